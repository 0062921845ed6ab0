//! The demo's timeline as a PNG: a real (tiny, simulated) demo run, rendered; the labels of
//! its phases and reinitializes do not overlap (their boxes from the layout code) and the PNG
//! is a valid image of the size the layout says.

use std::sync::Arc;
use std::time::Duration;

use rmm::config::ConfigLoader;
use rmm_cli::demo::{DemoOptions, DemoSize, NoProgress};
use rmm_cli::timeline::{PlotFormat, render, render_svg_with_layout};

#[test]
fn the_demo_timeline_renders_to_a_png_whose_labels_do_not_overlap() {
    let loader = ConfigLoader::new().no_env().toml_str(
        "test",
        "backend = \"sim\"\ndevices = [0, 1]\nworkers_per_device = 2\n",
    );
    let report = rmm_cli::demo::run(DemoOptions {
        size: DemoSize::Tiny,
        loader,
        progress: Arc::new(NoProgress),
        sample_every: Duration::from_millis(5),
        record_events: false,
    })
    .unwrap();
    let timeline = &report.timeline;
    let (_, layout) = render_svg_with_layout(timeline).unwrap();
    assert_eq!(layout.labels.len(), 2, "a panel per device");
    for (device, labels) in layout.labels.iter().enumerate() {
        let texts: Vec<&str> = labels.iter().map(|l| l.text.as_str()).collect();
        for expected in [
            "pooled",
            "pooled → plain",
            "plain",
            "plain → pooled",
            "pooled again",
        ] {
            assert!(texts.contains(&expected), "device {device}: {texts:?}");
        }
        // The reinitialize back to the pool takes milliseconds: its label and the next phase's
        // start at nearly the same place, and still do not overlap.
        for (i, a) in labels.iter().enumerate() {
            assert!(a.bounds.width > 0.0 && a.bounds.height > 0.0, "{a:?}");
            assert!(
                a.bounds.x >= 0.0 && a.bounds.x + a.bounds.width <= f64::from(layout.width),
                "{a:?} outside the picture"
            );
            for b in &labels[i + 1..] {
                assert!(!a.bounds.overlaps(&b.bounds), "{a:?} overlaps {b:?}");
            }
        }
    }
    let png = render(timeline, PlotFormat::Png).unwrap();
    let image = resvg::tiny_skia::Pixmap::decode_png(&png).expect("a valid PNG");
    assert_eq!(
        (image.width(), image.height()),
        (layout.width, layout.height)
    );
    // Not blank: the stacked areas drew in colour.
    let coloured = image
        .pixels()
        .iter()
        .filter(|p| p.red() != p.green() || p.green() != p.blue())
        .count();
    assert!(coloured > 10_000, "{coloured} coloured pixels");
}

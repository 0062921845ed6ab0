use super::*;
use crate::timeline::{Action, MemoryEvent};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn well_formed(svg: &str) {
    assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(200)]);
    assert_eq!(svg.matches("<svg").count(), 1);
    assert_eq!(svg.matches("</svg>").count(), 1);
    assert!(svg.trim_end().ends_with("</svg>"));
    assert_eq!(svg.matches("<text").count(), svg.matches("</text>").count());
    assert_eq!(svg.matches('<').count(), svg.matches('>').count());
}

fn sample(t: f64, in_use: u64, reserved: u64) -> Sample {
    Sample {
        t,
        in_use,
        reserved,
        ..Sample::default()
    }
}

fn mark(t: f64, device: Option<u32>, kind: MarkKind, label: &str) -> Mark {
    Mark {
        t,
        device,
        kind,
        label: label.into(),
    }
}

#[test]
fn empty_timeline_is_a_valid_svg() {
    let svg = render_svg(&Timeline::default()).unwrap();
    well_formed(&svg);
    assert!(svg.contains("memory timeline"));
    // A device without samples, events or marks.
    let t = Timeline {
        title: "nothing <yet> & more".into(),
        devices: vec![DeviceTimeline::default()],
        marks: Vec::new(),
    };
    let svg = render_svg(&t).unwrap();
    well_formed(&svg);
    assert!(svg.contains("device 0"));
    assert!(svg.contains("nothing &lt;yet&gt; &amp; more"), "{svg}");
}

#[test]
fn single_sample_draws_its_area() {
    let t = Timeline {
        title: "one".into(),
        devices: vec![DeviceTimeline {
            device: 0,
            total_memory: None,
            samples: vec![sample(0.5, 3 * MIB, 4 * MIB)],
            events: Vec::new(),
        }],
        marks: Vec::new(),
    };
    let svg = render_svg(&t).unwrap();
    well_formed(&svg);
    assert!(svg.contains("bytes (MiB)"));
}

/// Two devices: one sampled with spilled bytes on host and disk, one from events.
fn two_devices() -> Timeline {
    let events = vec![
        MemoryEvent {
            t: 0.0,
            action: Action::SegmentAlloc,
            addr: 0x1000_0000,
            size: 2 * GIB,
            stream: 0,
        },
        MemoryEvent {
            t: 1.0,
            action: Action::Alloc,
            addr: 0x1000_0000,
            size: GIB,
            stream: 0,
        },
    ];
    let spilled = |t, in_use, reserved, host, disk| Sample {
        t,
        in_use,
        reserved,
        host,
        disk,
    };
    Timeline {
        title: "rmm demo --size small".into(),
        devices: vec![
            DeviceTimeline {
                device: 0,
                total_memory: Some(8 * GIB),
                samples: vec![
                    spilled(0.0, 0, 0, 0, 0),
                    spilled(1.0, GIB, 2 * GIB, GIB, 0),
                    spilled(2.0, 3 * GIB, 4 * GIB, 2 * GIB, GIB),
                    spilled(3.0, GIB, 4 * GIB, GIB, 0),
                ],
                events: Vec::new(),
            },
            DeviceTimeline {
                device: 1,
                total_memory: None,
                samples: Vec::new(),
                events,
            },
        ],
        marks: vec![
            mark(0.0, None, MarkKind::Phase, "pooled"),
            mark(2.5, Some(0), MarkKind::Spill, "12.0 MiB"),
            mark(2.6, Some(0), MarkKind::Unspill, "1.0 MiB"),
            mark(2.7, None, MarkKind::Reinitialize, "pooled → plain"),
            mark(2.71, None, MarkKind::Phase, "plain"),
            mark(2.9, Some(0), MarkKind::OutOfMemory, "OOM"),
        ],
    }
}

#[test]
fn two_devices_with_stacked_areas_bands_and_a_rug() {
    let t = two_devices();
    let (svg, layout) = render_svg_with_layout(&t).unwrap();
    well_formed(&svg);
    for text in [
        "device 0 (8.00 GiB total)",
        "device 1",
        "rmm demo --size small",
        "bytes (GiB)",
        "in use on the device",
        "spilled: pinned host",
        "spilled: on disk",
        "reserved",
        "total memory",
        "phase",
        "reinitialize",
        "spills",
        "unspills",
        "out of memory",
        "seconds",
    ] {
        assert!(svg.contains(text), "no {text:?} in the SVG");
    }
    // Phase labels on both panels; the OOM only on device 0; spills are not labelled (a rug).
    let labels: Vec<Vec<&str>> = layout
        .labels
        .iter()
        .map(|p| p.iter().map(|l| l.text.as_str()).collect())
        .collect();
    assert_eq!(labels[0], ["pooled", "pooled → plain", "plain", "OOM"]);
    assert_eq!(labels[1], ["pooled", "pooled → plain", "plain"]);
    assert!(!svg.contains("\n12.0 MiB\n"));
    // Labels 2.7 s and 2.71 s apart are in different rows, not on top of each other.
    for panel in &layout.labels {
        for (i, a) in panel.iter().enumerate() {
            for b in &panel[i + 1..] {
                assert!(!a.bounds.overlaps(&b.bounds), "{a:?} overlaps {b:?}");
            }
        }
    }
    // The colours of the layers, the reserved line and the marks are used.
    for c in [
        "#1F77B4", "#9467BD", "#8C8C8C", "#FF7F0E", "#8C564B", "#D62728", "#2CA02C",
    ] {
        assert!(svg.to_uppercase().contains(c), "no colour {c}");
    }
    assert!(layout.height > 2 * PLOT_HEIGHT);
    assert_eq!(layout.width, WIDTH);
}

#[test]
fn a_pool_that_dwarfs_the_bytes_in_use_gives_them_a_right_axis() {
    let t = Timeline {
        title: "replay".into(),
        devices: vec![DeviceTimeline {
            device: 0,
            total_memory: Some(80 * GIB),
            samples: vec![
                sample(0.0, 0, 40 * GIB),
                sample(1.0, 64 * MIB, 40 * GIB),
                sample(2.0, 8 * MIB, 40 * GIB),
            ],
            events: Vec::new(),
        }],
        marks: Vec::new(),
    };
    let svg = render_svg(&t).unwrap();
    well_formed(&svg);
    assert!(svg.contains("in use (right axis)"), "{svg}");
    assert!(svg.contains("in use (GiB)"), "{svg}");
    // Comparable sizes share one axis.
    let mut same = t.clone();
    same.devices[0].samples[1].in_use = 30 * GIB;
    let svg = render_svg(&same).unwrap();
    assert!(!svg.contains("right axis"));
}

#[test]
fn the_label_lane_uses_the_plot_columns_plotters_draws() {
    // The lane places labels on `plot_columns`; plotters must put the plot there too.
    let mut out = String::new();
    let root = SVGBackend::with_string(&mut out, (WIDTH, 400)).into_drawing_area();
    let (left, _) = root.split_horizontally(WIDTH - LEGEND_WIDTH);
    let chart = ChartBuilder::on(&left)
        .margin_left(MARGIN)
        .margin_right(MARGIN)
        .x_label_area_size(0)
        .y_label_area_size(Y_AXIS_WIDTH)
        .right_y_label_area_size(RIGHT_AXIS_WIDTH)
        .build_cartesian_2d(0.0..1.0, 0.0..1.0)
        .unwrap();
    let (xs, _) = chart.plotting_area().get_pixel_range();
    let columns = plot_columns();
    assert!(
        (f64::from(xs.start) - columns.start).abs() <= 1.0,
        "{xs:?} {columns:?}"
    );
    assert!(
        (f64::from(xs.end) - columns.end).abs() <= 1.0,
        "{xs:?} {columns:?}"
    );
}

#[test]
fn png_and_svg_are_written_as_asked() {
    let t = two_devices();
    let dir = tempfile::tempdir().unwrap();
    let svg_path = dir.path().join("t.svg");
    write_plot(&t, &svg_path, PlotFormat::Svg).unwrap();
    assert_eq!(
        std::fs::read_to_string(&svg_path).unwrap(),
        render_svg(&t).unwrap()
    );
    let png_path = dir.path().join("t.png");
    write_plot(&t, &png_path, PlotFormat::Png).unwrap();
    let png = std::fs::read(&png_path).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));
    let bad = dir.path().join("no-such-dir").join("t.png");
    let e = write_plot(&t, &bad, PlotFormat::Png)
        .unwrap_err()
        .to_string();
    assert!(e.contains("PNG plot") && e.contains("no-such-dir"), "{e}");
}

//! A [`Timeline`] as an SVG plot (plotters' SVG backend): one panel per device, stacked
//! vertically, seconds across and bytes up (in MiB, or GiB when the largest value is at least
//! 1 GiB), a line for bytes in use and one for bytes reserved (drawn as steps: memory changes
//! at an event and holds until the next), a dashed line at the device's total memory when it
//! is known, a vertical line per mark (coloured by kind; phases, reinitializes and
//! out-of-memory errors labelled), a legend per panel and a title.
//!
//! Panels share the time axis, so marks of the whole run line up. Without samples a panel
//! draws the samples derived from its events ([`DeviceTimeline::effective_samples`]); an empty
//! timeline is still a valid SVG with its title. Text is written as SVG `<text>` elements.

use std::fmt::Display;
use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::{DeviceTimeline, Mark, MarkKind, Sample, Timeline, TimelineError};

const WIDTH: u32 = 1000;
const PANEL_HEIGHT: u32 = 320;
/// Room right of each plot for its legend.
const LEGEND_WIDTH: u32 = 180;
/// The total memory is drawn (and scales the plot) only when it is at most this many times
/// the largest sample; otherwise the legend gives it and the samples fill the plot.
const TOTAL_SCALE_LIMIT: f64 = 4.0;
const TITLE_HEIGHT: u32 = 40;
const FONT: &str = "sans-serif";

const GIB: f64 = (1u64 << 30) as f64;
const MIB: f64 = (1u64 << 20) as f64;

const IN_USE: RGBColor = RGBColor(31, 119, 180);
const RESERVED: RGBColor = RGBColor(255, 127, 14);
const TOTAL: RGBColor = RGBColor(90, 90, 90);

/// The colour of a mark of `kind`.
pub fn mark_color(kind: MarkKind) -> RGBColor {
    match kind {
        MarkKind::Phase => RGBColor(127, 127, 127),
        MarkKind::Spill => RGBColor(148, 103, 189),
        MarkKind::Unspill => RGBColor(44, 160, 44),
        MarkKind::Reinitialize => RGBColor(140, 86, 75),
        MarkKind::OutOfMemory => RGBColor(214, 39, 40),
    }
}

fn kind_name(kind: MarkKind) -> &'static str {
    match kind {
        MarkKind::Phase => "phase",
        MarkKind::Spill => "spill",
        MarkKind::Unspill => "unspill",
        MarkKind::Reinitialize => "reinitialize",
        MarkKind::OutOfMemory => "out of memory",
    }
}

const KINDS: [MarkKind; 5] = [
    MarkKind::Phase,
    MarkKind::Spill,
    MarkKind::Unspill,
    MarkKind::Reinitialize,
    MarkKind::OutOfMemory,
];

fn labelled(kind: MarkKind) -> bool {
    matches!(
        kind,
        MarkKind::Phase | MarkKind::Reinitialize | MarkKind::OutOfMemory
    )
}

fn render<T, E: Display>(r: Result<T, E>) -> Result<T, TimelineError> {
    r.map_err(|e| TimelineError::Render(e.to_string()))
}

/// Step points of one series, held to `x_end` after the last sample.
fn steps(samples: &[Sample], value: impl Fn(&Sample) -> f64, x_end: f64) -> Vec<(f64, f64)> {
    let mut points: Vec<(f64, f64)> = Vec::with_capacity(samples.len() * 2 + 1);
    for s in samples.iter().filter(|s| s.t.is_finite()) {
        if let Some(&(_, y)) = points.last() {
            points.push((s.t, y));
        }
        points.push((s.t, value(s)));
    }
    if let Some(&(x, y)) = points.last()
        && x < x_end
    {
        points.push((x_end, y));
    }
    points
}

/// Decimals for tick labels of an axis spanning `span`.
fn decimals(span: f64) -> usize {
    if span > 0.0 && span.is_finite() {
        (1.0 - span.log10().floor()).clamp(0.0, 6.0) as usize
    } else {
        2
    }
}

struct Panel<'a> {
    device: &'a DeviceTimeline,
    samples: Vec<Sample>,
    marks: Vec<&'a Mark>,
}

impl Panel<'_> {
    /// The largest sample.
    fn max_sample(&self) -> u64 {
        self.samples
            .iter()
            .map(|s| s.in_use.max(s.reserved))
            .max()
            .unwrap_or(0)
    }

    /// The total memory, when it is known and close enough to the samples to share a scale.
    fn drawn_total(&self) -> Option<u64> {
        let max = self.max_sample();
        self.device
            .total_memory
            .filter(|&t| max == 0 || t as f64 <= max as f64 * TOTAL_SCALE_LIMIT)
    }

    /// The top of the panel's data, in bytes.
    fn top_bytes(&self) -> u64 {
        self.max_sample().max(self.drawn_total().unwrap_or(0))
    }
}

/// Renders `timeline` as an SVG document (see the module documentation).
pub fn render_svg(timeline: &Timeline) -> Result<String, TimelineError> {
    let panels: Vec<Panel<'_>> = timeline
        .devices
        .iter()
        .map(|d| Panel {
            device: d,
            samples: d.effective_samples(),
            marks: timeline.marks_for(d.device).collect(),
        })
        .collect();
    // Times are seconds since the start of the run: start at 0 unless something is earlier;
    // end a little after the last, so the final level (and a lone sample) shows.
    let (x0, x1) = match timeline.time_range() {
        Some((lo, hi)) if hi > lo.min(0.0) => (lo.min(0.0), hi + (hi - lo.min(0.0)) * 0.03),
        Some((lo, _)) => (lo.min(0.0), lo.min(0.0) + 1.0),
        None => (0.0, 1.0),
    };
    let max_bytes = panels.iter().map(|p| p.top_bytes()).max().unwrap_or(0);
    let (unit, unit_name) = if max_bytes as f64 >= GIB {
        (GIB, "GiB")
    } else {
        (MIB, "MiB")
    };
    let title = if timeline.title.is_empty() {
        "memory timeline"
    } else {
        timeline.title.as_str()
    };
    let rows = panels.len().max(1);
    let height = TITLE_HEIGHT + PANEL_HEIGHT * rows as u32;
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (WIDTH, height)).into_drawing_area();
        render(root.fill(&WHITE))?;
        let body = render(root.titled(title, (FONT, 22)))?;
        if panels.is_empty() {
            render(body.draw(&Text::new(
                "no devices recorded",
                (WIDTH as i32 / 2 - 80, PANEL_HEIGHT as i32 / 2),
                (FONT, 16).into_font().color(&TOTAL),
            )))?;
        } else {
            let areas = body.split_evenly((panels.len(), 1));
            for (area, panel) in areas.iter().zip(&panels) {
                draw_panel(area, panel, (x0, x1), (unit, unit_name))?;
            }
        }
        render(root.present())?;
    }
    Ok(out)
}

/// How a legend entry shows its series.
#[derive(Clone, Copy)]
enum Swatch {
    Line,
    Dashed,
    Vertical,
}

struct LegendEntry {
    label: String,
    color: RGBColor,
    swatch: Swatch,
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

fn fmt_bytes(bytes: u64) -> String {
    rmm::allocator::error::fmt_bytes(usize::try_from(bytes).unwrap_or(usize::MAX))
}

fn draw_panel(
    area: &Area<'_>,
    panel: &Panel<'_>,
    (x0, x1): (f64, f64),
    (unit, unit_name): (f64, &str),
) -> Result<(), TimelineError> {
    let d = panel.device;
    let to_unit = |b: u64| b as f64 / unit;
    let top = to_unit(panel.top_bytes());
    let y1 = if top > 0.0 { top * 1.08 } else { 1.0 };
    let caption = match d.total_memory {
        Some(t) => format!("device {} ({} total)", d.device, fmt_bytes(t)),
        None => format!("device {}", d.device),
    };
    let (plot_area, legend_area) = area.split_horizontally(WIDTH.saturating_sub(LEGEND_WIDTH));
    let mut chart = render(
        ChartBuilder::on(&plot_area)
            .caption(caption, (FONT, 16))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(x0..x1, 0.0..y1),
    )?;
    let (xd, yd) = (decimals(x1 - x0), decimals(y1));
    let x_fmt = |x: &f64| format!("{x:.xd$}");
    let y_fmt = |y: &f64| format!("{y:.yd$}");
    let y_desc = format!("bytes ({unit_name})");
    render(
        chart
            .configure_mesh()
            .x_desc("seconds")
            .y_desc(y_desc.as_str())
            .x_label_formatter(&x_fmt)
            .y_label_formatter(&y_fmt)
            .light_line_style(WHITE.mix(0.0))
            .draw(),
    )?;
    let mut legend = Vec::new();
    let series = [
        (
            "reserved",
            RESERVED,
            steps(&panel.samples, |s| to_unit(s.reserved), x1),
        ),
        (
            "in use",
            IN_USE,
            steps(&panel.samples, |s| to_unit(s.in_use), x1),
        ),
    ];
    for (label, color, points) in series {
        render(chart.draw_series(LineSeries::new(points, color.stroke_width(2))))?;
        legend.push(LegendEntry {
            label: label.into(),
            color,
            swatch: Swatch::Line,
        });
    }
    if let Some(total) = d.total_memory {
        let label = if panel.drawn_total().is_some() {
            let y = to_unit(total);
            render(chart.draw_series(DashedLineSeries::new(
                vec![(x0, y), (x1, y)],
                8,
                5,
                TOTAL.stroke_width(1),
            )))?;
            "total memory".to_string()
        } else {
            // Far above the samples: drawing it would flatten them.
            format!("total memory: {}", fmt_bytes(total))
        };
        legend.push(LegendEntry {
            label,
            color: TOTAL,
            swatch: Swatch::Dashed,
        });
    }
    for kind in KINDS {
        let marks: Vec<&Mark> = panel
            .marks
            .iter()
            .copied()
            .filter(|m| m.kind == kind && m.t.is_finite())
            .collect();
        if marks.is_empty() {
            continue;
        }
        let color = mark_color(kind);
        let width = if kind == MarkKind::OutOfMemory { 2 } else { 1 };
        render(
            chart.draw_series(
                marks.iter().map(|m| {
                    PathElement::new(vec![(m.t, 0.0), (m.t, y1)], color.stroke_width(width))
                }),
            ),
        )?;
        legend.push(LegendEntry {
            label: kind_name(kind).into(),
            color,
            swatch: Swatch::Vertical,
        });
    }
    // Labels near the top, staggered over three rows so neighbours do not overprint.
    let labels: Vec<&Mark> = panel
        .marks
        .iter()
        .copied()
        .filter(|m| labelled(m.kind) && m.t.is_finite() && !m.label.is_empty())
        .collect();
    // Right of the line, or left of it in the right third of the plot.
    render(chart.draw_series(labels.iter().enumerate().map(|(i, m)| {
        let y = y1 * (0.97 - 0.06 * (i % 3) as f64);
        let left = m.t > x0 + (x1 - x0) * 2.0 / 3.0;
        let (h, dx) = if left {
            (HPos::Right, -4)
        } else {
            (HPos::Left, 4)
        };
        let style = (FONT, 12)
            .into_font()
            .color(&mark_color(m.kind))
            .pos(Pos::new(h, VPos::Top));
        EmptyElement::at((m.t, y)) + Text::new(m.label.clone(), (dx, 0), style)
    })))?;
    draw_legend(&legend_area, &legend)
}

/// The legend, in the panel's right margin: a swatch and a label per entry, in a box.
fn draw_legend(area: &Area<'_>, entries: &[LegendEntry]) -> Result<(), TimelineError> {
    const TOP: i32 = 44;
    const ROW: i32 = 18;
    let rows = i32::try_from(entries.len()).unwrap_or(0);
    let right = i32::try_from(LEGEND_WIDTH).unwrap_or(0) - 8;
    render(area.draw(&Rectangle::new(
        [(0, TOP - 6), (right, TOP + ROW * rows - 4)],
        BLACK.stroke_width(1),
    )))?;
    for (i, e) in (0..).zip(entries) {
        let y = TOP + ROW * i + 4;
        let style = e.color.stroke_width(2);
        let parts: Vec<Vec<(i32, i32)>> = match e.swatch {
            Swatch::Line => vec![vec![(8, y), (30, y)]],
            Swatch::Dashed => vec![vec![(8, y), (15, y)], vec![(20, y), (27, y)]],
            Swatch::Vertical => vec![vec![(19, y - 6), (19, y + 6)]],
        };
        for part in parts {
            render(area.draw(&PathElement::new(part, style)))?;
        }
        render(area.draw(&Text::new(
            e.label.clone(),
            (36, y - 6),
            (FONT, 12).into_font().color(&BLACK),
        )))?;
    }
    Ok(())
}

/// Renders `timeline` (see [`render_svg`]) and writes it to `path`.
pub fn write_svg(timeline: &Timeline, path: &Path) -> Result<(), TimelineError> {
    let svg = render_svg(timeline)?;
    std::fs::write(path, svg).map_err(|source| TimelineError::Write {
        what: "SVG plot",
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::{Action, MemoryEvent};

    const MIB: u64 = 1 << 20;

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
    fn single_sample_draws_its_lines() {
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
        assert!(svg.contains("MiB"));
    }

    #[test]
    fn two_devices_with_marks() {
        let gib = 1u64 << 30;
        let events = vec![
            MemoryEvent {
                t: 0.0,
                action: Action::SegmentAlloc,
                addr: 0x1000_0000,
                size: 2 * gib,
                stream: 0,
            },
            MemoryEvent {
                t: 1.0,
                action: Action::Alloc,
                addr: 0x1000_0000,
                size: gib,
                stream: 0,
            },
        ];
        let t = Timeline {
            title: "rmm demo --size small".into(),
            devices: vec![
                DeviceTimeline {
                    device: 0,
                    total_memory: Some(8 * gib),
                    samples: vec![
                        sample(0.0, 0, 0),
                        sample(1.0, gib, 2 * gib),
                        sample(2.0, 3 * gib, 4 * gib),
                        sample(3.0, gib, 4 * gib),
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
                Mark {
                    t: 0.5,
                    device: None,
                    kind: MarkKind::Phase,
                    label: "pooled".into(),
                },
                Mark {
                    t: 2.5,
                    device: Some(0),
                    kind: MarkKind::Spill,
                    label: "12.0 MiB".into(),
                },
                Mark {
                    t: 2.7,
                    device: Some(1),
                    kind: MarkKind::Reinitialize,
                    label: "reinit".into(),
                },
                Mark {
                    t: 2.9,
                    device: Some(0),
                    kind: MarkKind::OutOfMemory,
                    label: "OOM".into(),
                },
            ],
        };
        let svg = render_svg(&t).unwrap();
        well_formed(&svg);
        for text in [
            "device 0 (8.00 GiB total)",
            "device 1",
            "rmm demo --size small",
            "GiB",
            "in use",
            "reserved",
            "total memory",
            "phase",
            "spill",
            "reinitialize",
            "pooled",
            "reinit",
            "OOM",
            "seconds",
        ] {
            assert!(svg.contains(text), "no {text:?} in the SVG");
        }
        // The phase (on both panels) is labelled twice; a spill is not labelled.
        // (plotters writes a text element's content on its own line.)
        assert_eq!(svg.matches("\npooled\n").count(), 2, "{svg}");
        assert!(!svg.contains("\n12.0 MiB\n"));
        // Two series per panel plus legend swatches: at least 4 series polylines.
        assert!(svg.matches("<polyline").count() >= 4, "{svg}");
        // The colours of the series and of the marks are used.
        for c in [
            "#1F77B4", "#FF7F0E", "#7F7F7F", "#9467BD", "#8C564B", "#D62728",
        ] {
            assert!(svg.to_uppercase().contains(c), "no colour {c}");
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.svg");
        write_svg(&t, &path).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), svg);
        let bad = dir.path().join("no-such-dir").join("t.svg");
        let e = write_svg(&t, &bad).unwrap_err().to_string();
        assert!(e.contains("SVG plot") && e.contains("no-such-dir"), "{e}");
    }
}

//! A [`Timeline`] as a picture (plotters' SVG backend; PNG by rasterizing that SVG, see
//! [`super::png`]): one panel per device, stacked vertically, on a shared time axis.
//!
//! Each panel, top to bottom:
//! - a caption (the device and its total memory);
//! - a lane of labels for the phases, reinitializes and out-of-memory errors, in as many rows
//!   as it takes for none to overlap ([`super::labels`]);
//! - the plot: phases as shaded bands (reinitializes in a darker shade), the bytes as stacked
//!   areas (in use on the device, then this device's spilled data in pinned host memory, then
//!   on disk), the bytes reserved from the device as a line, and the device's total memory as
//!   a dashed line when it is close enough to share the scale; all drawn as steps (memory
//!   changes at an event and holds until the next). When nothing is spilled and the reserved
//!   bytes dwarf those in use (a large pool), the in-use area gets its own scale on a right
//!   axis, so that it is not flattened to zero;
//! - a rug of spills and unspills: a thin tick per move (merged when close), not lines across
//!   the plot; the time axis in seconds below it.
//!
//! Sizes are in binary units (MiB, or GiB when the largest value is at least 1 GiB). A legend
//! per panel sits on the right. Without samples a panel draws the samples derived from its
//! events ([`DeviceTimeline::effective_samples`]); an empty timeline is still a valid picture
//! with its title.

use std::fmt::Display;
use std::ops::Range;
use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::font::FAMILY;
use super::format::PlotFormat;
use super::labels::{self, FONT_SIZE, Placed, ROW_HEIGHT};
use super::{DeviceTimeline, Mark, MarkKind, Sample, Timeline, TimelineError};

/// Width of the picture.
pub const WIDTH: u32 = 1000;
/// Room right of each plot for its legend.
const LEGEND_WIDTH: u32 = 200;
const TITLE_HEIGHT: u32 = 40;
const CAPTION_HEIGHT: u32 = 24;
const PLOT_HEIGHT: u32 = 260;
/// The rug of spills and unspills, and the time axis under it; a timeline without spills
/// (a replay) keeps only a sliver of it above the axis.
const RUG_HEIGHT: u32 = 34;
const NO_RUG_HEIGHT: u32 = 8;
const X_AXIS_HEIGHT: u32 = 40;
const PANEL_GAP: u32 = 12;
/// Left and right margins of the plots, and the room for their y axes.
const MARGIN: u32 = 10;
const Y_AXIS_WIDTH: u32 = 70;
const RIGHT_AXIS_WIDTH: u32 = 60;
/// The total memory is drawn (and scales the plot) only when it is at most this many times
/// the largest value; otherwise the legend gives it and the data fill the plot.
const TOTAL_SCALE_LIMIT: f64 = 4.0;
/// The in-use bytes get a scale of their own when the reserved bytes are more than this many
/// times their peak.
const ZOOM_RATIO: f64 = 4.0;

const GIB: f64 = (1u64 << 30) as f64;
const MIB: f64 = (1u64 << 20) as f64;

const IN_USE: RGBColor = RGBColor(31, 119, 180);
const HOST: RGBColor = RGBColor(148, 103, 189);
const DISK: RGBColor = RGBColor(140, 140, 140);
const RESERVED: RGBColor = RGBColor(255, 127, 14);
const TOTAL: RGBColor = RGBColor(90, 90, 90);
const PHASE_BANDS: [RGBColor; 2] = [RGBColor(236, 236, 236), RGBColor(248, 248, 248)];
const REINIT_BAND: RGBColor = RGBColor(230, 210, 200);

/// The colour of a mark of `kind`.
pub fn mark_color(kind: MarkKind) -> RGBColor {
    match kind {
        MarkKind::Phase => RGBColor(80, 80, 80),
        MarkKind::Spill => RGBColor(148, 103, 189),
        MarkKind::Unspill => RGBColor(44, 160, 44),
        MarkKind::Reinitialize => RGBColor(140, 86, 75),
        MarkKind::OutOfMemory => RGBColor(214, 39, 40),
    }
}

fn labelled(kind: MarkKind) -> bool {
    matches!(
        kind,
        MarkKind::Phase | MarkKind::Reinitialize | MarkKind::OutOfMemory
    )
}

fn render_err<T, E: Display>(r: Result<T, E>) -> Result<T, TimelineError> {
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

fn fmt_bytes(bytes: u64) -> String {
    crate::units::bytes(bytes)
}

/// What the picture holds where: its size and every label's box, for checking the layout.
#[derive(Debug, Clone, Default)]
pub struct Layout {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// The labels of each panel (in device order), placed in its lane.
    pub labels: Vec<Vec<Placed>>,
}

struct Panel<'a> {
    device: &'a DeviceTimeline,
    samples: Vec<Sample>,
    marks: Vec<&'a Mark>,
    /// Labels placed in the lane (x in pixels from the picture's left edge, y from the
    /// panel's lane top).
    labels: Vec<Placed>,
    rows: usize,
    /// Whether the timeline has spills or unspills to show in a rug.
    rug: bool,
}

impl Panel<'_> {
    fn stacked(s: &Sample) -> u64 {
        s.in_use.saturating_add(s.host).saturating_add(s.disk)
    }

    /// The largest value drawn on the main scale.
    fn max_sample(&self) -> u64 {
        self.samples
            .iter()
            .map(|s| Self::stacked(s).max(s.reserved))
            .max()
            .unwrap_or(0)
    }

    fn spilled_anything(&self) -> bool {
        self.samples.iter().any(|s| s.host > 0 || s.disk > 0)
    }

    /// The peak in use, when it gets a scale of its own (see the module documentation).
    fn zoomed_in_use(&self) -> Option<u64> {
        let peak = self.samples.iter().map(|s| s.in_use).max().unwrap_or(0);
        let reserved = self.samples.iter().map(|s| s.reserved).max().unwrap_or(0);
        (peak > 0 && !self.spilled_anything() && reserved as f64 > peak as f64 * ZOOM_RATIO)
            .then_some(peak)
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

    fn lane_height(&self) -> u32 {
        (self.rows as f64 * ROW_HEIGHT).ceil() as u32 + if self.rows > 0 { 4 } else { 0 }
    }

    fn height(&self) -> u32 {
        let rug = if self.rug { RUG_HEIGHT } else { NO_RUG_HEIGHT };
        CAPTION_HEIGHT + self.lane_height() + PLOT_HEIGHT + rug + X_AXIS_HEIGHT
    }
}

/// The pixel columns of the plots (the same in every panel and in the rug).
fn plot_columns() -> Range<f64> {
    let left = f64::from(MARGIN + Y_AXIS_WIDTH);
    let right = f64::from(WIDTH - LEGEND_WIDTH - MARGIN - RIGHT_AXIS_WIDTH);
    left..right
}

/// Time range of the picture: from 0 (or earlier) to a little after the last moment.
fn time_range(timeline: &Timeline) -> (f64, f64) {
    match timeline.time_range() {
        Some((lo, hi)) if hi > lo.min(0.0) => (lo.min(0.0), hi + (hi - lo.min(0.0)) * 0.03),
        Some((lo, _)) => (lo.min(0.0), lo.min(0.0) + 1.0),
        None => (0.0, 1.0),
    }
}

/// Renders `timeline` as an SVG document (see the module documentation).
///
/// # Errors
/// [`TimelineError::Render`] when writing the SVG fails.
pub fn render_svg(timeline: &Timeline) -> Result<String, TimelineError> {
    render_svg_with_layout(timeline).map(|(svg, _)| svg)
}

/// Renders `timeline` in `format`: the SVG's bytes, or the PNG rasterized from it.
///
/// # Errors
/// [`TimelineError::Render`] when the SVG cannot be written, or rasterized and encoded as PNG.
pub fn render(timeline: &Timeline, format: PlotFormat) -> Result<Vec<u8>, TimelineError> {
    let svg = render_svg(timeline)?;
    match format {
        PlotFormat::Svg => Ok(svg.into_bytes()),
        PlotFormat::Png => super::png::svg_to_png(&svg),
    }
}

/// Renders `timeline` (see [`render`]) and writes it to `path`, whole or not at all
/// ([`AtomicFile`](crate::atomic_file::AtomicFile)).
///
/// # Errors
/// As [`render`]; [`TimelineError::Write`] when `path` cannot be written (it is then as it
/// was).
pub fn write_plot(
    timeline: &Timeline,
    path: &Path,
    format: PlotFormat,
) -> Result<(), TimelineError> {
    let bytes = render(timeline, format)?;
    crate::atomic_file::AtomicFile::create(path)
        .and_then(|f| f.commit(&bytes))
        .map_err(|source| TimelineError::Write {
            what: format.describe(),
            path: path.to_path_buf(),
            source,
        })
}

/// [`render_svg`], with where everything went ([`Layout`]).
///
/// # Errors
/// [`TimelineError::Render`] when writing the SVG fails.
pub fn render_svg_with_layout(timeline: &Timeline) -> Result<(String, Layout), TimelineError> {
    let (x0, x1) = time_range(timeline);
    let columns = plot_columns();
    let to_px = |t: f64| columns.start + (t - x0) / (x1 - x0) * (columns.end - columns.start);
    let rug = timeline
        .marks
        .iter()
        .any(|m| matches!(m.kind, MarkKind::Spill | MarkKind::Unspill));
    let panels: Vec<Panel<'_>> = timeline
        .devices
        .iter()
        .map(|d| {
            let marks: Vec<&Mark> = timeline.marks_for(d.device).collect();
            let requests: Vec<(String, f64)> = marks
                .iter()
                .filter(|m| labelled(m.kind) && m.t.is_finite() && !m.label.is_empty())
                .map(|m| (m.label.clone(), to_px(m.t)))
                .collect();
            let (labels, rows) = labels::place(&requests, columns.start, columns.end, 0.0);
            Panel {
                device: d,
                samples: d.effective_samples(),
                marks,
                labels,
                rows,
                rug,
            }
        })
        .collect();
    let max_bytes = panels.iter().map(|p| p.top_bytes()).max().unwrap_or(0);
    let unit = if max_bytes as f64 >= GIB {
        (GIB, "GiB")
    } else {
        (MIB, "MiB")
    };
    let title = if timeline.title.is_empty() {
        "memory timeline"
    } else {
        timeline.title.as_str()
    };
    let height = TITLE_HEIGHT
        + panels
            .iter()
            .map(|p| p.height() + PANEL_GAP)
            .sum::<u32>()
            .max(PLOT_HEIGHT);
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (WIDTH, height)).into_drawing_area();
        render_err(root.fill(&WHITE))?;
        render_err(
            root.draw(&Text::new(
                title.to_string(),
                (i32::try_from(WIDTH / 2).unwrap_or(0), 10),
                (FAMILY, 22)
                    .into_font()
                    .color(&BLACK)
                    .pos(Pos::new(HPos::Center, VPos::Top)),
            )),
        )?;
        let (_, mut rest) = root.split_vertically(TITLE_HEIGHT);
        if panels.is_empty() {
            render_err(
                rest.draw(&Text::new(
                    "no devices recorded",
                    (i32::try_from(WIDTH / 2).unwrap_or(0), 40),
                    (FAMILY, 16)
                        .into_font()
                        .color(&TOTAL)
                        .pos(Pos::new(HPos::Center, VPos::Top)),
                )),
            )?;
        }
        for panel in &panels {
            let (area, below) = rest.split_vertically(panel.height() + PANEL_GAP);
            draw_panel(&area, panel, (x0, x1), unit)?;
            rest = below;
        }
        render_err(root.present())?;
    }
    let layout = Layout {
        width: WIDTH,
        height,
        labels: panels.into_iter().map(|p| p.labels).collect(),
    };
    Ok((out, layout))
}

/// How a legend entry shows its series.
#[derive(Clone, Copy)]
enum Swatch {
    Line,
    Dashed,
    Area,
    Tick,
}

struct LegendEntry {
    label: String,
    color: RGBColor,
    swatch: Swatch,
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// Bands of the phases and reinitializes: (start, end, is a reinitialize).
fn bands(marks: &[&Mark], x1: f64) -> Vec<(f64, f64, bool)> {
    let mut starts: Vec<(f64, bool)> = marks
        .iter()
        .filter(|m| matches!(m.kind, MarkKind::Phase | MarkKind::Reinitialize) && m.t.is_finite())
        .map(|m| (m.t, m.kind == MarkKind::Reinitialize))
        .collect();
    starts.sort_by(|a, b| a.0.total_cmp(&b.0));
    starts
        .iter()
        .enumerate()
        .map(|(i, &(t, reinit))| (t, starts.get(i + 1).map_or(x1, |n| n.0), reinit))
        .collect()
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
    let (left, legend_area) = area.split_horizontally(WIDTH - LEGEND_WIDTH);
    let (head, rest) = left.split_vertically(CAPTION_HEIGHT + panel.lane_height());
    let (plot_area, rug_area) = rest.split_vertically(PLOT_HEIGHT);
    render_err(head.draw(&Text::new(
        caption,
        (i32::try_from(MARGIN + Y_AXIS_WIDTH).unwrap_or(0), 4),
        (FAMILY, 15).into_font().color(&BLACK),
    )))?;
    // The lane's labels, placed by `labels::place` (x from the picture's left edge).
    for p in &panel.labels {
        let kind = panel
            .marks
            .iter()
            .filter(|m| labelled(m.kind) && m.t.is_finite() && !m.label.is_empty())
            .nth(p.index)
            .map_or(MarkKind::Phase, |m| m.kind);
        render_err(
            head.draw(&Text::new(
                p.text.clone(),
                (
                    p.bounds.x.round() as i32,
                    (f64::from(CAPTION_HEIGHT) + p.bounds.y).round() as i32,
                ),
                (FAMILY, FONT_SIZE)
                    .into_font()
                    .color(&mark_color(kind))
                    .pos(Pos::new(HPos::Left, VPos::Top)),
            )),
        )?;
    }

    let zoom = panel.zoomed_in_use();
    let y2 = zoom.map_or(y1, |peak| to_unit(peak) * 1.08);
    let mut chart = render_err(
        ChartBuilder::on(&plot_area)
            .margin_left(MARGIN)
            .margin_right(MARGIN)
            .x_label_area_size(0)
            .y_label_area_size(Y_AXIS_WIDTH)
            .right_y_label_area_size(RIGHT_AXIS_WIDTH)
            .build_cartesian_2d(x0..x1, 0.0..y1),
    )?
    .set_secondary_coord(x0..x1, 0.0..y2);
    let yd = decimals(y1);
    let y_fmt = |y: &f64| format!("{y:.yd$}");
    let y_desc = format!("bytes ({unit_name})");
    render_err(
        chart
            .configure_mesh()
            .disable_x_mesh()
            .y_desc(y_desc.as_str())
            .y_label_formatter(&y_fmt)
            .axis_desc_style((FAMILY, 13))
            .label_style((FAMILY, 12))
            .light_line_style(WHITE.mix(0.0))
            .bold_line_style(BLACK.mix(0.08))
            .draw(),
    )?;
    let y2d = decimals(y2);
    let y2_fmt = |y: &f64| format!("{y:.y2d$}");
    let y2_desc = format!("in use ({unit_name})");
    if zoom.is_some() {
        render_err(
            chart
                .configure_secondary_axes()
                .y_desc(y2_desc.as_str())
                .y_label_formatter(&y2_fmt)
                .axis_desc_style((FAMILY, 13).into_font().color(&IN_USE))
                .label_style((FAMILY, 12).into_font().color(&IN_USE))
                .draw(),
        )?;
    }
    let mut legend = Vec::new();

    // Phases and reinitializes as shaded bands behind the data.
    let bands = bands(&panel.marks, x1);
    // A band is at least a pixel wide (a reinitialize of a millisecond still shows); two
    // pixels' worth of time, so that rounding to whole pixels cannot make it empty.
    let columns = plot_columns();
    let min_width = (x1 - x0) * 2.0 / (columns.end - columns.start);
    let mut phase_index = 0;
    render_err(chart.draw_series(bands.iter().map(|&(a, b, reinit)| {
        let color = if reinit {
            REINIT_BAND
        } else {
            phase_index += 1;
            PHASE_BANDS[(phase_index - 1) % 2]
        };
        Rectangle::new([(a, 0.0), (b.max(a + min_width), y1)], color.filled())
    })))?;
    if bands.iter().any(|b| !b.2) {
        legend.push(LegendEntry {
            label: "phase".into(),
            color: PHASE_BANDS[0],
            swatch: Swatch::Area,
        });
    }
    if bands.iter().any(|b| b.2) {
        legend.push(LegendEntry {
            label: "reinitialize".into(),
            color: REINIT_BAND,
            swatch: Swatch::Area,
        });
    }

    // Stacked areas: the top of each layer is the sum of the layers below it and itself.
    let samples = &panel.samples;
    let disk_top = steps(samples, |s| to_unit(Panel::stacked(s)), x1);
    let host_top = steps(samples, |s| to_unit(s.in_use.saturating_add(s.host)), x1);
    if panel.samples.iter().any(|s| s.disk > 0) {
        render_err(chart.draw_series(AreaSeries::new(disk_top, 0.0, DISK.mix(0.85))))?;
        legend.push(LegendEntry {
            label: "spilled: on disk".into(),
            color: DISK,
            swatch: Swatch::Area,
        });
    }
    if panel.samples.iter().any(|s| s.host > 0) {
        render_err(chart.draw_series(AreaSeries::new(host_top, 0.0, HOST.mix(0.85))))?;
        legend.push(LegendEntry {
            label: "spilled: pinned host".into(),
            color: HOST,
            swatch: Swatch::Area,
        });
    }
    let in_use = steps(samples, |s| to_unit(s.in_use), x1);
    let in_use_series = AreaSeries::new(in_use, 0.0, IN_USE.mix(0.85)).border_style(IN_USE);
    render_err(if zoom.is_some() {
        chart.draw_secondary_series(in_use_series)
    } else {
        chart.draw_series(in_use_series)
    })?;
    legend.push(LegendEntry {
        label: if zoom.is_some() {
            "in use (right axis)".into()
        } else {
            "in use on the device".into()
        },
        color: IN_USE,
        swatch: Swatch::Area,
    });
    render_err(chart.draw_series(LineSeries::new(
        steps(samples, |s| to_unit(s.reserved), x1),
        RESERVED.stroke_width(2),
    )))?;
    legend.push(LegendEntry {
        label: "reserved".into(),
        color: RESERVED,
        swatch: Swatch::Line,
    });
    if let Some(total) = d.total_memory {
        let label = if panel.drawn_total().is_some() {
            let y = to_unit(total);
            render_err(chart.draw_series(DashedLineSeries::new(
                vec![(x0, y), (x1, y)],
                8,
                5,
                TOTAL.stroke_width(1),
            )))?;
            "total memory".to_string()
        } else {
            // Far above the data: drawing it would flatten them.
            format!("total: {}", fmt_bytes(total))
        };
        legend.push(LegendEntry {
            label,
            color: TOTAL,
            swatch: Swatch::Dashed,
        });
    }
    // Out-of-memory errors are rare and matter: a line across the plot.
    let ooms: Vec<f64> = panel
        .marks
        .iter()
        .filter(|m| m.kind == MarkKind::OutOfMemory && m.t.is_finite())
        .map(|m| m.t)
        .collect();
    if !ooms.is_empty() {
        let color = mark_color(MarkKind::OutOfMemory);
        render_err(
            chart.draw_series(
                ooms.iter()
                    .map(|&t| PathElement::new(vec![(t, 0.0), (t, y1)], color.stroke_width(2))),
            ),
        )?;
        legend.push(LegendEntry {
            label: "out of memory".into(),
            color,
            swatch: Swatch::Tick,
        });
    }

    draw_rug(&rug_area, panel, (x0, x1), &mut legend)?;
    draw_legend(&legend_area, &legend, CAPTION_HEIGHT + panel.lane_height())
}

/// The rug under the plot: a tick per spill (upper row) and per unspill (lower row), and the
/// time axis.
fn draw_rug(
    area: &Area<'_>,
    panel: &Panel<'_>,
    (x0, x1): (f64, f64),
    legend: &mut Vec<LegendEntry>,
) -> Result<(), TimelineError> {
    let mut rug = render_err(
        ChartBuilder::on(area)
            .margin_left(MARGIN)
            .margin_right(MARGIN)
            .margin_top(if panel.rug { 4 } else { 0 })
            .x_label_area_size(X_AXIS_HEIGHT)
            .y_label_area_size(Y_AXIS_WIDTH)
            .right_y_label_area_size(RIGHT_AXIS_WIDTH)
            .build_cartesian_2d(x0..x1, 0.0..2.0),
    )?;
    let rows: &[(MarkKind, f64, &str)] = if panel.rug {
        &[
            (MarkKind::Spill, 1.0, "spills"),
            (MarkKind::Unspill, 0.0, "unspills"),
        ]
    } else {
        &[]
    };
    let xd = decimals(x1 - x0);
    let x_fmt = |x: &f64| format!("{x:.xd$}");
    render_err(
        rug.configure_mesh()
            .disable_y_mesh()
            .disable_x_mesh()
            .y_labels(0)
            .x_desc("seconds")
            .x_label_formatter(&x_fmt)
            .axis_desc_style((FAMILY, 13))
            .label_style((FAMILY, 12))
            .draw(),
    )?;
    for &(kind, row, name) in rows {
        let color = mark_color(kind);
        let times: Vec<f64> = panel
            .marks
            .iter()
            .filter(|m| m.kind == kind && m.t.is_finite())
            .map(|m| m.t)
            .collect();
        // Pixels of the row's middle at the plot's left edge, in the rug area's own frame.
        let (px, py) = rug.backend_coord(&(x0, row + 0.5));
        let (bx, by) = area.get_base_pixel();
        render_err(
            area.draw(&Text::new(
                name,
                (px - bx - 6, py - by),
                (FAMILY, 11)
                    .into_font()
                    .color(&color)
                    .pos(Pos::new(HPos::Right, VPos::Center)),
            )),
        )?;
        if times.is_empty() {
            continue;
        }
        render_err(rug.draw_series(times.iter().map(|&t| {
            PathElement::new(
                vec![(t, row + 0.15), (t, row + 0.85)],
                color.stroke_width(1),
            )
        })))?;
        legend.push(LegendEntry {
            label: kind_name(kind).into(),
            color,
            swatch: Swatch::Tick,
        });
    }
    Ok(())
}

fn kind_name(kind: MarkKind) -> &'static str {
    match kind {
        MarkKind::Phase => "phase",
        MarkKind::Spill => "spill (rug)",
        MarkKind::Unspill => "unspill (rug)",
        MarkKind::Reinitialize => "reinitialize",
        MarkKind::OutOfMemory => "out of memory",
    }
}

/// The legend, in the panel's right margin: a swatch and a label per entry, in a box.
fn draw_legend(area: &Area<'_>, entries: &[LegendEntry], top: u32) -> Result<(), TimelineError> {
    const ROW: i32 = 18;
    let top = i32::try_from(top).unwrap_or(0) + 8;
    let rows = i32::try_from(entries.len()).unwrap_or(0);
    let right = i32::try_from(LEGEND_WIDTH).unwrap_or(0) - 8;
    render_err(area.draw(&Rectangle::new(
        [(0, top - 6), (right, top + ROW * rows - 4)],
        BLACK.mix(0.5).stroke_width(1),
    )))?;
    for (i, e) in (0..).zip(entries) {
        let y = top + ROW * i + 4;
        match e.swatch {
            Swatch::Area => render_err(area.draw(&Rectangle::new(
                [(8, y - 5), (30, y + 5)],
                e.color.mix(0.85).filled(),
            )))?,
            Swatch::Line => render_err(area.draw(&PathElement::new(
                vec![(8, y), (30, y)],
                e.color.stroke_width(2),
            )))?,
            Swatch::Dashed => {
                for part in [[(8, y), (15, y)], [(20, y), (27, y)]] {
                    render_err(area.draw(&PathElement::new(part, e.color.stroke_width(1))))?;
                }
            }
            Swatch::Tick => render_err(area.draw(&PathElement::new(
                vec![(19, y - 6), (19, y + 6)],
                e.color.stroke_width(2),
            )))?,
        }
        render_err(area.draw(&Text::new(
            e.label.clone(),
            (36, y - 7),
            (FAMILY, 12).into_font().color(&BLACK),
        )))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;

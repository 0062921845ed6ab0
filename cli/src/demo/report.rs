//! The demo's report as text: a few lines on the run, then tables (phases per device, the
//! reinitializes, the spill tiers), in binary units ([`crate::units`]).

use std::fmt;

use super::DemoReport;
use crate::plural::count;
use crate::table::{Align, NONE, Table, TableFormat};
use crate::units::{bytes, bytes_at_rate, bytes_or_none, duration};

impl DemoReport {
    /// The phases per device: tasks, allocation rate, peaks, what moved and how fast.
    pub fn phase_table(&self) -> Table {
        let mut t = Table::new([
            ("device", Align::Right),
            ("phase", Align::Left),
            ("tasks", Align::Right),
            ("allocations/s", Align::Right),
            ("peak in use", Align::Right),
            ("peak reserved", Align::Right),
            ("spilled", Align::Right),
            ("unspilled", Align::Right),
        ]);
        for &d in &self.devices {
            for p in &self.phases {
                let Some(x) = p.devices.iter().find(|x| x.device == d) else {
                    continue;
                };
                t.row([
                    d.to_string(),
                    p.name.clone(),
                    x.tasks.to_string(),
                    format!("{:.0}", x.allocations_per_second),
                    bytes_or_none(x.peak_in_use),
                    bytes_or_none(x.peak_reserved),
                    bytes_at_rate(x.spilled_bytes, x.spill_seconds),
                    bytes_at_rate(x.unspilled_bytes, x.unspill_seconds),
                ]);
            }
        }
        t
    }

    /// The reinitializes: how long, and how much of it was spilling what.
    pub fn reinitialize_table(&self) -> Table {
        let mut t = Table::new([
            ("reinitialize", Align::Left),
            ("time", Align::Right),
            ("spilled", Align::Right),
            ("spilling took", Align::Right),
        ]);
        for r in &self.reinitializes {
            let spilled = r.spilled_bytes > 0;
            t.row([
                r.transition.clone(),
                duration(r.seconds),
                bytes_or_none(r.spilled_bytes),
                if spilled {
                    duration(r.spill_seconds)
                } else {
                    NONE.into()
                },
            ]);
        }
        t
    }

    /// Each device's spill tiers over the whole run: the pinned host pool, what went to pageable
    /// memory while pinning could not keep up, what moved off the device and back (copy
    /// bandwidth), and the disk tier.
    pub fn spill_table(&self) -> Table {
        let mut t = Table::new([
            ("device", Align::Right),
            ("host pool", Align::Right),
            ("pinned in", Align::Right),
            ("pageable", Align::Right),
            ("spilled", Align::Right),
            ("unspilled", Align::Right),
            ("on disk at the end", Align::Right),
        ]);
        for s in &self.spill {
            t.row([
                s.device.to_string(),
                bytes_or_none(s.host_pool_bytes),
                if s.host_pool_bytes > 0 {
                    duration(s.host_pinning_seconds)
                } else {
                    NONE.into()
                },
                bytes_or_none(s.host_pageable_total_bytes),
                bytes_at_rate(s.spilled_bytes, s.spill_seconds),
                bytes_at_rate(s.unspilled_bytes, s.unspill_seconds),
                bytes_or_none(s.disk_bytes),
            ]);
        }
        t
    }

    /// The whole report as text, tables in `format`; ends without a newline.
    pub fn render(&self, format: TableFormat) -> String {
        let devices: Vec<String> = self.devices.iter().map(u32::to_string).collect();
        let mut out = vec![
            format!("backend: {}", self.backend),
            format!(
                "devices: {} ({}), {} each",
                count(self.devices.len() as u64, "device", "devices"),
                devices.join(", "),
                count(self.workers_per_device, "worker", "workers"),
            ),
            format!(
                "size:    {}: {} of results per device, spill limit {}",
                self.size.name(),
                bytes(self.scale.results_per_device),
                bytes(self.scale.spill_limit)
            ),
            "units:   binary (1 GiB = 1024³ bytes; rates in GiB/s)".into(),
            String::new(),
            self.phase_table().render(format),
            String::new(),
            self.reinitialize_table().render(format),
        ];
        if !self.spill.is_empty() {
            out.extend([String::new(), self.spill_table().render(format)]);
        }
        out.extend([
            String::new(),
            format!(
                "checked: {}, every byte as expected; {:.1} s in all",
                count(self.checked, "result", "results"),
                self.seconds
            ),
        ]);
        out.join("\n")
    }
}

impl fmt::Display for DemoReport {
    /// [`DemoReport::render`] with aligned text tables.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render(TableFormat::Text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::demo::{DemoSize, PhaseDevice, PhaseReport, ReinitSummary};
    use crate::timeline::Timeline;

    fn report() -> DemoReport {
        let phase = |name: &str, spilled: u64, unspilled: u64| PhaseReport {
            name: name.into(),
            seconds: 1.0,
            devices: vec![PhaseDevice {
                device: 0,
                tasks: 10,
                allocations: 40,
                allocations_per_second: 40.0,
                peak_in_use: 1 << 30,
                peak_reserved: 2 << 30,
                spilled_bytes: spilled,
                spill_seconds: if spilled > 0 { 0.5 } else { 0.0 },
                unspilled_bytes: unspilled,
                unspill_seconds: if unspilled > 0 { 0.25 } else { 0.0 },
            }],
        };
        DemoReport {
            backend: "sim".into(),
            size: DemoSize::Tiny,
            scale: DemoSize::Tiny.scale(),
            devices: vec![0],
            workers_per_device: 1,
            phases: vec![phase("pooled", 1 << 30, 0), phase("plain", 0, 1 << 30)],
            reinitializes: vec![ReinitSummary {
                transition: "pooled → plain".into(),
                seconds: 0.02,
                spill_seconds: 0.0,
                spilled_bytes: 0,
            }],
            checked: 1,
            spill: Vec::new(),
            seconds: 2.0,
            timeline: Timeline::default(),
        }
    }

    #[test]
    fn no_cell_shows_a_zero_that_looks_measured_and_rates_are_gib_per_second() {
        let text = report().render(TableFormat::Text);
        assert!(!text.contains("0 B"), "{text}");
        assert!(!text.contains("GB/s"), "{text}");
        assert!(text.contains("1.00 GiB at 2.0 GiB/s"), "{text}");
        assert!(text.contains("1.00 GiB at 4.0 GiB/s"), "{text}");
        assert!(text.contains(NONE), "{text}");
        assert!(text.contains("1 worker each"), "{text}");
        assert!(text.contains("checked: 1 result,"), "{text}");
    }

    #[test]
    fn markdown_tables_have_a_row_per_phase() {
        let md = report().render(TableFormat::Markdown);
        let rows: Vec<&str> = md.lines().filter(|l| l.starts_with("|")).collect();
        // Phase table: header, rule, 2 rows; reinitialize table: header, rule, 1 row.
        assert_eq!(rows.len(), 7, "{md}");
        assert!(rows.iter().any(|r| r.contains("| pooled ")), "{md}");
        assert!(md.contains("| pooled → plain |"), "{md}");
    }
}

//! The tables `rmm` prints: aligned columns for a person at a terminal (comfy-table), or
//! GitHub-flavoured markdown to paste into an issue or a page (`--format markdown`).
//!
//! The format is what the option says, whether standard output is a terminal or a pipe: the
//! same command gives the same text in a terminal, a file and a CI log (as `cargo` and
//! `kubectl` do), and scripts read `--json`, not tables. Numbers are right-aligned in both
//! formats; a cell with nothing to show holds [`NONE`] rather than a zero that looks measured.

use std::fmt;

use comfy_table::{CellAlignment, ColumnConstraint, ContentArrangement, Width};

/// What a cell holds when there is nothing to show (nothing moved, not measured).
pub const NONE: &str = "—";

/// A comfy-table preset: no borders, no lines between rows, one rule under the header.
const HEADER_RULE_ONLY: &str = "     ──            ";

/// How tables are printed (`--format`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum TableFormat {
    /// Columns padded to line up, with a rule under the header: for reading in a terminal.
    #[default]
    Text,
    /// GitHub-flavoured markdown (padded too, numbers right-aligned with `---:`).
    Markdown,
}

/// Alignment of a column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    /// Text: names, labels.
    Left,
    /// Numbers.
    Right,
}

/// A table: a header, rows of cells, an alignment per column.
///
/// ```
/// use rmm_cli::table::{Align, Table, TableFormat};
///
/// let mut t = Table::new([("device", Align::Left), ("tasks", Align::Right)]);
/// t.row(["0", "1024"]);
/// assert!(t.render(TableFormat::Markdown).contains("| device | tasks |"));
/// ```
#[derive(Debug, Clone, Default)]
pub struct Table {
    header: Vec<String>,
    align: Vec<Align>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these columns (title, alignment).
    pub fn new<S: Into<String>>(columns: impl IntoIterator<Item = (S, Align)>) -> Table {
        let (header, align) = columns.into_iter().map(|(h, a)| (h.into(), a)).unzip();
        Table {
            header,
            align,
            rows: Vec::new(),
        }
    }

    /// Adds a row; missing cells are empty, extra cells are dropped.
    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) -> &mut Table {
        let mut cells: Vec<String> = cells.into_iter().map(Into::into).collect();
        cells.resize(self.header.len(), String::new());
        self.rows.push(cells);
        self
    }

    /// The rows added so far.
    pub fn rows(&self) -> &[Vec<String>] {
        &self.rows
    }

    /// The table as text in `format`, ending without a newline.
    pub fn render(&self, format: TableFormat) -> String {
        match format {
            TableFormat::Text => self.text(),
            TableFormat::Markdown => self.markdown(),
        }
    }

    fn text(&self) -> String {
        let mut t = comfy_table::Table::new();
        t.load_preset(HEADER_RULE_ONLY)
            .set_content_arrangement(ContentArrangement::Disabled)
            .set_header(self.header.clone());
        for row in &self.rows {
            t.add_row(row.clone());
        }
        for (i, a) in self.align.iter().enumerate() {
            if let Some(c) = t.column_mut(i) {
                c.set_cell_alignment(match a {
                    Align::Left => CellAlignment::Left,
                    Align::Right => CellAlignment::Right,
                });
                // Never wrapped: a table wider than the terminal scrolls, as `ls -l` does.
                c.set_constraint(ColumnConstraint::LowerBoundary(Width::Fixed(1)));
            }
        }
        t.trim_fmt()
    }

    fn markdown(&self) -> String {
        let width = |i: usize| {
            self.rows
                .iter()
                .map(|r| r[i].chars().count())
                .chain([self.header[i].chars().count(), 3])
                .max()
                .unwrap_or(3)
        };
        let widths: Vec<usize> = (0..self.header.len()).map(width).collect();
        let line = |cells: &[String]| {
            let cells: Vec<String> = cells
                .iter()
                .zip(&widths)
                .zip(&self.align)
                .map(|((c, &w), a)| match a {
                    Align::Left => format!("{c:<w$}"),
                    Align::Right => format!("{c:>w$}"),
                })
                .collect();
            format!("| {} |", cells.join(" | "))
        };
        let rule: Vec<String> = widths
            .iter()
            .zip(&self.align)
            .map(|(&w, a)| match a {
                Align::Left => "-".repeat(w),
                Align::Right => format!("{}:", "-".repeat(w - 1)),
            })
            .collect();
        let mut out = vec![line(&self.header), format!("| {} |", rule.join(" | "))];
        out.extend(self.rows.iter().map(|r| line(r)));
        out.join("\n")
    }
}

impl fmt::Display for Table {
    /// The table as text ([`TableFormat::Text`]).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Table {
        let mut t = Table::new([
            ("device", Align::Left),
            ("phase", Align::Left),
            ("spilled", Align::Right),
        ]);
        t.row(["0", "pooled", "128.0 MiB"]);
        t.row(["0", "pooled again", NONE]);
        t
    }

    #[test]
    fn text_columns_line_up_and_numbers_align_right() {
        let text = sample().render(TableFormat::Text);
        let lines: Vec<&str> = text.lines().collect();
        let header = lines.iter().find(|l| l.contains("device")).unwrap();
        let rows: Vec<&&str> = lines.iter().filter(|l| l.contains("pooled")).collect();
        assert_eq!(rows.len(), 2, "{text}");
        // Every line of the table is as wide as the header (aligned columns).
        for l in &rows {
            assert_eq!(l.chars().count(), header.chars().count(), "{text}");
        }
        // The right-aligned column ends in the same place in both rows.
        let end = |l: &str, cell: &str| l.find(cell).unwrap() + cell.len();
        let a = rows[0].chars().count() - rows[0][end(rows[0], "MiB")..].chars().count();
        let b = rows[1].chars().count() - rows[1][end(rows[1], NONE)..].chars().count();
        assert_eq!(a, b, "{text}");
        assert!(!text.contains('|'), "{text}");
    }

    #[test]
    fn markdown_has_header_rule_with_alignment_and_padded_cells() {
        let md = sample().render(TableFormat::Markdown);
        let lines: Vec<&str> = md.lines().collect();
        assert_eq!(lines.len(), 4, "{md}");
        assert_eq!(lines[0], "| device | phase        |   spilled |");
        assert_eq!(lines[1], "| ------ | ------------ | --------: |");
        assert_eq!(lines[2], "| 0      | pooled       | 128.0 MiB |");
        assert_eq!(lines[3], "| 0      | pooled again |         — |");
    }

    #[test]
    fn rows_are_fitted_to_the_header() {
        let mut t = Table::new([("a", Align::Left), ("b", Align::Right)]);
        t.row(["1"]);
        t.row(["1", "2", "3"]);
        assert_eq!(t.rows()[0], ["1", ""]);
        assert_eq!(t.rows()[1], ["1", "2"]);
        assert!(t.render(TableFormat::Markdown).contains("| 1   |   2 |"));
    }
}

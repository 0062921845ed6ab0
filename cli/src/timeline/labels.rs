//! Where the labels of a panel's phases and events go: in a lane above the plot, in as many
//! rows as it takes for no two labels to overlap. Each label starts at its moment (or as
//! near as the lane allows) and takes the first row where it clears the label before it by
//! [`GAP`] pixels; widths are measured in the font that draws them ([`super::font`]).

use super::font::text_width;

/// Pixels kept free between two labels of a row.
pub const GAP: f64 = 6.0;
/// Height of a row of labels, in pixels.
pub const ROW_HEIGHT: f64 = 16.0;
/// Size of the labels' text, in pixels.
pub const FONT_SIZE: f64 = 12.0;

/// A rectangle in pixels (`x`, `y`: its top-left corner).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rect {
    /// Left edge.
    pub x: f64,
    /// Top edge.
    pub y: f64,
    /// Width.
    pub width: f64,
    /// Height.
    pub height: f64,
}

impl Rect {
    /// Whether the two rectangles share any area (touching edges do not count).
    pub fn overlaps(&self, other: &Rect) -> bool {
        self.x < other.x + other.width
            && other.x < self.x + self.width
            && self.y < other.y + other.height
            && other.y < self.y + self.height
    }
}

/// A label placed in the lane.
#[derive(Debug, Clone, PartialEq)]
pub struct Placed {
    /// Index of the label in the list given to [`place`].
    pub index: usize,
    /// The text.
    pub text: String,
    /// The pixel column of its moment (where its leader line goes).
    pub anchor: f64,
    /// Its row, 0 at the top.
    pub row: usize,
    /// Its bounding box.
    pub bounds: Rect,
}

/// Places `labels` (text, pixel column of its moment) in a lane from `left` to `right` whose
/// top is at `top`: each label as far left as its moment (shifted left to stay in the lane),
/// in the first row where it clears the labels already there. Returns them in the order
/// given, with the number of rows used.
pub fn place(labels: &[(String, f64)], left: f64, right: f64, top: f64) -> (Vec<Placed>, usize) {
    let mut order: Vec<usize> = (0..labels.len()).collect();
    order.sort_by(|&a, &b| labels[a].1.total_cmp(&labels[b].1));
    // Right end of the last label in each row.
    let mut rows: Vec<f64> = Vec::new();
    let mut placed: Vec<Placed> = Vec::with_capacity(labels.len());
    for i in order {
        let (text, anchor) = &labels[i];
        let width = text_width(text, FONT_SIZE);
        let x = (anchor + 3.0).min(right - width).max(left);
        let row = match rows.iter().position(|&end| x >= end + GAP) {
            Some(r) => r,
            None => {
                rows.push(f64::NEG_INFINITY);
                rows.len() - 1
            }
        };
        rows[row] = x + width;
        placed.push(Placed {
            index: i,
            text: text.clone(),
            anchor: *anchor,
            row,
            bounds: Rect {
                x,
                y: top + row as f64 * ROW_HEIGHT,
                width,
                height: ROW_HEIGHT - 2.0,
            },
        });
    }
    placed.sort_by_key(|p| p.index);
    (placed, rows.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_overlap(placed: &[Placed]) {
        for (i, a) in placed.iter().enumerate() {
            for b in &placed[i + 1..] {
                assert!(!a.bounds.overlaps(&b.bounds), "{a:?} overlaps {b:?}");
            }
        }
    }

    #[test]
    fn labels_at_the_same_moment_take_rows_and_never_overlap() {
        let labels: Vec<(String, f64)> = ["pooled", "pooled → plain", "plain", "plain → pooled"]
            .iter()
            .map(|t| (t.to_string(), 100.0))
            .collect();
        let (placed, rows) = place(&labels, 0.0, 800.0, 10.0);
        assert_eq!(rows, 4);
        no_overlap(&placed);
        assert_eq!(placed[0].text, "pooled");
    }

    #[test]
    fn far_apart_labels_share_a_row_and_stay_in_the_lane() {
        let labels = vec![
            ("a".to_string(), 10.0),
            ("b".to_string(), 400.0),
            ("a long label at the right end".to_string(), 795.0),
        ];
        let (placed, rows) = place(&labels, 0.0, 800.0, 0.0);
        assert_eq!(rows, 1);
        no_overlap(&placed);
        for p in &placed {
            assert!(
                p.bounds.x >= 0.0 && p.bounds.x + p.bounds.width <= 800.0,
                "{p:?}"
            );
        }
    }

    #[test]
    fn rects_overlap_only_with_shared_area() {
        let r = |x, y| Rect {
            x,
            y,
            width: 10.0,
            height: 10.0,
        };
        assert!(r(0.0, 0.0).overlaps(&r(5.0, 5.0)));
        assert!(!r(0.0, 0.0).overlaps(&r(10.0, 0.0)));
        assert!(!r(0.0, 0.0).overlaps(&r(0.0, 10.0)));
    }
}

//! The one font of the pictures: DejaVu Sans, shipped inside `rmm` (`cli/assets`, under the
//! Bitstream Vera licence in `DejaVuSans.LICENSE`), so that a PNG looks the same on every
//! machine and the layout measures text with the font that draws it.

/// The font file.
pub const DEJAVU_SANS: &[u8] = include_bytes!("../../assets/DejaVuSans.ttf");

/// The family the SVG asks for: DejaVu Sans where it is installed, else the viewer's sans-serif.
pub const FAMILY: &str = "DejaVu Sans, sans-serif";

/// Width in pixels of `text` drawn at `size` pixels in DejaVu Sans (the sum of the glyphs'
/// advances; characters the font lacks count as wide as an `M`).
pub fn text_width(text: &str, size: f64) -> f64 {
    let Ok(face) = ttf_parser::Face::parse(DEJAVU_SANS, 0) else {
        // The shipped font always parses; a generous estimate otherwise.
        return text.chars().count() as f64 * size * 0.7;
    };
    let em = f64::from(face.units_per_em().max(1));
    let advance = |c: char| {
        face.glyph_index(c)
            .or_else(|| face.glyph_index('M'))
            .and_then(|g| face.glyph_hor_advance(g))
            .map_or(em * 0.7, f64::from)
    };
    text.chars().map(advance).sum::<f64>() / em * size
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widths_grow_with_text_and_size() {
        let one = text_width("pooled", 12.0);
        assert!(one > 20.0 && one < 60.0, "{one}");
        assert!((text_width("pooled", 24.0) - 2.0 * one).abs() < 1e-9);
        assert!(text_width("pooled again", 12.0) > one);
        assert_eq!(text_width("", 12.0), 0.0);
        assert!(text_width("→", 12.0) > 0.0);
    }
}

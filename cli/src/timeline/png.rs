//! SVG to PNG: the SVG plot rasterized by resvg, its text in the shipped font
//! ([`super::font`]), on a white background.

use std::sync::Arc;

use resvg::{tiny_skia, usvg};

use super::TimelineError;
use super::font::DEJAVU_SANS;

/// Rasterizes `svg` at its own size (one pixel per SVG unit) and encodes it as PNG.
///
/// # Errors
/// [`TimelineError::Render`] when the SVG cannot be read, rasterized or encoded as PNG.
pub fn svg_to_png(svg: &str) -> Result<Vec<u8>, TimelineError> {
    let mut fonts = usvg::fontdb::Database::new();
    fonts.load_font_data(DEJAVU_SANS.to_vec());
    fonts.set_sans_serif_family("DejaVu Sans");
    let options = usvg::Options {
        font_family: "DejaVu Sans".into(),
        fontdb: Arc::new(fonts),
        ..usvg::Options::default()
    };
    let tree = usvg::Tree::from_str(svg, &options)
        .map_err(|e| TimelineError::Render(format!("reading the SVG to rasterize it: {e}")))?;
    let size = tree.size().to_int_size();
    let mut pixmap = tiny_skia::Pixmap::new(size.width(), size.height()).ok_or_else(|| {
        TimelineError::Render(format!(
            "no bitmap of {} × {} pixels",
            size.width(),
            size.height()
        ))
    })?;
    pixmap.fill(tiny_skia::Color::WHITE);
    resvg::render(&tree, tiny_skia::Transform::default(), &mut pixmap.as_mut());
    pixmap
        .encode_png()
        .map_err(|e| TimelineError::Render(format!("encoding the PNG: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_svg_becomes_a_png_of_its_size() {
        let svg = r#"<svg xmlns="http://www.w3.org/2000/svg" width="40" height="20">
            <text x="2" y="15" font-family="sans-serif" font-size="12">ab</text></svg>"#;
        let png = svg_to_png(svg).unwrap();
        let image = tiny_skia::Pixmap::decode_png(&png).unwrap();
        assert_eq!((image.width(), image.height()), (40, 20));
        // The text drew dark pixels (the font was found).
        assert!(image.pixels().iter().any(|p| p.red() < 128));
        assert!(svg_to_png("not svg").is_err());
    }
}

//! Which picture `--plot FILE` writes: PNG when the name ends in `.png`, SVG for `.svg` or no
//! extension; any other extension is an error before any work is done.

use std::path::Path;

/// A picture format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlotFormat {
    /// Scalable vector graphics (text stays text).
    Svg,
    /// A bitmap (rendered from the SVG with the shipped font).
    Png,
}

impl PlotFormat {
    /// The format `path`'s extension names (case does not matter); an error that names the
    /// option, the file and the formats there are for any other extension.
    ///
    /// # Errors
    /// A message naming `option`, `path` and the formats when the extension is not `svg` or `png`.
    pub fn from_path(option: &str, path: &Path) -> Result<PlotFormat, String> {
        let ext = path
            .extension()
            .map(|e| e.to_string_lossy().to_ascii_lowercase());
        match ext.as_deref() {
            None | Some("svg") => Ok(PlotFormat::Svg),
            Some("png") => Ok(PlotFormat::Png),
            Some(other) => Err(format!(
                "{option} {}: cannot write a .{other} picture; name the file .svg (vector) or \
                 .png (bitmap)",
                path.display()
            )),
        }
    }

    /// What the file holds, for messages (`"SVG plot"`).
    pub fn describe(self) -> &'static str {
        match self {
            PlotFormat::Svg => "SVG plot",
            PlotFormat::Png => "PNG plot",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_extension_picks_the_format_and_others_are_refused() {
        let f = |p: &str| PlotFormat::from_path("--plot", Path::new(p));
        assert_eq!(f("a/x.png"), Ok(PlotFormat::Png));
        assert_eq!(f("X.PNG"), Ok(PlotFormat::Png));
        assert_eq!(f("x.svg"), Ok(PlotFormat::Svg));
        assert_eq!(f("timeline"), Ok(PlotFormat::Svg));
        let e = f("x.jpg").unwrap_err();
        assert!(
            e.contains("--plot x.jpg") && e.contains(".svg") && e.contains(".png"),
            "{e}"
        );
    }
}

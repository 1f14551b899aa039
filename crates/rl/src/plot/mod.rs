//! Pictures of a run, drawn with `plotters` as SVG and PNG side by side:
//! the memory timeline per tag ([`memory_timeline`]), one step transition
//! by transition ([`memory_transitions`]) and the reward curve
//! ([`reward_curve`]). Each is a [`Picture`] that [`Picture::write`] puts
//! next to `metrics.jsonl` as `<stem>.svg` and `<stem>.png`.
//!
//! The PNG's labels use a subset of DejaVu Sans embedded in the binary
//! (`assets/DejaVuSans-subset.ttf`, 22 KiB: Latin-1 and a few symbols),
//! rendered by `ab_glyph`: no system fonts are read, so the pictures are
//! the same on every machine. The SVG names the same font family and lets
//! the viewer draw the text.

mod curve;
mod timeline;
mod workers;

pub use curve::reward_curve;
pub use timeline::{memory_timeline, memory_transitions, thin, MAX_DRAWN_EVENTS, TIME_SLICES};
pub use workers::workers_timeline;

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::{Error, Result};

/// The embedded font (see the module doc and `assets/DejaVuSans-LICENSE.txt`).
const FONT: &[u8] = include_bytes!("../../assets/DejaVuSans-subset.ttf");

/// The one font family the charts use; it is registered under this name.
pub(crate) const FAMILY: &str = "sans-serif";

/// Colours for series, in order (colour-blind-safe Okabe–Ito palette).
const PALETTE: [RGBColor; 8] = [
    RGBColor(0x00, 0x72, 0xB2),
    RGBColor(0xE6, 0x9F, 0x00),
    RGBColor(0x00, 0x9E, 0x73),
    RGBColor(0xCC, 0x79, 0xA7),
    RGBColor(0x56, 0xB4, 0xE9),
    RGBColor(0xD5, 0x5E, 0x00),
    RGBColor(0xF0, 0xE4, 0x42),
    RGBColor(0x00, 0x00, 0x00),
];

/// The colour of series `i` (the palette repeats past eight).
pub fn color(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// A chart in both formats.
#[derive(Debug, Clone)]
pub struct Picture {
    /// An SVG document.
    pub svg: String,
    /// A PNG file (8-bit RGB).
    pub png: Vec<u8>,
    /// The size of both, in pixels.
    pub width: u32,
    pub height: u32,
}

impl Picture {
    /// Writes `dir/<stem>.svg` and `dir/<stem>.png`.
    pub fn write(&self, dir: &Path, stem: &str) -> Result<()> {
        for (ext, bytes) in [("svg", self.svg.as_bytes()), ("png", &self.png[..])] {
            let path = dir.join(format!("{stem}.{ext}"));
            std::fs::write(&path, bytes).map_err(|e| Error::io(&path, e))?;
        }
        Ok(())
    }
}

/// A chart that can draw itself on any `plotters` backend.
pub(crate) trait Chart {
    /// A short name for error messages.
    const NAME: &'static str;
    fn size(&self) -> (u32, u32);
    fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
    ) -> std::result::Result<(), DrawingAreaErrorKind<DB::ErrorType>>;
}

/// Draws `chart` twice: into an SVG string and into an RGB buffer encoded
/// as PNG.
pub(crate) fn render<C: Chart>(chart: &C) -> Result<Picture> {
    register_font();
    let (width, height) = chart.size();
    let fail = |reason: String| Error::Plot {
        what: C::NAME,
        reason,
    };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (width, height)).into_drawing_area();
        chart.draw(&root).map_err(|e| fail(e.to_string()))?;
        root.present().map_err(|e| fail(e.to_string()))?;
    }
    let pixels = (width as usize)
        .checked_mul(height as usize)
        .and_then(|p| p.checked_mul(3))
        .ok_or_else(|| fail(format!("{width}×{height} pixels is too large")))?;
    let mut rgb = vec![0u8; pixels];
    {
        let root = BitMapBackend::with_buffer(&mut rgb, (width, height)).into_drawing_area();
        chart.draw(&root).map_err(|e| fail(e.to_string()))?;
        root.present().map_err(|e| fail(e.to_string()))?;
    }
    let png = encode_png(&rgb, width, height).map_err(|e| fail(format!("PNG: {e}")))?;
    Ok(Picture {
        svg,
        png,
        width,
        height,
    })
}

fn encode_png(
    rgb: &[u8],
    width: u32,
    height: u32,
) -> std::result::Result<Vec<u8>, png::EncodingError> {
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, width, height);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header()?;
    writer.write_image_data(rgb)?;
    writer.finish()?;
    Ok(out)
}

fn register_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // The font is part of the binary and parsed in a test: it is valid.
        let _ = plotters::style::register_font(FAMILY, FontStyle::Normal, FONT);
    });
}

/// Text of `size` pixels in the charts' font.
pub(crate) fn text(size: u32) -> TextStyle<'static> {
    (FAMILY, size).into_font().color(&BLACK)
}

/// A legend in the area `area` (right of a chart): one swatch and name per
/// entry, top to bottom.
pub(crate) fn legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    top: i32,
    entries: &[(String, ShapeStyle)],
) -> std::result::Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    for (i, (name, style)) in entries.iter().enumerate() {
        let y = top + 20 * i as i32;
        area.draw(&Rectangle::new([(8, y), (20, y + 12)], *style))?;
        area.draw(&Text::new(name.as_str(), (26, y), text(12)))?;
    }
    Ok(())
}

/// `(min, max)` of finite values, `None` if there are none.
fn extent(values: impl IntoIterator<Item = f64>) -> Option<(f64, f64)> {
    values
        .into_iter()
        .filter(|v| v.is_finite())
        .fold(None, |acc, v| match acc {
            None => Some((v, v)),
            Some((lo, hi)) => Some((lo.min(v), hi.max(v))),
        })
}

/// A range that is not empty: `(lo, lo + 1)` for a single value.
fn widen((lo, hi): (f64, f64)) -> std::ops::Range<f64> {
    if hi > lo {
        lo..hi
    } else {
        lo..lo + 1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_font_parses() {
        assert!(plotters::style::register_font("test-font", FontStyle::Normal, FONT).is_ok());
    }

    #[test]
    fn ranges_are_never_empty() {
        assert_eq!(widen((3.0, 3.0)), 3.0..4.0);
        assert_eq!(widen((0.0, 2.0)), 0.0..2.0);
        assert_eq!(extent([f64::NAN, 2.0, -1.0]), Some((-1.0, 2.0)));
        assert_eq!(extent([f64::NAN]), None);
    }
}

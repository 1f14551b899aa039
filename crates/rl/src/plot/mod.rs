//! Pictures of a run as SVG, drawn by hand (no plotting dependency): the
//! memory timeline ([`memory_timeline`]) and the reward curve
//! ([`reward_curve`]). Both are plain strings to write next to
//! `metrics.jsonl`; any browser shows them.
//!
//! Every data series is a `<g class="series" data-name=… data-min=…
//! data-max=…>` group, so tests (and scripts) can find them without
//! reading coordinates.

mod curve;
mod timeline;

pub use curve::reward_curve;
pub use timeline::{memory_timeline, memory_transitions};

use std::fmt::Write;

/// Colours for series, in order (colour-blind-safe Okabe–Ito palette).
const PALETTE: [&str; 8] = [
    "#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000",
];

fn color(i: usize) -> &'static str {
    PALETTE[i % PALETTE.len()]
}

/// Text safe inside XML elements and attribute values.
pub(crate) fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

/// Bytes as `1.5 GiB`.
pub fn human_bytes(b: f64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b;
    let mut u = 0;
    while v.abs() >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{v:.0} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

/// The plotting area and the data ranges it shows.
struct Frame {
    width: f64,
    height: f64,
    left: f64,
    right: f64,
    top: f64,
    bottom: f64,
    x: (f64, f64),
    y: (f64, f64),
}

impl Frame {
    fn px(&self, x: f64) -> f64 {
        let (lo, hi) = self.x;
        self.left + (x - lo) / (hi - lo) * (self.width - self.left - self.right)
    }

    fn py(&self, y: f64) -> f64 {
        let (lo, hi) = self.y;
        self.height - self.bottom - (y - lo) / (hi - lo) * (self.height - self.top - self.bottom)
    }

    /// Opens the document: background, title, axes with `ticks` labelled
    /// by the formatters, and axis titles.
    fn open(
        &self,
        title: &str,
        x_label: &str,
        fx: &dyn Fn(f64) -> String,
        fy: &dyn Fn(f64) -> String,
    ) -> String {
        let (w, h) = (self.width, self.height);
        let mut s = format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"{w}\" height=\"{h}\" fill=\"white\"/>\n<text x=\"{}\" y=\"22\" font-size=\"15\" text-anchor=\"middle\">{}</text>\n",
            w / 2.0,
            escape(title)
        );
        let (x0, x1, y0, y1) = (self.left, w - self.right, self.top, h - self.bottom);
        s.push_str("<g class=\"axes\" stroke=\"#999\" fill=\"none\">\n");
        let _ = writeln!(s, "<path d=\"M{x0:.1},{y0:.1} V{y1:.1} H{x1:.1}\"/>");
        s.push_str("</g>\n<g class=\"ticks\" fill=\"#333\">\n");
        for v in ticks(self.y.0, self.y.1, 5) {
            let y = self.py(v);
            let _ = writeln!(
                s,
                "<line x1=\"{x0:.1}\" x2=\"{x1:.1}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#eee\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
                x0 - 6.0,
                y + 4.0,
                escape(&fy(v))
            );
        }
        for v in ticks(self.x.0, self.x.1, 8) {
            let x = self.px(v);
            let _ = writeln!(
                s,
                "<text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
                y1 + 16.0,
                escape(&fx(v))
            );
        }
        let _ = writeln!(
            s,
            "</g>\n<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            (x0 + x1) / 2.0,
            h - 10.0,
            escape(x_label)
        );
        s
    }

    /// A legend entry (colour swatch and name) at row `i`, right of the plot.
    fn legend(&self, s: &mut String, i: usize, name: &str, fill: &str) {
        let x = self.width - self.right + 12.0;
        let y = self.top + 10.0 + 18.0 * i as f64;
        let _ = writeln!(
            s,
            "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"12\" height=\"12\" fill=\"{fill}\"/><text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
            y - 10.0,
            x + 18.0,
            y,
            escape(name)
        );
    }
}

/// About `n` round tick values covering `[lo, hi]`.
fn ticks(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    let span = hi - lo;
    if !(span > 0.0 && span.is_finite()) {
        return vec![lo];
    }
    let raw = span / n as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| span / s <= n as f64)
        .unwrap_or(10.0 * mag);
    let first = (lo / step).ceil() * step;
    (0..)
        .map(|i| first + i as f64 * step)
        .take_while(|v| *v <= hi + step * 1e-9)
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_cover_the_range() {
        let close = |a: Vec<f64>, b: &[f64]| {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-9)
        };
        assert!(close(ticks(0.0, 1.0, 5), &[0.0, 0.2, 0.4, 0.6, 0.8, 1.0]));
        assert!(close(
            ticks(0.0, 100.0, 8),
            &[0.0, 20.0, 40.0, 60.0, 80.0, 100.0]
        ));
        assert!(close(ticks(0.05, 0.95, 4), &[0.25, 0.5, 0.75]));
        assert_eq!(ticks(3.0, 3.0, 5), vec![3.0]);
    }

    #[test]
    fn bytes_and_escapes() {
        assert_eq!(human_bytes(1536.0 * 1024.0 * 1024.0), "1.5 GiB");
        assert_eq!(human_bytes(12.0), "12 B");
        assert_eq!(escape("a<b & \"c\""), "a&lt;b &amp; &quot;c&quot;");
    }
}

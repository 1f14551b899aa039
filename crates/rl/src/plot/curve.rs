//! The reward curve: the mean training score per step and the held-out
//! accuracy at each evaluation, overall and per `data_source` when the
//! held-out rows name more than one (verl logs `val-core/{source}/…`).

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::{color, extent, legend, render, text, widen, Chart, Picture};
use crate::Result;

/// `scores`: `(step, critic/score/mean)`; `accuracy`: `(step, eval/accuracy)`
/// (step 0 is the starting checkpoint); `by_source`: each data source's
/// accuracy at the same evaluations, drawn thinner when there are two or
/// more (one source is the overall line). The y axis spans at least [0, 1].
/// The legend gives each series' range; the first and last overall
/// accuracies are written beside their markers.
pub fn reward_curve(
    scores: &[(usize, f64)],
    accuracy: &[(usize, f64)],
    by_source: &[(String, Vec<(usize, f64)>)],
    title: &str,
) -> Result<Picture> {
    render(&Curve {
        scores,
        accuracy,
        by_source: if by_source.len() >= 2 { by_source } else { &[] },
        title,
    })
}

struct Curve<'a> {
    scores: &'a [(usize, f64)],
    accuracy: &'a [(usize, f64)],
    by_source: &'a [(String, Vec<(usize, f64)>)],
    title: &'a str,
}

fn finite(points: &[(usize, f64)]) -> Vec<(f64, f64)> {
    points
        .iter()
        .filter(|p| p.1.is_finite())
        .map(|&(s, v)| (s as f64, v))
        .collect()
}

impl Chart for Curve<'_> {
    const NAME: &'static str = "reward curve";

    fn size(&self) -> (u32, u32) {
        (900, 420)
    }

    fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
    ) -> std::result::Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
        root.fill(&WHITE)?;
        let sources = self.by_source.iter().flat_map(|(_, points)| points);
        let all = || {
            self.scores
                .iter()
                .chain(self.accuracy)
                .chain(sources.clone())
        };
        let x = widen(extent(all().map(|p| p.0 as f64)).unwrap_or((0.0, 1.0)));
        // Steps are whole: no more labels than steps in the span (a short
        // run's fractional ticks printed "1 1 1 2 2").
        let x_labels = ((x.end - x.start).round() as usize + 1).clamp(2, 10);
        let y = extent(all().map(|p| p.1)).unwrap_or((0.0, 1.0));
        let body = root.titled(self.title, text(18))?;
        let (plot, side) = body.split_horizontally(640);
        let mut chart = ChartBuilder::on(&plot)
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d(x, y.0.min(0.0)..y.1.max(1.0))?;
        chart
            .configure_mesh()
            .light_line_style(RGBColor(0xf2, 0xf2, 0xf2))
            .max_light_lines(1)
            .x_desc("step")
            .x_labels(x_labels)
            .x_label_formatter(&|v| format!("{v:.0}"))
            .y_label_formatter(&|v| format!("{v:.2}"))
            .label_style(text(12))
            .axis_desc_style(text(13))
            .draw()?;

        let mut entries = Vec::new();
        let series = [
            ("critic/score/mean".to_owned(), self.scores, false),
            ("eval/accuracy".to_owned(), self.accuracy, true),
        ]
        .into_iter()
        .chain(
            (self.by_source.iter())
                .map(|(source, points)| (format!("eval/accuracy/{source}"), &points[..], false)),
        );
        for (i, (name, points, marks)) in series.enumerate() {
            let pts = finite(points);
            let Some((lo, hi)) = extent(pts.iter().map(|p| p.1)) else {
                continue;
            };
            let c = color(i);
            let width = if i < 2 { 2 } else { 1 };
            chart.draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(width)))?;
            if marks {
                chart.draw_series(pts.iter().map(|&p| Circle::new(p, 4, c.filled())))?;
                let ends = [pts.first(), pts.last()];
                for (j, &(s, v)) in ends.into_iter().flatten().enumerate() {
                    if j == 1 && pts.len() < 2 {
                        break;
                    }
                    let (px, py) = chart.backend_coord(&(s, v));
                    let h = if j == 0 { HPos::Left } else { HPos::Right };
                    let style = text(12).color(&c).pos(Pos::new(h, VPos::Bottom));
                    root.draw(&Text::new(format!("{v:.2}"), (px, py - 7), style))?;
                }
            }
            entries.push((format!("{name}  ({lo:.2}–{hi:.2})"), c.filled()));
        }
        legend(&side, 40, &entries)
    }
}

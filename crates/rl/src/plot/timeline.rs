//! The memory timeline: bytes resident per tag over the run, stacked, as a
//! step chart (memory changes at transitions and stays put between them),
//! with the phase changes and the device capacity.

use std::collections::{BTreeSet, HashSet};

use colo_mem::{fmt_bytes, tags, Event, EventKind};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::{color, extent, legend, render, text, widen, Chart, Picture};
use crate::Result;

/// The tags in the order they are stacked: the engines' tags as
/// [`colo_mem::tags`] lists them, then any others alphabetically.
fn tag_order(events: &[Event]) -> Vec<String> {
    let known = [
        tags::TRAIN_PARAMS,
        tags::TRAIN_GRADS,
        tags::OPTIMIZER,
        tags::ACTIVATIONS,
        tags::REF,
        tags::WEIGHTS,
        tags::KV_CACHE,
        tags::CUDA_GRAPH,
    ];
    let present: BTreeSet<&str> = events
        .iter()
        .flat_map(|e| e.per_tag.keys().map(String::as_str))
        .collect();
    let mut out: Vec<String> = known
        .iter()
        .filter(|t| present.contains(*t))
        .map(|t| t.to_string())
        .collect();
    out.extend(
        present
            .iter()
            .filter(|t| !known.contains(t))
            .map(|t| t.to_string()),
    );
    out
}

/// The timeline of `events` over time; `capacity` (bytes) is drawn as a
/// line when given. A run of more than [`MAX_DRAWN_EVENTS`] events is drawn
/// thinned (see [`thin`]); the legend's per-tag maxima are the whole run's.
pub fn memory_timeline(events: &[Event], capacity: Option<u64>, title: &str) -> Result<Picture> {
    let drawn = thin(events, TIME_SLICES);
    let points = drawn.iter().map(|e| e.t_s).collect();
    let mut chart = Timeline::new(&drawn, points, capacity, title, "time (s)");
    chart.maxima = maxima(events, &chart.order);
    render(&chart)
}

/// Events a time-axis picture draws at most before it is thinned: a
/// 100-step run records ~1,700; a 10,000-step one ~170,000, whose every
/// event would make a ~50 MB SVG of bands finer than its pixels.
pub const MAX_DRAWN_EVENTS: usize = 4000;

/// Time slices of a thinned picture (the plot is ~700 pixels wide).
pub const TIME_SLICES: usize = 2000;

/// `events` as drawn: all of them up to [`MAX_DRAWN_EVENTS`]; past that,
/// in each of `slices` equal slices of time the event with the most bytes
/// resident (so every peak stays in the picture), the first and the last
/// event, and each phase's first change (its labelled line), in order.
pub fn thin(events: &[Event], slices: usize) -> std::borrow::Cow<'_, [Event]> {
    if events.len() <= MAX_DRAWN_EVENTS || slices == 0 {
        return std::borrow::Cow::Borrowed(events);
    }
    let (t0, t1) = (events[0].t_s, events[events.len() - 1].t_s);
    let span = (t1 - t0).max(f64::MIN_POSITIVE);
    let mut best: Vec<Option<usize>> = vec![None; slices];
    let mut keep = BTreeSet::from([0, events.len() - 1]);
    let mut phases = HashSet::new();
    for (i, e) in events.iter().enumerate() {
        let slice = (((e.t_s - t0) / span * slices as f64) as usize).min(slices - 1);
        if best[slice].is_none_or(|b| e.resident_bytes > events[b].resident_bytes) {
            best[slice] = Some(i);
        }
        if e.kind == EventKind::Phase && phases.insert(e.phase.as_str()) {
            keep.insert(i);
        }
    }
    keep.extend(best.into_iter().flatten());
    std::borrow::Cow::Owned(keep.into_iter().map(|i| events[i].clone()).collect())
}

/// The most bytes each tag of `order` held over `events`.
fn maxima(events: &[Event], order: &[String]) -> Vec<u64> {
    order
        .iter()
        .map(|t| {
            events
                .iter()
                .map(|e| e.per_tag.get(t).copied().unwrap_or(0))
                .max()
                .unwrap_or(0)
        })
        .collect()
}

/// The same picture with every transition given the same width instead of
/// its duration: for one step, where a switch takes milliseconds beside a
/// generation of seconds but is the thing to see.
pub fn memory_transitions(events: &[Event], capacity: Option<u64>, title: &str) -> Result<Picture> {
    let points = (0..events.len()).map(|i| i as f64).collect();
    let mut chart = Timeline::new(
        events,
        points,
        capacity,
        title,
        "transition (equal widths, not time)",
    );
    chart.maxima = maxima(events, &chart.order);
    render(&chart)
}

struct Timeline<'a> {
    events: &'a [Event],
    /// The x position of each event.
    x: Vec<f64>,
    capacity: Option<u64>,
    title: &'a str,
    x_label: &'a str,
    /// Transition indices: only whole numbers are labelled.
    integer_x: bool,
    order: Vec<String>,
    /// Each tag's most bytes (in `order`), for the legend: the whole run's,
    /// where `events` are thinned.
    maxima: Vec<u64>,
}

/// Phase lines drawn at most; past this only each phase's first change is
/// drawn, so the first step's choreography is labelled and the rest stays
/// legible.
const MAX_PHASE_LINES: usize = 60;

impl<'a> Timeline<'a> {
    fn new(
        events: &'a [Event],
        x: Vec<f64>,
        capacity: Option<u64>,
        title: &'a str,
        x_label: &'a str,
    ) -> Self {
        Timeline {
            integer_x: x_label.starts_with("transition"),
            order: tag_order(events),
            maxima: Vec::new(),
            events,
            x,
            capacity,
            title,
            x_label,
        }
    }

    /// The phase changes to draw: `(x, name)`.
    fn phases(&self) -> Vec<(f64, &str)> {
        let phases: Vec<(f64, &str)> = self
            .events
            .iter()
            .zip(&self.x)
            .filter(|(e, _)| e.kind == EventKind::Phase)
            .map(|(e, &x)| (x, e.phase.as_str()))
            .collect();
        if phases.len() <= MAX_PHASE_LINES {
            return phases;
        }
        let mut seen = HashSet::new();
        phases
            .into_iter()
            .filter(|(_, p)| seen.insert(*p))
            .collect()
    }

    /// The resident bytes of `tag` at each event.
    fn values(&self, tag: &str) -> Vec<f64> {
        self.events
            .iter()
            .map(|e| e.per_tag.get(tag).copied().unwrap_or(0) as f64)
            .collect()
    }

    /// The y axis in one binary unit, so that its ticks are round: the
    /// unit's name, its bytes, and the highest value (the most resident
    /// bytes of an event, or the capacity) in that unit.
    fn y_axis(&self) -> (&'static str, f64, f64) {
        let top = extent(
            self.events
                .iter()
                .map(|e| e.per_tag.values().sum::<u64>() as f64)
                .chain(self.capacity.map(|c| c as f64)),
        )
        .map_or(1.0, |(_, hi)| hi.max(1.0));
        let (unit, scale) = [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)]
            .into_iter()
            .map(|(u, shift)| (u, (1u64 << shift) as f64))
            .find(|&(_, s)| top >= 2.0 * s)
            .unwrap_or(("B", 1.0));
        (unit, scale, top / scale)
    }
}

impl Chart for Timeline<'_> {
    const NAME: &'static str = "memory timeline";

    fn size(&self) -> (u32, u32) {
        (1000, 520)
    }

    fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
    ) -> std::result::Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
        root.fill(&WHITE)?;
        let phases = self.phases();
        // Room above the plot for the phase names, written upwards.
        let longest = phases
            .iter()
            .map(|p| p.1.chars().count())
            .max()
            .unwrap_or(0);
        let label_band = (longest as u32 * 6 + 12).clamp(16, 130);
        let body = root.titled(self.title, text(18))?;
        let (plot, side) = body.split_horizontally(790);

        let x = widen(extent(self.x.iter().copied()).unwrap_or((0.0, 1.0)));
        let (unit, scale, top) = self.y_axis();
        let mut chart = ChartBuilder::on(&plot)
            .margin(8)
            .margin_top(label_band)
            .x_label_area_size(40)
            .y_label_area_size(80)
            .build_cartesian_2d(x.clone(), 0.0..top * 1.05)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .light_line_style(RGBColor(0xf2, 0xf2, 0xf2))
            .max_light_lines(1)
            .x_desc(self.x_label)
            .y_desc(format!("resident ({unit})"))
            .x_label_formatter(&|v| match self.integer_x && v.fract() != 0.0 {
                true => String::new(),
                false => trim(*v),
            })
            .y_label_formatter(&|v| format!("{} {unit}", trim(*v)))
            .label_style(text(12))
            .axis_desc_style(text(13))
            .draw()?;

        // Stacked step bands: tag k spans [Σ_{j<k}, Σ_{j≤k}] from each event
        // to the next.
        let mut entries = Vec::new();
        let mut below = vec![0.0f64; self.events.len()];
        for (k, tag) in self.order.iter().enumerate() {
            let vals: Vec<f64> = self.values(tag).iter().map(|v| v / scale).collect();
            let above: Vec<f64> = below.iter().zip(&vals).map(|(b, v)| b + v).collect();
            let style = color(k).filled();
            chart.draw_series(std::iter::once(Polygon::new(
                step_outline(&self.x, &below, &above),
                style,
            )))?;
            let hi = fmt_bytes(self.maxima.get(k).copied().unwrap_or(0));
            entries.push((format!("{tag}  (max {hi})"), style));
            below = above;
        }

        let red = RGBColor(0xcc, 0x00, 0x00);
        if let Some(bytes) = self.capacity {
            let c = bytes as f64 / scale;
            chart.draw_series(DashedLineSeries::new(
                [(x.start, c), (x.end, c)],
                6,
                4,
                red.stroke_width(1),
            ))?;
            let (px, py) = chart.backend_coord(&(x.end, c));
            let style = text(12)
                .color(&red)
                .pos(Pos::new(HPos::Right, VPos::Bottom));
            root.draw(&Text::new(
                format!("capacity {}", fmt_bytes(bytes)),
                (px - 4, py - 3),
                style,
            ))?;
            entries.push(("device capacity".to_owned(), red.filled()));
        }

        let grey = RGBColor(0x88, 0x88, 0x88);
        draw_phases(root, &mut chart, &phases, top * 1.05, grey)?;
        legend(&side, label_band as i32, &entries)?;
        if !phases.is_empty() {
            let y = label_band as i32 + 20 * entries.len() as i32 + 8;
            side.draw(&Text::new(
                "grey dashes: phase changes",
                (8, y),
                text(11).color(&grey),
            ))?;
        }
        Ok(())
    }
}

/// A dashed line at each phase change from the x axis up to `top`, named
/// (upwards, above the plot) where there is room.
fn draw_phases<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    chart: &mut ChartContext<'_, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    phases: &[(f64, &str)],
    top: f64,
    grey: RGBColor,
) -> std::result::Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let mut last_label: Option<i32> = None;
    for &(at, name) in phases {
        chart.draw_series(DashedLineSeries::new(
            [(at, 0.0), (at, top)],
            2,
            3,
            grey.stroke_width(1),
        ))?;
        let (px, py) = chart.backend_coord(&(at, top));
        if last_label.is_none_or(|l| px.saturating_sub(l) >= 13) {
            let style = text(10)
                .color(&RGBColor(0x44, 0x44, 0x44))
                .transform(FontTransform::Rotate270);
            root.draw(&Text::new(name, (px - 6, py - 4), style))?;
            last_label = Some(px);
        }
    }
    Ok(())
}

/// `v` with at most three decimals and no trailing zeros.
fn trim(v: f64) -> String {
    format!("{v:.3}")
        .trim_end_matches('0')
        .trim_end_matches('.')
        .to_owned()
}

/// The outline of one stacked band: along `above` left to right, back along
/// `below` right to left, each value held until the next event.
fn step_outline(x: &[f64], below: &[f64], above: &[f64]) -> Vec<(f64, f64)> {
    let n = x.len();
    let next = |i: usize| x[(i + 1).min(n - 1)];
    let mut points = Vec::with_capacity(4 * n);
    for i in 0..n {
        points.push((x[i], above[i]));
        points.push((next(i), above[i]));
    }
    for i in (0..n).rev() {
        points.push((next(i), below[i]));
        points.push((x[i], below[i]));
    }
    points
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_band_holds_each_value_until_the_next_event() {
        let pts = step_outline(&[0.0, 1.0, 3.0], &[0.0, 0.0, 0.0], &[2.0, 5.0, 1.0]);
        assert_eq!(
            pts,
            [
                (0.0, 2.0),
                (1.0, 2.0),
                (1.0, 5.0),
                (3.0, 5.0),
                (3.0, 1.0),
                (3.0, 1.0),
                (3.0, 0.0),
                (3.0, 0.0),
                (3.0, 0.0),
                (1.0, 0.0),
                (1.0, 0.0),
                (0.0, 0.0)
            ]
        );
    }
}

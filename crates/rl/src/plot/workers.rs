//! A data-parallel run's memory, one line per worker: the bytes resident on
//! each worker's device over time, so that workers can be compared at a
//! glance (each worker's own per-tag picture is in its directory).

use colo_mem::{fmt_bytes, Event};
use plotters::coord::Shift;
use plotters::prelude::*;

use super::timeline::{thin, TIME_SLICES};
use super::{color, extent, legend, render, text, widen, Chart, Picture};
use crate::Result;

/// `workers`: each worker's name and timeline (times from its own pool's
/// start; the workers start together, so the axes line up within the
/// start-up's spread). `capacity`: one device's, drawn when given.
pub fn workers_timeline(
    workers: &[(String, Vec<Event>)],
    capacity: Option<u64>,
    title: &str,
) -> Result<Picture> {
    render(&Workers {
        workers,
        capacity,
        title,
    })
}

struct Workers<'a> {
    workers: &'a [(String, Vec<Event>)],
    capacity: Option<u64>,
    title: &'a str,
}

impl Chart for Workers<'_> {
    const NAME: &'static str = "workers' memory";

    fn size(&self) -> (u32, u32) {
        (1000, 420)
    }

    fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
    ) -> std::result::Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
        root.fill(&WHITE)?;
        let body = root.titled(self.title, text(18))?;
        let (plot, side) = body.split_horizontally(790);
        let events = || self.workers.iter().flat_map(|(_, e)| e.iter());
        let x = widen(extent(events().map(|e| e.t_s)).unwrap_or((0.0, 1.0)));
        let top = extent(
            events()
                .map(|e| e.resident_bytes as f64)
                .chain(self.capacity.map(|c| c as f64)),
        )
        .map_or(1.0, |(_, hi)| hi.max(1.0));
        let mib = (1u64 << 20) as f64;
        let mut chart = ChartBuilder::on(&plot)
            .margin(8)
            .margin_top(16)
            .x_label_area_size(40)
            .y_label_area_size(80)
            .build_cartesian_2d(x.clone(), 0.0..top / mib * 1.05)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .light_line_style(RGBColor(0xf2, 0xf2, 0xf2))
            .max_light_lines(1)
            .x_desc("time since the worker started (s)")
            .y_desc("resident (MiB)")
            .label_style(text(12))
            .axis_desc_style(text(13))
            .draw()?;
        let mut entries = Vec::new();
        for (k, (name, all)) in self.workers.iter().enumerate() {
            // A long run's line is drawn thinned, its peak kept (see
            // `timeline::thin`); the legend's peak is the whole run's.
            let evs = thin(all, TIME_SLICES);
            // A step line: memory changes at events and stays put between.
            let mut points = Vec::with_capacity(2 * evs.len());
            for (i, e) in evs.iter().enumerate() {
                if i > 0 {
                    points.push((e.t_s, evs[i - 1].resident_bytes as f64 / mib));
                }
                points.push((e.t_s, e.resident_bytes as f64 / mib));
            }
            let style = color(k).stroke_width(2);
            chart.draw_series(LineSeries::new(points, style))?;
            let peak = all.iter().map(|e| e.resident_bytes).max().unwrap_or(0);
            entries.push((
                format!("{name}  (peak {})", fmt_bytes(peak)),
                color(k).filled(),
            ));
        }
        if let Some(c) = self.capacity {
            let red = RGBColor(0xcc, 0x00, 0x00);
            let y = c as f64 / mib;
            chart.draw_series(DashedLineSeries::new(
                [(x.start, y), (x.end, y)],
                6,
                4,
                red.stroke_width(1),
            ))?;
            entries.push((format!("device capacity {}", fmt_bytes(c)), red.filled()));
        }
        legend(&side, 16, &entries)
    }
}

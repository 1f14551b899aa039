//! The memory timeline: bytes resident per tag over the run, stacked, as a
//! step chart (memory changes at transitions and stays put between them),
//! with the phase labels and the device capacity.

use std::collections::BTreeSet;
use std::fmt::Write;

use colo_mem::{tags, Event, EventKind};

use super::{color, escape, extent, human_bytes, Frame};

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

/// The timeline of `events` as an SVG document; `capacity` (bytes) is drawn
/// as a line when given.
pub fn memory_timeline(events: &[Event], capacity: Option<u64>, title: &str) -> String {
    chart(events, capacity, title, "time (s)")
}

/// The same picture with every transition given the same width instead of
/// its duration: for one step, where a switch takes milliseconds beside a
/// generation of seconds but is the thing to see.
pub fn memory_transitions(events: &[Event], capacity: Option<u64>, title: &str) -> String {
    let spaced: Vec<Event> = events
        .iter()
        .enumerate()
        .map(|(i, e)| Event {
            t_s: i as f64,
            ..e.clone()
        })
        .collect();
    chart(
        &spaced,
        capacity,
        title,
        "transition (equal widths, not time)",
    )
}

fn chart(events: &[Event], capacity: Option<u64>, title: &str, x_label: &str) -> String {
    let order = tag_order(events);
    let t = extent(events.iter().map(|e| e.t_s)).unwrap_or((0.0, 1.0));
    let top = extent(
        events
            .iter()
            .map(|e| e.per_tag.values().sum::<u64>() as f64)
            .chain(capacity.map(|c| c as f64)),
    )
    .map_or(1.0, |(_, hi)| hi.max(1.0));
    let frame = Frame {
        width: 960.0,
        height: 440.0,
        left: 80.0,
        right: 160.0,
        top: 70.0,
        bottom: 50.0,
        x: if t.1 > t.0 { t } else { (t.0, t.0 + 1.0) },
        y: (0.0, top * 1.05),
    };
    let mut s = frame.open(
        title,
        x_label,
        &|v| {
            format!("{v:.3}")
                .trim_end_matches('0')
                .trim_end_matches('.')
                .to_owned()
        },
        &human_bytes,
    );

    // Stacked step areas: tag k spans [Σ_{j<k}, Σ_{j≤k}] from each event to the next.
    let mut below = vec![0.0f64; events.len()];
    for (k, tag) in order.iter().enumerate() {
        let vals: Vec<f64> = events
            .iter()
            .map(|e| e.per_tag.get(tag).copied().unwrap_or(0) as f64)
            .collect();
        let above: Vec<f64> = below.iter().zip(&vals).map(|(b, v)| b + v).collect();
        let (lo, hi) = extent(vals.iter().copied()).unwrap_or((0.0, 0.0));
        let _ = writeln!(
            s,
            "<g class=\"series\" data-name=\"{}\" data-min=\"{lo}\" data-max=\"{hi}\">",
            escape(tag)
        );
        let _ = write!(
            s,
            "<path fill=\"{}\" fill-opacity=\"0.85\" stroke=\"none\" d=\"",
            color(k)
        );
        s.push_str(&step_outline(&frame, events, &below, &above));
        s.push_str("\"><title>");
        let _ = write!(s, "{}: up to {}", escape(tag), human_bytes(hi));
        s.push_str("</title></path>\n</g>\n");
        frame.legend(&mut s, k, tag, color(k));
        below = above;
    }

    if let Some(c) = capacity {
        let y = frame.py(c as f64);
        let _ = writeln!(
            s,
            "<g class=\"capacity\"><line x1=\"{:.1}\" x2=\"{:.1}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#c00\" stroke-dasharray=\"6 4\"/><text x=\"{:.1}\" y=\"{:.1}\" fill=\"#c00\" text-anchor=\"end\">capacity {}</text></g>",
            frame.left,
            frame.width - frame.right,
            frame.width - frame.right,
            y - 4.0,
            human_bytes(c as f64)
        );
    }
    phase_labels(&mut s, &frame, events);
    s.push_str("</svg>\n");
    s
}

/// The outline of one stacked band: along `above` left to right, back along
/// `below` right to left, each value held until the next event.
fn step_outline(f: &Frame, events: &[Event], below: &[f64], above: &[f64]) -> String {
    let mut d = String::new();
    let n = events.len();
    for i in 0..n {
        let (x0, x1) = (f.px(events[i].t_s), f.px(events[(i + 1).min(n - 1)].t_s));
        let y = f.py(above[i]);
        let _ = write!(
            d,
            "{}{x0:.1},{y:.1} L{x1:.1},{y:.1} ",
            if i == 0 { "M" } else { "L" }
        );
    }
    for i in (0..n).rev() {
        let (x0, x1) = (f.px(events[i].t_s), f.px(events[(i + 1).min(n - 1)].t_s));
        let y = f.py(below[i]);
        let _ = write!(d, "L{x1:.1},{y:.1} L{x0:.1},{y:.1} ");
    }
    d.push('Z');
    d
}

/// A dashed line at each phase change, labelled where there is room (every
/// line has its phase in a tooltip). A long run has more phase changes than
/// pixels: past `MAX_PHASE_LINES` only each phase's first change is drawn,
/// so the first step's choreography is labelled and the rest stays legible.
fn phase_labels(s: &mut String, f: &Frame, events: &[Event]) {
    const MAX_PHASE_LINES: usize = 60;
    s.push_str("<g class=\"phases\" font-size=\"10\" fill=\"#555\">\n");
    let phases: Vec<&Event> = events
        .iter()
        .filter(|e| e.kind == EventKind::Phase)
        .collect();
    let dense = phases.len() > MAX_PHASE_LINES;
    let mut seen = std::collections::HashSet::new();
    let mut last_label = f64::NEG_INFINITY;
    for e in phases {
        let first = seen.insert(e.phase.as_str());
        if dense && !first {
            continue;
        }
        let x = f.px(e.t_s);
        let name = escape(&e.phase);
        let _ = writeln!(
            s,
            "<line x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#bbb\" stroke-dasharray=\"2 3\"><title>{name} at {:.3} s</title></line>",
            f.top - 4.0,
            f.height - f.bottom,
            e.t_s
        );
        if x - last_label >= 14.0 {
            let y = f.top - 6.0;
            let _ = writeln!(
                s,
                "<text class=\"phase\" x=\"{x:.1}\" y=\"{y:.1}\" transform=\"rotate(-35 {x:.1} {y:.1})\">{name}</text>"
            );
            last_label = x;
        }
    }
    s.push_str("</g>\n");
}

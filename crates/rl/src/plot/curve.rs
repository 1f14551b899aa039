//! The reward curve: the mean training score per step and the held-out
//! accuracy at each evaluation.

use std::fmt::Write;

use super::{color, extent, Frame};

/// `scores`: `(step, critic/score/mean)`; `accuracy`: `(step, eval/accuracy)`
/// (step 0 is the starting checkpoint). The y axis spans at least [0, 1].
pub fn reward_curve(scores: &[(usize, f64)], accuracy: &[(usize, f64)], title: &str) -> String {
    let all = || scores.iter().chain(accuracy);
    let x = extent(all().map(|p| p.0 as f64)).unwrap_or((0.0, 1.0));
    let y = extent(all().map(|p| p.1)).unwrap_or((0.0, 1.0));
    let frame = Frame {
        width: 900.0,
        height: 400.0,
        left: 60.0,
        right: 270.0,
        top: 40.0,
        bottom: 50.0,
        x: if x.1 > x.0 { x } else { (x.0, x.0 + 1.0) },
        y: (y.0.min(0.0), y.1.max(1.0)),
    };
    let mut s = frame.open(title, "step", &|v| format!("{v:.0}"), &|v| {
        format!("{v:.2}")
    });
    for (i, (name, points, marks)) in [
        ("critic/score/mean", scores, false),
        ("eval/accuracy", accuracy, true),
    ]
    .into_iter()
    .enumerate()
    {
        let finite: Vec<(usize, f64)> =
            points.iter().copied().filter(|p| p.1.is_finite()).collect();
        if finite.is_empty() {
            continue;
        }
        let (lo, hi) = extent(finite.iter().map(|p| p.1)).expect("non-empty");
        let c = color(i);
        let _ = writeln!(
            s,
            "<g class=\"series\" data-name=\"{name}\" data-min=\"{lo}\" data-max=\"{hi}\">"
        );
        let pts: Vec<String> = finite
            .iter()
            .map(|&(st, v)| format!("{:.1},{:.1}", frame.px(st as f64), frame.py(v)))
            .collect();
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"{c}\" stroke-width=\"2\" points=\"{}\"/>",
            pts.join(" ")
        );
        if marks {
            for &(st, v) in &finite {
                let _ = writeln!(
                    s,
                    "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3.5\" fill=\"{c}\"><title>step {st}: {v:.3}</title></circle>",
                    frame.px(st as f64),
                    frame.py(v)
                );
            }
        }
        s.push_str("</g>\n");
        frame.legend(&mut s, i, &format!("{name} ({lo:.2}–{hi:.2})"), c);
    }
    s.push_str("</svg>\n");
    s
}

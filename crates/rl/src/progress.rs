//! A progress bar on stderr with the current reward.
//!
//! On a terminal it redraws one line in place. Elsewhere (CI logs, files)
//! redrawing would leave one line per update, so it prints a plain line only
//! at each tenth of the run and at the end — at most 11 lines.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// How a run is going, for the bar.
#[derive(Debug, Clone, Copy, Default)]
pub struct Status {
    /// Mean score of the step.
    pub score: f64,
    /// The latest held-out accuracy, if any.
    pub accuracy: Option<f64>,
}

/// See the module doc.
pub struct Progress<W: Write> {
    out: W,
    terminal: bool,
    total: usize,
    start: Instant,
    /// The last tenth printed (non-terminal mode).
    last_tenth: Option<usize>,
    width: usize,
}

impl Progress<std::io::Stderr> {
    /// A bar on stderr for `total` steps.
    pub fn stderr(total: usize) -> Self {
        let err = std::io::stderr();
        let terminal = err.is_terminal();
        Progress::new(err, terminal, total)
    }
}

impl<W: Write> Progress<W> {
    pub fn new(out: W, terminal: bool, total: usize) -> Self {
        Progress {
            out,
            terminal,
            total: total.max(1),
            start: Instant::now(),
            last_tenth: None,
            width: 30,
        }
    }

    /// Reports that `done` steps are finished.
    pub fn update(&mut self, done: usize, status: Status) {
        let done = done.min(self.total);
        let line = self.line(done, status, self.start.elapsed());
        // Progress is best effort: a closed stderr must not stop training.
        if self.terminal {
            let _ = write!(self.out, "\r{line}\x1b[K");
            if done == self.total {
                let _ = writeln!(self.out);
            }
        } else {
            let tenth = done * 10 / self.total;
            if self.last_tenth.is_none_or(|t| tenth > t) {
                let _ = writeln!(self.out, "{line}");
                self.last_tenth = Some(tenth);
            }
        }
        let _ = self.out.flush();
    }

    fn line(&self, done: usize, status: Status, elapsed: Duration) -> String {
        let filled = done * self.width / self.total;
        let bar: String = "#".repeat(filled) + &"-".repeat(self.width - filled);
        let eta = match done {
            0 => "?".to_owned(),
            d => clock(elapsed.mul_f64((self.total - d) as f64 / d as f64)),
        };
        let acc = status
            .accuracy
            .map_or(String::new(), |a| format!(" eval acc {:.1}%", a * 100.0));
        format!(
            "[{bar}] {done}/{} reward {:.3}{acc} {} eta {eta}",
            self.total,
            status.score,
            clock(elapsed)
        )
    }

    /// The writer (for tests).
    pub fn into_inner(self) -> W {
        self.out
    }
}

/// `m:ss`.
fn clock(d: Duration) -> String {
    let s = d.as_secs();
    format!("{}:{:02}", s / 60, s % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(terminal: bool, total: usize) -> String {
        let mut p = Progress::new(Vec::new(), terminal, total);
        for i in 0..=total {
            p.update(
                i,
                Status {
                    score: i as f64 / total as f64,
                    accuracy: Some(0.5),
                },
            );
        }
        String::from_utf8(p.into_inner()).unwrap()
    }

    #[test]
    fn not_a_terminal_prints_at_most_eleven_lines() {
        let out = run(false, 1000);
        assert_eq!(out.lines().count(), 11, "{out}");
        assert!(!out.contains('\r'));
        let last = out.lines().last().unwrap();
        assert!(
            last.starts_with(&format!(
                "[{}] 1000/1000 reward 1.000 eval acc 50.0%",
                "#".repeat(30)
            )),
            "{last}"
        );
    }

    #[test]
    fn terminal_redraws_in_place() {
        let out = run(true, 20);
        assert_eq!(out.matches('\r').count(), 21);
        assert_eq!(out.matches('\n').count(), 1, "one newline, at the end");
    }
}

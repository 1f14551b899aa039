//! The run's progress bar on stderr, with the current reward: `indicatif`.
//!
//! On a terminal it is a live bar, redrawn in place. Elsewhere (CI logs,
//! files) redrawing would leave one line per update, so the same line, as
//! `indicatif` renders it, is printed only at each tenth of the run and at
//! the end — at most 11 plain lines.
//!
//! The run's other lines on the console ([`say`]) go where the bar goes.

use std::io::Write;
use std::sync::{Arc, Mutex};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle, TermLike};

/// How a run is going, for the bar.
#[derive(Debug, Clone, Copy, Default)]
pub struct Status {
    /// Mean score of the step.
    pub score: f64,
    /// The latest held-out accuracy, if any.
    pub accuracy: Option<f64>,
    /// Samples so far whose reward failed and scored the reward's
    /// `default_score` instead (shown when there are any: a default
    /// score hides a broken reward otherwise).
    pub reward_failures: u64,
}

/// The bar's line: `[####------] 12/100 reward 0.512 eval acc 36.0% 00:00:41 eta 00:05:00`,
/// with `(16 reward failures)` after the reward when any failed.
const TEMPLATE: &str = "[{bar:30}] {pos}/{len} {msg} {elapsed_precise} eta {eta_precise}";

/// See the module doc.
pub struct Progress {
    bar: ProgressBar,
    total: u64,
    /// Off a terminal: where the plain lines go and the last tenth printed.
    plain: Option<Plain>,
}

struct Plain {
    out: Box<dyn Write + Send>,
    line: Arc<Mutex<String>>,
    last_tenth: Option<u64>,
}

impl Progress {
    /// A bar on stderr for `total` steps: live on a terminal, plain lines
    /// elsewhere.
    pub fn stderr(total: usize) -> Self {
        if console_is_terminal() {
            Progress::live(total, ProgressDrawTarget::stderr())
        } else {
            Progress::plain(total, std::io::stderr())
        }
    }

    /// A live bar drawn on `target`.
    pub fn live(total: usize, target: ProgressDrawTarget) -> Self {
        Progress {
            bar: bar(total, target),
            total: total.max(1) as u64,
            plain: None,
        }
    }

    /// At most 11 plain lines on `out`.
    pub fn plain(total: usize, out: impl Write + Send + 'static) -> Self {
        let line = Arc::new(Mutex::new(String::new()));
        let target = ProgressDrawTarget::term_like(Box::new(LastLine(Arc::clone(&line))));
        Progress {
            bar: bar(total, target),
            total: total.max(1) as u64,
            plain: Some(Plain {
                out: Box::new(out),
                line,
                last_tenth: None,
            }),
        }
    }

    /// Reports that `done` steps are finished.
    pub fn update(&mut self, done: usize, status: Status) {
        let done = (done as u64).min(self.total);
        let acc = status
            .accuracy
            .map_or(String::new(), |a| format!(" eval acc {:.1}%", a * 100.0));
        let failed = match status.reward_failures {
            0 => String::new(),
            1 => " (1 reward failure)".to_owned(),
            n => format!(" ({n} reward failures)"),
        };
        self.bar
            .set_message(format!("reward {:.3}{failed}{acc}", status.score));
        self.bar.set_position(done);
        if done == self.total {
            self.bar.finish();
        }
        let Some(p) = self.plain.as_mut() else {
            return;
        };
        let tenth = done * 10 / self.total;
        if p.last_tenth.is_none_or(|t| tenth > t) {
            let line = p.line.lock().unwrap_or_else(|e| e.into_inner()).clone();
            // Progress is best effort: a closed stderr must not stop training.
            let _ = writeln!(p.out, "{}", line.trim_end());
            let _ = p.out.flush();
            p.last_tenth = Some(tenth);
        }
    }
}

/// A line of the run's own report on stderr, where the bar is: what the
/// run says of where it starts (checkpoints skipped, records removed), of
/// its data (prompts left out, a reward that does not fit them) and of a
/// step still drawing batches. Shown at every log level: it is the run's
/// report, not a diagnostic (those go through `log`; the program decides
/// where, see [`crate::process::init_logging`]). Best effort, as the bar:
/// a closed stderr does not stop a run.
pub fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

fn bar(total: usize, target: ProgressDrawTarget) -> ProgressBar {
    let style = ProgressStyle::with_template(TEMPLATE)
        .expect("the template is valid")
        .progress_chars("#-");
    ProgressBar::with_draw_target(Some(total.max(1) as u64), target).with_style(style)
}

fn console_is_terminal() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal()
}

/// A `TermLike` that keeps the last line drawn, for the plain mode.
#[derive(Debug)]
struct LastLine(Arc<Mutex<String>>);

impl TermLike for LastLine {
    fn width(&self) -> u16 {
        200
    }
    fn move_cursor_up(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }
    fn move_cursor_down(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }
    fn move_cursor_right(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }
    fn move_cursor_left(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }
    fn write_line(&self, s: &str) -> std::io::Result<()> {
        self.write_str(s)
    }
    fn write_str(&self, s: &str) -> std::io::Result<()> {
        if !s.trim().is_empty() {
            *self.0.lock().unwrap_or_else(|e| e.into_inner()) = s.to_owned();
        }
        Ok(())
    }
    fn clear_line(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `Write` and `TermLike` whose bytes the test can read afterwards.
    #[derive(Debug, Clone, Default)]
    struct Shared(Arc<Mutex<String>>);

    impl Shared {
        fn text(&self) -> String {
            self.0.lock().unwrap().clone()
        }
        fn push(&self, s: &str) {
            self.0.lock().unwrap().push_str(s);
        }
    }

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.push(std::str::from_utf8(buf).unwrap());
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl TermLike for Shared {
        fn width(&self) -> u16 {
            120
        }
        fn move_cursor_up(&self, n: usize) -> std::io::Result<()> {
            self.push(&format!("<up {n}>"));
            Ok(())
        }
        fn move_cursor_down(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_right(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_left(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn write_line(&self, s: &str) -> std::io::Result<()> {
            self.push(&format!("{s}\n"));
            Ok(())
        }
        fn write_str(&self, s: &str) -> std::io::Result<()> {
            self.push(s);
            Ok(())
        }
        fn clear_line(&self) -> std::io::Result<()> {
            self.push("<clear>");
            Ok(())
        }
        fn flush(&self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn feed(p: &mut Progress, total: usize) {
        for i in 0..=total {
            let status = Status {
                score: i as f64 / total as f64,
                accuracy: Some(0.5),
                reward_failures: 0,
            };
            p.update(i, status);
        }
    }

    #[test]
    fn not_a_terminal_prints_at_most_eleven_lines() {
        let out = Shared::default();
        let mut p = Progress::plain(1000, out.clone());
        feed(&mut p, 1000);
        let text = out.text();
        assert_eq!(text.lines().count(), 11, "{text}");
        assert!(!text.contains('\r') && !text.contains('\x1b'), "{text:?}");
        let last = text.lines().last().unwrap();
        let want = format!(
            "[{}] 1000/1000 reward 1.000 eval acc 50.0% ",
            "#".repeat(30)
        );
        assert!(last.starts_with(&want), "{last}");
        assert!(last.contains(" eta "), "{last}");
        let first = text.lines().next().unwrap();
        assert!(first.starts_with(&format!("[{}] 0/1000 reward 0.000", "-".repeat(30))));
    }

    #[test]
    fn a_terminal_redraws_in_place() {
        let term = Shared::default();
        let target = ProgressDrawTarget::term_like(Box::new(term.clone()));
        let mut p = Progress::live(20, target);
        feed(&mut p, 20);
        let text = term.text();
        // Every redraw after the first clears the line it drew before.
        assert!(text.matches("<clear>").count() >= 20, "{text}");
        let last = text.rsplit("<clear>").next().unwrap();
        let last = last.trim_start_matches("<up 0>");
        assert!(
            last.starts_with(&format!(
                "[{}] 20/20 reward 1.000 eval acc 50.0%",
                "#".repeat(30)
            )),
            "{last:?}"
        );
    }

    /// Failed rewards that scored the default are on the line from the
    /// first one on; none, nothing is said.
    #[test]
    fn reward_failures_are_on_the_line() {
        let out = Shared::default();
        let mut p = Progress::plain(3, out.clone());
        for (done, reward_failures) in [(0, 0), (1, 1), (2, 16), (3, 16)] {
            let status = Status {
                score: 0.0,
                accuracy: None,
                reward_failures,
            };
            p.update(done, status);
        }
        let text = out.text();
        let lines: Vec<&str> = text.lines().collect();
        assert!(!lines[0].contains("failure"), "{text}");
        assert!(
            lines[1].contains("reward 0.000 (1 reward failure) "),
            "{text}"
        );
        assert!(
            lines[3].contains("reward 0.000 (16 reward failures) "),
            "{text}"
        );
    }
}

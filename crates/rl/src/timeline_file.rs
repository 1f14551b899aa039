//! The run's `timeline.jsonl`, written as the run goes.
//!
//! The pool's events are appended after every step and once more at the
//! end, however the run ends, so a run killed between steps keeps the
//! timeline of every step it finished. A `--resume` treats the file as it
//! treats `metrics.jsonl`: it keeps the events of the steps its checkpoint
//! covers (each event carries its step, `colo_mem::Event::step`), drops the
//! rest, and appends its own after them. The resumed process's pool starts
//! its clock at 0; its events are shifted to continue from the last kept
//! one, so the file reads as one run in time (the time between the kill
//! and the resume is not in it).
//!
//! The file holds every event of the run, not only the pool's ring of the
//! newest `timeline_limit` (the ring bounds the process's memory; the file
//! is on disk, ~250 bytes an event).

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use colo_mem::{Event, Pool};

use crate::{Error, Result};

/// Appends a pool's events to a run's `timeline.jsonl`.
pub struct TimelineWriter {
    path: PathBuf,
    /// How many of the pool's events are in the file already.
    seen: u64,
    /// Added to the pool's times (the last kept event's, after a resume).
    offset_s: f64,
}

impl TimelineWriter {
    /// A new, empty `path` (a run from scratch).
    pub fn create(path: &Path) -> Result<Self> {
        File::create(path).map_err(|e| Error::io(path, e))?;
        Ok(TimelineWriter {
            path: path.to_owned(),
            seen: 0,
            offset_s: 0.0,
        })
    }

    /// `path` cut back to the events of steps up to `step` (a run resumed
    /// from that step's checkpoint); later events go after them. A missing
    /// file is an empty one; a last line cut short by a kill is dropped; any
    /// other line that is not an event is an error naming the file and the
    /// line. Events written before events carried a step read as step 0 and
    /// are kept.
    pub fn resume(path: &Path, step: usize) -> Result<Self> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(Error::io(path, e)),
        };
        let lines: Vec<&str> = text.lines().collect();
        let mut kept = String::with_capacity(text.len());
        let mut offset_s = 0.0;
        for (i, line) in lines.iter().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let event: Event = match serde_json::from_str(line) {
                Ok(e) => e,
                Err(_) if i + 1 == lines.len() && !text.ends_with('\n') => continue,
                Err(e) => {
                    return Err(Error::Data {
                        path: path.to_owned(),
                        line: i + 1,
                        field: None,
                        message: format!("not a timeline event: {e}"),
                    })
                }
            };
            if event.step <= step as u64 {
                offset_s = event.t_s;
                kept.push_str(line);
                kept.push('\n');
            }
        }
        crate::metrics::replace_file(path, kept.as_bytes())?;
        Ok(TimelineWriter {
            path: path.to_owned(),
            seen: 0,
            offset_s,
        })
    }

    /// Appends the events `pool` recorded since the last call.
    pub fn append_new(&mut self, pool: &Pool) -> Result<()> {
        let (mut events, recorded) = pool.timeline_since(self.seen);
        if events.is_empty() {
            self.seen = recorded;
            return Ok(());
        }
        for e in &mut events {
            e.t_s += self.offset_s;
        }
        let io = |e| Error::io(&self.path, e);
        let file = OpenOptions::new()
            .append(true)
            .create(true)
            .open(&self.path)
            .map_err(io)?;
        let mut w = BufWriter::new(file);
        colo_mem::timeline_jsonl(&events, &mut w)
            .and_then(|()| w.flush())
            .map_err(io)?;
        self.seen = recorded;
        Ok(())
    }

    /// The whole file's events (for the pictures).
    pub fn read(&self) -> Result<Vec<Event>> {
        Ok(colo_mem::read_timeline(&self.path)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("colo-rl-timeline-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn line(step: u64, t_s: f64) -> String {
        format!(
            r#"{{"t_s":{t_s},"step":{step},"phase":"p{step}","kind":"mark","tags":[],"duration_s":0.0,"resident_bytes":0,"per_tag":{{}},"untagged_bytes":0}}"#
        )
    }

    #[test]
    fn resume_keeps_the_steps_up_to_the_checkpoint_and_continues_in_time() {
        let d = dir("resume");
        let path = d.join("timeline.jsonl");
        let cut_short = &line(3, 3.5)[..40];
        let text = [line(0, 0.1), line(1, 1.0), line(2, 2.0), line(3, 3.0)].join("\n");
        std::fs::write(&path, format!("{text}\n{cut_short}")).unwrap();
        let mut w = TimelineWriter::resume(&path, 2).unwrap();
        let kept = colo_mem::read_timeline(&path).unwrap();
        assert_eq!(kept.iter().map(|e| e.step).collect::<Vec<_>>(), [0, 1, 2]);

        let pool = colo_mem::Pool::host(colo_mem::PoolConfig::default()).unwrap();
        pool.set_step(3);
        pool.mark();
        w.append_new(&pool).unwrap();
        w.append_new(&pool).unwrap(); // nothing new: nothing written twice
        pool.mark();
        w.append_new(&pool).unwrap();
        let all = w.read().unwrap();
        assert_eq!(all.len(), 5);
        assert_eq!(all[3].step, 3);
        assert!(all[3].t_s >= 2.0 && all[3].t_s <= all[4].t_s, "{all:?}");
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn a_line_that_is_not_an_event_is_named() {
        let d = dir("bad");
        let path = d.join("timeline.jsonl");
        std::fs::write(
            &path,
            format!("{}\nnot json\n{}\n", line(1, 1.0), line(2, 2.0)),
        )
        .unwrap();
        let err = TimelineWriter::resume(&path, 2)
            .err()
            .expect("refused")
            .to_string();
        assert!(err.contains("timeline.jsonl") && err.contains('2'), "{err}");
        assert!(err.contains("not a timeline event"), "{err}");
        assert_eq!(
            std::fs::read_to_string(&path).unwrap().lines().count(),
            3,
            "nothing lost"
        );
        std::fs::remove_dir_all(d).unwrap();
    }
}

//! The memory timeline: every transition of a pool, with the time, the
//! caller's phase label and the bytes resident per tag afterwards. This is
//! the record from which a user sees, for their own run, what the
//! multi-stage-awake RFC shows as "5.8 → 36.6 → 98.1 → 37.6 → 131.8 GB".

use crate::pool::{Pool, State};
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

/// What happened at one point of the timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// The caller changed the phase label (`Pool::set_phase`).
    Phase,
    /// The caller asked for a snapshot (`Pool::mark`).
    Mark,
    Pause,
    Resume,
    /// A resume ran out of memory (or failed in the backend) and was undone.
    ResumeFailed,
    EmptyCache,
    /// An allocation was refused for lack of capacity.
    OutOfMemory,
}

/// One entry of the timeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Seconds since the pool was made.
    pub t_s: f64,
    /// The caller's step number when it happened (`Pool::set_step`; 0
    /// before the first). Lets a resumed run keep the events of the steps
    /// its checkpoint covers.
    #[serde(default)]
    pub step: u64,
    pub phase: String,
    pub kind: EventKind,
    /// The tags the transition concerned (empty for phase changes and marks).
    pub tags: Vec<String>,
    /// How long the transition took, in seconds (0 for instantaneous ones).
    pub duration_s: f64,
    /// Bytes mapped over all tags after the transition.
    pub resident_bytes: u64,
    /// Bytes mapped per tag after the transition.
    pub per_tag: BTreeMap<String, u64>,
    /// Tensor bytes libtorch held outside any region at that moment
    /// (process-wide; see `colo_mem::untagged`).
    pub untagged_bytes: u64,
}

/// Writes events as JSON lines, one object per event.
pub fn write_jsonl(events: &[Event], mut w: impl Write) -> std::io::Result<()> {
    for e in events {
        serde_json::to_writer(&mut w, e)?;
        w.write_all(b"\n")?;
    }
    Ok(())
}

/// Reads events written by [`write_jsonl`] (e.g. another process's
/// `timeline.jsonl`); a bad line is an error naming the file and the line.
pub fn read_jsonl(path: &std::path::Path) -> Result<Vec<Event>> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.display().to_string(),
        source,
    })?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| {
                Error::Invalid(format!(
                    "{}:{}: not a timeline event: {e}",
                    path.display(),
                    i + 1
                ))
            })
        })
        .collect()
}

impl Pool {
    /// Sets the phase label recorded with later timeline events, and records
    /// the change.
    pub fn set_phase(&self, phase: &str) {
        let mut st = self.lock();
        st.phase = phase.to_string();
        self.record(&mut st, EventKind::Phase, Vec::new(), Duration::ZERO);
    }

    /// Records a snapshot of the resident bytes in the timeline.
    pub fn mark(&self) {
        let mut st = self.lock();
        self.record(&mut st, EventKind::Mark, Vec::new(), Duration::ZERO);
    }

    pub fn phase(&self) -> String {
        self.lock().phase.clone()
    }

    /// Sets the step number recorded with later timeline events (the
    /// caller's count: colo-rl's training step, 1-based). Records nothing.
    pub fn set_step(&self, step: u64) {
        self.lock().step = step;
    }

    /// The timeline so far (the last `timeline_limit` events).
    pub fn timeline(&self) -> Vec<Event> {
        self.lock().timeline.iter().cloned().collect()
    }

    /// The events recorded after the first `seen` of the pool's life, and
    /// how many it has recorded in all (the `seen` of the next call): how a
    /// writer appends a timeline to a file as the run goes. Events the ring
    /// of `timeline_limit` dropped before they were asked for are skipped.
    pub fn timeline_since(&self, seen: u64) -> (Vec<Event>, u64) {
        let st = self.lock();
        let held = st.timeline.len() as u64;
        let first_held = st.recorded.saturating_sub(held);
        let skip = usize::try_from(seen.saturating_sub(first_held)).unwrap_or(usize::MAX);
        let events = st.timeline.iter().skip(skip).cloned().collect();
        (events, st.recorded)
    }

    /// Writes the timeline as JSON lines to `path`.
    pub fn write_timeline(&self, path: &std::path::Path) -> Result<()> {
        let events = self.timeline();
        let io = |source| Error::Io {
            path: path.display().to_string(),
            source,
        };
        let f = std::fs::File::create(path).map_err(io)?;
        crate::timeline::write_jsonl(&events, std::io::BufWriter::new(f)).map_err(io)
    }

    /// Appends a timeline event for the state as it is now.
    pub(crate) fn record(
        &self,
        st: &mut State,
        kind: EventKind,
        tags: Vec<String>,
        took: Duration,
    ) {
        let event = Event {
            t_s: self.epoch.elapsed().as_secs_f64(),
            step: st.step,
            phase: st.phase.clone(),
            kind,
            tags,
            duration_s: took.as_secs_f64(),
            resident_bytes: st.resident,
            per_tag: st
                .tags
                .iter()
                .map(|t| (t.name.clone(), t.resident))
                .collect(),
            untagged_bytes: crate::torch::untagged().live_bytes,
        };
        if st.timeline.len() >= self.cfg.timeline_limit.max(1) {
            st.timeline.pop_front();
        }
        st.timeline.push_back(event);
        st.recorded = st.recorded.saturating_add(1);
    }
}

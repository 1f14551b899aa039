//! The memory timeline: every transition of a pool, with the time, the
//! caller's phase label and the bytes resident per tag afterwards. This is
//! the record from which a user sees, for their own run, what the
//! multi-stage-awake RFC shows as "5.8 → 36.6 → 98.1 → 37.6 → 131.8 GB".

use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write;

/// What happened at one point of the timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
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
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Event {
    /// Seconds since the pool was made.
    pub t_s: f64,
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
}

/// Writes events as JSON lines, one object per event.
pub fn write_jsonl(events: &[Event], mut w: impl Write) -> std::io::Result<()> {
    for e in events {
        serde_json::to_writer(&mut w, e)?;
        w.write_all(b"\n")?;
    }
    Ok(())
}

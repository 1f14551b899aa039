//! One reward served by several child processes at once (`workers` of the
//! `python` and `external` rewards), for rewards that take milliseconds a
//! sample (symbolic math checkers, sandboxed code): verl's `prime` reward
//! manager scores in a process pool for the same reason.
//!
//! A batch is cut into as many contiguous parts as there are processes
//! (the samples of a prompt stay together where the cut allows), each part
//! scored by its own process on its own thread; the scores come back in
//! the batch's order. The first failing part's error is the batch's.

use super::{Reward, RewardInput, Scored};
use crate::Result;

/// See the module documentation.
pub struct Parallel {
    parts: Vec<Box<dyn Reward>>,
}

impl Parallel {
    /// `parts`: at least one reward, all of the same kind and settings.
    pub fn new(parts: Vec<Box<dyn Reward>>) -> Self {
        assert!(!parts.is_empty(), "a parallel reward needs a part");
        Parallel { parts }
    }
}

impl Reward for Parallel {
    fn name(&self) -> String {
        format!("{} × {} processes", self.parts[0].name(), self.parts.len())
    }

    fn score(&mut self, input: &RewardInput<'_>) -> Result<f32> {
        self.parts[0].score(input)
    }

    fn score_batch(&mut self, inputs: &[RewardInput<'_>]) -> Result<Vec<f32>> {
        Ok(Scored::scores(self.score_batch_extra(inputs)?))
    }

    fn score_batch_extra(&mut self, inputs: &[RewardInput<'_>]) -> Result<Vec<Scored>> {
        if inputs.is_empty() {
            return Ok(Vec::new());
        }
        let size = inputs.len().div_ceil(self.parts.len());
        let results: Vec<Result<Vec<Scored>>> = std::thread::scope(|s| {
            let running: Vec<_> = self
                .parts
                .iter_mut()
                .zip(inputs.chunks(size))
                .map(|(part, chunk)| s.spawn(move || part.score_batch_extra(chunk)))
                .collect();
            running
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        });
        let mut scores = Vec::with_capacity(inputs.len());
        for part in results {
            scores.extend(part?);
        }
        Ok(scores)
    }

    fn failures(&self) -> u64 {
        self.parts.iter().map(|p| p.failures()).sum()
    }
}

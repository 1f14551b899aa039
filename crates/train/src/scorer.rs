//! Scoring without a gradient — per-token log-probabilities (and entropy)
//! of given sequences — for the trainer's own old log-probs and for a
//! frozen model such as the reference policy: micro-batches, each split
//! over the lanes, only the response window through the LM head.

use std::sync::Arc;

use colo_mem::Pool;
use colo_model::Model;
use tch::{Device, Kind, Tensor};

use crate::batch::{micro_batches, Micro, SeqBatch};
use crate::config::Split;
use crate::engine::Scores;
use crate::forward::Entropy;
use crate::lanes::{self, Lane};
use crate::Result;

/// Rows `start..start + len` of `batch` on `device`, one part per lane.
pub(crate) fn lane_parts(
    batch: &SeqBatch,
    start: usize,
    len: usize,
    lanes: usize,
    device: Device,
) -> Result<Vec<Micro>> {
    colo_model::lanes::split(start, len, lanes)
        .into_iter()
        .map(|(s, n)| batch.micro(s, n, device))
        .collect()
}

/// A zero (batch, seq) float32 result on `device`, made outside any
/// region (what the caller keeps is not in the discardable `activations`
/// tag).
pub(crate) fn per_token_out(batch: &SeqBatch, device: Device) -> Result<Tensor> {
    let shape = [batch.batch_size() as i64, batch.seq_len() as i64];
    Ok(Tensor::f_zeros(shape, (Kind::Float, device))?)
}

/// `out` as a float32 CPU tensor (a copy on a GPU, none on the CPU).
pub(crate) fn to_host(t: Tensor) -> Result<Tensor> {
    Ok(t.f_to_device(Device::Cpu)?)
}

/// Scores `batch` with `lane`'s model in the micro-batches of `split`,
/// each split over `lanes` threads; zero outside the response mask.
pub(crate) fn score(
    lane: &Lane,
    lanes: usize,
    split: Split,
    batch: &SeqBatch,
    with_entropy: bool,
) -> Result<Scores> {
    let device = lane.model.device();
    let ent = match with_entropy {
        true => Entropy::Detached,
        false => Entropy::None,
    };
    let out = || per_token_out(batch, device);
    let (log_probs, entropy) = (out()?, with_entropy.then(out).transpose()?);
    for (start, len) in micro_batches(batch, split) {
        let parts = lane_parts(batch, start, len, lanes, device)?;
        let scored = lanes::run(lane, false, parts, || {
            move |lane: &Lane, mb: Micro| Ok((lane.token_scores(&mb, ent)?, mb))
        })?;
        for (scores, mb) in scored {
            let Some((lp, e)) = scores else { continue };
            mb.write_window(&log_probs, &lp)?;
            if let (Some(out), Some(e)) = (&entropy, e) {
                mb.write_window(out, &e)?;
            }
        }
    }
    Ok(Scores {
        log_probs: to_host(log_probs)?,
        entropy: entropy.map(to_host).transpose()?,
    })
}

/// A frozen model's scoring pass (the reference policy's), the trainer's
/// way: lanes on the CPU, transients in `region(activations)` of `pool`.
pub struct Scorer {
    lane: Lane,
    lanes: usize,
}

impl Scorer {
    /// `model`'s weights must be in `pool` (any tag); `cpu_threads` as
    /// [`crate::TrainerConfig::cpu_threads`].
    pub fn new(pool: Arc<Pool>, model: Model, cpu_threads: usize) -> Self {
        let lanes = colo_model::lanes::count(model.device(), cpu_threads);
        Scorer {
            lane: Lane {
                pool,
                model,
                value_head: None,
                params: Vec::new(),
                top: None,
                shards: None,
            },
            lanes,
        }
    }

    pub fn model(&self) -> &Model {
        &self.lane.model
    }

    /// Per-token log-probabilities (batch, seq) float32 on the CPU, zero
    /// outside the response mask, in the micro-batches of `split` (a number
    /// of rows, or a [`Split`]).
    pub fn log_probs(&self, batch: &SeqBatch, split: impl Into<Split>) -> Result<Tensor> {
        Ok(score(&self.lane, self.lanes, split.into(), batch, false)?.log_probs)
    }
}

//! The reference model: the starting policy, kept frozen for the KL term.
//!
//! Its weights live in colo-mem's `ref` tag with the `Backup` policy, so
//! `offload` (verl's `ref` param offload, MindSpeed-RL's reference on the
//! host) is a pause of that tag and `reload` brings the same bytes back at
//! the same addresses. Scoring builds no autograd graph.

use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use colo_mem::{tags, Policy, Pool, TagState};
use colo_model::{loss::token_logprobs, Model, Weights};
use colo_train::SeqBatch;

use crate::{Error, Result};

pub struct Reference {
    pool: Arc<Pool>,
    model: Model,
}

impl Reference {
    /// Loads a Hugging Face checkpoint into the `ref` tag of `pool`.
    pub fn from_dir(pool: Arc<Pool>, dir: &Path) -> Result<Self> {
        pool.set_policy(tags::REF, Policy::Backup)?;
        let model = {
            let region = pool.region(tags::REF)?;
            let cfg = colo_model::ModelConfig::from_file(&dir.join("config.json"))?;
            let w = Weights::from_dir(dir, DType::F32, &Device::Cpu)?;
            let m = Model::load(&cfg, &w)?;
            drop(w);
            region.finish()?;
            m
        };
        Ok(Reference { pool, model })
    }

    /// Per-token log-probabilities under the reference, (batch, seq) float32
    /// aligned with the tokens like the trainer's scores (column `t`: token
    /// `t` given the ones before it), zero outside the response mask.
    /// `micro` rows per forward pass.
    pub fn score(&self, seqs: &SeqBatch, micro: usize) -> Result<Tensor> {
        if self.pool.tag_state(tags::REF) != Some(TagState::Active) {
            return Err(Error::Phase {
                op: "score with the reference model",
                state: "its weights are offloaded".into(),
            });
        }
        let (b, s) = (seqs.batch_size(), seqs.seq_len());
        let mut rows = Vec::new();
        for start in (0..b).step_by(micro.max(1)) {
            let len = micro.min(b - start);
            let ids = seqs.input_ids().narrow(0, start, len)?;
            let mask = seqs.attention_mask().narrow(0, start, len)?;
            let logits = self.model.forward_masked(&ids, &mask, None)?; // (len, s, vocab)
            let lp = token_logprobs(&logits.narrow(1, 0, s - 1)?, &ids.narrow(1, 1, s - 1)?)?; // (len, s-1)
            rows.push(lp.pad_with_zeros(1, 1, 0)?); // column t: token t
        }
        Ok((Tensor::cat(&rows, 0)? * seqs.response_mask())?)
    }

    /// Moves the weights to host memory (their device memory is released).
    pub fn offload(&self) -> Result<()> {
        Ok(self.pool.pause(&[tags::REF])?)
    }

    /// Brings the weights back, bit-exactly, at the same addresses.
    pub fn reload(&self) -> Result<()> {
        Ok(self.pool.resume(&[tags::REF])?)
    }
}

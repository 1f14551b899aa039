//! The reference model: the starting policy, kept frozen for the KL term.
//!
//! Its weights live in colo-mem's `ref` tag with the `Backup` policy, so
//! `offload` (verl's `ref` param offload, MindSpeed-RL's reference on the
//! host) is a pause of that tag and `reload` brings the same bytes back at
//! the same addresses. Scoring builds no autograd graph.

use std::path::Path;
use std::sync::Arc;

use colo_mem::{tags, Policy, Pool, TagState};
use colo_model::{loss::token_logprobs, Model, Weights};
use colo_train::SeqBatch;
use tch::{Device, Kind, Tensor};

use crate::{Error, Result};

pub struct Reference {
    pool: Arc<Pool>,
    model: Model,
}

impl Reference {
    /// Loads a Hugging Face checkpoint into the `ref` tag of `pool`, in
    /// `kind` on `device`.
    pub fn from_dir(pool: Arc<Pool>, dir: &Path, kind: Kind, device: Device) -> Result<Self> {
        pool.set_policy(tags::REF, Policy::Backup)?;
        let model = {
            let region = pool.region(tags::REF)?;
            let cfg = colo_model::ModelConfig::from_file(&dir.join("config.json"))?;
            let w = Weights::from_dir(dir, kind, device)?;
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
        let (b, s) = (b as i64, s as i64);
        let device = self.model.device();
        let _no_grad = tch::no_grad_guard();
        let mut rows = Vec::new();
        for start in (0..b).step_by(micro.max(1)) {
            let len = (micro as i64).min(b - start);
            let ids = seqs
                .input_ids()
                .f_narrow(0, start, len)?
                .f_to_device(device)?;
            let mask = seqs
                .attention_mask()
                .f_narrow(0, start, len)?
                .f_to_device(device)?;
            let logits = self.model.forward_masked(&ids, &mask, None)?; // (len, s, vocab)
            let lp = token_logprobs(&logits.f_narrow(1, 0, s - 1)?, &ids.f_narrow(1, 1, s - 1)?)?; // (len, s-1)
            let lp = lp.f_to_kind(Kind::Float)?.f_to_device(Device::Cpu)?;
            rows.push(lp.f_constant_pad_nd([1, 0])?); // column t: token t
        }
        let mask = seqs.response_mask().f_to_kind(Kind::Float)?;
        Ok(Tensor::f_cat(&rows, 0)?.f_mul(&mask)?)
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

//! The reference model: the starting policy, kept frozen for the KL term.
//!
//! Its weights live in colo-mem's `ref` tag with the `Backup` policy, so
//! `offload` (verl's `ref` param offload, MindSpeed-RL's reference on the
//! host) is a pause of that tag and `reload` brings the same bytes back at
//! the same addresses. Scoring builds no autograd graph.

use std::path::Path;
use std::sync::Arc;

use colo_mem::{tags, Policy, Pool, TagState};
use colo_model::{Model, Weights};
use colo_train::{Scorer, SeqBatch};
use tch::{Device, Kind, Tensor};

use crate::{Error, Result};

pub struct Reference {
    pool: Arc<Pool>,
    scorer: Scorer,
}

impl Reference {
    /// Loads a Hugging Face checkpoint into the `ref` tag of `pool`, in
    /// `kind` on `device`; on the CPU its passes run on `cpu_threads`
    /// lanes like the trainer's (0: `OMP_NUM_THREADS`, else one per core).
    pub fn from_dir(
        pool: Arc<Pool>,
        dir: &Path,
        kind: Kind,
        device: Device,
        cpu_threads: usize,
    ) -> Result<Self> {
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
        let scorer = Scorer::new(Arc::clone(&pool), model, cpu_threads);
        Ok(Reference { pool, scorer })
    }

    /// Per-token log-probabilities under the reference, (batch, seq) float32
    /// aligned with the tokens like the trainer's scores (column `t`: token
    /// `t` given the ones before it), zero outside the response mask.
    /// `micro`: rows per forward pass, or a token budget; the passes' transients are in the
    /// `activations` tag, like the trainer's.
    pub fn score(&self, seqs: &SeqBatch, micro: impl Into<colo_train::Split>) -> Result<Tensor> {
        if self.pool.tag_state(tags::REF) != Some(TagState::Active) {
            return Err(Error::Phase {
                op: "score with the reference model",
                state: "its weights are offloaded".into(),
            });
        }
        Ok(self.scorer.log_probs(seqs, micro)?)
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

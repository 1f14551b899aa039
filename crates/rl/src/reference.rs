//! The reference model: the starting policy, kept frozen for the KL term.
//!
//! Its weights live in colo-mem's `ref` tag with the `Backup` policy, so
//! `offload` (verl's `ref` param offload, MindSpeed-RL's reference on the
//! host) is a pause of that tag and `reload` brings the same bytes back at
//! the same addresses. Scoring builds no autograd graph.
//!
//! When the actor trains LoRA adapters its frozen weights are the starting
//! policy: the reference is then the actor's model with the adapters off
//! ([`Reference::base_of`]), over the actor's weights in `train_params` —
//! no copy, nothing of its own to offload (verl's `ref_in_actor`).

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
    /// The tag holding the weights: `ref`, or the actor's `train_params`
    /// for the base of a LoRA actor (which moves with the actor).
    tag: &'static str,
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
        Ok(Reference {
            pool,
            scorer,
            tag: tags::REF,
        })
    }

    /// The reference of an actor that trains LoRA adapters: its base
    /// `model` (colo-train's `ColoTrainer::base_model`, the actor's weights
    /// without the adapters), scored in lanes like [`Reference::from_dir`]'s.
    /// [`Reference::offload`] and [`Reference::reload`] do nothing: the
    /// weights are the actor's, offloaded and reloaded with it.
    pub fn base_of(pool: Arc<Pool>, model: Model, cpu_threads: usize) -> Self {
        let scorer = Scorer::new(Arc::clone(&pool), model, cpu_threads);
        Reference {
            pool,
            scorer,
            tag: tags::TRAIN_PARAMS,
        }
    }

    /// Whether the weights are the actor's ([`Reference::base_of`]).
    pub fn is_actor_base(&self) -> bool {
        self.tag == tags::TRAIN_PARAMS
    }

    /// Per-token log-probabilities under the reference, (batch, seq) float32
    /// aligned with the tokens like the trainer's scores (column `t`: token
    /// `t` given the ones before it), zero outside the response mask.
    /// `micro`: rows per forward pass, or a token budget; the passes' transients are in the
    /// `activations` tag, like the trainer's.
    pub fn score(&self, seqs: &SeqBatch, micro: impl Into<colo_train::Split>) -> Result<Tensor> {
        if self.pool.tag_state(self.tag) != Some(TagState::Active) {
            return Err(Error::Phase {
                op: "score with the reference model",
                state: "its weights are offloaded".into(),
            });
        }
        Ok(self.scorer.log_probs(seqs, micro)?)
    }

    /// Moves the weights to host memory (their device memory is released);
    /// nothing for the actor's base, whose weights are the actor's.
    pub fn offload(&self) -> Result<()> {
        match self.is_actor_base() {
            true => Ok(()),
            false => Ok(self.pool.pause(&[tags::REF])?),
        }
    }

    /// Brings the weights back, bit-exactly, at the same addresses (nothing
    /// for the actor's base).
    pub fn reload(&self) -> Result<()> {
        match self.is_actor_base() {
            true => Ok(()),
            false => Ok(self.pool.resume(&[tags::REF])?),
        }
    }
}

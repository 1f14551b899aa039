//! The hybrid worker's operations one by one, for a controller that
//! composes its own dataflow (colo-py exposes them to Python): switch the
//! device between the engines, generate, score with the actor or the
//! reference, update the policy on given samples, and the weights in and
//! out. [`Rank::step`] is these operations in colo-rl's order.
//!
//! Samples cross as token ids and per-response-token values (one `Vec` per
//! sample, as long as its response); the trainer's (batch, seq) layout is
//! made here, as the loop makes it.

use colo_rollout::{Completion, Request, SamplingParams};
use colo_train::{PolicyBatch, PolicyMetrics, SeqBatch};
use tch::Tensor;

use super::Rank;
use crate::rollouts::Rollouts;
use crate::setup::loss_config;
use crate::worker::{Phase, SwitchTiming};
use crate::{Error, Result};

/// Weights by name: (name, shape, float32 values).
pub type NamedWeights = Vec<(String, Vec<i64>, Vec<f32>)>;

/// The error of a call `op` given `state`.
fn refuse(op: &'static str, state: String) -> Error {
    Error::Phase { op, state }
}

/// Samples given by a caller, checked against the model the actor trains:
/// as many responses as prompts, every prompt non-empty, every token in
/// the vocabulary and every sample within the context (the rollout engine
/// refuses such prompts too; the trainer would index out of its embedding,
/// or score positions the model was not trained for).
fn samples(
    op: &'static str,
    model: &colo_model::ModelConfig,
    prompts: Vec<Vec<u32>>,
    responses: Vec<Vec<u32>>,
) -> Result<Rollouts> {
    if prompts.len() != responses.len() || prompts.is_empty() {
        return Err(refuse(
            op,
            format!(
                "{} prompts and {} responses: one response per prompt row, at least one",
                prompts.len(),
                responses.len()
            ),
        ));
    }
    let (vocab, context) = (model.vocab_size, model.max_position_embeddings);
    for (i, (p, r)) in prompts.iter().zip(&responses).enumerate() {
        if p.is_empty() {
            return Err(refuse(op, format!("sample {i}: the prompt is empty")));
        }
        let outside = |part: &str, tokens: &[u32]| {
            let (k, t) = tokens
                .iter()
                .enumerate()
                .find(|(_, &t)| t as usize >= vocab)?;
            Some(format!(
                "sample {i}: {part} token {k} is {t}, outside the vocabulary (size {vocab})"
            ))
        };
        if let Some(why) = outside("prompt", p).or_else(|| outside("response", r)) {
            return Err(refuse(op, why));
        }
        if p.len() + r.len() > context {
            return Err(refuse(
                op,
                format!(
                    "sample {i}: {} prompt + {} response tokens, more than the model's context \
                     (max_position_embeddings = {context})",
                    p.len(),
                    r.len()
                ),
            ));
        }
    }
    Ok(Rollouts {
        prompts,
        responses,
        ..Default::default()
    })
}

/// The first value that is NaN or infinite, with its index.
fn first_non_finite(values: &[f32]) -> Option<(usize, f32)> {
    values
        .iter()
        .copied()
        .enumerate()
        .find(|(_, x)| !x.is_finite())
}

/// Per-response values, checked against the responses' lengths and for
/// NaN or infinity (one would turn the loss into NaN, and the update would
/// be skipped without a word).
fn per_token(
    op: &'static str,
    r: &Rollouts,
    what: &str,
    values: &[Vec<f32>],
    seq: usize,
) -> Result<Tensor> {
    let lens_ok = values.len() == r.len()
        && values
            .iter()
            .zip(&r.responses)
            .all(|(v, t)| v.len() == t.len());
    if !lens_ok {
        return Err(refuse(
            op,
            format!("{what}: one value per response token of every sample"),
        ));
    }
    for (i, v) in values.iter().enumerate() {
        if let Some((k, x)) = first_non_finite(v) {
            return Err(refuse(
                op,
                format!("{what}: sample {i}, token {k} is {x}; expected a finite number"),
            ));
        }
    }
    r.to_token_layout(values, 0..r.len(), seq)
}

impl Rank {
    /// Which engine holds the device.
    pub fn phase(&self) -> Phase {
        self.run.worker.phase()
    }

    /// Starts RL step `step` (1-based) of a loop composed op by op
    /// ([`crate::worker::HybridWorker::begin_step`]; `step` does it itself).
    pub fn begin_step(&mut self, step: u64) -> Result<()> {
        if step == 0 {
            return Err(refuse(
                "begin a step",
                "step 0: RL steps count from 1 here (the timeline's step 0 is the set-up)".into(),
            ));
        }
        self.run.worker.begin_step(step);
        Ok(())
    }

    /// Train → rollout in the config's colocation mode (weights synced).
    pub fn to_rollout(&mut self) -> Result<SwitchTiming> {
        self.run.worker.to_rollout()
    }

    /// Rollout → train.
    pub fn to_train(&mut self) -> Result<SwitchTiming> {
        self.run.worker.to_train()
    }

    /// The tokenizer's end-of-sequence and padding ids.
    pub fn special_ids(&self) -> (u32, u32) {
        (self.run.stop[0], self.run.pad)
    }

    /// Completions of every prompt (rollout phase), in prompt order; the
    /// end-of-sequence token stops them unless `params` says otherwise.
    pub fn generate(
        &mut self,
        prompts: Vec<Vec<u32>>,
        mut params: SamplingParams,
    ) -> Result<Vec<Vec<Completion>>> {
        if params.stop_token_ids.is_empty() {
            params.stop_token_ids = self.run.stop.clone();
        }
        let requests = prompts
            .into_iter()
            .map(|p| Request::new(p, params.clone()))
            .collect();
        self.run
            .worker
            .generate(requests)?
            .into_iter()
            .enumerate()
            .map(|(k, out)| {
                out.map(|o| o.completions).map_err(|e| Error::Phase {
                    op: "generate",
                    state: format!("prompt {k}: {e}"),
                })
            })
            .collect()
    }

    /// The actor's log-probability of every response token (training
    /// phase, no gradient): π_old.
    pub fn log_probs(
        &mut self,
        prompts: Vec<Vec<u32>>,
        responses: Vec<Vec<u32>>,
    ) -> Result<Vec<Vec<f32>>> {
        let r = self.samples("score samples", prompts, responses)?;
        let seqs = r.seq_batch(0..r.len(), self.run.pad)?;
        let lp = self.run.worker.score(&seqs, false)?.log_probs;
        r.from_token_layout(&lp)
    }

    /// The reference model's log-probabilities (training phase); `None`
    /// when the run has no reference.
    pub fn ref_log_probs(
        &mut self,
        prompts: Vec<Vec<u32>>,
        responses: Vec<Vec<u32>>,
    ) -> Result<Option<Vec<Vec<f32>>>> {
        let r = self.samples("score samples with the reference", prompts, responses)?;
        let seqs = r.seq_batch(0..r.len(), self.run.pad)?;
        match self
            .run
            .worker
            .ref_log_probs(&seqs, self.run.config.batch.micro_split())?
        {
            Some(lp) => Ok(Some(r.from_token_layout(&lp)?)),
            None => Ok(None),
        }
    }

    /// One optimizer step of the actor on these samples (training phase),
    /// accumulated over the config's micro-batches, with the run's loss;
    /// joint with the other ranks (global denominators, summed gradients).
    pub fn update_policy(
        &mut self,
        prompts: Vec<Vec<u32>>,
        responses: Vec<Vec<u32>>,
        advantages: Vec<Vec<f32>>,
        old_log_probs: Vec<Vec<f32>>,
        ref_log_probs: Option<Vec<Vec<f32>>>,
    ) -> Result<PolicyMetrics> {
        const OP: &str = "update the policy";
        let r = self.samples(OP, prompts, responses)?;
        let seqs: SeqBatch = r.seq_batch(0..r.len(), self.run.pad)?;
        let s = seqs.seq_len();
        let adv = per_token(OP, &r, "advantages", &advantages, s)?;
        let old = per_token(OP, &r, "old_log_probs", &old_log_probs, s)?;
        let reference = ref_log_probs
            .map(|v| per_token(OP, &r, "ref_log_probs", &v, s))
            .transpose()?;
        let batch = PolicyBatch::new(seqs, &old, &adv, reference.as_ref(), None)?;
        let loss = loss_config(self.run.config);
        self.run.worker.update_policy(&batch, &loss)
    }

    /// The actor's weights, by name: (shape, float32 values), copied out.
    pub fn weights(&self) -> Result<NamedWeights> {
        const OP: &str = "read the weights";
        self.expect_train(OP)?;
        // A sharded actor's are gathered: every rank must call this.
        let read = self.run.worker.actor(OP)?.with_gathered(|actor| {
            (actor.parameters().into_iter())
                .map(|(n, t)| {
                    let v = t.f_to_kind(tch::Kind::Float)?.f_flatten(0, -1)?;
                    Ok((n, t.size(), Vec::<f32>::try_from(&v)?))
                })
                .collect::<colo_train::Result<NamedWeights>>()
        });
        Ok(read?)
    }

    /// Copies weights into the actor, in place (training phase): each name
    /// must be one of the actor's, once, with its number of values (and its
    /// shape, where one is given, as [`Rank::weights`] gives it), all of
    /// them finite; the float32 master copy (bf16 runs) is set too. The
    /// rollout engine gets them at the next `to_rollout`, as after an
    /// update.
    pub fn load_weights(
        &mut self,
        weights: Vec<(String, Option<Vec<i64>>, Vec<f32>)>,
    ) -> Result<()> {
        const OP: &str = "load weights";
        if self.run.worker.actor(OP)?.is_sharded() {
            return Err(Error::Phase {
                op: OP,
                state: "the actor is sharded (cluster.sharding = \"full\"): its weights \
                        change by updates and checkpoints only"
                    .into(),
            });
        }
        self.expect_train(OP)?;
        let actor = self.run.worker.actor(OP)?;
        let params: std::collections::HashMap<String, Tensor> =
            actor.parameters().into_iter().collect();
        let masters: std::collections::HashMap<String, Tensor> =
            actor.master_weights().into_iter().collect();
        // Every name, size and value first: nothing is written unless all fit.
        let mut seen = std::collections::HashSet::new();
        for (name, shape, values) in &weights {
            let p = params
                .get(name)
                .ok_or_else(|| refuse(OP, format!("the actor has no parameter {name:?}")))?;
            if !seen.insert(name) {
                return Err(refuse(OP, format!("{name} is given twice")));
            }
            if shape.as_ref().is_some_and(|s| *s != p.size()) || p.numel() != values.len() {
                let given = match shape {
                    Some(s) => format!("shape {s:?} ({} values)", values.len()),
                    None => format!("{} values", values.len()),
                };
                return Err(refuse(
                    OP,
                    format!("{name}: {given} for a parameter of shape {:?}", p.size()),
                ));
            }
            if let Some((k, x)) = first_non_finite(values) {
                return Err(refuse(
                    OP,
                    format!("{name}: value {k} is {x}; expected a finite number"),
                ));
            }
        }
        let _no_grad = tch::no_grad_guard();
        for (name, _, values) in weights {
            let src = Tensor::f_from_slice(&values)?;
            let mut p = params[&name].shallow_clone();
            p.f_copy_(&src.f_view_as(&p)?.f_to_kind(p.kind())?)?;
            if let Some(m) = masters.get(&name) {
                let mut m = m.shallow_clone();
                m.f_copy_(&src.f_view_as(&m)?)?;
            }
        }
        Ok(())
    }

    /// The actor's tensors by name, sharing their memory (training phase):
    /// `"weights"`, `"grads"` (the last update's, summed over the ranks,
    /// until a switch to generation discards them),
    /// or `"optimizer"` (AdamW's moments, `<name>.exp_avg` and
    /// `<name>.exp_avg_sq`). For zero-copy views: the memory is released
    /// by the next switch to the rollout phase, so a caller must not keep
    /// them past it.
    pub fn shared_tensors(&self, what: &str) -> Result<Vec<(String, Tensor)>> {
        const OP: &str = "view the training state";
        self.expect_train(OP)?;
        let actor = self.run.worker.actor(OP)?;
        Ok(match what {
            // A sharded actor's weights exist only gathered, inside a pass.
            "weights" if actor.is_sharded() => {
                return Err(Error::Phase {
                    op: OP,
                    state: "the actor is sharded (cluster.sharding = \"full\"): its weights are \
                            gathered only while a pass runs; \"grads\" and \"optimizer\" are \
                            this rank's shards, by unit"
                        .into(),
                })
            }
            "weights" => actor.parameters(),
            "grads" => actor.gradients(),
            "optimizer" => actor
                .optimizer_state()
                .into_iter()
                .flat_map(|(n, m, v)| [(format!("{n}.exp_avg"), m), (format!("{n}.exp_avg_sq"), v)])
                .collect(),
            other => {
                return Err(Error::Phase {
                    op: "view the training state",
                    state: format!("{other:?}: expected \"weights\", \"grads\" or \"optimizer\""),
                })
            }
        })
    }

    /// Samples for call `op` (training phase), checked against the actor's
    /// model ([`samples`]).
    fn samples(
        &self,
        op: &'static str,
        prompts: Vec<Vec<u32>>,
        responses: Vec<Vec<u32>>,
    ) -> Result<Rollouts> {
        self.expect_train(op)?;
        let model = self.run.worker.actor(op)?.model()?.config();
        samples(op, model, prompts, responses)
    }

    pub(crate) fn expect_train(&self, op: &'static str) -> Result<()> {
        match self.phase() {
            Phase::Train => Ok(()),
            Phase::Rollout => Err(refuse(
                op,
                "the worker is in the rollout phase (its training state is released); call to_train first".into(),
            )),
        }
    }
}

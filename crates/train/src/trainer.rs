//! `ColoTrainer`: colo's training engine on candle, and the machinery of
//! one optimizer step (micro-batches, accumulation, clipping, AdamW).
//!
//! Memory: every parameter, gradient accumulator and AdamW moment is one
//! allocation in its `colo-mem` tag (`train_params`, `train_grads`,
//! `optimizer`, all `Backup`), made once when the engine is built and
//! updated in place ever after. Forward and backward passes run inside
//! `region(activations)`, so their transients are counted in that tag and
//! their blocks are cached for the next micro-batch; [`ColoTrainer::release_cache`]
//! hands them back.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use colo_mem::{tags, Policy, Pool};
use colo_model::{Model, ModelConfig, Weights};
use serde::{Deserialize, Serialize};

use crate::adamw::AdamW;
use crate::batch::{chunks, SeqBatch};
use crate::buffers::{read_f32, var_in, write_f32, zeros_in};
use crate::config::{MicroBatchConfig, MicroBatches, Optim, OptimConfig};
use crate::engine::{Scores, StepStats};
use crate::forward::Entropy;
use crate::offload::{self, require_resident, Offload, Part, GRADS, OPTIMIZER, PARAMS};
use crate::value_head::{ValueHead, VALUE_HEAD_WEIGHT};
use crate::{Error, Result};

/// A critic's value head: how to initialise it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ValueHeadConfig {
    /// Standard deviation of the initial weights.
    pub init_std: f64,
    pub seed: u64,
}

impl Default for ValueHeadConfig {
    fn default() -> Self {
        ValueHeadConfig {
            init_std: 0.02,
            seed: 0,
        }
    }
}

/// Everything that configures a [`ColoTrainer`], as a run's config file
/// writes it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainerConfig {
    pub optim: OptimConfig,
    pub micro_batch: MicroBatchConfig,
    /// Present for a critic: the engine gets a value head.
    pub value_head: Option<ValueHeadConfig>,
}

/// colo's [`crate::TrainEngine`] on candle, float32 on the CPU.
pub struct ColoTrainer {
    pub(crate) pool: Arc<Pool>,
    /// The model whose parameters are `Var`s (forwards build a graph).
    pub(crate) model: Model,
    /// The same storage through detached tensors: forwards build no graph
    /// and keep no activations alive (scoring passes).
    pub(crate) frozen: Model,
    pub(crate) value_head: Option<ValueHead>,
    /// Parameter names (Hugging Face's, then `v_head.weight`), and in the
    /// same order the parameters and their gradient accumulators.
    pub(crate) names: Vec<String>,
    pub(crate) params: Vec<Tensor>,
    pub(crate) grads: Vec<Tensor>,
    pub(crate) opt: AdamW,
    pub(crate) optim: Optim,
    pub(crate) micro: MicroBatches,
}

impl ColoTrainer {
    /// Builds the engine from a model config and its weights (copied into
    /// the `train_params` tag of `pool`; `weights` may be dropped after).
    pub fn new(
        pool: Arc<Pool>,
        model_cfg: &ModelConfig,
        weights: &Weights,
        cfg: &TrainerConfig,
    ) -> Result<Self> {
        let optim = cfg.optim.validate()?;
        let micro = cfg.micro_batch.validate()?;
        for tag in [tags::TRAIN_PARAMS, tags::TRAIN_GRADS, tags::OPTIMIZER] {
            pool.set_policy(tag, Policy::Backup)?;
        }
        // Checks names and shapes against the config before copying.
        let base = Model::load(model_cfg, weights)?;
        let mut names = Vec::new();
        let mut vars = HashMap::new();
        let mut frozen = HashMap::new();
        for (name, t) in base.named_parameters() {
            let v = var_in(&pool, tags::TRAIN_PARAMS, &t)?;
            frozen.insert(name.clone(), v.as_tensor().detach());
            vars.insert(name.clone(), v.as_tensor().clone());
            names.push(name);
        }
        drop(base);
        let model = Model::load(model_cfg, &Weights::from_tensors(vars))?;
        let frozen = Model::load(model_cfg, &Weights::from_tensors(frozen))?;
        let mut params: Vec<Tensor> = model
            .named_parameters()
            .into_iter()
            .map(|(_, t)| t)
            .collect();
        let value_head = cfg
            .value_head
            .as_ref()
            .map(|h| ValueHead::new(&pool, model_cfg.hidden_size, h.init_std, h.seed))
            .transpose()?;
        if let Some(h) = &value_head {
            names.push(VALUE_HEAD_WEIGHT.to_owned());
            params.push(h.weight().clone());
        }
        let grads = params
            .iter()
            .map(|p| zeros_in(&pool, tags::TRAIN_GRADS, p.shape()))
            .collect::<Result<Vec<_>>>()?;
        let opt = AdamW::new(&pool, optim.adamw, &params)?;
        Ok(ColoTrainer {
            pool,
            model,
            frozen,
            value_head,
            names,
            params,
            grads,
            opt,
            optim,
            micro,
        })
    }

    /// Builds the engine from a Hugging Face checkpoint directory.
    pub fn from_dir(pool: Arc<Pool>, dir: &Path, cfg: &TrainerConfig) -> Result<Self> {
        let model_cfg = ModelConfig::from_file(&dir.join("config.json"))?;
        let weights = Weights::from_dir(dir, DType::F32, &Device::Cpu)?;
        ColoTrainer::new(pool, &model_cfg, &weights, cfg)
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// The trainable model (its parameters are updated in place by steps).
    /// An error while the parameters are offloaded: the model's tensors
    /// point into released memory, and reading them would fault.
    pub fn model(&self) -> Result<&Model> {
        crate::offload::require_resident(&self.pool, "use the model", &[crate::offload::PARAMS])?;
        Ok(&self.model)
    }

    pub fn value_head(&self) -> Option<&ValueHead> {
        self.value_head.as_ref()
    }

    /// Number of trained scalars (the value head included).
    pub fn num_parameters(&self) -> usize {
        self.params.iter().map(|p| p.elem_count()).sum()
    }

    /// Bytes of the parameters, of the gradient accumulators, and of the
    /// optimizer state (as allocated, before page rounding).
    pub fn state_bytes(&self) -> (u64, u64, u64) {
        let n = 4 * self.num_parameters() as u64;
        (n, n, 2 * n)
    }

    /// Every trained tensor (the value head included) with its name.
    pub fn parameters(&self) -> Vec<(String, Tensor)> {
        self.names
            .iter()
            .cloned()
            .zip(self.params.iter().cloned())
            .collect()
    }

    /// The gradient accumulators of the last step (before clipping), by
    /// parameter name. Valid until the next step starts.
    pub fn gradients(&self) -> Vec<(String, Tensor)> {
        self.names
            .iter()
            .cloned()
            .zip(self.grads.iter().cloned())
            .collect()
    }

    /// The AdamW moments, `(name, exp_avg, exp_avg_sq)`.
    pub fn optimizer_state(&self) -> Vec<(String, Tensor, Tensor)> {
        self.names
            .iter()
            .zip(&self.opt.moments)
            .map(|(n, m)| (n.clone(), m.exp_avg.clone(), m.exp_avg_sq.clone()))
            .collect()
    }

    /// The learning rate the next step will use.
    pub fn next_lr(&self) -> f64 {
        self.optim.schedule.lr_at(self.opt.t)
    }

    pub(crate) fn offload_parts(&mut self, what: Offload) -> Result<()> {
        // Cached activation blocks are device memory too; an offload is the
        // moment the trainer steps aside, so they go back as well.
        self.pool.empty_cache();
        offload::offload(&self.pool, what)
    }

    pub(crate) fn reload_parts(&mut self, what: Offload) -> Result<()> {
        offload::reload(&self.pool, what)
    }

    // ------------------------------------------------------------ passes

    /// Runs `f` inside `region(activations)` and copies its tensors out to
    /// ordinary memory, so nothing the caller keeps lives in a tag that
    /// the RL loop may discard.
    pub(crate) fn in_activations<const N: usize>(
        &self,
        f: impl FnOnce() -> Result<[Option<Tensor>; N]>,
    ) -> Result<[Option<Tensor>; N]> {
        warm_thread_locals()?;
        let guard = self.pool.region(tags::ACTIVATIONS)?;
        let out = f();
        guard.finish()?;
        let out = out?;
        let mut res: [Option<Tensor>; N] = std::array::from_fn(|_| None);
        for (r, t) in res.iter_mut().zip(out) {
            *r = t.map(|t| to_heap(&t)).transpose()?;
        }
        Ok(res)
    }

    /// Scores `batch` in micro-batches without a gradient.
    pub(crate) fn score_batch(&self, batch: &SeqBatch, with_entropy: bool) -> Result<Scores> {
        require_resident(&self.pool, "score a batch", &[PARAMS])?;
        let ent = if with_entropy {
            Entropy::Detached
        } else {
            Entropy::None
        };
        let (mut lps, mut ents) = (vec![], vec![]);
        for (start, len) in chunks(batch.batch_size(), self.micro.score) {
            let (mb, w) = batch.micro(start, len)?;
            let [lp, e] = self.in_activations(|| {
                let (lp, e) = self.token_scores(&mb, false, ent)?;
                Ok([Some(lp), e])
            })?;
            let pad = batch.seq_len() - w;
            lps.push(lp.expect("set").pad_with_zeros(1, 0, pad)?);
            if let Some(e) = e {
                ents.push(e.pad_with_zeros(1, 0, pad)?);
            }
        }
        Ok(Scores {
            log_probs: Tensor::cat(&lps, 0)?,
            entropy: with_entropy.then(|| Tensor::cat(&ents, 0)).transpose()?,
        })
    }

    /// Values of `batch` in micro-batches without a gradient.
    pub(crate) fn value_batch(&self, batch: &SeqBatch) -> Result<Tensor> {
        require_resident(&self.pool, "compute values", &[PARAMS])?;
        let mut out = vec![];
        for (start, len) in chunks(batch.batch_size(), self.micro.score) {
            let (mb, w) = batch.micro(start, len)?;
            let [v] = self.in_activations(|| Ok([Some(self.token_values(&mb, false)?)]))?;
            out.push(v.expect("set").pad_with_zeros(1, 0, batch.seq_len() - w)?);
        }
        Ok(Tensor::cat(&out, 0)?)
    }

    /// One optimizer step: zero the accumulators, run `micro_loss` on each
    /// micro-batch `(start, len)` of `rows` rows and accumulate its
    /// gradient, clip, and update. `micro_loss` returns the micro-batch's
    /// share of the batch loss (scaled by batch-wide denominators, so the
    /// shares add up to the full-batch loss) and its metrics.
    pub(crate) fn train_step<M>(
        &mut self,
        op: &'static str,
        rows: usize,
        mut micro_loss: impl FnMut(&Self, usize, usize) -> Result<(Tensor, M)>,
    ) -> Result<(Vec<M>, StepStats)> {
        const ALL: [Part; 3] = [PARAMS, GRADS, OPTIMIZER];
        require_resident(&self.pool, op, &ALL)?;
        for g in &self.grads {
            write_f32(g, |g| g.fill(0.0))?;
        }
        warm_thread_locals()?;
        let mut metrics = Vec::new();
        let this = &*self;
        for (start, len) in chunks(rows, this.micro.train) {
            let guard = this.pool.region(tags::ACTIVATIONS)?;
            let res = micro_loss(this, start, len).and_then(|(loss, m)| {
                let grads = loss.backward()?;
                for (p, acc) in this.params.iter().zip(&this.grads) {
                    if let Some(g) = grads.get(p) {
                        accumulate(acc, g)?;
                    }
                }
                Ok(m)
            });
            guard.finish()?;
            metrics.push(res?);
        }
        let stats = self.apply_update(metrics.len())?;
        Ok((metrics, stats))
    }

    /// Clipping and the AdamW update from the accumulated gradients.
    fn apply_update(&mut self, micro_batches: usize) -> Result<StepStats> {
        let mut sq = 0f64;
        for g in &self.grads {
            sq += read_f32(g, |g| {
                g.iter().map(|&x| (x as f64) * (x as f64)).sum::<f64>()
            })?;
        }
        let grad_norm = sq.sqrt();
        let lr = self.next_lr();
        let mut stats = StepStats {
            grad_norm,
            lr,
            micro_batches,
            updated: false,
        };
        if !grad_norm.is_finite() {
            return Ok(stats);
        }
        // torch.nn.utils.clip_grad_norm_'s coefficient.
        let coef = match self.optim.grad_clip {
            Some(max) => (max / (grad_norm + 1e-6)).min(1.0),
            None => 1.0,
        };
        self.opt.step(&self.params, &self.grads, lr, coef)?;
        stats.updated = true;
        Ok(stats)
    }
}

/// `acc += g`, in place.
fn accumulate(acc: &Tensor, g: &Tensor) -> Result<()> {
    let g = g.contiguous()?;
    if g.dims() != acc.dims() {
        return Err(Error::Unsupported {
            what: "gradient shape",
            found: format!("{:?} for a parameter of shape {:?}", g.dims(), acc.dims()),
        });
    }
    write_f32(acc, |a| {
        read_f32(&g, |g| a.iter_mut().zip(g).for_each(|(a, g)| *a += g))
    })??;
    Ok(())
}

thread_local! {
    static WARM: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Makes this thread's lazily allocated library buffers exist *before* a
/// region opens: gemm keeps a per-thread packing slab (the size of the L2
/// cache) that it allocates at the thread's first matrix product and keeps
/// for the thread's life. Made inside `region(activations)`, it would be a
/// permanent allocation of that tag, and a pause of the tag would unmap
/// memory gemm still uses.
fn warm_thread_locals() -> Result<()> {
    if !WARM.with(|w| w.get()) {
        let a = Tensor::ones((64, 64), DType::F32, &Device::Cpu)?;
        a.matmul(&a)?;
        WARM.with(|w| w.set(true));
    }
    Ok(())
}

/// A copy of `t` in ordinary (heap) memory, detached.
fn to_heap(t: &Tensor) -> Result<Tensor> {
    let data = t.flatten_all()?.to_vec1::<f32>()?;
    Ok(Tensor::from_vec(data, t.shape(), &Device::Cpu)?)
}

impl crate::TrainEngine for ColoTrainer {
    fn score(&mut self, batch: &SeqBatch, with_entropy: bool) -> Result<Scores> {
        self.score_batch(batch, with_entropy)
    }

    fn values(&mut self, batch: &SeqBatch) -> Result<Tensor> {
        self.value_batch(batch)
    }

    fn update_policy(
        &mut self,
        batch: &crate::PolicyBatch,
        cfg: &crate::LossConfig,
    ) -> Result<crate::PolicyMetrics> {
        self.policy_update(batch, cfg)
    }

    fn update_critic(
        &mut self,
        batch: &crate::CriticBatch,
        cfg: &crate::CriticLossConfig,
    ) -> Result<crate::CriticMetrics> {
        self.critic_update(batch, cfg)
    }

    fn sft_step(&mut self, batch: &SeqBatch) -> Result<crate::SftMetrics> {
        self.supervised_step(batch)
    }

    fn offload(&mut self, what: Offload) -> Result<()> {
        self.offload_parts(what)
    }

    fn reload(&mut self, what: Offload) -> Result<()> {
        self.reload_parts(what)
    }

    fn release_cache(&mut self) -> u64 {
        self.pool.empty_cache()
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        self.model.named_parameters()
    }

    fn step(&self) -> u64 {
        self.opt.t
    }

    fn save_checkpoint(&self, dir: &Path) -> Result<()> {
        self.save(dir)
    }

    fn load_checkpoint(&mut self, dir: &Path) -> Result<()> {
        self.load(dir)
    }
}

//! `ColoTrainer`: colo's training engine on libtorch, and the machinery of
//! one optimizer step (micro-batches, accumulation, clipping, AdamW).
//!
//! Memory: every parameter, gradient accumulator and AdamW state tensor is
//! one allocation in its `colo-mem` tag (`train_params`, `train_grads`,
//! `optimizer`, all `Backup`), made once when the engine is built and
//! updated in place ever after. Forward and backward passes — and the
//! optimizer's temporaries — run inside `region(activations)`, so their
//! transients are counted in that tag and its cached blocks are reused by
//! the next micro-batch; [`crate::TrainEngine::release_cache`] hands them
//! back.
//!
//! Gradients: each micro-batch's backward returns the parameters'
//! gradients (`torch.autograd.grad`, not `.grad`), which are added into
//! the accumulators in place and dropped. Autograd never holds a gradient
//! between micro-batches, so no gradient memory lives outside
//! `train_grads`, and no parameter ever has a `.grad` to clear.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use colo_mem::{tags, Policy, Pool};
use colo_model::{Model, ModelConfig, Weights};
use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use crate::adamw::AdamW;
use crate::batch::{micro_batches, Micro, SeqBatch};
use crate::buffers::{copy_in, done, zeros_in};
use crate::collective::{Collective, ReduceOp};
use crate::config::{
    check_target, device_name, device_serde, kind_serde, MicroBatchConfig, MicroBatches, Optim,
    OptimConfig,
};
use crate::engine::{ParamVisitor, Scores, StepStats};
use crate::lanes::{self, Lane};
use crate::lora::{self, LoraConfig, LoraState};
use crate::offload::{self, require_resident, Offload, Part, GRADS, OPTIMIZER, PARAMS};
use crate::param_lanes;
use crate::scorer::{self, lane_parts, per_token_out, to_host};
use crate::sharding::{self, Peers, Shards};
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
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainerConfig {
    pub optim: OptimConfig,
    pub micro_batch: MicroBatchConfig,
    /// Present for a critic: the engine gets a value head.
    pub value_head: Option<ValueHeadConfig>,
    /// The parameters' kind: `"f32"` (default) or `"bf16"`. Gradient
    /// accumulators, AdamW moments and (for bf16) master weights are
    /// float32 either way; log-probabilities are computed in float32.
    #[serde(with = "kind_serde")]
    pub kind: Kind,
    /// `"cpu"` (default), `"cuda"` or `"cuda:N"`; CUDA without a GPU is an
    /// error when the engine is built.
    #[serde(with = "device_serde")]
    pub device: Device,
    /// On the CPU, the threads each pass splits a micro-batch's rows over,
    /// each running libtorch with one intra-op thread (see
    /// [`colo_model::lanes`]); 0: the process's share (`OMP_NUM_THREADS`, else the cores). Ignored on CUDA.
    pub cpu_threads: usize,
    /// Activation checkpointing in training passes: keep each decoder
    /// layer's input, recompute the layer for the backward (see
    /// [`crate::checkpointing`]). Less activation memory, one more forward.
    pub gradient_checkpointing: bool,
    /// Train LoRA adapters on the frozen weights instead of the weights
    /// ([`crate::lora`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lora: Option<LoraConfig>,
}

impl Default for TrainerConfig {
    fn default() -> Self {
        TrainerConfig {
            optim: OptimConfig::default(),
            micro_batch: MicroBatchConfig::default(),
            value_head: None,
            kind: Kind::Float,
            device: Device::Cpu,
            cpu_threads: 0,
            gradient_checkpointing: false,
            lora: None,
        }
    }
}

/// colo's [`crate::TrainEngine`] on libtorch.
pub struct ColoTrainer {
    pub(crate) pool: Arc<Pool>,
    /// The model; its parameters are the tensors of `params` (shared), so
    /// in-place updates are the model's. Forwards under `tch::no_grad`
    /// (scoring) build no graph.
    pub(crate) model: Model,
    pub(crate) value_head: Option<ValueHead>,
    /// Parameter names (Hugging Face's, then `v_head.weight`), and in the
    /// same order the parameters (leaves that require a gradient) and
    /// their float32 gradient accumulators.
    pub(crate) names: Vec<String>,
    pub(crate) params: Vec<Tensor>,
    pub(crate) grads: Vec<Tensor>,
    pub(crate) opt: AdamW,
    pub(crate) optim: Optim,
    pub(crate) micro: MicroBatches,
    pub(crate) kind: Kind,
    pub(crate) device: Device,
    /// Threads a pass splits its rows over (see [`crate::lanes`]); 1 on CUDA.
    pub(crate) lanes: usize,
    /// [`TrainerConfig::gradient_checkpointing`].
    pub(crate) checkpointing: bool,
    /// The data-parallel peers, if any (see [`crate::collective`]).
    pub(crate) collective: Option<Peers>,
    /// Sharded state (see [`crate::sharding`]): then `params` are the
    /// model's parameters, empty between the gathers of their units, and
    /// `grads` and the optimizer hold this peer's shard of each unit.
    pub(crate) shards: Option<Shards>,
    /// LoRA: `names` / `params` are then the adapters' (and the value
    /// head's), the model's own weights frozen (see [`crate::lora`]).
    pub(crate) lora: Option<LoraState>,
}

impl ColoTrainer {
    /// Builds the engine from a model config and its weights (copied, in
    /// `cfg.kind` on `cfg.device`, into the `train_params` tag of `pool`;
    /// `weights` may be dropped after).
    pub fn new(
        pool: Arc<Pool>,
        model_cfg: &ModelConfig,
        weights: &Weights,
        cfg: &TrainerConfig,
    ) -> Result<Self> {
        let optim = cfg.optim.validate()?;
        let micro = cfg.micro_batch.validate()?;
        let (kind, device) = (cfg.kind, cfg.device);
        let lora = cfg.lora.as_ref().map(LoraConfig::validate).transpose()?;
        check_target(kind, device)?;
        check_pool(&pool, device)?;
        for tag in [tags::TRAIN_PARAMS, tags::OPTIMIZER] {
            pool.set_policy(tag, Policy::Backup)?;
        }
        // Every step writes the accumulators before reading them (the
        // first gradient is copied in, untouched ones zeroed), so an
        // offload need not keep them: no backup copy out, none back in.
        // `gradients()` is therefore valid until the next offload.
        pool.set_policy(tags::TRAIN_GRADS, Policy::Discard)?;
        // Checks names and shapes against the config before copying.
        let base = Model::load(model_cfg, weights)?;
        let mut names = Vec::new();
        let mut params = Vec::new();
        let mut shared = HashMap::new();
        // With LoRA the weights are frozen: no gradient, no optimizer state.
        let trained = lora.is_none();
        for (name, t) in base.named_parameters() {
            let p = copy_in(&pool, tags::TRAIN_PARAMS, &t, kind, device, trained)?;
            shared.insert(name.clone(), p.shallow_clone());
            if trained {
                names.push(name);
                params.push(p);
            }
        }
        drop(base);
        let mut model = Model::load(model_cfg, &Weights::from_tensors(shared))?;
        let lora = match lora {
            Some(l) => {
                let (adapted, state, adapters) = lora::attach(&pool, &model, l, kind, device)?;
                model = adapted;
                (names, params) = adapters.into_iter().unzip();
                Some(state)
            }
            None => None,
        };
        let value_head = cfg
            .value_head
            .as_ref()
            .map(|h| ValueHead::new(&pool, model_cfg.hidden_size, h, kind, device))
            .transpose()?;
        if let Some(h) = &value_head {
            names.push(VALUE_HEAD_WEIGHT.to_owned());
            params.push(h.weight().shallow_clone());
        }
        let grads = params
            .iter()
            .map(|p| zeros_in(&pool, tags::TRAIN_GRADS, &p.size(), Kind::Float, device))
            .collect::<Result<Vec<_>>>()?;
        let opt = AdamW::new(&pool, optim.adamw, &params)?;
        Ok(ColoTrainer {
            pool,
            model,
            value_head,
            names,
            params,
            grads,
            opt,
            optim,
            micro,
            kind,
            device,
            lanes: colo_model::lanes::count(device, cfg.cpu_threads),
            checkpointing: cfg.gradient_checkpointing,
            collective: None,
            shards: None,
            lora,
        })
    }

    /// Joins this trainer to data-parallel peers: from the next update on,
    /// losses use global denominators and gradients are summed over the
    /// peers before the step (see [`crate::collective`]). `None` leaves
    /// the group.
    /// A sharded trainer keeps the peers it was built with: an error.
    pub fn set_collective(&mut self, collective: Option<Box<dyn Collective>>) -> Result<()> {
        if self.shards.is_some() {
            return Err(Error::Unsupported {
                what: "collective",
                found: "a sharded trainer's peers are fixed when it is built".into(),
            });
        }
        self.collective = collective.map(|c| Arc::new(std::sync::Mutex::new(c)));
        Ok(())
    }

    /// Reduces host values over the peers (the identity without any).
    pub(crate) fn reduce_values(&mut self, values: &mut [f64], op: ReduceOp) -> Result<()> {
        match &self.collective {
            Some(c) => sharding::lock(c)?.all_reduce_values(values, op),
            None => Ok(()),
        }
    }

    /// Builds the engine from a Hugging Face checkpoint directory.
    pub fn from_dir(pool: Arc<Pool>, dir: &Path, cfg: &TrainerConfig) -> Result<Self> {
        check_target(cfg.kind, cfg.device)?;
        let model_cfg = ModelConfig::from_file(&dir.join("config.json"))?;
        // Read on the CPU in float32; `new` converts while copying into
        // the pool, so no second full copy exists on the device.
        let weights = Weights::from_dir(dir, Kind::Float, Device::Cpu)?;
        let mut trainer = ColoTrainer::new(pool, &model_cfg, &weights, cfg)?;
        trainer.set_lora_base(dir);
        Ok(trainer)
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// The parameters' kind.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    pub fn device(&self) -> Device {
        self.device
    }

    /// The trainable model (its parameters are updated in place by steps).
    /// An error while the parameters are offloaded: the model's tensors
    /// point into released memory, and reading them would fault.
    pub fn model(&self) -> Result<&Model> {
        require_resident(&self.pool, "use the model", &[PARAMS])?;
        Ok(&self.model)
    }

    pub fn value_head(&self) -> Option<&ValueHead> {
        self.value_head.as_ref()
    }

    /// Number of trained scalars (the value head included).
    pub fn num_parameters(&self) -> usize {
        self.params.iter().map(|p| p.numel()).sum()
    }

    /// Bytes of the parameters (with LoRA: the frozen weights and the
    /// adapters), of the gradient accumulators, and of the optimizer state
    /// (as allocated, before page rounding).
    pub fn state_bytes(&self) -> (u64, u64, u64) {
        let n = self.num_parameters() as u64;
        (
            n * self.kind.elt_size_in_bytes() as u64 + self.frozen_bytes(),
            4 * n,
            self.opt.bytes(),
        )
    }

    /// Every trained tensor (the value head included) with its name;
    /// detached views of the parameters' storage.
    ///
    /// A sharded trainer's are empty outside [`Self::with_gathered`].
    pub fn parameters(&self) -> Vec<(String, Tensor)> {
        self.names
            .iter()
            .cloned()
            .zip(self.params.iter().map(Tensor::detach))
            .collect()
    }

    /// The float32 gradient accumulators of the last step, clipped in
    /// place by the update (as PyTorch's `clip_grad_norm_` leaves them),
    /// by parameter name. Valid until the next step starts or
    /// the next offload of the gradients, which keeps no copy of them.
    ///
    /// A sharded trainer's gradients, moments and masters are this peer's
    /// flat shards of its units, named for them ([`Self::state_names`]).
    pub fn gradients(&self) -> Vec<(String, Tensor)> {
        self.state_names()
            .into_iter()
            .zip(self.grads.iter().map(Tensor::shallow_clone))
            .collect()
    }

    /// The names [`Self::gradients`], [`Self::optimizer_state`] and
    /// [`Self::master_weights`] give their tensors: the parameters', or a
    /// sharded trainer's units' (`root`: everything outside the decoder
    /// layers; `model.layers.N`).
    pub fn state_names(&self) -> Vec<String> {
        match &self.shards {
            Some(sh) => (0..sh.units.len())
                .map(|u| match u {
                    0 => "root".to_owned(),
                    _ => format!("model.layers.{}", u - 1),
                })
                .collect(),
            None => self.names.clone(),
        }
    }

    /// The AdamW moments (float32), `(name, exp_avg, exp_avg_sq)`.
    pub fn optimizer_state(&self) -> Vec<(String, Tensor, Tensor)> {
        self.state_names()
            .into_iter()
            .zip(&self.opt.moments)
            .map(|(n, m)| (n, m.exp_avg.shallow_clone(), m.exp_avg_sq.shallow_clone()))
            .collect()
    }

    /// The float32 master weights AdamW keeps for parameters of another
    /// kind (empty for a float32 engine).
    pub fn master_weights(&self) -> Vec<(String, Tensor)> {
        self.state_names()
            .into_iter()
            .zip(&self.opt.moments)
            .filter_map(|(n, m)| Some((n, m.master.as_ref()?.shallow_clone())))
            .collect()
    }

    /// The learning rate the next step will use.
    pub fn next_lr(&self) -> f64 {
        self.optim.schedule.lr_at(self.opt.t)
    }

    pub(crate) fn offload_parts(&mut self, what: Offload) -> Result<()> {
        // The cached activation blocks stay: returning them is
        // `release_cache`, a separate call (PyTorch's `empty_cache` beside
        // FSDP's offload), because giving them back and faulting them in
        // again next step costs a quarter of a small model's step and is
        // worth it only when something else needs the room.
        offload::offload(&self.pool, what)
    }

    pub(crate) fn reload_parts(&mut self, what: Offload) -> Result<()> {
        offload::reload(&self.pool, what)
    }

    // ------------------------------------------------------------ passes

    /// The engine's weights as one lane's own handles.
    pub(crate) fn lane(&self) -> Lane {
        Lane {
            shards: self.shards.clone(),
            ..Lane::of(
                &self.pool,
                &self.model,
                self.value_head.as_ref(),
                &self.params,
            )
        }
    }

    /// Scores `batch` in micro-batches without a gradient (see
    /// [`crate::scorer`]).
    pub(crate) fn score_batch(&mut self, batch: &SeqBatch, with_entropy: bool) -> Result<Scores> {
        require_resident(&self.pool, "score a batch", &[PARAMS])?;
        if self.shards.is_some() {
            return self.sharded_score(batch, with_entropy);
        }
        scorer::score(
            &self.lane(),
            self.lanes,
            self.micro.score,
            batch,
            with_entropy,
        )
    }

    /// Values of `batch` in micro-batches without a gradient, as a
    /// float32 CPU tensor (like [`Self::score_batch`]).
    pub(crate) fn value_batch(&mut self, batch: &SeqBatch) -> Result<Tensor> {
        require_resident(&self.pool, "compute values", &[PARAMS])?;
        if self.value_head.is_none() {
            return Err(Error::NoValueHead {
                op: "compute values",
            });
        }
        if self.shards.is_some() {
            return self.sharded_values(batch);
        }
        let out = per_token_out(batch, self.device)?;
        let lane = self.lane();
        for (start, len) in micro_batches(batch, self.micro.score) {
            let parts = lane_parts(batch, start, len, self.lanes, self.device)?;
            let values = lanes::run(&lane, false, parts, || {
                move |lane: &Lane, mb: Micro| Ok((lane.token_values(&mb)?, mb))
            })?;
            for (v, mb) in values {
                if let Some(v) = v {
                    mb.write_window(&out, &v)?;
                }
            }
        }
        to_host(out)
    }

    /// One optimizer step: for each micro-batch of `batch`, split over the
    /// lanes, run a loss from `make_loss` on each part and accumulate its
    /// gradient (parts in order, so the sum does not depend on which lane
    /// finished first); then clip and update. A loss returns its part's
    /// share of the batch loss (scaled by batch-wide denominators, so the
    /// shares add up to the full-batch loss) and its metrics; no loss for
    /// a part without response tokens (it contributes nothing).
    pub(crate) fn train_step<M, L>(
        &mut self,
        op: &'static str,
        batch: &SeqBatch,
        mut make_loss: impl FnMut() -> L,
    ) -> Result<(Vec<M>, StepStats)>
    where
        M: Default + Send,
        L: FnOnce(&Lane, &Micro) -> Result<Option<(Tensor, M)>> + Send,
    {
        const ALL: [Part; 3] = [PARAMS, GRADS, OPTIMIZER];
        require_resident(&self.pool, op, &ALL)?;
        if self.shards.is_some() {
            // Gradients arrive reduce-scattered: no all-reduce after.
            let (metrics, count) = self.sharded_accumulate(batch, &mut make_loss)?;
            return Ok((metrics, self.update_in_activations(count)?));
        }
        let mut metrics = Vec::new();
        // Accumulators not yet written this step: the first gradient is
        // copied in, the following ones added.
        let mut fresh = vec![true; self.grads.len()];
        let mut micro_count = 0;
        let lane = self.lane();
        let checkpointing = self.checkpointing;
        for (start, len) in micro_batches(batch, self.micro.train) {
            let parts = lane_parts(batch, start, len, self.lanes, self.device)?;
            let done_parts = lanes::run(&lane, true, parts, || {
                let loss_of = make_loss();
                move |lane: &Lane, mb: Micro| {
                    if checkpointing {
                        return lane.checkpointed_grads(&mb, loss_of);
                    }
                    let Some((loss, m)) = loss_of(lane, &mb)? else {
                        return Ok((None, M::default()));
                    };
                    if !loss.requires_grad() {
                        return Ok((None, m));
                    }
                    let grads = Tensor::f_run_backward(&[&loss], &lane.params, false, false)?;
                    Ok((Some(grads), m))
                }
            })?;
            let mut parts = Vec::with_capacity(done_parts.len());
            for (grads, m) in done_parts {
                metrics.push(m);
                parts.extend(grads);
            }
            param_lanes::accumulate(&self.grads, &parts, &mut fresh, self.lanes)?;
            micro_count += 1;
        }
        tch::no_grad(|| -> Result<()> {
            for (acc, fresh) in self.grads.iter().zip(fresh) {
                if fresh {
                    done(acc.shallow_clone().f_zero_())?;
                }
            }
            Ok(())
        })?;
        if let Some(c) = &self.collective {
            sharding::lock(c)?.all_reduce_tensors(&self.grads)?;
        }
        Ok((metrics, self.update_in_activations(micro_count)?))
    }

    /// [`Self::apply_update`] with the optimizer's temporaries (on a GPU;
    /// the CPU's fused update makes none) in the activations' cached
    /// blocks.
    fn update_in_activations(&mut self, micro_batches: usize) -> Result<StepStats> {
        let guard = self.pool.region(tags::ACTIVATIONS)?;
        let stats = self.apply_update(micro_batches);
        guard.finish()?;
        stats
    }

    /// Clipping and the AdamW update from the accumulated gradients.
    fn apply_update(&mut self, micro_batches: usize) -> Result<StepStats> {
        let grad_norm = match self.device {
            // Each tensor's norm on the lanes, combined in float64.
            Device::Cpu => param_lanes::global_norm(&self.grads, self.lanes)?,
            // In float64 on the device, one host read per step.
            _ => {
                let norms = (self.grads.iter())
                    .map(|g| g.f_norm_scalaropt_dtype(2, Kind::Double))
                    .collect::<std::result::Result<Vec<_>, _>>()?;
                Tensor::f_stack(&norms, 0)?.f_norm()?.f_double_value(&[])?
            }
        };
        // Sharded: each peer's norm is of its shards; the global one is
        // the root of their squares' sum.
        let grad_norm = match self.shards.is_some() {
            true => {
                let mut sq = [grad_norm * grad_norm];
                self.reduce_values(&mut sq, ReduceOp::Sum)?;
                sq[0].sqrt()
            }
            false => grad_norm,
        };
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
        let params = match &self.shards {
            Some(sh) => &sh.params[..],
            None => &self.params[..],
        };
        self.opt.step(params, &self.grads, lr, coef, self.lanes)?;
        stats.updated = true;
        Ok(stats)
    }
}

/// The pool must hold the engine's device memory (a host pool for the
/// CPU, a CUDA pool of the same GPU for CUDA): otherwise the regions would
/// leave the engine's tensors outside their tags, and offloads would
/// release nothing.
pub(crate) fn check_pool(pool: &Pool, device: Device) -> Result<()> {
    let pool_device = pool
        .cuda_device()
        .map_or(Device::Cpu, |i| Device::Cuda(i as usize));
    match pool_device == device {
        true => Ok(()),
        false => Err(Error::Unsupported {
            what: "pool",
            found: format!(
                "the engine runs on {} but its pool ({}) holds {} memory",
                device_name(device),
                pool.backend_name(),
                device_name(pool_device)
            ),
        }),
    }
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

    /// With LoRA the adapted projections' weights are merged copies
    /// (`W + scale · B A`), not the engine's storage; a libtorch failure
    /// while merging (out of memory) panics, as tch's infallible ops do.
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let params = match self.lora {
            Some(_) => (self.model.merged_parameters())
                .unwrap_or_else(|e| panic!("merging the LoRA adapters: {e}")),
            None => self.model.named_parameters(),
        };
        params.into_iter().map(|(n, t)| (n, t.detach())).collect()
    }

    fn step(&self) -> u64 {
        self.opt.t
    }

    fn visit_parameters(&self, visit: &mut ParamVisitor<'_>) -> Result<()> {
        match (&self.shards, &self.lora) {
            (Some(_), _) => self.visit_units(visit),
            (None, Some(_)) => self.visit_merged(visit),
            (None, None) => visit(&crate::TrainEngine::named_parameters(self)),
        }
    }

    fn gathered_traffic(&self) -> Option<crate::Traffic> {
        ColoTrainer::gathered_traffic(self)
    }

    fn save_checkpoint(&self, dir: &Path) -> Result<()> {
        self.save(dir)
    }

    fn save_checkpoint_with<E: From<crate::Error>>(
        &self,
        dir: &Path,
        global_step: Option<u64>,
        extra: impl FnOnce(&Path) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        ColoTrainer::save_checkpoint_with(self, dir, global_step, extra)
    }

    fn save_model(&self, dir: &Path) -> Result<()> {
        let model = self.model()?;
        match self.lora {
            Some(_) => Ok(model.merged()?.save_dir(dir)?),
            None => Ok(model.save_dir(dir)?),
        }
    }

    fn load_checkpoint(&mut self, dir: &Path) -> Result<()> {
        self.load(dir)
    }
}

//! [`ColoTrainer`] with sharded state (see [`crate::sharding`]): building
//! it from each peer's byte ranges of a checkpoint or from whole weights in
//! memory, its micro-batch loop, its scoring loop, and
//! whole-model gathers for what needs every weight at once (checkpoints,
//! the rollout engine's weights).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use colo_mem::{tags, Policy, Pool};
use colo_model::{Model, ModelConfig, Weights};
use tch::{Kind, Tensor};

use crate::batch::{micro_batches, Micro, SeqBatch};
use crate::collective::{Collective, ReduceOp};
use crate::config::{check_target, Split};
use crate::engine::{ParamVisitor, Scores};
use crate::forward::Entropy;
use crate::lanes::{self, Lane};
use crate::scorer::{lane_parts, per_token_out, to_host};
use crate::shard_read::ShardRead;
use crate::sharded_checkpoint::read_weight_shards;
use crate::sharding::{flatten, units, Shards, Unit};
use crate::trainer::{check_pool, ColoTrainer, TrainerConfig};
use crate::value_head::VALUE_HEAD_WEIGHT;
use crate::{buffers, AdamW, Error, Result};

impl ColoTrainer {
    /// A trainer holding `1/world` of the parameters, gradients and AdamW
    /// state of the model (see [`crate::sharding`]), joined to its peers by
    /// `collective`, which must make the same calls on every peer.
    /// `weights` are the whole model's, already in memory (each peer cuts
    /// its shard from them); [`ColoTrainer::from_dir_sharded`] reads only
    /// each peer's part of a checkpoint. Activation checkpointing is always
    /// on.
    pub fn new_sharded(
        pool: Arc<Pool>,
        model_cfg: &ModelConfig,
        weights: &Weights,
        cfg: &TrainerConfig,
        collective: Box<dyn Collective>,
    ) -> Result<Self> {
        let fill =
            |names: &[String], units: &[Unit], rank: usize, world: usize, shards: &[Tensor]| {
                // Checked against the config; each unit flattened, its shard
                // cut from it in the shard's kind.
                let whole = Model::load(model_cfg, weights)?;
                let whole: HashMap<String, Tensor> = whole.named_parameters().into_iter().collect();
                let _no_grad = tch::no_grad_guard();
                for (unit, shard) in units.iter().zip(shards) {
                    let n = unit.shard_len(world);
                    let members: Vec<Tensor> = (unit.params.iter())
                        .map(|&i| whole[&names[i]].shallow_clone())
                        .collect();
                    let flat = flatten(&members, unit.padded, shard.kind())?;
                    shard
                        .shallow_clone()
                        .f_copy_(&flat.f_narrow(0, rank as i64 * n, n)?)?;
                }
                Ok(())
            };
        ColoTrainer::sharded_with(pool, model_cfg, cfg, collective, fill)
    }

    /// [`ColoTrainer::new_sharded`] from a Hugging Face checkpoint
    /// directory, each peer reading only its elements of the weights'
    /// files (see [`crate::shard_read`]): no peer holds the whole model.
    pub fn from_dir_sharded(
        pool: Arc<Pool>,
        dir: &Path,
        cfg: &TrainerConfig,
        collective: Box<dyn Collective>,
    ) -> Result<Self> {
        Ok(ColoTrainer::from_dir_sharded_read(pool, dir, cfg, collective)?.0)
    }

    /// [`ColoTrainer::from_dir_sharded`], and what it read of the
    /// checkpoint's files. A missing or wrongly shaped tensor is an error
    /// naming it and its file, on every peer, before anything is read.
    pub fn from_dir_sharded_read(
        pool: Arc<Pool>,
        dir: &Path,
        cfg: &TrainerConfig,
        collective: Box<dyn Collective>,
    ) -> Result<(Self, ShardRead)> {
        check_target(cfg.kind, cfg.device)?;
        let model_cfg = ModelConfig::from_file(&dir.join("config.json"))?;
        let mut read = ShardRead::default();
        let fill =
            |names: &[String], units: &[Unit], rank: usize, world: usize, shards: &[Tensor]| {
                read = read_weight_shards(dir, names, units, rank, world, shards)?;
                Ok(())
            };
        let e = ColoTrainer::sharded_with(pool, &model_cfg, cfg, collective, fill)?;
        Ok((e, read))
    }

    /// A sharded trainer whose weight shards (one a unit, zero, the
    /// engine's kind on its device) `fill(names, units, rank, world,
    /// shards)` fills; the AdamW masters are copies of them.
    fn sharded_with(
        pool: Arc<Pool>,
        model_cfg: &ModelConfig,
        cfg: &TrainerConfig,
        collective: Box<dyn Collective>,
        fill: impl FnOnce(&[String], &[Unit], usize, usize, &[Tensor]) -> Result<()>,
    ) -> Result<Self> {
        let optim = cfg.optim.validate()?;
        let micro = cfg.micro_batch.validate()?;
        if cfg.lora.is_some() {
            return Err(Error::Unsupported {
                what: "LoRA with sharded state",
                found: "a sharded trainer trains every weight; build it without `lora`".into(),
            });
        }
        if cfg.value_head.is_some() {
            return Err(Error::Unsupported {
                what: "value head with sharded state",
                found: "a critic stays whole on every worker; build it without sharding".into(),
            });
        }
        let (kind, device) = (cfg.kind, cfg.device);
        check_target(kind, device)?;
        check_pool(&pool, device)?;
        for tag in [tags::TRAIN_PARAMS, tags::OPTIMIZER] {
            pool.set_policy(tag, Policy::Backup)?;
        }
        for tag in [tags::TRAIN_GRADS, tags::GATHERED_PARAMS] {
            pool.set_policy(tag, Policy::Discard)?;
        }
        let (world, rank) = (collective.world_size(), collective.rank());
        if world == 0 || rank >= world {
            return Err(Error::Unsupported {
                what: "collective",
                found: format!("rank {rank} of {world} peers"),
            });
        }
        let (model, names, shapes, params) = unfilled(model_cfg, kind, device)?;
        let units = units(&names, &shapes, model_cfg.num_layers, world);
        let mut shard_params = Vec::with_capacity(units.len());
        let mut grads = Vec::with_capacity(units.len());
        for u in &units {
            let n = u.shard_len(world);
            shard_params.push(buffers::zeros_in(
                &pool,
                tags::TRAIN_PARAMS,
                &[n],
                kind,
                device,
            )?);
            grads.push(buffers::zeros_in(
                &pool,
                tags::TRAIN_GRADS,
                &[n],
                Kind::Float,
                device,
            )?);
        }
        fill(&names, &units, rank, world, &shard_params)?;
        let opt = AdamW::new(&pool, optim.adamw, &shard_params)?;
        let peers = Arc::new(Mutex::new(collective));
        let shards = Shards {
            pool: pool.clone(),
            peers: peers.clone(),
            fresh: Arc::new(Mutex::new(vec![true; units.len()])),
            spent_ns: Default::default(),
            gathered: Default::default(),
            units: Arc::new(units),
            world,
            rank,
            params: shard_params,
            grads: grads.iter().map(Tensor::shallow_clone).collect(),
        };
        Ok(ColoTrainer {
            pool,
            model,
            value_head: None,
            names,
            params,
            grads,
            opt,
            optim,
            micro,
            kind,
            device,
            // The peers' collective calls are made in one order: one lane.
            lanes: 1,
            checkpointing: true,
            collective: Some(peers),
            shards: Some(shards),
            lora: None,
        })
    }

    /// [`crate::TrainEngine::visit_parameters`] of a sharded trainer: one
    /// unit at a time, gathered around the call.
    pub(crate) fn visit_units(&self, visit: &mut ParamVisitor<'_>) -> Result<()> {
        let sh = self.shards.as_ref().expect("sharded");
        for (u, unit) in sh.units.iter().enumerate() {
            sh.gather(u, &self.params)?;
            let named: Vec<(String, Tensor)> = (unit.params.iter())
                .filter(|&&i| self.names[i] != VALUE_HEAD_WEIGHT)
                .map(|&i| (self.names[i].clone(), self.params[i].detach()))
                .collect();
            let out = visit(&named);
            drop(named);
            sh.release(u, &self.params)?;
            out?;
        }
        Ok(())
    }

    /// The bytes a sharded trainer's all-gathers have sent to and received
    /// from its peers since it was built, counted per call (see
    /// [`crate::Traffic`]): the training passes' gathers and every whole-model
    /// visit's (the rollout engine's weight sync, checkpoints). The
    /// difference around a weight sync is what the sync moved. `None` when
    /// not sharded.
    pub fn gathered_traffic(&self) -> Option<crate::Traffic> {
        Some(self.shards.as_ref()?.gathered())
    }

    /// Seconds a sharded trainer has spent in its gathers and
    /// reduce-scatters since it was built, as it sees them (the collective's
    /// transport and whatever lies between, e.g. a call into Python);
    /// `None` when not sharded.
    pub fn collective_seconds(&self) -> Option<f64> {
        let ns = self
            .shards
            .as_ref()?
            .spent_ns
            .load(std::sync::atomic::Ordering::Relaxed);
        Some(ns as f64 * 1e-9)
    }

    /// Whether the state is sharded over peers.
    pub fn is_sharded(&self) -> bool {
        self.shards.is_some()
    }

    /// Whether this trainer writes the checkpoints its peers help gather:
    /// unsharded, or the first peer.
    pub fn writes_checkpoints(&self) -> bool {
        self.shards.as_ref().is_none_or(|s| s.rank == 0)
    }

    /// The number of micro-batches every peer runs: the most any has.
    fn agreed_count(&mut self, mine: usize) -> Result<usize> {
        let mut n = [mine as f64];
        self.reduce_values(&mut n, ReduceOp::Max)?;
        Ok(n[0] as usize)
    }

    /// This peer's micro-batch `i` of `spans` (none past its own).
    fn part(&self, batch: &SeqBatch, spans: &[(usize, usize)], i: usize) -> Result<Option<Micro>> {
        let Some(&(start, len)) = spans.get(i) else {
            return Ok(None);
        };
        Ok(lane_parts(batch, start, len, 1, self.device)?
            .into_iter()
            .next())
    }

    /// A sharded trainer's accumulation over `batch`'s micro-batches (see
    /// `sharded_grads`): the metrics of each and how many ran.
    pub(crate) fn sharded_accumulate<M, L>(
        &mut self,
        batch: &SeqBatch,
        make_loss: &mut impl FnMut() -> L,
    ) -> Result<(Vec<M>, usize)>
    where
        M: Default + Send,
        L: FnOnce(&Lane, &Micro) -> Result<Option<(Tensor, M)>> + Send,
    {
        let sh = self.shards.clone().expect("sharded");
        if let Ok(mut fresh) = sh.fresh.lock() {
            fresh.iter_mut().for_each(|f| *f = true);
        }
        let spans = micro_batches(batch, self.micro.train);
        let count = self.agreed_count(spans.len())?;
        let lane = self.lane();
        let mut metrics = Vec::with_capacity(count);
        for i in 0..count {
            let part = self.part(batch, &spans, i)?;
            let mut loss_of = Some(make_loss());
            let mut m = lanes::run(&lane, true, vec![part], || {
                let loss_of = loss_of.take().expect("one part");
                move |lane: &Lane, mb: Option<Micro>| {
                    lane.with_unit(0, || lane.sharded_grads(mb.as_ref(), loss_of))
                }
            })?;
            metrics.push(m.pop().expect("one part"));
        }
        // No micro-batch on any peer: nothing was reduced, and the
        // accumulators must not keep the last step's sums.
        if count == 0 {
            let _no_grad = tch::no_grad_guard();
            for g in &sh.grads {
                buffers::done(g.shallow_clone().f_zero_())?;
            }
        }
        Ok((metrics, count))
    }

    /// A sharded trainer's no-grad pass over `batch` in the micro-batches
    /// of `split`: `f(head, mb)` for each of this peer's micro-batches with
    /// response tokens, `head` a lane whose forward starts from the last
    /// layer's output (the root gathered); the results with their
    /// micro-batches.
    fn sharded_no_grad<T, F>(
        &mut self,
        batch: &SeqBatch,
        split: Split,
        f: F,
    ) -> Result<Vec<(T, Micro)>>
    where
        T: Send,
        F: Fn(&Lane, &Micro) -> Result<Option<T>> + Clone + Send,
    {
        let spans = micro_batches(batch, split);
        let count = self.agreed_count(spans.len())?;
        let lane = self.lane();
        let mut out = Vec::new();
        for i in 0..count {
            let part = self.part(batch, &spans, i)?;
            let done = lanes::run(&lane, false, vec![part], || {
                let f = f.clone();
                move |lane: &Lane, mb: Option<Micro>| {
                    let t = lane.with_unit(0, || {
                        let Some((mb, _, top, _)) = lane.sharded_forward(mb.as_ref())? else {
                            return Ok(None);
                        };
                        let mut head = lane.clone();
                        head.top = Some(top);
                        f(&head, mb)
                    })?;
                    Ok(t.zip(mb))
                }
            })?;
            out.extend(done.into_iter().flatten());
        }
        Ok(out)
    }

    /// A sharded trainer's scoring (see [`ColoTrainer::score_batch`]).
    pub(crate) fn sharded_score(&mut self, batch: &SeqBatch, with_entropy: bool) -> Result<Scores> {
        let out = || per_token_out(batch, self.device);
        let (log_probs, entropy) = (out()?, with_entropy.then(out).transpose()?);
        let ent = match with_entropy {
            true => Entropy::Detached,
            false => Entropy::None,
        };
        let split = self.micro.score;
        let scored =
            self.sharded_no_grad(batch, split, move |head, mb| head.token_scores(mb, ent))?;
        for ((lp, e), mb) in scored {
            mb.write_window(&log_probs, &lp)?;
            if let (Some(out), Some(e)) = (&entropy, e) {
                mb.write_window(out, &e)?;
            }
        }
        Ok(Scores {
            log_probs: to_host(log_probs)?,
            entropy: entropy.map(to_host).transpose()?,
        })
    }

    /// A sharded critic's values (see [`ColoTrainer::value_batch`]).
    pub(crate) fn sharded_values(&mut self, batch: &SeqBatch) -> Result<Tensor> {
        let out = per_token_out(batch, self.device)?;
        let split = self.micro.score;
        for (v, mb) in self.sharded_no_grad(batch, split, |head, mb| head.token_values(mb))? {
            mb.write_window(&out, &v)?;
        }
        to_host(out)
    }

    /// Runs `f` with every unit gathered (the whole model, as an unsharded
    /// trainer holds it), releasing them after, also on error. Every peer
    /// must call it.
    pub fn with_gathered<T>(&self, f: impl FnOnce(&Self) -> Result<T>) -> Result<T> {
        let Some(sh) = &self.shards else {
            return f(self);
        };
        let mut gathered = 0;
        let mut out = (|| {
            for u in 0..sh.units.len() {
                sh.gather(u, &self.params)?;
                gathered += 1;
            }
            f(self)
        })();
        for u in 0..gathered {
            if let Err(e) = sh.release(u, &self.params) {
                out = out.and(Err(e));
            }
        }
        out
    }
}

/// A model, its parameters' names and shapes, and the parameters.
type Unfilled = (Model, Vec<String>, Vec<Vec<i64>>, Vec<Tensor>);

/// A model of `cfg` whose parameters (`kind` on `device`, requiring
/// gradients) hold no values, with their names and shapes in the model's
/// order: each is made one element strided over its shape (the shape is
/// what building the model checks), then emptied. A gather points them at
/// their unit's gathered weights.
fn unfilled(cfg: &ModelConfig, kind: Kind, device: tch::Device) -> Result<Unfilled> {
    let mut empty = HashMap::new();
    for (name, shape) in cfg.parameter_shapes() {
        let shape: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
        let strides = vec![0i64; shape.len()];
        let p = Tensor::f_empty_strided(&shape, &strides, (kind, device))?;
        empty.insert(name, p.f_set_requires_grad(true)?);
    }
    let model = Model::load(cfg, &Weights::from_tensors(empty))?;
    let (names, params): (Vec<String>, Vec<Tensor>) = model.named_parameters().into_iter().unzip();
    let shapes = params.iter().map(Tensor::size).collect();
    tch::no_grad(|| -> Result<()> {
        for p in &params {
            buffers::done(p.shallow_clone().f_set_())?;
        }
        Ok(())
    })?;
    Ok((model, names, shapes, params))
}

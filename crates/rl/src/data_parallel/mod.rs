//! One rank of a data-parallel run: the same hybrid worker and step as
//! `step.rs`, on a shard of every step's prompts, with its trainers
//! joined to the other ranks by a [`Collective`].
//!
//! The controller (colo-py's, on Ray) makes one [`Rank`] per device and
//! calls the same methods on all of them in the same order. What makes the
//! ranks one run:
//!
//! - every rank draws the **same global batch** (same data seed) and takes
//!   its contiguous share of whole prompts, so a prompt's `n` samples, and
//!   hence its GRPO group, are complete on one rank, and sampling seeds
//!   (run, step, prompt id) do not depend on the split;
//! - each update uses **global denominators and summed gradients**
//!   (colo-train's collective), so the weights stay identical on all ranks
//!   and equal, up to the order of float sums, one device's on the whole
//!   batch;
//! - mini-batches are split the same way: each rank holds `1/world` of
//!   every mini-batch. With one mini-batch per step that is exactly one
//!   device's batch; with several, rank `r`'s mini-batch `k` holds its own
//!   prompts, a different grouping of the same prompts than one device's.
//!
//! Validation is sharded too: each rank evaluates a contiguous share of the
//! held-out prompts and returns its count of right answers.
//!
//! **Dynamic sampling** (`[algorithm.filter_groups]`) filters on each
//! rank: a rank keeps the groups of its share of each generation batch
//! whose metric varies, and after every batch the ranks agree (one
//! all-reduce of a flag) whether each has its share of
//! `data.train_batch_size`; if one lacks it, all draw another batch, so
//! their data stay in step. Each trains on the first of its kept groups.
//! verl pools the groups of all workers instead and takes the first
//! `train_batch_size` of them: colo keeps every rank's share whole, so a
//! step may draw a batch more than verl's would (a rank's groups never
//! move to another).

mod ops;

pub use ops::NamedWeights;

use std::hash::Hasher;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use colo_model::Tokenizer;
use colo_train::Collective;

use crate::config::{Config, Sharding};
use crate::data::{Batch, Batches, Dataset};
use crate::metrics::{EvalTallies, MetricsWriter, StepMetrics};
use crate::setup::{draw, load_data, make_pool, open_model};
use crate::step::Run;
use crate::timeline_file::TimelineWriter;
use crate::worker::WorkerPeers;
use crate::{checkpoints, Error, Result};
use colo_rollout::TensorParallel;

/// This rank's share of `0..len` when split into `world` contiguous parts
/// (the first `len % world` parts one longer).
pub fn shard(len: usize, rank: usize, world: usize) -> std::ops::Range<usize> {
    let (base, extra) = (len / world, len % world);
    let start = rank * base + rank.min(extra);
    start..start + base + usize::from(rank < extra)
}

/// The batch plan of one rank: `1/world` of the prompts per step and per
/// mini-batch, the same micro-batches. Errors name the key that does not
/// divide.
pub fn rank_config(config: &Config, world: usize) -> Result<Config> {
    let plan = config.batch;
    let check = |key: &str, prompts: usize| match world > 0 && prompts.is_multiple_of(world) {
        true => Ok(prompts / world),
        false => Err(Error::Cluster(format!(
            "{key} = {prompts} prompts cannot be split evenly over cluster.workers = {world}; \
             make it a multiple of {world}"
        ))),
    };
    let tp = config.rollout.tensor_model_parallel_size;
    if tp == 0 || !world.is_multiple_of(tp) {
        return Err(Error::Cluster(format!(
            "rollout.tensor_model_parallel_size = {tp} does not divide cluster.workers = {world}: \
             each tensor-parallel group is {tp} consecutive workers"
        )));
    }
    let mut local = config.clone();
    local.batch.prompts_per_step = check("data.train_batch_size", plan.prompts_per_step)?;
    local.batch.mini_batch_prompts = check("actor.ppo_mini_batch_size", plan.mini_batch_prompts)?;
    local.batch.samples_per_step = local.batch.prompts_per_step * plan.n;
    local.batch.gen_batch_prompts = match config.algorithm.filter_groups.enable {
        true => check("data.gen_batch_size", plan.gen_batch_prompts)?,
        false => local.batch.prompts_per_step,
    };
    local.batch.mini_batch_samples = local.batch.mini_batch_prompts * plan.n;
    Ok(local)
}

/// One rank: its worker, its share of the data, its own records under
/// `out/workers/rank-R/`.
pub struct Rank {
    run: Run<'static>,
    global: &'static Config,
    train: &'static Dataset,
    /// The global generation batches, the same on every rank.
    batches: Batches<'static>,
    /// Generation batches drawn so far (one a step, or with dynamic
    /// sampling as many as its steps took: the same on every rank).
    gen_batches: usize,
    /// The 0-based step [`Rank::step`] runs next (steps run in order).
    next_step: usize,
    rank: usize,
    world: usize,
    out: PathBuf,
    dir: PathBuf,
    /// This rank's `timeline.jsonl`, appended to after every step.
    timeline: TimelineWriter,
}

impl Rank {
    /// Builds rank `rank` of `world` from the run's (global) config;
    /// `resume_from`: the step of the checkpoint a resumed run continues
    /// from (this rank's `metrics.jsonl` keeps the records up to it; the
    /// caller then calls [`Rank::load`]).
    /// `collective` makes the actor's collective and, for PPO with GAE,
    /// the critic's (called once or twice; the ranks call the collectives
    /// in the same order, so they may share a transport).
    /// `rollout_group`: this rank's tensor-parallel group, when
    /// `rollout.tensor_model_parallel_size` > 1 (the consecutive ranks
    /// `rank / tg · tg ..`, over a transport of their own).
    pub fn new(
        config: Config,
        out: &Path,
        rank: usize,
        world: usize,
        resume_from: Option<usize>,
        collective: impl FnMut() -> Box<dyn Collective>,
        rollout_group: Option<Box<dyn TensorParallel>>,
    ) -> Result<Self> {
        check_rank(out, rank, world)?;
        // As `colo train --resume`: `auto` continues in the checkpoint's
        // dtype, and the run's record keeps what the user asked for.
        let asked = config.clone();
        let config = resumed_config(config, out, resume_from)?;
        let local = local_config(&config, out, rank, world)?;
        // The run directory is readied, and the configuration recorded, as
        // `colo train` does it: once, by rank 0.
        if rank == 0 {
            ready_run_dir(&config, &asked, out)?;
        }
        let dir = out.join("workers").join(format!("rank-{rank}"));
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        // A rank lives as long as its worker process: its configs and data
        // are leaked once, so the run can borrow them for `'static` (a
        // Python object cannot carry a lifetime).
        let global: &'static Config = Box::leak(Box::new(config));
        let local: &'static Config = Box::leak(Box::new(local));
        let (model, train, val) = rank_data(global, &dir, rank, world)?;
        let train: &'static Dataset = Box::leak(Box::new(train));
        let pool = make_pool(global)?;
        pool.set_step(resume_from.unwrap_or(0) as u64);
        let (metrics, timeline) = rank_records(&dir, resume_from)?;
        let total = global.total_steps(train.len());
        let mut collective = collective;
        // `[cluster] sharding = "full"`: the actor keeps 1/world of its
        // state, joined to the other ranks from the start (one rank alone
        // too, as FSDP at world size 1: its gathers are copies).
        let sharded = global.cluster.sharding == Sharding::Full;
        let peers = WorkerPeers {
            actor: sharded.then(&mut collective),
            rollout: check_group(global, rank, rollout_group)?,
        };
        let mut run = Run::new(local, &dir, &pool, model, val, metrics, total, peers)?;
        join_ranks(&mut run, global, collective)?;
        let batches = Batches::of_run(train, global)?;
        Ok(Rank {
            run,
            global,
            train,
            batches,
            // Set from the checkpoint by `load`.
            gen_batches: resume_from.unwrap_or(0),
            next_step: resume_from.unwrap_or(0),
            rank,
            world,
            out: out.to_owned(),
            dir,
            timeline,
        })
    }

    /// Makes `path` this rank's stop file: while it exists, a step still
    /// drawing generation batches (dynamic sampling) stops with an error
    /// saying so, on every rank at once. The controller writes it on
    /// Ctrl-C; a worker busy with a step cannot be called.
    pub fn set_stop_file(&mut self, path: PathBuf) {
        self.run.stop_file = Some(path);
    }

    /// The run's total steps (every rank computes the same).
    pub fn total_steps(&self) -> usize {
        self.global.total_steps(self.train.len())
    }

    /// Step `step` (0-based) on this rank's prompts of the global batch;
    /// the update is joint with the other ranks. The metrics are this
    /// rank's, except the actor's (loss, clip fraction, entropy, grad norm),
    /// which are the global batch's already.
    pub fn step(&mut self, step: usize) -> Result<StepMetrics> {
        let (next, total) = (self.next_step, self.total_steps());
        if step != next || step >= total {
            let why = match step >= total {
                true => format!(
                    "the run has {total} steps (0 to {})",
                    total.saturating_sub(1)
                ),
                false => format!(
                    "steps run in order, and the next one is {next} (0-based; a resumed run \
                     starts at its checkpoint's step)"
                ),
            };
            return Err(Error::Phase {
                op: "run the step",
                state: format!("step {step}: {why}"),
            });
        }
        let at_start = self.gen_batches;
        let (batches, next) = (&self.batches, &mut self.gen_batches);
        let (rank, world) = (self.rank, self.world);
        let tp = self.global.rollout.tensor_model_parallel_size;
        let mut draw = || {
            let global = batches.batch(*next);
            *next = next.saturating_add(1);
            let len = global.prompts.len();
            let mine = shard(len, rank, world);
            // The tensor-parallel group's ranks are consecutive, their
            // shares too: the group generates their union.
            let group = (tp > 1).then(|| {
                let first = rank / tp * tp;
                let span = shard(len, first, world).start..shard(len, first + tp - 1, world).end;
                (
                    global.prompts[span.clone()].to_vec(),
                    mine.start - span.start,
                )
            });
            Batch {
                step: global.step,
                epoch: global.epoch,
                prompts: global.prompts[mine].to_vec(),
                group,
            }
        };
        let m = match self.run.step(step, &mut draw) {
            // Cut short by the stop request (dynamic sampling still
            // drawing): nothing of it trained, and the worker is back in
            // the training phase (`Run::step`). The rank's next batch goes
            // back to the step's first too, so that a checkpoint of the
            // last finished step resumes by drawing this step's batches
            // again, as `colo train` on one device does.
            Err(e @ Error::StoppedMidStep(_)) => {
                self.gen_batches = at_start;
                return Err(e);
            }
            r => r.map_err(|e| e.explained_by(self.run.worker.pool()))?,
        };
        self.run.metrics.step(&m)?;
        self.timeline.append_new(self.run.worker.pool())?;
        self.next_step = step + 1;
        Ok(m)
    }

    /// Greedy evaluation of this rank's share of the held-out prompts, as
    /// tallies the controller adds up (`EvalRecord::of_parts`).
    pub fn evaluate(&mut self) -> Result<EvalTallies> {
        if self.run.val.prompts.is_empty() {
            return Ok(EvalTallies::default());
        }
        let result = self.run.greedy_eval()?;
        // A tensor-parallel group's ranks evaluated the same prompts
        // together: the first of them reports them.
        if !(self.rank).is_multiple_of(self.global.rollout.tensor_model_parallel_size.max(1)) {
            return Ok(EvalTallies::default());
        }
        self.run.dump_eval(self.next_step, &result)?;
        Ok(EvalTallies::from(&result))
    }

    /// Writes `out/checkpoints/step-N`. Every rank calls it (a sharded
    /// trainer's weights are gathered from all of them); rank 0 writes,
    /// the others return once they have taken part.
    pub fn save(&self, step: usize) -> Result<()> {
        if self.rank != 0 && !self.run.worker.actor("save")?.is_sharded() {
            return Ok(());
        }
        let data = checkpoints::DataState {
            gen_batches: self.gen_batches,
            gen_batch_size: self.global.batch.gen_batch_prompts,
        };
        self.run.save(&self.out.join(checkpoints::DIR), step, &data)
    }

    /// Loads `out/checkpoints/step-N` (every rank); the next step is `N`.
    pub fn load(&mut self, step: usize) -> Result<()> {
        let dir = checkpoints::step_dir(&self.out.join(checkpoints::DIR), step);
        let critic = self.run.worker.has_critic();
        if let Some(why) = checkpoints::incomplete(&dir, step, critic) {
            return Err(Error::Phase {
                op: "load the checkpoint",
                state: format!("{}: {why}", dir.display()),
            });
        }
        let dynamic = self.global.algorithm.filter_groups.enable;
        let batch_size = self.global.batch.gen_batch_prompts;
        let (at, note) = checkpoints::DataState::resume(&dir, step, batch_size, dynamic)?;
        if let (Some(note), 0) = (note, self.rank) {
            crate::progress::say(&note);
        }
        self.run.worker.load_checkpoint(&dir)?;
        (self.next_step, self.gen_batches) = (step, at);
        Ok(())
    }

    /// A digest of the actor's weights, bit for bit: equal on every rank
    /// while the ranks agree. Read a tensor at a time (a sharded actor's a
    /// unit at a time, gathered: every rank must call it), so it never
    /// holds a second copy of the model.
    pub fn weights_digest(&self) -> Result<u64> {
        const OP: &str = "digest the weights";
        self.expect_train(OP)?;
        let mut h = std::hash::DefaultHasher::new();
        let actor = self.run.worker.actor(OP)?;
        colo_train::TrainEngine::visit_parameters(actor, &mut |params| {
            for (name, t) in params {
                h.write(name.as_bytes());
                let values =
                    Vec::<f32>::try_from(&t.f_to_kind(tch::Kind::Float)?.f_flatten(0, -1)?)?;
                for x in values {
                    h.write_u32(x.to_bits());
                }
            }
            Ok(())
        })?;
        Ok(h.finish())
    }

    /// The run's schedule from the config: (total steps, `save_freq`,
    /// `test_freq`, `val_before_train`).
    pub fn schedule(&self) -> (usize, Option<usize>, Option<usize>, bool) {
        let t = &self.global.trainer;
        (
            self.total_steps(),
            t.save_every(),
            t.test_every(),
            t.val_before_train,
        )
    }

    /// The device pool (memory statistics and timeline).
    pub fn pool(&self) -> &Arc<colo_mem::Pool> {
        self.run.worker.pool()
    }

    /// One device's capacity, as the pool enforces it.
    pub fn capacity(&self) -> u64 {
        self.pool().capacity()
    }

    /// Writes the rest of this rank's timeline and its pictures into its
    /// directory.
    pub fn finish(&mut self) -> Result<PathBuf> {
        draw(&self.dir, self.run.worker.pool(), &mut self.timeline)?;
        Ok(self.dir.clone())
    }
}

/// Refuses a rank outside `0..world` (and a world of none), and an empty
/// run directory.
fn check_rank(out: &Path, rank: usize, world: usize) -> Result<()> {
    if rank >= world {
        return Err(Error::Cluster(format!(
            "rank {rank} of a group of {world} workers: ranks count from 0 and stay below the \
             number of workers (world {world}{})",
            if world == 0 {
                ", which must be at least 1"
            } else {
                ""
            }
        )));
    }
    if out.as_os_str().is_empty() {
        return Err(Error::Cluster(
            "the run directory is empty; name one (the directory every rank shares)".into(),
        ));
    }
    Ok(())
}

/// The run's config from the checkpoint of `resume_from` (its dtype for
/// `auto`), refused when that checkpoint is not complete; `config` itself
/// from scratch.
fn resumed_config(config: Config, out: &Path, resume_from: Option<usize>) -> Result<Config> {
    let Some(step) = resume_from else {
        return Ok(config);
    };
    let saved = checkpoints::step_dir(&out.join(checkpoints::DIR), step);
    if let Some(why) = checkpoints::incomplete(&saved, step, crate::setup::uses_critic(&config)) {
        return Err(Error::Resume(format!(
            "no complete checkpoint of step {step} to resume from: {}: {why}",
            saved.display()
        )));
    }
    // (The controller says its note: `resume_notes`.)
    Ok(checkpoints::resume_dtype(&config, &saved)?.0)
}

/// This rank's config ([`rank_config`]), which dumps its share of the
/// generations into a directory of its own (`…/rank-R`), in the run
/// directory when the path is relative.
fn local_config(config: &Config, out: &Path, rank: usize, world: usize) -> Result<Config> {
    let mut local = rank_config(config, world)?;
    let t = &mut local.trainer;
    (t.rollout_data_dir, t.validation_data_dir) = config.trainer.dumps_in(out);
    for d in [&mut t.rollout_data_dir, &mut t.validation_data_dir]
        .into_iter()
        .flatten()
    {
        *d = d.join(format!("rank-{rank}"));
    }
    Ok(local)
}

/// Readies `out/checkpoints` (what it says of leftovers is said) and
/// records the configuration as `asked`.
fn ready_run_dir(config: &Config, asked: &Config, out: &Path) -> Result<()> {
    let ckpts = out.join(checkpoints::DIR);
    for note in checkpoints::prepare_dir(&ckpts, crate::setup::uses_critic(config))? {
        crate::progress::say(&note);
    }
    crate::run_config::write(out, asked)
}

/// The model (its directory and tokenizer), the training data, and this
/// rank's share of the held-out prompts. The built-in job's checkpoint and
/// data are written out by each rank into its own directory `dir`: ranks
/// start at once, and one must not read what another is writing.
fn rank_data(
    global: &Config,
    dir: &Path,
    rank: usize,
    world: usize,
) -> Result<((PathBuf, Tokenizer), Dataset, Dataset)> {
    let (model_dir, tokenizer) = open_model(global, &dir.join("base"))?;
    let (train, val) = load_data(global, dir, &tokenizer)?;
    // A tensor-parallel group evaluates one share together.
    let tp = global.rollout.tensor_model_parallel_size.max(1);
    let val = Dataset {
        prompts: val.prompts[shard(val.len(), rank / tp, world / tp)].to_vec(),
        ..Dataset::default()
    };
    Ok(((model_dir, tokenizer), train, val))
}

/// This rank's `metrics.jsonl` and `timeline.jsonl` in `dir`: new from
/// scratch, cut back to and appended after the step of `resume_from`.
fn rank_records(dir: &Path, resume_from: Option<usize>) -> Result<(MetricsWriter, TimelineWriter)> {
    let records = dir.join("metrics.jsonl");
    let timeline_path = dir.join("timeline.jsonl");
    Ok(match resume_from {
        None => (
            MetricsWriter::create(&records)?,
            TimelineWriter::create(&timeline_path)?,
        ),
        Some(step) => {
            crate::metrics::truncate_after(&records, step)?;
            (
                MetricsWriter::append(&records)?,
                TimelineWriter::resume(&timeline_path, step)?,
            )
        }
    })
}

/// Joins `run`'s trainers to the other ranks: the actor's collective, the
/// critic's for PPO with GAE, and with dynamic sampling the peers a step
/// asks whether every rank has its groups.
/// This rank's tensor-parallel group, checked against the config: given
/// exactly when `rollout.tensor_model_parallel_size` > 1, of that size,
/// this rank at its place in it.
fn check_group(
    config: &Config,
    rank: usize,
    group: Option<Box<dyn TensorParallel>>,
) -> Result<Option<Box<dyn TensorParallel>>> {
    let tp = config.rollout.tensor_model_parallel_size;
    let found = group.as_ref().map(|g| (g.world_size(), g.rank()));
    match found {
        None if tp <= 1 => Ok(None),
        Some((size, r)) if tp > 1 && size == tp && r == rank % tp => Ok(group),
        _ => Err(Error::Cluster(format!(
            "rank {rank}: rollout.tensor_model_parallel_size = {tp}, but the worker was given \
             {}",
            match found {
                Some((size, r)) => format!("rank {r} of a tensor-parallel group of {size}"),
                None => "no tensor-parallel group".into(),
            }
        ))),
    }
}

fn join_ranks(
    run: &mut Run,
    global: &Config,
    mut collective: impl FnMut() -> Box<dyn Collective>,
) -> Result<()> {
    run.worker.set_collectives(&mut collective)?;
    if global.algorithm.filter_groups.enable {
        run.peers = Some(collective());
    }
    Ok(())
}

/// Draws `out/memory_workers.{svg,png}`: every worker's resident bytes over
/// time, one line each, from the `timeline.jsonl` in each of `dirs`
/// (the directories [`Rank::finish`] returned, in rank order).
pub fn draw_workers(out: &Path, dirs: &[PathBuf], capacity: Option<u64>) -> Result<()> {
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    let workers = dirs
        .iter()
        .enumerate()
        .map(|(rank, d)| {
            let events = colo_mem::read_timeline(&d.join("timeline.jsonl"))?;
            Ok((format!("worker {rank}"), events))
        })
        .collect::<Result<Vec<_>>>()?;
    crate::plot::workers_timeline(&workers, capacity, "colo: device memory per worker")?
        .write(out, "memory_workers")
}

/// The newest complete checkpoint of the run in `out` (colo-rl's own
/// judgement, as `colo train --resume` uses it) and the newer directories
/// skipped, with why.
pub fn latest_checkpoint(config: &Config, out: &Path) -> Result<checkpoints::Found> {
    checkpoints::latest_complete(
        &out.join(checkpoints::DIR),
        crate::setup::uses_critic(config),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_takes_its_share_of_every_batch() {
        let global = Config::builtin(); // 32 prompts × 8, mini-batches of 16
        let local = rank_config(&global, 4).unwrap();
        let b = local.batch;
        assert_eq!(
            (b.prompts_per_step, b.samples_per_step, b.gen_batch_prompts),
            (8, 64, 8)
        );
        assert_eq!((b.mini_batch_prompts, b.mini_batch_samples), (4, 32));
        // Dynamic sampling's generation batches are split too.
        let mut dynamic = global.clone();
        dynamic.algorithm.filter_groups.enable = true;
        dynamic.batch.gen_batch_prompts = 64;
        assert_eq!(
            rank_config(&dynamic, 4).unwrap().batch.gen_batch_prompts,
            16
        );
        dynamic.batch.gen_batch_prompts = 66;
        let e = rank_config(&dynamic, 4).unwrap_err().to_string();
        assert!(e.contains("data.gen_batch_size = 66"), "{e}");
        let e = rank_config(&global, 3).unwrap_err().to_string();
        assert!(e.contains("data.train_batch_size = 32"), "{e}");
        assert_eq!([shard(10, 0, 3), shard(10, 2, 3)], [0..4, 7..10]);
    }
}

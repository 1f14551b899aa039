//! The hybrid worker: actor (training engine), rollout engine and reference
//! model on one device, and the memory transitions between training and
//! generation.
//!
//! The worker is always in one of two phases. [`HybridWorker::to_rollout`]
//! and [`HybridWorker::to_train`] switch between them; every change of
//! what is resident is an explicit call on the memory layer, under a phase
//! label that the pool's timeline records. The colocation mode picks the
//! order (the seeds' story, each mode a step further):
//!
//! | mode | train → rollout | rollout → train |
//! |---|---|---|
//! | `naive` | sync weights | — |
//! | `restart` | write the actor's safetensors, offload it, build a new engine from disk | drop the engine, reload the actor |
//! | `sleep` | offload optimizer/grads, wake weights **and** KV cache, sync, offload params | release KV cache and weights, reload |
//! | `staged` | offload optimizer/grads, wake weights, sync, offload params, **then** wake the KV cache | release KV cache and weights, reload |
//!
//! `staged` is SGLang's multi-stage awake: the trainer's copy of the
//! weights is gone before the KV cache comes back, so the peak is lower by
//! the trainer's weight bytes. Offloads follow the config's
//! `offload_train_param / grad / optimizer` (MindSpeed-RL's switches).
//!
//! ## The engines behind their traits
//!
//! `HybridWorker<T: TrainEngine = ColoTrainer, R: RolloutEngine = Engine>`:
//! the worker drives its engines through colo-train's [`TrainEngine`]
//! (scores, values, updates, offload and reload, the weights by name,
//! checkpoints, the model written for a rollout engine) and colo-rollout's
//! [`RolloutEngine`] (generate, release and resume, weight updates), so the
//! choreography and the phase checks run on fake engines in the unit tests,
//! and a sharded or LoRA engine that implements the traits slots in.
//! Generic rather than concrete (with the rollout trait deleted) because
//! all the choreography needs of its engines fits the traits once the
//! training one says how to write a checkpoint with the caller's files and
//! the model a rollout engine is built from
//! ([`TrainEngine::save_checkpoint_with`], [`TrainEngine::save_model`]). What
//! belongs to colo's own engines stays with [`HybridWorker::new`], which
//! builds them from a checkpoint: the CUDA graphs captured at start, and
//! `restart` mode's engine built from the actor's weights on disk (an
//! [`EngineBuilder`]). [`HybridWorker::from_engines`] takes engines built
//! elsewhere. The defaults keep the RL step and the harness on the
//! concrete engines, where they also use what only those have (an
//! evaluation on `&mut Engine`, the data-parallel ranks' collectives and
//! raw tensors).
//!
//! ## Every engine call checks the phase
//!
//! The fields are private: the step and the harness reach the engines only
//! through the worker's methods, and each one refuses a call in the wrong
//! phase with [`Error::Phase`] naming the call and the phase it needs
//! (training calls — [`HybridWorker::score`], [`HybridWorker::values`],
//! [`HybridWorker::update_policy`], [`HybridWorker::update_critic`],
//! [`HybridWorker::ref_log_probs`], checkpoints, [`HybridWorker::actor`] for
//! the rest — need [`Phase::Train`]; [`HybridWorker::generate`] and
//! [`HybridWorker::engine`] need [`Phase::Rollout`]). A call refused never
//! reaches the engine, whose memory may be offloaded or asleep.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use colo_mem::{tags, Pool};
use colo_rollout::{Engine, EngineConfig, Request, RequestOutput, RolloutEngine, TensorParallel};
use colo_train::{
    Collective, ColoTrainer, CriticBatch, CriticLossConfig, CriticMetrics, LossConfig, Offload,
    PolicyBatch, PolicyMetrics, Scores, SeqBatch, TrainEngine,
};
use tch::{Device, Kind, Tensor};

use crate::config::{Colocation, MemoryConfig, OffloadPolicy};
use crate::reference::Reference;
use crate::{Error, Result};

/// Which engine holds the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Train,
    Rollout,
}

impl Phase {
    /// The switch that enters this phase.
    fn switch(self) -> &'static str {
        match self {
            Phase::Train => "to_train",
            Phase::Rollout => "to_rollout",
        }
    }
}

impl std::fmt::Display for Phase {
    /// "training" or "rollout".
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Phase::Train => "training",
            Phase::Rollout => "rollout",
        })
    }
}

/// Seconds spent in one switch.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SwitchTiming {
    /// The whole switch.
    pub total_s: f64,
    /// Of which, the trainer → rollout weight sync (or the disk round trip
    /// in `restart` mode).
    pub sync_s: f64,
    /// Bytes a sharded actor's all-gathers sent and received during a
    /// switch to rollout (the weight sync's, or `restart` mode's save):
    /// the reshard. `None` for an actor that gathers nothing.
    pub reshard: Option<colo_train::Traffic>,
}

/// The peers a worker's engines compute with, when its run spans workers.
#[derive(Default)]
pub struct WorkerPeers {
    /// A sharded actor's (`cluster.sharding = "full"`): the actor keeps
    /// its share of the training state only (colo-train's `sharding`).
    pub actor: Option<Box<dyn Collective>>,
    /// A tensor-parallel rollout engine's group
    /// (`rollout.tensor_model_parallel_size`): the engine keeps its slice
    /// of the weights and KV heads (colo-rollout's `tensor_parallel`).
    pub rollout: Option<Box<dyn TensorParallel>>,
}

/// What a worker is built from.
#[derive(Debug, Clone)]
pub struct WorkerSpec {
    /// The Hugging Face checkpoint that actor, critic, reference and rollout
    /// engine start from.
    pub model_dir: PathBuf,
    pub actor: colo_train::TrainerConfig,
    /// A critic (same checkpoint with a value head), for GAE.
    pub critic: Option<colo_train::TrainerConfig>,
    pub engine: EngineConfig,
    pub memory: MemoryConfig,
    /// Whether to load a reference model (for a KL term).
    pub reference: bool,
    /// Where `restart` mode writes the actor's weights each step.
    pub scratch: PathBuf,
}

/// Builds a rollout engine from a Hugging Face directory: `restart` mode's
/// engine, from the actor's weights written to the scratch directory
/// ([`TrainEngine::save_model`]).
pub type EngineBuilder<R> = Box<dyn Fn(&Path) -> Result<R> + Send>;

/// The engines of a worker besides the rollout engine, built
/// ([`HybridWorker::from_engines`]).
pub struct Engines<T, R> {
    pub actor: T,
    /// A value model for GAE, in the actor's tags.
    pub critic: Option<T>,
    /// The reference model, resident or offloaded.
    pub reference: Option<Reference>,
    /// `restart` mode's rollout engine, from the actor's weights on disk.
    pub build_rollout: EngineBuilder<R>,
}

/// The actor, the critic, the reference and the rollout engine on one
/// device, in one [`Phase`] at a time (the module documentation).
pub struct HybridWorker<T: TrainEngine = ColoTrainer, R: RolloutEngine = Engine> {
    pool: Arc<Pool>,
    actor: T,
    /// A value model for GAE: the same checkpoint with a value head. It
    /// lives in the actor's tags (`train_params`, `train_grads`,
    /// `optimizer`), so the actor's offloads and reloads move it too.
    critic: Option<T>,
    /// `None` in `restart` mode while training.
    rollout: Option<R>,
    reference: Option<Reference>,
    /// `restart` mode builds the rollout engine with it each step.
    build_rollout: EngineBuilder<R>,
    mode: Colocation,
    /// What the actor may give up during generation (the `offload_*`
    /// flags).
    offload: Offload,
    /// What the last train → rollout switch gave up: `to_train` brings
    /// back exactly that.
    offloaded: Offload,
    policy: OffloadPolicy,
    offload_ref: bool,
    /// Padded tokens (rows × length) of this step's batch, from the
    /// reference's pass.
    step_tokens: Option<u64>,
    /// The largest step so far, for [`HybridWorker::room_for_the_reference`].
    largest: Option<StepSize>,
    /// The rollout engine's weights stayed resident through the training
    /// phase under way or last ended ([`HybridWorker::to_train_for_update`]).
    weights_kept: bool,
    /// `restart` mode writes the actor here each step.
    scratch: PathBuf,
    phase: Phase,
}

/// The most any completed step held: its padded tokens and its allocated
/// peak without the reference (each the maximum over the steps).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
struct StepSize {
    tokens: u64,
    peak: u64,
}

/// What the memory choreography remembers across steps, saved in each
/// checkpoint (`worker_state.json`) so that a resumed run gives up and
/// keeps what the uninterrupted one would have.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
struct MemoryState {
    /// The largest step so far, the one just ended included.
    largest: Option<StepSize>,
    /// The reference stayed resident after the last pass.
    reference_kept: bool,
    /// The rollout engine's weights stayed resident through the last update
    /// (absent in checkpoints written before it existed: false).
    #[serde(default)]
    weights_kept: bool,
}

/// The file of [`MemoryState`] in a checkpoint (absent in checkpoints
/// written before it existed: the state starts empty then).
pub const WORKER_STATE_FILE: &str = "worker_state.json";

/// What one train → rollout switch gives up ([`HybridWorker::switch_plan`]).
#[derive(Debug, Clone, Copy)]
struct SwitchPlan {
    /// The training passes' cached blocks.
    cache: bool,
    /// The reference's weights, when the last pass kept them.
    reference: bool,
    actor: Offload,
}

impl HybridWorker {
    /// Builds the rollout engine first (so a KV fraction is a share of the
    /// device after the serving weights, like SGLang's), then the actor, the
    /// critic and the reference from `spec.model_dir`, and leaves the worker
    /// in the training phase. Every model runs in the actor's kind on its
    /// device: a bf16 actor generates in bf16 (the sampling in float32), as
    /// verl's rollout runs in the actor's `dtype`. The process-wide state
    /// its CPU passes rely on (one libtorch intra-op thread) is set by the
    /// program, once: [`crate::process::init`].
    ///
    /// `peers`: the groups of a run that spans workers (none: a whole
    /// actor and a whole engine).
    pub fn new(pool: Arc<Pool>, spec: &WorkerSpec, peers: WorkerPeers) -> Result<Self> {
        let (model_dir, memory) = (spec.model_dir.as_path(), &spec.memory);
        pool.set_phase("init_rollout");
        let (kind, device) = (spec.actor.kind, spec.actor.device);
        let build_rollout = engine_builder(&pool, &spec.engine, kind, device);
        let mut rollout = match peers.rollout {
            Some(group) => Engine::from_dir_parallel(
                model_dir,
                kind,
                device,
                Arc::clone(&pool),
                &spec.engine,
                group,
            )?,
            None => build_rollout(model_dir)?,
        };
        // On CUDA, the decode step's graphs for a step's samples at full
        // length, captured now as vLLM and SGLang capture theirs at start
        // (their memory sleeps and wakes with the KV cache); none on the
        // CPU. A restarted engine captures as it goes.
        if let Some(len) = spec.engine.max_seq_len {
            if memory.colocation != Colocation::Restart {
                rollout.capture_cuda_graphs(spec.engine.validate()?.kv_seqs, len)?;
            }
        }
        // The engine sleeps before the trainer is built (and until the first
        // step wakes it), so start-up never holds both: a device that fits
        // the choreography fits its start too.
        let rollout = asleep(&pool, memory.colocation, rollout)?;
        pool.set_phase("init_trainer");
        let actor = match peers.actor {
            Some(peers) => {
                ColoTrainer::from_dir_sharded(Arc::clone(&pool), model_dir, &spec.actor, peers)?
            }
            None => ColoTrainer::from_dir(Arc::clone(&pool), model_dir, &spec.actor)?,
        };
        let critic = spec
            .critic
            .as_ref()
            .map(|c| ColoTrainer::from_dir(Arc::clone(&pool), model_dir, c))
            .transpose()?;
        let reference = match spec.reference {
            // A LoRA actor's frozen weights are the starting policy: no copy.
            true if actor.lora().is_some() => Some(Reference::base_of(
                Arc::clone(&pool),
                actor.base_model()?,
                spec.actor.cpu_threads,
            )),
            true => {
                let a = &spec.actor;
                let (kind, device, threads) = (a.kind, a.device, a.cpu_threads);
                let r = Reference::from_dir(Arc::clone(&pool), model_dir, kind, device, threads)?;
                if memory.offload_ref && memory.colocation != Colocation::Naive {
                    r.offload()?;
                }
                Some(r)
            }
            false => None,
        };
        pool.set_phase("train");
        let engines = Engines {
            actor,
            critic,
            reference,
            build_rollout,
        };
        Ok(Self::assemble(
            pool,
            memory,
            spec.scratch.clone(),
            rollout,
            engines,
        ))
    }
}

impl<R: RolloutEngine> HybridWorker<ColoTrainer, R> {
    /// Joins the actor and the critic to the other ranks, each with a
    /// collective of its own from `make`, the actor's first. No phase: it
    /// moves no memory.
    pub(crate) fn set_collectives(
        &mut self,
        mut make: impl FnMut() -> Box<dyn Collective>,
    ) -> Result<()> {
        // A sharded actor was built with its peers.
        if !self.actor.is_sharded() {
            self.actor.set_collective(Some(make()))?;
        }
        if let Some(c) = &mut self.critic {
            c.set_collective(Some(make()))?;
        }
        Ok(())
    }
}

/// The rollout engine of [`HybridWorker::new`], built from a directory in
/// `kind` on `device` (the actor's), in `pool`, with `cfg`: the first one
/// from the checkpoint, and `restart` mode's from the actor's weights.
fn engine_builder(
    pool: &Arc<Pool>,
    cfg: &EngineConfig,
    kind: Kind,
    device: Device,
) -> EngineBuilder<Engine> {
    let (pool, cfg) = (Arc::clone(pool), cfg.clone());
    Box::new(move |dir| {
        Ok(Engine::from_dir_on(
            dir,
            kind,
            device,
            Arc::clone(&pool),
            &cfg,
        )?)
    })
}

/// The rollout engine as a worker starts, in the training phase: awake in
/// `naive` mode, dropped in `restart` mode (the first switch builds one),
/// its KV cache and weights released in `sleep` and `staged` modes.
fn asleep<R: RolloutEngine>(pool: &Pool, mode: Colocation, mut rollout: R) -> Result<Option<R>> {
    match mode {
        Colocation::Naive => {}
        Colocation::Restart => {
            drop(rollout);
            pool.empty_cache();
            return Ok(None);
        }
        Colocation::Sleep | Colocation::Staged => {
            rollout.release(&[tags::KV_CACHE, tags::WEIGHTS])?;
        }
    }
    Ok(Some(rollout))
}

impl<T: TrainEngine, R: RolloutEngine> HybridWorker<T, R> {
    /// A worker on engines built elsewhere (another backend, fakes), in
    /// the training phase, all in `pool`: `rollout` awake, put to sleep
    /// (or dropped, `restart`) as [`HybridWorker::new`] leaves its own.
    pub fn from_engines(
        pool: Arc<Pool>,
        memory: &MemoryConfig,
        scratch: PathBuf,
        rollout: R,
        engines: Engines<T, R>,
    ) -> Result<Self> {
        let rollout = asleep(&pool, memory.colocation, rollout)?;
        pool.set_phase("train");
        Ok(Self::assemble(pool, memory, scratch, rollout, engines))
    }

    /// The worker of these engines, in the training phase.
    fn assemble(
        pool: Arc<Pool>,
        memory: &MemoryConfig,
        scratch: PathBuf,
        rollout: Option<R>,
        engines: Engines<T, R>,
    ) -> Self {
        HybridWorker {
            actor: engines.actor,
            critic: engines.critic,
            reference: engines.reference,
            build_rollout: engines.build_rollout,
            pool,
            rollout,
            mode: memory.colocation,
            // `naive` keeps everything resident, whatever the switches say.
            offload: match memory.colocation {
                Colocation::Naive => Offload::NONE,
                _ => Offload {
                    params: memory.offload_train_param,
                    grads: memory.offload_train_grad,
                    optimizer: memory.offload_train_optimizer,
                },
            },
            offload_ref: memory.offload_ref && memory.colocation != Colocation::Naive,
            step_tokens: None,
            largest: None,
            weights_kept: false,
            offloaded: Offload::NONE,
            policy: memory.offload_policy,
            scratch,
            phase: Phase::Train,
        }
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// Starts RL step `step` (1-based, for the timeline): folds the step
    /// before into the largest so far (what `as_needed` weighs the
    /// reference against) and starts a new peak window. A CUDA refusal
    /// libtorch recovered from (by emptying its caches) is forgotten: it
    /// is not the reason for a later error.
    pub fn begin_step(&mut self, step: u64) {
        self.largest = self.largest_with_this_step();
        self.step_tokens = None;
        self.pool.reset_peak();
        self.pool.set_step(step);
        let _ = self.pool.take_device_refusal();
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The one phase check: `op` needs `phase`.
    fn expect(&self, op: &'static str, phase: Phase) -> Result<()> {
        if self.phase != phase {
            return Err(Error::Phase {
                op,
                state: format!(
                    "it needs the {phase} phase and the worker is in the {} phase (switch with {} first)",
                    self.phase,
                    phase.switch()
                ),
            });
        }
        Ok(())
    }

    /// The actor (training phase), for what [`TrainEngine`] does not cover
    /// (a concrete engine's model, its raw tensors); `op` names the call.
    pub fn actor(&self, op: &'static str) -> Result<&T> {
        self.expect(op, Phase::Train)?;
        Ok(&self.actor)
    }

    /// [`HybridWorker::actor`], to change it.
    pub fn actor_mut(&mut self, op: &'static str) -> Result<&mut T> {
        self.expect(op, Phase::Train)?;
        Ok(&mut self.actor)
    }

    /// Whether the worker has a critic.
    pub fn has_critic(&self) -> bool {
        self.critic.is_some()
    }

    /// The actor's scores of `seqs`, no gradient (training phase): π_old.
    pub fn score(&mut self, seqs: &SeqBatch, with_entropy: bool) -> Result<Scores> {
        self.expect("score with the actor", Phase::Train)?;
        Ok(self.actor.score(seqs, with_entropy)?)
    }

    /// The critic's value of each token of `seqs`, no gradient (training
    /// phase); `None` without a critic.
    pub fn values(&mut self, seqs: &SeqBatch) -> Result<Option<Tensor>> {
        self.expect("score with the critic", Phase::Train)?;
        match &mut self.critic {
            Some(c) => Ok(Some(c.values(seqs)?)),
            None => Ok(None),
        }
    }

    /// One optimizer step of the actor on the policy loss (training phase).
    pub fn update_policy(
        &mut self,
        batch: &PolicyBatch,
        loss: &LossConfig,
    ) -> Result<PolicyMetrics> {
        self.expect("update the policy", Phase::Train)?;
        Ok(self.actor.update_policy(batch, loss)?)
    }

    /// One optimizer step of the critic on the value loss (training phase);
    /// an error without a critic.
    pub fn update_critic(
        &mut self,
        batch: &CriticBatch,
        loss: &CriticLossConfig,
    ) -> Result<CriticMetrics> {
        const OP: &str = "update the critic";
        self.expect(OP, Phase::Train)?;
        let Some(c) = &mut self.critic else {
            return Err(Error::Phase {
                op: OP,
                state: "the worker has no critic".into(),
            });
        };
        Ok(c.update_critic(batch, loss)?)
    }

    /// Train → rollout, in the order the colocation mode says.
    pub fn to_rollout(&mut self) -> Result<SwitchTiming> {
        self.expect("switch to rollout", Phase::Train)?;
        let start = Instant::now();
        let gathered = self.actor.gathered_traffic();
        let sync_s = match self.mode {
            Colocation::Naive => {
                self.pool.set_phase("sync_weights");
                self.sync()?
            }
            Colocation::Restart => {
                self.pool.set_phase("save_weights");
                let t = Instant::now();
                std::fs::create_dir_all(&self.scratch).map_err(|e| Error::io(&self.scratch, e))?;
                self.actor.save_model(&self.scratch)?;
                self.offloaded = self.offload;
                self.offload_actor(self.offload)?;
                // The engine about to be built is not in the pool yet, so
                // there is nothing to weigh the cache against: it goes.
                self.actor.release_cache();
                self.pool.set_phase("restart_engine");
                self.rollout = Some((self.build_rollout)(&self.scratch)?);
                t.elapsed().as_secs_f64()
            }
            Colocation::Sleep => {
                let params = self.give_up_before_the_wake()?;
                self.pool.set_phase("wake_all");
                let tags: &[&str] = match self.weights_kept {
                    true => &[tags::KV_CACHE],
                    false => &[tags::WEIGHTS, tags::KV_CACHE],
                };
                self.rollout_engine()?.resume(tags)?;
                self.pool.set_phase("sync_weights");
                let s = self.sync()?;
                self.free_trainer_weights(params)?;
                s
            }
            Colocation::Staged => {
                let params = self.give_up_before_the_wake()?;
                if !self.weights_kept {
                    self.pool.set_phase("wake_weights");
                    self.rollout_engine()?.resume(&[tags::WEIGHTS])?;
                }
                self.pool.set_phase("sync_weights");
                let s = self.sync()?;
                self.free_trainer_weights(params)?;
                self.pool.set_phase("wake_kv_cache");
                self.rollout_engine()?.resume(&[tags::KV_CACHE])?;
                s
            }
        };
        self.pool.set_phase("generate");
        self.phase = Phase::Rollout;
        let reshard =
            (self.actor.gathered_traffic().zip(gathered)).map(|(now, was)| now.since(was));
        Ok(SwitchTiming {
            total_s: start.elapsed().as_secs_f64(),
            sync_s,
            reshard,
        })
    }

    /// Rollout → train: the engine's memory goes, the actor's comes back.
    pub fn to_train(&mut self) -> Result<SwitchTiming> {
        self.enter_training(false)
    }

    /// Rollout → train before an update of `tokens` padded tokens. As
    /// [`HybridWorker::to_train`], except that with `offload_policy =
    /// "as_needed"` the rollout engine's weights stay resident (only the
    /// KV cache goes to sleep) when a step at least as large has run and
    /// its allocated peak plus the weights fits the capacity: the next
    /// switch to rollout then neither wakes nor populates them, and the
    /// weight sync writes into resident pages. On a tight device they go,
    /// as before.
    pub fn to_train_for_update(&mut self, tokens: u64) -> Result<SwitchTiming> {
        self.expect("switch to training", Phase::Rollout)?;
        self.step_tokens = Some(self.step_tokens.unwrap_or(0).max(tokens));
        let keep = self.room_for_the_engine_weights(tokens);
        self.enter_training(keep)
    }

    /// Rollout → train, the engine's weights kept resident or not.
    fn enter_training(&mut self, keep_weights: bool) -> Result<SwitchTiming> {
        self.expect("switch to training", Phase::Rollout)?;
        let start = Instant::now();
        match self.mode {
            Colocation::Naive => {}
            Colocation::Restart => {
                self.pool.set_phase("drop_engine");
                self.rollout = None;
                self.pool.empty_cache();
                self.reload_actor()?;
            }
            Colocation::Sleep | Colocation::Staged => {
                self.pool.set_phase("sleep_engine");
                let tags: &[&str] = match keep_weights {
                    true => &[tags::KV_CACHE],
                    false => &[tags::KV_CACHE, tags::WEIGHTS],
                };
                self.rollout_engine()?.release(tags)?;
                self.weights_kept = keep_weights;
                self.reload_actor()?;
            }
        }
        self.pool.set_phase("train");
        self.phase = Phase::Train;
        Ok(SwitchTiming {
            total_s: start.elapsed().as_secs_f64(),
            sync_s: 0.0,
            reshard: None,
        })
    }

    /// Generates (rollout phase only).
    pub fn generate(
        &mut self,
        requests: Vec<Request>,
    ) -> Result<Vec<colo_rollout::Result<RequestOutput>>> {
        self.expect("generate", Phase::Rollout)?;
        Ok(self.rollout_engine()?.generate(requests)?)
    }

    /// The rollout engine (rollout phase), for what [`RolloutEngine`] does
    /// not cover (an evaluation on a concrete engine, its model); `op`
    /// names the call.
    pub fn engine(&mut self, op: &'static str) -> Result<&mut R> {
        self.expect(op, Phase::Rollout)?;
        self.rollout_engine()
    }

    /// The rollout engine, if one exists right now (not in `restart` mode
    /// during training), in either phase: the switches wake it and put it
    /// to sleep.
    fn rollout_engine(&mut self) -> Result<&mut R> {
        self.rollout.as_mut().ok_or(Error::Phase {
            op: "use the rollout engine",
            state: "it is not built (restart mode, training phase)".into(),
        })
    }

    /// Reference log-probabilities (training phase), reloading the
    /// reference's weights around the pass if `offload_ref`.
    ///
    /// `always` (and `restart` mode): they go after every pass. `as_needed`
    /// (sleep and staged): they stay through the update when a step at
    /// least as large (padded tokens) has run and its allocated peak plus
    /// them fits the capacity. They are live memory, which the pool cannot
    /// drop like a cache if the update needs more, so only a step no
    /// larger than one already measured keeps them (in RL responses grow);
    /// before that, and on a device without that room (the built-in job in
    /// f32), they go. Kept, they are the first thing after the training
    /// cache that the next switch gives up if the engine needs the room
    /// ([`HybridWorker::switch_plan`]). verl offloads its reference only
    /// when told; on a GPU each offload is two copies of the model a step.
    pub fn ref_log_probs(
        &mut self,
        seqs: &SeqBatch,
        micro: impl Into<colo_train::Split>,
    ) -> Result<Option<Tensor>> {
        self.expect("score with the reference", Phase::Train)?;
        let Some(r) = &self.reference else {
            return Ok(None);
        };
        let tokens = (seqs.batch_size() as u64).saturating_mul(seqs.seq_len() as u64);
        self.step_tokens = Some(self.step_tokens.unwrap_or(0).max(tokens));
        if self.offload_ref {
            self.pool.set_phase("ref_log_prob");
            if !self.reference_kept() {
                r.reload()?;
            }
        }
        let lp = r.score(seqs, micro)?;
        if self.offload_ref {
            if !self.room_for_the_reference(tokens) {
                r.offload()?;
            }
            self.pool.set_phase("train");
        }
        Ok(Some(lp))
    }

    /// Whether the reference's weights are resident although `offload_ref`
    /// lets them go: kept by `as_needed` after its last pass (a switch may
    /// give them up since). Derived from the pool, the one record of it.
    fn reference_kept(&self) -> bool {
        self.offload_ref
            && self.reference.is_some()
            && self.pool.tag_state(tags::REF) == Some(colo_mem::TagState::Active)
    }

    /// The largest step so far with the step under way (since the last
    /// `begin_step`) folded in, if it scored with the reference.
    fn largest_with_this_step(&self) -> Option<StepSize> {
        let Some(tokens) = self.step_tokens else {
            return self.largest;
        };
        let stats = self.pool.stats();
        let reference = stats
            .tag(tags::REF)
            .map_or(0, |t| t.resident_bytes + t.paused_bytes);
        let weights = stats.tag(tags::WEIGHTS).map_or(0, |t| t.resident_bytes);
        let peak = match self.reference_kept() {
            true => stats.peak_allocated_bytes.saturating_sub(reference),
            false => stats.peak_allocated_bytes,
        };
        // Kept through the update, the weights were in its peak: the
        // room checks add them back.
        let peak = match self.weights_kept {
            true => peak.saturating_sub(weights),
            false => peak,
        };
        Some(match self.largest {
            None => StepSize { tokens, peak },
            Some(l) => StepSize {
                tokens: l.tokens.max(tokens),
                peak: l.peak.max(peak),
            },
        })
    }

    /// Whether the reference may stay resident through the update of a
    /// batch of `tokens` padded tokens (see [`HybridWorker::ref_log_probs`]),
    /// beside the engine's weights if they stay too.
    fn room_for_the_reference(&self, tokens: u64) -> bool {
        let stats = self.pool.stats();
        let reference = stats.tag(tags::REF).map_or(0, |t| t.resident_bytes);
        let weights = match self.weights_kept {
            true => stats.tag(tags::WEIGHTS).map_or(0, |t| t.resident_bytes),
            false => 0,
        };
        self.room_beside_the_largest_step(tokens, reference + weights)
    }

    /// Whether the rollout engine's weights may stay resident through the
    /// update of a batch of `tokens` padded tokens (see
    /// [`HybridWorker::to_train_for_update`]), beside a kept reference.
    fn room_for_the_engine_weights(&self, tokens: u64) -> bool {
        let stats = self.pool.stats();
        let weights = (stats.tag(tags::WEIGHTS)).map_or(0, |t| t.resident_bytes + t.paused_bytes);
        let reference = match self.reference_kept() {
            true => stats.tag(tags::REF).map_or(0, |t| t.resident_bytes),
            false => 0,
        };
        self.room_beside_the_largest_step(tokens, weights + reference)
    }

    /// `as_needed`'s rule for keeping `bytes` resident through an update of
    /// `tokens` padded tokens: a sleep or staged worker, a measured step at
    /// least as large, and its allocated peak plus `bytes` within the
    /// capacity.
    fn room_beside_the_largest_step(&self, tokens: u64, bytes: u64) -> bool {
        let (Some(largest), OffloadPolicy::AsNeeded) = (self.largest, self.policy) else {
            return false;
        };
        if !matches!(self.mode, Colocation::Sleep | Colocation::Staged) || tokens > largest.tokens {
            return false;
        }
        largest.peak.saturating_add(bytes) <= self.pool.stats().capacity_bytes
    }

    /// Writes the checkpoint of RL step `step` into `dir` (training phase),
    /// atomically: the actor as a complete Hugging Face directory (the
    /// tokenizer files of `model_dir`, the starting model, copied in), and
    /// the critic, when there is one, in `dir/critic` inside the same
    /// atomic write. See [`crate::checkpoints`].
    pub fn save_checkpoint(
        &self,
        dir: &Path,
        step: usize,
        model_dir: &Path,
        data: &crate::checkpoints::DataState,
    ) -> Result<()> {
        self.expect("save a checkpoint", Phase::Train)?;
        let critic = self.critic.as_ref();
        let memory = MemoryState {
            largest: self.largest_with_this_step(),
            reference_kept: self.reference_kept(),
            weights_kept: self.weights_kept,
        };
        self.actor
            .save_checkpoint_with(dir, Some(step as u64), |tmp| -> Result<()> {
                crate::checkpoints::write_model_files(model_dir, tmp)?;
                let path = tmp.join(WORKER_STATE_FILE);
                let text = serde_json::to_string_pretty(&memory)?;
                std::fs::write(&path, text).map_err(|e| Error::io(&path, e))?;
                data.write(tmp)?;
                if let Some(c) = critic {
                    let cdir = tmp.join(crate::checkpoints::CRITIC_DIR);
                    c.save_checkpoint_with(&cdir, Some(step as u64), |_| Ok::<(), Error>(()))?;
                }
                Ok(())
            })
    }

    /// Restores the actor (and the critic) from a checkpoint written by
    /// [`HybridWorker::save_checkpoint`].
    pub fn load_checkpoint(&mut self, dir: &Path) -> Result<()> {
        self.expect("load a checkpoint", Phase::Train)?;
        self.actor.load_checkpoint(dir)?;
        if let Some(c) = &mut self.critic {
            c.load_checkpoint(&dir.join(crate::checkpoints::CRITIC_DIR))?;
        }
        let path = dir.join(WORKER_STATE_FILE);
        if path.is_file() {
            let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
            let memory: MemoryState = serde_json::from_str(&text)
                .map_err(|e| Error::Resume(format!("{}: {e}", path.display())))?;
            self.largest = memory.largest;
            self.step_tokens = None;
            // Resident again where the run that wrote it had it resident.
            if let (true, true, Some(r)) =
                (memory.reference_kept, self.offload_ref, &self.reference)
            {
                if !self.reference_kept() {
                    r.reload()?;
                }
            }
            if memory.weights_kept && !self.weights_kept {
                self.keep_engine_weights()?;
            }
        }
        Ok(())
    }

    /// The engine's weights awake through the training phase, as a run
    /// that kept them through its last update had them (a resumed run's
    /// start-up): the next switch syncs into them without a wake.
    fn keep_engine_weights(&mut self) -> Result<()> {
        if !matches!(self.mode, Colocation::Sleep | Colocation::Staged) {
            return Ok(());
        }
        self.pool.set_phase("wake_weights");
        self.rollout_engine()?.resume(&[tags::WEIGHTS])?;
        self.weights_kept = true;
        Ok(())
    }

    /// Copies the actor's parameters into the engine's weights, in place.
    fn sync(&mut self) -> Result<f64> {
        let t = Instant::now();
        let rollout = self.rollout.as_mut().ok_or(Error::Phase {
            op: "sync the weights",
            state: "the rollout engine is not built".into(),
        })?;
        // A sharded actor hands its units over one at a time, each
        // gathered for the copy; the first failure of the engine is kept.
        let mut failed = None;
        let visited = self.actor.visit_parameters(&mut |params| {
            rollout.update_weights(params).map(drop).map_err(|e| {
                let why = e.to_string();
                failed = Some(e);
                colo_train::Error::Unsupported {
                    what: "weight sync",
                    found: why,
                }
            })
        });
        if let Some(e) = failed {
            return Err(e.into());
        }
        visited?;
        Ok(t.elapsed().as_secs_f64())
    }

    fn offload_actor(&mut self, what: Offload) -> Result<()> {
        if what != Offload::NONE {
            self.actor.offload(what)?;
        }
        Ok(())
    }

    /// The first stages of a sleep or staged switch: what the switch gives
    /// up ([`HybridWorker::switch_plan`]) but the parameters, which the
    /// sync still reads; returns whether they go after it.
    fn give_up_before_the_wake(&mut self) -> Result<bool> {
        let plan = self.switch_plan();
        self.offloaded = plan.actor;
        if plan.cache {
            self.pool.set_phase("release_cache");
            self.actor.release_cache();
        }
        if let (true, Some(r)) = (plan.reference, &self.reference) {
            self.pool.set_phase("offload_ref");
            r.offload()?;
        }
        self.pool.set_phase("offload_optimizer");
        self.offload_actor(Offload {
            params: false,
            ..plan.actor
        })?;
        Ok(plan.actor.params)
    }

    fn free_trainer_weights(&mut self, params: bool) -> Result<()> {
        self.pool.set_phase("free_trainer_weights");
        self.offload_actor(Offload {
            params,
            ..Offload::NONE
        })
    }

    /// What a sleep or staged switch gives up, of what the `offload_*`
    /// flags allow.
    ///
    /// `always`: all of it. `as_needed`: the cheapest first — the cache
    /// (nothing to copy), a kept reference (one copy of the model), the
    /// optimizer state, the gradients (neither is
    /// read while generating), the parameters (they are read by the sync
    /// and go after it) — until every byte mapped
    /// now, less what goes, plus the engine's paused tags fits the
    /// capacity. The estimate is the whole engine awake beside what stays,
    /// so a staged switch may give up a little more than its stages need,
    /// never less. On a roomy device nothing goes, and nothing is copied
    /// out and back or faulted in again (the 3 M-parameter job's switches:
    /// 10% of a bf16 step → 2%); on a tight one (the built-in job's 72 MiB)
    /// all of it, as `always`.
    fn switch_plan(&self) -> SwitchPlan {
        let allowed = self.offload;
        let kept_ref = self.reference_kept();
        if self.policy == OffloadPolicy::Always {
            return SwitchPlan {
                cache: true,
                reference: kept_ref,
                actor: allowed,
            };
        }
        let stats = self.pool.stats();
        let tag = |t: &str| stats.tag(t);
        let engine: u64 = [tags::WEIGHTS, tags::KV_CACHE, tags::CUDA_GRAPH]
            .iter()
            .filter_map(|t| tag(t))
            .map(|t| t.paused_bytes)
            .sum();
        let held = |t: &str| tag(t).map_or(0, |s| s.resident_bytes - s.cached_bytes);
        let cached: u64 = stats.tags.iter().map(|t| t.cached_bytes).sum();
        let mut need = stats.resident_bytes.saturating_add(engine);
        let fits = |need: u64| need <= stats.capacity_bytes;
        let mut plan = SwitchPlan {
            cache: false,
            reference: false,
            actor: Offload::NONE,
        };
        let steps: [(bool, u64, &mut bool); 5] = [
            (true, cached, &mut plan.cache),
            (kept_ref, held(tags::REF), &mut plan.reference),
            (
                allowed.optimizer,
                held(tags::OPTIMIZER),
                &mut plan.actor.optimizer,
            ),
            (
                allowed.grads,
                held(tags::TRAIN_GRADS),
                &mut plan.actor.grads,
            ),
            (
                allowed.params,
                held(tags::TRAIN_PARAMS),
                &mut plan.actor.params,
            ),
        ];
        for (allowed, bytes, take) in steps {
            if fits(need) {
                break;
            }
            if allowed && bytes > 0 {
                *take = true;
                need -= bytes;
            }
        }
        plan
    }

    fn reload_actor(&mut self) -> Result<()> {
        let what = std::mem::replace(&mut self.offloaded, Offload::NONE);
        if what != Offload::NONE {
            self.pool.set_phase("reload_trainer");
            self.actor.reload(what)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! The worker on fake engines that record every call: a call in the
    //! wrong phase is refused by name and never reaches an engine, and
    //! the switches drive the engines through their traits.

    use std::sync::Mutex;

    use colo_mem::PoolConfig;
    use colo_rollout::WeightUpdate;
    use colo_train::SftMetrics;

    use super::*;
    use crate::checkpoints::DataState;
    use crate::config::Capacity;

    /// Every engine call, `role.method`, in order.
    type Calls = Arc<Mutex<Vec<String>>>;

    fn log(calls: &Calls, role: &str, method: &str) {
        calls.lock().unwrap().push(format!("{role}.{method}"));
    }

    fn zeros(seqs: &SeqBatch) -> Tensor {
        let shape = [seqs.batch_size() as i64, seqs.seq_len() as i64];
        Tensor::zeros(shape, (Kind::Float, Device::Cpu))
    }

    struct FakeTrainer {
        role: &'static str,
        calls: Calls,
    }

    impl FakeTrainer {
        fn log(&self, method: &str) {
            log(&self.calls, self.role, method);
        }
    }

    impl TrainEngine for FakeTrainer {
        fn score(&mut self, batch: &SeqBatch, _entropy: bool) -> colo_train::Result<Scores> {
            self.log("score");
            Ok(Scores {
                log_probs: zeros(batch),
                entropy: None,
            })
        }
        fn values(&mut self, batch: &SeqBatch) -> colo_train::Result<Tensor> {
            self.log("values");
            Ok(zeros(batch))
        }
        fn update_policy(
            &mut self,
            _: &PolicyBatch,
            _: &LossConfig,
        ) -> colo_train::Result<PolicyMetrics> {
            self.log("update_policy");
            Ok(PolicyMetrics::default())
        }
        fn update_critic(
            &mut self,
            _: &CriticBatch,
            _: &CriticLossConfig,
        ) -> colo_train::Result<CriticMetrics> {
            self.log("update_critic");
            Ok(CriticMetrics::default())
        }
        fn sft_step(&mut self, _: &SeqBatch) -> colo_train::Result<SftMetrics> {
            self.log("sft_step");
            Ok(SftMetrics::default())
        }
        fn offload(&mut self, _: Offload) -> colo_train::Result<()> {
            self.log("offload");
            Ok(())
        }
        fn reload(&mut self, _: Offload) -> colo_train::Result<()> {
            self.log("reload");
            Ok(())
        }
        fn release_cache(&mut self) -> u64 {
            self.log("release_cache");
            0
        }
        fn named_parameters(&self) -> Vec<(String, Tensor)> {
            self.log("named_parameters");
            Vec::new()
        }
        fn step(&self) -> u64 {
            0
        }
        fn save_checkpoint(&self, _: &Path) -> colo_train::Result<()> {
            self.log("save_checkpoint");
            Ok(())
        }
        fn save_checkpoint_with<E: From<colo_train::Error>>(
            &self,
            dir: &Path,
            _: Option<u64>,
            extra: impl FnOnce(&Path) -> std::result::Result<(), E>,
        ) -> std::result::Result<(), E> {
            self.log("save_checkpoint");
            extra(dir)
        }
        fn save_model(&self, _: &Path) -> colo_train::Result<()> {
            self.log("save_model");
            Ok(())
        }
        fn load_checkpoint(&mut self, _: &Path) -> colo_train::Result<()> {
            self.log("load_checkpoint");
            Ok(())
        }
    }

    struct FakeRollout {
        calls: Calls,
    }

    impl RolloutEngine for FakeRollout {
        fn generate(
            &mut self,
            requests: Vec<Request>,
        ) -> colo_rollout::Result<Vec<colo_rollout::Result<RequestOutput>>> {
            log(&self.calls, "rollout", "generate");
            Ok((requests.into_iter())
                .map(|_| {
                    Ok(RequestOutput {
                        id: 0,
                        completions: Vec::new(),
                    })
                })
                .collect())
        }
        fn release(&mut self, _: &[&str]) -> colo_rollout::Result<()> {
            log(&self.calls, "rollout", "release");
            Ok(())
        }
        fn resume(&mut self, _: &[&str]) -> colo_rollout::Result<()> {
            log(&self.calls, "rollout", "resume");
            Ok(())
        }
        fn update_weights(&mut self, _: &[(String, Tensor)]) -> colo_rollout::Result<WeightUpdate> {
            log(&self.calls, "rollout", "update_weights");
            Ok(WeightUpdate {
                tensors: 0,
                bytes: 0,
                buckets: 0,
            })
        }
    }

    fn scratch(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("colo-worker-fake-{}-{name}", std::process::id()))
    }

    /// A worker on fakes with an actor and a critic, every offload allowed.
    fn worker(
        mode: Colocation,
        name: &str,
        calls: &Calls,
    ) -> HybridWorker<FakeTrainer, FakeRollout> {
        let pool = Pool::host(PoolConfig {
            address_space: 1 << 30,
            ..PoolConfig::default()
        })
        .unwrap();
        let memory = MemoryConfig {
            capacity: Capacity::Auto,
            colocation: mode,
            offload_train_param: true,
            offload_train_grad: true,
            offload_train_optimizer: true,
            offload_ref: true,
            offload_policy: OffloadPolicy::Always,
        };
        let fake = |role| FakeTrainer {
            role,
            calls: Arc::clone(calls),
        };
        let built = Arc::clone(calls);
        let engines = Engines {
            actor: fake("actor"),
            critic: Some(fake("critic")),
            reference: None,
            build_rollout: Box::new(move |_| {
                log(&built, "rollout", "build");
                Ok(FakeRollout {
                    calls: Arc::clone(&built),
                })
            }),
        };
        let rollout = FakeRollout {
            calls: Arc::clone(calls),
        };
        HybridWorker::from_engines(pool, &memory, scratch(name), rollout, engines).unwrap()
    }

    fn seqs() -> SeqBatch {
        SeqBatch::from_prompt_response(&[(&[1, 2][..], &[3, 4][..])], 0).unwrap()
    }

    /// `err` is the phase error of call `op`, which needs `needs`.
    fn assert_refused(err: Option<Error>, op: &str, needs: Phase, is: Phase) {
        let err = err.unwrap_or_else(|| panic!("{op}: accepted in the {is} phase"));
        let text = err.to_string();
        match err {
            Error::Phase { op: named, state } => {
                assert_eq!(named, op);
                let needs =
                    format!("it needs the {needs} phase and the worker is in the {is} phase");
                assert!(state.starts_with(&needs), "{state}");
                assert!(
                    text.starts_with(&format!("hybrid worker: cannot {op}: ")),
                    "{text}"
                );
            }
            other => panic!("{op}: {other}"),
        }
    }

    #[test]
    fn a_training_call_in_the_rollout_phase_is_refused_by_name() {
        let calls = Calls::default();
        let mut w = worker(Colocation::Sleep, "train-calls", &calls);
        let seqs = seqs();
        let z = zeros(&seqs);
        let pb = PolicyBatch::new(seqs.clone(), &z, &z, None, None).unwrap();
        let cb = CriticBatch::new(seqs.clone(), &z, &z).unwrap();
        let (loss, critic_loss) = (LossConfig::default(), CriticLossConfig::default());
        w.to_rollout().unwrap();
        let before = calls.lock().unwrap().len();
        let data = DataState {
            gen_batches: 0,
            gen_batch_size: 1,
        };
        let nowhere = scratch("train-calls-nowhere");
        let refused = [
            ("score with the actor", w.score(&seqs, false).err()),
            ("score with the critic", w.values(&seqs).err()),
            ("update the policy", w.update_policy(&pb, &loss).err()),
            (
                "update the critic",
                w.update_critic(&cb, &critic_loss).err(),
            ),
            ("score with the reference", w.ref_log_probs(&seqs, 1).err()),
            ("read the weights", w.actor("read the weights").err()),
            ("take an SFT step", w.actor_mut("take an SFT step").err()),
            (
                "save a checkpoint",
                w.save_checkpoint(&nowhere, 1, &nowhere, &data).err(),
            ),
            ("load a checkpoint", w.load_checkpoint(&nowhere).err()),
            ("switch to rollout", w.to_rollout().err()),
        ];
        for (op, err) in refused {
            assert_refused(err, op, Phase::Train, Phase::Rollout);
        }
        assert_eq!(calls.lock().unwrap().len(), before, "no engine was called");
        assert!(!nowhere.exists());

        w.to_train().unwrap();
        calls.lock().unwrap().clear();
        w.score(&seqs, false).unwrap();
        assert!(w.values(&seqs).unwrap().is_some());
        w.update_policy(&pb, &loss).unwrap();
        w.update_critic(&cb, &critic_loss).unwrap();
        assert_eq!(
            *calls.lock().unwrap(),
            [
                "actor.score",
                "critic.values",
                "actor.update_policy",
                "critic.update_critic"
            ]
        );
    }

    #[test]
    fn a_generation_call_in_the_training_phase_is_refused_by_name() {
        let calls = Calls::default();
        let mut w = worker(Colocation::Naive, "generate", &calls);
        let request = || vec![Request::new(vec![1, 2], Default::default())];
        let refused = [
            ("generate", w.generate(request()).err()),
            ("evaluate", w.engine("evaluate").err()),
            ("switch to training", w.to_train().err()),
        ];
        for (op, err) in refused {
            assert_refused(err, op, Phase::Rollout, Phase::Train);
        }
        assert!(
            calls.lock().unwrap().is_empty(),
            "{:?}",
            calls.lock().unwrap()
        );

        w.to_rollout().unwrap();
        assert_eq!(w.generate(request()).unwrap().len(), 1);
        assert!(w.engine("evaluate").is_ok());
        assert_eq!(calls.lock().unwrap().last().unwrap(), "rollout.generate");
    }

    #[test]
    fn a_critic_update_without_a_critic_is_refused() {
        let calls = Calls::default();
        let mut w = worker(Colocation::Naive, "no-critic", &calls);
        w.critic = None;
        let seqs = seqs();
        let z = zeros(&seqs);
        let cb = CriticBatch::new(seqs.clone(), &z, &z).unwrap();
        assert!(!w.has_critic());
        assert!(w.values(&seqs).unwrap().is_none());
        let err = w.update_critic(&cb, &CriticLossConfig::default());
        assert!(
            matches!(&err, Err(Error::Phase { op: "update the critic", state }) if state == "the worker has no critic"),
            "{err:?}"
        );
        assert!(calls.lock().unwrap().is_empty());
    }

    /// The switches through the traits, in each mode's order (the module
    /// documentation's table).
    #[test]
    fn the_switches_drive_the_engines_in_the_modes_order() {
        let cases: [(Colocation, &[&str], &[&str]); 3] = [
            (
                Colocation::Sleep,
                &[
                    "actor.release_cache",
                    "actor.offload",
                    "rollout.resume",
                    "actor.named_parameters",
                    "rollout.update_weights",
                    "actor.offload",
                ],
                &["rollout.release", "actor.reload"],
            ),
            (
                Colocation::Staged,
                &[
                    "actor.release_cache",
                    "actor.offload",
                    "rollout.resume",
                    "actor.named_parameters",
                    "rollout.update_weights",
                    "actor.offload",
                    "rollout.resume",
                ],
                &["rollout.release", "actor.reload"],
            ),
            (
                Colocation::Restart,
                &[
                    "actor.save_model",
                    "actor.offload",
                    "actor.release_cache",
                    "rollout.build",
                ],
                &["actor.reload"],
            ),
        ];
        for (mode, to_rollout, to_train) in cases {
            let calls = Calls::default();
            let name = format!("{mode:?}");
            let mut w = worker(mode, &name, &calls);
            let started: &[&str] = match mode {
                Colocation::Sleep | Colocation::Staged => &["rollout.release"],
                _ => &[],
            };
            assert_eq!(*calls.lock().unwrap(), started, "{mode:?}: start");
            assert_eq!(w.rollout.is_some(), mode != Colocation::Restart);
            calls.lock().unwrap().clear();
            w.to_rollout().unwrap();
            assert_eq!(*calls.lock().unwrap(), to_rollout, "{mode:?}: to_rollout");
            calls.lock().unwrap().clear();
            w.to_train().unwrap();
            assert_eq!(*calls.lock().unwrap(), to_train, "{mode:?}: to_train");
            assert_eq!(w.rollout.is_some(), mode != Colocation::Restart);
            let _ = std::fs::remove_dir_all(scratch(&name));
        }
    }
}

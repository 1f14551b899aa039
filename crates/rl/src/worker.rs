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

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use colo_mem::{tags, Pool};
use colo_rollout::{Engine, EngineConfig, Request, RequestOutput};
use colo_train::{ColoTrainer, Offload, TrainEngine};

use crate::config::{Colocation, MemoryConfig, OffloadPolicy};
use crate::reference::Reference;
use crate::{Error, Result};

/// Which engine holds the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Train,
    Rollout,
}

/// Seconds spent in one switch.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SwitchTiming {
    /// The whole switch.
    pub total_s: f64,
    /// Of which, the trainer → rollout weight sync (or the disk round trip
    /// in `restart` mode).
    pub sync_s: f64,
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

pub struct HybridWorker {
    pool: Arc<Pool>,
    pub actor: ColoTrainer,
    /// A value model for GAE: the same checkpoint with a value head. It
    /// lives in the actor's tags (`train_params`, `train_grads`,
    /// `optimizer`), so the actor's offloads and reloads move it too.
    pub critic: Option<ColoTrainer>,
    /// `None` in `restart` mode while training.
    rollout: Option<Engine>,
    pub reference: Option<Reference>,
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
    engine_cfg: EngineConfig,
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
    pub fn new(pool: Arc<Pool>, spec: &WorkerSpec) -> Result<Self> {
        let (model_dir, memory) = (spec.model_dir.as_path(), &spec.memory);
        pool.set_phase("init_rollout");
        let (kind, device) = (spec.actor.kind, spec.actor.device);
        let mut rollout = Some(Engine::from_dir_on(
            model_dir,
            kind,
            device,
            Arc::clone(&pool),
            &spec.engine,
        )?);
        // On CUDA, the decode step's graphs for a step's samples at full
        // length, captured now as vLLM and SGLang capture theirs at start
        // (their memory sleeps and wakes with the KV cache); none on the
        // CPU. A restarted engine captures as it goes.
        if let (Some(e), Some(len)) = (rollout.as_mut(), spec.engine.max_seq_len) {
            if memory.colocation != Colocation::Restart {
                e.capture_cuda_graphs(spec.engine.validate()?.kv_seqs, len)?;
            }
        }
        // The engine sleeps before the trainer is built (and until the first
        // step wakes it), so start-up never holds both: a device that fits
        // the choreography fits its start too.
        match memory.colocation {
            Colocation::Naive => {}
            Colocation::Restart => {
                rollout = None;
                pool.empty_cache();
            }
            Colocation::Sleep | Colocation::Staged => {
                if let Some(e) = rollout.as_mut() {
                    e.release(&[tags::KV_CACHE, tags::WEIGHTS])?;
                }
            }
        }
        pool.set_phase("init_trainer");
        let actor = ColoTrainer::from_dir(Arc::clone(&pool), model_dir, &spec.actor)?;
        let critic = spec
            .critic
            .as_ref()
            .map(|c| ColoTrainer::from_dir(Arc::clone(&pool), model_dir, c))
            .transpose()?;
        let reference = match spec.reference {
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
        Ok(HybridWorker {
            actor,
            critic,
            reference,
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
            engine_cfg: spec.engine.clone(),
            offloaded: Offload::NONE,
            policy: memory.offload_policy,
            scratch: spec.scratch.clone(),
            phase: Phase::Train,
        })
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

    fn expect(&self, op: &'static str, phase: Phase) -> Result<()> {
        if self.phase != phase {
            return Err(Error::Phase {
                op,
                state: format!("the worker is in the {:?} phase", self.phase),
            });
        }
        Ok(())
    }

    /// Train → rollout, in the order the colocation mode says.
    pub fn to_rollout(&mut self) -> Result<SwitchTiming> {
        self.expect("switch to rollout", Phase::Train)?;
        let start = Instant::now();
        let sync_s = match self.mode {
            Colocation::Naive => {
                self.pool.set_phase("sync_weights");
                self.sync()?
            }
            Colocation::Restart => {
                self.pool.set_phase("save_weights");
                let t = Instant::now();
                std::fs::create_dir_all(&self.scratch).map_err(|e| Error::io(&self.scratch, e))?;
                let model = self.actor.model()?;
                model.save_dir(&self.scratch)?;
                let (kind, device) = (model.dtype(), model.device());
                self.offloaded = self.offload;
                self.offload_actor(self.offload)?;
                // The engine about to be built is not in the pool yet, so
                // there is nothing to weigh the cache against: it goes.
                self.actor.release_cache();
                self.pool.set_phase("restart_engine");
                self.rollout = Some(Engine::from_dir_on(
                    &self.scratch,
                    kind,
                    device,
                    Arc::clone(&self.pool),
                    &self.engine_cfg,
                )?);
                t.elapsed().as_secs_f64()
            }
            Colocation::Sleep => {
                let params = self.give_up_before_the_wake()?;
                self.pool.set_phase("wake_all");
                self.engine()?.resume(&[tags::WEIGHTS, tags::KV_CACHE])?;
                self.pool.set_phase("sync_weights");
                let s = self.sync()?;
                self.free_trainer_weights(params)?;
                s
            }
            Colocation::Staged => {
                let params = self.give_up_before_the_wake()?;
                self.pool.set_phase("wake_weights");
                self.engine()?.resume(&[tags::WEIGHTS])?;
                self.pool.set_phase("sync_weights");
                let s = self.sync()?;
                self.free_trainer_weights(params)?;
                self.pool.set_phase("wake_kv_cache");
                self.engine()?.resume(&[tags::KV_CACHE])?;
                s
            }
        };
        self.pool.set_phase("generate");
        self.phase = Phase::Rollout;
        Ok(SwitchTiming {
            total_s: start.elapsed().as_secs_f64(),
            sync_s,
        })
    }

    /// Rollout → train: the engine's memory goes, the actor's comes back.
    pub fn to_train(&mut self) -> Result<SwitchTiming> {
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
                self.engine()?.release(&[tags::KV_CACHE, tags::WEIGHTS])?;
                self.reload_actor()?;
            }
        }
        self.pool.set_phase("train");
        self.phase = Phase::Train;
        Ok(SwitchTiming {
            total_s: start.elapsed().as_secs_f64(),
            sync_s: 0.0,
        })
    }

    /// Generates (rollout phase only).
    pub fn generate(
        &mut self,
        requests: Vec<Request>,
    ) -> Result<Vec<colo_rollout::Result<RequestOutput>>> {
        self.expect("generate", Phase::Rollout)?;
        Ok(self.engine()?.generate(requests)?)
    }

    /// The rollout engine, if one exists right now (not in `restart` mode
    /// during training).
    pub fn engine(&mut self) -> Result<&mut Engine> {
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
        seqs: &colo_train::SeqBatch,
        micro: impl Into<colo_train::Split>,
    ) -> Result<Option<tch::Tensor>> {
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
        let peak = match self.reference_kept() {
            true => stats.peak_allocated_bytes.saturating_sub(reference),
            false => stats.peak_allocated_bytes,
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
    /// batch of `tokens` padded tokens (see [`HybridWorker::ref_log_probs`]).
    fn room_for_the_reference(&self, tokens: u64) -> bool {
        let (Some(largest), OffloadPolicy::AsNeeded) = (self.largest, self.policy) else {
            return false;
        };
        if !matches!(self.mode, Colocation::Sleep | Colocation::Staged) || tokens > largest.tokens {
            return false;
        }
        let stats = self.pool.stats();
        let reference = stats.tag(tags::REF).map_or(0, |t| t.resident_bytes);
        largest.peak.saturating_add(reference) <= stats.capacity_bytes
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
        }
        Ok(())
    }

    /// Copies the actor's parameters into the engine's weights, in place.
    fn sync(&mut self) -> Result<f64> {
        let t = Instant::now();
        let params = self.actor.named_parameters();
        self.engine()?.update_weights(&params)?;
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

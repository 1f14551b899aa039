//! The RL loop: GRPO / PPO post-training with the trainer and the rollout
//! engine sharing one device. Read it top to bottom; it is the whole step
//! and the loop around it.
//!
//! `train_steps` builds the [`Run`] (the worker and everything the steps
//! share) and runs the steps; `Steps::step` runs one and then what is due
//! after it: its records, a checkpoint every `trainer.save_freq` steps, an
//! evaluation every `trainer.test_freq`, the progress line, and a stop
//! request's checkpoint. Where the run starts (a resumed checkpoint), its
//! files and its pictures are the harness's (`run.rs`).
//!
//! `Run::step` calls the stages in order, one function each, and hands
//! each stage's output to the next as a typed struct:
//!
//! 1. `generate_and_score`: n samples per prompt, scored, in the rollout
//!    phase (with dynamic sampling, batch after batch until enough groups
//!    vary: `step/dynamic_sampling.rs`) → `Sampled`;
//! 2. `rewards`: one training score per sample, the rows in the order the
//!    updates take them → `Rewarded`;
//! 3. `log_probs`: old, reference and rollout log-probs, and the critic's
//!    values (`on_policy_rows`: the π_old shortcut) → `LogProbs`;
//! 4. `advantages` → `Advantages`;
//! 5. `update`: the actor, and the critic, in mini- and micro-batches →
//!    `Updates`;
//! 6. `step_metrics`: the step's record with verl's names.
//!
//! It follows verl's `RayPPOTrainer.fit` (generate → reward → old and
//! reference log-probs → advantages → actor update in mini- and
//! micro-batches) with SGLang's multi-stage awake for the memory (see
//! `worker.rs`), and departs from verl where one process makes things
//! simpler: no Ray, no data-proto dictionaries (typed [`Rollouts`] cross
//! the phase boundary), and the rollout engine's own log-probabilities are
//! compared with the trainer's every step (the mismatch metrics).
//!
//! PPO with GAE gets a critic: the same checkpoint with a value head,
//! trained beside the actor on the clipped value loss (it shares the
//! actor's optimizer settings; a separate `[critic]` section is future
//! work). ReMax gets its baselines from one extra greedy sample per prompt.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use colo_algo::kl::{apply_kl_penalty, KlController};
use colo_algo::mismatch::{mismatch_metrics, MismatchMetrics};
use colo_algo::{compute_advantage, AdvEstimator, AdvantageInputs};
use colo_model::Tokenizer;
use colo_rollout::{FinishReason, Request, SamplingParams};
use colo_train::{
    CriticBatch, CriticLossConfig, CriticMetrics, PolicyBatch, PolicyMetrics, SeqBatch,
};
use tch::Tensor;

use crate::checkpoints::{self, DataState};
use crate::config::{Config, FilterMetric};
use crate::data::{Batch, Batches, Dataset, Prompt};
use crate::eval::{self, EvalConfig, Tally};
use crate::finite;
use crate::generations::Generation;
use crate::metrics::{EvalRecord, EvalTallies, MetricsWriter, StepMetrics};
use crate::progress::{Progress, Status};
use crate::reward::{self, Reward, RewardInput, Scored};
use crate::rollouts::Rollouts;
use crate::run::{Earlier, Setup, Start};
use crate::setup::{critic_config, loss_config, trainer_config, uses_critic};
use crate::timeline_file::TimelineWriter;
use crate::worker::{HybridWorker, SwitchTiming, WorkerSpec};
use crate::{Error, Result};

mod dynamic_sampling;

use dynamic_sampling::Drawn;

pub use crate::finite::MAX_SKIPPED_IN_A_ROW;
pub use crate::run::{run, run_until, RunSummary, Stop};
pub use crate::setup::{
    builtin_capacity, device_capacity, device_memory, device_pool, engine_config, BUILTIN_CAPACITY,
    BUILTIN_CAPACITY_BF16,
};

/// Everything the steps share.
pub(crate) struct Run<'a> {
    pub(crate) config: &'a Config,
    pub(crate) worker: HybridWorker,
    /// The starting checkpoint (its tokenizer files go into every checkpoint).
    pub(crate) model_dir: PathBuf,
    pub(crate) tokenizer: Tokenizer,
    pub(crate) reward: Box<dyn Reward>,
    pub(crate) val: Dataset,
    /// The tokens that end a completion (`colo_model::tokenizer::stop_token_ids`),
    /// the tokenizer's end-of-sequence token first.
    pub(crate) stop: Vec<u32>,
    pub(crate) pad: u32,
    pub(crate) metrics: MetricsWriter,
    /// β of the KL penalty in the reward, when `use_kl_in_reward`.
    pub(crate) kl_ctrl: Option<KlController>,
    /// An evaluation of the policy after this many steps, to run at the
    /// start of the next step's rollout phase — the same weights, without
    /// a switch of its own (verl validates in the rollout mode too) — and
    /// the last such evaluation's (step, accuracy).
    pub(crate) pending_eval: Option<usize>,
    pub(crate) evaluated: Option<(usize, f64)>,
    /// The last evaluation's accuracy per `data_source` (empty when its
    /// rows name none), for the run's closing line.
    pub(crate) accuracy_by_source: BTreeMap<String, f64>,
    /// A request to stop, which a step that draws generation batches
    /// until enough groups vary checks between them.
    pub(crate) stop_request: crate::run::Stop,
    /// The other ranks of a data-parallel run, which a step that draws
    /// generation batches asks whether every rank has its groups (all
    /// ranks draw the same batches, so their data stay in step).
    pub(crate) peers: Option<Box<dyn colo_train::Collective>>,
    /// A file whose existence is a request to stop, as `stop_request` is:
    /// a distributed run's controller writes it (a worker busy with a step
    /// cannot be called, nor signalled, without its peers).
    pub(crate) stop_file: Option<PathBuf>,
    /// Optimizer steps skipped in a row (their gradient norm was not
    /// finite), across RL steps: [`MAX_SKIPPED_IN_A_ROW`] stops the run.
    pub(crate) skipped_in_a_row: usize,
    /// A sharded actor's seconds in its gathers and reduce-scatters up to
    /// the last step's metrics (each step records its own).
    collective_s: std::cell::Cell<f64>,
}

impl<'a> Run<'a> {
    /// The worker on `pool` and everything the steps share, for a run of
    /// `total_steps` steps from the checkpoint in `model_dir`;
    /// `peers` as [`HybridWorker::new`]'s.
    // Eight: the run's parts, each built by its caller (setup.rs, or a
    // data-parallel rank), none of which belong together.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        config: &'a Config,
        out: &Path,
        pool: &Arc<colo_mem::Pool>,
        (model_dir, tokenizer): (PathBuf, Tokenizer),
        val: Dataset,
        metrics: MetricsWriter,
        total_steps: usize,
        mut peers: crate::worker::WorkerPeers,
    ) -> Result<Self> {
        let stop = colo_model::tokenizer::stop_token_ids(&model_dir, &tokenizer)?;
        let Some(&eos) = stop.first() else {
            return Err(Error::Phase {
                op: "generate",
                state:
                    "the tokenizer has no end-of-sequence token and the model's config names none"
                        .into(),
            });
        };
        let pad = tokenizer.special.pad.as_ref().map_or(eos, |t| t.id);
        let tp = config.rollout.tensor_model_parallel_size;
        if tp > 1 && peers.rollout.is_none() {
            return Err(Error::Cluster(format!(
                "rollout.tensor_model_parallel_size = {tp}: a tensor-parallel rollout runs on \
                 Ray workers; set cluster.workers to a multiple of {tp}"
            )));
        }
        // A sharded run on one device (no Ray): the sharded actor alone,
        // its gathers and reduce-scatters copies, as a sharded rank of
        // one runs on Ray.
        if config.cluster.sharding == crate::config::Sharding::Full && peers.actor.is_none() {
            peers.actor = Some(Box::new(colo_train::Solo));
        }
        let spec = WorkerSpec {
            model_dir: model_dir.clone(),
            actor: trainer_config(config, total_steps),
            critic: uses_critic(config).then(|| critic_config(config, total_steps)),
            engine: engine_config(config),
            memory: config.memory.clone(),
            reference: config.needs_ref(),
            scratch: out.join("scratch"),
        };
        Ok(Run {
            config,
            worker: HybridWorker::new(Arc::clone(pool), &spec, peers)?,
            model_dir,
            tokenizer,
            reward: reward::build(&config.reward)?,
            val,
            stop,
            pad,
            kl_ctrl: (config.algorithm.use_kl_in_reward)
                .then(|| KlController::new(&config.algorithm.kl_ctrl))
                .transpose()?,
            metrics,
            pending_eval: None,
            evaluated: None,
            accuracy_by_source: BTreeMap::new(),
            stop_request: crate::run::Stop::new(),
            peers: None,
            stop_file: None,
            skipped_in_a_row: 0,
            collective_s: Default::default(),
        })
    }
}

/// The worker, the evaluations and the steps from `start.first_step`.
pub(crate) fn train_steps(
    config: &Config,
    out: &Path,
    pool: &Arc<colo_mem::Pool>,
    setup: Setup,
    start: Start,
    timeline: &mut TimelineWriter,
    stop: &Stop,
) -> Result<RunSummary> {
    let Setup {
        model_dir,
        tokenizer,
        train,
        val,
        metrics,
    } = setup;
    let (first_step, total) = (start.first_step, start.total);
    let model = (model_dir, tokenizer);
    let mut run = Run::new(
        config,
        out,
        pool,
        model,
        val,
        metrics,
        total,
        Default::default(),
    )?;
    run.stop_request = stop.clone();
    let ckpt_dir = out.join(checkpoints::DIR);
    if first_step > 0 {
        let dir = checkpoints::step_dir(&ckpt_dir, first_step);
        run.worker.load_checkpoint(&dir)?;
    }
    let batches = Batches::of_run(&train, config)?;
    let mut steps = Steps {
        config,
        ckpt_dir,
        first_step,
        total,
        next_batch: start.first_batch,
        seen: start.before,
        last: total,
        score: None,
        progress: Progress::stderr(total),
    };
    run.pending_eval = steps.first_eval();
    for step in first_step..total {
        if steps.step(&mut run, &batches, step, (pool, timeline), stop)? {
            break;
        }
    }
    if steps.last == total {
        steps.finish(&mut run, stop)?;
    }
    Ok(RunSummary {
        run_dir: out.to_owned(),
        steps: steps.last,
        total_steps: total,
        resumed_from: (first_step > 0).then_some(first_step),
        first_accuracy: steps.seen.first,
        last_accuracy: steps.seen.last,
        reward_failures: steps.reward_failures(&run),
        last_accuracy_by_source: run.accuracy_by_source,
        peak_device_bytes: steps.seen.peak,
        peak_allocated_bytes: steps.seen.peak_allocated,
        notes: start.notes,
    })
}

/// The loop over a run's steps: where it is in the data, and what the
/// progress line and the summary say.
struct Steps<'c> {
    config: &'c Config,
    ckpt_dir: PathBuf,
    /// The step the run starts from (a resumed run's checkpoint), and its
    /// last.
    first_step: usize,
    total: usize,
    /// The next generation batch to draw.
    next_batch: usize,
    /// The accuracies and peaks so far, the resumed run's included; its
    /// `reward_failures` are the resumed run's only.
    seen: Earlier,
    /// The last step run: `total`, or the one a stop request ended at.
    last: usize,
    /// The last step's mean score.
    score: Option<f64>,
    progress: Progress,
}

impl Steps<'_> {
    /// Whether an evaluation is due after `done` steps. Evaluations during
    /// the run happen at the start of the next step's rollout phase (the
    /// same weights, no switch of their own); the record comes before
    /// that step's, as if evaluated in between.
    fn test_step(&self, done: usize) -> bool {
        self.config.evaluates()
            && (self.config.trainer.test_every()).is_some_and(|f| done.is_multiple_of(f))
    }

    /// The evaluation due before the first step: before training when
    /// `val_before_train`; for a resumed run, an evaluation of its
    /// checkpoint's step that was due but not logged (a run stopped
    /// between the checkpoint and the next step).
    fn first_eval(&self) -> Option<usize> {
        match self.first_step {
            0 => (self.config.evaluates() && self.config.trainer.val_before_train).then_some(0),
            k => (self.test_step(k) && self.seen.evaluated_at != Some(k)).then_some(k),
        }
    }

    /// Where a checkpoint is in the data when the next batch is `next_batch`.
    fn data_state(&self, next_batch: usize) -> DataState {
        DataState {
            gen_batches: next_batch,
            gen_batch_size: self.config.batch.gen_batch_prompts,
        }
    }

    /// Samples whose reward failed, over the whole run.
    fn reward_failures(&self, run: &Run) -> u64 {
        self.seen.reward_failures + run.reward.failures()
    }

    /// Step `step`, its records, and the checkpoint and evaluation due
    /// after it; whether the run stops there (at the stop request).
    fn step(
        &mut self,
        run: &mut Run,
        batches: &Batches,
        step: usize,
        (pool, timeline): (&Arc<colo_mem::Pool>, &mut TimelineWriter),
        stop: &Stop,
    ) -> Result<bool> {
        let total = self.total;
        stop.step_began(step + 1);
        let batch_at_start = self.next_batch;
        let next_batch = &mut self.next_batch;
        let mut draw = || {
            let b = batches.batch(*next_batch);
            *next_batch = next_batch.saturating_add(1);
            b
        };
        let m = match run.step(step, &mut draw) {
            Err(Error::StoppedMidStep(why)) => {
                return Err(self.stopped_mid_step(run, step, batch_at_start, stop, why)?)
            }
            r => r.map_err(|e| e.explained_by(pool))?,
        };
        if let Some((at, accuracy)) = run.evaluated.take() {
            if at == 0 {
                self.seen.first = Some(accuracy);
            }
            self.seen.last = Some(accuracy);
        }
        self.seen.peak = self.seen.peak.max(m.peak_device_bytes);
        self.seen.peak_allocated = self.seen.peak_allocated.max(m.peak_allocated_bytes);
        run.metrics.step(&m)?;
        timeline.append_new(pool)?;
        let done = step + 1;
        let stopping = stop.requested() && done < total;
        let saves = (self.config.trainer.save_every()).is_some_and(|f| done.is_multiple_of(f));
        if (saves || stopping) && done < total {
            run.save(&self.ckpt_dir, done, &self.data_state(self.next_batch))?;
            stop.saved(done);
        }
        stop.step_ended();
        if self.test_step(done) && done < total {
            // Made up by `--resume` when stopping here.
            run.pending_eval = Some(done);
        }
        self.score = Some(m.score_mean);
        // The last step's line waits for the evaluation at the end.
        if done < total {
            let status = Status {
                score: m.score_mean,
                accuracy: self.seen.last,
                reward_failures: self.reward_failures(run),
            };
            self.progress.update(done, status);
        }
        if stopping {
            self.last = done;
        }
        Ok(stopping)
    }

    /// Dynamic sampling still drawing batches when asked to stop: the step
    /// under way is dropped, but the steps finished since the last
    /// checkpoint are kept, as without dynamic sampling. The error to end
    /// the run with.
    fn stopped_mid_step(
        &self,
        run: &mut Run,
        step: usize,
        batch_at_start: usize,
        stop: &Stop,
        why: String,
    ) -> Result<Error> {
        let ckpt_dir = &self.ckpt_dir;
        let unsaved = step > self.first_step && !checkpoints::step_dir(ckpt_dir, step).exists();
        if !unsaved {
            return Ok(Error::StoppedMidStep(why));
        }
        run.save(ckpt_dir, step, &self.data_state(batch_at_start))?;
        stop.saved(step);
        Ok(Error::StoppedMidStep(format!(
            "{why}; a checkpoint of step {step}, the last one finished, was written"
        )))
    }

    /// The end of a run that reached its last step: one evaluation, the
    /// last checkpoint. (`run` returns early when a resumed run has no
    /// step left, so this evaluation is the only one at `total`.)
    fn finish(&mut self, run: &mut Run, stop: &Stop) -> Result<()> {
        let total = self.total;
        if self.config.evaluates() {
            self.seen.last = Some(run.evaluate(total)?);
        }
        run.save(&self.ckpt_dir, total, &self.data_state(self.next_batch))?;
        stop.saved(total);
        if let Some(score) = self.score {
            let status = Status {
                score,
                accuracy: self.seen.last,
                reward_failures: self.reward_failures(run),
            };
            self.progress.update(total, status);
        }
        Ok(())
    }
}

impl Run<'_> {
    /// RL step `step` (0-based) on the prompts of generation batches drawn
    /// from `draw`: one, or with dynamic sampling as many as it takes. The
    /// stages in order, one function each below.
    pub(crate) fn step<'p>(
        &mut self,
        step: usize,
        draw: &mut dyn FnMut() -> Batch<'p>,
    ) -> Result<StepMetrics> {
        let t_step = Instant::now();
        self.worker.begin_step((step as u64).saturating_add(1));
        let (sampled, sampling) = self.generate_and_score(step, draw)?; // 1.
        let rewarded = self.rewards(step, sampled)?; // 2.
        let log_probs = self.log_probs(step, &rewarded.rollouts)?; // 3.
        let advantages = self.advantages(step, &rewarded, &log_probs)?; // 4.
        let updates = self.update(step, &rewarded, &log_probs, &advantages)?; // 5.
        let step_s = t_step.elapsed().as_secs_f64() - sampling.eval_s;
        let stages = (sampling, rewarded, log_probs, advantages, updates);
        self.step_metrics(step, step_s, stages) // 6.
    }

    /// 1. Generate n samples per prompt and score them (memory: train →
    ///    rollout → train; the rewards need no device). A pending
    ///    evaluation runs first, in the same rollout phase; its time is its
    ///    own record's, not the step's.
    fn generate_and_score<'p>(
        &mut self,
        step: usize,
        draw: &mut dyn FnMut() -> Batch<'p>,
    ) -> Result<(Sampled<'p>, Sampling)> {
        let t = Instant::now();
        let to_rollout = self.worker.to_rollout()?;
        let eval_s = match self.pending_eval.take() {
            Some(step) => {
                let te = Instant::now();
                let accuracy = self.evaluate_in_rollout(step)?;
                self.evaluated = Some((step, accuracy));
                te.elapsed().as_secs_f64()
            }
            None => 0.0,
        };
        let mut reward = RewardCost::default();
        let (sampled, drawn) = match self.sample(step, draw, &mut reward) {
            // Cut short by the stop request: back to the training phase,
            // where the step began, so that the caller can save the last
            // finished step.
            Err(e @ Error::StoppedMidStep(_)) => {
                self.worker.to_train()?;
                return Err(e);
            }
            r => r?,
        };
        let to_train = (self.worker).to_train_for_update(sampled.rollouts.padded_tokens())?;
        let gen_s = t.elapsed().as_secs_f64() - eval_s - reward.seconds;
        let sampling = Sampling {
            drawn,
            to_rollout,
            to_train,
            eval_s,
            gen_s,
            reward,
        };
        Ok((sampled, sampling))
    }

    /// 2. Rewards: one score per sample, and DAPO's overlong punishment
    ///    logged as verl's DAPO reward manager logs it; the rows put in the
    ///    order the updates take them.
    fn rewards<'p>(&self, step: usize, sampled: Sampled<'p>) -> Result<Rewarded<'p>> {
        let cfg = self.config;
        let Sampled {
            prompts,
            rollouts,
            scored,
            penalties,
            baselines,
        } = sampled;
        let n = rollouts.len(); // samples = prompts × n
        let mut reward_extra = Tally::of(&scored.iter().collect::<Vec<_>>()).extra_means();
        let scores: Vec<f32> = (0..n)
            .map(|i| training_score(&scored, &penalties, i))
            .collect();
        if !penalties.is_empty() {
            let mean = |f: fn(f64) -> f64| penalties.iter().map(|&p| f(p)).sum::<f64>() / n as f64;
            reward_extra.insert("overlong_reward".into(), mean(|p| p));
            reward_extra.insert("overlong".into(), mean(|p| f64::from(u8::from(p < 0.0))));
        }
        // ReMax: each row's baseline is its prompt's greedy score.
        let baselines: Option<Vec<f32>> =
            baselines.map(|b| rollouts.batch_prompt.iter().map(|&k| b[k]).collect());
        if let Some(dir) = &cfg.trainer.rollout_data_dir {
            self.dump_rollouts(dir, step + 1, &prompts, &rollouts, &scored, &penalties)?;
        }
        // Each mini-batch's rows longest first, so that a micro-batch holds
        // rows of like length and pads little (the groups stay whole in
        // their mini-batch, and every row keeps its own data).
        let order = rollouts.longest_first(cfg.batch.mini_batch_samples);
        let rollouts = rollouts.into_rows(&order);
        let scores: Vec<f32> = order.iter().map(|&i| scores[i]).collect();
        let baselines = baselines.map(|b| order.iter().map(|&i| b[i]).collect::<Vec<f32>>());
        Ok(Rewarded {
            prompts,
            rollouts,
            scores,
            baselines,
            order,
            reward_extra,
        })
    }

    /// 3. Old, reference and rollout log-probs, and the critic's values,
    ///    (samples, seq) aligned with the tokens. The rows of the first
    ///    mini-batch are left for its update when [`Run::on_policy_rows`]
    ///    says so.
    fn log_probs(&mut self, step: usize, rollouts: &Rollouts) -> Result<LogProbs> {
        let n = rollouts.len();
        let seqs = rollouts.seq_batch(0..n, self.pad)?;
        let t = Instant::now();
        let on_policy = self.on_policy_rows(step, n);
        let old = self.score_old(rollouts, &seqs, on_policy)?;
        let old_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let micro = self.config.batch.micro_split();
        let reference = self.worker.ref_log_probs(&seqs, micro)?;
        let ref_s = t.elapsed().as_secs_f64();
        let values = self.worker.values(&seqs)?; // (samples, seq)
        let rollout = rollouts.to_token_layout(&rollouts.logprobs, 0..n, seqs.seq_len())?;
        Ok(LogProbs {
            seqs,
            old,
            on_policy,
            reference,
            rollout,
            values,
            old_s,
            ref_s,
        })
    }

    /// The π_old shortcut: how many leading rows need no scoring pass for
    /// π_old. The first mini-batch is on-policy (no optimizer step since
    /// it was sampled), so its update computes π_old itself, in the
    /// forward pass it makes anyway, and fills those rows of the old
    /// log-probs; only the other mini-batches are scored beforehand (verl
    /// skips the extra pass the same way when the old log-probs equal the
    /// trainer's). No rows when the rewards need π_old before any update
    /// (KL in the reward), nor in the critic's warmup steps, which update
    /// no actor (so nothing computes π_old for the mismatch metrics either).
    fn on_policy_rows(&self, step: usize, n: usize) -> usize {
        match (
            self.config.algorithm.use_kl_in_reward,
            self.actor_updates(step),
        ) {
            (false, true) => self.config.batch.mini_batch_samples.min(n),
            _ => 0,
        }
    }

    /// Whether step `step` updates the actor: not in the critic's warmup.
    fn actor_updates(&self, step: usize) -> bool {
        step >= self.config.trainer.critic_warmup
    }

    /// π_old of every token, (samples, seq): the actor's scores of rows
    /// `from..`; rows before `from` are left for the first update to fill.
    fn score_old(&mut self, rollouts: &Rollouts, seqs: &SeqBatch, from: usize) -> Result<Tensor> {
        let n = rollouts.len();
        if from == 0 {
            return Ok(self.worker.score(seqs, false)?.log_probs);
        }
        let old = Tensor::f_zeros(
            [n as i64, seqs.seq_len() as i64],
            (tch::Kind::Float, tch::Device::Cpu),
        )?;
        if from < n {
            let rest = rollouts.seq_batch(from..n, self.pad)?;
            let scored = self.worker.score(&rest, false)?.log_probs;
            old.f_narrow(0, from as i64, (n - from) as i64)?
                .f_narrow(1, 0, rest.seq_len() as i64)?
                .f_copy_(&scored)?;
        }
        Ok(old)
    }

    /// 4. Advantages in colo-algo's layout, (samples, max_response_len),
    ///    grouped by prompt id, then moved to the trainer's layout. A value
    ///    that is not finite would make every update NaN (and be skipped):
    ///    it is an error naming its sample instead.
    fn advantages(&mut self, step: usize, r: &Rewarded, lp: &LogProbs) -> Result<Advantages> {
        let cfg = self.config;
        let (rollouts, n, seq_len) = (&r.rollouts, r.rollouts.len(), lp.seqs.seq_len());
        let t = Instant::now();
        let (mut rewards, resp_mask) =
            rollouts.response_layout(&rollouts.outcome_rewards(&r.scores))?;
        if let (true, Some(ref_lp), Some(ctrl)) = (
            cfg.algorithm.use_kl_in_reward,
            &lp.reference,
            &mut self.kl_ctrl,
        ) {
            // verl's use_kl_in_reward: token rewards minus β·KL(π_old ‖ π_ref).
            let (old_r, _) = rollouts.response_layout(&rollouts.from_token_layout(&lp.old)?)?;
            let (ref_r, _) = rollouts.response_layout(&rollouts.from_token_layout(ref_lp)?)?;
            let p = apply_kl_penalty(
                &rewards,
                &old_r,
                &ref_r,
                &resp_mask,
                cfg.algorithm.kl_penalty,
                ctrl.value(),
            )?;
            ctrl.update(p.kl, n);
            rewards = p.token_level_rewards;
        }
        let values_resp = match &lp.values {
            Some(v) => Some(rollouts.response_layout(&rollouts.from_token_layout(v)?)?.0),
            None => None,
        };
        // The groups are the step's prompts as drawn: one prompt drawn twice
        // (dynamic sampling across an epoch's end) is two groups, as in verl.
        let groups: Vec<u64> = rollouts.batch_prompt.iter().map(|&k| k as u64).collect();
        let adv = compute_advantage(
            &cfg.algorithm.advantage(),
            &AdvantageInputs {
                token_level_rewards: &rewards,
                response_mask: &resp_mask,
                values: values_resp.as_ref(),
                index: Some(&groups),
                reward_baselines: r.baselines.as_deref(),
            },
        )?;
        let samples = r.samples(step);
        let rows = rows_of(&adv.advantages, rollouts)?;
        samples.check_rows("advantage", &rows)?;
        let per_token = rollouts.to_token_layout(&rows, 0..n, seq_len)?;
        let returns = match lp.values {
            Some(_) => {
                let rows = rows_of(&adv.returns, rollouts)?;
                samples.check_rows("return", &rows)?;
                Some(rollouts.to_token_layout(&rows, 0..n, seq_len)?)
            }
            None => None,
        };
        Ok(Advantages {
            rewards,
            rows,
            per_token,
            returns,
            seconds: t.elapsed().as_secs_f64(),
        })
    }

    /// 5. Actor update: ppo_epochs × mini-batches of whole prompts, each
    ///    one optimizer step accumulated over micro-batches; the critic's
    ///    beside it on the same mini-batches.
    fn update(
        &mut self,
        step: usize,
        r: &Rewarded,
        lp: &LogProbs,
        adv: &Advantages,
    ) -> Result<Updates> {
        let (cfg, plan) = (self.config, self.config.batch);
        let t = Instant::now();
        // The scoring passes' freed activation blocks stay cached: the
        // update reuses those that fit (best fit within 2×), and an
        // allocation that finds the device full drops them first. Emptying
        // the cache here cost 10–20 ms a step on the built-in job (the
        // kernel freeing the pages, then faulting them in again) for no
        // lower peak (43.1 MiB either way).
        let loss = loss_config(cfg);
        let critic_loss = CriticLossConfig {
            cliprange_value: cfg.critic.cliprange_value,
            loss_agg_mode: cfg.critic_loss_agg_mode(),
        };
        let actor_updates = self.actor_updates(step);
        let (mut actor, mut critic) = (Vec::new(), Vec::new());
        for _epoch in 0..cfg.actor.ppo_epochs {
            for k in 0..plan.mini_batches_per_step {
                let rows = k * plan.mini_batch_samples..(k + 1) * plan.mini_batch_samples;
                let mb = r.rollouts.seq_batch(rows.clone(), self.pad)?;
                let cut = |t: &Tensor| -> Result<Tensor> {
                    Ok(t.f_narrow(0, rows.start as i64, rows.len() as i64)?
                        .f_narrow(1, 0, mb.seq_len() as i64)?)
                };
                let mut pb = PolicyBatch::new(
                    mb.clone(),
                    &cut(&lp.old)?,
                    &cut(&adv.per_token)?,
                    lp.reference.as_ref().map(cut).transpose()?.as_ref(),
                    Some(&cut(&lp.rollout)?),
                )?;
                if actor.is_empty() && rows.end <= lp.on_policy {
                    pb = pb.old_from_update(); // fills `old`'s rows: Run::on_policy_rows
                }
                if actor_updates {
                    actor.push(self.worker.update_policy(&pb, &loss)?);
                }
                // Values exist when the worker has a critic.
                if let (Some(v), Some(ret)) = (&lp.values, &adv.returns) {
                    let cb = CriticBatch::new(mb.clone(), &cut(v)?, &cut(ret)?)?;
                    critic.push(self.worker.update_critic(&cb, &critic_loss)?);
                }
            }
        }
        let seconds = t.elapsed().as_secs_f64();
        self.check_updates(step, r, lp, (&actor, &critic))?;
        Ok(Updates {
            mismatch: mismatch_metrics(&lp.old, &lp.rollout, lp.seqs.response_mask())?,
            actor,
            critic,
            use_kl_loss: loss.use_kl_loss,
            seconds,
        })
    }

    /// A loss that is not finite is an error naming its sample; a
    /// gradient that overflows from finite losses is skipped by the
    /// trainer, up to [`MAX_SKIPPED_IN_A_ROW`] optimizer steps in a row.
    fn check_updates(
        &mut self,
        step: usize,
        r: &Rewarded,
        lp: &LogProbs,
        (actor, critic): (&[PolicyMetrics], &[CriticMetrics]),
    ) -> Result<()> {
        let plan = self.config.batch;
        r.samples(step).check_losses(
            (actor, critic),
            (plan.mini_batches_per_step, plan.mini_batch_samples),
            &lp.old,
            lp.seqs.response_mask(),
        )?;
        finite::count_skipped(step, &mut self.skipped_in_a_row, actor)?;
        let skipped = actor.iter().filter(|u| !u.grad_norm.is_finite()).count();
        if skipped > 0 {
            // The trainer skips an optimizer step whose gradient norm is not
            // finite, as verl's actor does; say so, a diverged run repeats it.
            log::warn!(
                "step {}: the gradient norm was not finite in {skipped} of {} optimizer steps, which were skipped; if it stays so the run has diverged (lower actor.lr, set actor.grad_clip, check the rewards)",
                step + 1,
                actor.len()
            );
        }
        Ok(())
    }

    /// 6. Metrics with verl's names. The actor's metrics are not numbers
    ///    in the critic's warmup (`null` in metrics.jsonl; verl logs none).
    fn step_metrics(
        &self,
        step: usize,
        step_s: f64,
        (sampling, r, lp, adv, updates): (Sampling, Rewarded, LogProbs, Advantages, Updates),
    ) -> Result<StepMetrics> {
        let cfg = self.config;
        let (rollouts, scores, n) = (&r.rollouts, &r.scores[..], r.rollouts.len());
        let actor = &updates.actor;
        let mean = |f: fn(&PolicyMetrics) -> f64| match actor.is_empty() {
            true => f64::NAN,
            false => actor.iter().map(f).sum::<f64>() / actor.len() as f64,
        };
        let resp_lens: Vec<f64> = rollouts.responses.iter().map(|r| r.len() as f64).collect();
        let tokens: usize = rollouts
            .prompts
            .iter()
            .chain(&rollouts.responses)
            .map(Vec::len)
            .sum();
        let pool_stats = self.worker.pool().stats();
        Ok(StepMetrics {
            step: step + 1,
            epoch: sampling.drawn.epoch,
            num_gen_batches: (cfg.algorithm.filter_groups.enable).then_some(sampling.drawn.batches),
            timing_step: step_s,
            timing_gen: sampling.gen_s,
            timing_update_weights: sampling.to_rollout.sync_s,
            timing_switch_to_rollout: sampling.to_rollout.total_s,
            timing_switch_to_train: sampling.to_train.total_s,
            timing_reward: sampling.reward.seconds,
            timing_old_log_prob: lp.old_s,
            timing_ref: lp.ref_s,
            timing_adv: adv.seconds,
            timing_update_actor: updates.seconds,
            pg_loss: mean(|m| m.pg_loss),
            pg_clipfrac: mean(|m| m.pg_clipfrac),
            ppo_kl: mean(|m| m.ppo_kl),
            entropy: mean(|m| m.entropy),
            grad_norm: mean(|m| m.grad_norm),
            lr: actor.last().map_or(0.0, |m| m.lr),
            kl_loss: (updates.use_kl_loss).then(|| mean(|m| m.kl_loss.unwrap_or(0.0))),
            score_mean: mean_f32(scores),
            score_max: scores.iter().copied().fold(f32::MIN, f32::max) as f64,
            score_min: scores.iter().copied().fold(f32::MAX, f32::min) as f64,
            rewards_mean: adv.rewards.f_sum(tch::Kind::Double)?.double_value(&[]) / n as f64,
            vf_loss: mean_of(&updates.critic, |m| m.vf_loss),
            vf_clipfrac: mean_of(&updates.critic, |m| m.vf_clipfrac),
            vpred_mean: mean_of(&updates.critic, |m| m.vpred_mean),
            advantages_mean: adv.rows.iter().flatten().map(|&a| a as f64).sum::<f64>()
                / adv.rows.iter().map(Vec::len).sum::<usize>().max(1) as f64,
            response_length_mean: resp_lens.iter().sum::<f64>() / n as f64,
            response_length_max: resp_lens.iter().copied().fold(0.0, f64::max),
            response_length_clip_ratio: rollouts.truncated.iter().filter(|&&t| t).count() as f64
                / n as f64,
            throughput: tokens as f64 / step_s,
            peak_device_bytes: pool_stats.peak_resident_bytes,
            peak_allocated_bytes: pool_stats.peak_allocated_bytes,
            reshard_sent_bytes: sampling.to_rollout.reshard.map(|t| t.sent),
            reshard_recv_bytes: sampling.to_rollout.reshard.map(|t| t.received),
            shard_collectives_s: self
                .worker
                .actor("read the metrics")?
                .collective_seconds()
                .map(|total| total - self.collective_s.replace(total)),
            reward_failures: sampling.reward.failures,
            reward_extra: r.reward_extra,
            mismatch: Some(updates.mismatch.into()),
        })
    }

    /// Generates `n` samples for each prompt of `batch` and scores them,
    /// for RL step `step` (0-based); a score that is not finite is an error.
    fn sample_batch<'p>(
        &mut self,
        step: usize,
        batch: &Batch<'p>,
        cost: &mut RewardCost,
    ) -> Result<Sampled<'p>> {
        let cfg = self.config;
        let (rollouts, greedy) = self.generate(batch)?;
        let t = Instant::now();
        let failures_before = self.reward.failures();
        let inputs: Vec<RewardInput> = (0..rollouts.len())
            .map(|i| {
                let p = batch.prompts[rollouts.batch_prompt[i]];
                RewardInput {
                    sample: i as u64,
                    prompt_id: p.prompt_id,
                    prompt: &p.text,
                    completion: &rollouts.texts[i],
                    ground_truth: &p.ground_truth,
                    extra: Some(&p.extra),
                }
            })
            .collect();
        // A reward's error names the sample, its prompt's line and the step.
        let named = |e| {
            let e = crate::data::with_origin(e, batch.prompts.iter().copied());
            Error::context(format!("step {}", step + 1), e)
        };
        let scored = (self.reward.score_batch_extra(&inputs))
            .and_then(|s| reward::finite(&self.reward.name(), &inputs, s))
            .map_err(named)?;
        let penalties = match &cfg.algorithm.overlong_punishment() {
            Some(buffer) => (rollouts.responses.iter())
                .map(|r| buffer.penalty(r.len(), cfg.rollout.max_new_tokens))
                .collect(),
            None => Vec::new(),
        };
        let baselines = match greedy {
            Some(texts) => {
                let inputs: Vec<RewardInput> = (batch.prompts.iter().zip(&texts).enumerate())
                    .map(|(k, (p, t))| RewardInput {
                        sample: (rollouts.len() + k) as u64,
                        prompt_id: p.prompt_id,
                        prompt: &p.text,
                        completion: t,
                        ground_truth: &p.ground_truth,
                        extra: Some(&p.extra),
                    })
                    .collect();
                let plain = |b: Vec<f32>| b.into_iter().map(Scored::plain).collect();
                Some(
                    (self.reward.score_batch(&inputs))
                        .and_then(|b| reward::finite(&self.reward.name(), &inputs, plain(b)))
                        .map(Scored::scores)
                        .map_err(named)?,
                )
            }
            None => None,
        };
        cost.seconds += t.elapsed().as_secs_f64();
        cost.failures += self.reward.failures().saturating_sub(failures_before);
        Ok(Sampled {
            prompts: batch.prompts.clone(),
            rollouts,
            scored,
            penalties,
            baselines,
        })
    }

    /// Writes the step's samples to `dir/{step}.jsonl` (verl's
    /// `rollout_data_dir`; see [`crate::generations`]).
    fn dump_rollouts(
        &self,
        dir: &Path,
        step: usize,
        prompts: &[&Prompt],
        rollouts: &Rollouts,
        scored: &[Scored],
        penalties: &[f64],
    ) -> Result<()> {
        // One decode a prompt: its rows share the tokens.
        let mut inputs: Vec<Option<String>> = vec![None; prompts.len()];
        for (i, &k) in rollouts.batch_prompt.iter().enumerate() {
            if inputs[k].is_none() {
                inputs[k] = Some(self.tokenizer.decode(&rollouts.prompts[i], true)?);
            }
        }
        let rows: Vec<Generation> = (0..rollouts.len())
            .map(|i| {
                let k = rollouts.batch_prompt[i];
                let extra = scored[i].extra.iter().map(|(n, &v)| (n.as_str(), v));
                let overlong = penalties.get(i).map(|&p| ("overlong_reward", p));
                Generation {
                    input: inputs[k].as_deref().unwrap_or_default(),
                    output: &rollouts.texts[i],
                    gts: &prompts[k].ground_truth,
                    score: f64::from(training_score(scored, penalties, i)),
                    step,
                    extra: Generation::extras(extra.chain(overlong)),
                }
            })
            .collect();
        crate::generations::write(dir, step, &rows)?;
        Ok(())
    }

    /// Generates `n` samples for each prompt of `batch` (rollout phase).
    fn generate(&mut self, batch: &Batch) -> Result<(Rollouts, Option<Vec<String>>)> {
        let cfg = self.config;
        // A tensor-parallel group's engines generate the group's prompts
        // together; this rank keeps its own.
        let (asked, mine) = match &batch.group {
            Some((all, at)) => (all, *at..*at + batch.prompts.len()),
            None => (&batch.prompts, 0..batch.prompts.len()),
        };
        let mut requests = Vec::with_capacity(asked.len());
        for p in asked {
            let ids = p.encode(&self.tokenizer)?;
            if ids.len() > cfg.data.max_prompt_length {
                // verl's `truncation = "error"`: a silently cut prompt
                // would train on a different question.
                return Err(Error::Dataset(format!(
                    "prompt {} has {} tokens, more than data.max_prompt_length = {}",
                    p.prompt_id,
                    ids.len(),
                    cfg.data.max_prompt_length
                )));
            }
            let params = SamplingParams {
                n: cfg.batch.n,
                max_new_tokens: cfg.rollout.max_new_tokens,
                temperature: cfg.rollout.temperature,
                top_p: cfg.rollout.top_p,
                top_k: cfg.rollout.sampling().top_k,
                stop_token_ids: self.stop.clone(),
                stop_strings: Vec::new(),
                // Seeded by run, generation batch (the step's, without
                // dynamic sampling) and prompt: a resumed run draws the
                // same samples as an uninterrupted one.
                seed: mix(cfg.trainer.seed, batch.step as u64, p.prompt_id),
            };
            requests.push(Request::new(ids, params));
        }
        let prompts: Vec<Vec<u32>> = requests.iter().map(|r| r.prompt.clone()).collect();
        let remax = cfg.algorithm.adv_estimator == AdvEstimator::Remax;
        if remax {
            for p in &prompts {
                let greedy = SamplingParams {
                    stop_token_ids: self.stop.clone(),
                    ..SamplingParams::greedy(cfg.rollout.max_new_tokens)
                };
                requests.push(Request::new(p.clone(), greedy));
            }
        }
        let mut outputs = self.worker.generate(requests)?;
        let mut greedy_outputs = outputs.split_off(prompts.len());
        if mine.len() != prompts.len() {
            outputs = outputs.drain(mine.clone()).collect();
            if remax {
                greedy_outputs = greedy_outputs.drain(mine.clone()).collect();
            }
        }
        let prompts = &prompts[mine];
        let mut r = Rollouts::default();
        for (k, out) in outputs.into_iter().enumerate() {
            let out = out.map_err(|e| Error::Phase {
                op: "generate",
                state: format!("prompt {}: {e}", batch.prompts[k].prompt_id),
            })?;
            for c in out.completions {
                let body = self.without_stop(&c.tokens);
                r.texts.push(self.tokenizer.decode(body, true)?);
                r.prompt_ids.push(batch.prompts[k].prompt_id);
                r.batch_prompt.push(k);
                r.prompts.push(prompts[k].clone());
                r.truncated
                    .push(matches!(c.finish_reason, FinishReason::Length));
                r.responses.push(c.tokens);
                r.logprobs.push(c.logprobs);
            }
        }
        if !remax {
            return Ok((r, None));
        }
        let mut texts = Vec::with_capacity(greedy_outputs.len());
        for out in greedy_outputs {
            let c = &out?.completions[0];
            let body = self.without_stop(&c.tokens);
            texts.push(self.tokenizer.decode(body, true)?);
        }
        Ok((r, Some(texts)))
    }

    /// A completion's tokens without the stop token that ended it.
    fn without_stop<'t>(&self, tokens: &'t [u32]) -> &'t [u32] {
        match tokens.split_last() {
            Some((last, body)) if self.stop.contains(last) => body,
            _ => tokens,
        }
    }

    /// Greedy evaluation of the held-out set, the device switched to the
    /// rollout engine and back around it.
    pub(crate) fn greedy_eval(&mut self) -> Result<eval::EvalResult> {
        self.worker.to_rollout()?;
        let result = self.greedy_eval_now();
        self.worker.to_train()?;
        result
    }

    /// Greedy evaluation of the held-out set (rollout phase).
    fn greedy_eval_now(&mut self) -> Result<eval::EvalResult> {
        let ecfg = EvalConfig {
            keep_generations: self.config.trainer.validation_data_dir.is_some(),
            ..EvalConfig::greedy(self.config.rollout.max_new_tokens, self.stop.clone())
        };
        eval::evaluate(
            self.worker.engine("evaluate")?,
            &self.val,
            &self.tokenizer,
            self.reward.as_mut(),
            &ecfg,
        )
    }

    /// Greedy accuracy on the held-out set after `step` steps, logged,
    /// with a switch to the rollout engine and back around it.
    pub(crate) fn evaluate(&mut self, step: usize) -> Result<f64> {
        let t = Instant::now();
        let result = self.greedy_eval()?;
        self.log_eval(step, result, t)
    }

    /// [`Run::evaluate`] in a rollout phase already under way.
    fn evaluate_in_rollout(&mut self, step: usize) -> Result<f64> {
        let t = Instant::now();
        let result = self.greedy_eval_now()?;
        self.log_eval(step, result, t)
    }

    /// Writes an evaluation's generations to `dir/{step}.jsonl` when the
    /// run keeps them (verl's `validation_data_dir`).
    pub(crate) fn dump_eval(&self, step: usize, result: &eval::EvalResult) -> Result<()> {
        let Some(dir) = &self.config.trainer.validation_data_dir else {
            return Ok(());
        };
        let rows: Vec<Generation> = (result.generations.iter())
            .map(|g| Generation {
                input: &g.input,
                output: &g.output,
                gts: &g.ground_truth,
                score: f64::from(g.scored.score),
                step,
                extra: Generation::extras(g.scored.extra.iter().map(|(n, &v)| (n.as_str(), v))),
            })
            .collect();
        crate::generations::write(dir, step, &rows)?;
        Ok(())
    }

    fn log_eval(&mut self, step: usize, result: eval::EvalResult, t: Instant) -> Result<f64> {
        self.dump_eval(step, &result)?;
        let parts = [EvalTallies::from(&result)];
        if let Some(record) = EvalRecord::of_parts(step, &parts, t.elapsed().as_secs_f64()) {
            self.metrics.eval(&record)?;
        }
        self.accuracy_by_source = (result.by_source.iter())
            .map(|(source, tally)| (source.clone(), tally.accuracy()))
            .collect();
        Ok(result.accuracy())
    }

    /// Writes `checkpoints/step-N`, atomically and as a complete Hugging
    /// Face directory, with the critic if any and where the run is in its
    /// data (see [`crate::checkpoints`]).
    pub(crate) fn save(&self, dir: &Path, step: usize, data: &DataState) -> Result<()> {
        let path = crate::checkpoints::step_dir(dir, step);
        self.worker
            .save_checkpoint(&path, step, &self.model_dir, data)
    }
}

/// What stage 1 cost beside its samples: its timings and its draws.
struct Sampling {
    drawn: Drawn,
    /// The switches of the memory to the rollout engine and back.
    to_rollout: SwitchTiming,
    to_train: SwitchTiming,
    /// Seconds of the pending evaluation run in the rollout phase (not the
    /// step's).
    eval_s: f64,
    /// Seconds of generation: the rollout phase less the evaluation and
    /// the rewards.
    gen_s: f64,
    reward: RewardCost,
}

/// Stage 2's output: the step's samples with their training scores, rows
/// in the order the updates take them.
struct Rewarded<'p> {
    /// One prompt per group of rows (`rollouts.batch_prompt` indexes it).
    prompts: Vec<&'p Prompt>,
    /// The rows, each mini-batch's longest first.
    rollouts: Rollouts,
    /// (samples,) each row's training score: the reward's score with
    /// DAPO's overlong punishment.
    scores: Vec<f32>,
    /// (samples,) ReMax's baseline of each row: its prompt's greedy score.
    baselines: Option<Vec<f32>>,
    /// (samples,) each row's index among the samples as they were scored.
    order: Vec<usize>,
    /// The means of what the reward returned beside its scores
    /// (`reward_extra/*`), and the overlong punishment's.
    reward_extra: BTreeMap<String, f64>,
}

impl Rewarded<'_> {
    /// The rows for messages about a value that is not finite.
    fn samples(&self, step: usize) -> finite::Samples<'_> {
        finite::Samples {
            step,
            rollouts: &self.rollouts,
            scores: &self.scores,
            order: &self.order,
            prompts: &self.prompts,
        }
    }
}

/// Stage 3's output: per-token tensors, (samples, seq) float32 on the CPU,
/// aligned with the tokens of `seqs`.
struct LogProbs {
    /// The step's rows as the trainer's batch.
    seqs: SeqBatch,
    /// π_old; its first `on_policy` rows are zeros until the first update
    /// fills them.
    old: Tensor,
    /// Rows of `old` left for the first update ([`Run::on_policy_rows`]).
    on_policy: usize,
    /// π_ref, when the run has a reference model.
    reference: Option<Tensor>,
    /// The rollout engine's own log-probs of the sampled tokens.
    rollout: Tensor,
    /// The critic's values, when the run has a critic (GAE).
    values: Option<Tensor>,
    /// Seconds scoring π_old, and π_ref.
    old_s: f64,
    ref_s: f64,
}

/// Stage 4's output.
struct Advantages {
    /// (samples, max_response_len) the token rewards (the outcome at each
    /// response's last token, less the KL penalty when it is in the reward).
    rewards: Tensor,
    /// (samples,) each row's advantages, as long as its response.
    rows: Vec<Vec<f32>>,
    /// (samples, seq) the advantages aligned with the tokens.
    per_token: Tensor,
    /// (samples, seq) the critic's targets, when the run has a critic.
    returns: Option<Tensor>,
    seconds: f64,
}

/// Stage 5's output.
struct Updates {
    /// One per actor optimizer step (none in the critic's warmup).
    actor: Vec<PolicyMetrics>,
    /// One per critic optimizer step.
    critic: Vec<CriticMetrics>,
    /// π_old (the trainer's) against the rollout engine's log-probs.
    mismatch: MismatchMetrics,
    /// Whether the loss had a KL term (`actor.use_kl_loss`).
    use_kl_loss: bool,
    seconds: f64,
}

/// One generation batch's samples with their rewards, or the groups
/// dynamic sampling kept from several: what the step trains on.
#[derive(Default)]
struct Sampled<'p> {
    /// One prompt per group of rows (`rollouts.batch_prompt` indexes it).
    prompts: Vec<&'p Prompt>,
    rollouts: Rollouts,
    /// (samples,) the reward's scores and what it returned beside them.
    scored: Vec<Scored>,
    /// (samples,) DAPO's overlong punishment; empty when it is off.
    penalties: Vec<f64>,
    /// (prompts,) ReMax's baselines: each prompt's greedy score.
    baselines: Option<Vec<f32>>,
}

impl<'p> Sampled<'p> {
    /// The groups of `prompts` (indices into `self.prompts`), in that order.
    fn select(mut self, prompts: &[usize]) -> Sampled<'p> {
        let (rollouts, rows) = self.rollouts.select_prompts(prompts);
        let penalties = match self.penalties.is_empty() {
            true => Vec::new(),
            false => rows.iter().map(|&i| self.penalties[i]).collect(),
        };
        Sampled {
            prompts: prompts.iter().map(|&k| self.prompts[k]).collect(),
            rollouts,
            scored: (rows.iter())
                .map(|&i| std::mem::take(&mut self.scored[i]))
                .collect(),
            penalties,
            baselines: (self.baselines.as_ref()).map(|b| prompts.iter().map(|&k| b[k]).collect()),
        }
    }

    /// `other`'s groups after these.
    fn append(&mut self, other: Sampled<'p>) {
        self.rollouts.append(other.rollouts, self.prompts.len());
        self.prompts.extend(other.prompts);
        self.scored.extend(other.scored);
        self.penalties.extend(other.penalties);
        if let Some(b) = other.baselines {
            self.baselines.get_or_insert_with(Vec::new).extend(b);
        }
    }
}

/// What the step's rewards cost.
#[derive(Default)]
struct RewardCost {
    seconds: f64,
    /// Samples that failed and got the configured default.
    failures: u64,
}

/// Sample `i`'s training reward: its score with DAPO's overlong punishment.
fn training_score(scored: &[Scored], penalties: &[f64], i: usize) -> f32 {
    scored[i].score + penalties.get(i).map_or(0.0, |&p| p as f32)
}

/// A (samples, max_response_len) tensor as one `Vec` per row, as long as
/// the row's response.
fn rows_of(t: &Tensor, rollouts: &Rollouts) -> Result<Vec<Vec<f32>>> {
    Ok(Vec::<Vec<f32>>::try_from(t.f_to_kind(tch::Kind::Float)?)?
        .into_iter()
        .zip(&rollouts.responses)
        .map(|(row, r)| row[..r.len()].to_vec())
        .collect())
}

fn mean_of<T>(v: &[T], f: impl Fn(&T) -> f64) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().map(f).sum::<f64>() / v.len() as f64)
}

fn mean_f32(v: &[f32]) -> f64 {
    v.iter().map(|&x| x as f64).sum::<f64>() / v.len().max(1) as f64
}

/// SplitMix64-style mixing of three numbers into a seed.
fn mix(a: u64, b: u64, c: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ c.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

//! # colo-rl: colocated RL post-training
//!
//! The hybrid worker that keeps the actor, the rollout engine and the
//! reference on one device and switches memory between them
//! ([`worker`]), the RL loop that drives it ([`step`], one file: `src/step.rs`), and
//! everything a run needs around the engines: prompt datasets, the built-in
//! task, the run configuration, and the run's output (metrics, pictures,
//! progress). Rewards are a crate of their own, `colo-reward` (no
//! libtorch), re-exported as [`reward`].
//!
//! | module | holds |
//! |---|---|
//! | [`step`] | the RL step and the loop over the steps, top to bottom (`step.rs`; DAPO's drawing of batches in `step/dynamic_sampling.rs`); `run(config, out, resume)`, the harness around them (`run.rs`: where a run starts, its records, the pool, a stop request, the pictures) |
//! | [`data_parallel`] | one rank of a run on N devices: the step on a shard of the prompts, trainers joined by a collective; the worker's operations one by one (for colo-py) |
//! | [`checkpoints`] | `checkpoints/step-N`: complete Hugging Face directories; the newest complete one for `--resume` |
//! | [`worker`] | [`worker::HybridWorker`]: `to_rollout` / `to_train` in the colocation modes naive, restart, sleep, staged; generic over its engines' traits, every engine call checked against the phase |
//! | [`reference`](mod@reference) | the frozen reference model in tag `ref` |
//! | [`rollouts`] | [`rollouts::Rollouts`]: the typed step data from generation to training |
//! | [`eval`], [`sft`] | held-out greedy accuracy and pass@k; the supervised run behind `colo sft` |
//! | [`config`] | the run's TOML file → validated [`Config`] (batch sizes checked, errors with line and field) |
//! | [`data`] | prompts from JSONL ([`Dataset`]), seeded epochs of batches ([`Batches`]), held-out split |
//! | [`reward`] | the crate `colo-reward` (`crates/reward`): the [`Reward`] trait; exact / numeric / `\boxed{}` / format rules, weighted sums, external commands, verl-style Python functions |
//! | [`task`], [`vocab`] | the built-in arithmetic task, its character tokenizer and its 0.8M-parameter model |
//! | [`metrics`] | `metrics.jsonl` records with verl's names |
//! | [`plot`] | the memory timeline, the reward curve and the workers' memory, SVG and PNG (`plotters`) |
//! | [`progress`] | a progress bar (`indicatif`) that stays quiet off a terminal; the run's other console lines ([`progress::say`]) |
//! | [`process`] | what colo sets for the whole process (one libtorch intra-op thread, the lane threads, the CPU's features, the logger), called once by the program at its start |
//!
//! ## Example
//!
//! ```
//! use colo_rl::{reward, Config, Reward, RewardInput};
//!
//! // The built-in run, as `colo train` with no arguments would use it.
//! let config = Config::builtin();
//! assert_eq!(config.batch.samples_per_step, 32 * 8);
//! println!("{}", config.summary());
//!
//! // Its reward: exact match of the trimmed completion.
//! let mut r = reward::build(&config.reward)?;
//! let input = RewardInput {
//!     sample: 0, prompt_id: 0, prompt: "12+7=", completion: "19",
//!     ground_truth: "19", extra: None,
//! };
//! assert_eq!(r.score(&input)?, 1.0);
//! # Ok::<(), colo_rl::Error>(())
//! ```
//!
//! ## Design decisions
//!
//! - **Config from one source.** [`Config`] is the file's serde structs
//!   ([`config::sections`]), with verl's names, unknown keys refused (a
//!   typo must not pass silently), validated once: the values an unset key
//!   resolves to are written in and [`config::BatchPlan`] is derived; what
//!   the run reads in another shape (the optimizer, the KV budget, the run
//!   length) is a method of its section. Algorithm choices and engine
//!   sections reuse `colo-algo`'s serde types. Each key is documented once,
//!   at its field (doc comment, `#[key]`, `#[default]`); `--print-config`
//!   (the structs serialised) and the hints of config errors read those
//!   declarations (colo-keys).
//! - **The harness is modules, not a crate.** The step (`step.rs`) and the
//!   harness around it (`run.rs`, [`config`], [`checkpoints`], [`metrics`],
//!   [`plot`], [`progress`], [`run_lock`], [`run_config`],
//!   [`timeline_file`]) share [`Config`] and [`Error`], and colo-py's
//!   ranks need both halves; a crate boundary between them would move the
//!   config and the error type out of the crate that defines the step, for
//!   no caller that wants one without the other. The seam is the module:
//!   the step files open no file themselves (they hand records, generation
//!   dumps and checkpoints to the harness's writers), and `run.rs` holds
//!   no stage of the step.
//! - **Rewards in their own crate.** `colo-reward` needs no libtorch, so it
//!   builds and tests without the tensor engine; its design decisions are
//!   in its crate doc. Its errors come into this crate's [`Error`] as
//!   [`Error::Reward`], their messages unchanged; a reward's error about a
//!   sample is given the sample's step and the file and line of its prompt
//!   here.
//! - **One data path.** The built-in task is written as JSONL and read by the
//!   same loader as a user's files.
//! - **Deterministic by seed, forever.** Shuffling and task generation use a
//!   hand-rolled SplitMix64 ([`rng`]), not a crate whose stream could change
//!   with an upgrade; any step's batch is computed directly, so a resumed
//!   run sees the same prompts.
//! - **The field's crates for the run's output.** Charts are `plotters`
//!   (SVG and PNG, with an embedded font, no system fonts), the progress bar
//!   is `indicatif`; the crate README lists what stays hand-written and why.
//! - **Diagnostics through `log`, the run's report on the console.** A
//!   warning (a gradient that was not finite, a run directory that cannot
//!   be locked) is a `log` record: the program decides where it goes and
//!   how loud ([`process::init_logging`]). What the run says of itself
//!   (where it starts, prompts left out, a step drawing more batches) is
//!   its report, printed where its progress bar is, at every log level.
//! - **Process-wide state in one place.** No constructor here sets state
//!   for the whole process; [`process::init`] does, once, called by the
//!   program at its start, with the reasons.

mod error;

pub mod checkpoints;
pub mod config;
pub mod data;
pub mod data_parallel;
pub mod eval;
mod finite;
pub mod generations;
pub mod metrics;
pub mod plot;
pub mod process;
pub mod progress;
pub mod reference;
pub mod step;
pub use colo_algo::rng;
/// Rewards live in their own crate, [`colo_reward`]; `colo_rl::reward` is
/// that crate.
pub use colo_reward as reward;
pub mod rollouts;
mod run;
pub mod run_config;
pub mod run_lock;
mod setup;
pub mod sft;
pub mod task;
pub mod timeline_file;
pub mod vocab;
pub mod worker;

pub use config::Config;
pub use data::{Batch, Batches, Dataset, Fields, Overlong, Prompt};
pub use error::{Error, Result};
pub use metrics::{EvalRecord, MetricsWriter, StepMetrics};
pub use reward::{Reward, RewardInput, RewardSpec};
pub use timeline_file::TimelineWriter;

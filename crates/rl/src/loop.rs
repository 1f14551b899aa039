//! The RL loop — **to come**, in this one file, readable top to bottom
//! (`shared/STYLE.md`, point 6). Nothing is here yet: it needs the training
//! engine (`colo-train`'s `TrainEngine`) and the rollout engine
//! (`colo-rollout`'s `RolloutEngine`), which are being written.
//!
//! What it will do, with the pieces that already exist in this crate:
//!
//! ```text
//! config   = Config::from_file(..) / Config::builtin()          config
//! data     = ArithmeticTask::write_jsonl(run_dir/data) or the   task, data
//!            user's files → Dataset::from_jsonl(..) (+ split)
//! reward   = reward::build(&config.reward)                      reward
//! metrics  = MetricsWriter::create(run_dir/metrics.jsonl)       metrics
//! eval (step 0) → EvalRecord
//! for batch in Batches::new(..).from_step(resume_step):
//!     wake(weights) → sync trainer→rollout → free trainer copy   (colocation
//!     → wake(kv_cache) → generate n per prompt (logprobs)         mode picks
//!     → sleep(kv_cache, weights) → reload trainer params          the order)
//!     rewards: reward.score_batch(RewardInput { sample, prompt_id, .. })
//!     ref / old logprobs → colo_algo::compute_advantage (grouped by prompt_id)
//!     → actor update: BatchPlan's mini- and micro-batches, colo_algo losses
//!     → StepMetrics (memory/peak_device_bytes from the pool's statistics)
//!     → Progress::update, checkpoints every save_freq, eval every test_freq
//! eval (end) → EvalRecord; plot::memory_timeline(pool events), plot::reward_curve
//! ```
//!
//! The hybrid worker (actor + rollout + reference on one device, and its
//! phase state machine) will live beside it, in its own file.

//! `colo train --print-config`: the resolved configuration as a TOML file,
//! every key with a comment (meaning, unit, default, verl's name).
//!
//! The validated [`Config`] is turned back into a [`RawConfig`]
//! ([`to_raw`]), serialised by `toml`, and written section by section with
//! the comments of [`DOCS`]. Reading the printed text back gives the same
//! `Config` (a test checks the round trip); a key without an entry in
//! [`DOCS`] fails a test, so a new field cannot go undocumented.

use std::fmt::Write;

use colo_algo::{KlControlConfig, KlEstimator};
use toml::{Table, Value};

use super::raw::{
    Files, Loggers, RawActor, RawAlgorithm, RawCapacity, RawCluster, RawCritic, RawData,
    RawFilterGroups, RawMemory, RawModel, RawOverlongBuffer, RawRollout, RawRolloutCorrection,
    RawTrainer, RawValKwargs,
};
use super::*;

/// One key's documentation.
pub(crate) struct Doc {
    /// Dotted path from the file's root, e.g. `actor.ppo_mini_batch_size`.
    pub key: &'static str,
    pub meaning: &'static str,
    /// Unit or accepted values; "" when the meaning says it.
    pub unit: &'static str,
    /// verl's name where it differs from `key` or is worth saying ("" for
    /// none: a colo-only key).
    pub verl: &'static str,
    /// For optional keys: what leaving it out means.
    pub unset: &'static str,
}

const fn d(
    key: &'static str,
    meaning: &'static str,
    unit: &'static str,
    verl: &'static str,
) -> Doc {
    Doc {
        key,
        meaning,
        unit,
        verl,
        unset: "",
    }
}

const fn opt(
    key: &'static str,
    meaning: &'static str,
    unit: &'static str,
    verl: &'static str,
    unset: &'static str,
) -> Doc {
    Doc {
        key,
        meaning,
        unit,
        verl,
        unset,
    }
}

/// Every key of the file, in the order printed.
pub(crate) const DOCS: &[Doc] = &[
    // [data]
    d("data.train_files", "training prompts: JSONL files (one object per line) or parquet files (verl's, as they are; README: \"The data schema\"); none means the built-in arithmetic task", "paths (one or a list)", "data.train_files"),
    d("data.val_files", "held-out prompts for eval/accuracy: JSONL or parquet files; with neither these nor val_fraction the run does not evaluate", "paths (one or a list)", "data.val_files"),
    opt("data.val_fraction", "instead of val_files: hold out this fraction of the training prompts (seeded split)", "fraction in (0, 1)", "", "val_files are the held-out set (none: no evaluation)"),
    d("data.prompt_key", "field holding the prompt: a string, or a chat (a list of {role, content} messages rendered with the tokenizer's chat template)", "JSON key", "data.prompt_key"),
    d("data.answer_key", "field holding the ground truth the reward compares with; a dotted path reaches into objects", "JSON key or dotted path", "reward_model.ground_truth (fixed in verl)"),
    d("data.train_batch_size", "prompts per RL step (each sampled rollout.n times)", "prompts", "data.train_batch_size"),
    opt("data.gen_batch_size", "prompts per generation batch with dynamic sampling (algorithm.filter_groups); DAPO draws 3 × train_batch_size", "prompts", "data.gen_batch_size", "data.train_batch_size"),
    d("data.max_prompt_length", "longest prompt, as the run encodes it (chat template and special tokens included); a longer one is an error when the data are read, or is left out with filter_overlong_prompts", "tokens", "data.max_prompt_length (with truncation = \"error\")"),
    d("data.filter_overlong_prompts", "leave out prompts longer than max_prompt_length (counted on stderr when the data are read) instead of stopping at the first", "bool", "data.filter_overlong_prompts"),
    d("data.seed", "seed of the epoch shuffles and of the held-out split", "integer", "data.seed"),
    d("data.shuffle", "shuffle the prompts each epoch (else file order)", "bool", "data.shuffle"),
    d("data.builtin.max_operand", "built-in task (used when train_files is empty): operands are 0..=max_operand", "integer", ""),
    d("data.builtin.ops", "built-in task: the operations", "list of \"+\", \"-\"", ""),
    d("data.builtin.train_size", "built-in task: training problems", "prompts", ""),
    d("data.builtin.val_size", "built-in task: held-out problems (disjoint from training)", "prompts", ""),
    d("data.builtin.seed", "built-in task: seed of the problem generator", "integer", ""),
    // [model]
    d("model.enable_gradient_checkpointing", "activation checkpointing in the actor's and critic's updates: keep each decoder layer's input, recompute the layer for the backward (less activation memory, one more forward)", "bool", "actor_rollout_ref.model.enable_gradient_checkpointing"),
    opt("model.path", "Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer.json)", "path", "actor_rollout_ref.model.path", "the built-in 0.8M-parameter model and its committed SFT checkpoint"),
    // [rollout]
    d("rollout.n", "samples generated per prompt", "samples", "actor_rollout_ref.rollout.n"),
    d("rollout.temperature", "sampling temperature; 0 is greedy", "≥ 0", "actor_rollout_ref.rollout.temperature"),
    d("rollout.top_p", "nucleus sampling: keep the smallest set of tokens with this much probability", "(0, 1]", "actor_rollout_ref.rollout.top_p"),
    d("rollout.top_k", "keep the k most likely tokens; -1 or 0: off", "tokens", "actor_rollout_ref.rollout.top_k"),
    d("rollout.max_new_tokens", "longest response; with data.max_prompt_length at most the model's max_position_embeddings (a longer pair is refused, as verl refuses it)", "tokens", "data.max_response_length (alias: response_length, max_response_length)"),
    d("rollout.mem_fraction", "share of the device memory left after weights that the KV cache takes (ignored when max_kv_tokens is set)", "fraction in (0, 1]", "actor_rollout_ref.rollout.gpu_memory_utilization (alias)"),
    opt("rollout.max_kv_tokens", "KV-cache size in tokens, instead of mem_fraction", "tokens", "", "the cache is sized by mem_fraction"),
    d("rollout.max_num_seqs", "most sequences generated at once (fewer when the KV cache's blocks run short); the cache is sized for a step's samples at full length, and evaluation fits more of its short answers in it", "sequences", "actor_rollout_ref.rollout.max_num_seqs"),
    d("rollout.cpu_threads", "on the CPU, threads each prefill and decode step splits its rows over, each running libtorch with one intra-op thread (decoding is many small ops: lanes beat intra-op threads); 0: OMP_NUM_THREADS if set, else one per core", "threads", ""),
    d("rollout.enforce_eager", "on CUDA, run every decode step eagerly instead of replaying captured CUDA graphs (graphs: a small model's step is bound by launching its kernels; their memory is tag cuda_graph, released and resumed with the KV cache)", "bool", "actor_rollout_ref.rollout.enforce_eager"),
    d("rollout.val_kwargs.n", "evaluation: samples per held-out prompt (pass@n)", "samples", "actor_rollout_ref.rollout.val_kwargs.n"),
    d("rollout.val_kwargs.temperature", "evaluation: temperature; 0 is greedy", "≥ 0", "actor_rollout_ref.rollout.val_kwargs.temperature"),
    d("rollout.val_kwargs.top_p", "evaluation: nucleus sampling", "(0, 1]", "actor_rollout_ref.rollout.val_kwargs.top_p"),
    d("rollout.val_kwargs.top_k", "evaluation: top-k; -1 or 0: off", "tokens", "actor_rollout_ref.rollout.val_kwargs.top_k"),
    // [actor]
    d("actor.lr", "AdamW learning rate", "> 0", "actor_rollout_ref.actor.optim.lr"),
    d("actor.warmup_steps", "linear learning-rate warmup", "optimiser steps", "actor_rollout_ref.actor.optim.lr_warmup_steps (alias; also: warmup)"),
    d("actor.weight_decay", "AdamW weight decay", "[0, 1]", "actor_rollout_ref.actor.optim.weight_decay"),
    d("actor.warmup_style", "the learning rate after warmup: constant, or a half cosine that reaches min_lr_ratio × lr as the run ends", "\"constant\" or \"cosine\"", "actor_rollout_ref.actor.optim.warmup_style (alias: lr_scheduler_type)"),
    d("actor.min_lr_ratio", "the cosine's floor as a fraction of lr", "[0, 1]", "actor_rollout_ref.actor.optim.min_lr_ratio"),
    d("actor.betas", "AdamW's (β₁, β₂)", "two numbers in [0, 1)", "actor_rollout_ref.actor.optim.betas"),
    d("actor.grad_clip", "gradient-norm clip", "> 0", "actor_rollout_ref.actor.grad_clip"),
    opt("actor.ppo_mini_batch_size", "prompts per optimiser step (× rollout.n samples); must divide data.train_batch_size", "prompts", "actor_rollout_ref.actor.ppo_mini_batch_size", "the largest divisor of data.train_batch_size up to 16"),
    opt("actor.ppo_micro_batch_size", "samples per forward/backward pass (gradient accumulation); must divide ppo_mini_batch_size × rollout.n", "samples", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu (alias)", "the largest divisor of ppo_mini_batch_size × rollout.n up to ppo_max_token_len_per_gpu / (data.max_prompt_length + rollout.max_new_tokens)"),
    d("actor.use_dynamic_bsz", "cut micro-batches by a token budget (ppo_max_token_len_per_gpu) instead of ppo_micro_batch_size: consecutive samples while samples × the longest stay within it; bounds activation memory as responses grow", "bool", "actor_rollout_ref.actor.use_dynamic_bsz"),
    d("actor.ppo_max_token_len_per_gpu", "the budget of use_dynamic_bsz: padded tokens per forward/backward (the reference's too; the old-policy pass: twice it); at least max_prompt_length + max_new_tokens", "tokens", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"),
    d("actor.ppo_epochs", "passes over each step's samples", "epochs", "actor_rollout_ref.actor.ppo_epochs"),
    d("actor.loss_mode", "policy loss", "\"vanilla\" (PPO clip), \"gspo\", \"gpg\" (no ratio, no clip), \"cispo\" (clipped, stopped IS weight), \"kl_cov\" (no clip; a KL penalty on the tokens of largest covariance), \"clip_cov\" (PPO clip; a few tokens of large covariance lose their gradient), \"geo_mean\" (GMPO: the geometric mean of the token ratios, clipped in log space) or \"sapo\" (a soft gate of the ratio instead of the clip)", "actor_rollout_ref.actor.policy_loss.loss_mode"),
    d("actor.clip_ratio", "PPO clip ε (both sides unless clip_ratio_low/high are set)", "ratio", "actor_rollout_ref.actor.clip_ratio"),
    opt("actor.clip_ratio_low", "ε_low: the ratio floor is 1 − ε_low", "ratio", "actor_rollout_ref.actor.clip_ratio_low", "clip_ratio"),
    opt("actor.clip_ratio_high", "ε_high: the ratio ceiling is 1 + ε_high (DAPO: 0.28)", "ratio", "actor_rollout_ref.actor.clip_ratio_high", "clip_ratio"),
    d("actor.clip_ratio_c", "dual-clip bound c: for negative advantages the loss is at most −c·A", "> 1", "actor_rollout_ref.actor.clip_ratio_c"),
    d("actor.kl_cov_ratio", "loss_mode = \"kl_cov\": the share of a micro-batch's response tokens, those of largest covariance between advantage and log-probability, that pay the KL penalty", "(0, 1]", "actor_rollout_ref.actor.policy_loss.kl_cov_ratio"),
    d("actor.ppo_kl_coef", "loss_mode = \"kl_cov\": the penalty's coefficient on |log π_θ − log π_old|", "≥ 0", "actor_rollout_ref.actor.policy_loss.ppo_kl_coef"),
    d("actor.clip_cov_ratio", "loss_mode = \"clip_cov\": the share of a micro-batch's response tokens that lose their gradient (at least one per micro-batch, as in verl), drawn (seeded by the optimizer step) among those whose advantage/log-probability covariance lies in (clip_cov_lb, clip_cov_ub)", "(0, 1]", "actor_rollout_ref.actor.policy_loss.clip_cov_ratio"),
    d("actor.clip_cov_lb", "loss_mode = \"clip_cov\": the covariance range's lower end", "< clip_cov_ub", "actor_rollout_ref.actor.policy_loss.clip_cov_lb"),
    d("actor.clip_cov_ub", "loss_mode = \"clip_cov\": the covariance range's upper end", "> clip_cov_lb", "actor_rollout_ref.actor.policy_loss.clip_cov_ub"),
    d("actor.tau_pos", "loss_mode = \"sapo\": the gate's temperature for tokens of positive advantage", "[1e-6, 1e6]", "actor_rollout_ref.actor.tau_pos"),
    d("actor.tau_neg", "loss_mode = \"sapo\": the gate's temperature for the others", "[1e-6, 1e6]", "actor_rollout_ref.actor.tau_neg"),
    d("actor.loss_agg_mode", "how per-token losses become a scalar (gspo and sapo always use seq-mean-token-mean, geo_mean a mean over sequences, as verl)", "\"token-mean\", \"seq-mean-token-sum\", \"seq-mean-token-mean\", \"seq-mean-token-sum-norm\"", "actor_rollout_ref.actor.loss_agg_mode"),
    d("actor.entropy_coeff", "entropy bonus coefficient", "[-1, 1]", "actor_rollout_ref.actor.entropy_coeff"),
    d("actor.use_kl_loss", "add a KL(actor ‖ reference) term to the loss (loads the reference model)", "bool", "actor_rollout_ref.actor.use_kl_loss"),
    d("actor.kl_loss_coef", "coefficient of the KL loss", "≥ 0", "actor_rollout_ref.actor.kl_loss_coef"),
    d("actor.kl_loss_type", "KL estimator of the loss", "\"k1\" (kl), \"abs\", \"k2\" (mse), \"k3\" (low_var_kl)", "actor_rollout_ref.actor.kl_loss_type"),
    // [critic]
    opt("critic.lr", "the value model's learning rate (PPO with algorithm.adv_estimator = \"gae\"; verl's default is 10× its actor's)", "> 0", "critic.optim.lr", "actor.lr"),
    opt("critic.warmup_steps", "its linear warmup (the schedule's shape and the betas are the actor's)", "optimiser steps", "critic.optim.lr_warmup_steps (alias)", "actor.warmup_steps"),
    opt("critic.weight_decay", "its AdamW weight decay", "[0, 1]", "critic.optim.weight_decay", "actor.weight_decay"),
    opt("critic.grad_clip", "its gradient-norm clip", "> 0", "critic.grad_clip", "actor.grad_clip"),
    d("critic.cliprange_value", "the value loss's clip around the values the step started from", "> 0", "critic.cliprange_value"),
    opt("critic.loss_agg_mode", "how the value loss is averaged over tokens", "as actor.loss_agg_mode", "critic.loss_agg_mode", "actor.loss_agg_mode"),
    // [algorithm]
    d("algorithm.adv_estimator", "advantage estimator", "\"grpo\", \"rloo\", \"reinforce_plus_plus\", \"reinforce_plus_plus_baseline\", \"remax\", \"opo\", \"grpo_passk\", \"gpg\", \"gae\" (trains a critic)", "algorithm.adv_estimator"),
    d("algorithm.gamma", "discount (GAE, REINFORCE++)", "[0, 1]", "algorithm.gamma"),
    d("algorithm.lam", "GAE λ", "[0, 1]", "algorithm.lam"),
    d("algorithm.norm_adv_by_std_in_grpo", "divide GRPO advantages by the group's std (false: Dr. GRPO)", "bool", "algorithm.norm_adv_by_std_in_grpo"),
    d("algorithm.use_kl_in_reward", "subtract β·KL(actor ‖ reference) from the reward (loads the reference model)", "bool", "algorithm.use_kl_in_reward"),
    d("algorithm.kl_penalty", "KL estimator of the reward penalty", "\"k1\", \"abs\", \"k2\", \"k3\"", "algorithm.kl_penalty"),
    d("algorithm.kl_ctrl.type", "β controller of the reward penalty", "\"fixed\" or \"adaptive\"", "algorithm.kl_ctrl.type"),
    d("algorithm.kl_ctrl.kl_coef", "β, or its initial value when adaptive", "≥ 0", "algorithm.kl_ctrl.kl_coef"),
    d("algorithm.kl_ctrl.target_kl", "adaptive controller: the KL it aims for", "nats", "algorithm.kl_ctrl.target_kl"),
    d("algorithm.kl_ctrl.horizon", "adaptive controller: its horizon", "samples", "algorithm.kl_ctrl.horizon"),
    opt("algorithm.rollout_correction.rollout_is", "truncated importance sampling between rollout and trainer probabilities", "\"token\" or \"sequence\"", "algorithm.rollout_correction.rollout_is", "off"),
    d("algorithm.rollout_correction.rollout_is_threshold", "the importance-weight cap C", "> 0", "algorithm.rollout_correction.rollout_is_threshold"),
    d("algorithm.overlong_buffer.enable", "DAPO's soft overlong punishment of the training rewards: a response in the last `len` tokens before rollout.max_new_tokens loses up to penalty_factor, linearly (evaluations are not punished)", "bool", "reward_model.overlong_buffer.enable"),
    d("algorithm.overlong_buffer.len", "tokens before the limit over which the punishment grows", "1 to rollout.max_new_tokens", "reward_model.overlong_buffer.len"),
    d("algorithm.overlong_buffer.penalty_factor", "the punishment at the limit (DAPO: 1.0; verl's default 0 punishes nothing)", "≥ 0", "reward_model.overlong_buffer.penalty_factor"),
    d("algorithm.filter_groups.enable", "DAPO's dynamic sampling: a step trains only on prompts whose samples' metric varies (a group that all scored the same has no advantage), drawing generation batches of data.gen_batch_size prompts until it has data.train_batch_size of them", "bool", "algorithm.filter_groups.enable"),
    d("algorithm.filter_groups.metric", "what must vary within a group: acc (right or not: the reward's `acc`, else score ≥ 1), score (before the overlong punishment), seq_reward (after it), seq_final_reward (after the KL penalty; not with use_kl_in_reward), or a number the reward returns beside its score", "\"acc\", \"score\", \"seq_reward\", \"seq_final_reward\" or a reward extra's name", "algorithm.filter_groups.metric"),
    d("algorithm.filter_groups.max_num_gen_batches", "the most generation batches a step may draw before the run stops with an error (the data are too hard or too easy)", "batches; ≤ 0 no limit", "algorithm.filter_groups.max_num_gen_batches"),
    // [reward]
    d("reward.kind", "the reward; \"verl\" picks the rule by each row's data_source as verl's default reward does (openai/gsm8k: numeric after \"####\"; lighteval/MATH: boxed)", "\"exact_match\", \"numeric\", \"boxed\", \"format\", \"weighted\", \"verl\", \"python\" (a verl-style reward function), \"external\"", "reward_model / custom_reward_function (verl picks a Python function; by default by data_source)"),
    d("reward.tolerance", "numeric, boxed: numbers within this are equal", "absolute", ""),
    opt("reward.after", "numeric: read the first number after the last occurrence of this marker (GSM8K: \"####\")", "text", "", "the last number of the completion"),
    d("reward.open", "format: the answer must stand between open…", "text", ""),
    d("reward.close", "format: …and close", "text", ""),
    d("reward.terms", "weighted: Σ weight · reward over these terms; each term's own score is logged under its name in reward/extra and eval/reward_extra", "list of {weight, reward = {kind, …}, name (default: its kind, or a python term's function)}", ""),
    d("reward.path", "python: the file defining the reward function (relative to the working directory)", "path", "custom_reward_function.path"),
    d("reward.name", "python: the function, called as verl calls it: name(data_source=, solution_str=, ground_truth=, extra_info=, **kwargs), returning a number or a dict with \"score\"", "identifier", "custom_reward_function.name"),
    d("reward.kwargs", "python: keyword arguments added to every call", "table", "custom_reward_function.reward_kwargs"),
    d("reward.python", "python: the interpreter that runs the function (a virtual environment's bin/python for one with its imports)", "program", ""),
    d("reward.command", "external: program and arguments of a child process, started once for the run: colo writes a JSON line per sample, {\"id\", \"prompt\", \"completion\", \"ground_truth\", \"row\" (the row's other fields)}, and the child answers each with a line {\"id\", \"score\"} (and optionally \"extra\": {name: number}), in any order", "list of strings", ""),
    d("reward.timeout_s", "external, python: how long to wait for each answer line (python: and for the file to load)", "seconds", ""),
    d("reward.workers", "external, python: processes scoring each batch's samples at once (for rewards that take milliseconds a sample)", "processes", "reward_model.reward_manager = \"prime\" (a process pool)"),
    opt("reward.default_score", "external, python: the score of a sample the command or function failed on", "score", "", "a failure stops the run with an error naming the sample"),
    // [memory]
    d("memory.capacity", "device capacity the memory layer enforces; \"auto\": the device's memory (the built-in model on the CPU: 72 MiB in f32, 44 MiB in bf16; otherwise the machine's memory, or the GPU's)", "\"auto\", bytes, or \"512 MiB\" / \"2 GB\"", ""),
    d("memory.colocation", "how trainer and rollout engine share the device (also spelled `mode`)", "\"naive\", \"restart\", \"sleep\", \"staged\"", ""),
    d("memory.offload_train_param", "while generating, the trainer's parameters go to host memory", "bool", "actor_rollout_ref.actor.fsdp_config.param_offload"),
    d("memory.offload_train_grad", "while generating, the trainer's gradients go to host memory", "bool", ""),
    d("memory.offload_train_optimizer", "while generating, the optimiser state goes to host memory", "bool", "actor_rollout_ref.actor.fsdp_config.optimizer_offload"),
    d("memory.offload_ref", "the reference model may wait in host memory between uses: after every pass with offload_policy \"always\"; with \"as_needed\" only where no step as large has run yet or its peak left no room for it, and at a switch whose engine needs the room", "bool", "actor_rollout_ref.ref.fsdp_config.param_offload"),
    d("memory.offload_policy", "how much a train → rollout switch gives up (sleep, staged): \"as_needed\": the training cache, a kept reference, then what the offload_* flags allow (optimizer, grads, params), only as far as the rollout engine needs the room; \"always\": all of it every switch", "\"as_needed\", \"always\"", ""),
    // [trainer]
    opt("trainer.total_steps", "length of the run; wins over total_epochs", "RL steps", "trainer.total_training_steps (alias)", "total_epochs, or 100 steps when neither is set"),
    opt("trainer.total_epochs", "length of the run in passes over the training prompts (used when total_steps is unset)", "epochs", "trainer.total_epochs", "total_steps decides"),
    d("trainer.save_freq", "checkpoint every this many steps; -1 or 0: only at the end", "steps", "trainer.save_freq"),
    d("trainer.test_freq", "evaluate every this many steps; -1 or 0: only before (val_before_train) and at the end", "steps", "trainer.test_freq"),
    d("trainer.val_before_train", "evaluate the starting checkpoint", "bool", "trainer.val_before_train"),
    d("trainer.val_only", "evaluate model.path on the held-out prompts (an eval record in metrics.jsonl, the generations in validation_data_dir if set) and train nothing; to evaluate a run's checkpoint, set model.path to checkpoints/step-N", "bool", "trainer.val_only (verl loads a resumed checkpoint; colo reads model.path)"),
    d("trainer.resume", "continue from the latest checkpoint in out_dir (also: colo train --resume)", "bool", "trainer.resume_mode = \"auto\""),
    opt("trainer.out_dir", "run directory: metrics.jsonl, pictures, checkpoints/ (colo train --out wins)", "path", "trainer.default_local_dir (alias)", "runs/{project_name}/{experiment_name} when either is set, else runs/colo"),
    opt("trainer.project_name", "the project's name; names the run directory when out_dir is not written", "path component", "trainer.project_name", "none"),
    opt("trainer.experiment_name", "the run's name; names the run directory when out_dir is not written", "path component", "trainer.experiment_name", "none"),
    opt("trainer.logger", "where metrics go: colo always writes the console and metrics.jsonl, so only these two are accepted (other backends are an error)", "\"console\", \"file\" or a list of them", "trainer.logger", "both, always"),
    d("trainer.critic_warmup", "steps at the start that train only the critic, so the actor's first update has learnt values (GAE)", "RL steps", "trainer.critic_warmup (verl updates the actor from step critic_warmup; colo after critic_warmup steps)"),
    opt("trainer.rollout_data_dir", "every step's generations as {step}.jsonl in this directory (a relative path is in the run directory, --out), one line a sample: input (the prompt as the model saw it), output, gts, score (the training reward), step and the reward's other numbers", "path", "trainer.rollout_data_dir", "not written"),
    opt("trainer.validation_data_dir", "every evaluation's greedy generations as {step}.jsonl in this directory (a relative path is in the run directory), as rollout_data_dir's", "path", "trainer.validation_data_dir", "not written"),
    d("trainer.seed", "seed of sampling and initialisation; data.seed defaults to it", "integer", "data.seed, actor_rollout_ref.rollout.seed"),
    d("trainer.device", "where the run computes", "\"cpu\" or \"cuda\"", ""),
    d("trainer.cpu_threads", "on the CPU, threads the trainer's passes split each micro-batch's rows over, each running libtorch with one intra-op thread (many small ops: lanes beat intra-op threads); 0: OMP_NUM_THREADS if set, else one per core", "threads", ""),
    d("trainer.dtype", "dtype of weights and compute; bf16 is mixed precision (gradients, optimiser moments and master weights stay f32); auto: bf16 where the device multiplies bf16 natively (CUDA; a CPU with AVX512_BF16 or AMX-BF16), else f32", "\"auto\", \"f32\" or \"bf16\"", "actor_rollout_ref.model.dtype (alias: model_dtype)"),
    // [cluster]
    opt("cluster.workers", "data-parallel workers, one per device, on Ray (colo-py's controller); 1: this process alone", "devices", "trainer.n_gpus_per_node × trainer.nnodes", "the layout's devices, else 1"),
    opt("cluster.layout", "a layout from `colo plan map` for the run to execute; data-parallel \"1-1-N\" only", "\"p-t-d\"", "", "none"),
    opt("cluster.address", "the Ray cluster to join", "\"auto\" or host:port", "ray_init / RAY_ADDRESS", "a local Ray instance, started and stopped by the run"),
];

/// The raw form of a validated config: every value as written, derived
/// values (`data.seed`, the run length) explicit. One function a section.
pub(crate) fn to_raw(c: &Config) -> RawConfig {
    RawConfig {
        data: raw_data(c),
        model: RawModel {
            path: match &c.model {
                ModelSource::Builtin => None,
                ModelSource::Path(p) => Some(p.clone()),
            },
            enable_gradient_checkpointing: c.actor.gradient_checkpointing,
        },
        rollout: raw_rollout(c),
        actor: raw_actor(c),
        critic: RawCritic {
            lr: Some(c.critic.optim.lr),
            warmup_steps: Some(c.critic.optim.warmup_steps),
            weight_decay: Some(c.critic.optim.weight_decay),
            grad_clip: Some(c.critic.optim.grad_clip),
            cliprange_value: c.critic.cliprange_value,
            loss_agg_mode: Some(c.critic.loss_agg_mode),
        },
        algorithm: raw_algorithm(c),
        reward: c.reward.clone(),
        memory: raw_memory(c),
        trainer: raw_trainer(c),
        cluster: RawCluster {
            workers: Some(c.cluster.workers),
            layout: c.cluster.layout.clone(),
            address: c.cluster.address.clone(),
        },
    }
}

/// `[data]` of [`to_raw`].
fn raw_data(c: &Config) -> RawData {
    let b = &c.batch;
    let defaults = RawConfig::default();
    let paths = |v: &[std::path::PathBuf]| Files::Many(v.to_vec());
    let (train_files, val_files, val_fraction, builtin) = match &c.data.source {
        DataSource::Builtin(t) => (Files::default(), Files::default(), None, t.clone()),
        DataSource::Files { train, val } => {
            let builtin = defaults.data.builtin.clone();
            match val {
                ValSource::Files(v) => (paths(train), paths(v), None, builtin),
                ValSource::Fraction(f) => (paths(train), Files::default(), Some(*f), builtin),
                ValSource::None => (paths(train), Files::default(), None, builtin),
            }
        }
    };
    RawData {
        train_files,
        val_files,
        val_fraction,
        prompt_key: c.data.fields.prompt_key.clone(),
        answer_key: c.data.fields.answer_key.clone(),
        train_batch_size: b.prompts_per_step,
        gen_batch_size: (b.gen_batch_prompts != b.prompts_per_step).then_some(b.gen_batch_prompts),
        max_prompt_length: c.data.max_prompt_length,
        filter_overlong_prompts: c.data.overlong == Overlong::Drop,
        seed: Some(c.data.seed),
        shuffle: c.data.shuffle,
        builtin,
    }
}

/// `[rollout]` of [`to_raw`].
fn raw_rollout(c: &Config) -> RawRollout {
    let (b, defaults) = (&c.batch, RawConfig::default());
    let top_k = |k: Option<usize>| k.map_or(-1, |k| k as i64);
    let (mem_fraction, max_kv_tokens) = match c.rollout.kv {
        KvBudget::Fraction(f) => (f, None),
        KvBudget::Tokens(t) => (defaults.rollout.mem_fraction, Some(t)),
    };
    let (s, vs) = (&c.rollout.sampling, &c.rollout.val_sampling);
    RawRollout {
        n: b.n,
        temperature: s.temperature,
        top_p: s.top_p,
        top_k: top_k(s.top_k),
        max_new_tokens: c.rollout.max_new_tokens,
        mem_fraction,
        max_kv_tokens,
        max_num_seqs: c.rollout.max_num_seqs,
        cpu_threads: c.rollout.cpu_threads.unwrap_or(0),
        enforce_eager: c.rollout.enforce_eager,
        val_kwargs: RawValKwargs {
            n: c.rollout.val_n,
            temperature: vs.temperature,
            top_p: vs.top_p,
            top_k: top_k(vs.top_k),
        },
    }
}

/// `[actor]` of [`to_raw`].
fn raw_actor(c: &Config) -> RawActor {
    let (b, defaults) = (&c.batch, RawConfig::default());
    let p = &c.actor.policy_loss;
    let kl = c.actor.kl_loss.unwrap_or(KlLoss {
        coef: defaults.actor.kl_loss_coef,
        estimator: defaults.actor.kl_loss_type,
    });
    RawActor {
        lr: c.actor.optim.lr,
        warmup_steps: c.actor.optim.warmup_steps,
        weight_decay: c.actor.optim.weight_decay,
        grad_clip: c.actor.optim.grad_clip,
        warmup_style: c.actor.optim.schedule,
        min_lr_ratio: c.actor.optim.min_lr_ratio,
        betas: vec![c.actor.optim.betas.0, c.actor.optim.betas.1],
        ppo_mini_batch_size: Some(b.mini_batch_prompts),
        ppo_micro_batch_size: Some(b.micro_batch_samples),
        use_dynamic_bsz: b.micro_batch_max_tokens.is_some(),
        ppo_max_token_len_per_gpu: b
            .micro_batch_max_tokens
            .unwrap_or(RawActor::default().ppo_max_token_len_per_gpu),
        ppo_epochs: c.actor.ppo_epochs,
        loss_mode: p.loss_mode,
        clip_ratio: p.clip_ratio,
        clip_ratio_low: p.clip_ratio_low,
        clip_ratio_high: p.clip_ratio_high,
        clip_ratio_c: p.clip_ratio_c,
        loss_agg_mode: p.loss_agg_mode,
        kl_cov_ratio: p.kl_cov_ratio,
        ppo_kl_coef: p.ppo_kl_coef,
        clip_cov_ratio: p.clip_cov_ratio,
        clip_cov_lb: p.clip_cov_lb,
        clip_cov_ub: p.clip_cov_ub,
        tau_pos: p.tau_pos,
        tau_neg: p.tau_neg,
        entropy_coeff: c.actor.entropy_coeff,
        use_kl_loss: c.actor.kl_loss.is_some(),
        kl_loss_coef: kl.coef,
        kl_loss_type: kl.estimator,
    }
}

/// `[algorithm]` of [`to_raw`].
fn raw_algorithm(c: &Config) -> RawAlgorithm {
    let defaults = RawConfig::default();
    let (kl_penalty, kl_ctrl): (KlEstimator, KlControlConfig) = match &c.algorithm.kl_in_reward {
        Some(k) => (k.estimator, k.ctrl.clone()),
        None => (defaults.algorithm.kl_penalty, defaults.algorithm.kl_ctrl),
    };
    let adv = &c.algorithm.advantage;
    RawAlgorithm {
        adv_estimator: adv.adv_estimator,
        gamma: adv.gamma,
        lam: adv.lam,
        norm_adv_by_std_in_grpo: adv.norm_adv_by_std_in_grpo,
        use_kl_in_reward: c.algorithm.kl_in_reward.is_some(),
        kl_penalty,
        kl_ctrl,
        rollout_correction: RawRolloutCorrection {
            rollout_is: c.algorithm.rollout_correction.rollout_is,
            rollout_is_threshold: c.algorithm.rollout_correction.rollout_is_threshold,
        },
        overlong_buffer: match c.algorithm.overlong_buffer {
            Some(b) => RawOverlongBuffer {
                enable: true,
                len: b.len,
                penalty_factor: b.penalty_factor,
            },
            None => RawOverlongBuffer::default(),
        },
        filter_groups: match &c.algorithm.filter_groups {
            Some(f) => RawFilterGroups {
                enable: true,
                metric: f.metric.name().to_owned(),
                max_num_gen_batches: f.max_gen_batches.map_or(0, |m| m as i64),
            },
            None => RawFilterGroups::default(),
        },
    }
}

/// `[memory]` of [`to_raw`].
fn raw_memory(c: &Config) -> RawMemory {
    RawMemory {
        capacity: match c.memory.capacity {
            Capacity::Auto => RawCapacity::Text("auto".into()),
            Capacity::Bytes(b) => capacity_text(b),
        },
        colocation: c.memory.colocation,
        offload_train_param: c.memory.offload_train_param,
        offload_train_grad: c.memory.offload_train_grad,
        offload_train_optimizer: c.memory.offload_train_optimizer,
        offload_ref: c.memory.offload_ref,
        offload_policy: c.memory.offload_policy,
    }
}

/// `[trainer]` of [`to_raw`].
fn raw_trainer(c: &Config) -> RawTrainer {
    let freq = |f: Option<usize>| f.map_or(-1, |f| f as i64);
    let (total_steps, total_epochs) = match c.trainer.length {
        RunLength::Steps(s) => (Some(s), None),
        RunLength::Epochs(e) => (None, Some(e)),
    };
    RawTrainer {
        total_steps,
        total_epochs,
        save_freq: freq(c.trainer.save_freq),
        test_freq: freq(c.trainer.test_freq),
        val_before_train: c.trainer.val_before_train,
        val_only: c.trainer.val_only,
        resume: c.trainer.resume,
        out_dir: Some(c.trainer.out_dir.clone()),
        project_name: c.trainer.project_name.clone(),
        experiment_name: c.trainer.experiment_name.clone(),
        logger: c.trainer.logger.clone().map(Loggers::Many),
        critic_warmup: c.trainer.critic_warmup,
        rollout_data_dir: c.trainer.rollout_data_dir.clone(),
        validation_data_dir: c.trainer.validation_data_dir.clone(),
        seed: c.trainer.seed,
        device: c.trainer.device,
        dtype: c.trainer.dtype,
        cpu_threads: c.trainer.cpu_threads.unwrap_or(0),
    }
}

/// `"24 GiB"` where the bytes are a whole number of a binary unit, else the
/// number of bytes: either reads back to the same capacity.
fn capacity_text(b: u64) -> RawCapacity {
    for (unit, shift) in [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if b >= 1 << shift && b.is_multiple_of(1 << shift) {
            return RawCapacity::Text(format!("{} {unit}", b >> shift));
        }
    }
    RawCapacity::Bytes(b)
}

/// The documented TOML text of `c` (see the module doc).
pub(crate) fn print(c: &Config) -> std::result::Result<String, String> {
    let table = |raw: &RawConfig| Table::try_from(raw).map_err(|e| e.to_string());
    let values = table(&to_raw(c))?;
    let defaults = table(&RawConfig::default())?;
    let mut out = String::from(
        "# colo train: the resolved run configuration. Every key is shown with\n\
         # its meaning, unit, default and verl's name; a file needs only the keys\n\
         # it changes. Run it with `colo train --config FILE`.\n#\n",
    );
    for line in c.summary().lines() {
        let _ = writeln!(out, "#   {line}");
    }
    // The sections in the order of the file's documentation.
    let mut sections: Vec<&String> = values.keys().collect();
    sections.sort_by_key(|s| {
        DOCS.iter()
            .position(|d| d.key.starts_with(&format!("{s}.")))
    });
    for section in sections {
        let Some(Value::Table(t)) = values.get(section) else {
            return Err(format!("`{section}` is not a table"));
        };
        write_table(&mut out, section, t, &defaults)?;
    }
    Ok(out)
}

/// `[path]`, its keys in [`DOCS`] order (unset optional keys as comments),
/// then its sub-tables.
fn write_table(
    out: &mut String,
    path: &str,
    t: &Table,
    defaults: &Table,
) -> std::result::Result<(), String> {
    let _ = writeln!(out, "\n[{path}]");
    let prefix = format!("{path}.");
    // `(index in DOCS, the line "key = value")`; `None` for an unset key.
    let mut rows: Vec<(usize, Option<String>)> = Vec::new();
    for (k, v) in t {
        if matches!(v, Value::Table(_)) {
            continue;
        }
        let full = format!("{prefix}{k}");
        if free_form(path) {
            rows.push((usize::MAX, Some(format!("{k} = {}", value_text(v)))));
            continue;
        }
        let i = DOCS
            .iter()
            .position(|d| d.key == full)
            .ok_or_else(|| format!("`{full}` has no documentation in config/print.rs"))?;
        rows.push((i, Some(format!("{k} = {}", value_text(v)))));
    }
    // Optional keys that are unset, at their place in DOCS order.
    rows.extend(
        DOCS.iter()
            .enumerate()
            .filter(|(_, d)| {
                d.key
                    .strip_prefix(&prefix)
                    .is_some_and(|k| !k.contains('.') && !t.contains_key(k))
                    && !d.unset.is_empty()
                    && relevant(d.key, t)
            })
            .map(|(i, _)| (i, None)),
    );
    rows.sort_by_key(|r| r.0);
    for (i, line) in rows {
        let Some(d) = DOCS.get(i) else {
            let _ = writeln!(out, "{}", line.unwrap_or_default());
            continue;
        };
        let default = lookup(defaults, d.key)
            .map(value_text)
            .or_else(|| reward_default(d.key));
        let _ = writeln!(out, "# {}", comment(d, default.as_deref()));
        match line {
            Some(line) => {
                let _ = writeln!(out, "{line}");
            }
            None => {
                let k = &d.key[prefix.len()..];
                let _ = writeln!(out, "# {k} = …  (unset)");
            }
        }
    }
    for (k, v) in t {
        if let Value::Table(sub) = v {
            write_table(out, &format!("{path}.{k}"), sub, defaults)?;
        }
    }
    Ok(())
}

/// A value as TOML, a float far from 1 in exponent form (`1e300`, not a
/// 1 and 300 zeros; see [`super::num::Num`]); the rest as the toml crate
/// writes it (`0.0` stays a float).
fn value_text(v: &Value) -> String {
    match v {
        Value::Float(f) if super::num::Num::far_from_one(*f) => super::num::Num(*f).to_string(),
        _ => v.to_string(),
    }
}

/// A table whose keys are the user's (the python reward's `kwargs`),
/// documented as a whole.
fn free_form(path: &str) -> bool {
    path == "reward.kwargs"
}

/// Unset reward keys are shown only for the reward kind that has them.
fn relevant(key: &str, t: &Table) -> bool {
    let kind = t.get("kind").and_then(Value::as_str);
    match key {
        "reward.after" => kind == Some("numeric"),
        "reward.default_score" => matches!(kind, Some("external" | "python")),
        _ => true,
    }
}

/// The default of a reward key that the default reward (`exact_match`)
/// does not have: serde's, read from the smallest spec of a kind with it
/// (`timeout_s` = 30, `workers` = 1 for `external` and `python`).
fn reward_default(key: &str) -> Option<String> {
    let name = key.strip_prefix("reward.")?;
    const SMALLEST: [&str; 3] = [
        "kind = \"numeric\"",
        "kind = \"external\"\ncommand = [\"x\"]",
        "kind = \"python\"\npath = \"x.py\"",
    ];
    SMALLEST.iter().find_map(|text| {
        let spec: crate::reward::RewardSpec = toml::from_str(text).ok()?;
        let table = Table::try_from(&spec).ok()?;
        table.get(name).map(value_text)
    })
}

/// `meaning [unit]. Default: …. verl: …`
fn comment(d: &Doc, default: Option<&str>) -> String {
    let mut s = d.meaning.to_owned();
    if !d.unit.is_empty() {
        let _ = write!(s, " [{}]", d.unit);
    }
    match (default, d.unset.is_empty()) {
        (Some(v), _) => {
            let _ = write!(s, ". Default: {v}");
        }
        (None, false) => {
            let _ = write!(s, ". Default: unset ({})", d.unset);
        }
        (None, true) => {}
    }
    if d.key == "data.seed" {
        s.push_str(". Default: trainer.seed");
    }
    if !d.verl.is_empty() {
        let _ = write!(s, ". verl: {}", d.verl);
    }
    s
}

/// The value at a dotted path.
fn lookup<'a>(t: &'a Table, path: &str) -> Option<&'a Value> {
    let mut parts = path.split('.');
    let mut v = t.get(parts.next()?)?;
    for p in parts {
        v = v.as_table()?.get(p)?;
    }
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_documented_key_is_a_key_and_none_twice() {
        let mut seen = std::collections::HashSet::new();
        for d in DOCS {
            assert!(seen.insert(d.key), "{} twice", d.key);
            assert!(!d.meaning.is_empty(), "{}", d.key);
        }
        // Each key, set alone, is accepted (or refused for its value, not
        // as an unknown field).
        for d in DOCS {
            let (section, key) = d.key.rsplit_once('.').unwrap();
            let text = format!("[{section}]\n{key} = \"?\"\n");
            let e = Config::from_toml(&text, std::path::Path::new("t.toml"));
            if let Err(e) = e {
                assert!(!e.to_string().contains("unknown field"), "{}: {e}", d.key);
            }
        }
    }

    #[test]
    fn capacities_print_in_whole_units_or_bytes() {
        assert_eq!(capacity_text(24 << 30), RawCapacity::Text("24 GiB".into()));
        assert_eq!(
            capacity_text(1536 << 20),
            RawCapacity::Text("1536 MiB".into())
        );
        assert_eq!(capacity_text(1000), RawCapacity::Bytes(1000));
    }
}

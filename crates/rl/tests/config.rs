//! The run configuration: defaults, verl names, and errors with line and field.

mod common;

use std::path::Path;

use colo_algo::{AdvEstimator, KlEstimator, LossAggMode};
use colo_rl::config::{
    Capacity, Colocation, DataSource, FilterMetric, KvBudget, RunLength, Sharding, ValSource,
};
use colo_rl::{Config, Error, RewardSpec};
use common::TempDir;

fn parse(text: &str) -> Result<Config, Error> {
    Config::from_toml(text, Path::new("run.toml"))
}

/// `(line, field, message)` of a config error.
fn err(text: &str) -> (Option<usize>, String, String) {
    match parse(text).unwrap_err() {
        Error::Config {
            line,
            field,
            message,
            ..
        } => (line, field, message),
        other => panic!("not a config error: {other}"),
    }
}

#[test]
fn empty_file_is_the_builtin_run() {
    let c = parse("").unwrap();
    assert_eq!(c, Config::builtin());
    assert!(matches!(c.data.source(), DataSource::Builtin(_)));
    assert_eq!(c.model.path, None);
    assert_eq!(c.reward, RewardSpec::ExactMatch {});
    assert_eq!(c.memory.colocation, Colocation::Staged);
    assert_eq!(c.algorithm.adv_estimator, AdvEstimator::Grpo);
    let b = c.batch;
    assert_eq!(
        (
            b.samples_per_step,
            b.mini_batch_samples,
            b.mini_batches_per_step,
            b.micro_batches_per_mini_batch
        ),
        (256, 128, 2, 1)
    );
    assert_eq!(c.total_steps(8000), 100);
    let s = c.summary();
    assert!(s.contains("32 prompts × n 8 = 256 samples"), "{s}");
    assert!(
        s.contains("2 mini-batches of 16 prompts (128 samples)"),
        "{s}"
    );
    assert!(s.contains("staged colocation"), "{s}");
}

#[test]
fn a_verl_like_user_config() {
    let c = parse(
        r#"
[data]
train_files = "train.jsonl"
val_fraction = 0.05
prompt_key = "question"
answer_key = "reward_model.ground_truth"
train_batch_size = 64

[model]
path = "/models/qwen"

[rollout]
n = 4
top_k = 50
gpu_memory_utilization = 0.6
response_length = 512

[actor]
lr = 1e-6
ppo_mini_batch_size = 32
ppo_micro_batch_size_per_gpu = 16
ppo_epochs = 2
clip_ratio_high = 0.28
loss_agg_mode = "seq-mean-token-sum-norm"
kl_loss_type = "low_var_kl"

[algorithm]
adv_estimator = "rloo"
kl_ctrl = { type = "adaptive", kl_coef = 0.05 }

[reward]
kind = "numeric"
after = "Answer:"

[memory]
capacity = "24GiB"
colocation = "sleep"

[trainer]
total_epochs = 3
save_freq = -1
default_local_dir = "runs/x"
"#,
    )
    .unwrap();
    assert_eq!(
        c.data.source(),
        DataSource::Files {
            train: vec!["train.jsonl".into()],
            val: ValSource::Fraction(0.05)
        }
    );
    assert_eq!(c.data.answer_key, "reward_model.ground_truth");
    assert_eq!(c.model.path, Some("/models/qwen".into()));
    assert_eq!(c.rollout.sampling().top_k, Some(50));
    assert_eq!(c.rollout.kv(), KvBudget::Fraction(0.6));
    assert_eq!(c.rollout.max_new_tokens, 512);
    assert_eq!(c.actor.policy_loss().clip_ratio_high, Some(0.28));
    assert_eq!(
        c.actor.policy_loss().loss_agg_mode,
        LossAggMode::SeqMeanTokenSumNorm
    );
    assert!(c.actor.use_kl_loss);
    assert_eq!(c.actor.kl_loss_type, KlEstimator::K3);
    assert_eq!(c.memory.capacity, Capacity::Bytes(24 << 30));
    assert_eq!(c.trainer.length(), RunLength::Epochs(3));
    assert_eq!(c.trainer.save_every(), None);
    assert_eq!(c.total_steps(1000), 3 * 15);
    assert_eq!(
        (
            c.batch.samples_per_step,
            c.batch.mini_batch_samples,
            c.batch.micro_batches_per_mini_batch,
            c.batch.optimizer_steps_per_step
        ),
        (256, 128, 8, 4)
    );
}

/// verl's `max_num_seqs`: 1,024 by default; zero is refused by name.
#[test]
fn max_num_seqs_is_verls_and_must_be_positive() {
    assert_eq!(parse("").unwrap().rollout.max_num_seqs, 1024);
    let c = parse("[rollout]\nmax_num_seqs = 64\n").unwrap();
    assert_eq!(c.rollout.max_num_seqs, 64);
    let (_, field, msg) = err("[rollout]\nmax_num_seqs = 0\n");
    assert_eq!(field, "rollout.max_num_seqs", "{msg}");
}

/// vLLM's and verl's `enforce_eager`: CUDA graphs unless it is set, and
/// it reaches the rollout engine's configuration.
#[test]
fn enforce_eager_defaults_to_graphs() {
    assert!(!parse("").unwrap().rollout.enforce_eager);
    let c = parse("[rollout]\nenforce_eager = true\n").unwrap();
    assert!(c.rollout.enforce_eager);
    let (_, field, msg) = err("[rollout]\nenforce_eager = 1\n");
    assert_eq!(field, "rollout.enforce_eager", "{msg}");
}

#[test]
fn a_bad_type_names_line_and_field() {
    let (line, field, msg) = err("[data]\nseed = 3\ntrain_batch_size = \"many\"\n");
    assert_eq!(
        (line, field.as_str()),
        (Some(3), "data.train_batch_size"),
        "{msg}"
    );
    let e = parse("[data]\nseed = 3\ntrain_batch_size = \"many\"\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("run.toml:3: `data.train_batch_size`: invalid type"),
        "{e}"
    );
}

#[test]
fn unknown_keys_are_errors_with_their_line() {
    let (line, field, msg) = err("[rollout]\nn = 4\ntempreature = 0.7\n");
    assert_eq!(
        (line, field.as_str()),
        (Some(3), "rollout.tempreature"),
        "{msg}"
    );
    assert!(msg.contains("unknown field `tempreature`"), "{msg}");

    let (line, field, msg) = err("[trainer]\n\n[algorithms]\nadv_estimator = \"grpo\"\n");
    assert_eq!((line, field.as_str()), (Some(3), "algorithms"), "{msg}");
    assert!(msg.contains("unknown field `algorithms`"), "{msg}");

    // `[reward]` is read as a whole (its `kind` picks the fields): the line
    // of the typo is found by its name.
    let (line, field, msg) = err("[reward]\nkind = \"numeric\"\ntolerence = 0.1\n");
    assert_eq!(
        (line, field.as_str()),
        (Some(3), "reward.tolerence"),
        "{msg}"
    );
    assert!(msg.contains("expected `tolerance` or `after`"), "{msg}");
}

/// A setting of another reward kind says which kinds have it, not that
/// "there are no fields" nor that colo keeps it as itself.
#[test]
fn a_setting_of_another_reward_kind_names_its_kinds() {
    let (line, field, msg) = err("[reward]\nkind = \"exact_match\"\nafter = \"####\"\n");
    assert_eq!((line, field.as_str()), (Some(3), "reward.after"), "{msg}");
    assert!(
        msg.contains(
            "unknown field `after`: `reward.after` is a setting of reward.kind = \"numeric\" only"
        ),
        "{msg}"
    );
    assert!(
        !msg.contains("there are no fields") && !msg.contains("colo keeps"),
        "{msg}"
    );
    let (_, _, msg) = err("[reward]\nkind = \"numeric\"\ndefault_score = 0.0\n");
    assert!(
        msg.contains("is a setting of reward.kind = \"external\" or \"python\" only"),
        "{msg}"
    );
    // A key no kind has keeps serde's list of the kind's own keys.
    let (_, _, msg) = err("[reward]\nkind = \"exact_match\"\nfoo = 1\n");
    assert!(
        msg.contains("unknown field `foo`, expected no other key")
            && !msg.contains("there are no fields"),
        "{msg}"
    );
}

/// A verl user writes verl's names in verl's places: the error says where
/// colo keeps them.
#[test]
fn unknown_keys_say_where_colo_keeps_them() {
    let (line, field, msg) = err("[data]
train_batch_size = 4
max_response_length = 64
");
    assert_eq!(
        (line, field.as_str()),
        (Some(3), "data.max_response_length")
    );
    assert!(
        msg.contains("colo keeps it as `rollout.max_new_tokens`"),
        "verl's data.max_response_length: {msg}"
    );
    let (_, _, msg) = err("[actor.optim]
lr = 1e-6
");
    assert!(
        msg.contains("colo keeps it as `actor.lr`, `actor.warmup_steps`, `actor.weight_decay`"),
        "verl's actor.optim.*: {msg}"
    );
    let (_, _, msg) = err("[critic.optim]
lr = 1e-5
");
    assert!(
        msg.contains("colo keeps it as `critic.lr`, `critic.warmup_steps`, `critic.weight_decay`"),
        "verl's critic.optim.*: {msg}"
    );
    let (_, _, msg) = err("[custom_reward_function]
path = \"my_reward.py\"
");
    assert!(
        msg.contains(
            "colo keeps it as `reward.kind`, `reward.path`, `reward.name`, `reward.kwargs`"
        ),
        "verl's custom_reward_function: {msg}"
    );
    let (_, _, msg) = err("[trainer]
total_training_step = 5
");
    assert!(
        !msg.contains("colo keeps") && msg.contains("`colo train --print-config` writes every key"),
        "a name colo does not know at all: {msg}"
    );
    let (_, _, msg) = err("[actor_rollout_ref]
hybrid_engine = true
");
    assert!(
        msg.ends_with(". `colo train --print-config` writes every key with verl's name beside it"),
        "verl's whole actor_rollout_ref tree maps to too many keys to list: {msg}"
    );
}

#[test]
fn bad_enum_values_list_the_choices() {
    let (line, field, msg) = err("[algorithm]\nadv_estimator = \"ppo\"\n");
    assert_eq!((line, field.as_str()), (Some(2), "algorithm.adv_estimator"));
    assert!(msg.contains("grpo"), "{msg}");
    let (line, _, msg) = err("[memory]\ncolocation = \"lazy\"\n");
    assert_eq!(line, Some(2));
    assert!(msg.contains("staged"), "{msg}");
    // A choice written as a number: toml's "wanted string or table", with
    // the choices.
    let (line, field, msg) = err("[actor]\nwarmup_style = 3\n");
    assert_eq!((line, field.as_str()), (Some(2), "actor.warmup_style"));
    assert_eq!(msg, "wanted a string: \"constant\" or \"cosine\"");
    let (_, field, msg) = err("[trainer]\ndtype = 16\n");
    assert_eq!(field, "trainer.dtype");
    assert!(msg.contains("\"bf16\""), "{msg}");
    // Under verl's other name too.
    let (_, _, msg) = err("[actor]\nlr_scheduler_type = 3\n");
    assert!(msg.contains("\"cosine\""), "{msg}");
    // Both names at once: said, with the other name.
    let (_, _, msg) = err("[actor]\nwarmup_style = \"cosine\"\nlr_scheduler_type = \"cosine\"\n");
    assert!(msg.contains("also as `lr_scheduler_type`"), "{msg}");
    let (_, _, msg) = err("[rollout]\nmax_new_tokens = 4\nresponse_length = 4\n");
    assert!(
        msg.contains("`response_length` or `max_response_length`"),
        "{msg}"
    );
    // serde's Rust type names are said in words.
    let (_, field, msg) = err("[data]\ngen_batch_size = -2\n");
    assert_eq!(field, "data.gen_batch_size");
    assert!(
        msg.contains("a whole number ≥ 0") && !msg.contains("usize"),
        "{msg}"
    );
}

#[test]
fn malformed_toml_gives_the_line() {
    let (line, _, _) = err("[actor]\nlr = 1e-4\nweight_decay = = 0.1\n");
    assert_eq!(line, Some(3));
}

#[test]
fn batch_sizes_are_checked_against_each_other() {
    let (line, field, msg) =
        err("[data]\ntrain_batch_size = 30\n[actor]\nppo_mini_batch_size = 16\n");
    assert_eq!(
        (line, field.as_str()),
        (Some(4), "actor.ppo_mini_batch_size")
    );
    assert!(
        msg.contains("16 prompts must divide data.train_batch_size (30 prompts)"),
        "{msg}"
    );

    let (line, field, msg) = err("[rollout]\nn = 3\n[actor]\nppo_micro_batch_size = 32\n");
    assert_eq!(
        (line, field.as_str()),
        (Some(4), "actor.ppo_micro_batch_size")
    );
    assert!(
        msg.contains("ppo_mini_batch_size 16 × rollout.n 3 = 48 samples"),
        "{msg}"
    );

    let (line, field, _) = err("[rollout]\nn = 1\n");
    assert_eq!((line, field.as_str()), (Some(2), "rollout.n"));
    assert!(parse("[rollout]\nn = 1\n[algorithm]\nadv_estimator = \"reinforce_plus_plus\"\n[actor]\nppo_micro_batch_size = 16\n").is_ok());
}

/// Unset mini- and micro-batch sizes follow their defaults (16 prompts; as
/// many samples of the longest allowed length as the token budget
/// `ppo_max_token_len_per_gpu` holds) down to the largest size that
/// divides the batch they cut: a user's first small config runs instead of
/// failing on values it never wrote; `--print-config` writes what was
/// chosen.
#[test]
fn unset_batch_sizes_fit_the_batch_they_cut() {
    let cases = [
        // (file, mini-batch prompts, micro-batch samples)
        // 16,384 tokens hold 234 samples of 64 + 6 tokens: the whole
        // mini-batch of 128.
        ("", 16, 128),
        ("[data]\ntrain_batch_size = 4\n[rollout]\nn = 4\n", 4, 16),
        ("[data]\ntrain_batch_size = 30\n", 15, 120),
        ("[rollout]\nn = 3\n", 16, 48),
        // 1,024 + 1,024 tokens: 8 samples in the budget.
        (
            "[data]\nmax_prompt_length = 1024\n[rollout]\nmax_new_tokens = 1024\n",
            16,
            8,
        ),
        // 4,480 tokens: 64 samples of 70.
        ("[actor]\nppo_max_token_len_per_gpu = 4480\n", 16, 64),
        // A budget shorter than one sample still cuts one at a time.
        ("[actor]\nppo_max_token_len_per_gpu = 10\n", 16, 1),
        (
            "[data]\ntrain_batch_size = 7\n[rollout]\nn = 2\n[actor]\nppo_micro_batch_size = 7\n",
            7,
            7,
        ),
        (
            "[data]\ntrain_batch_size = 8\n[actor]\nppo_mini_batch_size = 2\n",
            2,
            16,
        ),
    ];
    for (text, mini, micro) in cases {
        let c = parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert_eq!(
            (c.batch.mini_batch_prompts, c.batch.micro_batch_samples),
            (mini, micro),
            "{text:?}"
        );
        let printed = c.to_toml().unwrap();
        assert!(
            printed.contains(&format!("ppo_mini_batch_size = {mini}"))
                && printed.contains(&format!("ppo_micro_batch_size = {micro}")),
            "{printed}"
        );
    }
}

/// verl's `model.enable_gradient_checkpointing` reaches the actor's config
/// (and `--print-config` shows it).
#[test]
fn gradient_checkpointing_is_read_from_the_model_section() {
    assert!(!parse("").unwrap().model.enable_gradient_checkpointing);
    let c = parse("[model]\nenable_gradient_checkpointing = true\n").unwrap();
    assert!(c.model.enable_gradient_checkpointing);
    let toml = c.to_toml().unwrap();
    assert!(
        toml.contains("enable_gradient_checkpointing = true"),
        "{toml}"
    );
    let (line, field, _) = err("[model]\nenable_gradient_checkpointing = 1\n");
    assert_eq!(
        (line, field.as_str()),
        (Some(2), "model.enable_gradient_checkpointing")
    );
}

/// verl's `use_dynamic_bsz`: a token budget replaces the micro-batch's
/// sample count (which then need not divide anything), and must hold the
/// longest sample.
#[test]
fn a_token_budget_replaces_the_micro_batch_size() {
    let c = parse("[rollout]\nn = 3\n[actor]\nppo_micro_batch_size = 32\nuse_dynamic_bsz = true\nppo_max_token_len_per_gpu = 4096\n").unwrap();
    assert_eq!(c.batch.micro_batch_max_tokens, Some(4096));
    assert_eq!(c.batch.micro_split(), colo_train::Split::Tokens(4096));
    assert!(
        c.summary().contains("within 4096 padded tokens"),
        "{}",
        c.summary()
    );
    let rows = parse("").unwrap();
    assert_eq!(rows.batch.micro_split(), colo_train::Split::Rows(128));

    let (line, field, msg) = err("[data]\nmax_prompt_length = 100\n[rollout]\nmax_new_tokens = 50\n[actor]\nuse_dynamic_bsz = true\nppo_max_token_len_per_gpu = 120\n");
    assert_eq!(
        (line, field.as_str()),
        (Some(7), "actor.ppo_max_token_len_per_gpu")
    );
    assert!(
        msg.contains("120 tokens") && msg.contains("= 150 tokens"),
        "{msg}"
    );
}

#[test]
fn bad_values_name_their_field() {
    for (text, want_field, want_line) in [
        ("[actor]\nlr = -1.0\n", "actor.lr", Some(2)),
        (
            "[actor]\nclip_ratio_low = 1.5\n",
            "actor.clip_ratio_low",
            Some(2),
        ),
        ("[rollout]\ntop_p = 0.0\n", "rollout.top_p", Some(2)),
        (
            "[rollout.val_kwargs]\ntemperature = -1.0\n",
            "rollout.val_kwargs.temperature",
            Some(2),
        ),
        (
            "[memory]\ncapacity = \"12 parsecs\"\n",
            "memory.capacity",
            Some(2),
        ),
        (
            "[data]\nval_files = [\"a.jsonl\"]\n",
            "data.train_files",
            None,
        ),
        (
            "[reward]\nkind = \"format\"\nopen = \"\"\nclose = \"x\"\n",
            "reward.open",
            Some(3),
        ),
        (
            "[data.builtin]\nmax_operand = 9\n",
            "data.builtin.train_size",
            None,
        ),
        (
            "[trainer]\ntotal_steps = 0\n",
            "trainer.total_steps",
            Some(2),
        ),
        (
            "[algorithm.overlong_buffer]\nenable = true\n",
            "algorithm.overlong_buffer.len",
            None,
        ),
        (
            "[rollout]\nmax_new_tokens = 8\n[algorithm.overlong_buffer]\nenable = true\nlen = 9\n",
            "algorithm.overlong_buffer.len",
            Some(5),
        ),
        (
            "[algorithm.overlong_buffer]\nenable = true\nlen = 2\npenalty_factor = -1.0\n",
            "algorithm.overlong_buffer.penalty_factor",
            Some(4),
        ),
    ] {
        let (line, field, msg) = err(text);
        assert_eq!(
            (field.as_str(), line),
            (want_field, want_line),
            "{text}: {msg}"
        );
    }
}

/// Open-ended bounds are said in words, not as the extremes of a float
/// (`grad_clip = 0` once printed a 300-digit range).
#[test]
fn open_ended_bounds_read_as_written() {
    for (text, want) in [
        (
            "[actor]\ngrad_clip = 0.0\n",
            "must be a finite number > 0, got 0",
        ),
        (
            "[actor]\nlr = nan\n",
            "must be a finite number > 0, got NaN",
        ),
        (
            "[actor]\nkl_loss_coef = -0.5\n",
            "must be a finite number ≥ 0, got -0.5",
        ),
        (
            "[algorithm.rollout_correction]\nrollout_is_threshold = inf\n",
            "must be a finite number > 0, got inf",
        ),
    ] {
        let (_, _, msg) = err(text);
        assert_eq!(msg, want, "{text}");
    }
}

#[test]
fn capacities_parse_with_units() {
    for (text, want) in [
        ("capacity = \"auto\"", Capacity::Auto),
        ("capacity = 1048576", Capacity::Bytes(1 << 20)),
        ("capacity = \"512MiB\"", Capacity::Bytes(512 << 20)),
        ("capacity = \"1.5 GB\"", Capacity::Bytes(1_500_000_000)),
    ] {
        let c = parse(&format!("[memory]\n{text}\n")).unwrap();
        assert_eq!(c.memory.capacity, want, "{text}");
    }
}

#[test]
fn bad_capacities_say_what_was_expected() {
    for (text, want) in [
        (
            "\"12 parsecs\"",
            "expected \"auto\" or a size like \"512MiB\"",
        ),
        ("\"-1GiB\"", "expected \"auto\" or a size like \"512MiB\""),
        ("\"0 MiB\"", "must be positive"),
        ("0", "must be positive"),
        ("\"99999999999 TiB\"", "is too large"),
    ] {
        let (line, field, msg) = err(&format!("[memory]\ncapacity = {text}\n"));
        assert_eq!((line, field.as_str()), (Some(2), "memory.capacity"));
        assert!(msg.contains(want), "{text}: {msg}");
    }
}

#[test]
fn from_file_reads_or_names_the_missing_file() {
    let dir = TempDir::new("cfg");
    let p = dir.write("run.toml", "[trainer]\ntotal_steps = 7\n");
    assert_eq!(
        Config::from_file(&p).unwrap().trainer.length(),
        RunLength::Steps(7)
    );
    let e = Config::from_file(&dir.0.join("nope.toml")).unwrap_err();
    assert!(e.to_string().starts_with("config file not found:"), "{e}");
    let e = Config::from_file(&dir.0).unwrap_err().to_string();
    assert!(e.ends_with("a directory, not a config file (TOML)"), "{e}");
}

/// A CUDA run is refused where libtorch sees no GPU, naming the key's line,
/// but it can still be read to be planned.
#[test]
fn a_cuda_run_needs_a_gpu_to_run_not_to_plan() {
    let dir = TempDir::new("cfg");
    let p = dir.write(
        "run.toml",
        "[trainer]
total_steps = 7
device = \"cuda\"
",
    );
    let (planned, text) = Config::from_file_to_plan(&p).unwrap();
    assert_eq!(planned.trainer.device, colo_rl::config::Device::Cuda);
    assert!(text.contains("device = \"cuda\""));
    match tch::Cuda::is_available() {
        true => assert_eq!(
            Config::from_file(&p).unwrap().trainer.device,
            planned.trainer.device
        ),
        false => {
            let e = Config::from_file(&p).unwrap_err().to_string();
            assert!(
                e.contains(
                    "run.toml:3: `trainer.device`: is \"cuda\", but libtorch sees no CUDA device"
                ),
                "{e}"
            );
        }
    }
}

#[test]
fn a_cluster_must_split_every_step_into_whole_prompts() {
    let c = parse("[cluster]\nworkers = 4\naddress = \"auto\"\n").unwrap();
    assert_eq!(c.cluster.workers(), 4);
    assert_eq!(c.cluster.address.as_deref(), Some("auto"));
    assert_eq!(
        parse("").unwrap().cluster.workers(),
        1,
        "no [cluster]: one device"
    );

    // The built-in 32 prompts per step over 3 workers.
    let (line, field, msg) = err("[cluster]\nworkers = 3\n");
    assert_eq!(
        (line, field.as_str()),
        (Some(2), "cluster.workers"),
        "{msg}"
    );
    assert!(
        msg.contains("do not divide data.train_batch_size = 32"),
        "{msg}"
    );
    let (_, field, msg) =
        err("[actor]\nppo_mini_batch_size = 2\nppo_micro_batch_size = 8\n[cluster]\nworkers = 4\n");
    assert_eq!(field, "cluster.workers");
    assert!(msg.contains("actor.ppo_mini_batch_size = 2"), "{msg}");
    let (_, field, _) = err("[cluster]\nworkers = 0\n");
    assert_eq!(field, "cluster.workers");
    let (_, field, msg) = err("[cluster]\nworkers = 2\naddress = \"nowhere\"\n");
    assert_eq!(field, "cluster.address", "{msg}");
}

#[test]
fn a_layout_from_colo_plan_map_sets_the_workers_or_is_refused() {
    let c = parse("[cluster]\nlayout = \"1-1-4\"\n").unwrap();
    assert_eq!(
        (c.cluster.workers(), c.cluster.layout.as_deref()),
        (4, Some("1-1-4"))
    );
    let c = parse("[cluster]\nworkers = 2\nlayout = \"1-1-2\"\n").unwrap();
    assert_eq!(c.cluster.workers(), 2);

    let (line, field, msg) = err("[cluster]\nlayout = \"1-2-2\"\n");
    assert_eq!((line, field.as_str()), (Some(2), "cluster.layout"), "{msg}");
    assert!(
        msg.contains("data-parallel layouts \"1-1-N\" only"),
        "{msg}"
    );
    let (_, field, msg) = err("[cluster]\nworkers = 4\nlayout = \"1-1-2\"\n");
    assert_eq!(field, "cluster.layout");
    assert!(
        msg.contains("uses 2 devices, but cluster.workers = 4"),
        "{msg}"
    );
    let (_, field, msg) = err("[cluster]\nlayout = \"1-1-3\"\n");
    assert_eq!(field, "cluster.layout");
    assert!(
        msg.contains("do not divide data.train_batch_size = 32"),
        "{msg}"
    );
    let (_, field, msg) = err("[cluster]\nlayout = \"4\"\n");
    assert_eq!(field, "cluster.layout");
    assert!(msg.contains("not a p-t-d layout"), "{msg}");
}

/// `cluster.sharding = "full"` splits the trainer over the workers and
/// turns activation checkpointing on (printed so); written off, or with
/// `restart` mode, it is refused naming the key.
#[test]
fn sharding_resolves_checkpointing_on_and_refuses_what_it_cannot_run() {
    let none = parse("[cluster]\nworkers = 4\n").unwrap();
    assert_eq!(none.cluster.sharding, Sharding::None);
    assert_eq!(none.cluster.shards(), 1);
    assert!(!none.model.enable_gradient_checkpointing);
    let c = parse("[cluster]\nworkers = 4\nsharding = \"full\"\n").unwrap();
    assert_eq!(
        (c.cluster.sharding, c.cluster.shards()),
        (Sharding::Full, 4)
    );
    assert!(c.model.enable_gradient_checkpointing, "resolved to on");
    let toml = c.to_toml().unwrap();
    assert!(toml.contains("sharding = \"full\""), "{toml}");
    assert!(toml.contains("enable_gradient_checkpointing = true"));
    assert!(
        toml.contains("verl: actor_rollout_ref.actor.strategy"),
        "{toml}"
    );
    assert_eq!(
        Config::from_toml(&toml, Path::new("printed.toml")).unwrap(),
        c
    );

    let off = "[model]\nenable_gradient_checkpointing = false\n";
    let (line, field, msg) = err(&format!(
        "{off}[cluster]\nworkers = 2\nsharding = \"full\"\n"
    ));
    assert_eq!(
        (line, field.as_str()),
        (Some(2), "model.enable_gradient_checkpointing")
    );
    assert!(
        msg.contains("cluster.sharding = \"full\" needs it true"),
        "{msg}"
    );
    let (line, field, msg) =
        err("[memory]\ncolocation = \"restart\"\n[cluster]\nworkers = 2\nsharding = \"full\"\n");
    assert_eq!((line, field.as_str()), (Some(2), "memory.colocation"));
    assert!(
        msg.contains("expected \"sleep\", \"staged\" or \"naive\""),
        "{msg}"
    );
    let (_, field, msg) = err("[cluster]\nsharding = \"zero3\"\n");
    assert_eq!(field, "cluster.sharding", "{msg}");
}

/// verl's run names: they name the run directory, as verl's
/// `checkpoints/${project_name}/${experiment_name}`, unless `out_dir` is
/// written.
#[test]
fn project_and_experiment_names_name_the_run_directory() {
    let dir = |text: &str| parse(text).unwrap().out_dir().to_owned();
    assert_eq!(dir(""), Path::new("runs/colo"));
    let both = "[trainer]\nproject_name = \"gsm8k\"\nexperiment_name = \"qwen-grpo\"\n";
    assert_eq!(dir(both), Path::new("runs/gsm8k/qwen-grpo"));
    assert_eq!(
        dir("[trainer]\nexperiment_name = \"e1\"\n"),
        Path::new("runs/e1")
    );
    assert_eq!(
        dir(&format!("{both}default_local_dir = \"ckpt/here\"\n")),
        Path::new("ckpt/here"),
        "an explicit out_dir (verl's default_local_dir) wins"
    );
    let c = parse(both).unwrap();
    assert_eq!(c.trainer.project_name.as_deref(), Some("gsm8k"));
    for bad in ["", "..", "a/b"] {
        let (line, field, msg) = err(&format!("[trainer]\nproject_name = {bad:?}\n"));
        assert_eq!(
            (line, field.as_str()),
            (Some(2), "trainer.project_name"),
            "{bad:?}"
        );
        assert!(msg.contains("one non-empty path component"), "{msg}");
    }
}

/// verl's `trainer.logger`: "console" and "file" (a string or a list) are
/// what colo writes anyway; a backend it does not have is an error naming
/// it, not a run silently missing from the user's wandb.
#[test]
fn verl_loggers_colo_has_are_accepted_and_others_refused() {
    for text in [
        "logger = \"console\"",
        "logger = [\"console\", \"file\"]",
        "logger = []",
    ] {
        let c = parse(&format!("[trainer]\n{text}\n")).unwrap_or_else(|e| panic!("{text}: {e}"));
        let printed = c.to_toml().unwrap();
        assert_eq!(parse(&printed).unwrap(), c, "{text}");
    }
    assert_eq!(parse("").unwrap().trainer.logger, None);
    for text in [
        "logger = [\"console\", \"wandb\"]",
        "logger = \"tensorboard\"",
    ] {
        let (line, field, msg) = err(&format!("[trainer]\n{text}\n"));
        assert_eq!(
            (line, field.as_str()),
            (Some(2), "trainer.logger"),
            "{text}"
        );
        assert!(
            msg.contains("is not a logger colo has") && msg.contains("metrics.jsonl"),
            "{msg}"
        );
    }
}

/// DAPO's overlong punishment: verl's keys under `[algorithm]`, off unless
/// enabled, the factor DAPO's 1.0 unless given.
#[test]
fn the_overlong_buffer_is_off_until_enabled() {
    assert_eq!(parse("").unwrap().algorithm.overlong_punishment(), None);
    let off = parse("[algorithm.overlong_buffer]\nlen = 4\n").unwrap();
    assert_eq!(off.algorithm.overlong_punishment(), None);
    let on = parse("[algorithm.overlong_buffer]\nenable = true\nlen = 4\n").unwrap();
    assert_eq!(
        on.algorithm.overlong_punishment(),
        Some(colo_algo::OverlongBuffer {
            len: 4,
            penalty_factor: 1.0
        })
    );
}

/// DAPO's dynamic sampling: verl's keys, off unless enabled; DAPO's metric
/// and no limit unless given; generation batches of the step's size unless
/// `data.gen_batch_size` says otherwise.
#[test]
fn dynamic_sampling_is_off_until_enabled_and_sizes_generation_batches() {
    let c = parse("").unwrap();
    assert!(!c.algorithm.filter_groups.enable);
    assert_eq!(c.batch.gen_batch_prompts, c.batch.prompts_per_step);
    let on = parse(
        "[data]\ntrain_batch_size = 8\ngen_batch_size = 24\n\
         [algorithm.filter_groups]\nenable = true\nmax_num_gen_batches = 10\n",
    )
    .unwrap();
    assert_eq!(
        (
            &on.algorithm.filter_groups.metric,
            on.algorithm.filter_groups.max_gen_batches()
        ),
        (&FilterMetric::Acc, Some(10))
    );
    assert_eq!(
        (on.batch.prompts_per_step, on.batch.gen_batch_prompts),
        (8, 24)
    );
    assert!(on.summary().contains("dynamic sampling: batches of 24 prompts until 8 with varying acc (at most 10 batches a step)"), "{}", on.summary());
    // An epoch is a pass of generation batches, as verl's dataloader counts.
    let epochs = parse(
        "[data]\ntrain_batch_size = 8\ngen_batch_size = 24\n[trainer]\ntotal_epochs = 2\n\
         [algorithm.filter_groups]\nenable = true\n",
    )
    .unwrap();
    assert_eq!(epochs.total_steps(240), 20);
    for (metric, want) in [
        ("score", FilterMetric::Score),
        ("seq_reward", FilterMetric::SeqReward),
        ("seq_final_reward", FilterMetric::SeqFinalReward),
        ("format", FilterMetric::Extra("format".into())),
    ] {
        let text = format!(
            "[algorithm.filter_groups]\nenable = true\nmetric = \"{metric}\"\nmax_num_gen_batches = -1\n"
        );
        let f = parse(&text).unwrap().algorithm.filter_groups;
        assert_eq!((&f.metric, f.max_gen_batches()), (&want, None), "{metric}");
    }
}

#[test]
fn dynamic_sampling_refuses_what_it_cannot_do() {
    for (text, want_field, want) in [
        (
            "[data]\ngen_batch_size = 64\n",
            "data.gen_batch_size",
            "only dynamic sampling",
        ),
        (
            "[data]\ngen_batch_size = 0\n[algorithm.filter_groups]\nenable = true\n",
            "data.gen_batch_size",
            "at least 1",
        ),
        (
            "[algorithm.filter_groups]\nenable = true\nmetric = \" \"\n",
            "algorithm.filter_groups.metric",
            "must name",
        ),
        (
            "[algorithm]\nuse_kl_in_reward = true\n\
             [algorithm.filter_groups]\nenable = true\nmetric = \"seq_final_reward\"\n",
            "algorithm.filter_groups.metric",
            "KL penalty",
        ),
    ] {
        let (_, field, msg) = err(text);
        assert_eq!(field, want_field, "{text}: {msg}");
        assert!(msg.contains(want), "{text}: {msg}");
    }
    // The same size as the step's is no conflict.
    assert!(parse("[data]\ngen_batch_size = 32\n").is_ok());
}

/// verl's generation dumps: off unless a directory is named.
#[test]
fn generation_dumps_are_off_unless_a_directory_is_named() {
    let c = parse("").unwrap();
    assert_eq!(
        (c.trainer.rollout_data_dir, c.trainer.validation_data_dir),
        (None, None)
    );
    let on =
        parse("[trainer]\nrollout_data_dir = \"gen\"\nvalidation_data_dir = \"/v\"\n").unwrap();
    assert_eq!(on.trainer.rollout_data_dir, Some("gen".into()));
    assert_eq!(on.trainer.validation_data_dir, Some("/v".into()));
    let (line, field, msg) = err("[trainer]\nvalidation_data_dir = \"\"\n");
    assert_eq!(
        (line, field.as_str()),
        (Some(2), "trainer.validation_data_dir"),
        "{msg}"
    );
}

/// verl's optimizer keys beyond lr: the schedule after warmup (also by its
/// newer name), the cosine's floor, Adam's betas; and a cosine that would
/// have no steps left after its warmup is refused.
#[test]
fn the_learning_rate_schedule_and_betas_are_verls() {
    let c = parse("").unwrap().actor.optim();
    assert_eq!(
        (c.schedule, c.min_lr_ratio, c.betas),
        (colo_train::ScheduleKind::Constant, 0.0, (0.9, 0.999))
    );
    for key in ["warmup_style", "lr_scheduler_type"] {
        let text =
            format!("[actor]\n{key} = \"cosine\"\nmin_lr_ratio = 0.1\nbetas = [0.9, 0.95]\n");
        let c = parse(&text).unwrap().actor.optim();
        assert_eq!(
            (c.schedule, c.min_lr_ratio, c.betas),
            (colo_train::ScheduleKind::Cosine, 0.1, (0.9, 0.95))
        );
    }
    for (text, want_field, want) in [
        (
            "[actor]\nmin_lr_ratio = 1.5\n",
            "actor.min_lr_ratio",
            "[0, 1]",
        ),
        ("[actor]\nbetas = [0.9, 1.0]\n", "actor.betas", "[0, 1)"),
        (
            "[actor]\nwarmup_style = \"cosine\"\nwarmup_steps = 40\n[trainer]\ntotal_steps = 10\n",
            "actor.warmup_steps",
            "optimizer steps, 20, which must be more than actor.warmup_steps = 40",
        ),
    ] {
        let (_, field, msg) = err(text);
        assert_eq!(field, want_field, "{text}: {msg}");
        assert!(msg.contains(want), "{text}: {msg}");
    }
}

/// `[critic]`: the actor's optimizer unless it says otherwise; its warmup
/// needs a critic.
#[test]
fn the_critic_takes_the_actors_optimizer_but_for_what_it_sets() {
    let c = parse("[actor]\nlr = 2e-6\nloss_agg_mode = \"seq-mean-token-mean\"\n").unwrap();
    assert_eq!(c.critic_optim(), c.actor.optim());
    assert_eq!(c.critic.cliprange_value, 0.5);
    assert_eq!(c.critic_loss_agg_mode(), LossAggMode::SeqMeanTokenMean);
    assert_eq!(c.trainer.critic_warmup, 0);
    let c = parse(
        "[algorithm]\nadv_estimator = \"gae\"\n[critic]\nlr = 1e-5\ngrad_clip = 0.5\n\
         [trainer]\ncritic_warmup = 3\n",
    )
    .unwrap();
    let (critic, actor) = (c.critic_optim(), c.actor.optim());
    assert_eq!((critic.lr, critic.grad_clip), (1e-5, Some(0.5)));
    assert_eq!(critic.warmup_steps, actor.warmup_steps);
    assert_eq!(c.trainer.critic_warmup, 3);
    assert!(
        c.summary()
            .contains(", critic lr 0.00001 (alone for the first 3 steps)"),
        "{}",
        c.summary()
    );
    for (text, want_field, want) in [
        ("[critic]\nlr = 0\n", "critic.lr", "> 0"),
        (
            "[critic]\ncliprange_value = -1\n",
            "critic.cliprange_value",
            "> 0",
        ),
        (
            "[trainer]\ncritic_warmup = 2\n",
            "trainer.critic_warmup",
            "\"gae\"",
        ),
        (
            "[actor]\nwarmup_style = \"cosine\"\nwarmup_steps = 1\n[critic]\nwarmup_steps = 99\n\
             [trainer]\ntotal_steps = 10\n",
            "critic.warmup_steps",
            "more than critic.warmup_steps = 99",
        ),
    ] {
        let (_, field, msg) = err(text);
        assert_eq!(field, want_field, "{text}: {msg}");
        assert!(msg.contains(want), "{text}: {msg}");
    }
}

#[test]
fn val_only_needs_held_out_prompts_and_one_process() {
    let c = parse("[trainer]\nval_only = true\n").unwrap();
    assert!(c.trainer.val_only);
    // The summary says what runs: an evaluation, no steps, no checkpoints.
    let summary = c.summary();
    let run = summary.lines().last().unwrap().to_owned();
    assert!(
        run.contains("evaluation only") && !run.contains("steps") && !run.contains("checkpoint"),
        "{run}"
    );
    assert!(
        !summary.contains("\nupdate ") && !summary.contains("\nalgorithm "),
        "{summary}"
    );
    for (text, want) in [
        (
            "[data]\ntrain_files = [\"t.jsonl\"]\n[trainer]\nval_only = true\n",
            "needs held-out prompts",
        ),
        (
            "[trainer]\nval_only = true\nresume = true\n",
            "set model.path",
        ),
        (
            "[trainer]\nval_only = true\n[cluster]\nworkers = 2\n",
            "one process",
        ),
    ] {
        let (_, field, msg) = err(text);
        assert_eq!(field, "trainer.val_only", "{text}: {msg}");
        assert!(msg.contains(want), "{text}: {msg}");
    }
}

/// Settings that a sweep of bad inputs found silently accepted.
#[test]
fn settings_that_cannot_work_together_are_refused() {
    for (text, want_field, want) in [
        (
            "[actor]\nbetas = [0.9, 0.999, 0.5]\n",
            "actor.betas",
            "two numbers",
        ),
        (
            "[actor]\nloss_mode = \"kl_cov\"\nkl_cov_ratio = 0.0\n",
            "actor.kl_cov_ratio",
            "in (0, 1]",
        ),
        ("[actor]\nppo_kl_coef = -1.0\n", "actor.ppo_kl_coef", "≥ 0"),
        (
            "[actor]\nloss_mode = \"clip_cov\"\nclip_cov_ratio = 1.5\n",
            "actor.clip_cov_ratio",
            "in (0, 1]",
        ),
        (
            "[actor]\nclip_cov_lb = 5.0\nclip_cov_ub = 1.0\n",
            "actor.clip_cov_ub",
            "above actor.clip_cov_lb = 5 (Clip-Cov draws tokens whose covariance lies between them), got 1",
        ),
        ("[actor]\nclip_cov_ub = inf\n", "actor.clip_cov_ub", "got inf"),
        ("[actor]\nclip_cov_lb = nan\n", "actor.clip_cov_lb", "finite number, got NaN"),
        ("[actor]\ntau_neg = 0.0\n", "actor.tau_neg", "in [1e-6, 1e6]"),
        ("[actor]\ntau_pos = 1e39\n", "actor.tau_pos", "in [1e-6, 1e6]"),
        ("[actor]\nclip_ratio = 1.5\n", "actor.clip_ratio", "in [0, 1), got 1.5"),
        ("[actor]\nclip_cov_lb = 6.0\n", "actor.clip_cov_lb", "below actor.clip_cov_ub = 5"),
        (
            "[trainer]\nrollout_data_dir = \"d\"\nvalidation_data_dir = \"d\"\n",
            "trainer.validation_data_dir",
            "overwrite",
        ),
        (
            "[data]\ntrain_files = [\"t.jsonl\"]\n[trainer]\nvalidation_data_dir = \"v\"\n",
            "trainer.validation_data_dir",
            "no held-out prompts",
        ),
        (
            "[algorithm]\nadv_estimator = \"gae\"\n[trainer]\ntotal_steps = 2\ncritic_warmup = 2\n",
            "trainer.critic_warmup",
            "leave the actor none",
        ),
        (
            "[rollout]\ntemperature = 0.0\n[algorithm.filter_groups]\nenable = true\n",
            "algorithm.filter_groups.enable",
            "no group varies",
        ),
        (
            "[rollout]\ntop_k = 1\n[algorithm.filter_groups]\nenable = true\n",
            "algorithm.filter_groups.enable",
            "greedy sampling",
        ),
    ] {
        let (_, field, msg) = err(text);
        assert_eq!(field, want_field, "{text}: {msg}");
        assert!(msg.contains(want), "{text}: {msg}");
    }
}

/// Floats far from 1 are written in exponent form, in `--print-config`
/// (which still reads back to the same config) and in error messages:
/// Rust's `{}` wrote `1e300` as a 1 and 300 zeros.
#[test]
fn extreme_floats_print_short() {
    let c = parse("[actor]\nlr = 1e-300\nkl_loss_coef = 1e200\n").unwrap();
    let printed = c.to_toml().unwrap();
    assert!(printed.contains("\nlr = 1e-300\n"), "{printed}");
    assert!(printed.contains("\nkl_loss_coef = 1e200\n"), "{printed}");
    let digits = printed.lines().find(|l| l.contains("0000000000"));
    assert!(digits.is_none(), "a line of digits: {digits:?}");
    assert_eq!(parse(&printed).unwrap(), c);
    let (_, field, msg) = err("[actor]\nclip_ratio = 1e300\n");
    assert_eq!(field, "actor.clip_ratio");
    assert!(msg.ends_with("got 1e300"), "{msg}");
}

/// An unknown table under a header of several parts is named as written,
/// not with its first part appended again (`foo.bar.foo`).
#[test]
fn an_unknown_dotted_header_names_the_unknown_part() {
    for (text, want) in [
        ("[foo.bar]\nx = 1\n", "foo"),
        (
            "[actor_rollout_ref.actor]\nlr = 1e-6\n",
            "actor_rollout_ref",
        ),
        ("[actor.optim]\nlr = 1e-6\n", "actor.optim"),
        ("[actor]\nbogus = 1\n", "actor.bogus"),
    ] {
        let (line, field, msg) = err(text);
        assert_eq!(field, want, "{text:?}: {msg}");
        assert_eq!(
            line,
            Some(1 + usize::from(want == "actor.bogus")),
            "{text:?}"
        );
        assert!(msg.contains("unknown field"), "{msg}");
    }
}

/// A tensor-parallel rollout with `restart` mode is refused before
/// anything starts, naming the key.
#[test]
fn a_tensor_parallel_rollout_refuses_restart_mode() {
    let (line, field, msg) = err(
        "[memory]\ncolocation = \"restart\"\n[rollout]\ntensor_model_parallel_size = 2\n\
         [cluster]\nworkers = 2\n",
    );
    assert_eq!((line, field.as_str()), (Some(2), "memory.colocation"));
    assert!(msg.contains("tensor_model_parallel_size = 2"), "{msg}");
    let ok = parse("[rollout]\ntensor_model_parallel_size = 2\n[cluster]\nworkers = 2\n").unwrap();
    assert_eq!(ok.rollout.tensor_model_parallel_size, 2);
}

//! `Config::to_toml` (`colo train --print-config`): every key documented,
//! and the printed file reads back to the same configuration.

use std::path::Path;

use colo_rl::Config;

fn parse(text: &str) -> Config {
    Config::from_toml(text, Path::new("run.toml")).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// Prints `c`, reads the text back, and checks it is the same config.
fn round_trip(c: &Config) -> String {
    let printed = c.to_toml().unwrap();
    let back = Config::from_toml(&printed, Path::new("printed.toml"))
        .unwrap_or_else(|e| panic!("the printed config does not parse: {e}\n{printed}"));
    assert_eq!(&back, c, "{printed}");
    printed
}

#[test]
fn the_builtin_config_round_trips_and_every_key_has_a_comment() {
    let printed = round_trip(&Config::builtin());
    if std::env::var_os("COLO_SHOW").is_some() {
        eprintln!("{printed}");
    }
    for key in [
        "total_steps = 100",
        "save_freq = 50",
        "test_freq = 10",
        "prompt_key = \"prompt\"",
        "answer_key = \"answer\"",
        "train_batch_size = 32",
        "capacity = \"auto\"",
        "seed = 1",
    ] {
        assert!(printed.lines().any(|l| l == key), "{key}\n{printed}");
    }
    // Each key line follows its comment, which gives the default and verl's name.
    let lines: Vec<&str> = printed.lines().collect();
    for (i, l) in lines.iter().enumerate() {
        if l.starts_with('#') || l.starts_with('[') || l.trim().is_empty() {
            continue;
        }
        assert!(
            i > 0 && lines[i - 1].starts_with("# "),
            "no comment above {l:?}"
        );
    }
    let comment_of = |key: &str| {
        let i = lines.iter().position(|l| l.starts_with(key)).unwrap();
        lines[i - 1]
    };
    let c = comment_of("ppo_mini_batch_size = ");
    assert!(
        c.contains("[prompts]")
            && c.contains("Default: unset (the largest divisor of data.train_batch_size up to 16)")
            && c.contains("verl: actor_rollout_ref.actor.ppo_mini_batch_size"),
        "{c}"
    );
    let c = comment_of("# max_kv_tokens = ");
    assert!(
        c.contains("Default: unset (the cache is sized by mem_fraction)"),
        "{c}"
    );
    assert!(
        printed.contains("# max_kv_tokens = …  (unset)"),
        "{printed}"
    );
    let c = comment_of("max_new_tokens = ");
    assert!(
        c.contains("[tokens]") && c.contains("max_response_length"),
        "{c}"
    );
    // The sections in the file's order, the resolved summary on top.
    let order: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.starts_with('[') && !l[1..].contains('.'))
        .collect();
    assert_eq!(
        order,
        [
            "[data]",
            "[model]",
            "[rollout]",
            "[actor]",
            "[critic]",
            "[algorithm]",
            "[reward]",
            "[memory]",
            "[trainer]",
            "[cluster]"
        ]
    );
    assert!(printed.contains("#   step       32 prompts × n 8 = 256 samples"));
}

#[test]
fn user_configs_round_trip() {
    for text in [
        // Files with a held-out fraction, a model path, epochs, a byte capacity.
        r#"
[data]
train_files = "a.jsonl"
val_fraction = 0.2
gen_batch_size = 96
answer_key = "reward_model.ground_truth"
seed = 9
[model]
path = "ckpt/qwen"
[rollout]
n = 4
top_k = 20
max_kv_tokens = 4096
val_kwargs = { n = 4, temperature = 0.7, top_p = 0.9 }
[actor]
ppo_mini_batch_size = 8
ppo_micro_batch_size = 16
clip_ratio_low = 0.2
clip_ratio_high = 0.28
warmup_style = "cosine"
min_lr_ratio = 0.1
betas = [0.9, 0.95]
use_kl_loss = false
loss_agg_mode = "seq-mean-token-sum-norm"
[algorithm.overlong_buffer]
enable = true
len = 4
penalty_factor = 0.5
[algorithm.filter_groups]
enable = true
metric = "seq_reward"
max_num_gen_batches = 5
[memory]
capacity = 123456789
colocation = "sleep"
offload_ref = false
[trainer]
total_epochs = 3
save_freq = -1
test_freq = 0
dtype = "bf16"
"#,
        // A weighted reward, KL in the reward, truncated IS, held-out files;
        // PPO's critic with its own learning rate and a warmup.
        r#"
[data]
train_files = ["a.jsonl", "b.jsonl"]
val_files = ["v.jsonl"]
[critic]
lr = 1e-5
cliprange_value = 0.3
[trainer]
critic_warmup = 2
[algorithm]
adv_estimator = "gae"
use_kl_in_reward = true
kl_penalty = "k2"
kl_ctrl = { type = "adaptive", kl_coef = 0.05, target_kl = 0.2, horizon = 500 }
rollout_correction = { rollout_is = "sequence", rollout_is_threshold = 3.5 }
[reward]
kind = "weighted"
[[reward.terms]]
weight = 0.9
reward = { kind = "numeric", tolerance = 1e-6, after = "Answer:" }
[[reward.terms]]
weight = 0.1
reward = { kind = "format", open = "<answer>", close = "</answer>" }
[memory]
capacity = "24GiB"
"#,
        // An external reward with a default score, a built-in task variant.
        r#"
[data.builtin]
max_operand = 50
ops = ["+", "-"]
train_size = 1000
val_size = 100
[reward]
kind = "external"
command = ["python3", "score.py", "--strict \"yes\""]
timeout_s = 2.5
default_score = -1.0
[trainer]
total_steps = 7
out_dir = "runs/x y"
rollout_data_dir = "dumps/train"
validation_data_dir = "dumps/val"
val_only = true
"#,
    ] {
        let printed = round_trip(&parse(text));
        assert!(!printed.contains("\n\n\n"), "{printed}");
    }
}

/// An external reward's keys are described with their defaults, and the
/// protocol with them, not a pointer to a source file.
#[test]
fn an_external_rewards_keys_have_their_defaults() {
    let printed = parse("[reward]\nkind = \"external\"\ncommand = [\"python3\", \"r.py\"]\n")
        .to_toml()
        .unwrap();
    let comment_of = |key: &str| {
        let lines: Vec<&str> = printed.lines().collect();
        let at = (lines.iter())
            .position(|l| {
                l.starts_with(&format!("{key} = ")) || l.starts_with(&format!("# {key} = "))
            })
            .unwrap_or_else(|| panic!("no {key}: {printed}"));
        lines[at - 1].to_owned()
    };
    let command = comment_of("command");
    assert!(
        command.contains("{\"id\", \"score\"}") && !command.contains(".rs"),
        "{command}"
    );
    assert!(
        comment_of("timeout_s").contains("Default: 30.0"),
        "{printed}"
    );
    assert!(comment_of("workers").contains("Default: 1"), "{printed}");
    assert!(
        comment_of("default_score").contains("Default: unset (a failure stops the run"),
        "{printed}"
    );
    let numeric = parse("[reward]\nkind = \"numeric\"\n").to_toml().unwrap();
    assert!(
        numeric.contains("are equal [absolute]. Default: 1e-6"),
        "{numeric}"
    );
}

#[test]
fn only_the_reward_kinds_own_optional_keys_are_hinted() {
    let numeric = parse("[reward]\nkind = \"numeric\"\n").to_toml().unwrap();
    assert!(numeric.contains("# after = …"), "{numeric}");
    assert!(!numeric.contains("# default_score = …"), "{numeric}");
    let exact = Config::builtin().to_toml().unwrap();
    assert!(!exact.contains("# after = …") && !exact.contains("tolerance"));
}

//! `[model]`'s LoRA keys (verl's names): defaults, what reaches the actor's
//! engine, `--print-config`, and errors naming the key.

use std::path::Path;

use colo_rl::{Config, Error};
use colo_train::TargetModules;

fn parse(text: &str) -> Result<Config, Error> {
    Config::from_toml(text, Path::new("run.toml"))
}

/// `(field, message)` of a config error.
fn err(text: &str) -> (String, String) {
    match parse(text).unwrap_err() {
        Error::Config { field, message, .. } => (field, message),
        other => panic!("not a config error: {other}"),
    }
}

#[test]
fn lora_is_off_by_default_with_verls_defaults() {
    let c = parse("").unwrap();
    let m = &c.model;
    assert_eq!((m.lora_rank, m.lora_alpha, m.lora_dropout), (0, 16.0, 0.0));
    assert_eq!(m.target_modules, TargetModules::One("all-linear".into()));
    assert_eq!(m.lora_adapter_path, None);
    assert_eq!(m.lora(), None);
    assert!(!c.summary().contains("LoRA"), "{}", c.summary());
    let toml = c.to_toml().unwrap();
    for (key, verl) in [
        ("lora_rank = 0", "actor_rollout_ref.model.lora_rank"),
        ("lora_alpha = 16.0", "actor_rollout_ref.model.lora_alpha"),
        (
            "target_modules = \"all-linear\"",
            "actor_rollout_ref.model.target_modules",
        ),
        ("lora_dropout = 0.0", ""),
        (
            "# lora_adapter_path = …  (unset)",
            "actor_rollout_ref.model.lora_adapter_path",
        ),
    ] {
        assert!(toml.contains(key), "{key}: {toml}");
        assert!(toml.contains(verl), "{verl}");
    }
}

#[test]
fn the_keys_reach_the_actors_engine_and_print_back() {
    let text = "[model]\nlora_rank = 8\nlora_alpha = 16\ntarget_modules = \"all-linear\"\n";
    let c = parse(text).unwrap();
    let l = c.model.lora().expect("on");
    assert_eq!((l.rank, l.alpha, l.dropout), (8, 16.0, 0.0));
    let s = c.summary();
    assert!(s.contains("LoRA rank 8, alpha 16 on all-linear"), "{s}");
    let printed = c.to_toml().unwrap();
    assert!(printed.contains("lora_rank = 8"), "{printed}");
    assert_eq!(Config::from_toml(&printed, Path::new("p.toml")).unwrap(), c);

    let list =
        parse("[model]\nlora_rank = 4\ntarget_modules = [\"v_proj\", \"q_proj\"]\n").unwrap();
    let l = list.model.lora().unwrap();
    assert_eq!(l.validate().unwrap().targets, ["q_proj", "v_proj"]);
    assert!(list.summary().contains("on q_proj, v_proj"));
    let from = parse("[model]\nlora_rank = 4\nlora_adapter_path = \"a/lora_adapter\"\n").unwrap();
    assert_eq!(
        from.model.lora().unwrap().adapter_path.as_deref(),
        Some(Path::new("a/lora_adapter"))
    );
}

#[test]
fn bad_lora_settings_are_errors_naming_the_key() {
    let (field, msg) = err("[model]\nlora_rank = 8\ntarget_modules = [\"q_proj\", \"qkv\"]\n");
    assert_eq!(field, "model.target_modules");
    assert!(msg.contains("`qkv`") && msg.contains("all-linear"), "{msg}");
    let (field, msg) = err("[model]\nlora_rank = 8\nlora_dropout = 0.05\n");
    assert_eq!(field, "model.lora_dropout");
    assert!(msg.contains("only 0"), "{msg}");
    let (field, _) = err("[model]\nlora_rank = 8\nlora_alpha = 0\n");
    assert_eq!(field, "model.lora_alpha");
    let (field, msg) = err("[model]\nlora_adapter_path = \"x\"\n");
    assert_eq!(field, "model.lora_adapter_path");
    assert!(msg.contains("model.lora_rank"), "{msg}");
    let (field, msg) = err("[model]\nlora_rank = 8\n[cluster]\nworkers = 2\nsharding = \"full\"\n");
    assert_eq!(field, "model.lora_rank");
    assert!(msg.contains("cluster.sharding"), "{msg}");
    let (field, _) = err("[model]\nlora_rank = -1\n");
    assert_eq!(field, "model.lora_rank");
}

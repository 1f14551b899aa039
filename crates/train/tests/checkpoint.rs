//! Checkpoints: resume gives identical steps, the model half is a Hugging
//! Face checkpoint, replacement is atomic, and a wrong shape is an error
//! naming the tensor; `trainer_state.json` names its counts, and a partial
//! directory is not a complete checkpoint.

mod common;

use colo_model::Checkpoint;
use colo_train::{LossConfig, TrainEngine, ValueHeadConfig};
use common::*;
use tch::{Device, Kind, Tensor};

#[test]
fn resume_from_a_checkpoint_gives_identical_steps() {
    let dir = scratch_dir("resume").join("ckpt");
    let cfg = LossConfig::default();
    let mut a = engine("tiny-llama", 2);
    let batch = policy_batch(&mut a);
    a.update_policy(&batch, &cfg).unwrap();
    a.save_checkpoint(&dir).unwrap();
    let a2 = a.update_policy(&batch, &cfg).unwrap();
    let a3 = a.update_policy(&batch, &cfg).unwrap();

    // A fresh engine from the original weights, then the checkpoint.
    let mut b = engine("tiny-llama", 2);
    b.load_checkpoint(&dir).unwrap();
    assert_eq!(b.step(), 1);
    let b2 = b.update_policy(&batch, &cfg).unwrap();
    let b3 = b.update_policy(&batch, &cfg).unwrap();
    assert_eq!((a2, a3), (b2, b3));
    assert!(
        state_bits(&a) == state_bits(&b),
        "states differ after resuming"
    );

    // An engine that skipped the checkpoint takes another step: the
    // comparison above can fail.
    let mut fresh = engine("tiny-llama", 2);
    assert_ne!(fresh.update_policy(&batch, &cfg).unwrap(), a2);

    // A bare model directory is not a trainer checkpoint.
    let model_only = dir.with_file_name("model-only");
    a.model().unwrap().save_dir(&model_only).unwrap();
    let msg = fresh.load_checkpoint(&model_only).unwrap_err().to_string();
    assert!(msg.contains("trainer_state.json"), "{msg}");
}

#[test]
fn the_model_half_is_a_hugging_face_checkpoint_and_saves_replace_atomically() {
    let root = scratch_dir("hf");
    let dir = root.join("step");
    let mut cfg = config(4);
    cfg.value_head = Some(ValueHeadConfig::default());
    let mut e = engine_with("tiny-qwen2", &cfg);
    e.sft_step(&seqs()).unwrap();
    e.save_checkpoint(&dir).unwrap();
    e.sft_step(&seqs()).unwrap();
    e.save_checkpoint(&dir).unwrap(); // replaces the first
    let names: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .map(|d| d.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        vec!["step".to_owned()],
        "temporary directories left behind"
    );
    for f in [
        "config.json",
        "model.safetensors",
        "optimizer.safetensors",
        "value_head.safetensors",
        "trainer_state.json",
    ] {
        assert!(dir.join(f).is_file(), "{f}");
    }
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("trainer_state.json")).unwrap())
            .unwrap();
    assert_eq!(state["optimizer_steps"], 2);
    // colo-model (and so transformers) loads it, with the trained weights.
    let ckpt = Checkpoint::from_dir(&dir, Kind::Float, Device::Cpu).unwrap();
    let ids = seqs().input_ids().shallow_clone();
    let want = tch::no_grad(|| e.model().unwrap().forward(&ids).unwrap());
    let got = tch::no_grad(|| ckpt.model.forward(&ids).unwrap());
    assert_eq!(to_vec(&got), to_vec(&want));
}

#[test]
fn a_checkpoint_of_the_wrong_shape_is_an_error_naming_the_tensor() {
    let dir = scratch_dir("shape").join("ckpt");
    let qwen = engine("tiny-qwen2", 2);
    qwen.save_checkpoint(&dir).unwrap();
    let mut llama = engine("tiny-llama", 2);
    let before = state_bits(&llama);
    let msg = llama.load_checkpoint(&dir).unwrap_err().to_string();
    assert!(
        msg.contains("`model.embed_tokens.weight`")
            && msg.contains("[384, 64]")
            && msg.contains("[384, 96]"),
        "{msg}"
    );
    assert!(
        state_bits(&llama) == before,
        "a failed load changed the engine"
    );

    // Optimizer state of the wrong shape, under the right model.
    let mut other = engine("tiny-qwen2", 2);
    let opt = dir.join("optimizer.safetensors");
    let t = Tensor::zeros([3, 3], (Kind::Float, Device::Cpu));
    let mut moments = Tensor::read_safetensors(&opt).unwrap();
    for (name, m) in &mut moments {
        if name == "model.norm.weight.exp_avg" {
            *m = t.shallow_clone();
        }
    }
    Tensor::write_safetensors(&moments, &opt).unwrap();
    let msg = other.load_checkpoint(&dir).unwrap_err().to_string();
    assert!(
        msg.contains("`model.norm.weight.exp_avg`") && msg.contains("[3, 3]"),
        "{msg}"
    );
}

/// A checkpoint whose weights or optimizer state hold a NaN or an infinity
/// (a bit flipped on disk) is refused when loaded, naming the file and the
/// tensor, and the engine is left as it was: a run from it would skip
/// every optimizer step.
#[test]
fn a_checkpoint_holding_nan_or_inf_is_refused_naming_the_tensor() {
    let dir = scratch_dir("nan").join("ckpt");
    let mut e = engine("tiny-qwen2", 2);
    e.sft_step(&seqs()).unwrap();
    e.save_checkpoint(&dir).unwrap();
    let mut fresh = engine("tiny-qwen2", 2);
    let before = state_bits(&fresh);
    for (file, name, bad) in [
        (
            "model.safetensors",
            "model.layers.1.mlp.up_proj.weight",
            f32::NAN,
        ),
        (
            "optimizer.safetensors",
            "model.norm.weight.exp_avg_sq",
            f32::INFINITY,
        ),
    ] {
        let path = dir.join(file);
        let good = std::fs::read(&path).unwrap();
        let mut tensors = Tensor::read_safetensors(&path).unwrap();
        let t = &mut tensors.iter_mut().find(|(n, _)| n == name).unwrap().1;
        *t = t.copy();
        let _ = t.view(-1).get(5).fill_(f64::from(bad));
        Tensor::write_safetensors(&tensors, &path).unwrap();
        let msg = fresh.load_checkpoint(&dir).unwrap_err().to_string();
        assert!(
            msg.contains(&path.display().to_string())
                && msg.contains(&format!("tensor `{name}` holds NaN or infinite values")),
            "{msg}"
        );
        assert!(
            state_bits(&fresh) == before,
            "a refused load changed the engine"
        );
        std::fs::write(&path, good).unwrap();
    }
    // The same checkpoint, undamaged, loads.
    fresh.load_checkpoint(&dir).unwrap();
}

/// A bf16 engine's checkpoint holds its float32 master weights, and
/// resuming from it gives the same steps.
#[test]
fn bf16_resume_restores_master_weights() {
    let dir = scratch_dir("bf16").join("ckpt");
    let mut cfg = config(2);
    cfg.kind = Kind::BFloat16;
    let mut a = engine_with("tiny-qwen2", &cfg);
    let batch = seqs();
    a.sft_step(&batch).unwrap();
    a.save_checkpoint(&dir).unwrap();
    let names: Vec<String> = Tensor::read_safetensors(dir.join("optimizer.safetensors"))
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert!(names.contains(&"model.norm.weight.master".to_owned()));
    let a2 = a.sft_step(&batch).unwrap();
    let mut b = engine_with("tiny-qwen2", &cfg);
    b.load_checkpoint(&dir).unwrap();
    let b2 = b.sft_step(&batch).unwrap();
    assert_eq!(a2, b2);
    assert!(
        state_bits(&a) == state_bits(&b),
        "states differ after resuming"
    );
}

/// `trainer_state.json` names the optimizer steps and the caller's steps;
/// files written before those names still load; a directory missing a file
/// is incomplete; a save that fails leaves nothing behind.
#[test]
fn state_names_both_counts_and_partial_directories_are_incomplete() {
    use colo_train::checkpoint::{check_complete, read_state};
    let root = scratch_dir("state");
    let dir = root.join("step-1");
    let mut e = engine("tiny-qwen2", 4);
    e.sft_step(&seqs()).unwrap();
    e.sft_step(&seqs()).unwrap();
    e.save_checkpoint_with(&dir, Some(1), |tmp| {
        std::fs::write(tmp.join("tokenizer.json"), "{}").unwrap();
        Ok::<(), colo_train::Error>(())
    })
    .unwrap();
    assert!(
        dir.join("tokenizer.json").is_file(),
        "extra files are in it"
    );
    let state = check_complete(&dir).unwrap();
    assert_eq!((state.optimizer_steps, state.global_step), (2, Some(1)));
    let text = std::fs::read_to_string(dir.join("trainer_state.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        (v["optimizer_steps"].as_u64(), v["global_step"].as_u64()),
        (Some(2), Some(1))
    );
    assert!(v.get("step").is_none(), "{text}");

    // A file written before the names: `step` is optimizer steps.
    let old = r#"{"format": "colo-train/1", "step": 6, "next_lr": 0.001}"#;
    std::fs::write(dir.join("trainer_state.json"), old).unwrap();
    let state = read_state(&dir).unwrap();
    assert_eq!((state.optimizer_steps, state.global_step), (6, None));
    let mut b = engine("tiny-qwen2", 4);
    b.load_checkpoint(&dir).unwrap();
    assert_eq!(b.step(), 6);

    // Partial directories: weights cut short (a copy interrupted), then
    // missing.
    let weights = dir.join("model.safetensors");
    let whole = std::fs::read(&weights).unwrap();
    std::fs::write(&weights, &whole[..whole.len() - 100]).unwrap();
    let msg = check_complete(&dir).unwrap_err().to_string();
    assert!(
        msg.contains("model.safetensors") && msg.contains("the file is truncated"),
        "{msg}"
    );
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    let msg = check_complete(&dir).unwrap_err().to_string();
    assert!(
        msg.contains("model.safetensors") && msg.contains("missing"),
        "{msg}"
    );
    let empty = root.join("step-2");
    std::fs::create_dir_all(&empty).unwrap();
    let msg = check_complete(&empty).unwrap_err().to_string();
    assert!(msg.contains("config.json"), "{msg}");

    // A save whose extra files fail leaves no directory, temporary or final.
    let err = e
        .save_checkpoint_with(&root.join("step-3"), Some(3), |_| {
            Err(colo_train::Error::CheckpointState {
                path: root.clone(),
                reason: "no tokenizer".into(),
            })
        })
        .unwrap_err();
    assert!(err.to_string().contains("no tokenizer"), "{err}");
    let mut names: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .map(|d| d.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, vec!["step-1".to_owned(), "step-2".to_owned()]);
}

//! Parity with Hugging Face transformers / PyTorch on the fixture
//! checkpoints: logits, loss and the gradient of every parameter.

mod common;

use colo_model::loss;
use common::*;

#[test]
fn logits_match_transformers() {
    for name in MODELS {
        let r = reference(name);
        let logits = load(name).forward(&r.input_ids).unwrap();
        let diff = max_abs_diff(&logits, &r.logits);
        eprintln!("{name}: max |logits - reference| = {diff:.3e}");
        assert!(diff <= 1e-4, "{name}: logits differ by {diff}");
    }
}

#[test]
fn loss_matches_transformers() {
    for name in MODELS {
        let r = reference(name);
        let logits = load(name).forward(&r.input_ids).unwrap();
        let ce = loss::next_token_cross_entropy(&logits, &r.input_ids).unwrap();
        let ce = ce.to_scalar::<f32>().unwrap() as f64;
        eprintln!("{name}: loss {ce:.7} reference {:.7}", r.loss);
        assert!(
            (ce - r.loss).abs() <= 1e-5 * r.loss.abs().max(1.0),
            "{name}: loss {ce} vs {}",
            r.loss
        );
    }
}

/// The fused ops' backward is what this guards: a kernel without one would
/// leave the norms' weights (or everything below a softmax) without a
/// gradient.
#[test]
fn every_parameter_gets_the_reference_gradient() {
    for name in MODELS {
        let r = reference(name);
        let model = load_trainable(name);
        let vars = model.vars().unwrap();
        let logits = model.forward(&r.input_ids).unwrap();
        let grads = loss::next_token_cross_entropy(&logits, &r.input_ids)
            .unwrap()
            .backward()
            .unwrap();

        let mut names: Vec<&str> = vars.iter().map(|(n, _)| n.as_str()).collect();
        let mut expected: Vec<&str> = r.grads.keys().map(String::as_str).collect();
        names.sort_unstable();
        expected.sort_unstable();
        assert_eq!(
            names, expected,
            "{name}: parameter set differs from transformers'"
        );

        let mut worst = (0f64, String::new());
        for (pname, var) in &vars {
            let g = grads
                .get(var.as_tensor())
                .unwrap_or_else(|| panic!("{name}: `{pname}` got no gradient"));
            let gnorm = norm(g);
            assert!(gnorm > 0.0, "{name}: `{pname}` got a zero gradient");
            let reference = &r.grads[pname];
            let rel = norm(&(g - reference).unwrap()) / norm(reference);
            assert!(
                rel <= 1e-4,
                "{name}: `{pname}` gradient relative error {rel:.3e}"
            );
            if rel > worst.0 {
                worst = (rel, pname.clone());
            }
        }
        eprintln!(
            "{name}: {} parameters, worst gradient relative error {:.3e} ({})",
            vars.len(),
            worst.0,
            worst.1
        );
    }
}

#[test]
fn inference_model_refuses_to_hand_out_vars() {
    assert!(load("tiny-qwen2").vars().is_err());
}

/// float64 takes the tensor-op compositions instead of the float32 kernels:
/// the fallback path must compute the same model, gradients included.
#[test]
fn float64_fallback_path_matches_too() {
    use candle_core::{DType, Device};
    use colo_model::{Model, ModelConfig, Weights};
    for name in MODELS {
        let r = reference(name);
        let dir = fixture_dir(name);
        let cfg = ModelConfig::from_file(&dir.join("config.json")).unwrap();
        let w = Weights::from_dir(&dir, DType::F64, &Device::Cpu).unwrap();
        let model = Model::load_trainable(&cfg, &w).unwrap();
        let logits = model.forward(&r.input_ids).unwrap();
        assert_eq!(logits.dtype(), DType::F64);
        let diff = max_abs_diff(&logits.to_dtype(DType::F32).unwrap(), &r.logits);
        assert!(diff <= 1e-4, "{name}: float64 logits differ by {diff}");
        let grads = loss::next_token_cross_entropy(&logits, &r.input_ids)
            .unwrap()
            .backward()
            .unwrap();
        for (pname, var) in model.vars().unwrap() {
            let g = grads
                .get(var.as_tensor())
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap();
            let rel = norm(&(&g - &r.grads[&pname]).unwrap()) / norm(&r.grads[&pname]);
            assert!(
                rel <= 1e-4,
                "{name}: float64 `{pname}` gradient relative error {rel:.3e}"
            );
        }
    }
}

/// The trainer's contract: an optimizer that updates the vars updates the
/// model the next forward runs.
#[test]
fn updating_a_var_updates_the_model() {
    let r = reference("tiny-qwen2");
    let model = load_trainable("tiny-qwen2");
    let before = model.forward(&r.input_ids).unwrap();
    let vars = model.vars().unwrap();
    let (name, norm_weight) = vars.iter().find(|(n, _)| n == "model.norm.weight").unwrap();
    norm_weight
        .set(&(norm_weight.as_tensor() * 2.0).unwrap())
        .unwrap();
    let after = model.forward(&r.input_ids).unwrap();
    assert!(
        max_abs_diff(&before, &after) > 1e-3,
        "setting `{name}` did not change the logits"
    );
    // A clone of the model shares the parameters too.
    let again = model.clone().forward(&r.input_ids).unwrap();
    assert_eq!(max_abs_diff(&after, &again), 0.0);
}

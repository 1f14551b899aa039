//! Parity with Hugging Face transformers / PyTorch on the fixture
//! checkpoints: logits, loss and the gradient of every parameter, in
//! float32 (the reference path), float64 and bfloat16.

mod common;

use colo_model::{loss, Model};
use common::*;
use tch::{Kind, Tensor};

#[test]
fn logits_match_transformers() {
    for name in MODELS {
        let r = reference(name);
        let logits = load(name).forward(&r.input_ids).unwrap();
        assert_eq!(logits.kind(), Kind::Float);
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
        let ce = f64::try_from(ce).unwrap();
        eprintln!("{name}: loss {ce:.7} reference {:.7}", r.loss);
        assert!(
            (ce - r.loss).abs() <= 1e-5 * r.loss.abs().max(1.0),
            "{name}: loss {ce} vs {}",
            r.loss
        );
    }
}

/// Backward of the mean next-token loss; returns the trainable parameters
/// (their `.grad()` filled).
fn backward(model: &Model, ids: &Tensor) -> Vec<(String, Tensor)> {
    let params = model.trainable_parameters();
    let logits = model.forward(ids).unwrap();
    loss::next_token_cross_entropy(&logits, ids)
        .unwrap()
        .backward();
    params
}

/// Per parameter: ‖g − g_ref‖ / ‖g_ref‖, after checking that the parameter
/// set is PyTorch's and every gradient is defined and non-zero.
fn gradient_errors(name: &str, params: &[(String, Tensor)]) -> Vec<(String, f64)> {
    let r = reference(name);
    let mut names: Vec<&str> = params.iter().map(|(n, _)| n.as_str()).collect();
    let mut expected: Vec<&str> = r.grads.keys().map(String::as_str).collect();
    names.sort_unstable();
    expected.sort_unstable();
    assert_eq!(
        names, expected,
        "{name}: parameter set differs from transformers'"
    );
    params
        .iter()
        .map(|(pname, p)| {
            let g = p.grad();
            assert!(g.defined(), "{name}: `{pname}` got no gradient");
            assert!(norm(&g) > 0.0, "{name}: `{pname}` got a zero gradient");
            let reference = &r.grads[pname];
            let rel = norm(&(g.to_kind(Kind::Float) - reference)) / norm(reference);
            (pname.clone(), rel)
        })
        .collect()
}

fn worst(errors: &[(String, f64)]) -> (f64, &str) {
    errors
        .iter()
        .map(|(n, e)| (*e, n.as_str()))
        .fold((0.0, ""), |a, b| if b.0 > a.0 { b } else { a })
}

/// Autograd through libtorch's fused ops (rms_norm, sdpa, linear,
/// logsumexp) must reach every parameter — the norms' weights included —
/// with PyTorch's gradient.
#[test]
fn every_parameter_gets_the_reference_gradient() {
    for name in MODELS {
        let r = reference(name);
        let params = backward(&load_trainable(name), &r.input_ids);
        let errors = gradient_errors(name, &params);
        for (pname, rel) in &errors {
            assert!(
                *rel <= 1e-4,
                "{name}: `{pname}` gradient relative error {rel:.3e}"
            );
        }
        let (e, n) = worst(&errors);
        eprintln!(
            "{name}: {} parameters, worst gradient relative error {e:.3e} ({n})",
            params.len()
        );
    }
}

#[test]
fn inference_model_has_no_trainable_parameters() {
    let model = load("tiny-qwen2");
    assert!(model.trainable_parameters().is_empty());
    assert!(!model
        .forward(&reference("tiny-qwen2").input_ids)
        .unwrap()
        .requires_grad());
}

/// The kind is a parameter: float64 computes the same model, gradients
/// included.
#[test]
fn float64_matches_too() {
    for name in MODELS {
        let r = reference(name);
        let model = load_trainable_as(name, Kind::Double);
        let logits = model.forward(&r.input_ids).unwrap();
        assert_eq!(logits.kind(), Kind::Double);
        let diff = max_abs_diff(&logits, &r.logits);
        assert!(diff <= 1e-4, "{name}: float64 logits differ by {diff}");
        drop(logits);
        let params = backward(&model, &r.input_ids);
        for (pname, rel) in gradient_errors(name, &params) {
            assert!(
                rel <= 1e-4,
                "{name}: float64 `{pname}` gradient relative error {rel:.3e}"
            );
        }
    }
}

/// bfloat16 against the float32 transformers reference (the fixtures have
/// no bfloat16 reference). bfloat16 keeps 8 significant bits, so each op
/// rounds at ~4e-3 relative; through 2–3 layers that compounds to a few
/// percent. Tolerances: logits within 5% of the reference's largest
/// magnitude, loss within 1%, every gradient within 10% relative (and
/// non-zero), measured worst values printed.
#[test]
fn bfloat16_matches_float32_reference_within_bf16_tolerance() {
    for name in MODELS {
        let r = reference(name);
        let model = load_trainable_as(name, Kind::BFloat16);
        assert_eq!(model.dtype(), Kind::BFloat16);
        let logits = model.forward(&r.input_ids).unwrap();
        assert_eq!(logits.kind(), Kind::BFloat16);
        let scale = f32::try_from(r.logits.abs().max()).unwrap();
        let diff = max_abs_diff(&logits, &r.logits);
        let ce =
            loss::next_token_cross_entropy(&logits.to_kind(Kind::Float), &r.input_ids).unwrap();
        let ce = f64::try_from(ce).unwrap();
        let params = backward(&model, &r.input_ids);
        let errors = gradient_errors(name, &params);
        let (e, n) = worst(&errors);
        eprintln!(
            "{name} bf16: max |logits - ref| = {diff:.3e} (ref max {scale:.3}), loss {ce:.5} vs {:.5}, worst gradient rel. error {e:.3e} ({n})",
            r.loss
        );
        assert!(diff <= 0.05 * scale, "{name}: bf16 logits differ by {diff}");
        assert!(
            (ce - r.loss).abs() <= 0.01 * r.loss,
            "{name}: bf16 loss {ce}"
        );
        assert!(
            e <= 0.1,
            "{name}: bf16 `{n}` gradient relative error {e:.3e}"
        );
    }
}

/// The trainer's contract: an optimizer that updates the parameters in
/// place updates the model the next forward runs.
#[test]
fn updating_a_parameter_in_place_updates_the_model() {
    let r = reference("tiny-qwen2");
    let model = load_trainable("tiny-qwen2");
    let before = model.forward(&r.input_ids).unwrap();
    let params = model.trainable_parameters();
    let (name, norm_weight) = params
        .iter()
        .find(|(n, _)| n == "model.norm.weight")
        .unwrap();
    tch::no_grad(|| {
        let mut w = norm_weight.shallow_clone();
        let _ = w.f_mul_scalar_(2.0).unwrap();
    });
    let after = model.forward(&r.input_ids).unwrap();
    assert!(
        max_abs_diff(&before, &after) > 1e-3,
        "updating `{name}` did not change the logits"
    );
    // A clone of the model shares the parameters too.
    let again = model.clone().forward(&r.input_ids).unwrap();
    assert_eq!(max_abs_diff(&after, &again), 0.0);
    // And named_parameters hands out the same storage.
    let (_, same) = model
        .named_parameters()
        .into_iter()
        .find(|(n, _)| n == "model.norm.weight")
        .unwrap();
    assert_eq!(same.data_ptr(), norm_weight.data_ptr());
}

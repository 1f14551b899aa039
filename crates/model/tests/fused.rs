//! Fused projections (`Model::fuse_projections`, what the rollout engine
//! runs): transformers' logits and greedy tokens on every fixture, in the
//! full and the cached forward; a write through a parameter's view reaches
//! the fused product; misuse is an error naming the thing, and leaves the
//! model as it was.

mod common;

use std::collections::HashMap;

use colo_model::{fused_groups, Model, Weights};
use common::*;
use tch::{Device, Kind, Tensor};

/// `model`'s parameters copied into fused buffers (the others copied
/// alone), and a model loaded over the views, fused.
fn fused_copy(model: &Model) -> (Model, HashMap<String, Tensor>) {
    let params: HashMap<String, Tensor> = model.named_parameters().into_iter().collect();
    let (mut tensors, mut buffers) = (HashMap::new(), HashMap::new());
    for g in fused_groups(model.config()) {
        let buffer = Tensor::zeros(g.shape(), (Kind::Float, Device::Cpu));
        for (name, mut view) in g.views(&buffer).unwrap() {
            view.copy_(&params[&name]);
            tensors.insert(name, view);
        }
        buffers.insert(g.name, buffer);
    }
    for (name, t) in &params {
        tensors.entry(name.clone()).or_insert_with(|| t.copy());
    }
    let mut fused = Model::load(model.config(), &Weights::from_tensors(tensors)).unwrap();
    fused.fuse_projections(&buffers).unwrap();
    (fused, buffers)
}

#[test]
fn fused_projections_match_transformers() {
    for name in MODELS {
        let (model, r) = (load(name), reference(name));
        let (fused, buffers) = fused_copy(&model);
        let per_layer = if model.config().qkv_bias { 3 } else { 2 };
        assert_eq!(buffers.len(), per_layer * model.config().num_layers);
        let logits = fused.forward(&r.input_ids).unwrap();
        let diff = max_abs_diff(&logits, &r.logits);
        assert!(diff <= 1e-4, "{name}: fused logits differ by {diff}");

        // The cached forward, as the engine decodes: transformers' greedy
        // tokens, one step at a time.
        let expected = &r.greedy[0];
        let prompt = expected.len() - 16;
        let mut cache = fused.new_cache();
        let mut ids = expected[..prompt].to_vec();
        let mut logits = fused
            .forward_with_cache(&ids_tensor(&ids), &mut cache, None)
            .unwrap();
        while ids.len() < expected.len() {
            let last = logits.size()[1] - 1;
            ids.push(argmax(&logits.get(0).get(last)));
            logits = fused
                .forward_with_cache(&ids_tensor(&ids[ids.len() - 1..]), &mut cache, None)
                .unwrap();
        }
        assert_eq!(&ids, expected, "{name}: fused greedy decoding");
    }
}

/// The parameters are the buffers' row blocks: writing one in place (what
/// the engine's `update_weights` does) changes the fused product exactly
/// as it changes the separate one.
#[test]
fn a_write_through_a_parameter_reaches_the_fused_product() {
    let (model, r) = (load("tiny-qwen2"), reference("tiny-qwen2"));
    let (fused, _) = fused_copy(&model);
    let before = fused.forward(&r.input_ids).unwrap();
    let _no_grad = tch::no_grad_guard();
    for m in [&model, &fused] {
        for (name, mut t) in m.named_parameters() {
            if name.ends_with("layers.0.self_attn.k_proj.weight")
                || name.ends_with("layers.1.mlp.up_proj.weight")
            {
                let _ = t.f_mul_scalar_(0.5).unwrap();
            }
        }
    }
    let (after, unfused) = (
        fused.forward(&r.input_ids).unwrap(),
        model.forward(&r.input_ids).unwrap(),
    );
    assert!(
        max_abs_diff(&after, &before) > 1e-3,
        "the write changed nothing"
    );
    let diff = max_abs_diff(&after, &unfused);
    assert!(
        diff <= 1e-4,
        "fused and separate differ by {diff} after the write"
    );
}

fn shallow(m: &HashMap<String, Tensor>) -> HashMap<String, Tensor> {
    m.iter()
        .map(|(n, t)| (n.clone(), t.shallow_clone()))
        .collect()
}

#[test]
fn misuse_is_an_error_naming_it() {
    let model = load("tiny-llama");
    let (mut fused, buffers) = fused_copy(&model);
    let ids = reference("tiny-llama").input_ids;
    let want = fused.forward(&ids).unwrap();

    let mut missing = shallow(&buffers);
    missing.remove("model.layers.1.mlp.gate_up_proj.weight");
    let err = fused.fuse_projections(&missing).unwrap_err().to_string();
    assert!(
        err.contains("no buffer `model.layers.1.mlp.gate_up_proj.weight`"),
        "{err}"
    );

    // Copies hold the same values but not the parameters' memory.
    let copies: HashMap<String, Tensor> = buffers
        .iter()
        .map(|(n, t)| (n.clone(), t.zeros_like()))
        .collect();
    let err = fused.fuse_projections(&copies).unwrap_err().to_string();
    assert!(
        err.contains("`model.layers.0.self_attn.q_proj.weight` is not its row block"),
        "{err}"
    );

    let mut wrong = shallow(&buffers);
    let name = "model.layers.0.self_attn.qkv_proj.weight";
    wrong.insert(name.into(), wrong[name].narrow(0, 0, 1));
    let err = fused.fuse_projections(&wrong).unwrap_err().to_string();
    assert!(err.contains(name) && err.contains("expected"), "{err}");

    // None of them changed what the model computes (a zeroed fused weight
    // would have).
    assert_eq!(max_abs_diff(&fused.forward(&ids).unwrap(), &want), 0.0);
}

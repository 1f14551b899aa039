//! Decoding: greedy continuations against transformers' `generate`, the
//! cached incremental forward against the full forward, and padded batches
//! against unpadded rows.

mod common;

use colo_model::Model;
use common::*;
use tch::{Kind, Tensor};

const NEW_TOKENS: usize = 16;

/// Greedy decoding by recomputing the whole sequence each step.
fn greedy_naive(model: &Model, prompt: &[u32], steps: usize) -> Vec<u32> {
    let mut ids = prompt.to_vec();
    for _ in 0..steps {
        let logits = model.forward(&ids_tensor(&ids)).unwrap();
        ids.push(argmax(&logits.get(0).get(ids.len() as i64 - 1)));
    }
    ids
}

#[test]
fn greedy_decode_reproduces_transformers_generate() {
    for name in MODELS {
        let (model, r) = (load(name), reference(name));
        for expected in &r.greedy {
            let prompt = &expected[..expected.len() - NEW_TOKENS];
            assert_eq!(
                &greedy_naive(&model, prompt, NEW_TOKENS),
                expected,
                "{name}"
            );
        }
    }
}

#[test]
fn cached_decode_matches_full_forward() {
    for name in MODELS {
        let (model, r) = (load(name), reference(name));
        let full = &r.greedy[1];
        let prompt_len = full.len() - NEW_TOKENS;
        let all = model.forward(&ids_tensor(full)).unwrap();
        let mut cache = model.new_cache();
        let first = model
            .forward_with_cache(&ids_tensor(&full[..prompt_len]), &mut cache, None)
            .unwrap();
        let mut diff = max_abs_diff(&first, &all.narrow(1, 0, prompt_len as i64));
        for t in prompt_len..full.len() {
            let step = model
                .forward_with_cache(&ids_tensor(&full[t..t + 1]), &mut cache, None)
                .unwrap();
            diff = diff.max(max_abs_diff(&step, &all.narrow(1, t as i64, 1)));
        }
        assert_eq!(cache.len(), full.len());
        // Not 1e-5 as on candle: libtorch's BLAS takes a different kernel
        // for a one-row product (a decode step) than for many rows, so the
        // same logits round differently — 1.4e-5 measured on tiny-llama
        // (logits up to 6.4), the same order as one `linear` of one row vs
        // many (1.7e-5 on random data). The parity tolerance against
        // transformers (1e-4) is unchanged.
        assert!(diff < 5e-5, "{name}: cached logits differ by {diff}");
        eprintln!("{name}: max |cached - full| = {diff:.3e}");
    }
}

/// The fixture prompts have different lengths; pad them into one batch.
/// Returns (ids, mask), both (rows, longest) int64.
fn padded_batch(rows: &[Vec<u32>], left: bool) -> (Tensor, Tensor) {
    let len = rows.iter().map(Vec::len).max().unwrap();
    let (mut ids, mut mask): (Vec<i64>, Vec<i64>) = (vec![], vec![]);
    for row in rows {
        let pad = vec![0i64; len - row.len()];
        let real: Vec<i64> = row.iter().map(|&t| t as i64).collect();
        let ones = vec![1i64; row.len()];
        match left {
            true => {
                ids.extend(pad.iter().chain(&real));
                mask.extend(pad.iter().chain(&ones));
            }
            false => {
                ids.extend(real.iter().chain(&pad));
                mask.extend(ones.iter().chain(&pad));
            }
        }
    }
    let shape = [rows.len() as i64, len as i64];
    (
        Tensor::from_slice(&ids).view(shape),
        Tensor::from_slice(&mask).view(shape),
    )
}

#[test]
fn padded_batches_match_unpadded_rows() {
    for name in MODELS {
        let (model, r) = (load(name), reference(name));
        let rows: Vec<Vec<u32>> = r
            .greedy
            .iter()
            .map(|g| g[..g.len() - NEW_TOKENS].to_vec())
            .collect();
        let len = rows.iter().map(Vec::len).max().unwrap();
        for left in [false, true] {
            let (ids, mask) = padded_batch(&rows, left);
            // Any mask kind works: int64, bool, float.
            for mask in [mask.shallow_clone(), mask.ne(0), mask.to_kind(Kind::Float)] {
                let logits = model.forward_masked(&ids, &mask, None).unwrap();
                for (b, row) in rows.iter().enumerate() {
                    let alone = model.forward(&ids_tensor(row)).unwrap();
                    let start = if left { len - row.len() } else { 0 };
                    let got = logits
                        .get(b as i64)
                        .narrow(0, start as i64, row.len() as i64)
                        .unsqueeze(0);
                    let diff = max_abs_diff(&got, &alone);
                    assert!(diff < 1e-5, "{name} left={left} row {b}: {diff}");
                }
            }
        }
    }
}

/// What a rollout engine does: a left-padded prompt batch, then one token
/// per row per step through the cache.
#[test]
fn batched_cached_greedy_with_left_padding_reproduces_generate() {
    for name in MODELS {
        let (model, r) = (load(name), reference(name));
        let rows: Vec<Vec<u32>> = r
            .greedy
            .iter()
            .map(|g| g[..g.len() - NEW_TOKENS].to_vec())
            .collect();
        let (ids, mut mask) = padded_batch(&rows, true);
        let mut cache = model.new_cache();
        let mut out = rows.clone();
        let mut logits = model
            .forward_with_cache(&ids, &mut cache, Some(&mask))
            .unwrap();
        for _ in 0..NEW_TOKENS {
            let last = logits.size()[1] - 1;
            let next: Vec<u32> = (0..rows.len())
                .map(|b| argmax(&logits.get(b as i64).get(last)))
                .collect();
            for (row, &t) in out.iter_mut().zip(&next) {
                row.push(t);
            }
            let step: Vec<i64> = next.iter().map(|&t| t as i64).collect();
            let step = Tensor::from_slice(&step).unsqueeze(1);
            mask = Tensor::cat(&[&mask, &mask.ones_like().narrow(1, 0, 1)], 1);
            logits = model
                .forward_with_cache(&step, &mut cache, Some(&mask))
                .unwrap();
        }
        assert_eq!(out, r.greedy, "{name}");
    }
}

#[test]
fn explicit_position_ids_are_used() {
    let model = load("tiny-llama");
    let ids = ids_tensor(&[5, 6, 7]);
    let mask = Tensor::ones([1, 3], (Kind::Int64, tch::Device::Cpu));
    let shifted = Tensor::from_slice2(&[[10i64, 11, 12]]);
    let a = model.forward_masked(&ids, &mask, None).unwrap();
    let b = model.forward_masked(&ids, &mask, Some(&shifted)).unwrap();
    // RoPE is relative: a constant shift of all positions changes the
    // logits only by rounding.
    assert!(max_abs_diff(&a, &b) < 1e-4);
    let scrambled = Tensor::from_slice2(&[[0i64, 7, 3]]);
    let c = model.forward_masked(&ids, &mask, Some(&scrambled)).unwrap();
    assert!(max_abs_diff(&a, &c) > 1e-3);
}

/// The pieces a paged engine strings together give the model's forward.
#[test]
fn pieces_reproduce_the_forward() {
    let (model, r) = (load("tiny-qwen2"), reference("tiny-qwen2"));
    let ids = &r.input_ids;
    let s = ids.size()[1] as usize;
    let rope = model.rope_tables_for_range(0, s).unwrap();
    let mask = colo_model::mask::causal(s, s, model.dtype(), model.device()).unwrap();
    let mut x = model.embed(ids).unwrap();
    for layer in model.layers() {
        let normed = layer.input_layernorm.forward(&x).unwrap();
        let (q, k, v) = layer.self_attn.qkv(&normed, &rope).unwrap();
        assert!(q.is_contiguous() && k.is_contiguous() && v.is_contiguous());
        let h = &x + layer.self_attn.attend(&q, &k, &v, Some(&mask)).unwrap();
        x = layer.finish(&h).unwrap();
    }
    let logits = model.lm_head(&model.final_norm(&x).unwrap()).unwrap();
    assert!(max_abs_diff(&logits, &r.logits) <= 1e-4);
}

/// Shape errors from user data are errors, not panics.
#[test]
fn malformed_inputs_are_errors() {
    let model = load("tiny-qwen2");
    let ids = ids_tensor(&[1, 2, 3]);
    assert!(model.forward(&ids.view([-1])).is_err());
    let bad_mask = Tensor::ones([1, 4], (Kind::Int64, tch::Device::Cpu));
    assert!(model.forward_masked(&ids, &bad_mask, None).is_err());
    let out_of_vocab = ids_tensor(&[1, 100_000]);
    assert!(model.forward(&out_of_vocab).is_err());
    let rope = model.rope_tables_for_range(0, 2).unwrap();
    let x = model.embed(&ids).unwrap();
    assert!(model.layers()[0].self_attn.qkv(&x, &rope).is_err());
}

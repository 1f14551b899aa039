//! Decoding: greedy continuations against transformers' `generate`, the
//! cached incremental forward against the full forward, and padded batches
//! against unpadded rows.

mod common;

use candle_core::{Device, IndexOp, Tensor};
use colo_model::Model;
use common::*;

const NEW_TOKENS: usize = 16;

/// Greedy decoding by recomputing the whole sequence each step.
fn greedy_naive(model: &Model, prompt: &[u32], steps: usize) -> Vec<u32> {
    let mut ids = prompt.to_vec();
    for _ in 0..steps {
        let logits = model.forward(&ids_tensor(&ids)).unwrap();
        ids.push(argmax(&logits.i((0, ids.len() - 1)).unwrap()));
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
        let mut diff = max_abs_diff(&first, &all.narrow(1, 0, prompt_len).unwrap());
        for t in prompt_len..full.len() {
            let step = model
                .forward_with_cache(&ids_tensor(&full[t..t + 1]), &mut cache, None)
                .unwrap();
            diff = diff.max(max_abs_diff(&step, &all.narrow(1, t, 1).unwrap()));
        }
        assert_eq!(cache.len(), full.len());
        assert!(diff < 1e-5, "{name}: cached logits differ by {diff}");
    }
}

/// The fixture prompts have different lengths; pad them into one batch.
fn padded_batch(rows: &[Vec<u32>], left: bool) -> (Tensor, Tensor) {
    let len = rows.iter().map(Vec::len).max().unwrap();
    let (mut ids, mut mask) = (vec![], vec![]);
    for row in rows {
        let pad = len - row.len();
        let (ids_row, mask_row): (Vec<u32>, Vec<u32>) = match left {
            true => (
                vec![0; pad]
                    .into_iter()
                    .chain(row.iter().copied())
                    .collect(),
                [vec![0; pad], vec![1; row.len()]].concat(),
            ),
            false => (
                row.iter().copied().chain(vec![0; pad]).collect(),
                [vec![1; row.len()], vec![0; pad]].concat(),
            ),
        };
        ids.extend(ids_row);
        mask.extend(mask_row);
    }
    let shape = (rows.len(), len);
    (
        Tensor::from_vec(ids, shape, &Device::Cpu).unwrap(),
        Tensor::from_vec(mask, shape, &Device::Cpu).unwrap(),
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
            let logits = model.forward_masked(&ids, &mask, None).unwrap();
            for (b, row) in rows.iter().enumerate() {
                let alone = model.forward(&ids_tensor(row)).unwrap();
                let start = if left { len - row.len() } else { 0 };
                let got = logits
                    .i(b)
                    .unwrap()
                    .narrow(0, start, row.len())
                    .unwrap()
                    .unsqueeze(0)
                    .unwrap();
                let diff = max_abs_diff(&got, &alone);
                assert!(diff < 1e-5, "{name} left={left} row {b}: {diff}");
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
            let last = logits.dim(1).unwrap() - 1;
            let next: Vec<u32> = (0..rows.len())
                .map(|b| argmax(&logits.i((b, last)).unwrap()))
                .collect();
            for (row, &t) in out.iter_mut().zip(&next) {
                row.push(t);
            }
            let step = Tensor::new(next.as_slice(), &Device::Cpu)
                .unwrap()
                .unsqueeze(1)
                .unwrap();
            let ones = Tensor::ones((rows.len(), 1), mask.dtype(), &Device::Cpu).unwrap();
            mask = Tensor::cat(&[&mask, &ones], 1).unwrap();
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
    let mask = Tensor::ones((1, 3), candle_core::DType::U32, &Device::Cpu).unwrap();
    let shifted = Tensor::new(&[[10u32, 11, 12]], &Device::Cpu).unwrap();
    let a = model.forward_masked(&ids, &mask, None).unwrap();
    let b = model.forward_masked(&ids, &mask, Some(&shifted)).unwrap();
    // RoPE is relative: a constant shift of all positions changes the
    // logits only by rounding.
    assert!(max_abs_diff(&a, &b) < 1e-4);
    let scrambled = Tensor::new(&[[0u32, 7, 3]], &Device::Cpu).unwrap();
    let c = model.forward_masked(&ids, &mask, Some(&scrambled)).unwrap();
    assert!(max_abs_diff(&a, &c) > 1e-3);
}

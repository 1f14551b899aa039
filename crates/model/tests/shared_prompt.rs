//! The shared-prompt forward is the full forward of every (prompt,
//! response) row: the same hidden states at every response position and
//! the same gradients, with prompts and responses of different lengths
//! and several rows per prompt.

mod common;

use colo_model::{ModelConfig, SharedPrompts, Weights};
use common::*;
use tch::{Device, Kind, Tensor};

fn batch() -> SharedPrompts {
    let tok = |i: usize, j: usize| ((i * 53 + j * 17) % 300 + 3) as u32;
    SharedPrompts {
        // Lengths 5, 2 and 7; rows 0, 1, 2 share prompt 0.
        prompts: vec![
            (0..5).map(|j| tok(0, j)).collect(),
            (0..2).map(|j| tok(1, j)).collect(),
            (0..7).map(|j| tok(2, j)).collect(),
        ],
        rows: [(0, 3), (0, 6), (0, 1), (1, 4), (2, 5), (1, 2)]
            .iter()
            .enumerate()
            .map(|(r, &(g, n))| (g, (0..n).map(|j| tok(10 + r, j)).collect()))
            .collect(),
    }
}

#[test]
fn equals_the_full_forward_in_states_and_gradients() {
    for name in MODELS {
        let dir = fixture_dir(name);
        let cfg = ModelConfig::from_file(&dir.join("config.json")).unwrap();
        let w = Weights::from_dir(&dir, Kind::Float, Device::Cpu).unwrap();
        let model = colo_model::Model::load_trainable(&cfg, &w).unwrap();
        let params: Vec<Tensor> = model
            .trainable_parameters()
            .into_iter()
            .map(|(_, t)| t)
            .collect();
        let b = batch();
        let shared = model.hidden_states_shared_prompts(&b).unwrap();
        let hidden = shared.size()[2];
        // A probe weighting every compared state, for the gradients.
        let probe = Tensor::randn(shared.size(), (Kind::Float, Device::Cpu));
        let mut full_loss = Tensor::zeros([], (Kind::Float, Device::Cpu));
        let mut shared_loss = Tensor::zeros([], (Kind::Float, Device::Cpu));
        for (r, (g, resp)) in b.rows.iter().enumerate() {
            let prompt = &b.prompts[*g];
            let ids: Vec<i64> = prompt.iter().chain(resp).map(|&t| t as i64).collect();
            let full = model
                .hidden_states(&Tensor::from_slice(&ids).unsqueeze(0), None, None)
                .unwrap()
                .get(0); // (len, hidden)
                         // Column j: position P − 1 + j, for j in 0..=len(resp).
            let n = resp.len() as i64 + 1;
            let want = full.narrow(0, prompt.len() as i64 - 1, n);
            let got = shared.get(r as i64).narrow(0, 0, n);
            let diff = (&got - &want).abs().max().double_value(&[]);
            assert!(diff < 1e-5, "{name} row {r}: states differ by {diff}");
            let pad = shared.get(r as i64).narrow(0, n, shared.size()[1] - n);
            assert_eq!(
                pad.abs().sum(Kind::Float).double_value(&[]),
                0.0,
                "{name} row {r}: padding"
            );
            let pr = probe.get(r as i64).narrow(0, 0, n);
            full_loss += (&want * &pr).sum(Kind::Float);
            shared_loss += (&got * &pr).sum(Kind::Float);
        }
        assert_eq!(hidden, cfg.hidden_size as i64);
        let grads = |loss: &Tensor| Tensor::run_backward(&[loss], &params, false, false);
        let (gf, gs) = (grads(&full_loss), grads(&shared_loss));
        for (i, (f, s)) in gf.iter().zip(&gs).enumerate() {
            // The LM head does not take part in hidden states.
            assert_eq!(f.defined(), s.defined(), "{name}: gradient {i}");
            if !f.defined() {
                continue;
            }
            let scale = f.abs().max().double_value(&[]).max(1e-3);
            let diff = (f - s).abs().max().double_value(&[]) / scale;
            assert!(
                diff < 1e-4,
                "{name}: gradient {i} differs by {diff} (relative)"
            );
        }
    }
}

#[test]
fn bad_input_is_an_error_naming_it() {
    let dir = fixture_dir("tiny-qwen2");
    let model = colo_model::Model::from_dir(&dir, Kind::Float, Device::Cpu).unwrap();
    let mut b = batch();
    b.rows[2].0 = 9;
    let e = model
        .hidden_states_shared_prompts(&b)
        .unwrap_err()
        .to_string();
    assert!(e.contains("row 2 names prompt 9 of 3"), "{e}");
    let empty = SharedPrompts {
        prompts: vec![vec![]],
        rows: vec![(0, vec![1])],
    };
    assert!(model.hidden_states_shared_prompts(&empty).is_err());
}

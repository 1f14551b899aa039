//! Where the trainer's state lives, and offloading it: resident bytes by
//! tag and as the OS counts them, in-place updates, bit-exact training
//! across an offload/reload cycle, and the errors of misuse.

mod common;

use colo_mem::{os, tags, TagState};
use colo_train::{storage_addr, ColoTrainer, Error, LossConfig, Offload, TrainEngine};
use common::*;

fn tag_resident(e: &ColoTrainer, tag: &str) -> u64 {
    e.pool().stats().tag(tag).map_or(0, |t| t.resident_bytes)
}

fn pool_rss(e: &ColoTrainer) -> u64 {
    let (start, len) = e.pool().address_range();
    os::resident_in_range(start, len).unwrap()
}

/// Addresses of every parameter, accumulator and moment, with the tag each
/// must be in.
fn placements(e: &ColoTrainer) -> Vec<(u64, &'static str)> {
    let mut out = vec![];
    for ((_, p), (_, g)) in e.parameters().iter().zip(e.gradients()) {
        out.push((storage_addr(p), tags::TRAIN_PARAMS));
        out.push((storage_addr(&g), tags::TRAIN_GRADS));
    }
    for (_, m, v) in e.optimizer_state() {
        out.push((storage_addr(&m), tags::OPTIMIZER));
        out.push((storage_addr(&v), tags::OPTIMIZER));
    }
    out
}

#[test]
fn state_lives_in_its_tags_and_updates_stay_in_place() {
    let mut e = engine("tiny-llama", 2);
    let n_params = e.parameters().len();
    let before = placements(&e);
    for &(addr, tag) in &before {
        assert_eq!(e.pool().tag_of(addr).as_deref(), Some(tag));
    }
    let stats = e.pool().stats();
    let (p, g, o) = e.state_bytes();
    for (tag, count, bytes) in [
        (tags::TRAIN_PARAMS, n_params, p),
        (tags::TRAIN_GRADS, n_params, g),
        (tags::OPTIMIZER, 2 * n_params, o),
    ] {
        let t = stats.tag(tag).unwrap();
        assert_eq!((t.allocations, t.allocated_bytes), (count, bytes), "{tag}");
    }
    let batch = policy_batch(&mut e);
    let params_before = state_bits(&e);
    e.update_policy(&batch, &LossConfig::default()).unwrap();
    e.sft_step(&batch.seqs).unwrap();
    assert_ne!(state_bits(&e), params_before, "the steps changed nothing");
    // Same allocations, same tags, nothing new in the trainer's tags.
    assert_eq!(placements(&e), before);
    for &(addr, tag) in &before {
        assert_eq!(e.pool().tag_of(addr).as_deref(), Some(tag));
    }
    let after = e.pool().stats();
    for tag in [tags::TRAIN_PARAMS, tags::TRAIN_GRADS, tags::OPTIMIZER] {
        assert_eq!(
            after.tag(tag).unwrap().allocations,
            stats.tag(tag).unwrap().allocations
        );
    }
    // Gradients live in the accumulators only: autograd keeps none.
    for (n, p) in e.model().unwrap().named_parameters() {
        assert!(p.requires_grad(), "`{n}` is not trained");
        assert!(!p.grad().defined(), "`{n}` has a .grad");
    }
    // What scoring returns is ordinary memory, not the discardable tag.
    let scores = e.score(&batch.seqs, true).unwrap();
    for t in [&scores.log_probs, scores.entropy.as_ref().unwrap()] {
        assert_eq!(e.pool().tag_of(storage_addr(t)), None);
    }
    // Passes ran in the activations tag, and its cache goes back on request.
    assert!(tag_resident(&e, tags::ACTIVATIONS) > 0);
    e.release_cache();
    let act = e.pool().stats().tag(tags::ACTIVATIONS).cloned().unwrap();
    assert_eq!(act.resident_bytes, 0, "{act:?}");
}

#[test]
fn offload_releases_exactly_what_was_offloaded() {
    let mut e = engine("tiny-llama", 2);
    e.release_cache();
    let (params, grads, optim) = (
        tag_resident(&e, tags::TRAIN_PARAMS),
        tag_resident(&e, tags::TRAIN_GRADS),
        tag_resident(&e, tags::OPTIMIZER),
    );
    let (p_bytes, _, o_bytes) = e.state_bytes();
    assert!(params >= p_bytes && optim >= o_bytes);
    let total = e.pool().stats().resident_bytes;
    let rss = pool_rss(&e);

    e.offload(Offload::PARAMS).unwrap();
    assert_eq!(
        e.pool().tag_state(tags::TRAIN_PARAMS),
        Some(TagState::Paused)
    );
    assert_eq!(tag_resident(&e, tags::TRAIN_PARAMS), 0);
    assert_eq!(e.pool().stats().resident_bytes, total - params);
    let rss_params = pool_rss(&e);
    assert!(
        rss - rss_params >= params * 9 / 10,
        "rss {rss} -> {rss_params}, params {params}"
    );

    // Training or scoring now is an error that names what is missing.
    let batch = seqs();
    let err = e.sft_step(&batch).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Offloaded {
                tag: tags::TRAIN_PARAMS,
                ..
            }
        ),
        "{err}"
    );
    assert!(e
        .score(&batch, false)
        .unwrap_err()
        .to_string()
        .contains("train_params"));
    let twice = e.offload(Offload::PARAMS).unwrap_err().to_string();
    assert!(twice.contains("already offloaded"), "{twice}");

    e.offload(Offload {
        grads: true,
        optimizer: true,
        params: false,
    })
    .unwrap();
    assert_eq!(
        e.pool().stats().resident_bytes,
        total - params - grads - optim
    );
    assert!(pool_rss(&e) + (params + grads + optim) * 9 / 10 <= rss);
    // The gradients are rewritten by every step: their offload keeps no
    // host copy (the optimizer's does).
    let s = e.pool().stats();
    assert_eq!(s.tag(tags::TRAIN_GRADS).unwrap().backup_bytes, 0);
    assert!(s.tag(tags::OPTIMIZER).unwrap().backup_bytes >= o_bytes);
    let err = e.reload(Offload::ALL);
    assert!(err.is_ok(), "{err:?}");
    assert_eq!(e.pool().stats().resident_bytes, total);
    let again = e.reload(Offload::GRADS).unwrap_err().to_string();
    assert!(again.contains("already resident"), "{again}");
    e.sft_step(&batch).unwrap();
}

/// A step after an offload/reload cycle of everything gives the same bits
/// as a step without one (separate pools: offloading is per tag and pool).
#[test]
fn training_is_bit_identical_with_and_without_offload() {
    let mut plain = engine("tiny-qwen2", 2);
    let mut cycled = engine("tiny-qwen2", 2);
    let batch = policy_batch(&mut plain);
    let cfg = LossConfig::default();
    for e in [&mut plain, &mut cycled] {
        e.update_policy(&batch, &cfg).unwrap();
    }
    let addrs = placements(&cycled);
    cycled.offload(Offload::ALL).unwrap();
    cycled.reload(Offload::PARAMS).unwrap();
    cycled.reload(Offload::GRADS).unwrap();
    cycled.reload(Offload::OPTIMIZER).unwrap();
    assert_eq!(placements(&cycled), addrs);
    let a = plain.update_policy(&batch, &cfg).unwrap();
    let b = cycled.update_policy(&batch, &cfg).unwrap();
    assert_eq!(a, b);
    assert!(
        state_bits(&plain) == state_bits(&cycled),
        "state differs after the cycle"
    );
}

/// Regression: `model()` handed out tensors over offloaded parameters, and
/// reading them faulted the process.
#[test]
fn the_model_is_not_handed_out_while_its_parameters_are_offloaded() {
    let mut e = engine("tiny-qwen2", 2);
    assert!(e.model().is_ok());
    e.offload(Offload::PARAMS).unwrap();
    let err = e.model().err().unwrap();
    assert!(matches!(err, Error::Offloaded { .. }), "{err}");
    e.reload(Offload::PARAMS).unwrap();
    assert!(e.model().is_ok());
}

/// A token budget (verl's `use_dynamic_bsz`) bounds the activations an
/// update holds at once: 16 rows of 60 tokens in one micro-batch against
/// one row a micro-batch (a budget of 60 tokens), the update's peak of
/// allocated bytes above the training state.
#[test]
fn a_token_budget_lowers_the_updates_peak() {
    let seqs = sixteen_rows_of_sixty_tokens();
    let peak_of = |max_tokens: Option<usize>| {
        let mut cfg = config(16);
        cfg.micro_batch.max_tokens = max_tokens;
        update_peak_above_state(cfg, &seqs)
    };
    let (all, one) = (peak_of(None), peak_of(Some(60)));
    eprintln!("above the state at the peak: one row {one}, 16 rows {all}");
    assert!(one > 0 && one * 4 < all, "one row {one}, 16 rows {all}");
}

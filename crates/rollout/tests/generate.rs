//! Generation: parity with references, log-probabilities, determinism,
//! prefix sharing, preemption, stops and bad input.

mod common;

use colo_rollout::{Engine, EngineConfig, Error, FinishReason, Request, SamplingParams};
use common::*;

#[test]
fn greedy_matches_transformers_and_a_full_recompute() {
    for name in ["tiny-qwen2", "tiny-llama", "tiny-llama3", "tiny-qwen3"] {
        // Block size 4: prompts of 10 and 29 tokens end mid-block and the
        // 16 new tokens cross several blocks.
        let mut e = engine(name, 512, 4);
        let reference = greedy_reference(name);
        let reqs = reference
            .iter()
            .map(|(p, _)| Request::new(p.clone(), SamplingParams::greedy(16)))
            .collect();
        let out = ok(e.generate(reqs).unwrap());
        for ((prompt, expected), got) in reference.iter().zip(&out) {
            assert_eq!(
                &got[0].tokens, expected,
                "{name}: transformers' greedy tokens"
            );
            assert_eq!(got[0].finish_reason, FinishReason::Length);
            assert_eq!(
                got[0].tokens,
                naive_greedy(e.model().unwrap(), prompt, 16),
                "{name}: naive"
            );
        }
        // Longer than the fixture: 40 tokens against the naive reference.
        let (prompt, _) = &reference[1];
        let long = ok(e
            .generate(vec![Request::new(
                prompt.clone(),
                SamplingParams::greedy(40),
            )])
            .unwrap());
        assert_eq!(
            long[0][0].tokens,
            naive_greedy(e.model().unwrap(), prompt, 40),
            "{name}: 40 tokens"
        );
    }
}

#[test]
fn logprobs_equal_teacher_forced_recomputation() {
    for name in ["tiny-qwen2", "tiny-llama", "tiny-llama3", "tiny-qwen3"] {
        let mut e = engine(name, 1024, 8);
        let prompts: Vec<Vec<u32>> = greedy_reference(name).into_iter().map(|(p, _)| p).collect();
        for (t, top_k, top_p) in [(1.0, None, 1.0), (0.7, Some(20), 0.9)] {
            let params = SamplingParams {
                temperature: t,
                top_k,
                top_p,
                ..sampled(3, 24, 11)
            };
            let out = ok(e.generate(requests(&prompts, &params)).unwrap());
            let mut worst = 0f32;
            for (prompt, comps) in prompts.iter().zip(&out) {
                for c in comps {
                    let expected = teacher_forced(e.model().unwrap(), prompt, &c.tokens, t);
                    assert_eq!(expected.len(), c.logprobs.len());
                    for (a, b) in c.logprobs.iter().zip(&expected) {
                        worst = worst.max((a - b).abs());
                    }
                }
            }
            assert!(worst <= 1e-4, "{name} T={t}: worst |Δ logprob| = {worst}");
        }
    }
}

#[test]
fn same_seed_same_outputs_whatever_the_batch() {
    let mut e = engine("tiny-qwen2", 1024, 4);
    let prompts: Vec<Vec<u32>> = greedy_reference("tiny-qwen2")
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    let params = sampled(4, 20, 5);
    let alone = ok(e.generate(requests(&prompts[..1], &params)).unwrap());
    let batched = ok(e.generate(requests(&prompts, &params)).unwrap());
    assert_same(&alone, &batched[..1], 1e-5);
    let again = ok(e.generate(requests(&prompts, &params)).unwrap());
    assert_eq!(batched, again, "same engine, same requests: bit-identical");
    // The n samples differ from each other, and another seed differs.
    let toks: Vec<_> = batched[0].iter().map(|c| c.tokens.clone()).collect();
    assert!(
        toks.iter().skip(1).any(|t| *t != toks[0]),
        "samples are not all equal"
    );
    let other = ok(e
        .generate(requests(&prompts[..1], &sampled(4, 20, 6)))
        .unwrap());
    assert_ne!(other[0][0].tokens, alone[0][0].tokens);
}

/// Prefill and decode steps split over lanes (threads on the CPU, see
/// `colo_model::lanes`) give what one lane gives: the same tokens, and
/// log-probabilities equal up to float rounding.
#[test]
fn lanes_give_the_same_outputs_as_one() {
    let with = |threads: usize| {
        let cfg = EngineConfig {
            block_size: 4,
            cpu_threads: threads,
            ..EngineConfig::with_kv_tokens(1024)
        };
        Engine::from_dir(&fixture("tiny-qwen2"), pool(), &cfg).unwrap()
    };
    let prompts: Vec<Vec<u32>> = greedy_reference("tiny-qwen2")
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    let params = sampled(3, 12, 7);
    let one = ok(with(1).generate(requests(&prompts, &params)).unwrap());
    for threads in [2, 3] {
        let many = ok(with(threads).generate(requests(&prompts, &params)).unwrap());
        assert_same(&one, &many, 1e-5);
    }
}

#[test]
fn n_samples_hold_one_copy_of_the_prompt() {
    let mut e = engine("tiny-qwen2", 256, 4);
    let prompt: Vec<u32> = (10..20).collect(); // 10 tokens: 3 blocks, the last half full
    let out = ok(e
        .generate(vec![Request::new(prompt, sampled(4, 2, 1))])
        .unwrap());
    assert_eq!(out[0].len(), 4);
    let s = e.stats();
    assert_eq!(
        (s.prefills, s.prefill_tokens),
        (1, 10),
        "the prompt is prefilled once"
    );
    // 3 shared prompt blocks + a private copy of the partial block for 3 of
    // the 4 samples (the last writer keeps the original). Without sharing:
    // 4 × 3 = 12.
    assert_eq!(s.cow_copies, 3);
    assert_eq!(s.kv_blocks_peak, 6);
    assert_eq!(s.kv_blocks_used, 0, "everything is freed at the end");
}

#[test]
fn a_small_pool_preempts_and_gives_the_same_outputs() {
    let prompts: Vec<Vec<u32>> = greedy_reference("tiny-llama")
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    let params = sampled(3, 24, 3);
    let mut big = engine("tiny-llama", 4096, 4);
    let expected = ok(big.generate(requests(&prompts, &params)).unwrap());
    assert_eq!(big.stats().preemptions, 0);
    // 56 tokens: one sequence of 29 + 24 fits, the nine do not.
    let mut small = engine("tiny-llama", 56, 4);
    let got = ok(small.generate(requests(&prompts, &params)).unwrap());
    let s = small.stats();
    assert!(s.preemptions > 0, "{s:?}");
    assert!(s.kv_blocks_peak <= 14);
    assert_same(&expected, &got, 1e-5);
}

#[test]
fn bad_requests_fail_alone() {
    // 256 tokens of KV: a sequence may grow to the context (512) only if
    // its max_new_tokens keeps it within the pool.
    let mut e = engine("tiny-qwen2", 256, 16);
    let good = Request::new(vec![5, 6, 7], SamplingParams::greedy(4));
    let bad = |f: fn(&mut SamplingParams)| {
        let mut p = SamplingParams::greedy(4);
        f(&mut p);
        Request::new(vec![5, 6, 7], p)
    };
    let reqs = vec![
        good.clone(),
        Request::new(vec![1; 600], SamplingParams::greedy(4)),
        bad(|p| p.top_p = 0.0),
        bad(|p| p.temperature = -1.0),
        bad(|p| p.n = 0),
        Request::new(vec![9999], SamplingParams::greedy(4)),
        bad(|p| p.max_new_tokens = 2000),
        good,
        // Sizes beyond reason are refused, not overflowed or allocated.
        bad(|p| p.max_new_tokens = usize::MAX),
        bad(|p| p.n = 1 << 40),
    ];
    let out = e.generate(reqs).unwrap();
    let msg = |i: usize| match &out[i] {
        Err(e @ Error::InvalidRequest { .. }) => e.to_string(),
        other => panic!("request {i}: {other:?}"),
    };
    assert!(
        msg(1).contains("600 tokens") && msg(1).contains("512"),
        "{}",
        msg(1)
    );
    assert!(msg(2).contains("top_p"), "{}", msg(2));
    assert!(msg(3).contains("temperature"), "{}", msg(3));
    assert!(msg(4).contains("n must"), "{}", msg(4));
    assert!(msg(5).contains("9999"), "{}", msg(5));
    assert!(msg(6).contains("KV blocks"), "{}", msg(6));
    assert!(msg(8).contains("KV blocks"), "{}", msg(8));
    assert!(
        msg(9).contains("samples need a KV block each"),
        "{}",
        msg(9)
    );
    assert!(msg(2).starts_with("request "), "{}", msg(2));
    let first = &out[0].as_ref().unwrap().completions[0];
    assert_eq!(first.tokens.len(), 4);
    assert_eq!(out[7].as_ref().unwrap().completions[0], *first);
}

#[test]
fn stop_tokens_stop_strings_and_the_context_end() {
    let mut e = engine("tiny-qwen2", 1024, 8);
    let (prompt, greedy) = greedy_reference("tiny-qwen2").remove(1);
    let stop = greedy[5];
    let first_at = greedy.iter().position(|&t| t == stop).unwrap();
    let p = SamplingParams {
        stop_token_ids: vec![stop],
        ..SamplingParams::greedy(16)
    };
    let c = &ok(e.generate(vec![Request::new(prompt.clone(), p)]).unwrap())[0][0];
    assert_eq!(c.tokens, greedy[..=first_at]);
    assert_eq!(c.finish_reason, FinishReason::StopToken(stop));

    let tok = e.tokenizer().unwrap().clone();
    let text = tok.decode(&greedy, false).unwrap();
    let needle: String = text
        .chars()
        .skip(text.chars().count() / 2)
        .take(2)
        .collect();
    let p = SamplingParams {
        stop_strings: vec![needle.clone()],
        ..SamplingParams::greedy(16)
    };
    let c = &ok(e.generate(vec![Request::new(prompt, p)]).unwrap())[0][0];
    assert_eq!(c.finish_reason, FinishReason::StopString(needle.clone()));
    assert!(c.tokens.len() < 16 && greedy.starts_with(&c.tokens));
    assert!(tok.decode(&c.tokens, false).unwrap().contains(&needle));
    let shorter = tok.decode(&c.tokens[..c.tokens.len() - 1], false).unwrap();
    assert!(
        !shorter.contains(&needle),
        "stops at the first token completing the match"
    );

    // 510 prompt tokens in a context of 512: two tokens, then `length`.
    let c = &ok(e
        .generate(vec![Request::new(vec![7; 510], SamplingParams::greedy(16))])
        .unwrap())[0][0];
    assert_eq!(
        (c.tokens.len(), &c.finish_reason),
        (2, &FinishReason::Length)
    );
}

/// Regression: when a request's samples stopped at their first token, the
/// first one gave the shared prompt blocks back before the others had taken
/// their references (a panic in debug builds, corrupted reference counts in
/// release builds).
#[test]
fn samples_that_stop_at_their_first_token_share_the_prompt_safely() {
    let (prompt, reference) = greedy_reference("tiny-qwen2").remove(0);
    let first = reference[0];
    let mut e = engine("tiny-qwen2", 256, 4);
    let params = SamplingParams {
        n: 4,
        temperature: 0.0,
        stop_token_ids: vec![first],
        ..SamplingParams::greedy(8)
    };
    for _ in 0..3 {
        let out = ok(e
            .generate(requests(std::slice::from_ref(&prompt), &params))
            .unwrap());
        assert_eq!(out[0].len(), 4);
        assert!(out[0].iter().all(|c| c.tokens == vec![first]));
        assert_eq!(
            e.stats().kv_blocks_used,
            0,
            "every block is given back exactly once"
        );
    }
}

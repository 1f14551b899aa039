//! Token sampling: greedy, temperature, top-k, top-p, with a counter-based
//! random number per (seed, sample, step).
//!
//! The random number of a token depends only on the request's seed, the
//! completion's index and the token's position in the completion — not on
//! which other sequences share the batch, nor on preemption — so the same
//! requests give the same outputs however they are scheduled.

use std::cmp::Ordering;

use crate::request::SamplingParams;

/// splitmix64's finaliser: a bijective mix of 64 bits.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A uniform number in [0, 1) for token `step` of completion `sample`.
pub fn uniform(seed: u64, sample: usize, step: usize) -> f64 {
    let h = mix(mix(mix(seed) ^ sample as u64) ^ step as u64);
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// Descending by score, ties to the lower token id (a total order, so the
/// truncated set is the same on every run).
fn by_score_desc(a: &(f32, u32), b: &(f32, u32)) -> Ordering {
    b.0.total_cmp(&a.0).then(a.1.cmp(&b.1))
}

/// Reusable scratch space so that sampling allocates nothing per token.
#[derive(Debug, Default)]
pub struct Sampler {
    candidates: Vec<(f32, u32)>,
    weights: Vec<f32>,
}

impl Sampler {
    /// Picks a token from `logits` (vocab) with the uniform number `u`;
    /// returns it with its log-probability under the temperature-scaled,
    /// untruncated distribution (temperature 1 when greedy).
    pub fn sample(&mut self, logits: &[f32], p: &SamplingParams, u: f64) -> (u32, f32) {
        let inv_t = if p.is_greedy() {
            1.0
        } else {
            (1.0 / p.temperature) as f32
        };
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) * inv_t;
        // One pass of exponentials, kept for the inverse CDF below.
        let w = &mut self.weights;
        w.clear();
        w.extend(logits.iter().map(|&l| (l * inv_t - max).exp()));
        let sum: f64 = w.iter().map(|&x| x as f64).sum();
        let lse = max as f64 + sum.ln();
        let logprob = |tok: u32| (logits[tok as usize] as f64 * inv_t as f64 - lse) as f32;

        if p.is_greedy() {
            let tok = argmax(logits);
            return (tok, logprob(tok));
        }
        let vocab = logits.len();
        let k = p.top_k.unwrap_or(vocab).min(vocab);
        if k == vocab && p.top_p >= 1.0 {
            // Untruncated: inverse CDF in vocabulary order.
            let target = u * sum;
            let mut cum = 0.0;
            let mut last = 0;
            for (i, &x) in w.iter().enumerate() {
                if x > 0.0 {
                    last = i;
                }
                cum += x as f64;
                if cum > target {
                    return (i as u32, logprob(i as u32));
                }
            }
            return (last as u32, logprob(last as u32));
        }

        let c = &mut self.candidates;
        c.clear();
        c.extend(
            logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (l * inv_t, i as u32)),
        );
        if k < vocab {
            c.select_nth_unstable_by(k - 1, by_score_desc);
            c.truncate(k);
        }
        c.sort_unstable_by(by_score_desc);
        if p.top_p < 1.0 {
            let mut cum = 0.0;
            let mut keep = c.len();
            for (i, &(s, _)) in c.iter().enumerate() {
                cum += (s as f64 - lse).exp();
                if cum >= p.top_p {
                    keep = i + 1;
                    break;
                }
            }
            c.truncate(keep);
        }
        let total: f64 = c.iter().map(|&(s, _)| ((s - max) as f64).exp()).sum();
        let target = u * total;
        let mut cum = 0.0;
        for &(s, tok) in c.iter() {
            cum += ((s - max) as f64).exp();
            if cum > target {
                return (tok, logprob(tok));
            }
        }
        let tok = c.last().expect("top-k/top-p keep at least one token").1;
        (tok, logprob(tok))
    }
}

/// Index of the largest value, the first one on ties.
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(t: f64, k: Option<usize>, p: f64) -> SamplingParams {
        SamplingParams {
            temperature: t,
            top_k: k,
            top_p: p,
            ..SamplingParams::default()
        }
    }

    #[test]
    fn logprob_is_of_the_scaled_untruncated_distribution() {
        let logits = [2.0f32, 1.0, 0.0, -1.0];
        let mut s = Sampler::default();
        let t = 0.5;
        let (tok, lp) = s.sample(&logits, &params(t, Some(1), 1.0), 0.3);
        assert_eq!(tok, 0, "top-1 keeps the argmax");
        let z: f64 = logits.iter().map(|&l| (l as f64 / t).exp()).sum();
        let expected = (2.0 / t - z.ln()) as f32;
        assert!((lp - expected).abs() < 1e-6, "{lp} vs {expected}");
        assert!(lp < 0.0, "truncation must not renormalise the logprob");
    }

    #[test]
    fn top_p_keeps_the_nucleus() {
        // probabilities ≈ 0.64, 0.24, 0.09, 0.03
        let logits = [3.0f32, 2.0, 1.0, 0.0];
        let mut s = Sampler::default();
        let p = params(1.0, None, 0.7);
        for i in 0..200 {
            let (tok, _) = s.sample(&logits, &p, uniform(7, 0, i));
            assert!(tok <= 1, "token {tok} is outside the 0.7 nucleus");
        }
    }

    #[test]
    fn sampling_follows_the_distribution() {
        let logits = [0.0f32, (3.0f32).ln()]; // p = 0.25, 0.75
        let mut s = Sampler::default();
        let p = params(1.0, None, 1.0);
        let ones = (0..4000)
            .filter(|&i| s.sample(&logits, &p, uniform(1, 0, i)).0 == 1)
            .count();
        assert!((2850..3150).contains(&ones), "{ones} of 4000");
    }

    #[test]
    fn uniform_depends_on_every_coordinate() {
        let u = uniform(1, 2, 3);
        assert!((0.0..1.0).contains(&u));
        assert_ne!(u, uniform(1, 2, 4));
        assert_ne!(u, uniform(1, 3, 3));
        assert_ne!(u, uniform(2, 2, 3));
        assert_eq!(u, uniform(1, 2, 3));
    }
}

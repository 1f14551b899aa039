//! Token sampling for a whole batch at once: greedy, temperature, top-k,
//! top-p, each row with its own parameters and its own random number.
//!
//! **Randomness is counter-based, per request.** The random number of a
//! token is a hash of the request's seed, the completion's index and the
//! token's position in the completion ([`uniform`]) — not a draw from a
//! generator shared by the batch — so which other sequences share a decode
//! step, in which order, and whether a sequence was preempted and
//! recomputed does not change which token is drawn. The numbers are made
//! on the host (a few nanoseconds per row) and sent with the step; the
//! rest runs as a handful of batched tensor operations on the logits'
//! device, and only the chosen token ids and their log-probabilities come
//! back.
//!
//! **The draw is an inverse CDF in a fixed token order**: vocabulary order
//! for an untruncated distribution, descending probability (ties to the
//! lower id: a stable sort) once top-k or top-p truncate it. The
//! cumulative sums are in float64.
//!
//! **Log-probabilities** are under the temperature-scaled distribution
//! *before* truncation — what a trainer recomputes; temperature 1 for
//! greedy rows.

use tch::{Device, Kind, Tensor};

use crate::request::SamplingParams;
use crate::Result;

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

/// One row of a batched draw: its parameters and its uniform number
/// (from [`uniform`]).
#[derive(Debug, Clone, Copy)]
pub struct Draw<'a> {
    pub params: &'a SamplingParams,
    pub u: f64,
}

/// Picks one token per row of `logits` (rows, vocab), any float kind, row
/// `i` with `draws[i]`. Returns each token with its log-probability under
/// the temperature-scaled, untruncated distribution (temperature 1 when
/// greedy).
pub fn sample(logits: &Tensor, draws: &[Draw<'_>]) -> Result<Vec<(u32, f32)>> {
    let (rows, vocab) = logits.size2()?;
    if rows as usize != draws.len() {
        return Err(crate::Error::Unsupported(format!(
            "sample: {rows} rows of logits for {} draws",
            draws.len()
        )));
    }
    let dev = logits.device();
    let logits = logits.f_to_kind(Kind::Float)?;
    let inv_t: Vec<f32> = draws
        .iter()
        .map(|d| match d.params.is_greedy() {
            true => 1.0,
            false => (1.0 / d.params.temperature) as f32,
        })
        .collect();
    let scaled = match inv_t.iter().all(|&t| t == 1.0) {
        true => logits,
        false => &logits * host(&inv_t, dev).unsqueeze(1),
    };
    let probs = scaled.f_softmax(-1, Kind::Float)?; // (rows, vocab)

    // Rows by kind of draw; each group is a few batched operations.
    let group = |f: &dyn Fn(&SamplingParams) -> bool| -> Vec<i64> {
        (0..draws.len() as i64)
            .filter(|&i| f(draws[i as usize].params))
            .collect()
    };
    let truncates =
        |p: &SamplingParams| p.top_k.is_some_and(|k| k < vocab as usize) || p.top_p < 1.0;
    let greedy = group(&|p| p.is_greedy());
    let plain = group(&|p| !p.is_greedy() && !truncates(p));
    let truncated = group(&|p| !p.is_greedy() && truncates(p));
    // The rows of `t` in `group` (no copy when the group is every row).
    let rows_of = |t: &Tensor, group: &[i64]| -> Result<Tensor> {
        Ok(match group.len() as i64 == rows {
            true => t.shallow_clone(),
            false => t.f_index_select(0, &host(group, dev))?,
        })
    };

    // Each group's picks go into one tensor of every row's token on the
    // device; tokens and log-probabilities come back in one transfer (each
    // transfer waits for the device's queue to drain).
    let mut tokens = Tensor::f_zeros([rows], (Kind::Int64, dev))?;
    let mut put = |group: &[i64], picked: &Tensor| -> Result<()> {
        match group.len() as i64 == rows {
            true => tokens.f_copy_(picked)?,
            false => drop(tokens.f_index_copy_(0, &host(group, dev), picked)?),
        }
        Ok(())
    };
    let uniforms = |rows: &[i64]| -> Tensor {
        let u: Vec<f64> = rows.iter().map(|&i| draws[i as usize].u).collect();
        host(&u, dev)
    };
    if !greedy.is_empty() {
        put(&greedy, &rows_of(&scaled, &greedy)?.f_argmax(-1, false)?)?;
    }
    if !plain.is_empty() {
        // Inverse CDF in vocabulary order.
        let picked = inverse_cdf(&rows_of(&probs, &plain)?, &uniforms(&plain))?;
        put(&plain, &picked)?;
    }
    if !truncated.is_empty() {
        // Descending probability, ties to the lower id; keep the top k,
        // then the smallest prefix whose probability reaches top_p.
        let (sorted, order) = rows_of(&probs, &truncated)?.f_sort_stable(true, -1, true)?;
        let (ks, ps): (Vec<i64>, Vec<f64>) = truncated
            .iter()
            .map(|&i| {
                let p = draws[i as usize].params;
                (p.top_k.map_or(vocab, |k| k as i64), p.top_p)
            })
            .unzip();
        let rank = Tensor::arange(vocab, (Kind::Int64, dev)).unsqueeze(0);
        let before = sorted.f_cumsum(-1, Kind::Double)? - sorted.to_kind(Kind::Double);
        let keep = rank
            .lt_tensor(&host(&ks, dev).unsqueeze(1))
            .logical_and(&before.lt_tensor(&host(&ps, dev).unsqueeze(1)));
        let pos = inverse_cdf(&(sorted * keep), &uniforms(&truncated))?;
        put(
            &truncated,
            &order.gather(1, &pos.unsqueeze(1), false).squeeze_dim(1),
        )?;
    }

    // log p of the chosen tokens only (no full log-softmax): every chosen
    // token has positive probability, so its logarithm is finite. Both
    // travel as float64, which holds every token id exactly.
    let lps = probs
        .f_gather(1, &tokens.f_unsqueeze(1)?, false)?
        .f_squeeze_dim(1)?
        .f_log()?;
    let both = Tensor::f_cat(
        &[
            tokens.f_to_kind(Kind::Double)?,
            lps.f_to_kind(Kind::Double)?,
        ],
        0,
    )?;
    let both = Vec::<f64>::try_from(&both.f_to_device(Device::Cpu)?)?;
    let (tokens, lps) = both.split_at(draws.len());
    Ok(tokens
        .iter()
        .zip(lps)
        .map(|(&t, &lp)| (t as u32, lp as f32))
        .collect())
}

/// For each row of `weights` (rows, n) ≥ 0 with a positive total, the first
/// index whose cumulative weight exceeds `u` ∈ [0, 1) times the row's total
/// — never an index of weight zero.
///
/// Why never zero: the cumulative sums are in float64 and `u ≤ 1 − 2⁻⁵³`,
/// so the target `u · total` rounds to strictly less than the total and
/// the first index whose sum exceeds it exists and adds a positive weight.
fn inverse_cdf(weights: &Tensor, u: &Tensor) -> Result<Tensor> {
    let cdf = weights.f_cumsum(-1, Kind::Double)?; // (rows, n)
    let n = cdf.size()[1];
    let target = cdf.narrow(1, n - 1, 1) * u.unsqueeze(1); // (rows, 1)
    let idx = target.f_searchsorted(&cdf, false, true, "right", None::<&Tensor>)?;
    Ok(idx.clamp_max(n - 1).squeeze_dim(1))
}

/// A host slice as a tensor on `dev`.
fn host<T: tch::kind::Element>(v: &[T], dev: Device) -> Tensor {
    Tensor::from_slice(v).to_device(dev)
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

    fn logits(rows: usize, v: &[f32]) -> Tensor {
        Tensor::from_slice(v)
            .unsqueeze(0)
            .expand([rows as i64, v.len() as i64], false)
    }

    #[test]
    fn logprob_is_of_the_scaled_untruncated_distribution() {
        let l = [2.0f32, 1.0, 0.0, -1.0];
        let t = 0.5;
        let p = params(t, Some(1), 1.0);
        let out = sample(&logits(1, &l), &[Draw { params: &p, u: 0.3 }]).unwrap();
        let (tok, lp) = out[0];
        assert_eq!(tok, 0, "top-1 keeps the argmax");
        let z: f64 = l.iter().map(|&x| (x as f64 / t).exp()).sum();
        let expected = (2.0 / t - z.ln()) as f32;
        assert!((lp - expected).abs() < 1e-6, "{lp} vs {expected}");
        assert!(lp < 0.0, "truncation must not renormalise the logprob");
    }

    #[test]
    fn top_p_keeps_the_nucleus() {
        // probabilities ≈ 0.64, 0.24, 0.09, 0.03
        let p = params(1.0, None, 0.7);
        let draws: Vec<Draw> = (0..200)
            .map(|i| Draw {
                params: &p,
                u: uniform(7, 0, i),
            })
            .collect();
        let out = sample(&logits(200, &[3.0, 2.0, 1.0, 0.0]), &draws).unwrap();
        assert!(
            out.iter().all(|&(tok, _)| tok <= 1),
            "outside the 0.7 nucleus"
        );
        assert!(
            out.iter().any(|&(tok, _)| tok == 1),
            "the nucleus has two tokens"
        );
    }

    #[test]
    fn sampling_follows_the_distribution() {
        let p = params(1.0, None, 1.0);
        let draws: Vec<Draw> = (0..4000)
            .map(|i| Draw {
                params: &p,
                u: uniform(1, 0, i),
            })
            .collect();
        let out = sample(&logits(4000, &[0.0, (3.0f32).ln()]), &draws).unwrap(); // p = 0.25, 0.75
        let ones = out.iter().filter(|&&(tok, _)| tok == 1).count();
        assert!((2850..3150).contains(&ones), "{ones} of 4000");
    }

    #[test]
    fn rows_are_independent_of_their_batch() {
        // A row's token depends on its own logits, parameters and number
        // only: mixing greedy, plain and truncated rows changes nothing.
        let l = [0.3f32, -1.0, 2.0, 0.5, 1.5, -0.2];
        let (g, plain, trunc) = (
            SamplingParams::greedy(1),
            params(0.8, None, 1.0),
            params(1.3, Some(3), 0.8),
        );
        let all = [&g, &plain, &trunc, &plain, &trunc];
        let draws: Vec<Draw> = all
            .iter()
            .enumerate()
            .map(|(i, p)| Draw {
                params: p,
                u: uniform(3, i, 0),
            })
            .collect();
        let batch = sample(&logits(draws.len(), &l), &draws).unwrap();
        for (i, d) in draws.iter().enumerate() {
            assert_eq!(
                sample(&logits(1, &l), &[*d]).unwrap()[0],
                batch[i],
                "row {i}"
            );
        }
        assert_eq!(batch[0].0, 2, "greedy takes the argmax");
        let kept = [2, 4, 3];
        assert!(kept.contains(&batch[2].0) && kept.contains(&batch[4].0));
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

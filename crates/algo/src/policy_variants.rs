//! verl's other policy losses: the two that pick tokens by the covariance
//! of advantage and log-probability (KL-Cov, Clip-Cov), GMPO's geometric
//! mean of the token ratios, and SAPO's soft gate in place of the clip.
//!
//! Inputs, padding, kinds and metrics as in [`crate::policy_loss`], whose
//! [`policy_loss()`](crate::policy_loss()) dispatches here.

use tch::{Kind, Tensor};

use crate::agg::{agg_loss, AggScale, LossAgg, LossAggMode};
use crate::error::Result;
use crate::masked::{host_means, masked_sum_rows, MASK_EPS};
use crate::policy_loss::{
    prepare, with_is_weights, ClipRange, PolicyInputs, PolicyLoss, PolicyLossMetrics, Prepared,
    LOG_RATIO_CLAMP,
};
use crate::rng::SplitMix64;

/// Clip-Cov's settings (verl's `policy_loss.clip_cov_{ratio,lb,ub}`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClipCov {
    /// The share of the batch's response tokens whose gradient is dropped, in (0, 1].
    pub ratio: f64,
    /// Only tokens whose covariance lies in (lb, ub) may be chosen.
    pub lb: f64,
    pub ub: f64,
}

/// SAPO's gate temperatures (verl's `actor.tau_pos`, `actor.tau_neg`), > 0.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SapoTemperatures {
    /// For tokens with a positive advantage.
    pub pos: f64,
    /// For the others (verl's default is a little larger, 1.05 to 1.0,
    /// so negative updates fade faster away from the old policy).
    pub neg: f64,
}

/// Each response token's covariance (A_t − Ā)·(log π_θ(y_t) − mean log π_θ),
/// the means over the batch's response tokens, detached; −∞ on padding.
/// `None` when the batch has no response token. The second value is the
/// number of response tokens.
fn covariances(p: &Prepared, valid: &Tensor) -> Option<(Tensor, i64)> {
    let n = valid.sum(Kind::Int64).int64_value(&[]);
    if n == 0 {
        return None;
    }
    let mean = |t: &Tensor| t.masked_select(valid).mean(t.kind());
    let lp = p.log_prob.detach();
    let cov = (&p.advantages - mean(&p.advantages)) * (&lp - mean(&lp));
    Some((cov.where_scalarother(valid, f64::NEG_INFINITY), n))
}

/// A (batch, len) tensor of `mask`'s kind: 1.0 at the flat positions
/// `chosen`, 0.0 elsewhere.
fn indicator(mask: &Tensor, chosen: &Tensor) -> Tensor {
    let flat = mask.zeros_like().flatten(0, -1);
    flat.index_fill(0, chosen, 1.0).view_as(mask)
}

/// KL-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement
/// Learning for Reasoning Language Models", arXiv:2505.22617); verl's
/// `compute_policy_loss_kl_cov`. The loss is the unclipped −A·r, except on
/// the `ratio` fraction of the batch's response tokens (at least one) whose
/// covariance (A_t − Ā)·(log π_θ(y_t) − mean log π_θ) is largest — the
/// tokens that drive entropy down the most — which also pay
/// `coef`·|log π_θ − log π_old|:
///
/// ```text
/// l_t = −A_t·r_t + [t among the top tokens]·coef·|log r_t|
/// ```
///
/// with r unclamped, as verl has it; times the IS weight if given,
/// aggregated with `agg`. Means and covariances are over the response
/// tokens of this call's batch (a micro-batch, as in verl). `ppo_kl`
/// reports the mean |log r| (verl's metric for this mode); the clip
/// fractions are 0. `ratio` is in (0, 1].
pub fn kl_cov_loss(x: &PolicyInputs, ratio: f64, coef: f64, agg: LossAgg) -> Result<PolicyLoss> {
    let p = prepare(x)?;
    let neg_kl = &p.log_prob - &p.old_log_prob;
    let abs_kl = neg_kl.abs();
    let plain = -&p.advantages * neg_kl.exp();
    let valid = p.mask.gt(0.0);
    let penalised = match covariances(&p, &valid) {
        None => p.mask.zeros_like(),
        Some((cov, n)) => {
            let k = ((n as f64 * ratio) as i64).max(1);
            let (_, top) = cov.flatten(0, -1).topk(k, 0, true, true);
            indicator(&p.mask, &top)
        }
    };
    let pg = with_is_weights(plain + &penalised * coef * &abs_kl, &p.is_weights);
    let loss = agg_loss(&pg, &p.mask, agg)?;
    let m = host_means(&[(&abs_kl.detach(), &p.mask)])?;
    let metrics = PolicyLossMetrics {
        ppo_kl: m[0],
        ..PolicyLossMetrics::default()
    };
    Ok(PolicyLoss { loss, metrics })
}

/// `k` of the flat positions where `candidates` (bool) is true, drawn
/// without replacement by a generator seeded with `seed` (all of them when
/// there are at most `k`), as flat indices (int64).
fn seeded_choice(candidates: &Tensor, k: i64, seed: u64) -> Result<Tensor> {
    let idx = candidates.flatten(0, -1).nonzero().squeeze_dim(1);
    let mut all = Vec::<i64>::try_from(&idx)?;
    let k = usize::try_from(k).unwrap_or(0).min(all.len());
    // A partial Fisher–Yates: the first k places hold a uniform k-subset.
    let mut g = SplitMix64::new(seed);
    for i in 0..k {
        let j = i + g.below((all.len() - i) as u64) as usize;
        all.swap(i, j);
    }
    all.truncate(k);
    Ok(Tensor::from_slice(&all).to_device(candidates.device()))
}

/// Clip-Cov (Cui et al. 2025, arXiv:2505.22617, as KL-Cov); verl's
/// `compute_policy_loss_clip_cov`: PPO's clipped loss, except that a few
/// tokens lose their gradient. Those are `cc.ratio` of the batch's
/// response tokens (at least one), drawn at random among the tokens whose
/// covariance (A_t − Ā)·(log π_θ(y_t) − mean log π_θ) lies in
/// (`cc.lb`, `cc.ub`) and that PPO's clip has not already stopped:
///
/// ```text
/// l_t = max(−A_t·r_t, −A_t·clip(r_t, 1 − ε_low, 1 + ε_high))·[t not drawn]
/// ```
///
/// with r unclamped and no dual clip, as verl has it; times the IS weight
/// if given, aggregated with `agg`. verl draws with `torch.randperm` on
/// the global generator; here the draw comes from `seed`, so a run and its
/// resumption drop the same tokens. `pg_clipfrac` is the share of tokens
/// drawn (verl's metric for this mode); `pg_clipfrac_lower` is 0.
pub fn clip_cov_loss(
    x: &PolicyInputs,
    clip: &ClipRange,
    cc: &ClipCov,
    seed: u64,
    agg: LossAgg,
) -> Result<PolicyLoss> {
    let p = prepare(x)?;
    let neg_kl = &p.log_prob - &p.old_log_prob;
    let ratio = neg_kl.exp();
    let neg_adv = -&p.advantages;
    let l1 = &neg_adv * &ratio;
    let l2 = &neg_adv * ratio.clamp(1.0 - clip.low, 1.0 + clip.high);
    let valid = p.mask.gt(0.0);
    let dropped = match covariances(&p, &valid) {
        None => p.mask.zeros_like(),
        Some((cov, n)) => {
            let clipped = l2.detach().gt_tensor(&l1.detach());
            let candidates = cov
                .gt(cc.lb)
                .logical_and(&cov.lt(cc.ub))
                .logical_and(&clipped.logical_not());
            let k = ((n as f64 * cc.ratio) as i64).max(1);
            indicator(&p.mask, &seeded_choice(&candidates, k, seed)?)
        }
    };
    let kept = 1.0 - &dropped;
    let pg = with_is_weights(l1.maximum(&l2) * kept, &p.is_weights);
    let loss = agg_loss(&pg, &p.mask, agg)?;
    let kl = -neg_kl.detach();
    let m = host_means(&[(&dropped, &p.mask), (&kl, &p.mask)])?;
    let metrics = PolicyLossMetrics {
        pg_clipfrac: m[0],
        pg_clipfrac_lower: 0.0,
        ppo_kl: m[1],
    };
    Ok(PolicyLoss { loss, metrics })
}

/// GMPO (Zhao et al. 2025, "Geometric-Mean Policy Optimization",
/// arXiv:2507.20673); verl's `compute_policy_loss_geo_mean`. Each
/// sequence's ratio is the geometric mean of its token ratios, each token's
/// log-ratio clipped (in log space) against the sign of its advantage:
///
/// ```text
/// c_t = sgn(A_t)·min(sgn(A_t)·log r_t, sgn(A_t)·clip(log r_t, −ε_low, ε_high))
/// l_i = −Ā_i·exp(mean_t c_t)          Ā_i: the sequence's mean advantage
/// ```
///
/// with r unclamped, as verl has it. The IS weights, if given, enter as
/// their geometric mean over the sequence. The loss is the mean of l_i
/// over the sequences; `loss_agg_mode` is ignored (as in verl). verl
/// divides by the micro-batch's rows; colo by `scale.global_batch_size`
/// when set (so micro-batches add up to the mini-batch's loss), else by
/// this call's non-empty sequences: the same unless a response has no token.
/// `pg_clipfrac` is the share of tokens whose log-ratio left the range with
/// A > 0, `pg_clipfrac_lower` with A < 0. verl's GMPO clips with
/// ε = 0.4 in log space (e^±0.4), not PPO's 0.2.
pub fn geo_mean_loss(x: &PolicyInputs, clip: &ClipRange, scale: AggScale) -> Result<PolicyLoss> {
    let p = prepare(x)?;
    let neg_kl = &p.log_prob - &p.old_log_prob;
    let sign = p.advantages.sign();
    let clamped = neg_kl.clamp(-clip.low, clip.high);
    let chosen = (&sign * &neg_kl).minimum(&(&sign * &clamped)) * &sign;
    let len = p.mask.sum_dim_intlist(-1, false, p.mask.kind()) + MASK_EPS;
    let ratio = (masked_sum_rows(&chosen, &p.mask)? / &len).exp();
    let advantage = masked_sum_rows(&p.advantages, &p.mask)? / &len;
    let pg = -advantage * ratio; // (batch,)
    let pg = match &p.is_weights {
        Some(w) => {
            let log_w = (w + 1e-10).log();
            pg * (masked_sum_rows(&log_w, &p.mask)? / &len).exp()
        }
        None => pg,
    };
    let nonempty = p.mask.sum_dim_intlist(-1, false, p.mask.kind()).gt(0.0);
    let rows = nonempty.sum(Kind::Int64).int64_value(&[]).max(1) as f64;
    let loss = pg.sum(pg.kind()) / scale.global_batch_size.unwrap_or(rows);

    let kind = p.mask.kind();
    let was_clipped = neg_kl.detach().ne_tensor(&clamped.detach());
    let upper = was_clipped.logical_and(&p.advantages.gt(0.0)).to_kind(kind);
    let lower = was_clipped.logical_and(&p.advantages.lt(0.0)).to_kind(kind);
    let kl = -neg_kl.detach();
    let m = host_means(&[(&upper, &p.mask), (&lower, &p.mask), (&kl, &p.mask)])?;
    let metrics = PolicyLossMetrics {
        pg_clipfrac: m[0],
        pg_clipfrac_lower: m[1],
        ppo_kl: m[2],
    };
    Ok(PolicyLoss { loss, metrics })
}

/// SAPO (Gao et al. 2025, "Soft Adaptive Policy Optimization",
/// arXiv:2511.20347); verl's `compute_policy_loss_sapo`. A smooth gate of
/// the ratio replaces the clip, so a token's gradient fades as its ratio
/// leaves 1 instead of stopping at a bound:
///
/// ```text
/// f(r) = σ(τ·(r − 1))·4/τ,     τ = tau.pos if A_t > 0, else tau.neg
/// l_t  = −f(r_t)·A_t
/// ```
///
/// with r = exp(clamp(log π_θ − log π_old, ±20)); f(1) has slope 1, so
/// on-policy the gradient is the plain policy gradient. Times the IS weight
/// if given; aggregated with seq-mean-token-mean whatever `loss_agg_mode`
/// says (as in verl), with `scale`. No clip: the clip fractions are 0.
pub fn sapo_loss(x: &PolicyInputs, tau: &SapoTemperatures, scale: AggScale) -> Result<PolicyLoss> {
    let p = prepare(x)?;
    let neg_kl = (&p.log_prob - &p.old_log_prob).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP);
    let ratio = neg_kl.exp();
    let taus = p
        .advantages
        .gt(0.0)
        .to_kind(p.mask.kind())
        .multiply_scalar(tau.pos - tau.neg)
        + tau.neg;
    let gate = (&taus * (ratio - 1.0)).sigmoid() * 4.0 / &taus;
    let pg = with_is_weights(-gate * &p.advantages, &p.is_weights);
    let agg = LossAgg {
        mode: LossAggMode::SeqMeanTokenMean,
        scale,
    };
    let loss = agg_loss(&pg, &p.mask, agg)?;
    let kl = -neg_kl.detach();
    let m = host_means(&[(&kl, &p.mask)])?;
    let metrics = PolicyLossMetrics {
        ppo_kl: m[0],
        ..PolicyLossMetrics::default()
    };
    Ok(PolicyLoss { loss, metrics })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::masked::test_util::*;
    use crate::policy_loss::tests::run;

    // The hand cases' values below (losses, gradients, metrics) are also
    // what verl's own functions give on the same inputs (torch 2.11, f64).

    fn close(got: &[f32], want: &[f64]) {
        for (x, w) in got.iter().zip(want) {
            assert!((*x as f64 - w).abs() < 1e-5, "{got:?} vs {want:?}");
        }
    }

    // KL-Cov, ratio 0.25 of 4 tokens → k = 1, coef 0.1, old log-prob 0:
    // A = [1, −1, 2, 0], lp = [−1, −2, −0.5, −3]; means 0.5 and −1.625;
    // covariances 0.3125, 0.5625, 1.6875, 0.6875 → token 2 pays 0.1·|−0.5|.
    // l = [−e⁻¹, e⁻², −2e^−0.5 + 0.05, 0], token-mean −0.348901;
    // grad = [−e⁻¹, e⁻², −2e^−0.5 − 0.1, 0] / 4; ppo_kl = mean |lp| = 1.625.
    #[test]
    fn kl_cov_penalises_the_tokens_of_largest_covariance() {
        let old = t2(&[&[0.0, 0.0, 0.0, 0.0, 0.0]]);
        let lp = t2(&[&[-1.0, -2.0, -0.5, -3.0, 7.0]]);
        let adv = t2(&[&[1.0, -1.0, 2.0, 0.0, 9.0]]);
        let mask = t2(&[&[1.0, 1.0, 1.0, 1.0, 0.0]]);
        let f = |x: &PolicyInputs| kl_cov_loss(x, 0.25, 0.1, LossAggMode::TokenMean.into());
        let (loss, g, m) = run(f, &old, &lp, &adv, &mask);
        assert!((loss + 0.348_901).abs() < 1e-5, "{loss}");
        let e = |x: f64| x.exp();
        close(
            &g[0],
            &[-e(-1.0), e(-2.0), -2.0 * e(-0.5) - 0.1, 0.0, 0.0].map(|x| x / 4.0),
        );
        assert_eq!((m.pg_clipfrac, m.pg_clipfrac_lower), (0.0, 0.0));
        assert!((m.ppo_kl - 1.625).abs() < 1e-6, "{m:?}");
    }

    // Clip-Cov, ε 0.2, lb 1, ub 5, ratio 0.25 of 4 tokens → one drawn,
    // old log-prob 0, lp = [−1, −3, −2, −2] (mean −2), A = [2, −2, 0.5, −0.5] (mean 0):
    // covariances 2, 2, 0, 0. Token 1 (r = e⁻³, A < 0) is clipped by PPO
    // (−A·0.8 = 1.6 > −A·r), so token 0 is the only candidate and is drawn:
    // l = [0, 1.6, −0.5·e⁻², 0.4 (clipped)], token-mean 0.483083;
    // the only gradient is token 2's, −A·r / 4 = −0.5·e⁻² / 4.
    #[test]
    fn clip_cov_drops_a_candidate_token_that_ppo_did_not_clip() {
        let old = t2(&[&[0.0; 5]]);
        let lp = t2(&[&[-1.0, -3.0, -2.0, -2.0, 4.0]]);
        let adv = t2(&[&[2.0, -2.0, 0.5, -0.5, 9.0]]);
        let mask = t2(&[&[1.0, 1.0, 1.0, 1.0, 0.0]]);
        let clip = ClipRange::new(0.2, 0.2, 3.0).unwrap();
        let cc = ClipCov {
            ratio: 0.25,
            lb: 1.0,
            ub: 5.0,
        };
        for seed in 0..4 {
            let f = |x: &PolicyInputs| {
                clip_cov_loss(x, &clip, &cc, seed, LossAggMode::TokenMean.into())
            };
            let (loss, g, m) = run(f, &old, &lp, &adv, &mask);
            let e2 = (-2f64).exp();
            assert!((loss - (1.6 - 0.5 * e2 + 0.4) / 4.0).abs() < 1e-6, "{loss}");
            close(&g[0], &[0.0, 0.0, -0.5 * e2 / 4.0, 0.0, 0.0]);
            assert!((m.pg_clipfrac - 0.25).abs() < 1e-6, "{m:?}");
            assert!((m.ppo_kl - 2.0).abs() < 1e-6, "{m:?}");
        }
    }

    #[test]
    fn clip_cov_draws_its_tokens_by_the_seed() {
        // 40 candidates, 5 drawn: always 5 distinct candidates, the same
        // for a seed, and not the same for every seed.
        let candidates = Tensor::arange(80, (Kind::Int64, tch::Device::Cpu))
            .remainder(2)
            .eq(0)
            .view([8, 10]);
        let draw =
            |seed| Vec::<i64>::try_from(&seeded_choice(&candidates, 5, seed).unwrap()).unwrap();
        let mut seen = std::collections::BTreeSet::new();
        for seed in 0..20 {
            let d = draw(seed);
            assert_eq!(d, draw(seed));
            let distinct: std::collections::BTreeSet<_> = d.iter().collect();
            assert_eq!(distinct.len(), 5, "{d:?}");
            assert!(d.iter().all(|i| i % 2 == 0 && (0..80).contains(i)), "{d:?}");
            seen.extend(d);
        }
        assert!(seen.len() > 30, "20 draws of 5 reached only {seen:?}");
        // Fewer candidates than asked for: all of them.
        let few = Tensor::from_slice(&[false, true, false, true]).view([1, 4]);
        let mut d = Vec::<i64>::try_from(&seeded_choice(&few, 3, 7).unwrap()).unwrap();
        d.sort();
        assert_eq!(d, vec![1, 3]);
    }

    // GMPO, ε = 0.4 in log space, old log-prob 0, two rows of two tokens:
    //  row 0, A = +1, log r = [0.1, 0.5] → clipped [0.1, 0.4], mean 0.25: l = −e^0.25;
    //  row 1, A = −1, log r = [−0.1, −0.6] → [−0.1, −0.4], mean −0.25: l = +e^−0.25.
    // loss = (−e^0.25 + e^−0.25)/2; only the unclipped tokens have a gradient:
    // ∂/∂lp₀₀ = −e^0.25/2/2, ∂/∂lp₁₀ = e^−0.25/2/2. One token in four clipped each way;
    // ppo_kl = −(0.1 + 0.5 − 0.1 − 0.6)/4 = 0.025.
    #[test]
    fn geo_mean_clips_in_log_space_against_the_advantage() {
        let old = t2(&[&[0.0, 0.0, 0.0], &[0.0, 0.0, 0.0]]);
        let lp = t2(&[&[0.1, 0.5, 3.0], &[-0.1, -0.6, 3.0]]);
        let adv = t2(&[&[1.0, 1.0, 5.0], &[-1.0, -1.0, 5.0]]);
        let mask = t2(&[&[1.0, 1.0, 0.0], &[1.0, 1.0, 0.0]]);
        let clip = ClipRange::new(0.4, 0.4, 3.0).unwrap();
        let f = |x: &PolicyInputs| geo_mean_loss(x, &clip, AggScale::default());
        let (loss, g, m) = run(f, &old, &lp, &adv, &mask);
        let (up, down) = (0.25f64.exp(), (-0.25f64).exp());
        assert!((loss - (down - up) / 2.0).abs() < 1e-6, "{loss}");
        close(&g[0], &[-up / 4.0, 0.0, 0.0]);
        close(&g[1], &[down / 4.0, 0.0, 0.0]);
        assert!((m.pg_clipfrac - 0.25).abs() < 1e-6, "{m:?}");
        assert!((m.pg_clipfrac_lower - 0.25).abs() < 1e-6, "{m:?}");
        assert!((m.ppo_kl - 0.025).abs() < 1e-6, "{m:?}");
        // A global count of sequences replaces the local one.
        let scale = AggScale {
            global_batch_size: Some(4.0),
            ..AggScale::default()
        };
        let f = |x: &PolicyInputs| geo_mean_loss(x, &clip, scale);
        let (halved, _, _) = run(f, &old, &lp, &adv, &mask);
        assert!((halved - loss / 2.0).abs() < 1e-6, "{halved}");
    }

    // SAPO, τ₊ = 1, τ₋ = 1.05, old log-prob 0, one row:
    //  t0: r = 1.5, A = +1: l = −4σ(0.5), ∂l/∂lp = −4σ(0.5)(1 − σ(0.5))·1.5;
    //  t1: r = 0.5, A = −1: l = 4σ(−0.525)/1.05, ∂l/∂lp = 4σ(−0.525)(1 − σ(−0.525))·0.5;
    // seq-mean-token-mean over 2 tokens.
    #[test]
    fn sapo_gates_the_ratio_smoothly() {
        let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
        let old = t2(&[&[0.0, 0.0, 0.0]]);
        let lp = t2(&[&[1.5f32.ln(), 0.5f32.ln(), 2.0]]);
        let adv = t2(&[&[1.0, -1.0, 3.0]]);
        let mask = t2(&[&[1.0, 1.0, 0.0]]);
        let tau = SapoTemperatures {
            pos: 1.0,
            neg: 1.05,
        };
        let f = |x: &PolicyInputs| sapo_loss(x, &tau, AggScale::default());
        let (loss, g, m) = run(f, &old, &lp, &adv, &mask);
        let (s0, s1) = (sig(0.5), sig(-0.525));
        let want = (-4.0 * s0 + 4.0 * s1 / 1.05) / 2.0;
        assert!((loss - want).abs() < 1e-6, "{loss} vs {want}");
        close(
            &g[0],
            &[
                -4.0 * s0 * (1.0 - s0) * 1.5 / 2.0,
                4.0 * s1 * (1.0 - s1) * 0.5 / 2.0,
                0.0,
            ],
        );
        assert_eq!((m.pg_clipfrac, m.pg_clipfrac_lower), (0.0, 0.0));
        // On-policy the gate's slope is 1: the plain policy gradient −A/n.
        let (_, g, _) = run(f, &old, &old.copy(), &adv, &mask);
        close(&g[0], &[-0.5, 0.5, 0.0]);
    }
}

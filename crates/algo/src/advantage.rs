//! Advantage estimators, chosen by [`AdvEstimator`], and the token-level ones:
//! GAE, REINFORCE++ and ReMax. The group-baseline ones (GRPO, Dr. GRPO, RLOO,
//! REINFORCE++-baseline) are in [`crate::group`]; OPO, GRPO for pass@k and
//! GPG in [`crate::group_variants`].
//!
//! Representation: inputs and outputs are (batch, response_len) tensors on one
//! device; the estimators are not differentiated (inputs are read as data and
//! detached) and run as tensor ops on that device, so the batch never makes a
//! round trip through the host. The outputs have the rewards' kind; the
//! arithmetic runs in [`acc_kind`](crate::masked::acc_kind) (f32 for bf16).
//! Per-sequence data (prompt ids, baseline scores) are plain slices, one entry
//! per row, uploaded once.
//!
//! The recurrences of GAE and REINFORCE++ run backwards in time. Instead of
//! one step per token (verl's Python loop: response_len launches of a few
//! kernels each), both are written as the linear recurrence
//! x_t = b_t + a_t·x_{t+1} and solved by recursive doubling
//! (`reverse_linear_scan`): ⌈log₂ response_len⌉ rounds of element-wise ops
//! over the whole batch.
//!
//! Conventions shared by all estimators: rewards are read through the mask
//! (r·mask, NaN-safe), and both outputs are zero on padding. verl leaves
//! whitened values on padding positions; since every consumer masks them, the
//! only visible difference is cleaner tensors.

use serde::{Deserialize, Serialize};
use tch::Tensor;

use crate::error::{Error, Result};
use crate::masked::{check_all, masked_whiten, upcast, zero_padding};
use crate::{group, group_variants};

/// Which advantage estimator. Config names are verl's (`adv_estimator = "grpo"`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdvEstimator {
    /// Generalized Advantage Estimation with a critic: [`gae`].
    Gae,
    /// Group-normalised outcome advantage (Dr. GRPO with `norm_adv_by_std_in_grpo = false`):
    /// [`group::grpo`].
    #[default]
    Grpo,
    /// Leave-one-out baseline: [`group::rloo`].
    Rloo,
    /// Discounted returns, whitened over the batch: [`reinforce_plus_plus`].
    ReinforcePlusPlus,
    /// Group mean subtracted, then whitened over the batch: [`group::reinforce_plus_plus_baseline`].
    ReinforcePlusPlusBaseline,
    /// Score minus the greedy response's score: [`remax`].
    Remax,
    /// Score minus the group's length-weighted mean: [`group_variants::opo`].
    Opo,
    /// Only each group's best response, by its lead over the second:
    /// [`group_variants::grpo_passk`].
    GrpoPassk,
    /// Group-centred, rescaled by the batch's share of non-zero scores:
    /// [`group_variants::gpg`].
    Gpg,
}

impl AdvEstimator {
    /// The config name.
    pub fn name(self) -> &'static str {
        match self {
            AdvEstimator::Gae => "gae",
            AdvEstimator::Grpo => "grpo",
            AdvEstimator::Rloo => "rloo",
            AdvEstimator::ReinforcePlusPlus => "reinforce_plus_plus",
            AdvEstimator::ReinforcePlusPlusBaseline => "reinforce_plus_plus_baseline",
            AdvEstimator::Remax => "remax",
            AdvEstimator::Opo => "opo",
            AdvEstimator::GrpoPassk => "grpo_passk",
            AdvEstimator::Gpg => "gpg",
        }
    }
}

/// The advantage settings as written in the config (verl's `algorithm.*` names).
///
/// Unknown keys are not rejected here, so that the run's config can
/// `#[serde(flatten)]` this into its `algorithm` section, which owns that check.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AdvantageConfig {
    /// The estimator.
    pub adv_estimator: AdvEstimator,
    /// Discount γ (GAE, REINFORCE++).
    pub gamma: f64,
    /// GAE's λ.
    pub lam: f64,
    /// GRPO divides by the group std; `false` is Dr. GRPO.
    pub norm_adv_by_std_in_grpo: bool,
    /// Whiten GAE advantages over the batch (verl always does; `true` by default).
    pub whiten_gae: bool,
    /// ε added to the group std (verl's 1e-6).
    pub epsilon: f64,
}

impl Default for AdvantageConfig {
    fn default() -> Self {
        AdvantageConfig {
            adv_estimator: AdvEstimator::Grpo,
            gamma: 1.0,
            lam: 1.0,
            norm_adv_by_std_in_grpo: true,
            whiten_gae: true,
            epsilon: 1e-6,
        }
    }
}

/// Everything an estimator may read; which fields are needed depends on the estimator.
#[derive(Clone, Copy, Debug)]
pub struct AdvantageInputs<'a> {
    /// (batch, response_len): per-token rewards; outcome rewards sit on the last
    /// response token, possibly with a KL penalty spread over all tokens.
    pub token_level_rewards: &'a Tensor,
    /// (batch, response_len): 1.0 on response tokens, 0.0 on padding.
    pub response_mask: &'a Tensor,
    /// (batch, response_len): the critic's values; GAE only.
    pub values: Option<&'a Tensor>,
    /// (batch,): the prompt id of each row; rows with the same id form a group.
    /// GRPO, RLOO and REINFORCE++-baseline.
    pub index: Option<&'a [u64]>,
    /// (batch,): the greedy response's score for each row's prompt; ReMax only.
    pub reward_baselines: Option<&'a [f32]>,
}

/// The estimator's output; both (batch, response_len) of the rewards' kind,
/// zero on padding, detached.
#[derive(Debug)]
pub struct Advantages {
    /// Â, what the policy loss multiplies.
    pub advantages: Tensor,
    /// Targets for the critic (GAE: Â + V before whitening); outcome estimators
    /// return their returns as verl does (for most, equal to the advantages,
    /// and then the same storage).
    pub returns: Tensor,
}

/// A clone shares both tensors' storage with the original (`shallow_clone`).
impl Clone for Advantages {
    fn clone(&self) -> Self {
        Advantages {
            advantages: self.advantages.shallow_clone(),
            returns: self.returns.shallow_clone(),
        }
    }
}

/// Runs the configured estimator, after checking that the inputs it needs are there.
pub fn compute_advantage(cfg: &AdvantageConfig, x: &AdvantageInputs) -> Result<Advantages> {
    let est = cfg.adv_estimator;
    let need = |present: bool, arg: &'static str| {
        if present {
            Ok(())
        } else {
            Err(Error::MissingInput {
                estimator: est.name(),
                arg,
            })
        }
    };
    let (r, m) = (x.token_level_rewards, x.response_mask);
    match est {
        AdvEstimator::Gae => {
            need(x.values.is_some(), "values")?;
            let v = x.values.unwrap_or(r);
            gae(r, v, m, cfg.gamma, cfg.lam, cfg.whiten_gae)
        }
        AdvEstimator::Grpo => {
            need(x.index.is_some(), "index")?;
            let idx = x.index.unwrap_or_default();
            group::grpo(r, m, idx, cfg.epsilon, cfg.norm_adv_by_std_in_grpo)
        }
        AdvEstimator::Rloo => {
            need(x.index.is_some(), "index")?;
            group::rloo(r, m, x.index.unwrap_or_default())
        }
        AdvEstimator::ReinforcePlusPlus => reinforce_plus_plus(r, m, cfg.gamma),
        AdvEstimator::ReinforcePlusPlusBaseline => {
            need(x.index.is_some(), "index")?;
            group::reinforce_plus_plus_baseline(r, m, x.index.unwrap_or_default())
        }
        AdvEstimator::Remax => {
            need(x.reward_baselines.is_some(), "reward_baselines")?;
            remax(r, m, x.reward_baselines.unwrap_or_default())
        }
        AdvEstimator::Opo => {
            need(x.index.is_some(), "index")?;
            group_variants::opo(r, m, x.index.unwrap_or_default())
        }
        AdvEstimator::GrpoPassk => {
            need(x.index.is_some(), "index")?;
            let idx = x.index.unwrap_or_default();
            group_variants::grpo_passk(r, m, idx, cfg.epsilon, cfg.norm_adv_by_std_in_grpo)
        }
        AdvEstimator::Gpg => {
            need(x.index.is_some(), "index")?;
            group_variants::gpg(r, m, x.index.unwrap_or_default())
        }
    }
}

/// Rewards read through the mask (r·mask, NaN-safe) and the mask, both
/// detached and in the accumulation kind, after checking shapes, kinds and devices.
pub(crate) fn clean_rewards(
    token_level_rewards: &Tensor,
    response_mask: &Tensor,
) -> Result<(Tensor, Tensor)> {
    check_all(
        ("token_level_rewards", token_level_rewards),
        &[("response_mask", response_mask)],
    )?;
    let mask = upcast(&response_mask.detach());
    let rewards = zero_padding(&upcast(&token_level_rewards.detach()), &mask) * &mask;
    Ok((rewards, mask))
}

/// Whitens over the mask (verl `masked_whiten`, unbiased variance) and zeroes padding.
pub(crate) fn whiten_masked(t: &Tensor, mask: &Tensor) -> Result<Tensor> {
    Ok(masked_whiten(t, mask, true)? * mask)
}

/// `x` moved `d` columns to the left, zero-filled on the right: column t holds x_{t+d}.
fn shift_left(x: &Tensor, d: i64) -> Tensor {
    let len = x.size()[1];
    let d = d.min(len);
    x.narrow(1, d, len - d).constant_pad_nd([0, d])
}

/// Solves x_t = b_t + a_t·x_{t+1} backwards along each row of (batch, len)
/// tensors, with x = 0 past the end, by recursive doubling (the scan of
/// Hillis & Steele 1986 applied to affine maps; Blelloch 1990, "Prefix Sums
/// and Their Applications", §1.4).
///
/// After the round with stride d, (a_t, b_t) describe the segment [t, t + 2d):
/// x_t = b_t + a_t·x_{t+2d}. Composing two segments is
/// (a_t·a_{t+d}, b_t + a_t·b_{t+d}), and past the end both are 0. So
/// ⌈log₂ len⌉ rounds of element-wise ops replace len sequential steps.
pub(crate) fn reverse_linear_scan(a: &Tensor, b: &Tensor) -> Tensor {
    let len = a.size()[1];
    let (mut a, mut b) = (a.shallow_clone(), b.shallow_clone());
    let mut d = 1;
    while d < len {
        b = b.addcmul(&a, &shift_left(&b, d));
        a = &a * shift_left(&a, d);
        d *= 2;
    }
    b
}

/// Generalized Advantage Estimation (Schulman et al. 2016, "High-Dimensional
/// Continuous Control Using Generalized Advantage Estimation", arXiv:1506.02438);
/// verl `compute_gae_advantage_return`.
///
/// Per row, backwards over t, skipping masked positions (their value and TD
/// error are not used, the recursion carries over them):
///
/// ```text
/// δ_t = r_t + γ·V_next − V_t
/// A_t = δ_t + γλ·A_next
/// ```
///
/// where V_next and A_next are those of the next unmasked position (0 past the
/// end). Returns = A + V (before whitening); advantages are then whitened over
/// the batch if `whiten` (verl always whitens). Shapes: rewards, values and
/// mask (batch, response_len). Whitening needs ≥ 2 unmasked tokens.
pub fn gae(
    token_level_rewards: &Tensor,
    values: &Tensor,
    response_mask: &Tensor,
    gamma: f64,
    lam: f64,
    whiten: bool,
) -> Result<Advantages> {
    check_all(
        ("token_level_rewards", token_level_rewards),
        &[("values", values)],
    )?;
    let (r, mask) = clean_rewards(token_level_rewards, response_mask)?;
    let v = zero_padding(&upcast(&values.detach()), &mask);
    let keep = mask.ne(0.0).to_kind(mask.kind());
    let skip = 1.0 - &keep;
    // c_t = V_t if t is kept, else c_{t+1}: the value of the first kept position
    // at or after t. V_next of position t is c_{t+1}.
    let next_value = shift_left(&reverse_linear_scan(&skip, &v), 1);
    let delta = (r + next_value * gamma - &v) * &keep;
    // A_t = δ_t + γλ·A_next where kept; masked positions pass A_next through.
    let adv = reverse_linear_scan(&(&keep * (gamma * lam) + skip), &delta);
    let returns = (&adv + v) * &mask;
    let adv = adv * &mask;
    let advantages = if whiten {
        whiten_masked(&adv, &mask)?
    } else {
        adv
    };
    let kind = token_level_rewards.kind();
    Ok(Advantages {
        advantages: advantages.to_kind(kind),
        returns: returns.to_kind(kind),
    })
}

/// REINFORCE++ (Hu 2025, "REINFORCE++: A Simple and Efficient Approach for
/// Aligning Large Language Models", arXiv:2501.03262); verl
/// `compute_reinforce_plus_plus_outcome_advantage`.
///
/// Returns G_t = r_t + γ·G_{t+1} per row (the running return restarts after a
/// masked position), then advantages = G whitened over the whole batch — the
/// global normalisation that replaces a critic. Shapes: (batch, response_len).
/// Whitening needs ≥ 2 unmasked tokens in the batch.
pub fn reinforce_plus_plus(
    token_level_rewards: &Tensor,
    response_mask: &Tensor,
    gamma: f64,
) -> Result<Advantages> {
    let (r, mask) = clean_rewards(token_level_rewards, response_mask)?;
    // G_t = r_t + γ·mask_{t+1}·G_{t+1} (verl multiplies the running return by the mask).
    let returns = reverse_linear_scan(&(shift_left(&mask, 1) * gamma), &r) * &mask;
    let advantages = whiten_masked(&returns, &mask)?;
    let kind = token_level_rewards.kind();
    Ok(Advantages {
        advantages: advantages.to_kind(kind),
        returns: returns.to_kind(kind),
    })
}

/// ReMax (Li et al. 2023, "ReMax: A Simple, Effective, and Efficient
/// Reinforcement Learning Method for Aligning Large Language Models",
/// arXiv:2310.10505); verl `compute_remax_outcome_advantage`.
///
/// returns_t = Σ_{s ≥ t} r_s·mask_s (undiscounted reward-to-go);
/// advantages_t = returns_t − b, where b is the score of the greedy response
/// to the same prompt (`reward_baselines`, one per row). Shapes: rewards and
/// mask (batch, response_len), baselines (batch,).
pub fn remax(
    token_level_rewards: &Tensor,
    response_mask: &Tensor,
    reward_baselines: &[f32],
) -> Result<Advantages> {
    let (r, mask) = clean_rewards(token_level_rewards, response_mask)?;
    let batch = r.size()[0] as usize;
    if reward_baselines.len() != batch {
        return Err(Error::LengthMismatch {
            arg: "reward_baselines",
            got: reward_baselines.len(),
            expected: batch,
        });
    }
    let returns = r.flip(1).cumsum(1, r.kind()).flip(1); // Σ_{s ≥ t} r_s
    let baselines = Tensor::from_slice(reward_baselines)
        .to_device(r.device())
        .to_kind(r.kind())
        .unsqueeze(1); // (batch, 1)
    let kind = token_level_rewards.kind();
    Ok(Advantages {
        advantages: ((&returns - baselines) * &mask).to_kind(kind),
        returns: (returns * mask).to_kind(kind),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::masked::test_util::*;

    fn assert_rows(t: &Tensor, want: &[&[f32]], tol: f32) {
        let got = rows(t);
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            for (a, b) in g.iter().zip(w.iter()) {
                assert!((a - b).abs() < tol, "got {got:?}, want {want:?}");
            }
        }
    }

    // γ = 0.9, λ = 0.8 (γλ = 0.72), one row r = [0, 0, 1], V = [0.5, 0.6, 0.7], all unmasked:
    //  t2: δ = 1 − 0.7 = 0.3;               A2 = 0.3
    //  t1: δ = 0 + 0.9·0.7 − 0.6 = 0.03;    A1 = 0.03 + 0.72·0.3 = 0.246
    //  t0: δ = 0 + 0.9·0.6 − 0.5 = 0.04;    A0 = 0.04 + 0.72·0.246 = 0.21712
    // returns = A + V = [0.71712, 0.846, 1.0].
    #[test]
    fn gae_hand_case() {
        let r = t2(&[&[0.0, 0.0, 1.0]]);
        let v = t2(&[&[0.5, 0.6, 0.7]]);
        let m = t2(&[&[1.0, 1.0, 1.0]]);
        let out = gae(&r, &v, &m, 0.9, 0.8, false).unwrap();
        assert_rows(&out.advantages, &[&[0.217_12, 0.246, 0.3]], 1e-6);
        assert_rows(&out.returns, &[&[0.717_12, 0.846, 1.0]], 1e-6);
        // whitened: mean 0.254373, unbiased std 0.042070 → [−0.885515, −0.199035, 1.084550]
        let out = gae(&r, &v, &m, 0.9, 0.8, true).unwrap();
        assert_rows(
            &out.advantages,
            &[&[-0.885_515, -0.199_035, 1.084_55]],
            1e-4,
        );
    }

    #[test]
    fn gae_skips_masked_positions_inside_a_row() {
        // A masked position in the middle is stepped over: with γ = λ = 1,
        // r = [0, 5, 1] (the 5 is masked), V = [0.2, 9, 0.4]:
        //  t2: A = 1 − 0.4 = 0.6; t0: δ = 0 + 0.4 − 0.2 = 0.2, A = 0.2 + 0.6 = 0.8.
        let r = t2(&[&[0.0, 5.0, 1.0]]);
        let v = t2(&[&[0.2, 9.0, 0.4]]);
        let m = t2(&[&[1.0, 0.0, 1.0]]);
        let out = gae(&r, &v, &m, 1.0, 1.0, false).unwrap();
        assert_rows(&out.advantages, &[&[0.8, 0.0, 0.6]], 1e-6);
        assert_rows(&out.returns, &[&[1.0, 0.0, 1.0]], 1e-6);
    }

    #[test]
    fn reinforce_plus_plus_hand_case() {
        // γ = 0.5: row 0 r = [0, 0, 2] → G = [0.5, 1, 2]; row 1 r = [1, (pad), (pad)] → G = [1].
        // Unmasked G: 0.5, 1, 2, 1 → mean 1.125, unbiased var (0.390625 + 0.015625
        // + 0.765625 + 0.015625)/3 = 0.395833, std 0.629153.
        let r = t2(&[&[0.0, 0.0, 2.0], &[1.0, 7.0, 7.0]]);
        let m = t2(&[&[1.0, 1.0, 1.0], &[1.0, 0.0, 0.0]]);
        let out = reinforce_plus_plus(&r, &m, 0.5).unwrap();
        assert_rows(&out.returns, &[&[0.5, 1.0, 2.0], &[1.0, 0.0, 0.0]], 1e-6);
        let z = |g: f32| (g - 1.125) / 0.629_152_9;
        assert_rows(
            &out.advantages,
            &[&[z(0.5), z(1.0), z(2.0)], &[z(1.0), 0.0, 0.0]],
            1e-4,
        );
    }

    #[test]
    fn remax_hand_case() {
        // reward-to-go of [0.5, 0, 1] is [1.5, 1, 1]; minus the greedy baseline 0.25.
        let r = t2(&[&[0.5, 0.0, 1.0], &[0.0, 2.0, 3.0]]);
        let m = t2(&[&[1.0, 1.0, 1.0], &[1.0, 1.0, 0.0]]);
        let out = remax(&r, &m, &[0.25, 1.0]).unwrap();
        assert_rows(&out.returns, &[&[1.5, 1.0, 1.0], &[2.0, 2.0, 0.0]], 1e-6);
        assert_rows(
            &out.advantages,
            &[&[1.25, 0.75, 0.75], &[1.0, 1.0, 0.0]],
            1e-6,
        );
        let err = remax(&r, &m, &[0.0]).unwrap_err();
        assert!(matches!(
            err,
            Error::LengthMismatch {
                arg: "reward_baselines",
                ..
            }
        ));
    }

    #[test]
    fn dispatch_reports_missing_inputs() {
        let r = t2(&[&[1.0]]);
        let x = AdvantageInputs {
            token_level_rewards: &r,
            response_mask: &r,
            values: None,
            index: None,
            reward_baselines: None,
        };
        for (est, arg) in [
            (AdvEstimator::Gae, "values"),
            (AdvEstimator::Grpo, "index"),
            (AdvEstimator::Rloo, "index"),
            (AdvEstimator::ReinforcePlusPlusBaseline, "index"),
            (AdvEstimator::Remax, "reward_baselines"),
        ] {
            let cfg = AdvantageConfig {
                adv_estimator: est,
                ..Default::default()
            };
            match compute_advantage(&cfg, &x).unwrap_err() {
                Error::MissingInput { estimator, arg: a } => {
                    assert_eq!((estimator, a), (est.name(), arg));
                }
                e => panic!("{e}"),
            }
        }
    }

    type Rows = Vec<Vec<f32>>;

    /// The recurrences one step per token (verl's loop), on the host.
    fn sequential(r: &[Vec<f32>], v: &[Vec<f32>], m: &[Vec<f32>], g: f32, l: f32) -> [Rows; 3] {
        let (mut adv, mut ret, mut rpp) = (r.to_vec(), r.to_vec(), r.to_vec());
        for i in 0..r.len() {
            let (mut next_value, mut last_gae, mut running) = (0f32, 0f32, 0f32);
            for t in (0..r[i].len()).rev() {
                let rt = if m[i][t] == 0.0 {
                    0.0
                } else {
                    r[i][t] * m[i][t]
                };
                running = rt + g * running;
                rpp[i][t] = running * m[i][t];
                running *= m[i][t];
                if m[i][t] != 0.0 {
                    let delta = rt + g * next_value - v[i][t];
                    last_gae = delta + g * l * last_gae;
                    next_value = v[i][t];
                }
                adv[i][t] = last_gae * m[i][t];
                ret[i][t] = (last_gae + v[i][t]) * m[i][t];
            }
        }
        [adv, ret, rpp]
    }

    #[test]
    fn scans_match_the_sequential_recurrences() {
        // 5 rows of 37 tokens (not a power of two), holes inside rows, an empty
        // row, NaN on padding: recursive doubling must agree with the loop.
        let (b, len) = (5usize, 37usize);
        let pseudo = |k: usize| ((k * 7919 % 1000) as f32 / 500.0) - 1.0;
        let mut r: Rows = (0..b)
            .map(|i| (0..len).map(|t| pseudo(i * len + t)).collect())
            .collect();
        let mut v: Rows = (0..b)
            .map(|i| (0..len).map(|t| pseudo(3 * i * len + t + 1)).collect())
            .collect();
        let m: Rows = (0..b)
            .map(|i| {
                (0..len)
                    .map(|t| f32::from(i != 3 && t < 30 - 4 * i && (t + i) % 9 != 4))
                    .collect()
            })
            .collect();
        let want = sequential(&r, &v, &m, 0.95, 0.9);
        for i in 0..b {
            for t in 0..len {
                if m[i][t] == 0.0 {
                    (r[i][t], v[i][t]) = (f32::NAN, f32::INFINITY);
                }
            }
        }
        let tensor = |x: &Rows| Tensor::from_slice2(x);
        let (rt, vt, mt) = (tensor(&r), tensor(&v), tensor(&m));
        let g = gae(&rt, &vt, &mt, 0.95, 0.9, false).unwrap();
        let rpp = reinforce_plus_plus(&rt, &mt, 0.95).unwrap();
        for (got, want) in [
            (&g.advantages, &want[0]),
            (&g.returns, &want[1]),
            (&rpp.returns, &want[2]),
        ] {
            let got = rows(got);
            for (gr, wr) in got.iter().zip(want) {
                for (x, y) in gr.iter().zip(wr) {
                    assert!((x - y).abs() < 1e-5, "{x} vs {y}");
                }
            }
        }
    }

    #[test]
    fn bf16_rewards_give_bf16_advantages() {
        let r = t2(&[&[0.0, 0.0, 1.0], &[0.0, 2.0, 3.0]]);
        let m = t2(&[&[1.0, 1.0, 1.0], &[1.0, 1.0, 0.0]]);
        let want = remax(&r, &m, &[0.25, 1.0]).unwrap();
        let bf = |t: &Tensor| t.to_kind(tch::Kind::BFloat16);
        let got = remax(&bf(&r), &bf(&m), &[0.25, 1.0]).unwrap();
        let close = |a: &Tensor, b: &Tensor, tol: f32| {
            for (x, y) in rows(a).iter().flatten().zip(rows(b).iter().flatten()) {
                assert!((x - y).abs() < tol, "{a:?} vs {b:?}");
            }
        };
        assert_eq!(got.advantages.kind(), tch::Kind::BFloat16);
        close(&got.advantages, &want.advantages, 1e-2);
        let got = gae(&bf(&r), &bf(&r), &bf(&m), 0.9, 0.8, true).unwrap();
        let want = gae(&r, &r, &m, 0.9, 0.8, true).unwrap();
        assert_eq!(got.returns.kind(), tch::Kind::BFloat16);
        close(&got.advantages, &want.advantages, 2e-2);
    }

    #[test]
    fn config_names_are_verls() {
        for est in [
            AdvEstimator::Gae,
            AdvEstimator::Grpo,
            AdvEstimator::Rloo,
            AdvEstimator::ReinforcePlusPlus,
            AdvEstimator::ReinforcePlusPlusBaseline,
            AdvEstimator::Remax,
        ] {
            let parsed: AdvEstimator =
                serde_json::from_str(&format!("\"{}\"", est.name())).unwrap();
            assert_eq!(parsed, est);
        }
        let cfg: AdvantageConfig =
            serde_json::from_str(r#"{"adv_estimator": "grpo", "norm_adv_by_std_in_grpo": false}"#)
                .unwrap();
        assert!(!cfg.norm_adv_by_std_in_grpo);
        assert_eq!(cfg.gamma, 1.0);
    }
}

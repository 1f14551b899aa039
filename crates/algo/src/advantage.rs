//! Advantage estimators, chosen by [`AdvEstimator`], and the token-level ones:
//! GAE, REINFORCE++ and ReMax. The group-baseline ones (GRPO, Dr. GRPO, RLOO,
//! REINFORCE++-baseline) are in [`crate::group`].
//!
//! Representation: inputs and outputs are (batch, response_len) tensors so they
//! travel with the rest of the batch, but the estimators are not
//! differentiated (inputs are read as data) and their recurrences are
//! sequential, so each copies its inputs to the host, computes in plain Rust,
//! and returns tensors of the input's dtype on the input's device. Per-sequence
//! data (prompt ids, baseline scores) are plain slices, one entry per row.
//!
//! Conventions shared by all estimators: rewards are read through the mask
//! (r·mask, NaN-safe), and both outputs are zero on padding. verl leaves
//! whitened values on padding positions; since every consumer masks them, the
//! only visible difference is cleaner tensors.

use candle_core::Tensor;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::group;
use crate::masked::{check_all, from_rows, masked_whiten, rows};

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

/// The estimator's output; both (batch, response_len), zero on padding, detached.
#[derive(Clone, Debug)]
pub struct Advantages {
    /// Â, what the policy loss multiplies.
    pub advantages: Tensor,
    /// Targets for the critic (GAE: Â + V before whitening); outcome estimators
    /// return their returns as verl does (for most, equal to the advantages).
    pub returns: Tensor,
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
    }
}

/// A (batch, response_len) matrix on the host.
pub(crate) type Rows = Vec<Vec<f32>>;

/// Host copies of rewards (read through the mask, NaN-safe) and the mask.
pub(crate) fn host_rewards(
    token_level_rewards: &Tensor,
    response_mask: &Tensor,
) -> Result<(Rows, Rows)> {
    check_all(
        ("token_level_rewards", token_level_rewards),
        &[("response_mask", response_mask)],
    )?;
    let mask = rows(response_mask)?;
    let mut r = rows(token_level_rewards)?;
    for (row, m_row) in r.iter_mut().zip(&mask) {
        for (x, &w) in row.iter_mut().zip(m_row) {
            *x = if w == 0.0 { 0.0 } else { *x * w };
        }
    }
    Ok((r, mask))
}

/// Element-wise product with the mask, as a tensor like `like`.
pub(crate) fn masked_tensor(
    mut data: Vec<Vec<f32>>,
    mask: &[Vec<f32>],
    like: &Tensor,
) -> Result<Tensor> {
    for (row, m_row) in data.iter_mut().zip(mask) {
        for (x, &w) in row.iter_mut().zip(m_row) {
            *x *= w;
        }
    }
    from_rows(data, like)
}

/// Whitens over the mask (verl `masked_whiten`, unbiased variance) and zeroes padding.
pub(crate) fn whiten_masked(t: &Tensor, mask: &Tensor) -> Result<Tensor> {
    Ok(masked_whiten(t, mask, true)?.mul(mask)?)
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
    let (r, mask) = host_rewards(token_level_rewards, response_mask)?;
    let v = rows(values)?;
    let (gamma, lam) = (gamma as f32, lam as f32);
    let mut adv = vec![vec![0f32; r.first().map_or(0, Vec::len)]; r.len()];
    let mut ret = adv.clone();
    for i in 0..r.len() {
        let (mut next_value, mut last_gae) = (0f32, 0f32);
        for t in (0..r[i].len()).rev() {
            if mask[i][t] == 0.0 {
                adv[i][t] = last_gae;
                continue;
            }
            let delta = r[i][t] + gamma * next_value - v[i][t];
            last_gae = delta + gamma * lam * last_gae;
            next_value = v[i][t];
            adv[i][t] = last_gae;
            ret[i][t] = last_gae + v[i][t];
        }
    }
    let returns = masked_tensor(ret, &mask, token_level_rewards)?;
    let adv = masked_tensor(adv, &mask, token_level_rewards)?;
    let advantages = if whiten {
        whiten_masked(&adv, response_mask)?
    } else {
        adv
    };
    Ok(Advantages {
        advantages,
        returns,
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
    let (r, mask) = host_rewards(token_level_rewards, response_mask)?;
    let gamma = gamma as f32;
    let mut ret = r.clone();
    for (row, m_row) in ret.iter_mut().zip(&mask) {
        let mut running = 0f32;
        for t in (0..row.len()).rev() {
            running = row[t] + gamma * running;
            row[t] = running;
            running *= m_row[t];
        }
    }
    let returns = masked_tensor(ret, &mask, token_level_rewards)?;
    let advantages = whiten_masked(&returns, response_mask)?;
    Ok(Advantages {
        advantages,
        returns,
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
    let (r, mask) = host_rewards(token_level_rewards, response_mask)?;
    if reward_baselines.len() != r.len() {
        return Err(Error::LengthMismatch {
            arg: "reward_baselines",
            got: reward_baselines.len(),
            expected: r.len(),
        });
    }
    let mut ret = r;
    for row in ret.iter_mut() {
        let mut acc = 0f32;
        for x in row.iter_mut().rev() {
            acc += *x;
            *x = acc;
        }
    }
    let adv: Vec<Vec<f32>> = ret
        .iter()
        .zip(reward_baselines)
        .map(|(row, &b)| row.iter().map(|&g| g - b).collect())
        .collect();
    Ok(Advantages {
        advantages: masked_tensor(adv, &mask, token_level_rewards)?,
        returns: masked_tensor(ret, &mask, token_level_rewards)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn t2(data: &[&[f32]]) -> Tensor {
        let rows: Vec<Vec<f32>> = data.iter().map(|r| r.to_vec()).collect();
        Tensor::new(rows, &Device::Cpu).unwrap()
    }

    fn assert_rows(t: &Tensor, want: &[&[f32]], tol: f32) {
        let got = rows(t).unwrap();
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

//! Outcome advantages with a group baseline: several responses are sampled per
//! prompt, and each response's score is compared with the others' for the same
//! prompt. GRPO, Dr. GRPO, RLOO and REINFORCE++-baseline.
//!
//! A response's score is its summed reward, s_i = Σ_t r_it·mask_it (verl sums
//! the rewards, which are zero on padding). Rows belong to the same group when
//! they have the same `index` entry (the prompt id). The advantage is one
//! number per response, broadcast over its response tokens.
//!
//! Groups of size 1, as in verl, get baseline (mean) 0 and std 1, i.e. the
//! score itself (divided by 1 + ε for GRPO): there is nothing to compare with,
//! and verl chose not to drop the sample. Inputs and outputs follow the
//! conventions in [`crate::advantage`].

use std::collections::HashMap;

use candle_core::Tensor;

use crate::advantage::{host_rewards, masked_tensor, whiten_masked, Advantages};
use crate::error::{Error, Result};

/// Group statistics of the scores.
struct Group {
    n: usize,
    mean: f64,
    /// Unbiased (n − 1) standard deviation, as `torch.std`.
    std: f64,
}

/// Per-row scores and the statistics of each row's group.
fn scores_and_groups(
    rewards: &[Vec<f32>],
    index: &[u64],
) -> Result<(Vec<f64>, HashMap<u64, Group>)> {
    if index.len() != rewards.len() {
        return Err(Error::LengthMismatch {
            arg: "index",
            got: index.len(),
            expected: rewards.len(),
        });
    }
    let scores: Vec<f64> = rewards
        .iter()
        .map(|row| row.iter().map(|&x| f64::from(x)).sum())
        .collect();
    let mut members: HashMap<u64, Vec<f64>> = HashMap::new();
    for (&id, &s) in index.iter().zip(&scores) {
        members.entry(id).or_default().push(s);
    }
    let groups = members
        .into_iter()
        .map(|(id, v)| {
            let n = v.len();
            let g = if n == 1 {
                Group {
                    n,
                    mean: 0.0,
                    std: 1.0,
                }
            } else {
                let mean = v.iter().sum::<f64>() / n as f64;
                let var = v.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
                Group {
                    n,
                    mean,
                    std: var.sqrt(),
                }
            };
            (id, g)
        })
        .collect();
    Ok((scores, groups))
}

/// One advantage per row, broadcast over that row's response tokens.
fn broadcast(per_row: &[f64], mask: &[Vec<f32>], like: &Tensor) -> Result<Tensor> {
    let data = per_row
        .iter()
        .zip(mask)
        .map(|(&a, m_row)| vec![a as f32; m_row.len()])
        .collect();
    masked_tensor(data, mask, like)
}

/// GRPO's outcome advantage (Shao et al. 2024, "DeepSeekMath", arXiv:2402.03300,
/// §4.1.2); verl `compute_grpo_outcome_advantage`.
///
/// A_i = (s_i − mean_g) / (std_g + ε) with the group's mean and unbiased std;
/// with `norm_by_std = false`, A_i = s_i − mean_g, which is Dr. GRPO (Liu et al.
/// 2025, "Understanding R1-Zero-Like Training: A Critical Perspective",
/// arXiv:2503.20783: dividing by the std over-weights prompts that are almost
/// always or almost never solved). Shapes: rewards and mask (batch,
/// response_len), `index` (batch,). Returns equal the advantages.
pub fn grpo(
    token_level_rewards: &Tensor,
    response_mask: &Tensor,
    index: &[u64],
    epsilon: f64,
    norm_by_std: bool,
) -> Result<Advantages> {
    let (r, mask) = host_rewards(token_level_rewards, response_mask)?;
    let (scores, groups) = scores_and_groups(&r, index)?;
    let adv: Vec<f64> = scores
        .iter()
        .zip(index)
        .map(|(&s, id)| {
            let g = &groups[id];
            if norm_by_std {
                (s - g.mean) / (g.std + epsilon)
            } else {
                s - g.mean
            }
        })
        .collect();
    let advantages = broadcast(&adv, &mask, token_level_rewards)?;
    Ok(Advantages {
        returns: advantages.clone(),
        advantages,
    })
}

/// RLOO, REINFORCE with a leave-one-out baseline (Kool et al. 2019, "Buy 4
/// REINFORCE Samples, Get a Baseline for Free!"; Ahmadian et al. 2024, "Back to
/// Basics", arXiv:2402.14740); verl `compute_rloo_outcome_advantage`.
///
/// A_i = s_i − (1/(n−1)) Σ_{j≠i} s_j = (s_i − mean_g)·n/(n−1) for a group of n > 1;
/// a group of one keeps its score (baseline 0). Shapes as [`grpo`].
pub fn rloo(
    token_level_rewards: &Tensor,
    response_mask: &Tensor,
    index: &[u64],
) -> Result<Advantages> {
    let (r, mask) = host_rewards(token_level_rewards, response_mask)?;
    let (scores, groups) = scores_and_groups(&r, index)?;
    let adv: Vec<f64> = scores
        .iter()
        .zip(index)
        .map(|(&s, id)| {
            let g = &groups[id];
            if g.n > 1 {
                let n = g.n as f64;
                (s - g.mean) * n / (n - 1.0)
            } else {
                s
            }
        })
        .collect();
    let advantages = broadcast(&adv, &mask, token_level_rewards)?;
    Ok(Advantages {
        returns: advantages.clone(),
        advantages,
    })
}

/// REINFORCE++-baseline (Hu 2025, arXiv:2501.03262); verl
/// `compute_reinforce_plus_plus_baseline_outcome_advantage`.
///
/// s_i − mean_g broadcast over the response tokens, then whitened over all
/// unmasked tokens of the batch (so the group baseline removes the per-prompt
/// offset and the batch statistics set the scale). Shapes as [`grpo`].
/// Whitening needs ≥ 2 unmasked tokens in the batch. Returns equal the advantages.
pub fn reinforce_plus_plus_baseline(
    token_level_rewards: &Tensor,
    response_mask: &Tensor,
    index: &[u64],
) -> Result<Advantages> {
    let (r, mask) = host_rewards(token_level_rewards, response_mask)?;
    let (scores, groups) = scores_and_groups(&r, index)?;
    let centred: Vec<f64> = scores
        .iter()
        .zip(index)
        .map(|(&s, id)| s - groups[id].mean)
        .collect();
    let centred = broadcast(&centred, &mask, token_level_rewards)?;
    let advantages = whiten_masked(&centred, response_mask)?;
    Ok(Advantages {
        returns: advantages.clone(),
        advantages,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::masked::rows;
    use candle_core::Device;

    fn t2(data: &[&[f32]]) -> Tensor {
        let rows: Vec<Vec<f32>> = data.iter().map(|r| r.to_vec()).collect();
        Tensor::new(rows, &Device::Cpu).unwrap()
    }

    /// Outcome rewards on the last response token of each row; returns (rewards, mask).
    /// Row lengths 2, 1, 2, 2, 1; scores 1, 0, 0, 3, 5.
    fn batch() -> (Tensor, Tensor) {
        (
            t2(&[&[0., 1.], &[0., 0.], &[0., 0.], &[0., 3.], &[5., 0.]]),
            t2(&[&[1., 1.], &[1., 0.], &[1., 1.], &[1., 1.], &[1., 0.]]),
        )
    }
    // Groups: id 7 = rows 0, 1, 2 (scores 1, 0, 0), id 9 = row 3 (score 3), id 4 = row 4 (5)
    // — deliberately not contiguous in id order.
    const INDEX: [u64; 5] = [7, 7, 7, 9, 4];

    fn per_row(t: &Tensor) -> Vec<f32> {
        rows(t).unwrap().iter().map(|r| r[0]).collect()
    }

    #[test]
    fn grpo_hand_case() {
        let (r, m) = batch();
        // group 7: mean 1/3, unbiased std sqrt(((2/3)² + 2·(1/3)²)/2) = sqrt(1/3) = 0.577350
        // → A = [0.666667, −0.333333, −0.333333] / 0.577351 = [1.154699, −0.577349, −0.577349].
        // singleton groups: mean 0, std 1 → A = s / (1 + 1e-6).
        let out = grpo(&r, &m, &INDEX, 1e-6, true).unwrap();
        let a = per_row(&out.advantages);
        let want = [1.154_699, -0.577_349, -0.577_349, 3.0, 5.0];
        for (x, w) in a.iter().zip(want) {
            assert!((x - w).abs() < 1e-4, "{a:?}");
        }
        // broadcast over response tokens only
        let full = rows(&out.advantages).unwrap();
        assert_eq!(full[1][1], 0.0);
        assert!((full[0][1] - 1.154_699).abs() < 1e-4);
        // Dr. GRPO: no division.
        let out = grpo(&r, &m, &INDEX, 1e-6, false).unwrap();
        let a = per_row(&out.advantages);
        let want = [2.0 / 3.0, -1.0 / 3.0, -1.0 / 3.0, 3.0, 5.0];
        for (x, w) in a.iter().zip(want) {
            assert!((x - w).abs() < 1e-6, "{a:?}");
        }
    }

    #[test]
    fn grpo_equal_scores_give_zero() {
        // std 0: (s − mean) / (0 + ε) = 0 exactly, no NaN.
        let r = t2(&[&[1.], &[1.]]);
        let m = t2(&[&[1.], &[1.]]);
        let a = per_row(&grpo(&r, &m, &[0, 0], 1e-6, true).unwrap().advantages);
        assert_eq!(a, vec![0.0, 0.0]);
    }

    #[test]
    fn rloo_hand_case() {
        let (r, m) = batch();
        // group 7: s_i − mean of the others: 1 − 0 = 1, 0 − 0.5 = −0.5, −0.5; singletons keep s.
        let a = per_row(&rloo(&r, &m, &INDEX).unwrap().advantages);
        let want = [1.0, -0.5, -0.5, 3.0, 5.0];
        for (x, w) in a.iter().zip(want) {
            assert!((x - w).abs() < 1e-6, "{a:?}");
        }
    }

    #[test]
    fn reinforce_plus_plus_baseline_hand_case() {
        let (r, m) = batch();
        // centred: group 7 → [2/3, −1/3, −1/3]; singletons → s (mean 0): [3, 5].
        // Over tokens (row lengths 2, 1, 2, 2, 1): values 2/3 ×2, −1/3, −1/3 ×2, 3 ×2, 5.
        let toks = [2. / 3., 2. / 3., -1. / 3., -1. / 3., -1. / 3., 3., 3., 5.];
        let mean = toks.iter().sum::<f64>() / 8.0;
        let var = toks.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / 7.0;
        let z = |x: f64| ((x - mean) / var.sqrt()) as f32;
        let a = rows(
            &reinforce_plus_plus_baseline(&r, &m, &INDEX)
                .unwrap()
                .advantages,
        )
        .unwrap();
        let want = [
            [z(2. / 3.), z(2. / 3.)],
            [z(-1. / 3.), 0.0],
            [z(-1. / 3.), z(-1. / 3.)],
            [z(3.), z(3.)],
            [z(5.), 0.0],
        ];
        for (g, w) in a.iter().zip(want) {
            assert!(
                (g[0] - w[0]).abs() < 1e-5 && (g[1] - w[1]).abs() < 1e-5,
                "{a:?}"
            );
        }
    }

    #[test]
    fn index_length_is_checked() {
        let (r, m) = batch();
        let err = grpo(&r, &m, &[1, 2], 1e-6, true).unwrap_err();
        assert!(matches!(
            err,
            Error::LengthMismatch {
                arg: "index",
                got: 2,
                expected: 5
            }
        ));
    }
}

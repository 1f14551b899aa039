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
//!
//! The group statistics run on the rewards' device, accumulated in f32 (f64
//! for f64 rewards): the prompt ids are numbered on the host, and a
//! (groups, batch) membership matrix turns per-group sums into one
//! matrix-vector product — deterministic, unlike scatter-adds, whose atomic
//! float additions on a GPU vary in order from run to run.

use std::collections::HashMap;

use tch::{Kind, Tensor};

use crate::advantage::{clean_rewards, whiten_masked, Advantages};
use crate::error::{Error, Result};

/// Per-row scores and the statistics of each row's group, all (batch,).
pub(crate) struct Scored {
    /// s_i, the summed reward of row i.
    pub(crate) score: Tensor,
    /// The size n of row i's group.
    pub(crate) n: Tensor,
    /// Its group's mean score (0 for a group of one).
    pub(crate) mean: Tensor,
    /// Its group's unbiased (n − 1) standard deviation, as `torch.std` (1 for a group of one).
    pub(crate) std: Tensor,
    /// The rows' groups: each row's group number (batch,), and the
    /// (groups, batch) membership matrix, 1 where row j is in group g.
    pub(crate) group: Tensor,
    pub(crate) members: Tensor,
}

/// Scores of the (cleaned) rewards and their group statistics.
pub(crate) fn scores_and_groups(rewards: &Tensor, index: &[u64]) -> Result<Scored> {
    let batch = rewards.size()[0] as usize;
    if index.len() != batch {
        return Err(Error::LengthMismatch {
            arg: "index",
            got: index.len(),
            expected: batch,
        });
    }
    // Number the groups on the host, in order of first appearance.
    let mut ids: HashMap<u64, i64> = HashMap::new();
    let group: Vec<i64> = index
        .iter()
        .map(|id| {
            let next = ids.len() as i64;
            *ids.entry(*id).or_insert(next)
        })
        .collect();
    let (kind, device) = (rewards.kind(), rewards.device());
    let group = Tensor::from_slice(&group).to_device(device); // (batch,)
    let members = Tensor::arange(ids.len() as i64, (Kind::Int64, device))
        .unsqueeze(1)
        .eq_tensor(&group.unsqueeze(0))
        .to_kind(kind); // (groups, batch): 1 where row j is in group g
    let per_row = |per_group: &Tensor| per_group.index_select(0, &group);

    let score = rewards.sum_dim_intlist(-1, false, kind); // (batch,)
    let n_group = members.sum_dim_intlist(-1, false, kind); // (groups,)
    let several = n_group.gt(1.0);
    let mean = (members.mv(&score) / &n_group).where_scalarother(&several, 0.0);
    let centred = &score - per_row(&mean);
    let var = members.mv(&centred.square()) / (&n_group - 1.0).clamp_min(1.0);
    let std = var.sqrt().where_scalarother(&several, 1.0);
    Ok(Scored {
        n: per_row(&n_group),
        mean: per_row(&mean),
        std: per_row(&std),
        score,
        group,
        members,
    })
}

/// One advantage per row (batch,), broadcast over that row's response tokens,
/// in the rewards' kind.
pub(crate) fn broadcast(per_row: &Tensor, mask: &Tensor, like: &Tensor) -> Tensor {
    (per_row.unsqueeze(1) * mask).to_kind(like.kind())
}

/// Outcome advantages whose returns are the advantages (the same storage).
pub(crate) fn outcome(advantages: Tensor) -> Advantages {
    Advantages {
        returns: advantages.shallow_clone(),
        advantages,
    }
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
    let (r, mask) = clean_rewards(token_level_rewards, response_mask)?;
    let g = scores_and_groups(&r, index)?;
    let centred = g.score - g.mean;
    let adv = if norm_by_std {
        centred / (g.std + epsilon)
    } else {
        centred
    };
    Ok(outcome(broadcast(&adv, &mask, token_level_rewards)))
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
    let (r, mask) = clean_rewards(token_level_rewards, response_mask)?;
    let g = scores_and_groups(&r, index)?;
    // n/(n − 1)·(s − mean); a group of one has mean 0 and keeps s (the factor is moot).
    let factor = &g.n / (&g.n - 1.0).clamp_min(1.0);
    let adv = ((&g.score - &g.mean) * factor).where_self(&g.n.gt(1.0), &g.score);
    Ok(outcome(broadcast(&adv, &mask, token_level_rewards)))
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
    let (r, mask) = clean_rewards(token_level_rewards, response_mask)?;
    let g = scores_and_groups(&r, index)?;
    let centred = (g.score - g.mean).unsqueeze(1) * &mask; // (batch, response_len)
    let advantages = whiten_masked(&centred, &mask)?.to_kind(token_level_rewards.kind());
    Ok(outcome(advantages))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::masked::test_util::*;

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
        rows(t).iter().map(|r| r[0]).collect()
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
        let full = rows(&out.advantages);
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
        );
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

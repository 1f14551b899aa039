//! More outcome advantages with a group baseline, as verl has them: OPO's
//! length-weighted baseline, GRPO for pass@k, and GPG's rescaled
//! advantage. Scores, groups and conventions as in [`crate::group`].

use std::collections::HashMap;

use tch::{Kind, Tensor};

use crate::advantage::{clean_rewards, Advantages};
use crate::error::{Error, Result};
use crate::group::{broadcast, outcome, scores_and_groups};

/// OPO, on-policy RL with the optimal reward baseline (Hao et al. 2025,
/// "On-Policy RL with Optimal Reward Baseline", arXiv:2505.23585); verl
/// `compute_opo_outcome_advantage`.
///
/// A_i = s_i − b_g with b_g = Σ_j |y_j|·s_j / Σ_j |y_j| over the group's
/// rows (|y| the response length): the baseline that minimises the
/// gradient's variance when it grows with the length. A group of one has
/// b = 0 and keeps its score, as in verl; so does a group whose responses
/// are all empty (verl divides by zero there). Returns equal the advantages.
pub fn opo(
    token_level_rewards: &Tensor,
    response_mask: &Tensor,
    index: &[u64],
) -> Result<Advantages> {
    let (r, mask) = clean_rewards(token_level_rewards, response_mask)?;
    let g = scores_and_groups(&r, index)?;
    let len = mask.sum_dim_intlist(-1, false, mask.kind()); // (batch,)
    let weighted = g.members.mv(&(&len * &g.score)); // (groups,)
    let total = g.members.mv(&len);
    let n_group = g.members.sum_dim_intlist(-1, false, mask.kind());
    let defined = n_group.gt(1.0).logical_and(&total.gt(0.0));
    let baseline = (weighted / total.clamp_min(1.0)).where_scalarother(&defined, 0.0);
    let adv = &g.score - baseline.index_select(0, &g.group);
    Ok(outcome(broadcast(&adv, &mask, token_level_rewards)))
}

/// GRPO for pass@k (Chen et al. 2025, "Pass@k Training for Adaptively
/// Balancing Exploration and Exploitation", arXiv:2503.19595 as verl cites
/// it); verl `compute_grpo_passk_outcome_advantage`.
///
/// Only each group's best response is pushed: its advantage is
/// r_max − r_second (divided by the group's std + ε when `norm_by_std`),
/// every other row's 0. When the best score is shared the difference is 0,
/// so which of the tied rows is "best" does not matter. Every group needs
/// at least two rows (verl raises otherwise). Returns equal the advantages.
pub fn grpo_passk(
    token_level_rewards: &Tensor,
    response_mask: &Tensor,
    index: &[u64],
    epsilon: f64,
    norm_by_std: bool,
) -> Result<Advantages> {
    let mut sizes: HashMap<u64, usize> = HashMap::new();
    for id in index {
        *sizes.entry(*id).or_default() += 1;
    }
    if let Some((id, _)) = sizes.iter().find(|(_, &n)| n < 2) {
        return Err(Error::InvalidInput {
            arg: "index",
            reason: format!(
                "grpo_passk compares each group's best response with its second, and group \
                 {id} has one response (rollout.n must be at least 2)"
            ),
        });
    }
    let (r, mask) = clean_rewards(token_level_rewards, response_mask)?;
    let g = scores_and_groups(&r, index)?;
    let in_group = g.members.gt(0.5); // (groups, batch)
    let by_group = g
        .score
        .unsqueeze(0)
        .expand_as(&g.members)
        .where_scalarother(&in_group, f64::NEG_INFINITY);
    let (best, best_row) = by_group.max_dim(1, false); // (groups,)
    let others = by_group.scatter_value(1, &best_row.unsqueeze(1), f64::NEG_INFINITY);
    let (second, _) = others.max_dim(1, false);
    let lead = match norm_by_std {
        true => (best - second) / (g.std.index_select(0, &best_row) + epsilon),
        false => best - second,
    };
    let batch = g.score.size()[0];
    let is_best = Tensor::arange(batch, (Kind::Int64, g.score.device()))
        .eq_tensor(&best_row.index_select(0, &g.group));
    let adv = lead
        .index_select(0, &g.group)
        .where_scalarother(&is_best, 0.0);
    Ok(outcome(broadcast(&adv, &mask, token_level_rewards)))
}

/// GPG's advantage (Chu et al. 2025, "GPG: A Simple and Strong
/// Reinforcement Learning Baseline for Model Reasoning", arXiv:2504.02546);
/// verl `compute_gpg_outcome_advantage` with its `f_norm` of 1.
///
/// A_i = α·(s_i − mean_g) with α = batch / (rows whose score is not 0,
/// at least 1): the batch's rows that carry no reward are not allowed to
/// dilute the gradient of those that do. A group of one has mean 0. GPG
/// trains with [`crate::policy_loss::gpg_loss`] (no ratio, no clip).
/// Returns equal the advantages.
pub fn gpg(
    token_level_rewards: &Tensor,
    response_mask: &Tensor,
    index: &[u64],
) -> Result<Advantages> {
    let (r, mask) = clean_rewards(token_level_rewards, response_mask)?;
    let g = scores_and_groups(&r, index)?;
    let batch = g.score.size()[0] as f64;
    let nonzero = g.score.ne(0.0).sum(Kind::Float).clamp_min(1.0);
    let alpha = nonzero.reciprocal() * batch;
    let adv = (&g.score - &g.mean) * alpha.to_kind(g.score.kind());
    Ok(outcome(broadcast(&adv, &mask, token_level_rewards)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::masked::test_util::*;

    /// Outcome rewards on the last response token of each row; returns
    /// (rewards, mask). Row lengths 2, 1, 2, 2, 1; scores 1, 0, 0, 3, 5.
    fn batch() -> (Tensor, Tensor) {
        (
            t2(&[&[0., 1.], &[0., 0.], &[0., 0.], &[0., 3.], &[5., 0.]]),
            t2(&[&[1., 1.], &[1., 0.], &[1., 1.], &[1., 1.], &[1., 0.]]),
        )
    }

    fn per_row(t: &Tensor) -> Vec<f32> {
        rows(t).iter().map(|r| r[0]).collect()
    }

    fn close(got: &[f32], want: &[f64]) {
        for (x, w) in got.iter().zip(want) {
            assert!((*x as f64 - w).abs() < 1e-5, "{got:?} vs {want:?}");
        }
    }

    #[test]
    fn opo_hand_case() {
        let (r, m) = batch();
        // group 7 (rows 0–2): b = (2·1 + 1·0 + 2·0) / 5 = 0.4; singletons b = 0.
        let out = opo(&r, &m, &[7, 7, 7, 9, 4]).unwrap();
        close(&per_row(&out.advantages), &[0.6, -0.4, -0.4, 3.0, 5.0]);
        assert_eq!(rows(&out.advantages)[1][1], 0.0, "padding stays 0");
    }

    #[test]
    fn grpo_passk_pushes_only_each_groups_best() {
        let (r, m) = batch();
        let index = [7, 7, 7, 9, 9];
        // group 7: best 1 (row 0), second 0, std √(1/3); group 9: best 5
        // (row 4), second 3, std √2.
        let plain = grpo_passk(&r, &m, &index, 1e-6, false).unwrap();
        close(&per_row(&plain.advantages), &[1.0, 0.0, 0.0, 0.0, 2.0]);
        let normed = grpo_passk(&r, &m, &index, 1e-6, true).unwrap();
        let (a, b) = (1.0 / (1f64 / 3.0).sqrt(), 2.0 / 2f64.sqrt());
        close(&per_row(&normed.advantages), &[a, 0.0, 0.0, 0.0, b]);
        // A shared best score: no push.
        let tied = t2(&[&[1.], &[1.], &[0.]]);
        let ones = t2(&[&[1.], &[1.], &[1.]]);
        let out = grpo_passk(&tied, &ones, &[3, 3, 3], 1e-6, true).unwrap();
        assert_eq!(per_row(&out.advantages), vec![0.0; 3]);
        // A group of one cannot be compared.
        let e = grpo_passk(&r, &m, &[7, 7, 7, 9, 4], 1e-6, true).unwrap_err();
        assert!(e.to_string().contains("one response"), "{e}");
    }

    #[test]
    fn gpg_hand_case() {
        let (r, m) = batch();
        // α = 5 rows / 3 non-zero scores; group 7 mean 1/3, singletons mean 0.
        let out = gpg(&r, &m, &[7, 7, 7, 9, 4]).unwrap();
        let a = 5.0 / 3.0;
        close(
            &per_row(&out.advantages),
            &[a * 2.0 / 3.0, -a / 3.0, -a / 3.0, a * 3.0, a * 5.0],
        );
    }
}

//! The losses an update differentiates, per micro-batch, and the three
//! updates built on them: policy (PPO/GSPO + entropy bonus + KL loss, from
//! colo-algo), critic (clipped value loss) and supervised (next-token
//! cross-entropy).
//!
//! Every micro-batch's loss is aggregated with the **whole batch's**
//! denominators ([`AggScale`]: response tokens, non-empty rows, the padded
//! length), so the micro-batch losses add up to the full-batch loss and the
//! accumulated gradient equals the full-batch gradient, whatever the
//! micro-batch size.

use candle_core::Tensor;
use colo_algo::entropy::entropy_bonus;
use colo_algo::kl::kl_loss;
use colo_algo::mismatch::truncated_is_weights;
use colo_algo::{
    agg_loss, policy_loss, value_loss, AggScale, KlEstimator, LossAgg, LossAggMode, PolicyInputs,
    PolicyLossConfig, RolloutCorrectionConfig,
};
use serde::{Deserialize, Serialize};

use crate::batch::{CriticBatch, PolicyBatch, SeqBatch};
use crate::engine::{CriticMetrics, PolicyMetrics, SftMetrics};
use crate::forward::Entropy;
use crate::trainer::ColoTrainer;
use crate::{Error, Result};

/// The actor's loss, as written in a config (verl's `actor` names).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LossConfig {
    /// PPO / GSPO, clip ranges, `loss_agg_mode`.
    #[serde(flatten)]
    pub policy: PolicyLossConfig,
    /// Weight of the entropy bonus (subtracted from the loss).
    pub entropy_coeff: f64,
    /// Add `kl_loss_coef · KL(π_θ ‖ π_ref)` to the loss (needs ref log-probs).
    pub use_kl_loss: bool,
    pub kl_loss_coef: f64,
    pub kl_loss_type: KlEstimator,
    /// Truncated importance sampling against the rollout's log-probs.
    pub rollout_correction: RolloutCorrectionConfig,
    /// seq-mean-token-sum-norm's constant; `None`: the batch's padded length.
    pub loss_scale_factor: Option<f64>,
}

impl Default for LossConfig {
    fn default() -> Self {
        LossConfig {
            policy: PolicyLossConfig::default(),
            entropy_coeff: 0.0,
            use_kl_loss: false,
            kl_loss_coef: 0.001,
            kl_loss_type: KlEstimator::K3,
            rollout_correction: RolloutCorrectionConfig::default(),
            loss_scale_factor: None,
        }
    }
}

/// The critic's loss (verl's `critic` names).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CriticLossConfig {
    pub cliprange_value: f64,
    pub loss_agg_mode: LossAggMode,
}

impl Default for CriticLossConfig {
    fn default() -> Self {
        CriticLossConfig {
            cliprange_value: 0.5,
            loss_agg_mode: LossAggMode::TokenMean,
        }
    }
}

/// The batch-wide denominators (`None` where the batch has nothing to
/// count, so colo-algo's own zero-safe path applies).
fn batch_scale(seqs: &SeqBatch, loss_scale_factor: Option<f64>) -> AggScale {
    let pos = |n: usize| (n > 0).then_some(n as f64);
    AggScale {
        batch_num_tokens: pos(seqs.num_response_tokens()),
        global_batch_size: pos(seqs.num_nonempty_rows()),
        loss_scale_factor: Some(loss_scale_factor.unwrap_or(seqs.seq_len() as f64)),
    }
}

fn scalar(t: &Tensor) -> Result<f64> {
    Ok(t.to_dtype(candle_core::DType::F64)?.to_scalar::<f64>()?)
}

/// Sums of a micro-batch's metrics: additive terms, and token-weighted
/// means times the micro-batch's token count.
#[derive(Default)]
struct PolicySums {
    pg_loss: f64,
    entropy: f64,
    kl_loss: f64,
    clipfrac: f64,
    clipfrac_lower: f64,
    ppo_kl: f64,
}

impl ColoTrainer {
    fn policy_micro_loss(
        &self,
        mb: &PolicyBatch,
        cfg: &LossConfig,
        scale: AggScale,
    ) -> Result<(Tensor, PolicySums)> {
        let ent_mode = match cfg.entropy_coeff != 0.0 {
            true => Entropy::Differentiable,
            false => Entropy::Detached,
        };
        let (lp, ent) = self.token_scores(&mb.seqs, true, ent_mode)?;
        let mask = mb.seqs.response_mask();
        let is_weights = match (cfg.rollout_correction.rollout_is, &mb.rollout_log_probs) {
            (None, _) => None,
            (Some(level), Some(rollout)) => Some(
                truncated_is_weights(
                    &mb.old_log_probs,
                    rollout,
                    mask,
                    level,
                    cfg.rollout_correction.rollout_is_threshold,
                )?
                .weights,
            ),
            (Some(_), None) => {
                return Err(Error::batch(
                    "rollout_log_probs",
                    "is required by rollout_correction.rollout_is",
                ))
            }
        };
        let pl = policy_loss(
            &cfg.policy,
            &PolicyInputs {
                old_log_prob: &mb.old_log_probs,
                log_prob: &lp,
                advantages: &mb.advantages,
                response_mask: mask,
                is_weights: is_weights.as_ref(),
            },
            scale,
        )?;
        let agg = LossAgg {
            mode: cfg.policy.loss_agg_mode,
            scale,
        };
        let n = mb.seqs.num_response_tokens() as f64;
        let mut sums = PolicySums {
            pg_loss: scalar(&pl.loss)?,
            clipfrac: pl.metrics.pg_clipfrac * n,
            clipfrac_lower: pl.metrics.pg_clipfrac_lower * n,
            ppo_kl: pl.metrics.ppo_kl * n,
            ..Default::default()
        };
        let mut loss = pl.loss;
        let bonus = entropy_bonus(&ent.expect("asked for"), mask, agg)?;
        sums.entropy = scalar(&bonus)?;
        if cfg.entropy_coeff != 0.0 {
            loss = (loss - bonus.affine(cfg.entropy_coeff, 0.0)?)?;
        }
        if cfg.use_kl_loss {
            let reference = mb
                .ref_log_probs
                .as_ref()
                .ok_or_else(|| Error::batch("ref_log_probs", "is required by use_kl_loss"))?;
            let kl = kl_loss(&lp, reference, mask, cfg.kl_loss_type, agg)?;
            sums.kl_loss = scalar(&kl)?;
            loss = (loss + kl.affine(cfg.kl_loss_coef, 0.0)?)?;
        }
        Ok((loss, sums))
    }

    pub(crate) fn policy_update(
        &mut self,
        batch: &PolicyBatch,
        cfg: &LossConfig,
    ) -> Result<PolicyMetrics> {
        let scale = batch_scale(&batch.seqs, cfg.loss_scale_factor);
        let (parts, stats) =
            self.train_step("update the policy", batch.seqs.batch_size(), |t, s, l| {
                t.policy_micro_loss(&batch.micro(s, l)?, cfg, scale)
            })?;
        let n = (batch.seqs.num_response_tokens() as f64).max(1.0);
        let sum = |f: fn(&PolicySums) -> f64| parts.iter().map(f).sum::<f64>();
        Ok(PolicyMetrics {
            pg_loss: sum(|p| p.pg_loss),
            pg_clipfrac: sum(|p| p.clipfrac) / n,
            pg_clipfrac_lower: sum(|p| p.clipfrac_lower) / n,
            ppo_kl: sum(|p| p.ppo_kl) / n,
            entropy: sum(|p| p.entropy),
            kl_loss: cfg.use_kl_loss.then(|| sum(|p| p.kl_loss)),
            grad_norm: stats.grad_norm,
            lr: stats.lr,
        })
    }

    pub(crate) fn critic_update(
        &mut self,
        batch: &CriticBatch,
        cfg: &CriticLossConfig,
    ) -> Result<CriticMetrics> {
        if self.value_head.is_none() {
            return Err(Error::NoValueHead {
                op: "update the critic",
            });
        }
        let agg = LossAgg {
            mode: cfg.loss_agg_mode,
            scale: batch_scale(&batch.seqs, None),
        };
        let (parts, stats) =
            self.train_step("update the critic", batch.seqs.batch_size(), |t, s, l| {
                let mb = batch.micro(s, l)?;
                let mask = mb.seqs.response_mask();
                let vpreds = t.token_values(&mb.seqs, true)?;
                let vl = value_loss(
                    &vpreds,
                    &mb.returns,
                    &mb.values,
                    mask,
                    cfg.cliprange_value,
                    agg,
                )?;
                let n = mb.seqs.num_response_tokens() as f64;
                let vsum = scalar(&(vpreds.detach() * mask)?.sum_all()?)?;
                let sums = (scalar(&vl.loss)?, vl.metrics.vf_clipfrac * n, vsum);
                Ok((vl.loss, sums))
            })?;
        let n = (batch.seqs.num_response_tokens() as f64).max(1.0);
        Ok(CriticMetrics {
            vf_loss: parts.iter().map(|p| p.0).sum(),
            vf_clipfrac: parts.iter().map(|p| p.1).sum::<f64>() / n,
            vpred_mean: parts.iter().map(|p| p.2).sum::<f64>() / n,
            grad_norm: stats.grad_norm,
            lr: stats.lr,
        })
    }

    pub(crate) fn supervised_step(&mut self, batch: &SeqBatch) -> Result<SftMetrics> {
        let agg = LossAgg {
            mode: LossAggMode::TokenMean,
            scale: batch_scale(batch, None),
        };
        let (parts, stats) =
            self.train_step("run a supervised step", batch.batch_size(), |t, s, l| {
                let (mb, _) = batch.micro(s, l)?;
                let (lp, _) = t.token_scores(&mb, true, Entropy::None)?;
                let loss = agg_loss(&lp.neg()?, mb.response_mask(), agg)?;
                let value = scalar(&loss)?;
                Ok((loss, value))
            })?;
        Ok(SftMetrics {
            loss: parts.iter().sum(),
            tokens: batch.num_response_tokens(),
            grad_norm: stats.grad_norm,
            lr: stats.lr,
        })
    }
}

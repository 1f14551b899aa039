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

use colo_algo::entropy::entropy_bonus;
use colo_algo::kl::kl_loss;
use colo_algo::mismatch::truncated_is_weights;
use colo_algo::rng::SplitMix64;
use colo_algo::{
    agg_loss, policy_loss, value_loss, AggScale, KlEstimator, LossAgg, LossAggMode, PolicyInputs,
    PolicyLossConfig, RolloutCorrectionConfig,
};
use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use crate::batch::{CriticBatch, Micro, PolicyBatch, SeqBatch};
use crate::collective::ReduceOp;
use crate::engine::{CriticMetrics, PolicyMetrics, SftMetrics};
use crate::forward::Entropy;
use crate::lanes::Lane;
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

fn scalar(t: &Tensor) -> Result<f64> {
    Ok(t.f_double_value(&[])?)
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
    /// The batch-wide denominators (`None` where the batch has nothing to
    /// count, so colo-algo's own zero-safe path applies), over every data-
    /// parallel peer's batch: counts summed, the padded length the largest.
    fn batch_scale(&mut self, seqs: &SeqBatch, loss_scale_factor: Option<f64>) -> Result<AggScale> {
        let mut counts = [
            seqs.num_response_tokens() as f64,
            seqs.num_nonempty_rows() as f64,
        ];
        self.reduce_values(&mut counts, ReduceOp::Sum)?;
        let mut len = [seqs.seq_len() as f64];
        if loss_scale_factor.is_none() {
            self.reduce_values(&mut len, ReduceOp::Max)?;
        }
        let pos = |n: f64| (n > 0.0).then_some(n);
        Ok(AggScale {
            batch_num_tokens: pos(counts[0]),
            global_batch_size: pos(counts[1]),
            loss_scale_factor: Some(loss_scale_factor.unwrap_or(len[0])),
        })
    }

    /// Sums metric parts over the peers; the last entry is the local token
    /// count, which becomes the global one (at least 1).
    fn reduce_sums<const N: usize>(&mut self, mut sums: [f64; N]) -> Result<[f64; N]> {
        self.reduce_values(&mut sums, ReduceOp::Sum)?;
        sums[N - 1] = sums[N - 1].max(1.0);
        Ok(sums)
    }
}

impl Lane {
    fn policy_micro_loss(
        &self,
        batch: &PolicyBatch,
        mb: &Micro,
        cfg: &LossConfig,
        scale: AggScale,
        step: u64,
    ) -> Result<Option<(Tensor, PolicySums)>> {
        let ent_mode = match cfg.entropy_coeff != 0.0 {
            true => Entropy::Differentiable,
            false => Entropy::Detached,
        };
        let Some((lp, ent)) = self.token_scores(mb, ent_mode)? else {
            return Ok(None);
        };
        // Every per-token tensor below is (rows, window), like `lp`.
        let mask = mb.mask.as_ref().expect("set with the window");
        let old = match batch.old_from_update {
            true => {
                let old = lp.detach();
                mb.write_window(&batch.old_log_probs, &old)?;
                old
            }
            false => mb.window_of(&batch.old_log_probs)?,
        };
        let advantages = mb.window_of(&batch.advantages)?;
        let is_weights = match (cfg.rollout_correction.rollout_is, &batch.rollout_log_probs) {
            (None, _) => None,
            (Some(level), Some(rollout)) => Some(
                truncated_is_weights(
                    &old,
                    &mb.window_of(rollout)?,
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
                old_log_prob: &old,
                log_prob: &lp,
                advantages: &advantages,
                response_mask: mask,
                is_weights: is_weights.as_ref(),
            },
            scale,
            // Clip-Cov's draw: its own for each optimizer step and
            // micro-batch, and the same again in a resumed run.
            SplitMix64::derive(step, mb.start as u64).next_u64(),
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
            loss = loss.f_sub(&bonus.f_mul_scalar(cfg.entropy_coeff)?)?;
        }
        if cfg.use_kl_loss {
            let reference = batch
                .ref_log_probs
                .as_ref()
                .ok_or_else(|| Error::batch("ref_log_probs", "is required by use_kl_loss"))?;
            let kl = kl_loss(&lp, &mb.window_of(reference)?, mask, cfg.kl_loss_type, agg)?;
            sums.kl_loss = scalar(&kl)?;
            loss = loss.f_add(&kl.f_mul_scalar(cfg.kl_loss_coef)?)?;
        }
        Ok(Some((loss, sums)))
    }
}

impl ColoTrainer {
    pub(crate) fn policy_update(
        &mut self,
        batch: &PolicyBatch,
        cfg: &LossConfig,
    ) -> Result<PolicyMetrics> {
        if cfg.use_kl_loss && batch.ref_log_probs.is_none() {
            return Err(Error::batch("ref_log_probs", "is required by use_kl_loss"));
        }
        let scale = self.batch_scale(&batch.seqs, cfg.loss_scale_factor)?;
        let step = self.opt.t;
        let (parts, stats) = self.train_step("update the policy", &batch.seqs, || {
            let (batch, cfg) = (batch.clone(), cfg.clone());
            move |lane: &Lane, mb: &Micro| lane.policy_micro_loss(&batch, mb, &cfg, scale, step)
        })?;
        let sum = |f: fn(&PolicySums) -> f64| parts.iter().map(f).sum::<f64>();
        let [pg_loss, clipfrac, clipfrac_lower, ppo_kl, entropy, kl_loss, n] =
            self.reduce_sums([
                sum(|p| p.pg_loss),
                sum(|p| p.clipfrac),
                sum(|p| p.clipfrac_lower),
                sum(|p| p.ppo_kl),
                sum(|p| p.entropy),
                sum(|p| p.kl_loss),
                batch.seqs.num_response_tokens() as f64,
            ])?;
        Ok(PolicyMetrics {
            pg_loss,
            pg_clipfrac: clipfrac / n,
            pg_clipfrac_lower: clipfrac_lower / n,
            ppo_kl: ppo_kl / n,
            entropy,
            kl_loss: cfg.use_kl_loss.then_some(kl_loss),
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
            scale: self.batch_scale(&batch.seqs, None)?,
        };
        let (parts, stats) = self.train_step("update the critic", &batch.seqs, || {
            let (batch, cfg) = (batch.clone(), cfg.clone());
            move |lane: &Lane, mb: &Micro| {
                let Some(vpreds) = lane.token_values(mb)? else {
                    return Ok(None);
                };
                let mask = mb.mask.as_ref().expect("set with the window");
                let vl = value_loss(
                    &vpreds,
                    &mb.window_of(&batch.returns)?,
                    &mb.window_of(&batch.values)?,
                    mask,
                    cfg.cliprange_value,
                    agg,
                )?;
                let n = mb.seqs.num_response_tokens() as f64;
                let vsum = scalar(&vpreds.detach().f_mul(mask)?.f_sum(Kind::Double)?)?;
                let sums = (scalar(&vl.loss)?, vl.metrics.vf_clipfrac * n, vsum);
                Ok(Some((vl.loss, sums)))
            }
        })?;
        let [vf_loss, vf_clipfrac, vpred, n] = self.reduce_sums([
            parts.iter().map(|p| p.0).sum(),
            parts.iter().map(|p| p.1).sum(),
            parts.iter().map(|p| p.2).sum(),
            batch.seqs.num_response_tokens() as f64,
        ])?;
        Ok(CriticMetrics {
            vf_loss,
            vf_clipfrac: vf_clipfrac / n,
            vpred_mean: vpred / n,
            grad_norm: stats.grad_norm,
            lr: stats.lr,
        })
    }

    pub(crate) fn supervised_step(&mut self, batch: &SeqBatch) -> Result<SftMetrics> {
        let agg = LossAgg {
            mode: LossAggMode::TokenMean,
            scale: self.batch_scale(batch, None)?,
        };
        let (parts, stats) = self.train_step("run a supervised step", batch, || {
            move |lane: &Lane, mb: &Micro| {
                let Some((lp, _)) = lane.token_scores(mb, Entropy::None)? else {
                    return Ok(None);
                };
                let mask = mb.mask.as_ref().expect("set with the window");
                let loss = agg_loss(&lp.f_neg()?, mask, agg)?;
                let value = scalar(&loss)?;
                Ok(Some((loss, value)))
            }
        })?;
        let [loss, _] = self.reduce_sums([parts.iter().sum(), 0.0])?;
        Ok(SftMetrics {
            loss,
            tokens: batch.num_response_tokens(),
            grad_norm: stats.grad_norm,
            lr: stats.lr,
        })
    }
}

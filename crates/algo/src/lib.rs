//! # colo-algo: the algorithms of RL post-training, as plain functions
//!
//! Advantage estimators, policy and value losses, KL to the reference, loss
//! aggregation and the rollout/train mismatch correction that colo's RL loop
//! (`colo-rl`) calls between generation and the optimizer step. Every function
//! names its paper in its doc comment; behaviour follows verl's
//! `verl/trainer/ppo/core_algos.py` unless the doc says where and why it departs.
//!
//! | what | functions | chosen by |
//! |---|---|---|
//! | advantages | [`advantage::gae`], [`group::grpo`] (and Dr. GRPO), [`group::rloo`], [`advantage::reinforce_plus_plus`], [`group::reinforce_plus_plus_baseline`], [`advantage::remax`] | [`AdvEstimator`] via [`compute_advantage`] |
//! | policy loss | [`policy_loss::ppo_clip_loss`] (clip-higher, dual clip), [`policy_loss::gspo_loss`], [`policy_loss::gpg_loss`], [`policy_loss::cispo_loss`], [`policy_variants::kl_cov_loss`], [`policy_variants::clip_cov_loss`], [`policy_variants::geo_mean_loss`], [`policy_variants::sapo_loss`] | [`PolicyLossMode`] via [`policy_loss()`] |
//! | value loss | [`value_loss()`] (clipped) | — |
//! | entropy | [`entropy::entropy_from_logits`], [`entropy::entropy_bonus`] | — |
//! | KL | [`kl::kl_estimate`], [`kl::kl_loss`], [`kl::apply_kl_penalty`], [`KlController`] | [`KlEstimator`] |
//! | aggregation | [`agg_loss`] | [`LossAggMode`] |
//! | mismatch | [`mismatch::mismatch_metrics`], [`mismatch::truncated_is_weights`] | [`IsLevel`] |
//! | reward shaping | [`OverlongBuffer::penalty`] (DAPO's soft overlong punishment) | — |
//! | dynamic sampling | [`groups_with_variance`] (DAPO's filter of groups that all scored the same) | — |
//! | helpers | [`masked::masked_mean`], [`masked::masked_whiten`], … | — |
//!
//! ## Example: one GRPO actor loss
//!
//! ```
//! use colo_algo::{
//!     compute_advantage, policy_loss, AdvantageConfig, AdvantageInputs, AggScale,
//!     PolicyInputs, PolicyLossConfig,
//! };
//! use tch::Tensor;
//!
//! # fn main() -> colo_algo::Result<()> {
//! // Two responses to one prompt (id 0), three tokens each; the second is two long.
//! let mask = Tensor::from_slice2(&[[1f32, 1., 1.], [1., 1., 0.]]);
//! // Outcome reward on the last response token: the first response was right.
//! let rewards = Tensor::from_slice2(&[[0f32, 0., 1.], [0., 0., 0.]]);
//! let adv = compute_advantage(
//!     &AdvantageConfig::default(), // adv_estimator = "grpo"
//!     &AdvantageInputs {
//!         token_level_rewards: &rewards,
//!         response_mask: &mask,
//!         values: None,
//!         index: Some(&[0, 0]),
//!         reward_baselines: None,
//!     },
//! )?;
//!
//! // log π_θ from the trainer (a leaf that records gradients, so we can take its gradient).
//! let old = Tensor::from_slice2(&[[-1f32, -2., -0.5], [-1., -1., 0.]]);
//! let log_prob = old.copy().set_requires_grad(true);
//! let out = policy_loss(
//!     &PolicyLossConfig::default(), // PPO clip, ε = 0.2, token-mean
//!     &PolicyInputs {
//!         old_log_prob: &old,
//!         log_prob: &log_prob,
//!         advantages: &adv.advantages,
//!         response_mask: &mask,
//!         is_weights: None,
//!     },
//!     AggScale::default(),
//!     0, // the seed of Clip-Cov's draw (unused by PPO)
//! )?;
//! out.loss.backward();
//! // On-policy, d loss / d log_prob = −A / (number of tokens): the right answer is pushed up.
//! assert!(log_prob.grad().double_value(&[0, 0]) < 0.0);
//! assert_eq!(out.metrics.pg_clipfrac, 0.0);
//! # Ok(())
//! # }
//! ```
//!
//! ## Design decisions
//!
//! - **Functions and enums, not registries.** Each algorithm is a function; a
//!   config picks one through an enum that deserialises from verl's names
//!   (`adv_estimator = "grpo"`, `loss_agg_mode = "seq-mean-token-mean"`,
//!   `kl_loss_type = "low_var_kl"`), and a `match` dispatches. Adding an
//!   algorithm is adding a variant, and the compiler lists every place to update.
//! - **Differentiated code is libtorch ops; autograd does the backward.**
//!   Losses, KL as a loss, entropy and aggregation take `tch::Tensor`s of shape
//!   (batch, response_len) with a float mask (1.0 response, 0.0 padding), one
//!   kind and one device, and are plain tensor expressions (`where`,
//!   `maximum`, `minimum`, `clamp`, `exp`, `sum`, …) that `backward()`
//!   differentiates. Inputs that must not receive gradient (old log-probs,
//!   advantages, IS weights) are detached inside, so a caller cannot
//!   differentiate through them by mistake. Tests check gradients against
//!   hand-derived values and finite differences.
//! - **Padding cannot leak.** Every masked computation replaces padding by zero
//!   *before* arithmetic (`where`), so NaN or −inf on padding (common for
//!   rollout log-probs) changes neither a loss nor a gradient.
//! - **Kinds: f32 is the reference, bf16 works.** Everything accepts f32, f64,
//!   bf16 and f16. Arithmetic on half-precision inputs runs in f32 (a PPO
//!   ratio of two nearby log-probs, a group mean, a sum over thousands of
//!   tokens do not fit in bf16's 8 bits); scalar results (losses, masked
//!   reductions) are returned in that accumulation kind ([`masked::acc_kind`]),
//!   tensors of the inputs' shape in the inputs' kind.
//! - **On the device, without round trips.** Advantage estimators are tensor
//!   ops on the rewards' device: group statistics through a membership matrix,
//!   GAE's and REINFORCE++'s backward recurrences by recursive doubling
//!   (log₂ response_len rounds, not one step per token). Per-sequence data are
//!   plain slices (`index: &[u64]`, `reward_baselines: &[f32]`), uploaded once.
//!   What comes back to the host is scalar metrics (one transfer per call) and
//!   the token count that unbiased whitening checks.
//! - **Typed results.** Losses return the loss tensor with a small metrics struct
//!   (`pg_clipfrac`, `pg_clipfrac_lower`, `ppo_kl`, `vf_clipfrac`) whose field
//!   names are verl's metric names, serialisable for `metrics.jsonl`.
//! - **Global denominators for micro-batches** ([`AggScale`]) so that gradient
//!   accumulation over micro-batches gives the mini-batch's loss exactly.
//! - **Errors name the argument** ([`Error`]): a shape mismatch says which input
//!   and which reference; a missing input says which estimator needed it.

pub mod advantage;
pub mod agg;
pub mod dynamic_sampling;
pub mod entropy;
pub mod error;
pub mod group;
pub mod group_variants;
pub mod kl;
pub mod masked;
pub mod mismatch;
pub mod overlong;
pub mod policy_loss;
pub mod policy_variants;
pub mod rng;
pub mod value_loss;

pub use advantage::{
    compute_advantage, AdvEstimator, AdvantageConfig, AdvantageInputs, Advantages,
};
pub use agg::{agg_loss, AggScale, LossAgg, LossAggMode};
pub use dynamic_sampling::groups_with_variance;
pub use error::{Error, Result};
pub use kl::{KlControlConfig, KlControlType, KlController, KlEstimator, KlPenalty};
pub use mismatch::{IsLevel, IsMetrics, IsWeights, MismatchMetrics, RolloutCorrectionConfig};
pub use overlong::OverlongBuffer;
pub use policy_loss::{
    policy_loss, ClipRange, PolicyInputs, PolicyLoss, PolicyLossConfig, PolicyLossMetrics,
    PolicyLossMode,
};
pub use policy_variants::{ClipCov, SapoTemperatures};
pub use value_loss::{value_loss, ValueLoss, ValueLossMetrics};

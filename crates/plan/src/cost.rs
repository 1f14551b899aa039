//! The analytic cost and memory model behind the auto device mapping: what
//! one model costs, per stage of the RLHF dataflow, on `A` devices in a
//! given parallel layout.
//!
//! HybridFlow (Sheng et al., EuroSys 2025) §6 estimates latencies with a
//! simulator; we use closed forms in its spirit: training and inference
//! passes are compute-bound at an assumed utilisation of peak FLOP/s,
//! decoding is memory-bound (every step reads the weights and the KV cache
//! at memory bandwidth), tensor-parallel all-reduces and the resharding move
//! bytes over one link bandwidth.

use serde::{Deserialize, Serialize};

use crate::config::GIB;
use crate::model::{DType, ModelSpec};
use crate::reshard::{scheme_cost, Scheme};

/// The four models of PPO-style RLHF.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Actor,
    Critic,
    Reference,
    Reward,
}

impl Role {
    pub const ALL: [Role; 4] = [Role::Actor, Role::Critic, Role::Reference, Role::Reward];

    pub fn name(self) -> &'static str {
        match self {
            Role::Actor => "actor",
            Role::Critic => "critic",
            Role::Reference => "reference",
            Role::Reward => "reward",
        }
    }

    /// Whether this model is updated (holds gradients and optimizer state).
    pub fn trains(self) -> bool {
        matches!(self, Role::Actor | Role::Critic)
    }

    /// Whether its head produces vocabulary logits (critic and reward
    /// models end in a scalar head).
    pub fn has_vocab_head(self) -> bool {
        matches!(self, Role::Actor | Role::Reference)
    }
}

/// One device type and its interconnect.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Hardware {
    pub device_bytes: u64,
    /// Resident whatever runs (CUDA context, communicators, graphs).
    pub runtime_overhead_bytes: u64,
    /// Dense bf16 FLOP/s.
    pub peak_flops: f64,
    /// Achieved share of `peak_flops` in training and prefill.
    pub utilisation: f64,
    /// Device memory bandwidth, bytes/s.
    pub mem_bandwidth: f64,
    /// Per-device collective bandwidth, bytes/s.
    pub link_bandwidth: f64,
    /// Largest tensor-parallel degree (devices joined by the fast link).
    pub devices_per_node: u64,
}

impl Hardware {
    /// NVIDIA H100 SXM: 80 GiB, 989 TFLOP/s bf16, 3.35 TB/s, NVLink 450 GB/s
    /// per direction; 40% utilisation.
    pub fn h100() -> Self {
        Hardware {
            device_bytes: 80 * GIB,
            runtime_overhead_bytes: 6 * GIB,
            peak_flops: 989e12,
            utilisation: 0.4,
            mem_bandwidth: 3.35e12,
            link_bandwidth: 450e9,
            devices_per_node: 8,
        }
    }

    /// NVIDIA H200: as the H100 with 140 GiB at 4.8 TB/s.
    pub fn h200() -> Self {
        Hardware {
            device_bytes: 140 * GIB,
            mem_bandwidth: 4.8e12,
            ..Self::h100()
        }
    }
}

/// One RL iteration's work.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    pub prompts: u64,
    pub samples_per_prompt: u64,
    pub prompt_len: u64,
    pub response_len: u64,
    /// Tokens per training / inference micro-batch on one data-parallel rank.
    pub micro_batch_tokens: u64,
    pub ppo_epochs: u64,
}

impl Default for Workload {
    /// HybridFlow's evaluation setting: 1,024 prompts, 1,024-token prompts
    /// and responses.
    fn default() -> Self {
        Workload {
            prompts: 1024,
            samples_per_prompt: 1,
            prompt_len: 1024,
            response_len: 1024,
            micro_batch_tokens: 8192,
            ppo_epochs: 1,
        }
    }
}

impl Workload {
    pub fn sequences(&self) -> u64 {
        self.prompts * self.samples_per_prompt
    }
    pub fn seq_len(&self) -> u64 {
        self.prompt_len + self.response_len
    }
    pub fn tokens(&self) -> u64 {
        self.sequences() * self.seq_len()
    }
}

/// A model's parallel layout on its set's devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Layout {
    pub p: u64,
    pub t: u64,
    pub d: u64,
    /// The actor's generation layout `(pg, tg)`.
    pub gen: Option<(u64, u64)>,
}

/// What one model in one layout costs and holds, before the set it lives
/// in is known (the actor's generation time needs the set's memory).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ModelCost {
    pub role: Role,
    pub layout: Layout,
    /// Forward passes before training (values, reference and old
    /// log-probs, rewards), seconds.
    pub prepare_s: f64,
    /// The update, seconds.
    pub train_s: f64,
    /// Actor only: the training → generation resharding, seconds.
    pub transition_s: f64,
    /// Bytes per device held across the whole iteration.
    pub persistent_bytes: u64,
    /// Bytes per device held only while this model computes.
    pub transient_bytes: u64,
    /// Actor only: generation weights per device, and KV bytes per token.
    pub gen_weight_bytes: u64,
    pub kv_bytes_per_token: u64,
}

/// Compute-bound seconds for `flops` on `devices` devices.
fn compute_s(hw: &Hardware, flops: f64, devices: u64) -> f64 {
    flops / (devices as f64 * hw.peak_flops * hw.utilisation)
}

/// Seconds of Megatron tensor-parallel all-reduces: `per_layer` all-reduces
/// of the hidden states per layer, ring cost `2(t−1)/t` of the message.
fn tp_comm_s(hw: &Hardware, m: &ModelSpec, tokens_per_replica: u64, t: u64, per_layer: u64) -> f64 {
    if t == 1 {
        return 0.0;
    }
    let msg = (tokens_per_replica * m.hidden * 2) as f64;
    (m.layers * per_layer) as f64 * 2.0 * (t - 1) as f64 / t as f64 * msg / hw.link_bandwidth
}

/// Cost and memory of `role` (architecture `m`, bf16 weights, mixed AdamW,
/// activation checkpointing) in `layout` on `devices` devices.
pub fn model_cost(
    role: Role,
    m: &ModelSpec,
    layout: Layout,
    devices: u64,
    hw: &Hardware,
    w: &Workload,
) -> ModelCost {
    let Layout { p, t, d, gen } = layout;
    let params = m.params();
    let tokens = w.tokens();
    let per_replica = tokens.div_ceil(d);
    let ctx = w.seq_len() / 2;
    let fwd_flops = tokens as f64 * m.forward_flops_per_token(ctx);
    // Pipeline bubble of 1F1B: (p−1) idle slots over m micro-batches.
    let micro = per_replica.div_ceil(w.micro_batch_tokens).max(1);
    let bubble = 1.0 + (p - 1) as f64 / micro as f64;
    let forward_s =
        compute_s(hw, fwd_flops, devices) * bubble + tp_comm_s(hw, m, per_replica, t, 2);
    // Every model makes one forward pass over the batch before the update:
    // old log-probs (actor), reference log-probs, values, rewards.
    let prepare_s = forward_s;
    let train_s = if role.trains() {
        // Forward, backward (2×) and the checkpointed forward again.
        let steps = w.ppo_epochs as f64;
        let grad_bytes = (params * 2 / (p * t)) as f64;
        let dp_s = 2.0 * (d - 1) as f64 / d as f64 * grad_bytes / hw.link_bandwidth;
        steps
            * (compute_s(hw, 4.0 * fwd_flops, devices) * bubble
                + tp_comm_s(hw, m, per_replica, t, 4)
                + dp_s)
    } else {
        0.0
    };

    let mt = w.micro_batch_tokens;
    let layer_act = mt * m.activation_elems_per_token_layer() * 2 / t;
    let logits = if role.has_vocab_head() {
        mt * m.vocab * 4 / t
    } else {
        0
    };
    let (persistent_bytes, transient_bytes) = if role.trains() {
        let states = params * 4 / (p * t) + params * 12 / (p * t * d);
        let act = mt * m.layers * m.hidden * 2 / t + layer_act;
        (states, act + 2 * logits)
    } else {
        (params * 2 / (p * t), layer_act + logits)
    };
    let (gen_weight_bytes, kv_bytes_per_token, transition_s) = match gen {
        Some((pg, tg)) => {
            let model_bytes = m.weight_bytes(DType::Bf16) as f64;
            let moved =
                scheme_cost(Scheme::HybridFlow, model_bytes, (p, t, d), (pg, tg)).comm_bytes;
            (
                params * 2 / (pg * tg),
                m.kv_bytes_per_token_sharded(DType::Bf16, pg, tg),
                moved / hw.link_bandwidth,
            )
        }
        None => (0, 0, 0.0),
    };
    ModelCost {
        role,
        layout,
        prepare_s,
        train_s,
        transition_s,
        persistent_bytes,
        transient_bytes,
        gen_weight_bytes,
        kv_bytes_per_token,
    }
}

/// Seconds the actor takes to generate the iteration's responses with
/// `kv_budget` bytes of KV cache per device, or `None` when not even one
/// sequence fits.
///
/// Sequences are spread over the `devices / (pg·tg)` replicas and run in
/// waves as large as the KV cache allows. A wave's prefill is
/// compute-bound; each of its decode steps reads the stage's weights and
/// the wave's KV cache at memory bandwidth, once per pipeline stage in turn.
pub fn generation_s(
    m: &ModelSpec,
    c: &ModelCost,
    devices: u64,
    kv_budget: u64,
    hw: &Hardware,
    w: &Workload,
) -> Option<f64> {
    let (pg, tg) = c.layout.gen?;
    let replicas = devices / (pg * tg);
    let seqs = w.sequences().div_ceil(replicas);
    let wave = (kv_budget / (c.kv_bytes_per_token * w.seq_len()).max(1)).min(seqs);
    if wave == 0 {
        return None;
    }
    let waves = seqs.div_ceil(wave);
    let prefill = compute_s(
        hw,
        (wave * w.prompt_len) as f64 * m.forward_flops_per_token(w.prompt_len / 2),
        pg * tg,
    );
    let kv_read = (wave * (w.prompt_len + w.response_len / 2) * c.kv_bytes_per_token) as f64;
    let step = pg as f64 * (c.gen_weight_bytes as f64 + kv_read) / hw.mem_bandwidth;
    Some(waves as f64 * (prefill + w.response_len as f64 * step))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::presets::preset;

    #[test]
    fn more_devices_train_faster() {
        let m = preset("qwen2.5-7b").unwrap();
        let (hw, w) = (Hardware::h100(), Workload::default());
        let l = |d| Layout {
            p: 1,
            t: 1,
            d,
            gen: None,
        };
        let a = model_cost(Role::Actor, &m, l(4), 4, &hw, &w);
        let b = model_cost(Role::Actor, &m, l(8), 8, &hw, &w);
        assert!(b.train_s < a.train_s && b.persistent_bytes < a.persistent_bytes);
    }

    #[test]
    fn larger_kv_budget_generates_faster_and_zero_is_infeasible() {
        let m = preset("qwen2.5-7b").unwrap();
        let (hw, w) = (Hardware::h100(), Workload::default());
        let c = model_cost(
            Role::Actor,
            &m,
            Layout {
                p: 1,
                t: 2,
                d: 4,
                gen: Some((1, 2)),
            },
            8,
            &hw,
            &w,
        );
        let small = generation_s(&m, &c, 8, 4 * GIB, &hw, &w).unwrap();
        let big = generation_s(&m, &c, 8, 40 * GIB, &hw, &w).unwrap();
        assert!(big < small);
        assert!(generation_s(&m, &c, 8, 0, &hw, &w).is_none());
    }

    #[test]
    fn scalar_heads_hold_no_logits() {
        let m = preset("qwen2.5-7b").unwrap();
        let (hw, w) = (Hardware::h100(), Workload::default());
        let l = Layout {
            p: 1,
            t: 1,
            d: 8,
            gen: None,
        };
        let reward = model_cost(Role::Reward, &m, l, 8, &hw, &w);
        let reference = model_cost(Role::Reference, &m, l, 8, &hw, &w);
        assert_eq!(
            reference.transient_bytes - reward.transient_bytes,
            w.micro_batch_tokens * m.vocab * 4
        );
    }
}

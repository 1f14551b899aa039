//! LoRA adapters applied at decode instead of merged into the weights.
//!
//! [`Engine::add_lora_adapters`] allocates, in the `weights` tag, an `A`
//! and a `B` per targeted projection under PEFT's names
//! (`model.layers.N.self_attn.q_proj.lora_A.weight`, `….lora_B.weight`),
//! zero at first, and puts them on the products the engine computes
//! ([`colo_model::lora::StackedAdapter`]): a layer's q/k/v `A`s are row
//! blocks of one buffer, so the fused q/k/v product's adapters take one
//! product `x Aᵀ` and then one small product per part, and the same for
//! gate/up; `o_proj` and `down_proj` one each. `update_weights` then writes
//! the adapters by name like any weight (`B` multiplied by `alpha / rank`
//! after the copy), so a switch moves only the adapters while the base
//! weights stay as they are.
//!
//! Merging costs one `addmm` per projection per switch; applying at decode
//! two small products and an add per part per forward. `colo bench lora`
//! measures both (BENCHMARKS.md, "LoRA"): at Qwen2.5-0.5B's shape in
//! bfloat16 on 2 cores, all-linear, the merge adds 0.06 s (rank 8) to
//! 0.15 s (rank 64) to a switch, the adapters 15–23% to a rollout of 16
//! rows and 3–8% to one of 64, so merging wins above 150–770 rollout
//! tokens per switch, fewer than any RL step generates. colo-rl therefore
//! merges (colo-train's `visit_parameters`); this is the engine's side of
//! the other choice, for a caller whose switches are that short.

use colo_mem::tags::WEIGHTS;
use colo_model::lora::{a_name, b_name, StackedAdapter, StackedPart, PROJECTIONS};
use tch::Tensor;

use crate::weights::pooled;
use crate::{Engine, Error, Result};

/// The adapters an engine applies at decode: PEFT's `r`, `lora_alpha` and
/// `target_modules` (module names from [`PROJECTIONS`]).
#[derive(Debug, Clone, PartialEq)]
pub struct DecodeLora {
    pub rank: usize,
    pub alpha: f64,
    pub targets: Vec<String>,
}

impl DecodeLora {
    /// PEFT's scale, `alpha / rank`.
    pub fn scale(&self) -> f64 {
        self.alpha / self.rank as f64
    }

    fn check(&self) -> Result<()> {
        if self.rank == 0 {
            return Err(Error::Config(
                "LoRA at decode: rank 0 (expected at least 1)".into(),
            ));
        }
        if let Some(t) = self
            .targets
            .iter()
            .find(|t| !PROJECTIONS.contains(&t.as_str()))
        {
            return Err(Error::Config(format!(
                "LoRA at decode: target module `{t}` (expected some of {PROJECTIONS:?})"
            )));
        }
        if self.targets.is_empty() {
            return Err(Error::Config(
                "LoRA at decode: no target modules (expected some of q_proj … down_proj)".into(),
            ));
        }
        Ok(())
    }
}

/// A product the engine's layer computes: its name in the layer, its input
/// size, and its parts (projection module name, output rows) in order.
struct Product {
    name: &'static str,
    cols: i64,
    parts: Vec<(&'static str, i64)>,
}

fn products(cfg: &colo_model::ModelConfig) -> [Product; 4] {
    let (h, d) = (cfg.hidden_size as i64, cfg.head_dim as i64);
    let (q, kv) = (cfg.num_heads as i64 * d, cfg.num_kv_heads as i64 * d);
    let i = cfg.intermediate_size as i64;
    [
        Product {
            name: "self_attn.qkv_proj",
            cols: h,
            parts: vec![("q_proj", q), ("k_proj", kv), ("v_proj", kv)],
        },
        Product {
            name: "self_attn.o_proj",
            cols: q,
            parts: vec![("o_proj", h)],
        },
        Product {
            name: "mlp.gate_up_proj",
            cols: h,
            parts: vec![("gate_proj", i), ("up_proj", i)],
        },
        Product {
            name: "mlp.down_proj",
            cols: i,
            parts: vec![("down_proj", h)],
        },
    ]
}

impl Engine {
    /// Puts zero LoRA adapters of `lora` on every layer's targeted
    /// projections, applied at each forward without merging (see the
    /// module docs); returns the bytes they take in the `weights` tag.
    /// `update_weights` writes them by PEFT's names. Needs the engine idle
    /// with its weights resumed, without adapters yet, without a
    /// tensor-parallel group (the adapters are not sliced) and before any
    /// CUDA graph is captured (a captured step would not run them).
    pub fn add_lora_adapters(&mut self, lora: &DecodeLora) -> Result<usize> {
        lora.check()?;
        if self.in_flight() > 0 {
            return Err(Error::Unsupported(
                "add LoRA adapters with requests in flight".into(),
            ));
        }
        if self.shard().size > 1 {
            return Err(Error::Unsupported(
                "LoRA adapters at decode with tensor parallelism (the adapters are not \
                 sliced); merge them into the weights instead"
                    .into(),
            ));
        }
        if self.cuda_graphs() > 0 {
            return Err(Error::Unsupported(
                "LoRA adapters added after CUDA graphs were captured: the graphs would not \
                 run them"
                    .into(),
            ));
        }
        let (kind, device) = {
            let m = self.model()?;
            (m.dtype(), m.device())
        };
        let pool = self.pool().clone();
        let cfg = self.model()?.config().clone();
        let rank = lora.rank as i64;
        // Refused before anything is allocated: a second set (other
        // targets, or the same) would replace the first's stacked adapters
        // while their A and B stayed among the weights, written and unused.
        if let Some(name) = (self.weights().names()).find(|n| n.ends_with(".lora_A.weight")) {
            return Err(Error::Unsupported(format!(
                "the engine already has LoRA adapters (`{name}`); add them once, before the \
                 first weight update"
            )));
        }
        let before = self.weights().bytes;
        for l in 0..cfg.num_layers {
            for p in products(&cfg) {
                let mut targeted = Vec::new();
                let mut out_start = 0;
                for &(module, rows) in &p.parts {
                    if lora.targets.iter().any(|t| t == module) {
                        targeted.push((module, out_start, rows));
                    }
                    out_start += rows;
                }
                if targeted.is_empty() {
                    continue;
                }
                let zeros = |shape: &[i64]| {
                    pooled(&pool, WEIGHTS, || Tensor::f_zeros(shape, (kind, device)))
                };
                let a = zeros(&[rank * targeted.len() as i64, p.cols])?;
                let mut parts = Vec::with_capacity(targeted.len());
                for (k, (module, out_start, rows)) in targeted.into_iter().enumerate() {
                    let prefix = p.name.split_once('.').map_or("", |(s, _)| s);
                    let path = format!("model.layers.{l}.{prefix}.{module}");
                    let rank_start = k as i64 * rank;
                    let a_part = a.f_narrow(0, rank_start, rank)?;
                    let b = zeros(&[rows, rank])?;
                    let w = self.weights_mut();
                    w.add(a_name(&path), a_part, None);
                    w.add(b_name(&path), b.shallow_clone(), Some(lora.scale()));
                    parts.push(StackedPart {
                        out_start,
                        rank_start,
                        scaled_b: b,
                    });
                }
                let adapter = StackedAdapter::new(a, parts)?;
                self.model_mut()
                    .set_stacked_adapter(l, p.name, Some(adapter))?;
            }
        }
        Ok(self.weights().bytes - before)
    }
}

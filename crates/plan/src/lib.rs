//! `colo-plan`: arithmetic-only planning for colocated RL post-training.
//!
//! No tensors, no devices: given a model's dimensions, layouts and a
//! workload, it answers four questions before anything is launched.
//!
//! 1. **Memory per phase** ([`memory::estimate`]): the resident bytes per
//!    component on one device at every transition of an RL step — idle,
//!    wake, weight sync, free of the trainer's copy, KV wake, generation,
//!    sleep, log-prob passes, training — the peak and where it happens, and
//!    the largest engine memory fraction that fits.
//! 2. **Device mapping** ([`mapping::auto_map`]): HybridFlow's Algorithms 1
//!    and 2 over actor, critic, reference and reward, with the analytic
//!    costs of [`cost`].
//! 3. **Resharding** ([`reshard::plan_reshard`]): the 3D-HybridEngine's
//!    generation groups, micro-DP all-gathers and HybridFlow Table 2's
//!    volumes and peaks; [`reshard::plan_fsdp_reshard`]: the bytes each
//!    worker of a sharded colo run sends and receives per switch, against
//!    the zero-redundancy reshard of the same layout.
//! 4. **Generation alone** ([`generate::estimate`]): what `colo generate`
//!    holds for `n` samples decoded at once — the weights, the KV cache and
//!    the decode step's buffers.
//!
//! ```
//! use colo_plan::config::{PlanInput, ModelSource, GIB};
//! use colo_plan::memory::estimate;
//!
//! // Qwen-32B served with tp=2 at mem fraction 0.9 on 140 GiB devices,
//! // woken in stages (the SGLang multi-stage-awake RFC's setting).
//! let input = PlanInput {
//!     model: ModelSource::Preset("qwen-32b".into()),
//!     devices: 8,
//!     device_memory_gib: 140.0,
//!     gen_tp: 2,
//!     mem_fraction: Some(0.9),
//!     ..Default::default()
//! };
//! let report = estimate(&input.validate()?)?;
//! assert_eq!(report.peak_phase, "wake_kv");
//! assert!((report.peak_bytes as f64 / GIB as f64 - 131.8).abs() < 1.0);
//! # Ok::<(), colo_plan::error::PlanError>(())
//! ```
//!
//! # Modelling assumptions
//!
//! These are the choices that reproduce the public figures (see the
//! crate's `README.md` and `tests/golden_memory.rs`):
//!
//! - **Parameters** are counted exactly from the config (q/k/v/o with
//!   Qwen2's q/k/v biases or Llama's `attention_bias`, SwiGLU, two RMSNorms
//!   per layer, embeddings, untied head, final norm). Qwen2.5-7B has
//!   7,615,616,512: 15.23 GB in bf16.
//! - **KV cache** per token is `2 · layers · kv_heads · head_dim · bytes`
//!   (57,344 B for Qwen2.5-7B in bf16); `pg` splits layers and `tg` splits KV
//!   heads, replicating them when `tg` exceeds their number.
//! - **Engine memory** follows SGLang's `mem_fraction_static` as the issue
//!   states it: the engine holds `fraction × device` for weights plus KV
//!   cache, so the KV cache is that minus the weights (`M / (tg·pg)`). The
//!   engine's activations and CUDA graphs are part of the runtime overhead.
//! - **Runtime overhead** (CUDA context, NCCL, CUDA graphs, allocator slack)
//!   is a constant per device, default **6 GiB**: the RFC's idle readings
//!   are 5.8 and 7.1 GiB, and the blog counts 1–3 GB of CUDA graphs plus
//!   3–7 GB of buffers. It is an input; set it to 0 for colo's host backend.
//! - **Training states**: mixed-precision AdamW 2 + 2 + 12 bytes per
//!   parameter (fp32: 4 + 4 + 8), FSDP shards all three; Megatron shards
//!   parameters and gradients over `p·t` and, with the distributed
//!   optimizer, the optimizer over `p·t·d`. FSDP pads each unit (the root:
//!   everything outside the layers; each layer) to a multiple of its ranks,
//!   and holds the root and `fsdp_gathered_layers` layers unsharded while
//!   computing (2, PyTorch's prefetch; 1, colo's sharded trainer, whose
//!   reference stays whole: `fsdp_shard_reference`).
//! - **Activations** per token and layer follow Korthikanti et al. (2022)
//!   redone for RMSNorm/GQA/SwiGLU with FlashAttention; checkpointing keeps
//!   each layer's input plus one layer recomputed; tensor parallelism (with
//!   sequence parallelism) divides them, pipeline parallelism does not
//!   (1F1B's first stage holds `p` micro-batches of `L/p` layers).
//! - **Logits** are fp32, `tokens × vocab × 4` bytes per micro-batch
//!   (vocab-parallel over `t`); training holds them and their gradient.
//!   In RL this is often the largest activation term.
//! - **Weight sync**: `full` materialises the trainer's whole model in the
//!   parameter dtype on every device while the engine copies its slice
//!   (verl's FSDP → SGLang path, and the peak `M` of DeepSpeed-Chat and
//!   HybridFlow-V); `in-place` gathers straight into the engine's weights
//!   (HybridFlow); a bucket streams it. The trainer's own shard is on the
//!   device during the sync only if its parameters were not offloaded.
//! - **Offload switches** (MindSpeed-RL's `offload_train_param/grad/
//!   optimizer`, plus the reference's parameters) say what sits in host
//!   memory from the end of training until the log-prob passes bring it
//!   back.
//! - **Modes**: `staged` wakes weights → sync → frees the trainer's copy →
//!   wakes KV (SGLang RFC #7009); `sleep` wakes weights and KV together
//!   before the sync; `naive` never releases the engine.
//!
//! With these, the RFC's Qwen-32B staged timeline "5.8 → 36.6 → 98.1 →
//! 37.6 → 131.8" comes out as 6.0 → 36.5 → 97.5 → 36.5 → 132.0 GiB, and the
//! single-stage peaks as 193.0 (RFC 192) and 147.0 (RFC 148.9) GiB. The RFC's
//! reading after freeing the trainer's copy stays ≈ 1 GiB above the model in
//! both runs (memory the allocator kept), which the model does not capture.
//!
//! # Design decisions
//!
//! - Input is a serde struct ([`config::PlanInput`]) validated once into
//!   [`config::Plan`]; `colo plan --config run.toml` maps a `colo train`
//!   run config onto the same struct (in the CLI, so this crate needs
//!   nothing of colo-rl), and its predicted peak is checked against real
//!   runs' timelines (`crates/colo/tests/plan_vs_run.rs`, within 10%).
//! - colo's own CPU runs use two extensions: a KV budget as a share of
//!   the memory free after the weights, in blocks
//!   ([`config::KvBudget::FreeFraction`]), and eager activations
//!   ([`config::ActivationModel::Eager`]), where every op's output is kept
//!   for backward.
//! - Phases are a walk over the same transitions the memory layer records,
//!   so the estimate and colo's timeline can be compared line by line.
//! - Integers (bytes) for memory, `f64` only for times and fractions.

pub mod config;
pub mod cost;
pub mod error;
pub mod generate;
pub mod lora;
pub mod mapping;
pub mod memory;
pub mod model;
pub mod presets;
pub mod report;
pub mod reshard;

pub use config::{Plan, PlanInput};
pub use error::{PlanError, Result};
pub use memory::estimate;
pub use report::MemoryReport;

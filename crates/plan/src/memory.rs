//! The per-phase memory model of a colocated RL step on one device.
//!
//! [`estimate`] walks the step as the memory layer would see it — the same
//! transitions that colo's timeline records — and snapshots the resident
//! bytes per [`Component`] after each. The modelling assumptions are listed
//! in the crate docs; each size below says which one it uses.

use std::collections::BTreeMap;

use crate::config::{ActivationModel, KvBudget, Mode, Optimizer, Plan, TrainLayout, WeightSync};
use crate::error::{out_of_range, Result};
use crate::model::DType;
use crate::report::{Component, MemoryReport, PhaseKind, PhaseMemory};

/// Bytes of each component on one device, before any choreography.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComponentSizes {
    pub train_params: u64,
    pub train_grads: u64,
    pub optimizer: u64,
    pub fsdp_gathered: u64,
    /// Activations kept for backward over one training micro-batch.
    pub train_activations: u64,
    /// Logits and their gradient for one training micro-batch.
    pub train_logits: u64,
    /// One layer's working set in a forward-only log-prob pass.
    pub forward_activations: u64,
    pub forward_logits: u64,
    pub ref_params: u64,
    pub rollout_weights: u64,
    /// KV-cache bytes per token on one device.
    pub kv_bytes_per_token: u64,
    pub sync_buffer: u64,
    /// The captured decode graphs' memory ([`cuda_graph_bytes`]).
    pub cuda_graphs: u64,
}

/// What the CUDA caching allocator holds for a capture's small tensors
/// whatever the shape: the segments (2 MiB for blocks up to 1 MiB, 20 MiB
/// for blocks up to 10 MiB) of the warm-up's and the capture's streams.
/// Measured, not derived: 48–58 MiB at the smallest shapes of
/// `bench/gpu/graph_mem.sh` (H200, 2026-11-26); the largest of them.
pub const CUDA_GRAPH_FLOOR: u64 = 56 << 20;

/// The memory the rollout engine's captured decode graphs hold on one
/// device: the working set of the largest step, `rows` × `keys`, which the
/// smaller buckets' captures reuse (colo-rollout captures largest first,
/// into one pool).
///
/// Counted from colo-rollout's decode step: the keys and values gathered
/// for attention, `2 · rows · keys · kv_dim` elements of the KV dtype with
/// a quarter's headroom (its `Scratch`), and the scores, `rows · heads ·
/// keys` of them at 8 bytes (the product in the KV dtype, the float32
/// softmax, the cast back; in float32 the cast is the softmax itself); then
/// [`CUDA_GRAPH_FLOOR`] for everything small. Checked against the
/// `cuda_graph` tag of runs of issue 9's 3 M-parameter model (plan_vs_run in
/// crates/plan/README.md): within 4% from 140 MiB up, and above the measure
/// (by at most 19 MiB) below.
pub fn cuda_graph_bytes(plan: &Plan) -> u64 {
    let Some(g) = plan.cuda_graphs else {
        return 0;
    };
    let m = &plan.model;
    let tg = plan.gen_tp;
    let (kv_heads, heads) = (m.kv_heads.div_ceil(tg), m.heads.div_ceil(tg));
    let gathered = 2 * g.rows * g.keys * kv_heads * m.head_dim;
    let scratch = (gathered + gathered / 4) * plan.kv_dtype.bytes();
    let scores = 8 * g.rows * heads * g.keys;
    scratch + scores + CUDA_GRAPH_FLOOR
}

/// Training-state sizes on one device.
///
/// Mixed-precision AdamW keeps parameters and gradients in the parameter
/// dtype and 12 bytes of fp32 state (master weights, first and second
/// moments) per parameter — ZeRO's 2 + 2 + 12 (Rajbhandari et al., *ZeRO*,
/// 2020, §3.1); fp32 training keeps 4 + 4 + 8. FSDP shards all three over
/// its shard group, each unit (the root: everything outside the decoder
/// layers; each layer) padded to a multiple of the shards (FSDP's
/// `FlatParameter`, colo-train's `sharding`), and holds the root unit and
/// [`Plan::fsdp_gathered_layers`] layers gathered while computing;
/// Megatron shards parameters and gradients over `p · t` and, with the
/// distributed optimizer, the optimizer states over `p · t · d`.
pub fn component_sizes(plan: &Plan) -> ComponentSizes {
    let m = &plan.model;
    let params = m.params();
    let (pb, gb, ob) = match plan.optimizer {
        Optimizer::AdamwMixed => (plan.param_dtype.bytes(), plan.param_dtype.bytes(), 12),
        Optimizer::AdamwMixedFp32Grads => (plan.param_dtype.bytes(), 4, 12),
        Optimizer::AdamwFp32 => (4, 4, 8),
    };
    let (state_shards, opt_shards, t) = match plan.train {
        TrainLayout::Fsdp { shards } => (shards, shards, 1),
        TrainLayout::Megatron {
            p,
            t,
            d,
            distributed_optimizer,
        } => (
            p * t,
            if distributed_optimizer {
                p * t * d
            } else {
                p * t
            },
            t,
        ),
    };
    // One rank's bytes of a state of `bytes` a parameter over `shards`.
    let shard = |bytes: u64, shards: u64| match plan.train {
        TrainLayout::Fsdp { .. } => {
            let units = m.non_layer_params().div_ceil(shards)
                + m.layers * m.layer_params().div_ceil(shards);
            units * bytes
        }
        TrainLayout::Megatron { .. } => (params * bytes).div_ceil(shards),
    };
    let fsdp = plan.fsdp_shards() > 1;
    let fsdp_gathered = match fsdp {
        true => (m.non_layer_params() + plan.fsdp_gathered_layers * m.layer_params()) * pb,
        false => 0,
    };
    // Activations: with checkpointing, every layer's input (h elements per
    // token) plus one layer recomputed in full; without, every layer in
    // full. Tensor parallelism (with sequence parallelism) divides both; the
    // first pipeline stage holds `p` micro-batches of `L / p` layers under
    // 1F1B, i.e. the same `L` layers' worth, so `p` does not.
    let per_layer = m.activation_elems_per_token_layer();
    let tokens = plan.tokens_per_micro_batch;
    let act_elems = if plan.activation_checkpointing {
        m.layers * m.hidden + per_layer
    } else {
        m.layers * per_layer
    };
    let lp_tokens = plan.logprob_tokens_per_micro_batch;
    // fp32 logits over the (vocab-parallel) vocabulary; training also holds
    // their gradient at the start of backward.
    let logits = |tok: u64| tok * m.vocab * 4 / t;
    let full_weights = params * plan.param_dtype.bytes();
    let (pg, tg) = (plan.gen_pp, plan.gen_tp);
    let mut sizes = ComponentSizes {
        train_params: shard(pb, state_shards),
        train_grads: shard(gb, state_shards),
        optimizer: shard(ob, opt_shards),
        fsdp_gathered,
        train_activations: tokens * act_elems * pb / t,
        train_logits: 2 * logits(tokens),
        forward_activations: lp_tokens * per_layer * pb / t,
        forward_logits: logits(lp_tokens),
        ref_params: match plan.fsdp_shard_reference || !fsdp {
            true => shard(plan.param_dtype.bytes(), state_shards),
            false => full_weights,
        },
        rollout_weights: match plan.gen_replicated_embeddings {
            // The layers split, the rest whole on every rank.
            true => {
                let whole = m.non_layer_params() * plan.param_dtype.bytes();
                (full_weights - whole).div_ceil(pg * tg) + whole
            }
            false => full_weights.div_ceil(pg * tg),
        },
        kv_bytes_per_token: m.kv_bytes_per_token_sharded(plan.kv_dtype, pg, tg),
        sync_buffer: match plan.weight_sync {
            WeightSync::Full => full_weights,
            WeightSync::InPlace => 0,
            WeightSync::Bucket(b) => b.min(full_weights),
            // Offloaded shards stream in for the gather.
            WeightSync::Gather => match plan.offload.train_param {
                true => fsdp_gathered + shard(pb, state_shards),
                false => fsdp_gathered,
            },
        },
        cuda_graphs: cuda_graph_bytes(plan),
    };
    if let Some(l) = &plan.lora {
        // Frozen weights, and the adapters' state alone ([`crate::lora`]).
        let adapters = m.lora_params(l);
        sizes.train_params += (adapters * pb).div_ceil(state_shards);
        sizes.train_grads = (adapters * gb).div_ceil(state_shards);
        sizes.optimizer = (adapters * ob).div_ceil(opt_shards);
        sizes.ref_params = 0;
        // One layer's merged weights beside what the sync reads.
        let merged = m.lora_merged_layer_params(l) * plan.param_dtype.bytes();
        sizes.sync_buffer = match plan.weight_sync {
            WeightSync::Full => sizes.train_params + merged,
            _ => sizes.sync_buffer + merged,
        };
    }
    if let ActivationModel::Eager {
        seq_len,
        response_len,
        prompt_rows,
        lanes,
        fused_head,
    } = plan.activations
    {
        eager_activations(
            plan,
            &mut sizes,
            seq_len,
            response_len,
            prompt_rows,
            fused_head,
        );
        sizes.train_activations =
            eager_training_peak(plan, sizes.train_activations, seq_len, lanes);
    }
    sizes
}

/// The share of the fitted terms (the activations' and the logits'
/// components, which count what libtorch's passes save and were checked
/// against real runs within 10%) that a plan adds as its margin: a phase
/// fits when its total and this share of its activations fit the device.
/// Every other component is the size of allocations the code makes
/// (parameters, gradients, optimizer state, weights, KV cache: exact up
/// to the pool's page rounding).
pub const ACTIVATION_MARGIN: f64 = 0.10;

/// The margin a phase with these components needs ([`ACTIVATION_MARGIN`]).
pub fn phase_margin(components: &BTreeMap<Component, u64>) -> u64 {
    let fitted = [Component::Activations, Component::Logits]
        .iter()
        .filter_map(|c| components.get(c))
        .sum::<u64>();
    (fitted as f64 * ACTIVATION_MARGIN).ceil() as u64
}

/// The `activations` tag's high-water mark in an eager training pass:
/// the larger of the graph (`graph`: [`eager_activations`], at the start
/// of the backward, every lane at once) and the end of the backward.
///
/// At the end the graph is freed and the gradients are all there: each
/// lane's `run_backward` (colo-train's `ColoTrainer::train_step`) returns
/// every parameter's gradient in the parameters' kind, and every lane's
/// are held until `param_lanes::accumulate` adds them into the float32
/// accumulators. The embedding's backward comes last (libtorch's
/// `embedding_dense_backward`), and holds twice its gradient's bytes
/// (`vocab × h` elements) at its peak; with tied embeddings the LM head's
/// partial gradient of the same matrix is alive beside it until autograd
/// adds the two. So a lane ends at its gradients plus one `vocab × h`
/// (untied) or two (tied) — measured to the MiB at Qwen2.5-0.5B's shape in
/// bf16 (942 MiB of gradients and 519 MiB a lane) and on `plan_vs_run`'s
/// real-vocabulary models. At that shape the end outweighs a small job's
/// graph; the lanes reach it at different moments or at once (both seen on
/// issue 36's job), so all of them at once is the bound. A micro-batch of
/// fewer rows than lanes runs on as many lanes as rows. With activation
/// checkpointing `graph` already holds one lane's gradients, summed piece
/// by piece beside the recomputed layer; the other lanes hold theirs
/// beside it.
///
/// Sharded (FSDP over more than one rank), a lane holds the gradients of
/// [`grad_params`] at once, and the unit being reduce-scattered is
/// flattened into float32 beside them (colo-train's `sharding`: the
/// design's count, not yet measured on a sharded run).
fn eager_training_peak(plan: &Plan, graph: u64, seq: u64, lanes: u64) -> u64 {
    let m = &plan.model;
    let b = plan.param_dtype.bytes();
    let rows = plan.tokens_per_micro_batch.div_ceil(seq).max(1);
    let lanes = lanes.min(rows);
    let grads = grad_params(plan) * b;
    let flat = match plan.fsdp_shards() > 1 {
        true => m.non_layer_params().max(m.layer_params()) * DType::F32.bytes(),
        false => 0,
    };
    let embedding = m.vocab * m.hidden * b;
    let beyond = match (plan.lora.is_some(), m.tie_embeddings) {
        // A frozen embedding gets no gradient.
        (true, _) => 0,
        (false, true) => 2 * embedding,
        (false, false) => embedding,
    };
    let graph_side = match plan.activation_checkpointing {
        true => graph + (lanes - 1) * grads,
        false => graph,
    };
    graph_side.max(lanes * (grads + beyond)) + flat
}

/// The parameters whose gradients an eager backward holds at once: all
/// of them, or sharded the root unit's (held from the LM head's backward
/// to the embedding's) and one decoder layer's (reduce-scattered when its
/// backward ends); with LoRA the adapters.
fn grad_params(plan: &Plan) -> u64 {
    let m = &plan.model;
    if let Some(l) = &plan.lora {
        return m.lora_params(l);
    }
    match plan.fsdp_shards() > 1 {
        true => m.non_layer_params() + m.layer_params(),
        false => m.params(),
    }
}

/// Activations of an eager trainer (colo's, on libtorch): the graph of a
/// micro-batch — every layer's saved op outputs
/// ([`crate::model::ModelSpec::eager_elems_per_token_layer`]), the
/// embedding and final norm (`2h`), and over the response window the
/// LM head's — lives until backward ends. With the fused head (colo-mem's
/// kernel, on the CPU) the head keeps the logits and its backward writes
/// their gradient (8 bytes per vocabulary entry and window token,
/// measured in both kinds).
/// Otherwise it keeps the float32 log-softmax (`vocab`; the logits are
/// dropped once it exists), and backward starts at the head, where the
/// gathered log-probs' gradient is scattered into a (window, vocab) tensor
/// and the log-softmax's backward makes another, both beside the whole
/// graph (`3 · vocab` float32 per window token). Backward frees each saved tensor as it
/// passes it and the parameters' gradients reuse those blocks from the
/// tag's cache (as does the update of the scoring passes' cached blocks),
/// so the tag's high-water mark is the graph.
/// With activation checkpointing only the layers' boundaries are kept,
/// and one layer's graph at a time.
/// A forward-only pass frees each layer's outputs as the next one runs:
/// one layer's working set and the logits. Both include the logits, so
/// the `logits` component stays empty.
///
/// With `prompt_rows` rows per shared prompt, a micro-batch's rows run
/// their responses and each prompt runs once: `rows · response + rows /
/// prompt_rows · (seq − response)` tokens through the layers, each layer
/// also keeps every row's copy of its prompt's keys and values (the
/// attention's input), and the LM-head window is `rows · response`.
fn eager_activations(
    plan: &Plan,
    s: &mut ComponentSizes,
    seq: u64,
    response: u64,
    prompt_rows: u64,
    fused_head: bool,
) {
    let m = &plan.model;
    // The log-softmax over the vocabulary and its gradients are float32
    // whatever the parameters' dtype.
    let b = plan.param_dtype.bytes();
    let f = DType::F32.bytes();
    // The LM head's window, per token. Fused (colo-kernels' loss head, the CPU):
    // the logits, kept for the backward, and their gradient in it: 8 bytes
    // per vocabulary entry in float32 and, fitted on the toy runs' mapped
    // peaks (plan_vs_run), in bf16 as well. The kernel itself holds 4 in
    // bf16 (the logits and `dx`, csrc/token_logprobs.cpp; measured alone
    // and on a real-vocabulary model of width 64); the other 4 stand for
    // what the fit absorbed, the cached blocks of the toy runs and, at
    // Qwen2.5-0.5B's width on two lanes, each lane's LM-head weight
    // gradient beside its logits (there the graph of 32 rows measured
    // 2,667 MiB allocated against 2,720 planned, BENCHMARKS.md "Plan against
    // run"). Otherwise the float32 log-softmax is kept, and the backward
    // makes the gather's and the log-softmax's gradients (`3 · vocab`
    // float32); in a reduced precision also ~2.5 vocabulary-sized float32
    // tensors of the casts to and from it, 10 bytes per element (measured
    // likewise). The layers keep nothing in float32 since colo-kernels' fused
    // RMSNorm (it saves its bf16 input and one float32 per row); the bf16
    // product attention on the CPU keeps its probabilities, which
    // `eager_elems_per_token_layer` counts.
    let head = match (fused_head, b < f) {
        (true, _) => 2 * m.vocab * f,
        (false, true) => 3 * m.vocab * f + 10 * m.vocab,
        (false, false) => 3 * m.vocab * f,
    };
    // A forward-only pass holds the logits (fused; a float32 result on the
    // way in bf16), or the logits and their float32 log-softmax.
    let head_forward = match fused_head {
        true => m.vocab * f,
        false => 2 * m.vocab * f,
    };
    let per_layer = m.eager_elems_per_token_layer(seq);
    // Tokens through the layers, the LM-head window, and the elements each
    // layer keeps of the rows' gathered prompt keys and values.
    let run = |tokens: u64| {
        let rows = tokens.div_ceil(seq);
        match prompt_rows {
            1 => (tokens, tokens * response / seq, 0),
            g => {
                let through = rows * response + rows.div_ceil(g) * (seq - response);
                (
                    through,
                    rows * response,
                    // The rows' gathered prompt keys and values, and the
                    // concatenations of the one token stream (prompts and
                    // responses) around the per-part attention: ~2h per
                    // token, measured (plan_vs_run).
                    rows * (seq - response) * 2 * m.kv_dim() + through * 2 * m.hidden,
                )
            }
        }
    };
    let (tokens, window, gathered) = run(plan.tokens_per_micro_batch);
    s.train_activations = match plan.activation_checkpointing {
        false => {
            (tokens * (m.layers * per_layer + 2 * m.hidden) + m.layers * gathered) * b
                + window * head
        }
        // colo-train's checkpointing keeps every layer's input and the last
        // output (`L + 1` boundaries of `h`), and holds one layer's graph
        // and the gradient flowing between layers (`h`) at a time; the
        // head's graph is the same as without. The parameters' gradients
        // are summed piece by piece beside them (without checkpointing
        // they come at the end, into the graph's freed blocks), and a
        // layer's backward works beside its small graph (~2i per token,
        // the MLP's gradients: measured, plan_vs_run).
        true => {
            (tokens * ((m.layers + 2) * m.hidden + per_layer + 2 * m.hidden + 2 * m.intermediate)
                + gathered
                + grad_params(plan))
                * b
                + window * head
        }
    };
    s.train_logits = 0;
    let (lp, lp_window, lp_gathered) = run(plan.logprob_tokens_per_micro_batch);
    s.forward_activations =
        (lp * (per_layer + 2 * m.hidden) + lp_gathered) * b + lp_window * head_forward;
    s.forward_logits = 0;
}

/// KV-cache bytes and the engine's share of the device (weights + KV).
fn kv_cache(plan: &Plan, s: &ComponentSizes) -> Result<(u64, f64)> {
    let device = plan.device_bytes;
    let block = s.kv_bytes_per_token * plan.kv_block_tokens;
    let weights = s.rollout_weights;
    let share = |kv: u64| (kv + weights) as f64 / device as f64;
    match plan.kv_budget {
        KvBudget::Fraction(f) => {
            let engine = (f * device as f64) as u64;
            if engine <= weights {
                return Err(out_of_range(
                    "mem_fraction",
                    f,
                    format!(
                        "in ({:.4}, 1]: the engine's weights alone take that share of the device",
                        weights as f64 / device as f64
                    ),
                ));
            }
            Ok(((engine - weights) / block * block, f))
        }
        KvBudget::Tokens(t) => {
            let kv = t.div_ceil(plan.kv_block_tokens) * block;
            Ok((kv, share(kv)))
        }
        KvBudget::FreeFraction(f) => {
            let free = device.saturating_sub(plan.runtime_overhead_bytes + weights);
            let mut kv = (f * free as f64) as u64 / block * block;
            if let Some(cap) = plan.kv_tokens_cap {
                kv = kv.min(cap.div_ceil(plan.kv_block_tokens) * block);
            }
            if kv == 0 {
                return Err(out_of_range(
                    "kv_free_fraction",
                    f,
                    format!(
                        "large enough for one KV block of {block} bytes: {} bytes are free after the weights",
                        free
                    ),
                ));
            }
            Ok((kv, share(kv)))
        }
    }
}

/// The resident set as the step proceeds, and the snapshots taken of it.
struct Timeline {
    resident: BTreeMap<Component, u64>,
    phases: Vec<PhaseMemory>,
}

impl Timeline {
    fn set(&mut self, c: Component, bytes: u64) {
        if bytes == 0 {
            self.resident.remove(&c);
        } else {
            self.resident.insert(c, bytes);
        }
    }

    fn release(&mut self, c: Component) {
        self.resident.remove(&c);
    }

    fn snap(&mut self, name: &str, kind: PhaseKind) {
        self.phases.push(PhaseMemory {
            name: name.into(),
            kind,
            total_bytes: self.resident.values().sum(),
            components: self.resident.clone(),
        });
    }
}

/// Estimate per-device resident bytes over one colocated RL step.
///
/// The step starts right after the previous step's actor update, when the
/// offload switches have moved training state to the host:
///
/// ```text
/// idle → [wake_weights | wake] → sync → free_train → [wake_kv] → generation
///      → sleep → [ref_logprob] → old_logprob → training
/// ```
///
/// `staged` wakes the engine's weights, syncs, frees the trainer's copy and
/// only then wakes the KV cache (SGLang RFC #7009, "multi-stage awake");
/// `sleep` wakes both before the sync; `naive` never releases the engine.
pub fn estimate(plan: &Plan) -> Result<MemoryReport> {
    use Component::*;
    let s = component_sizes(plan);
    let device = plan.device_bytes;
    let (kv_bytes, fraction) = kv_cache(plan, &s)?;
    let off = plan.offload;
    let naive = plan.mode == Mode::Naive;
    let mut tl = Timeline {
        resident: BTreeMap::new(),
        phases: Vec::new(),
    };

    // After the previous update: what the offload switches leave behind.
    tl.set(Runtime, plan.runtime_overhead_bytes);
    tl.set(
        TrainParams,
        if off.train_param { 0 } else { s.train_params },
    );
    tl.set(TrainGrads, if off.train_grad { 0 } else { s.train_grads });
    tl.set(Optimizer, if off.optimizer { 0 } else { s.optimizer });
    tl.set(
        RefParams,
        if off.ref_param || !plan.reference {
            0
        } else {
            s.ref_params
        },
    );
    if naive {
        tl.set(RolloutWeights, s.rollout_weights);
        tl.set(KvCache, kv_bytes);
        tl.set(CudaGraphs, s.cuda_graphs);
    }
    tl.snap("idle", PhaseKind::Transition);

    // Wake and weight sync. The trainer's copy for the sync streams in from
    // the host when its parameters were offloaded.
    match plan.mode {
        Mode::Staged => {
            tl.set(RolloutWeights, s.rollout_weights);
            tl.snap("wake_weights", PhaseKind::Transition);
        }
        Mode::Sleep => {
            tl.set(RolloutWeights, s.rollout_weights);
            tl.set(KvCache, kv_bytes);
            tl.set(CudaGraphs, s.cuda_graphs);
            tl.snap("wake", PhaseKind::Transition);
        }
        Mode::Naive => {}
    }
    tl.set(SyncBuffer, s.sync_buffer);
    tl.snap("sync", PhaseKind::Transition);
    tl.release(SyncBuffer);
    tl.snap("free_train", PhaseKind::Transition);
    if plan.mode == Mode::Staged {
        tl.set(KvCache, kv_bytes);
        tl.set(CudaGraphs, s.cuda_graphs);
        tl.snap("wake_kv", PhaseKind::Transition);
    }
    tl.snap("generation", PhaseKind::Generation);

    if !naive {
        tl.release(RolloutWeights);
        tl.release(KvCache);
        tl.release(CudaGraphs);
        tl.snap("sleep", PhaseKind::Transition);
    }

    // Forward-only passes: FSDP gathers parameters unit by unit, one
    // layer's activations live at a time, the logits of one micro-batch.
    let forward = |tl: &mut Timeline, gathered: u64| {
        tl.set(FsdpGathered, gathered);
        tl.set(Activations, s.forward_activations);
        tl.set(Logits, s.forward_logits);
    };
    if plan.reference {
        // With LoRA the reference is the trainer's weights, adapters off.
        match plan.lora {
            Some(_) => tl.set(TrainParams, s.train_params),
            None => tl.set(RefParams, s.ref_params),
        }
        // A whole reference gathers nothing.
        let gathered = match plan.fsdp_shard_reference {
            true => s.fsdp_gathered,
            false => 0,
        };
        forward(&mut tl, gathered);
        tl.snap("ref_logprob", PhaseKind::LogProb);
        if off.ref_param {
            tl.release(RefParams);
        }
    }
    tl.set(TrainParams, s.train_params);
    forward(&mut tl, s.fsdp_gathered);
    tl.snap("old_logprob", PhaseKind::LogProb);

    tl.set(TrainGrads, s.train_grads);
    tl.set(Optimizer, s.optimizer);
    tl.set(Activations, s.train_activations);
    tl.set(Logits, s.train_logits);
    tl.snap("training", PhaseKind::Training);

    let phases = tl.phases;
    // The first phase to reach the peak: where it starts.
    let peak = phases.iter().fold(&phases[0], |best, p| {
        if p.total_bytes > best.total_bytes {
            p
        } else {
            best
        }
    });
    let (peak_bytes, peak_phase) = (peak.total_bytes, peak.name.clone());
    // What each phase needs with its margin: the most of that is what the
    // device must hold.
    let needs = |p: &PhaseMemory| p.total_bytes + phase_margin(&p.components);
    let need = phases.iter().map(needs).max().unwrap_or(0);
    // Weights + KV equal `fraction × device` wherever the KV cache is
    // resident, so each such phase bounds the fraction by what the rest of
    // it (and its margin) leaves; phases without the KV cache must fit on
    // their own.
    let mut max_fraction = Some(1.0f64);
    for p in &phases {
        let has_kv = p.get(KvCache) > 0;
        let rest = needs(p)
            - if has_kv {
                p.get(KvCache) + p.get(RolloutWeights)
            } else {
                0
            };
        let bound = if has_kv {
            device.saturating_sub(rest) as f64 / device as f64
        } else if needs(p) <= device {
            1.0
        } else {
            0.0
        };
        max_fraction = max_fraction.map(|f| f.min(bound));
    }
    let weights_share = s.rollout_weights as f64 / device as f64;
    let max_mem_fraction = max_fraction.filter(|f| *f > weights_share);
    Ok(MemoryReport {
        peak_bytes,
        peak_phase,
        margin_bytes: need - peak_bytes,
        device_bytes: device,
        fits: need <= device,
        mem_fraction: fraction,
        max_mem_fraction,
        kv_cache_bytes: kv_bytes,
        kv_tokens: kv_bytes / s.kv_bytes_per_token.max(1),
        phases,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{GraphCapture, ModelSource, PlanInput, GIB};
    use crate::model::HfConfig;

    fn plan(f: impl FnOnce(&mut PlanInput)) -> Plan {
        let mut input = PlanInput::default();
        f(&mut input);
        input.validate().unwrap()
    }

    #[test]
    fn staged_peak_is_below_sleep_peak_by_the_sync_copy() {
        let staged = estimate(&plan(|_| ())).unwrap();
        let sleep = estimate(&plan(|i| i.mode = "sleep".into())).unwrap();
        let sync = component_sizes(&plan(|_| ())).sync_buffer;
        assert_eq!(
            sleep.phase("sync").unwrap().total_bytes - sync,
            staged.phase("wake_kv").unwrap().total_bytes
        );
        assert!(staged.peak_bytes < sleep.peak_bytes);
    }

    #[test]
    fn naive_keeps_the_engine_through_training() {
        let r = estimate(&plan(|i| i.mode = "naive".into())).unwrap();
        let t = r.phase("training").unwrap();
        assert!(t.get(Component::KvCache) > 0 && t.get(Component::RolloutWeights) > 0);
        assert!(r.phase("sleep").is_none());
        let staged = estimate(&plan(|_| ())).unwrap();
        assert_eq!(staged.phase("training").unwrap().get(Component::KvCache), 0);
    }

    /// The captured graphs' memory: issue 9's 3 M-parameter model (2 KV
    /// heads of 64, 4 query heads) at 256 rows and 512 keys in bf16, which
    /// measured 140 MiB on an H200 (`bench/gpu/graph_mem.sh`): gathered K
    /// and V with their headroom, 80 MiB; the scores, 4 MiB; the floor. It
    /// is resident with the KV cache, in every mode.
    #[test]
    fn cuda_graphs_hold_the_largest_steps_working_set_beside_the_kv_cache() {
        let small = |i: &mut PlanInput| {
            i.model = ModelSource::Config(HfConfig {
                model_type: Some("qwen2".into()),
                hidden_size: 256,
                intermediate_size: 688,
                num_hidden_layers: 4,
                num_attention_heads: 4,
                num_key_value_heads: Some(2),
                head_dim: None,
                vocab_size: 384,
                tie_word_embeddings: true,
                attention_bias: None,
            });
            i.devices = 1;
            i.kv_tokens = Some(4096);
            i.cuda_graphs = Some(GraphCapture {
                rows: 256,
                keys: 512,
            });
        };
        let p = plan(small);
        assert_eq!(
            cuda_graph_bytes(&p),
            (80 << 20) + (4 << 20) + CUDA_GRAPH_FLOOR
        );
        let f32 = plan(|i| {
            small(i);
            i.kv_dtype = "f32".into();
        });
        assert_eq!(
            cuda_graph_bytes(&f32),
            (160 << 20) + (4 << 20) + CUDA_GRAPH_FLOOR
        );
        assert_eq!(cuda_graph_bytes(&plan(|i| i.devices = 1)), 0, "no graphs");
        for mode in ["staged", "sleep", "naive"] {
            let r = estimate(&plan(|i| {
                small(i);
                i.mode = mode.into();
            }))
            .unwrap();
            for ph in &r.phases {
                let (kv, graphs) = (ph.get(Component::KvCache), ph.get(Component::CudaGraphs));
                assert_eq!(kv > 0, graphs > 0, "{mode} {}", ph.name);
            }
            assert_eq!(
                r.phase("generation").unwrap().get(Component::CudaGraphs),
                cuda_graph_bytes(&p)
            );
        }
    }

    #[test]
    fn offload_switches_decide_what_idles_on_the_device() {
        let r = estimate(&plan(|i| i.offload.optimizer = false)).unwrap();
        let idle = r.phase("idle").unwrap();
        assert!(idle.get(Component::Optimizer) > 0);
        assert_eq!(idle.get(Component::TrainParams), 0);
        // The optimizer stays through generation: it is in every phase.
        assert!(r.phases.iter().all(|p| p.get(Component::Optimizer) > 0));
    }

    #[test]
    fn max_fraction_is_tight() {
        let p = plan(|i| i.mode = "sleep".into());
        let r = estimate(&p).unwrap();
        let f = r.max_mem_fraction.unwrap();
        let at = |f: f64| {
            let mut q = p.clone();
            q.kv_budget = KvBudget::Fraction(f);
            estimate(&q).unwrap()
        };
        assert!(at(f - 1e-6).fits);
        assert!(!at(f + 1e-3).fits);
    }

    #[test]
    fn explicit_kv_tokens_size_the_cache() {
        let r = estimate(&plan(|i| i.kv_tokens = Some(100_000))).unwrap();
        assert_eq!(r.kv_tokens, 100_000);
        assert_eq!(r.kv_cache_bytes, 100_000 * 57_344);
    }

    #[test]
    fn fraction_below_the_weights_is_an_error_naming_the_range() {
        let p = plan(|i| {
            i.mem_fraction = Some(0.1);
            i.device_memory_gib = 16.0;
        });
        let err = estimate(&p).unwrap_err().to_string();
        assert!(
            err.contains("mem_fraction") && err.contains("weights"),
            "{err}"
        );
    }

    /// Eager activations: a shared prompt runs once for its rows (fewer
    /// tokens through the layers, the same LM-head window), every lane
    /// but one adds a set of gradients, and checkpointing keeps one layer.
    #[test]
    fn shared_prompts_shrink_and_lanes_grow_eager_activations() {
        let eager_with = |rows: Option<u64>, lanes: Option<u64>, checkpointing: bool| {
            let p = plan(|i| {
                i.devices = 1;
                i.activation_model = "eager".into();
                i.activation_checkpointing = checkpointing;
                i.seq_len = Some(1024);
                i.response_len = Some(256);
                i.tokens_per_micro_batch = 8 * 1024;
                i.shared_prompt_rows = rows;
                i.train_lanes = lanes;
            });
            (
                component_sizes(&p),
                p.model.params() * p.param_dtype.bytes(),
            )
        };
        let eager = |rows, lanes| eager_with(rows, lanes, false);
        let (full, grads) = eager(None, None);
        let (shared, _) = eager(Some(8), None);
        assert!(shared.train_activations < full.train_activations / 2);
        assert!(shared.forward_activations < full.forward_activations);
        let (ckpt, _) = eager_with(Some(8), None, true);
        assert!(ckpt.train_activations < shared.train_activations);
        assert_eq!(ckpt.forward_activations, shared.forward_activations);
        // Qwen2.5-7B's 15 GB of bf16 gradients a lane outweigh the graph
        // of 8 × 1024 tokens: three lanes end the backward holding three
        // sets, each with the embedding's backward's second `vocab × h`
        // (untied embeddings: no partial of the LM head beside it).
        let (lanes, _) = eager(Some(8), Some(3));
        let embedding = 152_064 * 3584 * 2;
        assert!(shared.train_activations < 3 * grads);
        assert_eq!(lanes.train_activations, 3 * (grads + embedding));
        // With checkpointing the graph holds one lane's gradients already.
        let (ckpt_lanes, _) = eager_with(Some(8), Some(3), true);
        assert_eq!(
            ckpt_lanes.train_activations,
            (ckpt.train_activations + 2 * grads).max(3 * (grads + embedding))
        );
    }

    /// The end of the backward at Qwen2.5-0.5B's shape in bf16 (tied
    /// embeddings): every lane's gradients and two `vocab × h` beside them
    /// (the embedding's backward's second copy and the LM head's partial
    /// gradient), against the graph of issue 36's job (16 rows
    /// of 22 tokens, 16 of them the response, 4 rows a prompt) and of a
    /// larger one (64 rows of 38 tokens), whose graph is the larger.
    #[test]
    fn the_backwards_end_holds_every_lanes_gradients_and_the_tied_partials() {
        let q05 = |rows: u64, response: u64, lanes: u64| {
            let p = plan(|i| {
                i.model = ModelSource::Preset("qwen2.5-0.5b".into());
                i.devices = 1;
                i.optimizer = "adamw-mixed-fp32-grads".into();
                i.activation_model = "eager".into();
                i.activation_checkpointing = false;
                i.seq_len = Some(6 + response);
                i.response_len = Some(response);
                i.tokens_per_micro_batch = rows * (6 + response);
                i.logprob_tokens_per_micro_batch = Some(rows * (6 + response));
                i.shared_prompt_rows = Some(4);
                i.train_lanes = Some(lanes);
            });
            let m = &p.model;
            let end = m.params() * 2 + 2 * m.vocab * m.hidden * 2;
            (component_sizes(&p).train_activations, end)
        };
        let (two, end) = q05(16, 16, 2);
        assert_eq!(two, 2 * end);
        // 942 MiB of gradients and 519 MiB beside them a lane.
        assert_eq!(end >> 20, 942 + 519);
        let (one, _) = q05(16, 16, 1);
        assert_eq!(one, end);
        // Two rows run on two lanes at most.
        let (rows, _) = q05(2, 16, 4);
        assert_eq!(rows, 2 * end);
        // 64 rows of 32 response tokens: the graph (the head's window of
        // 2,048 tokens × 151,936 entries × 8 bytes alone is 2.3 GiB).
        let (big, _) = q05(64, 32, 2);
        assert!(big > 2 * end, "{big} vs {}", 2 * end);
    }

    /// A phase fits with its margin: a tenth of its activations on top of
    /// its total. A device between the peak and the peak with its margin
    /// does not fit; the margin is zero where the peak has no activations.
    #[test]
    fn the_margin_is_a_tenth_of_the_peaks_activations() {
        let p = plan(|i| {
            i.model = ModelSource::Preset("qwen2.5-0.5b".into());
            i.devices = 1;
            i.runtime_overhead_gib = 0.0;
            i.activation_model = "eager".into();
            i.seq_len = Some(22);
            i.response_len = Some(16);
            i.tokens_per_micro_batch = 16 * 22;
            i.kv_tokens = Some(2048);
        });
        let r = estimate(&p).unwrap();
        assert_eq!(r.peak_phase, "training");
        let act = r.phase("training").unwrap().get(Component::Activations);
        assert_eq!(
            r.margin_bytes,
            (act as f64 * ACTIVATION_MARGIN).ceil() as u64
        );
        let at = |device: u64| {
            let mut q = p.clone();
            q.device_bytes = device;
            estimate(&q).unwrap()
        };
        assert!(at(r.peak_bytes + r.margin_bytes).fits);
        assert!(!at(r.peak_bytes + r.margin_bytes - 1).fits);
        assert!(!at(r.peak_bytes).fits);
        // A KV cache of 2 M tokens (23 GiB) makes waking it the peak: no
        // activations there, and training with its margin stays below.
        let mut q = p.clone();
        q.kv_budget = KvBudget::Tokens(2_000_000);
        let kv = estimate(&q).unwrap();
        assert_eq!(kv.peak_phase, "wake_kv");
        assert_eq!(kv.margin_bytes, 0);
    }

    /// FSDP over 2 and 4 ranks: a rank's parameters, gradients and
    /// optimizer state are 1/2 and 1/4 of one device's, up to each unit's
    /// padding to a multiple of the ranks; it gathers the root unit and
    /// `fsdp_gathered_layers` layers; a whole reference stays whole and
    /// gathers nothing for its pass.
    #[test]
    fn fsdp_ranks_hold_their_share_of_the_training_state() {
        let sized = |n: u64, shard_reference: bool| {
            let p = plan(|i| {
                i.model = ModelSource::Preset("qwen2.5-0.5b".into());
                i.devices = n;
                i.fsdp = Some(n);
                i.fsdp_gathered_layers = 1;
                i.fsdp_shard_reference = shard_reference;
                i.reference = true;
                i.weight_sync = WeightSync::Gather;
            });
            let s = component_sizes(&p);
            (p, s)
        };
        let (p, one) = sized(1, false);
        let m = &p.model;
        assert_eq!(one.fsdp_gathered, 0, "one rank gathers nothing");
        assert_eq!(one.sync_buffer, one.train_params, "unsharded: `full`");
        for n in [2, 4] {
            let (p, s) = sized(n, false);
            for (whole, part) in [
                (one.train_params, s.train_params),
                (one.train_grads, s.train_grads),
                (one.optimizer, s.optimizer),
            ] {
                // At most n − 1 elements of padding in each of the units.
                let per_param = whole / m.params();
                let padding = (m.layers + 1) * (n - 1) * per_param;
                assert!(
                    whole <= part * n && part * n <= whole + padding,
                    "{n}: {part}"
                );
            }
            let gathered = (m.non_layer_params() + m.layer_params()) * 2;
            assert_eq!(s.fsdp_gathered, gathered);
            assert_eq!(s.ref_params, one.ref_params, "the reference stays whole");
            // The offloaded shards come back for the gather.
            assert_eq!(s.sync_buffer, gathered + s.train_params);
            let r = estimate(&p).unwrap();
            let phase = |name| r.phase(name).unwrap().get(Component::FsdpGathered);
            assert_eq!((phase("ref_logprob"), phase("old_logprob")), (0, gathered));
            let (_, sharded_reference) = sized(n, true);
            assert!(sharded_reference.ref_params * n < one.ref_params + n * one.ref_params / 100);
        }
    }

    #[test]
    fn checkpointing_and_tensor_parallel_shrink_training_activations() {
        let full = component_sizes(&plan(|i| i.activation_checkpointing = false));
        let ckpt = component_sizes(&plan(|_| ()));
        assert!(ckpt.train_activations * 10 < full.train_activations);
        let tp = component_sizes(&plan(|i| {
            i.tp = Some(4);
        }));
        assert_eq!(tp.train_logits * 4, ckpt.train_logits);
        assert!(ckpt.train_logits > 8 * GIB);
    }
}

//! Megatron-style tensor parallelism inside the engine (verl's `[rollout]
//! tensor_model_parallel_size = tg`): an engine built with a group of `tg`
//! ranks ([`TensorParallel`]) keeps only its slice of the model and of the
//! KV cache, and sums two partial products per layer over the group.
//!
//! - **Column-parallel** q/k/v (by heads, biases with them) and gate/up (by
//!   intermediate rows): each rank computes its heads' queries, keys and
//!   values and its rows of the MLP's hidden layer, with no communication.
//!   In the engine's fused buffers (vLLM's `QKVParallelLinear` layout) a
//!   rank's q/k/v buffer is `[q_r; k_r; v_r]`, its own heads of each, not
//!   a row range of the full fused matrix ([`Shard::slice_of`]).
//! - **Row-parallel** `o_proj` and `down_proj` (by input columns): each
//!   rank's product over its columns is a partial sum, summed over the
//!   group by one all-reduce each; `o_proj`'s bias (Llama's
//!   `attention_bias`) is added once, after the sum.
//! - **Replicated**: the embeddings, the norms (Qwen3's per-head q/k norms
//!   too) and the LM head. Sampling needs every logit of a row; with the
//!   head whole, every rank computes the same logits from the same
//!   all-reduced hidden states, with no collective after the last layer and
//!   no (rows × vocabulary) gather per step, which a vocabulary-parallel
//!   head needs (vLLM gathers the logits to one rank, samples there and
//!   broadcasts the tokens). The cost is memory: vocabulary × hidden per
//!   copy on every rank (Qwen2.5-7B in bfloat16: 1.09 GB each for the
//!   embedding and the untied head), against `1/tg` of it vocabulary-parallel.
//! - **KV heads**: `tg` must divide the attention heads and the
//!   intermediate size, and either divide the KV heads or be a multiple of
//!   them; then, as in vLLM, each KV head is held by `tg / kv_heads` ranks
//!   (every rank one KV head). Anything else is a [`Error::Config`] naming
//!   [`KEY`].
//! - **The same token on every rank.** The ranks' logits are the same (the
//!   all-reduce gives every rank the same sum), and the sampling's random
//!   numbers are a hash of the request's seed, the sample and the step, so
//!   every rank would draw the same token; the engine makes that certain
//!   rather than likely: rank 0's tokens and log-probabilities go to the
//!   group in one small all-reduce (the others add zeros), so the ranks'
//!   sequences, block tables and schedules cannot drift apart.
//!
//! Loading and `update_weights` take **full** tensors by Hugging Face name
//! and copy this rank's slice ([`Shard::take`]) into its buffers in place,
//! so a trainer's weight sync is the same call whatever `tg`.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Condvar, Mutex};

use colo_model::{Block, Linear, ModelConfig};
use serde::Serialize;
use tch::{Device, Kind, Tensor};

use crate::{Error, Request, Result};

/// The configuration key the group's size comes from; every error about
/// an impossible size names it.
pub const KEY: &str = "rollout.tensor_model_parallel_size";

/// A tensor-parallel group as the engine needs it: its size, this rank,
/// and a sum over the group. colo-rl adapts its torch.distributed
/// collective to it; [`LocalGroup`] joins ranks that are threads of one
/// process.
///
/// Every rank of a group must make the same calls in the same order with
/// tensors of the same shape and kind (the engine does, given the same
/// requests: `generate` checks that they are).
pub trait TensorParallel: Send {
    /// This rank, in `0..world_size()`.
    fn rank(&self) -> usize;
    /// Ranks in the group (`tg`).
    fn world_size(&self) -> usize;
    /// Replaces `t` (on the model's device, any kind the engine uses:
    /// the model's, Int64, Float64) with the sum of every rank's `t`, in
    /// place; every rank must get the same sum, bit for bit.
    fn all_reduce_sum(&mut self, t: &Tensor) -> Result<()>;
}

// ---------------------------------------------------------------- slicing

/// Which part of a full parameter one rank holds: all of it, or `len`
/// rows (dimension 0) or columns (dimension 1) from `start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slice {
    Whole,
    Rows { start: i64, len: i64 },
    Cols { start: i64, len: i64 },
}

/// One rank's share of a model: the full configuration, and the
/// configuration of the model over its slices (its attention and KV heads,
/// its intermediate rows), which colo-model builds and runs as any other.
#[derive(Debug, Clone, PartialEq)]
pub struct Shard {
    pub rank: usize,
    /// Ranks in the group (`tg`).
    pub size: usize,
    pub full: ModelConfig,
    pub local: ModelConfig,
}

impl Shard {
    /// Rank `rank`'s share of `cfg` in a group of `size`; an error naming
    /// [`KEY`] when the model does not split that way.
    pub fn new(cfg: &ModelConfig, rank: usize, size: usize) -> Result<Self> {
        let bad = |what: String| Err(Error::Config(format!("{KEY} = {size}: {what}")));
        if size == 0 {
            return bad("must be at least 1".into());
        }
        if rank >= size {
            return bad(format!("rank {rank} is outside a group of {size}"));
        }
        let (heads, kv, inter) = (cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size);
        if !heads.is_multiple_of(size) {
            return bad(format!(
                "the model's {heads} attention heads are not divisible by {size}"
            ));
        }
        let local_kv = if kv.is_multiple_of(size) {
            kv / size
        } else if size.is_multiple_of(kv) {
            1
        } else {
            return bad(format!(
                "the model's {kv} KV heads are not divisible by {size}, and {size} is not a \
                 multiple of {kv} (then each KV head would be held by {size} / {kv} ranks)"
            ));
        };
        if !inter.is_multiple_of(size) {
            return bad(format!(
                "the model's intermediate size {inter} is not divisible by {size}"
            ));
        }
        let local = ModelConfig {
            num_heads: heads / size,
            num_kv_heads: local_kv,
            intermediate_size: inter / size,
            ..cfg.clone()
        };
        Ok(Shard {
            rank,
            size,
            full: cfg.clone(),
            local,
        })
    }

    /// No parallelism: the whole model.
    pub fn whole(cfg: &ModelConfig) -> Self {
        Shard::new(cfg, 0, 1).expect("a group of one takes any model")
    }

    /// Ranks that hold each KV head: 1, or `tg / kv_heads` when the group
    /// has more ranks than the model has KV heads.
    pub fn kv_replicas(&self) -> usize {
        (self.size / self.full.num_kv_heads).max(1)
    }

    /// The first of this rank's KV heads.
    fn first_kv_head(&self) -> usize {
        match self.kv_replicas() {
            1 => self.rank * self.local.num_kv_heads,
            r => self.rank / r,
        }
    }

    /// This rank's part of parameter `name` (a Hugging Face name).
    pub fn slice_of(&self, name: &str) -> Slice {
        if self.size == 1 {
            return Slice::Whole;
        }
        let (l, d) = (&self.local, self.local.head_dim as i64);
        let q = (self.rank * l.num_heads) as i64 * d;
        let (q_len, kv) = (l.num_heads as i64 * d, self.first_kv_head() as i64 * d);
        let kv_len = l.num_kv_heads as i64 * d;
        let i_len = l.intermediate_size as i64;
        let i = self.rank as i64 * i_len;
        let part = name
            .strip_prefix("model.layers.")
            .and_then(|rest| rest.split_once('.'))
            .map_or("", |(_, part)| part);
        match part {
            "self_attn.q_proj.weight" | "self_attn.q_proj.bias" => Slice::Rows {
                start: q,
                len: q_len,
            },
            "self_attn.k_proj.weight"
            | "self_attn.k_proj.bias"
            | "self_attn.v_proj.weight"
            | "self_attn.v_proj.bias" => Slice::Rows {
                start: kv,
                len: kv_len,
            },
            "self_attn.o_proj.weight" => Slice::Cols {
                start: q,
                len: q_len,
            },
            "mlp.gate_proj.weight" | "mlp.up_proj.weight" => Slice::Rows {
                start: i,
                len: i_len,
            },
            "mlp.down_proj.weight" => Slice::Cols {
                start: i,
                len: i_len,
            },
            _ => Slice::Whole,
        }
    }

    /// This rank's part of the full tensor `full` of parameter `name`: a
    /// view (`narrow`), no copy.
    pub fn take(&self, name: &str, full: &Tensor) -> Result<Tensor> {
        Ok(match self.slice_of(name) {
            Slice::Whole => full.shallow_clone(),
            Slice::Rows { start, len } => full.f_narrow(0, start, len)?,
            Slice::Cols { start, len } => full.f_narrow(1, start, len)?,
        })
    }

    /// The shape of this rank's part of a parameter of shape `full`.
    pub fn local_shape(&self, name: &str, full: &[usize]) -> Vec<usize> {
        let mut shape = full.to_vec();
        match self.slice_of(name) {
            Slice::Whole => {}
            Slice::Rows { len, .. } => shape[0] = len as usize,
            Slice::Cols { len, .. } => shape[1] = len as usize,
        }
        shape
    }

    /// Bytes of this rank's parameters at `elem_bytes` an element (every
    /// rank holds the same): what `colo plan` needs per rollout rank.
    pub fn weight_bytes(&self, elem_bytes: usize) -> RankBytes {
        let mut out = RankBytes::default();
        for (name, shape) in self.full.parameter_shapes() {
            let bytes = self.local_shape(&name, &shape).iter().product::<usize>() * elem_bytes;
            match self.slice_of(&name) {
                Slice::Whole => out.replicated += bytes,
                _ => out.sharded += bytes,
            }
        }
        out
    }

    /// Bytes of one token's keys and values over all layers on this rank
    /// (its KV heads only).
    pub fn kv_bytes_per_token(&self, elem_bytes: usize) -> usize {
        2 * self.full.num_layers * self.local.num_kv_heads * self.local.head_dim * elem_bytes
    }
}

/// One rank's weight bytes: the parameters every rank holds whole
/// (embeddings, norms, the LM head, `o_proj`'s bias) and its slices of the
/// others.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RankBytes {
    pub replicated: usize,
    pub sharded: usize,
}

impl RankBytes {
    pub fn total(&self) -> usize {
        self.replicated + self.sharded
    }
}

// ---------------------------------------------------------------- the layer's collectives

/// A row-parallel projection: this rank's partial product `x · w_rᵀ`
/// summed over the group, then the bias (whole on every rank) once.
pub(crate) fn row_parallel(
    lin: &Linear,
    x: &Tensor,
    group: &mut dyn TensorParallel,
) -> Result<Tensor> {
    let y = colo_model::layers::linear(x, lin.weight(), None)?;
    group.all_reduce_sum(&y)?;
    Ok(match lin.bias() {
        Some(b) => y.f_add(b)?,
        None => y,
    })
}

/// [`Block::finish`] with a row-parallel `down_proj`: `h + Σ_ranks
/// mlp_r(norm(h))` (the MLP has no bias).
pub(crate) fn finish(layer: &Block, h: &Tensor, group: &mut dyn TensorParallel) -> Result<Tensor> {
    let mlp = layer
        .mlp
        .forward(&layer.post_attention_layernorm.forward(h)?)?;
    group.all_reduce_sum(&mlp)?;
    Ok(h.f_add(&mlp)?)
}

/// Every rank's `values` (the same count on each), in rank order: one
/// all-reduce of a (ranks, n) table in which each rank fills its own row.
pub(crate) fn gather_i64(
    group: &mut dyn TensorParallel,
    values: &[i64],
    device: Device,
) -> Result<Vec<Vec<i64>>> {
    let (ranks, n) = (group.world_size(), values.len());
    let table = Tensor::f_zeros([ranks as i64, n as i64], (Kind::Int64, device))?;
    let mut row = table.f_select(0, group.rank() as i64)?;
    row.f_copy_(&Tensor::from_slice(values).f_to_device(device)?)?;
    group.all_reduce_sum(&table)?;
    let flat = Vec::<i64>::try_from(&table.f_to_device(Device::Cpu)?.f_view([-1])?)?;
    Ok(flat
        .chunks(n.max(1))
        .map(<[i64]>::to_vec)
        .take(ranks)
        .collect())
}

/// Rank 0's sampled `(token, log-probability)` pairs on every rank: one
/// all-reduce of a (rows, 2) float64 table that only rank 0 fills (token
/// ids and float32 values are exact in float64, and so is a sum with
/// zeros).
pub(crate) fn broadcast_picks(
    group: &mut dyn TensorParallel,
    picks: Vec<(u32, f32)>,
    device: Device,
) -> Result<Vec<(u32, f32)>> {
    let mut flat = vec![0f64; 2 * picks.len()];
    if group.rank() == 0 {
        for (i, &(tok, lp)) in picks.iter().enumerate() {
            flat[2 * i] = f64::from(tok);
            flat[2 * i + 1] = f64::from(lp);
        }
    }
    let table = Tensor::from_slice(&flat).f_to_device(device)?;
    group.all_reduce_sum(&table)?;
    let flat = Vec::<f64>::try_from(&table.f_to_device(Device::Cpu)?)?;
    Ok(flat.chunks(2).map(|p| (p[0] as u32, p[1] as f32)).collect())
}

/// An error unless every rank was given the same `requests` (prompts and
/// sampling parameters, in order): one all-reduce of a digest. Ranks
/// given different requests would run different steps, whose collectives
/// do not match.
pub(crate) fn check_same_requests(
    group: &mut dyn TensorParallel,
    requests: &[Request],
    device: Device,
) -> Result<()> {
    let mut h = DefaultHasher::new();
    for r in requests {
        r.prompt.hash(&mut h);
        let p = &r.params;
        (p.n, p.max_new_tokens, p.top_k, p.seed).hash(&mut h);
        (p.temperature.to_bits(), p.top_p.to_bits()).hash(&mut h);
        (&p.stop_token_ids, &p.stop_strings).hash(&mut h);
    }
    let mine = [requests.len() as i64, h.finish() as i64];
    let all = gather_i64(group, &mine, device)?;
    match all.iter().position(|d| d != &all[0]) {
        None => Ok(()),
        Some(r) => Err(Error::TensorParallel(format!(
            "generate: rank {r} was given other requests than rank 0 ({} against {} requests, \
             digests {:#x} and {:#x}); every rank of a group must be given the same requests",
            all[r][0], all[0][0], all[r][1], all[0][1]
        ))),
    }
}

// ---------------------------------------------------------------- in-process group

/// A group whose ranks are threads of one process ([`LocalGroup::new`]
/// makes one handle per rank): the tests' group, and any single-process
/// caller's. Each collective hands every rank's tensor (a copy) to all
/// ranks; each sums them in rank order itself, the same operations on the
/// same data, so every rank gets the same bits. A rank that drops its
/// handle (its thread ended or failed) makes every other rank's pending
/// and later collectives an error naming it, instead of a wait forever.
pub struct LocalGroup {
    rank: usize,
    shared: Arc<Shared>,
}

struct Shared {
    size: usize,
    state: Mutex<Exchange>,
    turn: Condvar,
}

struct Exchange {
    /// This round's tensors so far, by rank.
    given: Vec<Option<Tensor>>,
    arrived: usize,
    /// Completed rounds.
    round: u64,
    /// The last completed round's tensors, in rank order.
    done: Vec<Tensor>,
    /// A rank that dropped its handle.
    left: Option<usize>,
}

impl LocalGroup {
    /// The `size` ranks' handles, in rank order.
    pub fn new(size: usize) -> Vec<LocalGroup> {
        let shared = Arc::new(Shared {
            size,
            state: Mutex::new(Exchange {
                given: (0..size).map(|_| None).collect(),
                arrived: 0,
                round: 0,
                done: Vec::new(),
                left: None,
            }),
            turn: Condvar::new(),
        });
        (0..size)
            .map(|rank| LocalGroup {
                rank,
                shared: shared.clone(),
            })
            .collect()
    }

    fn left(&self, op: &str, rank: usize) -> Error {
        Error::TensorParallel(format!(
            "{op} on rank {}: rank {rank} of the in-process group has left it",
            self.rank
        ))
    }

    /// Every rank's `t`, in rank order, once all ranks have given theirs.
    fn exchange(&self, t: &Tensor) -> Result<Vec<Tensor>> {
        let mut mine = t.f_empty_like()?;
        mine.f_copy_(t)?;
        let mut st = (self.shared.state.lock()).unwrap_or_else(|p| p.into_inner());
        if let Some(r) = st.left {
            return Err(self.left("all_reduce_sum", r));
        }
        let round = st.round;
        st.given[self.rank] = Some(mine);
        st.arrived += 1;
        if st.arrived == self.shared.size {
            st.done = st
                .given
                .iter_mut()
                .map(|g| g.take().expect("arrived"))
                .collect();
            st.arrived = 0;
            st.round += 1;
            self.shared.turn.notify_all();
        } else {
            while st.round == round && st.left.is_none() {
                st = self.shared.turn.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            if st.round == round {
                let r = st.left.expect("woken by a rank leaving");
                return Err(self.left("all_reduce_sum", r));
            }
        }
        // The next round cannot complete before this rank joins it, so
        // `done` is still this round's.
        Ok(st.done.iter().map(Tensor::shallow_clone).collect())
    }
}

impl TensorParallel for LocalGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.shared.size
    }

    fn all_reduce_sum(&mut self, t: &Tensor) -> Result<()> {
        let parts = self.exchange(t)?;
        if let Some((r, p)) =
            (parts.iter().enumerate()).find(|(_, p)| p.size() != t.size() || p.kind() != t.kind())
        {
            return Err(Error::TensorParallel(format!(
                "all_reduce_sum: rank {r} gave {:?} {:?}, rank {} {:?} {:?}: the ranks are not \
                 running the same step (were they given the same requests?)",
                p.size(),
                p.kind(),
                self.rank,
                t.size(),
                t.kind()
            )));
        }
        let mut sum = parts[0].shallow_clone();
        for p in &parts[1..] {
            sum = sum.f_add(p)?;
        }
        t.shallow_clone().f_copy_(&sum)?;
        Ok(())
    }
}

impl Drop for LocalGroup {
    fn drop(&mut self) {
        let mut st = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
        st.left.get_or_insert(self.rank);
        self.shared.turn.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(heads: usize, kv: usize, inter: usize) -> ModelConfig {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/tiny-llama");
        let base = ModelConfig::from_file(&dir.join("config.json")).unwrap();
        ModelConfig {
            num_heads: heads,
            num_kv_heads: kv,
            intermediate_size: inter,
            ..base
        }
    }

    #[test]
    fn impossible_sizes_are_errors_naming_the_key() {
        for (c, tg, what) in [
            (cfg(6, 2, 256), 4, "6 attention heads"),
            (cfg(8, 3, 256), 2, "3 KV heads"),
            (cfg(8, 4, 100), 8, "intermediate size 100"),
            (cfg(8, 4, 256), 0, "at least 1"),
        ] {
            let e = Shard::new(&c, 0, tg).unwrap_err().to_string();
            assert!(e.contains(KEY) && e.contains(what), "{e}");
        }
    }

    /// Rank r's heads, KV heads (replicated past the model's count) and
    /// intermediate rows.
    #[test]
    fn slices_follow_the_heads() {
        let c = cfg(8, 2, 256);
        let d = c.head_dim as i64;
        let q = "model.layers.1.self_attn.q_proj.weight";
        let k = "model.layers.1.self_attn.k_proj.bias";
        let o = "model.layers.0.self_attn.o_proj.weight";
        let down = "model.layers.2.mlp.down_proj.weight";
        let s = Shard::new(&c, 1, 2).unwrap();
        assert_eq!(
            s.slice_of(q),
            Slice::Rows {
                start: 4 * d,
                len: 4 * d
            }
        );
        assert_eq!(s.slice_of(k), Slice::Rows { start: d, len: d });
        assert_eq!(
            s.slice_of(o),
            Slice::Cols {
                start: 4 * d,
                len: 4 * d
            }
        );
        assert_eq!(
            s.slice_of(down),
            Slice::Cols {
                start: 128,
                len: 128
            }
        );
        for name in [
            "model.embed_tokens.weight",
            "lm_head.weight",
            "model.layers.0.input_layernorm.weight",
            "model.layers.0.self_attn.o_proj.bias",
        ] {
            assert_eq!(s.slice_of(name), Slice::Whole, "{name}");
        }
        // Four ranks over two KV heads: ranks 0, 1 hold head 0; 2, 3 head 1.
        let heads: Vec<_> = (0..4)
            .map(|r| Shard::new(&c, r, 4).unwrap().slice_of(k))
            .collect();
        assert_eq!(
            heads,
            [0, 0, 1, 1].map(|h| Slice::Rows {
                start: h * d,
                len: d
            })
        );
        assert_eq!(Shard::new(&c, 3, 4).unwrap().kv_replicas(), 2);
    }

    #[test]
    fn the_local_group_sums_in_every_rank_and_reports_a_rank_that_left() {
        let groups = LocalGroup::new(3);
        let sums: Vec<Vec<f32>> = std::thread::scope(|s| {
            let handles: Vec<_> = groups
                .into_iter()
                .map(|mut g| {
                    s.spawn(move || {
                        let t = Tensor::from_slice(&[g.rank() as f32, 1.0]);
                        g.all_reduce_sum(&t).unwrap();
                        let again = Tensor::from_slice(&[2.0f32, 0.5]);
                        g.all_reduce_sum(&again).unwrap();
                        let (a, b) = (
                            Vec::<f32>::try_from(&t).unwrap(),
                            Vec::<f32>::try_from(&again).unwrap(),
                        );
                        [a, b].concat()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for s in &sums {
            assert_eq!(s, &[3.0, 3.0, 6.0, 1.5]);
        }
        let mut groups = LocalGroup::new(2);
        drop(groups.pop());
        let e = groups[0]
            .all_reduce_sum(&Tensor::from_slice(&[1f32]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("rank 1") && e.contains("left"), "{e}");
    }
}

//! CUDA graphs of the decode step, vLLM's and SGLang's answer to a decode
//! step bound by kernel launches: a small model's step is a few hundred
//! kernels of a few microseconds each, and launching them one by one costs
//! more than running them (H200, 2026-11-26, BENCHMARKS.md: 1.9 ms a step,
//! nearly all of it launching). A captured graph launches them all with one
//! call.
//!
//! How, on libtorch and colo-mem:
//! - **Shapes by bucket.** A graph replays fixed shapes, so a step of
//!   `rows` rows whose longest sequence has `keys` positions runs in the
//!   graph of ([`bucket`]) rows and keys each rounded up to a power of two.
//!   Padding rows write their keys and values to a slot no sequence owns
//!   (one extra block of the cache) and attend to it alone; padding keys are
//!   masked. Steps beyond [`MAX_GRAPH_ROWS`] or [`MAX_GRAPH_KEYS`] run
//!   eagerly. A graph is captured the first time its bucket is needed
//!   (after one eager warm-up of the same step on the capture stream, whose
//!   result the replay then recomputes), or up front for every bucket up to
//!   a shape with `Engine::capture_cuda_graphs`, as vLLM and SGLang capture
//!   theirs when they start.
//! - **Fixed inputs.** Every graph reads its inputs from one Int64 buffer
//!   (tokens, positions, write slots, lengths, then every row's block
//!   table) and writes the normalised hidden states to one output buffer;
//!   a step copies its packed inputs in with one transfer. The slots each
//!   row gathers and the attention mask are computed inside the graph from
//!   the tables and lengths (a table is 1/block_size of the slots). The
//!   LM head runs eagerly after the replay, so that no graph holds a
//!   (rows, vocabulary) logits buffer.
//! - **Memory in a tag.** The buffers and everything the graphs' kernels
//!   allocate live in tag `cuda_graph` (captured inside a region on it;
//!   its libtorch cache is held, because the graphs address blocks that
//!   are free between replays). The engine pauses and resumes that tag with
//!   `kv_cache`, so the graphs' memory goes back to the device with the KV
//!   cache and comes back at the same addresses, and the graphs stay valid
//!   — torch_memory_saver's "cuda_graph" tag, which SGLang pauses the same
//!   way. The weights and the KV cache never move, so weight updates need
//!   no recapture either.

use std::collections::HashMap;
use std::sync::Arc;

use colo_mem::graph::{self, CudaGraph};
use colo_mem::tags::CUDA_GRAPH;
use colo_mem::{Policy, Pool};
use colo_model::Model;
use tch::{Device, Kind, Tensor};

use crate::attention::{PagedBatch, Scratch};
use crate::block_table::BlockId;
use crate::forward::{decode_hidden, DecodeInputs, DecodeRow};
use crate::kv_cache::{KvLayout, PagedKv};
use crate::weights::pooled;
use crate::{Error, Result};

/// Most rows a captured step has (vLLM captures batch sizes up to 512).
pub const MAX_GRAPH_ROWS: usize = 512;
/// Most positions of a row's sequence a captured step attends to (vLLM's
/// `max_seq_len_to_capture`).
pub const MAX_GRAPH_KEYS: usize = 8192;
/// The smallest key bucket: shorter steps share one graph.
const MIN_GRAPH_KEYS: usize = 64;

/// The (rows, keys) graph a step of `rows` rows whose longest sequence has
/// `keys` positions runs in, or `None` (run it eagerly) beyond the caps.
pub(crate) fn bucket(rows: usize, keys: usize, caps: (usize, usize)) -> Option<(usize, usize)> {
    let shape = (
        rows.max(1).checked_next_power_of_two()?,
        keys.max(MIN_GRAPH_KEYS).checked_next_power_of_two()?,
    );
    (shape.0 <= caps.0 && shape.1 <= caps.1).then_some(shape)
}

/// The largest graph an engine captures for steps of up to `rows` rows
/// and `keys` positions: each rounded up to a power of two within the caps.
/// The graphs' memory is that step's working set (colo-plan models it).
pub fn largest_graph(rows: usize, keys: usize) -> (usize, usize) {
    (
        rows.clamp(1, MAX_GRAPH_ROWS).next_power_of_two(),
        keys.clamp(MIN_GRAPH_KEYS, MAX_GRAPH_KEYS)
            .next_power_of_two(),
    )
}

/// Where each input of a (rows, keys) graph sits in the input buffer.
struct Offsets {
    tokens: i64,
    positions: i64,
    slots: i64,
    lens: i64,
    tables: i64,
    /// Blocks of a row's table: enough for `keys` positions.
    blocks: i64,
    end: i64,
}

impl Offsets {
    fn new((rows, keys): (usize, usize), block_size: usize) -> Self {
        let r = rows as i64;
        let blocks = keys.div_ceil(block_size) as i64;
        Offsets {
            tokens: 0,
            positions: r,
            slots: 2 * r,
            lens: 3 * r,
            tables: 4 * r,
            blocks,
            end: 4 * r + r * blocks,
        }
    }
}

/// A step's inputs packed as the graph of `shape` reads them: tokens,
/// positions, write slots and lengths of every row, then each row's block
/// table (padded with `trash`, a block no sequence owns). Padding rows have
/// token 0 at position 0, write to the trash block's first slot and see
/// only it. The block tables, not every key's slot, go to the device: the
/// graph computes the slots (a row's table is `keys / block_size` entries).
pub(crate) fn pack(
    layout: &KvLayout,
    rows: &[DecodeRow<'_>],
    shape: (usize, usize),
    trash: BlockId,
) -> Vec<i64> {
    let at = Offsets::new(shape, layout.block_size);
    let trash_slot = trash as i64 * layout.block_size as i64;
    let mut v = vec![0i64; at.end as usize];
    let (slots, lens, tables) = (at.slots as usize, at.lens as usize, at.tables as usize);
    v[slots..lens].fill(trash_slot);
    v[lens..tables].fill(1);
    v[tables..].fill(trash as i64);
    for (i, row) in rows.iter().enumerate().take(shape.0) {
        v[at.tokens as usize + i] = row.token as i64;
        v[at.positions as usize + i] = row.pos as i64;
        v[slots + i] = layout.slot(row.blocks, row.pos);
        v[lens + i] = row.pos as i64 + 1;
        let t = tables + i * at.blocks as usize;
        let used = row.pos / layout.block_size + 1;
        for (dst, &b) in v[t..t + used].iter_mut().zip(row.blocks) {
            *dst = b as i64;
        }
    }
    v
}

/// The engine's captured decode steps and their fixed buffers.
pub(crate) struct DecodeGraphs {
    /// The pool whose `cuda_graph` cache the graphs hold.
    pool: Arc<Pool>,
    device: i32,
    /// Largest rows and keys captured.
    caps: (usize, usize),
    /// The block no sequence owns (the cache's extra one): padding.
    trash: BlockId,
    block_size: usize,
    /// (`Offsets::end` of the largest bucket,) Int64: every graph's inputs.
    inputs: Tensor,
    /// (largest rows, 1, hidden) in the model's kind: every graph's output.
    hidden: Tensor,
    graphs: HashMap<(usize, usize), CudaGraph>,
}

impl DecodeGraphs {
    /// Buffers for steps of up to `max_rows` rows and `max_keys` positions
    /// (each capped), in tag `cuda_graph` of `pool`; `trash` is a block of
    /// `layout`'s cache that no sequence owns.
    pub(crate) fn new(
        pool: &Arc<Pool>,
        model: &Model,
        layout: &KvLayout,
        max_rows: usize,
        max_keys: usize,
        trash: BlockId,
    ) -> Result<Self> {
        let Device::Cuda(index) = model.device() else {
            return Err(Error::Unsupported(
                "CUDA graphs need a model on a CUDA device".into(),
            ));
        };
        let caps = largest_graph(max_rows, max_keys);
        pool.set_policy(CUDA_GRAPH, Policy::Discard)?;
        let dev = model.device();
        let len = Offsets::new(caps, layout.block_size).end;
        let hidden = model.config().hidden_size as i64;
        let inputs = pooled(pool, CUDA_GRAPH, || {
            Tensor::f_zeros([len], (Kind::Int64, dev))
        })?;
        let hidden = pooled(pool, CUDA_GRAPH, || {
            Tensor::f_zeros([caps.0 as i64, 1, hidden], (model.dtype(), dev))
        })?;
        // Given up in `drop`.
        pool.hold_cuda_cache(CUDA_GRAPH);
        Ok(DecodeGraphs {
            pool: Arc::clone(pool),
            device: index as i32,
            caps,
            trash,
            block_size: layout.block_size,
            inputs,
            hidden,
            graphs: HashMap::new(),
        })
    }

    /// Graphs captured so far.
    pub(crate) fn captured(&self) -> usize {
        self.graphs.len()
    }

    /// One decode step of `rows` by replaying its bucket's graph (captured
    /// first if new); the logits (rows, vocab), or `None` when the step is
    /// beyond the graphs' caps and must run eagerly.
    pub(crate) fn decode(
        &mut self,
        model: &Model,
        kv: &PagedKv,
        rows: &[DecodeRow<'_>],
    ) -> Result<Option<Tensor>> {
        let keys = rows.iter().map(|r| r.pos + 1).max().unwrap_or(1);
        let Some(shape) = bucket(rows.len(), keys, self.caps) else {
            return Ok(None);
        };
        let _no_grad = tch::no_grad_guard();
        let host = pack(&kv.layout, rows, shape, self.trash);
        self.fill(&host)?;
        if !self.graphs.contains_key(&shape) {
            let captured = self.capture(model, kv, shape)?;
            self.graphs.insert(shape, captured);
        }
        self.graphs[&shape].replay()?;
        let x = self.hidden.f_narrow(0, 0, rows.len() as i64)?;
        Ok(Some(model.lm_head(&x)?.f_squeeze_dim(1)?))
    }

    /// Captures, largest first, the graph of every bucket up to `rows` rows
    /// and `keys` positions (within the caps) not captured yet, as vLLM and
    /// SGLang do when they start; returns how many were captured. Each
    /// capture's warm-up runs a step of padding rows only (they write the
    /// trash block).
    pub(crate) fn capture_up_to(
        &mut self,
        model: &Model,
        kv: &PagedKv,
        rows: usize,
        keys: usize,
    ) -> Result<usize> {
        // The caps are buckets themselves, so a shape within them has one.
        let (rows, keys) = bucket(rows.min(self.caps.0), keys.min(self.caps.1), self.caps)
            .expect("a shape within the caps has a bucket");
        let powers = |from: usize, top: usize| {
            std::iter::successors(Some(top), move |&n| (n / 2 >= from).then_some(n / 2))
        };
        let _no_grad = tch::no_grad_guard();
        let mut captured = 0;
        for r in powers(1, rows) {
            for k in powers(MIN_GRAPH_KEYS, keys) {
                if self.graphs.contains_key(&(r, k)) {
                    continue;
                }
                self.fill(&pack(&kv.layout, &[], (r, k), self.trash))?;
                let g = self.capture(model, kv, (r, k))?;
                self.graphs.insert((r, k), g);
                captured += 1;
            }
        }
        Ok(captured)
    }

    /// Copies packed inputs into the front of the input buffer.
    fn fill(&self, host: &[i64]) -> Result<()> {
        self.inputs
            .f_narrow(0, 0, host.len() as i64)?
            .f_copy_(&Tensor::from_slice(host))?;
        Ok(())
    }

    /// Captures the graph of `shape`, whose inputs are in the buffer
    /// already: one eager run of the step on the capture stream, then the
    /// capture, both inside a region on `cuda_graph`.
    fn capture(&self, model: &Model, kv: &PagedKv, shape: (usize, usize)) -> Result<CudaGraph> {
        let body = || self.step(model, kv, shape);
        let region = self.pool.region_with_threshold(CUDA_GRAPH, 1)?;
        let captured = graph::on_side_stream(self.device, body)
            .map_err(Error::from)
            .and_then(|warm| warm)
            .and_then(|()| Ok(CudaGraph::capture(self.device, body)?))
            .and_then(|(g, run)| run.map(|()| g));
        region.finish()?;
        captured
    }

    /// The device work of one step of `shape`: inputs from the buffer,
    /// normalised hidden states into the output buffer.
    fn step(&self, model: &Model, kv: &PagedKv, shape: (usize, usize)) -> Result<()> {
        let (r, k) = (shape.0 as i64, shape.1 as i64);
        let at = Offsets::new(shape, self.block_size);
        let input = |from: i64, len: i64| self.inputs.f_narrow(0, from, len);
        let (dev, kind) = (model.device(), model.dtype());
        // Key j of row i: slot tables[i][j / block_size] · block_size + j %
        // block_size.
        let bs = self.block_size as i64;
        let key = Tensor::f_arange(k, (Kind::Int64, dev))?.f_unsqueeze(0)?; // (1, k)
        let tables = input(at.tables, r * at.blocks)?.f_view([r, at.blocks])?;
        let slots = tables
            .f_gather(
                1,
                &key.f_floor_divide_scalar(bs)?.f_expand([r, k], false)?,
                false,
            )?
            .f_mul_scalar(bs)?
            .f_add(&key.f_remainder(bs)?)?
            .f_view([r * k])?;
        let lens = input(at.lens, r)?;
        let padding = key
            .f_ge_tensor(&lens.f_unsqueeze(1)?)?
            .f_view([1, r, 1, k])?;
        let mask = Tensor::f_zeros([1, r, 1, k], (kind, dev))?
            .f_masked_fill(&padding, colo_model::mask::masked_value(kind))?;
        let paged = PagedBatch::from_device(slots, mask, r, k);
        let step = DecodeInputs {
            tokens: &input(at.tokens, r)?.f_view([r, 1])?,
            positions: &input(at.positions, r)?.f_view([r, 1])?,
            slots: &input(at.slots, r)?,
            paged: &paged,
        };
        let x = decode_hidden(model, &mut kv.share(), &step, &mut Scratch::default(), None)?;
        self.hidden.f_narrow(0, 0, r)?.f_copy_(&x)?;
        Ok(())
    }
}

impl Drop for DecodeGraphs {
    /// The graphs and their buffers go, and with them this engine's hold on
    /// the `cuda_graph` cache: the next pause or `empty_cache` gives its
    /// blocks back to the device (the RL loop's `restart` colocation drops
    /// an engine and empties the cache every step).
    fn drop(&mut self) {
        self.graphs.clear();
        self.inputs = Tensor::new();
        self.hidden = Tensor::new();
        self.pool.release_cuda_cache(CUDA_GRAPH);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_round_up_to_powers_of_two_within_the_caps() {
        let caps = (256, 1024);
        assert_eq!(bucket(1, 1, caps), Some((1, 64)));
        assert_eq!(bucket(3, 65, caps), Some((4, 128)));
        assert_eq!(bucket(256, 1024, caps), Some((256, 1024)));
        assert_eq!(bucket(257, 10, caps), None);
        assert_eq!(bucket(2, 1025, caps), None);
    }

    /// Real rows carry their token, position, write slot, length and
    /// block table; padding rows and blocks point at the trash block.
    #[test]
    fn packing_lays_out_rows_and_padding() {
        let layout = KvLayout {
            num_layers: 1,
            num_blocks: 5,
            block_size: 2,
            kv_heads: 1,
            head_dim: 1,
            elem_bytes: 4,
        };
        let trash: BlockId = 4;
        let (a, b): (&[BlockId], &[BlockId]) = (&[3, 1], &[2]);
        let rows = [
            DecodeRow {
                token: 7,
                pos: 2,
                blocks: a,
            },
            DecodeRow {
                token: 9,
                pos: 0,
                blocks: b,
            },
        ];
        // 4 rows, 6 keys: tables of 3 blocks.
        let v = pack(&layout, &rows, (4, 6), trash);
        assert_eq!(v.len(), 4 * 4 + 4 * 3);
        assert_eq!(&v[0..4], &[7, 9, 0, 0]); // tokens
        assert_eq!(&v[4..8], &[2, 0, 0, 0]); // positions
        assert_eq!(&v[8..12], &[2, 4, 8, 8]); // write slots (trash: 4 · 2)
        assert_eq!(&v[12..16], &[3, 1, 1, 1]); // lengths
        assert_eq!(&v[16..19], &[3, 1, 4]); // row 0: blocks 3, 1
        assert_eq!(&v[19..22], &[2, 4, 4]); // row 1: block 2
        assert!(v[22..].iter().all(|&s| s == 4)); // padding rows
    }
}

//! The engine: requests in, completions out, over the paged cache; and the
//! memory operations of the colocated contract (release, resume, weight
//! update).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

use colo_mem::tags::{CUDA_GRAPH, KV_CACHE, WEIGHTS};
use colo_mem::{Policy, Pool, TagState};
use colo_model::{Model, ModelConfig, Tokenizer, Weights};
use serde::Serialize;
use tch::{Device, Kind, Tensor};

use crate::attention::Scratch;
use crate::block_table::{blocks_for, BlockId};
use crate::config::{EngineConfig, KvBudget, ValidConfig};
use crate::forward::{self, DecodeRow, PrefillRow};
use crate::graphs::DecodeGraphs;
use crate::kv_cache::{KvLayout, PagedKv};
use crate::request::{Completion, FinishReason, Request, RequestOutput, SamplingParams};
use crate::sampling::{self, uniform, Draw};
use crate::scheduler::{Scheduler, Sequence, Waiting};
use crate::tensor_parallel::{self as tp, Shard, TensorParallel};
use crate::weights::PooledWeights;
use crate::{Error, Result};

/// Counters and KV occupancy, for tests, benchmarks and the RL loop's
/// metrics.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EngineStats {
    pub block_size: usize,
    pub kv_blocks_total: usize,
    pub kv_blocks_used: usize,
    /// Most blocks in use at once since the engine was made or
    /// `reset_stats`.
    pub kv_blocks_peak: usize,
    /// Bytes of one block: this rank's KV heads only under tensor
    /// parallelism.
    pub kv_bytes_per_block: usize,
    /// Bytes of the KV buffers (allocated once), on this rank.
    pub kv_bytes: usize,
    /// Bytes of this rank's weights in the `weights` tag.
    pub weights_bytes: usize,
    /// Of `weights_bytes`, the parameters every rank holds whole
    /// (embeddings, norms, LM head); the rest is this rank's slice. All of
    /// them without tensor parallelism.
    pub weights_replicated_bytes: usize,
    /// Ranks of the tensor-parallel group (`tg`; 1 without one) and this
    /// engine's rank in it.
    pub tensor_parallel_size: usize,
    pub tensor_parallel_rank: usize,
    /// Prefill forwards and the tokens they ran (a request's prompt counts
    /// once, whatever its `n`; recomputed sequences count again).
    pub prefills: u64,
    pub prefill_tokens: u64,
    pub decode_steps: u64,
    pub generated_tokens: u64,
    pub preemptions: u64,
    pub cow_copies: u64,
}

impl EngineStats {
    /// Peak KV bytes actually holding sequences.
    pub fn kv_peak_bytes(&self) -> usize {
        self.kv_blocks_peak * self.kv_bytes_per_block
    }
}

#[derive(Debug, Default, Clone)]
pub(crate) struct Counters {
    pub prefills: u64,
    pub prefill_tokens: u64,
    pub decode_steps: u64,
    pub generated_tokens: u64,
}

/// Most padded tokens (rows × longest) of one prefill forward, as
/// SGLang's default `chunked_prefill_size`; a longer prompt runs alone.
const PREFILL_TOKENS: usize = 8192;

/// Weight bytes above which a CPU decode step is one pass whose matrix
/// products split their columns over the engine's lanes
/// (`colo_model::lanes::run_wide`) rather than lanes of rows: twice the 32
/// MiB L3 cache of the machines colo is measured on. Below it a lane's
/// read of a weight another lane read comes from the cache; above it each
/// lane streams every weight from memory: a Qwen2.5-0.5B step's products
/// (988 MB) for 16 rows took 35.8 ms as two lanes of 8 rows against 31.2
/// ms as two lanes of half the columns (colo-kernels' example
/// `skinny_linear`, AVX-512 EPYC, nothing else running).
pub const WIDE_DECODE_BYTES: usize = 64 << 20;

/// Concatenates the lanes' logits (rows, vocab) in row order.
fn cat(parts: Vec<Result<Tensor>>) -> Result<Tensor> {
    let parts = parts.into_iter().collect::<Result<Vec<_>>>()?;
    Ok(match parts.len() {
        1 => parts.into_iter().next().expect("one"),
        _ => Tensor::f_cat(&parts, 0)?,
    })
}

/// A request being served.
struct ReqState {
    params: SamplingParams,
    prompt_len: usize,
    done: Vec<Option<Completion>>,
    remaining: usize,
}

/// colo's rollout engine. See the crate docs.
pub struct Engine {
    model: Model,
    cfg: ValidConfig,
    pool: Arc<Pool>,
    tokenizer: Option<Tokenizer>,
    weights: PooledWeights,
    kv: PagedKv,
    /// Gather buffers of the decode step's attention, one per lane.
    scratch: Vec<Scratch>,
    /// Threads a prefill or decode step splits its rows over (see
    /// `colo_model::lanes`); 1 off the CPU.
    lanes: usize,
    /// Decode as one pass on `lanes` intra-op threads instead of lanes of
    /// rows: for weights larger than [`WIDE_DECODE_BYTES`].
    wide_decode: bool,
    /// Captured decode steps, on CUDA unless `enforce_eager` (or tensor
    /// parallel).
    graphs: Option<DecodeGraphs>,
    /// The tensor-parallel group; `None`: the whole model here.
    group: Option<Box<dyn TensorParallel>>,
    sched: Scheduler,
    reqs: BTreeMap<u64, ReqState>,
    next_id: u64,
    counters: Counters,
}

impl Engine {
    /// Copies `weights` into tag `weights` of `pool`, sizes and allocates
    /// the KV cache in tag `kv_cache`, and sets both tags' policies
    /// (`weights`: `config.weights_policy`; `kv_cache`: discard).
    pub fn new(
        model_cfg: &ModelConfig,
        weights: &Weights,
        tokenizer: Option<Tokenizer>,
        pool: Arc<Pool>,
        config: &EngineConfig,
    ) -> Result<Self> {
        Engine::build(model_cfg, weights, tokenizer, pool, config, None)
    }

    /// [`Engine::new`] as one rank of a tensor-parallel group of
    /// `group.world_size()` ranks ([`crate::tensor_parallel`]): `weights`
    /// are the full model's; the engine keeps this rank's slice of them
    /// and of the KV cache (its KV heads), and each layer sums its two
    /// row-parallel products over the group. Every rank must be built
    /// with the same model, configuration and requests; the ranks agree
    /// on the KV blocks (the fewest any rank's budget gives). An error
    /// naming `rollout.tensor_model_parallel_size` when the model does
    /// not split `tg` ways.
    pub fn new_parallel(
        model_cfg: &ModelConfig,
        weights: &Weights,
        tokenizer: Option<Tokenizer>,
        pool: Arc<Pool>,
        config: &EngineConfig,
        group: Box<dyn TensorParallel>,
    ) -> Result<Self> {
        Engine::build(model_cfg, weights, tokenizer, pool, config, Some(group))
    }

    fn build(
        model_cfg: &ModelConfig,
        weights: &Weights,
        tokenizer: Option<Tokenizer>,
        pool: Arc<Pool>,
        config: &EngineConfig,
        mut group: Option<Box<dyn TensorParallel>>,
    ) -> Result<Self> {
        let cfg = config.validate()?;
        let shard = match &group {
            Some(g) => Shard::new(model_cfg, g.rank(), g.world_size())?,
            None => Shard::whole(model_cfg),
        };
        pool.set_policy(WEIGHTS, cfg.weights_policy)?;
        pool.set_policy(KV_CACHE, Policy::Discard)?;
        let (model, weights) = PooledWeights::load(&pool, shard, weights)?;
        let local = model.config(); // this rank's heads
        let mut layout = KvLayout {
            num_layers: local.num_layers,
            num_blocks: 0,
            block_size: cfg.block_size,
            kv_heads: local.num_kv_heads,
            head_dim: local.head_dim,
            elem_bytes: model.dtype().elt_size_in_bytes(),
        };
        layout.num_blocks = match cfg.budget {
            KvBudget::Tokens(t) => blocks_for(t, cfg.block_size),
            KvBudget::Fraction(f) => {
                if pool.capacity() == u64::MAX {
                    return Err(Error::Config(
                        "mem_fraction needs a pool with a device capacity; set max_kv_tokens instead"
                            .into(),
                    ));
                }
                // The buffer may round up to the allocation granularity.
                let slack = pool.granularity() as u64;
                let free = pool
                    .capacity()
                    .saturating_sub(pool.stats().resident_bytes + slack);
                let by_fraction = (f * free as f64) as usize / layout.bytes_per_block();
                cfg.cap_blocks()
                    .map_or(by_fraction, |cap| by_fraction.min(cap))
            }
        };
        // The ranks' schedules must be the same: the fewest blocks any
        // rank's budget gives.
        if let Some(g) = group.as_deref_mut() {
            let blocks = tp::gather_i64(g, &[layout.num_blocks as i64], model.device())?;
            layout.num_blocks = blocks.iter().map(|b| b[0] as usize).min().unwrap_or(0);
        }
        if layout.num_blocks == 0 || layout.num_blocks > BlockId::MAX as usize {
            return Err(Error::Config(format!(
                "the KV budget gives {} blocks of {} bytes ({} tokens each); need 1 to {}",
                layout.num_blocks,
                layout.bytes_per_block(),
                cfg.block_size,
                BlockId::MAX
            )));
        }
        let blocks = layout.num_blocks;
        // A group's collectives are not known to be capturable: a
        // tensor-parallel engine decodes eagerly.
        let graphed = model.device().is_cuda()
            && !cfg.enforce_eager
            && group.is_none()
            && colo_mem::graph::available();
        // CUDA graphs' padding rows write to one block no sequence owns.
        layout.num_blocks += usize::from(graphed);
        let kv = PagedKv::new(&pool, layout, model.dtype(), model.device())?;
        let graphs = graphed
            .then(|| {
                let max_keys = model_cfg.max_position_embeddings;
                let trash = blocks as BlockId; // the extra block
                DecodeGraphs::new(&pool, &model, &layout, cfg.max_batch, max_keys, trash)
            })
            .transpose()?;
        let lanes = colo_model::lanes::count(model.device(), cfg.cpu_threads);
        let wide_decode = lanes > 1 && weights.bytes > WIDE_DECODE_BYTES;
        Ok(Engine {
            model,
            sched: Scheduler::new(blocks, cfg.block_size, cfg.max_batch),
            graphs,
            group,
            cfg,
            pool,
            tokenizer,
            weights,
            kv,
            scratch: (0..lanes).map(|_| Scratch::default()).collect(),
            lanes,
            wide_decode,
            reqs: BTreeMap::new(),
            next_id: 0,
            counters: Counters::default(),
        })
    }

    /// Loads a Hugging Face checkpoint directory in float32 on the CPU, and
    /// its tokenizer if it has one.
    pub fn from_dir(dir: &Path, pool: Arc<Pool>, config: &EngineConfig) -> Result<Self> {
        Engine::from_dir_on(dir, Kind::Float, Device::Cpu, pool, config)
    }

    /// [`Engine::from_dir`] in `kind` (e.g. `Kind::BFloat16`) on `device`:
    /// the engine runs the model, its KV cache and its sampling there.
    pub fn from_dir_on(
        dir: &Path,
        kind: Kind,
        device: Device,
        pool: Arc<Pool>,
        config: &EngineConfig,
    ) -> Result<Self> {
        let (cfg, weights, tokenizer) = read_dir(dir, kind, device)?;
        Engine::new(&cfg, &weights, tokenizer, pool, config)
    }

    /// [`Engine::from_dir_on`] as one rank of a tensor-parallel group (see
    /// [`Engine::new_parallel`]). Each rank reads the whole checkpoint
    /// and keeps its slice.
    pub fn from_dir_parallel(
        dir: &Path,
        kind: Kind,
        device: Device,
        pool: Arc<Pool>,
        config: &EngineConfig,
        group: Box<dyn TensorParallel>,
    ) -> Result<Self> {
        let (cfg, weights, tokenizer) = read_dir(dir, kind, device)?;
        Engine::new_parallel(&cfg, &weights, tokenizer, pool, config, group)
    }

    /// The model over the engine's (pooled) weights. An error while the
    /// `weights` tag is released: its tensors point into unmapped memory,
    /// and reading them would fault.
    pub fn model(&self) -> Result<&Model> {
        match self.pool.tag_state(colo_mem::tags::WEIGHTS) {
            Some(colo_mem::TagState::Active) => Ok(&self.model),
            _ => Err(Error::Released {
                op: "use the model",
                tag: colo_mem::tags::WEIGHTS.into(),
            }),
        }
    }

    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.tokenizer.as_ref()
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// Longest sequence (prompt + completion) the model takes.
    pub fn max_context(&self) -> usize {
        self.model.config().max_position_embeddings
    }

    /// Bytes of the weights in the `weights` tag (this rank's, under
    /// tensor parallelism).
    pub fn weights_bytes(&self) -> usize {
        self.weights.bytes
    }

    /// Requests queued or running.
    pub fn in_flight(&self) -> usize {
        self.reqs.len()
    }

    // ------------------------------------------------------------ requests

    /// Queues a request; returns its id, or the reason it cannot be served
    /// (naming the id it would have had).
    pub fn add_request(&mut self, req: Request) -> Result<u64> {
        let id = self.next_id;
        self.next_id += 1;
        let bad = |reason: String| {
            Err(Error::InvalidRequest {
                request: id,
                reason,
            })
        };
        let p = &req.params;
        if let Some(reason) = p.check() {
            return bad(reason);
        }
        let (len, ctx, vocab) = (
            req.prompt.len(),
            self.max_context(),
            self.model.config().vocab_size,
        );
        if len == 0 {
            return bad("the prompt is empty".into());
        }
        if let Some(t) = req.prompt.iter().find(|&&t| t as usize >= vocab) {
            return bad(format!(
                "prompt token {t} is outside the vocabulary (size {vocab})"
            ));
        }
        if len >= ctx {
            return bad(format!(
                "the prompt has {len} tokens; the model's context is {ctx}, which leaves no room to generate"
            ));
        }
        if !p.stop_strings.is_empty() && self.tokenizer.is_none() {
            return bad("stop strings need an engine with a tokenizer".into());
        }
        // The K/V of every token but the last one generated.
        let max_kv = len.saturating_add(p.max_new_tokens).min(ctx) - 1;
        let (need, total) = (
            blocks_for(max_kv, self.cfg.block_size),
            self.sched.blocks.total(),
        );
        if need > total {
            return bad(format!(
                "a sequence of up to {max_kv} cached tokens needs {need} KV blocks, but the pool has {total} \
                 ({} tokens); lower max_new_tokens or give the KV cache more memory",
                total * self.cfg.block_size
            ));
        }
        // Each sample writes its own tokens into blocks of its own.
        if p.n > total {
            return bad(format!(
                "n = {} samples need a KV block each at least, but the pool has {total}",
                p.n
            ));
        }
        self.reqs.insert(
            id,
            ReqState {
                params: req.params.clone(),
                prompt_len: len,
                done: vec![None; p.n],
                remaining: p.n,
            },
        );
        self.sched.waiting.push_back(Waiting::Prompt {
            req: id,
            prompt: req.prompt,
            n: req.params.n,
        });
        Ok(id)
    }

    /// Runs every request to completion. Each entry of the result is that
    /// request's completions, or why it could not be served; the outer error
    /// is for the engine (released memory, stale weights, a failed forward).
    pub fn generate(&mut self, requests: Vec<Request>) -> Result<Vec<Result<RequestOutput>>> {
        if !self.sched.is_idle() {
            return Err(Error::InFlight {
                op: "generate",
                in_flight: self.in_flight(),
            });
        }
        self.check_runnable()?;
        if let Some(g) = group_of(&mut self.group) {
            tp::check_same_requests(g, &requests, self.model.device())?;
        }
        let mut results: Vec<Option<Result<RequestOutput>>> = Vec::with_capacity(requests.len());
        let mut slot = HashMap::new();
        for (i, r) in requests.into_iter().enumerate() {
            match self.add_request(r) {
                Ok(id) => {
                    slot.insert(id, i);
                    results.push(None);
                }
                Err(e) => results.push(Some(Err(e))),
            }
        }
        while !self.sched.is_idle() {
            match self.step() {
                Ok(outs) => {
                    for o in outs {
                        let i = slot[&o.id];
                        results[i] = Some(Ok(o));
                    }
                }
                Err(e) => {
                    self.abort_all();
                    return Err(e);
                }
            }
        }
        Ok(results
            .into_iter()
            .map(|r| r.expect("every admitted request finishes"))
            .collect())
    }

    /// Drops every queued and running request.
    pub fn abort_all(&mut self) {
        self.sched.abort_all();
        self.reqs.clear();
    }

    /// One scheduler iteration: admit and prefill what fits, then one
    /// decode step of the whole running batch. Returns the requests that
    /// finished.
    pub fn step(&mut self) -> Result<Vec<RequestOutput>> {
        self.check_runnable()?;
        let mut finished = Vec::new();
        let mut admitted = Vec::new();
        let mut pending = 0;
        while let Some(item) = self.sched.admit(pending) {
            pending += item.0.seqs();
            admitted.push(item);
        }
        self.prefill(admitted, &mut finished)?;
        if self.sched.running.is_empty() {
            return Ok(finished);
        }
        self.sched.reserve_decode_slots(&mut self.kv);
        let rows: Vec<DecodeRow<'_>> = self
            .sched
            .running
            .iter()
            .map(|s| DecodeRow {
                token: s.tokens[s.kv_len],
                pos: s.kv_len,
                blocks: &s.blocks,
            })
            .collect();
        let replayed = match &mut self.graphs {
            Some(g) => g.decode(&self.model, &self.kv, &rows)?,
            None => None,
        };
        let logits = match replayed {
            Some(logits) => logits,
            // One pass on the calling thread: wide, or a tensor-parallel
            // rank's (its collectives are made from one thread).
            None if self.wide_decode || self.group.is_some() => {
                let (model, kv, scratch) = (&self.model, &mut self.kv, &mut self.scratch[0]);
                let group = group_of(&mut self.group);
                let threads = if self.wide_decode { self.lanes } else { 1 };
                colo_model::lanes::run_wide(threads, || {
                    forward::decode(model, kv, &rows, scratch, group)
                })?
            }
            None => {
                let parts = colo_model::lanes::split(0, rows.len(), self.lanes);
                let (model, kv) = (&self.model, &self.kv);
                let work: Vec<_> = parts
                    .iter()
                    .zip(&mut self.scratch)
                    .map(|(&(start, n), scratch)| {
                        let (model, mut kv) = (model.clone(), kv.share());
                        let rows = &rows[start..start + n];
                        move || forward::decode(&model, &mut kv, rows, scratch, None)
                    })
                    .collect();
                cat(colo_model::lanes::run(work))? // (batch, vocab)
            }
        };
        drop(rows);
        self.counters.decode_steps += 1;
        let running = std::mem::take(&mut self.sched.running);
        let draws: Vec<Draw<'_>> = running.iter().map(|s| self.draw(s)).collect();
        let picks = sampling::sample(&logits, &draws)?;
        drop(draws);
        let picks = self.agree(picks)?;
        for (mut seq, pick) in running.into_iter().zip(picks) {
            seq.kv_len += 1;
            self.push_token(seq, pick, &mut finished)?;
        }
        Ok(finished)
    }

    /// Prefills the admitted sequences: right-padded batches of at most
    /// [`PREFILL_TOKENS`] padded tokens (one forward per lane), then each
    /// sequence's first token.
    fn prefill(
        &mut self,
        admitted: Vec<(Waiting, Vec<BlockId>)>,
        finished: &mut Vec<RequestOutput>,
    ) -> Result<()> {
        let mut admitted = admitted.into_iter().peekable();
        while admitted.peek().is_some() {
            let mut batch = Vec::new();
            let mut longest = 0;
            while let Some((item, _)) = admitted.peek() {
                let len = item.tokens().len();
                let padded = longest.max(len) * (batch.len() + 1);
                if !batch.is_empty() && padded > PREFILL_TOKENS {
                    break;
                }
                longest = longest.max(len);
                batch.push(admitted.next().expect("peeked"));
            }
            let logits = self.prefill_forward(&batch)?; // (rows, vocab)
            for (i, (item, blocks)) in batch.into_iter().enumerate() {
                self.start(item, blocks, logits.get(i as i64).unsqueeze(0), finished)?;
            }
        }
        Ok(())
    }

    /// One prefill forward of `batch` per lane; logits (rows, vocab).
    fn prefill_forward(&mut self, batch: &[(Waiting, Vec<BlockId>)]) -> Result<Tensor> {
        let rows: Vec<PrefillRow<'_>> = batch
            .iter()
            .map(|(item, blocks)| PrefillRow {
                tokens: item.tokens(),
                blocks,
            })
            .collect();
        for r in &rows {
            self.counters.prefills += 1;
            self.counters.prefill_tokens += r.tokens.len() as u64;
        }
        if let Some(g) = group_of(&mut self.group) {
            let (model, kv) = (&self.model, &mut self.kv);
            return colo_model::lanes::run_wide(1, || forward::prefill(model, kv, &rows, Some(g)));
        }
        let parts = colo_model::lanes::split(0, rows.len(), self.lanes);
        let work: Vec<_> = parts
            .iter()
            .map(|&(start, n)| {
                let (model, mut kv) = (self.model.clone(), self.kv.share());
                let rows = &rows[start..start + n];
                move || forward::prefill(&model, &mut kv, rows, None)
            })
            .collect();
        cat(colo_model::lanes::run(work))
    }

    /// A prefilled sequence's first token, from its last position's
    /// `logits` (1, vocab); a prompt becomes its request's `n` samples.
    fn start(
        &mut self,
        item: Waiting,
        blocks: Vec<BlockId>,
        logits: Tensor,
        finished: &mut Vec<RequestOutput>,
    ) -> Result<()> {
        match item {
            Waiting::Prompt { req, prompt, n } => {
                let base = Sequence {
                    req,
                    sample: 0,
                    prompt_len: prompt.len(),
                    kv_len: prompt.len(),
                    tokens: prompt,
                    logprobs: Vec::new(),
                    blocks,
                };
                // The n samples share the prompt's blocks: one reference
                // each (the allocation's own reference is sample 0's). All
                // references are taken before any sample can finish and
                // give its own back.
                for _ in 1..n {
                    for &b in &base.blocks {
                        self.sched.blocks.retain(b);
                    }
                }
                let samples: Vec<Sequence> = (0..n)
                    .map(|i| Sequence {
                        sample: i,
                        ..base.clone()
                    })
                    .collect();
                let draws: Vec<Draw<'_>> = samples.iter().map(|s| self.draw(s)).collect();
                let picks = sampling::sample(&logits.expand([n as i64, -1], false), &draws)?;
                drop(draws);
                let picks = self.agree(picks)?;
                for (s, pick) in samples.into_iter().zip(picks) {
                    self.push_token(s, pick, finished)?;
                }
            }
            Waiting::Resume(mut seq) => {
                seq.blocks = blocks;
                seq.kv_len = seq.tokens.len();
                let pick = sampling::sample(&logits, &[self.draw(&seq)])?;
                let pick = self.agree(pick)?[0];
                self.push_token(seq, pick, finished)?;
            }
        }
        Ok(())
    }

    /// The tokens every rank of a tensor-parallel group continues with:
    /// rank 0's `picks` (each rank drew the same from the same logits;
    /// this makes it certain). `picks` as they are without a group.
    fn agree(&mut self, picks: Vec<(u32, f32)>) -> Result<Vec<(u32, f32)>> {
        match group_of(&mut self.group) {
            Some(g) => tp::broadcast_picks(g, picks, self.model.device()),
            None => Ok(picks),
        }
    }

    /// How the next token of `seq` is drawn: its request's parameters and
    /// the uniform number of (seed, sample, step).
    fn draw(&self, seq: &Sequence) -> Draw<'_> {
        let params = &self.reqs[&seq.req].params;
        Draw {
            params,
            u: uniform(params.seed, seq.sample, seq.generated()),
        }
    }

    /// Appends a sampled token to `seq`, then either finishes it or puts it
    /// (back) in the running batch.
    fn push_token(
        &mut self,
        mut seq: Sequence,
        (tok, lp): (u32, f32),
        finished: &mut Vec<RequestOutput>,
    ) -> Result<()> {
        seq.tokens.push(tok);
        seq.logprobs.push(lp);
        self.counters.generated_tokens += 1;
        match self.finish_reason(&seq)? {
            Some(reason) => self.complete(seq, reason, finished),
            None => self.sched.running.push(seq),
        }
        Ok(())
    }

    fn finish_reason(&self, seq: &Sequence) -> Result<Option<FinishReason>> {
        let p = &self.reqs[&seq.req].params;
        let tok = *seq.tokens.last().expect("a token was just pushed");
        if p.stop_token_ids.contains(&tok) {
            return Ok(Some(FinishReason::StopToken(tok)));
        }
        if !p.stop_strings.is_empty() {
            let tokenizer = self.tokenizer.as_ref().expect("checked in add_request");
            let text = tokenizer.decode(&seq.tokens[seq.prompt_len..], false)?;
            if let Some(s) = p.stop_strings.iter().find(|s| text.contains(s.as_str())) {
                return Ok(Some(FinishReason::StopString(s.clone())));
            }
        }
        if seq.generated() >= p.max_new_tokens || seq.tokens.len() >= self.max_context() {
            return Ok(Some(FinishReason::Length));
        }
        Ok(None)
    }

    fn complete(
        &mut self,
        mut seq: Sequence,
        reason: FinishReason,
        finished: &mut Vec<RequestOutput>,
    ) {
        self.sched.free_blocks(&mut seq);
        let st = self
            .reqs
            .get_mut(&seq.req)
            .expect("a running sequence has a request");
        st.done[seq.sample] = Some(Completion {
            tokens: seq.tokens[st.prompt_len..].to_vec(),
            logprobs: seq.logprobs,
            finish_reason: reason,
        });
        st.remaining -= 1;
        if st.remaining == 0 {
            let st = self.reqs.remove(&seq.req).expect("present");
            finished.push(RequestOutput {
                id: seq.req,
                completions: st
                    .done
                    .into_iter()
                    .map(|c| c.expect("all samples done"))
                    .collect(),
            });
        }
    }

    // Accessors for the memory operations in `memory.rs`.
    pub(crate) fn config(&self) -> &ValidConfig {
        &self.cfg
    }
    pub(crate) fn weights(&self) -> &PooledWeights {
        &self.weights
    }
    pub(crate) fn weights_mut(&mut self) -> &mut PooledWeights {
        &mut self.weights
    }
    pub(crate) fn model_mut(&mut self) -> &mut Model {
        &mut self.model
    }
    pub(crate) fn scratch_mut(&mut self) -> &mut [Scratch] {
        &mut self.scratch
    }
    pub(crate) fn kv(&self) -> &PagedKv {
        &self.kv
    }
    pub(crate) fn scheduler(&self) -> &Scheduler {
        &self.sched
    }
    pub(crate) fn counters(&self) -> &Counters {
        &self.counters
    }
    /// This engine's share of the model (the whole of it without a group).
    pub fn shard(&self) -> &Shard {
        &self.weights.shard
    }

    /// Starts the counters and the KV peak afresh.
    pub fn reset_stats(&mut self) {
        self.counters = Counters::default();
        self.reset_kv_accounting();
    }

    pub(crate) fn reset_kv_accounting(&mut self) {
        self.sched.blocks.reset_peak();
        self.sched.preemptions = 0;
        self.sched.cow_copies = 0;
    }

    /// The tags generation needs resumed: the weights, the KV cache, and
    /// the CUDA graphs' memory when there are graphs.
    pub(crate) fn runtime_tags(&self) -> &'static [&'static str] {
        match self.graphs {
            Some(_) => &[WEIGHTS, KV_CACHE, CUDA_GRAPH],
            None => &[WEIGHTS, KV_CACHE],
        }
    }

    /// Captures the decode step's CUDA graph of every bucket up to `rows`
    /// sequences of up to `max_len` tokens, so that generation replays
    /// them from its first step; returns how many were new. Nothing to do
    /// (0) off CUDA or with `enforce_eager`: there are no graphs. Needs the
    /// engine's memory resumed.
    pub fn capture_cuda_graphs(&mut self, rows: usize, max_len: usize) -> Result<usize> {
        self.check_runnable()?;
        match &mut self.graphs {
            Some(g) => g.capture_up_to(&self.model, &self.kv, rows, max_len),
            None => Ok(0),
        }
    }

    /// CUDA graphs captured so far (0 off CUDA or with `enforce_eager`).
    pub fn cuda_graphs(&self) -> usize {
        self.graphs.as_ref().map_or(0, DecodeGraphs::captured)
    }

    fn check_runnable(&self) -> Result<()> {
        for &tag in self.runtime_tags() {
            if self.pool.tag_state(tag) != Some(TagState::Active) {
                return Err(Error::Released {
                    op: "generate",
                    tag: tag.into(),
                });
            }
        }
        if let Some(first) = self.weights.stale.first() {
            return Err(Error::StaleWeights {
                missing: self.weights.stale.len(),
                first: first.clone(),
            });
        }
        Ok(())
    }
}

/// The group as the forward passes take it.
fn group_of(group: &mut Option<Box<dyn TensorParallel>>) -> Option<&mut dyn TensorParallel> {
    match group {
        Some(g) => Some(&mut **g),
        None => None,
    }
}

/// A checkpoint directory's configuration, weights (as `kind` on `device`)
/// and tokenizer if it has one.
fn read_dir(
    dir: &Path,
    kind: Kind,
    device: Device,
) -> Result<(ModelConfig, Weights, Option<Tokenizer>)> {
    let cfg = ModelConfig::from_file(&dir.join("config.json"))?;
    let weights = Weights::from_dir(dir, kind, device)?;
    let tokenizer = match dir.join("tokenizer.json").is_file() {
        true => Some(Tokenizer::from_dir(dir)?),
        false => None,
    };
    Ok((cfg, weights, tokenizer))
}

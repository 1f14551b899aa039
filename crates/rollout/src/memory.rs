//! The colocated contract on [`Engine`]: release and resume of the
//! engine's two tags, in-place weight updates, and the observable state
//! tests and the RL loop check (statistics, addresses).

use colo_mem::tags::{CUDA_GRAPH, KV_CACHE, WEIGHTS};
use colo_mem::{Policy, TagState};
use tch::Tensor;

use crate::attention::Scratch;
use crate::engine::{Engine, EngineStats};
use crate::weights::WeightUpdate;
use crate::{Error, Result};

fn check_tags(op: &'static str, tags: &[&str]) -> Result<()> {
    match tags.iter().find(|t| **t != WEIGHTS && **t != KV_CACHE) {
        Some(t) => Err(Error::UnknownTag {
            op,
            tag: (*t).into(),
        }),
        None => Ok(()),
    }
}

impl Engine {
    /// `tags`, with the CUDA graphs' tag beside `kv_cache` when the engine
    /// has graphs: their memory goes and comes back with the cache.
    fn with_graphs<'a>(&self, tags: &[&'a str]) -> Vec<&'a str> {
        let mut all = tags.to_vec();
        if tags.contains(&KV_CACHE) && self.runtime_tags().contains(&CUDA_GRAPH) {
            all.push(CUDA_GRAPH);
        }
        all
    }

    fn check_idle(&self, op: &'static str) -> Result<()> {
        match self.in_flight() {
            0 => Ok(()),
            n => Err(Error::InFlight { op, in_flight: n }),
        }
    }

    /// Returns the physical memory of `tags` (`weights`, `kv_cache`) to the
    /// device; their addresses stay reserved. An error with requests in
    /// flight. Releasing `weights` under the discard policy means
    /// generation refuses until `update_weights` has rewritten all of them.
    pub fn release(&mut self, tags: &[&str]) -> Result<()> {
        check_tags("release", tags)?;
        self.check_idle("release memory")?;
        self.pool().pause(&self.with_graphs(tags))?;
        if tags.contains(&KV_CACHE) {
            self.scratch_mut().iter_mut().for_each(Scratch::clear);
        }
        let discarded = self
            .pool()
            .stats()
            .tag(WEIGHTS)
            .is_some_and(|t| t.policy != Policy::Backup);
        if tags.contains(&WEIGHTS) && discarded {
            self.weights_mut().mark_all_stale();
        }
        Ok(())
    }

    /// Maps memory for `tags` again at the same addresses. The KV cache
    /// comes back empty (nothing is cached across a release); the weights
    /// come back as their policy says.
    pub fn resume(&mut self, tags: &[&str]) -> Result<()> {
        check_tags("resume", tags)?;
        self.pool().resume(&self.with_graphs(tags))?;
        Ok(())
    }

    /// Copies named tensors (Hugging Face names, any dtype, e.g. the
    /// trainer's parameters) into the engine's weights in place: addresses
    /// do not change. Every name and shape is checked before anything is
    /// written. Needs the `weights` tag resumed and no request in flight.
    pub fn update_weights(&mut self, tensors: &[(String, Tensor)]) -> Result<WeightUpdate> {
        self.check_idle("update weights")?;
        if self.pool().tag_state(WEIGHTS) != Some(TagState::Active) {
            return Err(Error::Released {
                op: "update weights",
                tag: WEIGHTS.into(),
            });
        }
        let bucket = self.config().weight_bucket_bytes;
        self.weights_mut().update(tensors, bucket)
    }

    /// Drops whatever the KV cache holds and resets its block accounting.
    /// The engine shares prompt blocks only among the samples of a running
    /// request, so outside `generate` nothing is cached; this checks that
    /// and starts the statistics' peak afresh.
    pub fn flush_cache(&mut self) -> Result<()> {
        self.check_idle("flush the cache")?;
        self.reset_kv_accounting();
        Ok(())
    }

    /// Start addresses of the KV buffers (keys and values per layer).
    pub fn kv_addresses(&self) -> Vec<u64> {
        self.kv().addresses()
    }

    /// Every parameter's data address, by name.
    pub fn weight_addresses(&self) -> Vec<(String, u64)> {
        self.weights().addresses()
    }

    pub fn stats(&self) -> EngineStats {
        let (kv, sched, c) = (self.kv(), self.scheduler(), self.counters());
        EngineStats {
            block_size: kv.layout.block_size,
            kv_blocks_total: sched.blocks.total(),
            kv_blocks_used: sched.blocks.used(),
            kv_blocks_peak: sched.blocks.peak_used(),
            kv_bytes_per_block: kv.layout.bytes_per_block(),
            kv_bytes: kv.bytes(),
            weights_bytes: self.weights().bytes,
            weights_replicated_bytes: self.weights().replicated_bytes,
            tensor_parallel_size: self.shard().size,
            tensor_parallel_rank: self.shard().rank,
            prefills: c.prefills,
            prefill_tokens: c.prefill_tokens,
            decode_steps: c.decode_steps,
            generated_tokens: c.generated_tokens,
            preemptions: sched.preemptions,
            cow_copies: sched.cow_copies,
        }
    }
}

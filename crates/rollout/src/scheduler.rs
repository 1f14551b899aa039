//! Which sequences run: the waiting queue, the running batch, admission,
//! block reservation for each decode step, copy on write, and preemption by
//! recompute.
//!
//! Policy (vLLM's, simplified): requests are admitted first come, first
//! served while the batch has room and enough free blocks for their prompt
//! plus one block of headroom per sequence. Before each decode step every
//! running sequence gets a writable slot for its next position; when blocks
//! run out, the most recently admitted sequence is preempted — its blocks
//! are freed and it goes back to the front of the queue, to be recomputed
//! from its tokens later. The oldest sequence is never preempted by a newer
//! one, so the batch always makes progress, and a sequence that fits the
//! pool alone (checked when the request is added) always finishes.

use std::collections::VecDeque;

use crate::block_table::{blocks_for, BlockAllocator, BlockId};
use crate::kv_cache::PagedKv;

/// One completion being generated.
#[derive(Debug, Clone)]
pub(crate) struct Sequence {
    /// Request id.
    pub req: u64,
    /// Index of this completion within its request (its RNG stream).
    pub sample: usize,
    /// Prompt followed by the generated tokens.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    pub logprobs: Vec<f32>,
    /// Block table: block `i` holds positions `i * block_size ..`.
    pub blocks: Vec<BlockId>,
    /// Positions whose keys and values are in the cache. While running,
    /// `tokens.len() - 1`: the last sampled token is fed by the next step.
    pub kv_len: usize,
}

impl Sequence {
    pub fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }
}

/// Work waiting for a prefill.
#[derive(Debug)]
pub(crate) enum Waiting {
    /// A new request: its prompt is prefilled once, then forked into `n`
    /// sequences that share the prompt's blocks.
    Prompt {
        req: u64,
        prompt: Vec<u32>,
        n: usize,
    },
    /// A preempted sequence, recomputed from all its tokens.
    Resume(Sequence),
}

impl Waiting {
    pub(crate) fn seqs(&self) -> usize {
        match self {
            Waiting::Prompt { n, .. } => *n,
            Waiting::Resume(_) => 1,
        }
    }

    /// The tokens its prefill runs: the prompt, or everything a
    /// preempted sequence had.
    pub(crate) fn tokens(&self) -> &[u32] {
        match self {
            Waiting::Prompt { prompt, .. } => prompt,
            Waiting::Resume(s) => &s.tokens,
        }
    }
}

pub(crate) struct Scheduler {
    pub waiting: VecDeque<Waiting>,
    pub running: Vec<Sequence>,
    pub blocks: BlockAllocator,
    pub block_size: usize,
    pub max_batch: usize,
    pub preemptions: u64,
    pub cow_copies: u64,
}

impl Scheduler {
    pub fn new(num_blocks: usize, block_size: usize, max_batch: usize) -> Self {
        Scheduler {
            waiting: VecDeque::new(),
            running: Vec::new(),
            blocks: BlockAllocator::new(num_blocks),
            block_size,
            max_batch,
            preemptions: 0,
            cow_copies: 0,
        }
    }

    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    /// The next waiting item with blocks allocated for its prefill, if it
    /// can start now beside the running sequences and the `pending` ones
    /// admitted earlier in the same step (not running until their
    /// prefill). With nothing running or pending it always can (the
    /// request checks guarantee that any one sequence fits the whole pool).
    pub fn admit(&mut self, pending: usize) -> Option<(Waiting, Vec<BlockId>)> {
        let front = self.waiting.front()?;
        let need = blocks_for(front.tokens().len(), self.block_size);
        let busy = self.running.len() + pending;
        if busy > 0
            && (busy + front.seqs() > self.max_batch
                || self.blocks.free_count() < need + front.seqs() + pending)
        {
            return None;
        }
        if self.blocks.free_count() < need {
            return None;
        }
        let item = self.waiting.pop_front().expect("front exists");
        let blocks = (0..need)
            .map(|_| self.blocks.alloc().expect("free blocks counted"))
            .collect();
        Some((item, blocks))
    }

    /// Gives every running sequence a writable slot for its next position,
    /// preempting from the back of the batch when blocks run out.
    pub fn reserve_decode_slots(&mut self, kv: &mut PagedKv) {
        // Copies on write are gathered and made together (one gather and
        // one scatter per buffer, not one per sequence and buffer), and
        // always before a preemption frees blocks they read or write.
        let mut copies = Vec::new();
        let mut i = 0;
        while i < self.running.len() {
            if self.ensure_slot(i, &mut copies) {
                i += 1;
            } else {
                kv.copy_prefixes(&std::mem::take(&mut copies));
                // The newest sequence goes (possibly `i` itself).
                let victim = self.running.pop().expect("running is non-empty");
                self.preempt(victim);
            }
        }
        kv.copy_prefixes(&copies);
    }

    /// A slot for position `kv_len` of `running[i]`: a fresh block at a
    /// block boundary, or a private copy of a shared partial block (its
    /// first `off` slots, queued in `copies` as (from, to, slots)).
    fn ensure_slot(&mut self, i: usize, copies: &mut Vec<(BlockId, BlockId, usize)>) -> bool {
        let bs = self.block_size;
        let seq = &self.running[i];
        let (bi, off) = (seq.kv_len / bs, seq.kv_len % bs);
        if bi == seq.blocks.len() {
            let Some(b) = self.blocks.alloc() else {
                return false;
            };
            self.running[i].blocks.push(b);
            return true;
        }
        let old = seq.blocks[bi];
        if self.blocks.refcount(old) == 1 {
            return true;
        }
        let Some(new) = self.blocks.alloc() else {
            return false;
        };
        copies.push((old, new, off));
        self.blocks.release(old);
        self.running[i].blocks[bi] = new;
        self.cow_copies += 1;
        true
    }

    /// Frees a sequence's blocks and queues it for recompute.
    fn preempt(&mut self, mut seq: Sequence) {
        self.free_blocks(&mut seq);
        seq.kv_len = 0;
        self.preemptions += 1;
        self.waiting.push_front(Waiting::Resume(seq));
    }

    pub fn free_blocks(&mut self, seq: &mut Sequence) {
        for b in seq.blocks.drain(..) {
            self.blocks.release(b);
        }
    }

    /// Drops everything queued or running (after an error).
    pub fn abort_all(&mut self) {
        let mut running = std::mem::take(&mut self.running);
        for s in &mut running {
            self.free_blocks(s);
        }
        self.waiting.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompt(req: u64, n: usize) -> Waiting {
        Waiting::Prompt {
            req,
            prompt: vec![1, 2, 3],
            n,
        }
    }

    /// `max_batch` bounds the sequences admitted in one step too, not only
    /// those admitted beside sequences already running.
    #[test]
    fn one_step_admits_at_most_max_batch_sequences() {
        let mut sched = Scheduler::new(100, 4, 4);
        sched
            .waiting
            .extend([prompt(0, 2), prompt(1, 2), prompt(2, 2)]);
        let mut pending = 0;
        let mut admitted = vec![];
        while let Some((item, _blocks)) = sched.admit(pending) {
            pending += item.seqs();
            admitted.push(item);
        }
        assert_eq!(admitted.len(), 2);
        assert_eq!(pending, 4);
        assert_eq!(sched.waiting.len(), 1);
    }

    /// A request larger than `max_batch` still starts when nothing else
    /// runs (it could never start otherwise), and alone.
    #[test]
    fn a_request_over_max_batch_starts_alone() {
        let mut sched = Scheduler::new(100, 4, 4);
        sched.waiting.extend([prompt(0, 6), prompt(1, 1)]);
        let (first, _) = sched.admit(0).expect("nothing runs: admitted");
        assert_eq!(first.seqs(), 6);
        assert!(sched.admit(6).is_none());
    }

    /// Each sequence admitted in the step keeps its block of headroom: with
    /// 5 blocks, two one-block prompts of 2 samples need 1 (nothing else
    /// runs), then 1 + 2 + 2 of the 4 left.
    #[test]
    fn headroom_counts_the_sequences_admitted_in_the_same_step() {
        let mut sched = Scheduler::new(5, 4, 16);
        sched.waiting.extend([prompt(0, 2), prompt(1, 2)]);
        let (first, _) = sched.admit(0).expect("nothing runs: admitted");
        assert_eq!(sched.blocks.free_count(), 4);
        // The second needs 1 block + 2 of its own headroom + 2 for the first.
        assert!(sched.admit(first.seqs()).is_none());
        assert_eq!(sched.waiting.len(), 1);
    }
}

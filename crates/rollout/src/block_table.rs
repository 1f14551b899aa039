//! KV block bookkeeping: which blocks are free, and how many sequences
//! share each one. A sequence's block table is a plain `Vec<BlockId>` (block
//! `i` holds its positions `i * block_size ..`); sharing is by reference
//! count, as in vLLM.

/// Index of a block in the paged KV cache.
pub type BlockId = u32;

/// Free list and reference counts of the KV blocks.
#[derive(Debug, Clone)]
pub struct BlockAllocator {
    refs: Vec<u32>,
    /// Popped from the end; filled so that block 0 goes first.
    free: Vec<BlockId>,
    peak_used: usize,
}

impl BlockAllocator {
    pub fn new(blocks: usize) -> Self {
        BlockAllocator {
            refs: vec![0; blocks],
            free: (0..blocks as BlockId).rev().collect(),
            peak_used: 0,
        }
    }

    pub fn total(&self) -> usize {
        self.refs.len()
    }

    pub fn free_count(&self) -> usize {
        self.free.len()
    }

    pub fn used(&self) -> usize {
        self.total() - self.free.len()
    }

    /// Most blocks in use at once since creation or `reset_peak`.
    pub fn peak_used(&self) -> usize {
        self.peak_used
    }

    pub fn reset_peak(&mut self) {
        self.peak_used = self.used();
    }

    /// A free block with reference count 1, or `None` when all are taken.
    pub fn alloc(&mut self) -> Option<BlockId> {
        let b = self.free.pop()?;
        self.refs[b as usize] = 1;
        self.peak_used = self.peak_used.max(self.used());
        Some(b)
    }

    /// One more sequence shares `b`.
    pub fn retain(&mut self, b: BlockId) {
        debug_assert!(self.refs[b as usize] > 0, "retain of free block {b}");
        self.refs[b as usize] += 1;
    }

    /// One sequence fewer shares `b`; the last one frees it.
    pub fn release(&mut self, b: BlockId) {
        let r = &mut self.refs[b as usize];
        debug_assert!(*r > 0, "release of free block {b}");
        *r -= 1;
        if *r == 0 {
            self.free.push(b);
        }
    }

    pub fn refcount(&self, b: BlockId) -> u32 {
        self.refs[b as usize]
    }
}

/// Blocks needed to hold `tokens` positions.
pub fn blocks_for(tokens: usize, block_size: usize) -> usize {
    tokens.div_ceil(block_size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_blocks_are_freed_by_the_last_holder() {
        let mut a = BlockAllocator::new(2);
        let b = a.alloc().unwrap();
        assert_eq!(b, 0);
        a.retain(b);
        a.release(b);
        assert_eq!((a.used(), a.refcount(b)), (1, 1));
        a.release(b);
        assert_eq!(a.used(), 0);
        assert_eq!(a.peak_used(), 1);
        assert!(a.alloc().is_some() && a.alloc().is_some() && a.alloc().is_none());
    }
}

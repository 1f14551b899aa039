//! Data parallelism seen from one trainer: a [`Collective`] joins this
//! trainer to its peers (one per device), and an update then behaves as if
//! it ran on the union of every peer's batch.
//!
//! Three things change when a collective is set, and nothing else:
//!
//! - the loss denominators ([`AggScale`](colo_algo::AggScale)) are the
//!   **global** counts: response tokens and non-empty rows summed over the
//!   peers, the padded length their maximum, so each peer's loss is its
//!   share of the global loss;
//! - the accumulated gradients are **summed** over the peers before the
//!   global norm, clipping and AdamW, so every peer applies the same update
//!   and the weights stay identical (the all-reduce hands every peer the
//!   same sum);
//! - the update's metrics are reduced the same way, so every peer reports
//!   the global batch's loss, clip fraction and entropy.
//!
//! What differs from one device is the order of the floating-point sums:
//! the all-reduce adds per-peer partial sums, one device adds per micro-
//! batch. This is the design of verl's and OpenRLHF's data-parallel actors
//! (verl: `loss_scale_factor` with global token counts, then DDP/FSDP's
//! gradient all-reduce).

use tch::Tensor;

use crate::Result;

/// Bytes one peer sent to and received from the others in some collective
/// calls, counted per call from the buffers handed to the transport.
///
/// The convention is the ring's, which gloo's and NCCL's all-gathers use
/// (and a direct exchange moves the same): an all-gather of a shard of `s`
/// bytes over `N` peers has each peer send `s·(N − 1)` bytes (its own
/// shard, then the ones it forwards) and receive `s·(N − 1)` (every other
/// peer's shard); one peer alone moves nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    pub sent: u64,
    pub received: u64,
}

impl Traffic {
    /// `self` less what had been counted at `earlier` (counters only grow).
    pub fn since(self, earlier: Traffic) -> Traffic {
        Traffic {
            sent: self.sent.saturating_sub(earlier.sent),
            received: self.received.saturating_sub(earlier.received),
        }
    }
}

/// How values are combined over the peers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Max,
}

/// The peers of a data-parallel group, as this trainer sees them
/// (torch.distributed's `all_reduce`, behind whatever transport).
pub trait Collective: Send {
    /// Number of peers, this one included.
    fn world_size(&self) -> usize;

    /// This peer's index, `0..world_size`.
    fn rank(&self) -> usize;

    /// Sums `tensors` over the peers, in place; afterwards every peer holds
    /// the same values.
    fn all_reduce_tensors(&mut self, tensors: &[Tensor]) -> Result<()>;

    /// Reduces a few host numbers (counts, metric sums) over the peers.
    fn all_reduce_values(&mut self, values: &mut [f64], op: ReduceOp) -> Result<()>;

    /// Gathers every peer's `shard` into `full`, in rank order
    /// (torch.distributed's `all_gather_into_tensor`): both flat and
    /// contiguous, of one kind, `full` holding `world_size` shards. What a
    /// sharded trainer does before computing with a unit's weights.
    fn all_gather(&mut self, shard: &Tensor, full: &Tensor) -> Result<()>;

    /// Sums `full` over the peers and leaves this peer's part of the sum
    /// (part `rank` of `world_size` equal parts) in `shard`
    /// (torch.distributed's `reduce_scatter_tensor`): both flat, contiguous
    /// float32. A sharded trainer's gradients of one unit.
    fn reduce_scatter(&mut self, full: &Tensor, shard: &Tensor) -> Result<()>;
}

/// Checks the shapes [`Collective::all_gather`] and
/// [`Collective::reduce_scatter`] take: `shard` and `full` flat and
/// contiguous, of one kind, `full` `world` times as long.
pub fn check_shards(what: &'static str, shard: &Tensor, full: &Tensor, world: usize) -> Result<()> {
    let flat = |t: &Tensor| t.dim() == 1 && t.is_contiguous();
    let long = (shard.numel() as u64).checked_mul(world as u64);
    if flat(shard) && flat(full) && shard.kind() == full.kind() && long == Some(full.numel() as u64)
    {
        return Ok(());
    }
    Err(crate::Error::Unsupported {
        what,
        found: format!(
            "a shard of {:?} {:?} and a full buffer of {:?} {:?} over {world} peers: both must \
             be flat, contiguous and of one kind, the full one {world} shards long",
            shard.size(),
            shard.kind(),
            full.size(),
            full.kind()
        ),
    })
}

/// One peer alone: every reduction is the identity. What a trainer without
/// a collective does; also a test double for the single-peer case.
#[derive(Debug, Default, Clone, Copy)]
pub struct Solo;

impl Collective for Solo {
    fn world_size(&self) -> usize {
        1
    }

    fn rank(&self) -> usize {
        0
    }

    fn all_reduce_tensors(&mut self, _tensors: &[Tensor]) -> Result<()> {
        Ok(())
    }

    fn all_reduce_values(&mut self, _values: &mut [f64], _op: ReduceOp) -> Result<()> {
        Ok(())
    }

    fn all_gather(&mut self, shard: &Tensor, full: &Tensor) -> Result<()> {
        check_shards("all_gather", shard, full, 1)?;
        tch::no_grad(|| full.shallow_clone().f_copy_(shard))?;
        Ok(())
    }

    fn reduce_scatter(&mut self, full: &Tensor, shard: &Tensor) -> Result<()> {
        check_shards("reduce_scatter", shard, full, 1)?;
        tch::no_grad(|| shard.shallow_clone().f_copy_(full))?;
        Ok(())
    }
}

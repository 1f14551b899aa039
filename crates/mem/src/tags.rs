//! The tag names colo's engines use, in one place so that the trainer, the
//! rollout engine and the RL loop pause and resume the same memory.

/// The rollout engine's weights.
pub const WEIGHTS: &str = "weights";
/// The rollout engine's paged KV cache.
pub const KV_CACHE: &str = "kv_cache";
/// The training engine's parameters.
pub const TRAIN_PARAMS: &str = "train_params";
/// The training engine's gradient accumulators.
pub const TRAIN_GRADS: &str = "train_grads";
/// The optimizer's state (AdamW moments).
pub const OPTIMIZER: &str = "optimizer";
/// Activations and other transient tensors of forward/backward passes.
pub const ACTIVATIONS: &str = "activations";
/// The reference model's weights.
pub const REF: &str = "ref";
/// The rollout engine's captured CUDA graphs: their fixed input buffers and
/// the memory their kernels use. Paused and resumed with `kv_cache`.
pub const CUDA_GRAPH: &str = "cuda_graph";
/// A sharded trainer's gathered weights: the full parameters of the units
/// a pass is computing with, gathered before and released after (see
/// colo-train's `sharding`). Nothing in it outlives a pass.
pub const GATHERED_PARAMS: &str = "gathered_params";

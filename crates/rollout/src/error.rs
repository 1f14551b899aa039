//! The crate's one error type. Messages name the request, tensor or tag.

/// Everything the rollout engine can refuse or fail at.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An `EngineConfig` value is out of range or inconsistent.
    #[error("invalid engine config: {0}")]
    Config(String),

    /// One request cannot be served (bad sampling parameters, a prompt that
    /// does not fit). Only that request fails; the others complete.
    #[error("request {request}: {reason}")]
    InvalidRequest { request: u64, reason: String },

    /// The operation needs memory of a tag that is released.
    #[error("cannot {op}: tag `{tag}` is released; resume it first")]
    Released { op: &'static str, tag: String },

    /// The weights were released without a backup and not all of them have
    /// been written since: generating would read garbage.
    #[error(
        "cannot generate: the weights were released without a backup and {missing} tensor(s) \
         have not been updated since (first: `{first}`); call update_weights with all of them"
    )]
    StaleWeights { missing: usize, first: String },

    /// A lifecycle call that needs an idle engine came while requests run.
    #[error("cannot {op}: {in_flight} request(s) are in flight; finish or abort them first")]
    InFlight { op: &'static str, in_flight: usize },

    /// `release` / `resume` named a tag the engine does not own.
    #[error("cannot {op} tag `{tag}`: the rollout engine owns only `weights` and `kv_cache`")]
    UnknownTag { op: &'static str, tag: String },

    /// `update_weights` got a tensor that is not a parameter of the model.
    #[error("update_weights: `{name}` is not a parameter of this model")]
    UnknownTensor { name: String },

    /// `update_weights` got a tensor of the wrong shape.
    #[error("update_weights: tensor `{name}` has shape {found:?}, expected {expected:?}")]
    ShapeMismatch {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },

    /// A collective of the tensor-parallel group failed, or its ranks
    /// diverged (given different requests, a rank gone).
    #[error("tensor parallelism: {0}")]
    TensorParallel(String),

    /// Something about the model or memory the engine cannot run with.
    #[error("{0}")]
    Unsupported(String),

    /// From the memory layer (its messages name the tag and its state).
    #[error(transparent)]
    Mem(#[from] colo_mem::Error),

    /// From colo-kernels' paged attention (its messages name the kernel
    /// and the lane, slot or shape that does not fit).
    #[error(transparent)]
    Kernel(#[from] colo_kernels::Error),

    /// From the model.
    #[error(transparent)]
    Model(#[from] colo_model::Error),

    /// From libtorch.
    #[error(transparent)]
    Torch(#[from] tch::TchError),
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

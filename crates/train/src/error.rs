//! The crate's one error type.

use std::path::PathBuf;

/// Everything that can go wrong in the training engine.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A configuration value is out of range; names the field.
    #[error("invalid config `{field}` = {value}: {reason}")]
    Config {
        field: &'static str,
        value: String,
        reason: String,
    },

    /// A batch does not have the shapes, dtypes or padding the engine needs.
    #[error("invalid batch: `{arg}` {reason}")]
    Batch { arg: &'static str, reason: String },

    /// A method needs memory that is offloaded right now.
    #[error("cannot {op}: {what} (tag `{tag}`) is offloaded; reload it first")]
    Offloaded {
        op: &'static str,
        what: &'static str,
        tag: &'static str,
    },

    /// `offload` of something already offloaded, or `reload` of something
    /// resident.
    #[error("cannot {op} {what} (tag `{tag}`): it is already {state}")]
    OffloadState {
        op: &'static str,
        what: &'static str,
        tag: &'static str,
        state: &'static str,
    },

    /// A method needs a value head the engine was built without.
    #[error("cannot {op}: this engine has no value head (build it with a critic head)")]
    NoValueHead { op: &'static str },

    /// A dtype or device the engine cannot run on (a kind other than
    /// float32 / bfloat16, CUDA without a GPU, a pool of another device).
    #[error("unsupported {what}: {found}")]
    Unsupported { what: &'static str, found: String },

    /// A collective call failed: a peer died or its transport broke
    /// (`rank` of `world`, the call, and what the transport said).
    #[error("collective {op} failed on rank {rank} of {world}: {reason}")]
    Collective {
        op: &'static str,
        rank: usize,
        world: usize,
        reason: String,
    },

    /// A checkpoint tensor does not have the shape of the engine's tensor.
    #[error("checkpoint {}: tensor `{name}` has shape {found:?}, expected {expected:?}", path.display())]
    CheckpointShape {
        path: PathBuf,
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },

    /// A checkpoint lacks a tensor the engine has.
    #[error("checkpoint {}: missing tensor `{name}`", path.display())]
    CheckpointMissing { path: PathBuf, name: String },

    /// A checkpoint's JSON state is malformed or from another format.
    #[error("checkpoint {}: {reason}", path.display())]
    CheckpointState { path: PathBuf, reason: String },

    /// Reading or writing a file failed.
    #[error("i/o error on {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },

    /// The model (loading, forward, saving).
    #[error(transparent)]
    Model(#[from] colo_model::Error),

    /// A loss from colo-algo.
    #[error(transparent)]
    Algo(#[from] colo_algo::Error),

    /// The memory layer (pause/resume, regions, out of memory).
    #[error(transparent)]
    Mem(#[from] colo_mem::Error),

    /// One of colo-kernels' fused kernels (the loss head, AdamW): names
    /// the kernel and what did not fit.
    #[error(transparent)]
    Kernel(#[from] colo_kernels::Error),

    /// libtorch (through tch): shapes, kinds, devices of user data.
    #[error(transparent)]
    Torch(#[from] tch::TchError),
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn config(field: &'static str, value: impl ToString, reason: &str) -> Self {
        Error::Config {
            field,
            value: value.to_string(),
            reason: reason.to_owned(),
        }
    }

    pub(crate) fn batch(arg: &'static str, reason: impl Into<String>) -> Self {
        Error::Batch {
            arg,
            reason: reason.into(),
        }
    }
}

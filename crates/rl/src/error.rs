//! The crate's one error type.

use std::path::PathBuf;

/// Everything that can go wrong in `colo-rl`. Messages name the thing (file,
/// line, field, sample) and what was wrong with it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A file that must exist does not.
    #[error("{what} not found: {path}")]
    MissingFile { what: &'static str, path: PathBuf },

    /// The run configuration is malformed or inconsistent. `line` is 1-based
    /// and absent when the value was a default (not written in the file).
    #[error("{}{}: `{field}`: {message}", path.display(), line.map(|l| format!(":{l}")).unwrap_or_default())]
    Config {
        path: PathBuf,
        line: Option<usize>,
        field: String,
        message: String,
    },

    /// A line of a JSONL dataset could not be used.
    #[error("{}:{line}: {}{message}", path.display(), field.as_ref().map(|f| format!("field `{f}`: ")).unwrap_or_default())]
    Data {
        path: PathBuf,
        line: usize,
        field: Option<String>,
        message: String,
    },

    /// A row of a parquet dataset could not be used (`row` is 1-based).
    #[error("{}: row {row}: {}{message}", path.display(), field.as_ref().map(|f| format!("field `{f}`: ")).unwrap_or_default())]
    DataRow {
        path: PathBuf,
        row: usize,
        field: Option<String>,
        message: String,
    },

    /// A dataset is unusable as a whole (empty, too small for a batch, …).
    /// The run's longest sequence does not fit the model's context window.
    #[error(
        "data.max_prompt_length ({prompt}) + rollout.max_new_tokens ({new}) = {} tokens, more than \
         the model's context: max_position_embeddings = {context} in {}; lower either (verl \
         refuses such a run too)",
        prompt + new,
        config.display()
    )]
    ContextWindow {
        prompt: usize,
        new: usize,
        context: usize,
        config: PathBuf,
    },

    /// A data-parallel run that cannot be laid out (workers, shards).
    #[error("cluster: {0}")]
    Cluster(String),

    #[error("dataset: {0}")]
    Dataset(String),

    /// Dynamic sampling that found too few groups to train on.
    #[error("dynamic sampling (algorithm.filter_groups): {0}")]
    DynamicSampling(String),

    /// A step that could not finish because the run was asked to stop
    /// (dynamic sampling still drawing batches): nothing of it trained.
    #[error("dynamic sampling (algorithm.filter_groups): {0}")]
    StoppedMidStep(String),

    /// Training whose loss stopped being a number.
    #[error("{0}")]
    Diverged(String),

    /// A reward could not score a sample, or could not be set up.
    #[error(transparent)]
    Reward(#[from] colo_reward::Error),

    #[error(transparent)]
    Model(#[from] colo_model::Error),

    // The lower layers' errors are boxed: they are large, and an error
    // travels through every `?` of the loop.
    #[error("training engine: {0}")]
    Train(Box<colo_train::Error>),

    #[error("rollout engine: {0}")]
    Rollout(Box<colo_rollout::Error>),

    #[error("memory: {0}")]
    Mem(Box<colo_mem::Error>),

    #[error("algorithm: {0}")]
    Algo(Box<colo_algo::Error>),

    #[error("tensor: {0}")]
    Torch(Box<tch::TchError>),

    /// libtorch failed after colo-mem refused it device memory (a CUDA
    /// region's segment): colo-mem's refusal says which tag, phase and
    /// capacity; libtorch's own message only "CUDA out of memory".
    #[error("memory: {refusal} (libtorch: {libtorch})")]
    DeviceRefused {
        refusal: Box<colo_mem::Error>,
        libtorch: String,
    },

    /// A chart could not be drawn or encoded.
    #[error("picture `{what}`: {reason}")]
    Plot { what: &'static str, reason: String },

    /// A run from scratch would overwrite the work of an earlier run in its
    /// directory.
    #[error(
        "{} already holds a run ({what}): {how}; to start over, choose another run directory (--out, or trainer.experiment_name) or remove this one",
        dir.display()
    )]
    RunExists {
        dir: std::path::PathBuf,
        what: String,
        how: &'static str,
    },

    /// Another run holds the run directory ([`crate::run_lock`]).
    #[error(
        "{} is in use by another run (it holds {}); wait for that run to end, or choose another run directory (--out, or trainer.experiment_name)",
        dir.display(),
        dir.join(crate::run_lock::FILE).display()
    )]
    RunInUse { dir: std::path::PathBuf },

    /// `--resume` cannot continue this run directory as configured.
    #[error("--resume: {0}")]
    Resume(String),

    /// A phase of the colocated step was asked for in the wrong state.
    #[error("hybrid worker: cannot {op}: {state}")]
    Phase { op: &'static str, state: String },

    #[error("json: {0}")]
    Json(#[from] serde_json::Error),

    /// An error from an engine or a lower layer, with what colo-rl was doing
    /// when it happened ("evaluating prompt \"12+7=\"", "SFT step 40").
    #[error("{context}: {source}")]
    Context {
        context: String,
        #[source]
        source: Box<Error>,
    },
}

impl Error {
    /// Wraps `source` (any error that converts into this crate's) with what
    /// was being done.
    pub(crate) fn context(context: impl Into<String>, source: impl Into<Error>) -> Self {
        Error::Context {
            context: context.into(),
            source: Box::new(source.into()),
        }
    }

    /// This error, or — when `pool` refused a CUDA region device memory
    /// meanwhile — that refusal with this error's first line beside it.
    pub fn explained_by(self, pool: &colo_mem::Pool) -> Self {
        match pool.take_device_refusal() {
            Some(refusal) => Error::DeviceRefused {
                refusal: Box::new(refusal),
                libtorch: self.to_string().lines().next().unwrap_or("").to_owned(),
            },
            None => self,
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

macro_rules! boxed_from {
    ($($variant:ident($ty:ty)),* $(,)?) => {$(
        impl From<$ty> for Error {
            fn from(e: $ty) -> Self {
                Error::$variant(Box::new(e))
            }
        }
    )*};
}

boxed_from!(
    Train(colo_train::Error),
    Rollout(colo_rollout::Error),
    Mem(colo_mem::Error),
    Algo(colo_algo::Error),
    Torch(tch::TchError),
);

//! The crate's one error type.

use std::path::PathBuf;

/// Everything that can go wrong while loading, running or saving a model.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `config.json` names an architecture this crate does not implement.
    #[error("unsupported model_type `{found}`: supported are {}", supported.join(", "))]
    UnsupportedModelType {
        found: String,
        supported: &'static [&'static str],
    },

    /// A configuration value is missing or inconsistent.
    #[error("invalid config: {0}")]
    Config(String),

    /// The checkpoint has no tensor of this name (that the config implies).
    #[error(
        "{}missing tensor `{name}`, which the model's config.json implies",
        in_checkpoint(checkpoint)
    )]
    MissingTensor {
        name: String,
        /// The directory the weights were read from, if they were.
        checkpoint: Option<PathBuf>,
    },

    /// The checkpoint has the tensor, but not with the shape the config implies.
    #[error(
        "{}tensor `{name}` has shape {found:?}, but the model's config.json implies {expected:?}",
        in_checkpoint(checkpoint)
    )]
    ShapeMismatch {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
        checkpoint: Option<PathBuf>,
    },

    /// The checkpoint stores a weight the model needs as integers or
    /// booleans.
    #[error(
        "{}tensor `{name}` is stored as {dtype}, but a weight must be floating-point (F32, F16, BF16 or F64)",
        in_checkpoint(checkpoint)
    )]
    NotFloat {
        name: String,
        dtype: String,
        checkpoint: Option<PathBuf>,
    },

    /// The checkpoint directory does not exist.
    #[error("no such directory: {} (a model is a Hugging Face directory: config.json, model.safetensors, tokenizer.json)", path.display())]
    MissingDirectory { path: PathBuf },

    /// The checkpoint "directory" is a file.
    #[error("{} is a file; a model is a Hugging Face directory (config.json, model.safetensors, tokenizer.json)", path.display())]
    NotADirectory { path: PathBuf },

    /// A file the checkpoint directory must hold is absent.
    #[error("missing file {}", path.display())]
    MissingFile { path: PathBuf },

    /// Reading or writing a file failed.
    #[error("i/o error on {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },

    /// A JSON file could not be parsed. The parser's message is part of
    /// this one and not a `source`: error chains (`{:#}`) would print it
    /// twice.
    #[error("cannot parse {}: {reason}", path.display())]
    Json {
        path: PathBuf,
        reason: serde_json::Error,
    },

    /// The `tokenizers` crate refused a tokenizer file or an input.
    #[error("tokenizer: {0}")]
    Tokenizer(String),

    /// An argument to a forward call is out of contract (shapes, dtypes).
    #[error("{0}")]
    Input(String),

    /// The requested device cannot be used (e.g. CUDA without a GPU).
    #[error("device {device:?} is not available: {reason}")]
    DeviceUnavailable { device: tch::Device, reason: String },

    /// A safetensors file could not be read or written, or one of its
    /// tensors could not be converted; names the file and, where one is
    /// at fault, the tensor.
    #[error("safetensors file {}{}: {reason}", path.display(), tensor.as_ref().map(|t| format!(", tensor `{t}`")).unwrap_or_default())]
    Safetensors {
        path: PathBuf,
        tensor: Option<String>,
        reason: String,
    },

    /// An error from libtorch (through tch).
    #[error(transparent)]
    Torch(#[from] tch::TchError),

    /// An error from one of colo-kernels' fused kernels (RMSNorm, RoPE):
    /// names the kernel and the shapes or kinds that do not fit.
    #[error(transparent)]
    Kernel(#[from] colo_kernels::Error),
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        let path = path.into();
        // A file of a checkpoint directory that is not one: name the
        // directory, not the file inside it.
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            if dir.is_file() {
                return Error::NotADirectory {
                    path: dir.to_owned(),
                };
            }
            if !dir.exists() {
                return Error::MissingDirectory {
                    path: dir.to_owned(),
                };
            }
        }
        if source.kind() == std::io::ErrorKind::NotFound {
            Error::MissingFile { path }
        } else {
            Error::Io { path, source }
        }
    }
}

/// "checkpoint DIR: " when the weights came from a directory.
fn in_checkpoint(dir: &Option<PathBuf>) -> String {
    dir.as_ref()
        .map_or(String::new(), |d| format!("checkpoint {}: ", d.display()))
}

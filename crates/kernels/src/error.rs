//! The crate's error type. Every message names the kernel and what was
//! wrong with its arguments, or what libtorch said.

/// A kernel's failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The kernel's checks refused its arguments before reading them: the
    /// message names the shapes, kinds, devices, lengths or indices that do
    /// not fit (`rope kernel: tables [2, 4, 8] and [2, 4, 8] do not fit x
    /// [2, 5, 3, 8]`).
    #[error("{kernel} kernel: {msg}")]
    Refused { kernel: &'static str, msg: String },

    /// libtorch threw while the kernel ran (its message, without its C++
    /// backtrace).
    #[error("{kernel} kernel: libtorch failed: {msg}")]
    Libtorch { kernel: &'static str, msg: String },
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

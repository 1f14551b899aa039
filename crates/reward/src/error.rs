//! The crate's one error type.

/// What can go wrong with a reward. Messages name the reward and, for a
/// sample it could not score, the sample and its prompt.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A reward could not score a sample (a ground truth a rule cannot
    /// read, a crashing or misbehaving external command, a user reward's
    /// error).
    #[error("reward `{reward}` failed on sample {sample} (prompt {prompt_id}): {reason}")]
    Score {
        reward: String,
        sample: u64,
        prompt_id: u64,
        reason: String,
    },

    /// A reward could not be set up (bad settings, a command that does not
    /// start, a Python file that does not load).
    #[error("reward `{reward}`: {reason}")]
    Setup { reward: String, reason: String },
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

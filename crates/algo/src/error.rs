//! The crate's one error type.

/// Everything that can go wrong in `colo-algo`.
///
/// Misuse (inputs of the wrong shape, a missing input an estimator needs, a
/// configuration value outside its range) is reported with the argument or
/// field by name; failures inside libtorch are wrapped as they are.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An error raised by a libtorch operation (through `tch`).
    #[error(transparent)]
    Torch(#[from] tch::TchError),

    /// An input tensor does not have the shape the others fix.
    #[error("shape mismatch: `{arg}` has shape {got:?}, but `{reference}` has shape {expected:?}")]
    ShapeMismatch {
        /// The argument with the unexpected shape.
        arg: &'static str,
        /// Its shape.
        got: Vec<usize>,
        /// The argument whose shape the others must match.
        reference: &'static str,
        /// That argument's shape.
        expected: Vec<usize>,
    },

    /// An input that must be a (batch, response_len) matrix is not 2-D.
    #[error("`{arg}` must be a (batch, response_len) tensor, got shape {got:?}")]
    NotMatrix {
        /// The argument.
        arg: &'static str,
        /// Its shape.
        got: Vec<usize>,
    },

    /// A per-sequence input (a slice with one entry per row) has the wrong length.
    #[error("`{arg}` has {got} entries, expected one per sequence ({expected})")]
    LengthMismatch {
        /// The argument.
        arg: &'static str,
        /// Its length.
        got: usize,
        /// The batch size.
        expected: usize,
    },

    /// The inputs do not share one floating-point kind (dtype).
    #[error("dtype mismatch: `{arg}` is {got:?}, but `{reference}` is {expected:?}")]
    DTypeMismatch {
        /// The argument with the unexpected kind.
        arg: &'static str,
        /// Its kind.
        got: tch::Kind,
        /// The argument whose kind the others must match.
        reference: &'static str,
        /// That argument's kind.
        expected: tch::Kind,
    },

    /// The inputs are not all on one device.
    #[error("device mismatch: `{arg}` is on {got:?}, but `{reference}` is on {expected:?}")]
    DeviceMismatch {
        /// The argument on the unexpected device.
        arg: &'static str,
        /// Its device.
        got: tch::Device,
        /// The argument whose device the others must match.
        reference: &'static str,
        /// That argument's device.
        expected: tch::Device,
    },

    /// An estimator was asked for without an input it needs.
    #[error("advantage estimator `{estimator}` needs `{arg}`, which was not given")]
    MissingInput {
        /// The estimator's config name (`gae`, `grpo`, …).
        estimator: &'static str,
        /// The missing argument.
        arg: &'static str,
    },

    /// A configuration value is outside its valid range.
    #[error("invalid config: `{field}` = {value}: {reason}")]
    InvalidConfig {
        /// The field, with its config name.
        field: &'static str,
        /// The value given, formatted.
        value: String,
        /// What it must satisfy.
        reason: &'static str,
    },

    /// Inputs of the right shape whose values make the computation undefined
    /// (for example whitening over fewer than two unmasked tokens).
    #[error("invalid input `{arg}`: {reason}")]
    InvalidInput {
        /// The argument.
        arg: &'static str,
        /// Why it cannot be used.
        reason: String,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_argument() {
        let e = Error::ShapeMismatch {
            arg: "values",
            got: vec![2, 3],
            reference: "token_level_rewards",
            expected: vec![2, 4],
        };
        assert_eq!(
            e.to_string(),
            "shape mismatch: `values` has shape [2, 3], but `token_level_rewards` has shape [2, 4]"
        );
        let e = Error::MissingInput {
            estimator: "gae",
            arg: "values",
        };
        assert!(e.to_string().contains("`gae` needs `values`"));
        let e = Error::DeviceMismatch {
            arg: "response_mask",
            got: tch::Device::Cpu,
            reference: "log_prob",
            expected: tch::Device::Cuda(0),
        };
        assert_eq!(
            e.to_string(),
            "device mismatch: `response_mask` is on Cpu, but `log_prob` is on Cuda(0)"
        );
    }
}

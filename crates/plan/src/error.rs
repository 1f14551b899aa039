//! The crate's one error type.
//!
//! Every variant names the offending input and says what would have been
//! valid, because the planner's whole job is to be asked "what if" by a user
//! at a command line.

/// Everything that can go wrong while validating planner input or planning.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// A preset name that is not in the table.
    #[error("unknown model preset `{name}`; valid presets: {valid}")]
    UnknownPreset { name: String, valid: String },

    /// A Hugging Face `config.json` that could not be read or parsed.
    #[error("cannot read model config `{path}`: {reason}")]
    ModelConfig { path: String, reason: String },

    /// A model dimension that is missing, zero or inconsistent.
    #[error("invalid model: {0}")]
    InvalidModel(String),

    /// A parallel layout whose product does not divide the device count, or
    /// that does not divide the model.
    #[error("invalid layout {layout} on {devices} devices: {reason}")]
    InvalidLayout {
        layout: String,
        devices: u64,
        reason: String,
    },

    /// A number outside its range (`name` says which, `valid` the range).
    #[error("invalid {name} = {value}: must be {valid}")]
    OutOfRange {
        name: &'static str,
        value: String,
        valid: String,
    },

    /// A keyword (dtype, mode, …) that is not one of the accepted spellings.
    #[error("unknown {what} `{value}`; valid: {valid}")]
    UnknownKeyword {
        what: &'static str,
        value: String,
        valid: String,
    },

    /// No placement / allocation / layout fits in device memory.
    #[error("no feasible mapping: {0}")]
    NoFeasibleMapping(String),
}

/// The crate's result alias.
pub type Result<T> = std::result::Result<T, PlanError>;

/// `v` as a person reads it in a message: in decimal when that is short
/// (`-5`, `0.5`, `80`), in exponent form far from one (`1e300`, whose
/// decimal form is a 1 and 300 zeros). colo-rl's `Num` follows the same
/// rule for its config values.
pub(crate) fn num(v: f64) -> String {
    let a = v.abs();
    match a != 0.0 && a.is_finite() && !(1e-5..1e16).contains(&a) {
        true => format!("{v:e}"),
        false => format!("{v}"),
    }
}

/// Shorthand for [`PlanError::OutOfRange`].
pub(crate) fn out_of_range(
    name: &'static str,
    value: impl std::fmt::Display,
    valid: impl Into<String>,
) -> PlanError {
    PlanError::OutOfRange {
        name,
        value: value.to_string(),
        valid: valid.into(),
    }
}

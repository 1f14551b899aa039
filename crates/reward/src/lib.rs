//! # colo-reward: a score for a completion given the sample's ground truth
//!
//! Two ways in, one trait:
//!
//! - **From the config**: a [`RewardSpec`] (a run's `[reward]` section,
//!   chosen by `kind`) is turned into a reward by [`build`], a `match` on the
//!   enum — rule-based rewards ([`rules`]; verl's choice of them by each
//!   row's `data_source`, [`verl`]), a [`Weighted`] combination, or an
//!   [`ExternalReward`] (a long-lived child process spoken to in JSON lines,
//!   for rewards written in other languages) — among them a verl-style
//!   Python reward function, run unchanged ([`python`]).
//! - **From Rust**: implement [`Reward`] for your own type.
//!
//! ## Design decisions
//!
//! - **An enum for the config, a trait for code.** Users with Rust rewards
//!   implement [`Reward`]; users in other languages run a child process that
//!   speaks JSON lines; a verl reward function runs unchanged behind that
//!   protocol in the user's own interpreter (no embedded Python).
//! - **Rules never fail on a completion.** An answer that cannot be read
//!   scores 0 (−1 under DAPO's rule, [`dapo`]; that is the model's mistake).
//!   A ground truth that cannot be read, a crashing or misbehaving external
//!   command, or a user reward's error is an [`Error::Score`] naming the
//!   sample and its prompt — or, where configured, a default score
//!   ([`WithDefault`], `default_score` of the external reward) that is
//!   counted ([`Reward::failures`]): a silent default hides bugs.
//! - **No libtorch.** A reward sees text and returns numbers; the crate
//!   builds and tests without the tensor engine. colo-rl scores the rollouts
//!   with it and checks every score with [`finite`].
//!
//! ```
//! use colo_reward::{build, RewardInput, RewardSpec};
//!
//! let spec: RewardSpec = serde_json::from_str(r#"{"kind": "numeric", "after": "Answer:"}"#).unwrap();
//! let mut reward = build(&spec)?;
//! let input = RewardInput {
//!     sample: 0, prompt_id: 0, prompt: "2+2?", completion: "Answer: 4.0",
//!     ground_truth: "4", extra: None,
//! };
//! assert_eq!(reward.score(&input)?, 1.0);
//! # Ok::<(), colo_reward::Error>(())
//! ```

pub mod dapo;
mod error;
mod external;
mod parallel;
pub mod python;
pub mod rules;
pub mod search_r1;
pub mod verl;
mod weighted;

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use error::{Error, Result};
pub use external::{ExternalReward, FINISH_GRACE};
pub use parallel::Parallel;
pub use rules::{BoxedMatch, ExactMatch, FormatReward, NumericMatch};
pub use verl::VerlDefault;
pub use weighted::{Term, Weighted};

/// What a reward sees of one sample.
#[derive(Debug, Clone, Copy)]
pub struct RewardInput<'a> {
    /// The sample's id, unique within a batch (errors name it).
    pub sample: u64,
    /// The prompt it answers (the n samples of a prompt share it).
    pub prompt_id: u64,
    pub prompt: &'a str,
    /// The generated text, special tokens removed.
    pub completion: &'a str,
    pub ground_truth: &'a str,
    /// The dataset row's other fields, for rewards that need more than the
    /// ground truth.
    pub extra: Option<&'a Map<String, Value>>,
}

/// A sample's score and the other numbers its scorer returned: a verl
/// reward function's dict beyond `"score"` (verl's `reward_extra_info`,
/// e.g. `{"score": 1.0, "acc": true}`), which evaluations report as
/// `eval/reward_extra`. Entries that are not numbers are not kept.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scored {
    pub score: f32,
    pub extra: BTreeMap<String, f64>,
}

impl Scored {
    /// A score with nothing beside it.
    pub fn plain(score: f32) -> Self {
        Scored {
            score,
            extra: BTreeMap::new(),
        }
    }

    /// The scores alone, in order (`score_batch` of a reward whose
    /// `score_batch_extra` does the work).
    pub fn scores(scored: Vec<Scored>) -> Vec<f32> {
        scored.into_iter().map(|s| s.score).collect()
    }
}

/// A reward function. Implement it for rewards written in Rust.
pub trait Reward: Send {
    /// A short name for messages and metrics (e.g. `exact_match`).
    fn name(&self) -> String;

    /// The score of one sample, or an error that names it (use
    /// [`RewardInput::fail`]).
    fn score(&mut self, input: &RewardInput<'_>) -> Result<f32>;

    /// Scores of a batch, in order. Override when a batch is cheaper than
    /// its samples one by one (the external reward pipelines its requests).
    fn score_batch(&mut self, inputs: &[RewardInput<'_>]) -> Result<Vec<f32>> {
        inputs.iter().map(|i| self.score(i)).collect()
    }

    /// [`Reward::score_batch`] with the numbers each sample's scorer
    /// returned beside its score ([`Scored::extra`]). Rewards that return
    /// none keep this default: empty extras.
    fn score_batch_extra(&mut self, inputs: &[RewardInput<'_>]) -> Result<Vec<Scored>> {
        Ok(self
            .score_batch(inputs)?
            .into_iter()
            .map(Scored::plain)
            .collect())
    }

    /// Samples so far that failed and got a configured default score
    /// instead of an error (the run logs the increase per step as
    /// `reward/failures`). Rewards that never fall back keep the default, 0.
    fn failures(&self) -> u64 {
        0
    }
}

impl RewardInput<'_> {
    /// The error for this sample failing under `reward`.
    pub fn fail(&self, reward: &str, reason: impl Into<String>) -> Error {
        Error::Score {
            reward: reward.to_owned(),
            sample: self.sample,
            prompt_id: self.prompt_id,
            reason: reason.into(),
        }
    }
}

/// `scored` (the scores of `inputs`, in order) when every score and every
/// number beside it is finite; otherwise an error naming the first sample
/// whose is not. colo-rl checks every reward's scores here, in training and
/// in evaluation, whatever computed them: one infinite score makes its
/// group's advantages, and so every update of its mini-batch, NaN.
pub fn finite(
    reward: &str,
    inputs: &[RewardInput<'_>],
    scored: Vec<Scored>,
) -> Result<Vec<Scored>> {
    for (input, s) in inputs.iter().zip(&scored) {
        if !s.score.is_finite() {
            return Err(input.fail(
                reward,
                format!("its score is {}, not a finite number", s.score),
            ));
        }
        if let Some((name, v)) = s.extra.iter().find(|(_, v)| !v.is_finite()) {
            return Err(input.fail(
                reward,
                format!(
                    "the number `{name}` it returned beside its score is {v}, not a finite number"
                ),
            ));
        }
    }
    Ok(scored)
}

/// A reward as written in the `[reward]` section of a run's config, chosen
/// by `kind`:
///
/// ```toml
/// [reward]
/// kind = "weighted"
/// [[reward.terms]]
/// weight = 0.9
/// reward = { kind = "numeric", tolerance = 1e-6, after = "####" }
/// [[reward.terms]]
/// weight = 0.1
/// reward = { kind = "format", open = "<answer>", close = "</answer>" }
/// ```
/// Each key's doc comment is what `colo train --print-config` says of it
/// (colo-keys): the kinds that have a key are prefixed there.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, colo_keys::Keys)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
#[key(
    tag_doc = "the reward; \"verl\" picks the rule by each row's data_source as verl's default reward does (openai/gsm8k: numeric after \"####\"; lighteval/MATH: boxed)",
    tag_verl = "reward_model / custom_reward_function (verl picks a Python function; by default by data_source)"
)]
pub enum RewardSpec {
    /// 1 if the trimmed completion equals the trimmed ground truth: [`ExactMatch`].
    ExactMatch {},
    /// 1 if the completion's number is within `tolerance` of the ground
    /// truth's: [`NumericMatch`].
    Numeric {
        /// numbers within this are equal
        #[serde(default = "default_tolerance")]
        #[key(unit = "absolute")]
        tolerance: f64,
        /// read the first number after the last occurrence of this marker
        /// (GSM8K: "####")
        #[serde(default)]
        #[key(unit = "text", unset = "the last number of the completion")]
        after: Option<String>,
    },
    /// 1 if the last `\boxed{…}` of the completion matches the ground truth
    /// (as text, or as numbers within `tolerance`): [`BoxedMatch`].
    Boxed {
        #[serde(default = "default_tolerance")]
        tolerance: f64,
    },
    /// 1 if the completion has a non-empty answer between `open` and
    /// `close`: [`FormatReward`].
    Format {
        /// the answer must stand between open…
        #[key(unit = "text")]
        open: String,
        /// …and close
        #[key(unit = "text")]
        close: String,
    },
    /// Σ weight · reward: [`Weighted`].
    Weighted {
        /// Σ weight · reward over these terms; each term's own score is
        /// logged under its name in reward/extra and eval/reward_extra
        #[key(
            unit = "list of {weight, reward = {kind, …}, name (default: its kind, or a python term's function)}"
        )]
        terms: Vec<WeightedTerm>,
    },
    /// verl's default reward, its rule chosen by each row's `data_source`
    /// (GSM8K, MATH): [`VerlDefault`].
    Verl {},
    /// A verl-style Python function (`custom_reward_function` in verl),
    /// called as verl calls it, in a child process: [`python`].
    Python {
        /// the file defining the reward function (relative to the working
        /// directory)
        #[key(unit = "path", verl = "custom_reward_function.path")]
        path: PathBuf,
        /// the function, called as verl calls it: name(data_source=,
        /// solution_str=, ground_truth=, extra_info=, **kwargs), returning a
        /// number or a dict with "score"
        #[serde(default = "default_function")]
        #[key(unit = "identifier", verl = "custom_reward_function.name")]
        name: String,
        /// keyword arguments added to every call
        #[serde(default)]
        #[key(unit = "table", verl = "custom_reward_function.reward_kwargs")]
        kwargs: Map<String, Value>,
        /// the interpreter that runs the function (a virtual environment's
        /// bin/python for one with its imports)
        #[serde(default = "default_python")]
        #[key(unit = "program")]
        python: String,
        /// how long to wait for each answer line (python: and for the file to
        /// load)
        #[serde(default = "default_timeout_s")]
        #[key(unit = "seconds")]
        timeout_s: f64,
        /// the score of a sample the command or function failed on
        #[serde(default)]
        #[key(
            unit = "score",
            unset = "a failure stops the run with an error naming the sample"
        )]
        default_score: Option<f32>,
        /// processes scoring each batch's samples at once (for rewards that
        /// take milliseconds a sample): [`Parallel`]
        #[serde(default = "one")]
        #[key(
            unit = "processes",
            verl = "reward_model.reward_manager = \"prime\" (a process pool)"
        )]
        workers: usize,
    },
    /// A child process spoken to in JSON lines: [`ExternalReward`].
    External {
        /// program and arguments of a child process, started once for the
        /// run: colo writes a JSON line per sample, {"id", "prompt",
        /// "completion", "ground_truth", "row" (the row's other fields)}, and
        /// the child answers each with a line {"id", "score"} (and optionally
        /// "extra": {name: number}), in any order
        #[key(unit = "list of strings")]
        command: Vec<String>,
        // `timeout_s`, `default_score`, `workers`: as `Python`'s.
        #[serde(default = "default_timeout_s")]
        timeout_s: f64,
        #[serde(default)]
        default_score: Option<f32>,
        #[serde(default = "one")]
        workers: usize,
    },
}

/// One term of a weighted reward.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeightedTerm {
    pub weight: f32,
    pub reward: RewardSpec,
    /// The term's key among the reward's extra numbers (its own score, in
    /// `reward/extra` and `eval/reward_extra`); default: its `kind` (a
    /// Python term's function name), numbered from `_2` when repeated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

fn default_tolerance() -> f64 {
    1e-6
}

fn default_timeout_s() -> f64 {
    30.0
}

/// verl's default `custom_reward_function.name`.
fn default_function() -> String {
    "compute_score".into()
}

fn one() -> usize {
    1
}

fn default_python() -> String {
    "python3".into()
}

impl Default for RewardSpec {
    /// The built-in task's reward.
    fn default() -> Self {
        RewardSpec::ExactMatch {}
    }
}

impl RewardSpec {
    /// Checks the settings that serde cannot (`Err` names the field).
    pub fn validate(&self) -> std::result::Result<(), (String, String)> {
        let bad = |f: &str, m: String| Err((f.to_owned(), m));
        match self {
            RewardSpec::Numeric { tolerance, .. } | RewardSpec::Boxed { tolerance }
                if !(tolerance.is_finite() && *tolerance >= 0.0) =>
            {
                bad("tolerance", format!("must be ≥ 0, got {tolerance}"))
            }
            RewardSpec::Format { open, close } if open.is_empty() || close.is_empty() => bad(
                "open",
                "`open` and `close` must both be non-empty".to_owned(),
            ),
            RewardSpec::Weighted { terms } if terms.is_empty() => {
                bad("terms", "a weighted reward needs at least one term".into())
            }
            RewardSpec::Weighted { terms } => terms.iter().try_for_each(|t| {
                if !t.weight.is_finite() {
                    return bad("terms.weight", format!("must be finite, got {}", t.weight));
                }
                t.reward
                    .validate()
                    .map_err(|(f, m)| (format!("terms.reward.{f}"), m))
            }),
            RewardSpec::External { command, .. } if command.is_empty() => {
                bad("command", "must name a program".into())
            }
            RewardSpec::Python { name, .. } if name.is_empty() => {
                bad("name", "must name a function".into())
            }
            RewardSpec::Python { python, .. } if python.is_empty() => {
                bad("python", "must name an interpreter".into())
            }
            RewardSpec::External { workers: 0, .. } | RewardSpec::Python { workers: 0, .. } => {
                bad("workers", "must be at least 1".into())
            }
            RewardSpec::External { timeout_s, .. } | RewardSpec::Python { timeout_s, .. }
                if !(timeout_s.is_finite() && *timeout_s > 0.0) =>
            {
                bad("timeout_s", format!("must be > 0, got {timeout_s}"))
            }
            _ => Ok(()),
        }
    }

    /// Whether the reward takes a ground truth that is a list or an object
    /// (as its JSON text): verl's rules (Search-R1's `{"target": […]}`),
    /// a Python function and an external command get it as the row holds
    /// it, as verl passes it to `compute_score`, and `format` does not read
    /// it. The other rules compare with a string or a number, and the data
    /// reader refuses such a row (colo-rl's `Fields::structured_answers`).
    pub fn takes_structured_ground_truth(&self) -> bool {
        match self {
            RewardSpec::Verl {}
            | RewardSpec::Python { .. }
            | RewardSpec::External { .. }
            | RewardSpec::Format { .. } => true,
            RewardSpec::ExactMatch {} | RewardSpec::Numeric { .. } | RewardSpec::Boxed { .. } => {
                false
            }
            RewardSpec::Weighted { terms } => terms
                .iter()
                .all(|t| t.reward.takes_structured_ground_truth()),
        }
    }
}

/// The reward a spec describes. External commands are started here.
pub fn build(spec: &RewardSpec) -> Result<Box<dyn Reward>> {
    if let Err((field, message)) = spec.validate() {
        return Err(Error::Setup {
            reward: format!("{spec:?}"),
            reason: format!("{field}: {message}"),
        });
    }
    Ok(match spec {
        RewardSpec::ExactMatch {} => Box::new(ExactMatch),
        RewardSpec::Verl {} => Box::new(VerlDefault),
        RewardSpec::Numeric { tolerance, after } => Box::new(NumericMatch {
            tolerance: *tolerance,
            after: after.clone(),
        }),
        RewardSpec::Boxed { tolerance } => Box::new(BoxedMatch {
            tolerance: *tolerance,
        }),
        RewardSpec::Format { open, close } => Box::new(FormatReward {
            open: open.clone(),
            close: close.clone(),
        }),
        RewardSpec::Weighted { terms } => Box::new(Weighted::build(terms)?),
        RewardSpec::Python {
            path,
            name,
            kwargs,
            python,
            timeout_s,
            default_score,
            workers,
        } => processes(*workers, || {
            python::start(
                python,
                path,
                name,
                kwargs,
                std::time::Duration::from_secs_f64(*timeout_s),
                *default_score,
            )
        })?,
        RewardSpec::External {
            command,
            timeout_s,
            default_score,
            workers,
        } => processes(*workers, || {
            ExternalReward::start(
                command.clone(),
                std::time::Duration::from_secs_f64(*timeout_s),
                *default_score,
            )
        })?,
    })
}

/// `workers` processes of one external reward, or the one alone; started
/// at once (a python reward's processes each import the user's file).
fn processes(
    workers: usize,
    start: impl Fn() -> Result<ExternalReward> + Sync,
) -> Result<Box<dyn Reward>> {
    if workers == 1 {
        return Ok(Box::new(start()?));
    }
    let parts = std::thread::scope(|s| {
        let starting: Vec<_> = (0..workers).map(|_| s.spawn(&start)).collect();
        starting
            .into_iter()
            .map(|h| {
                let r = h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))?;
                Ok(Box::new(r) as Box<dyn Reward>)
            })
            .collect::<Result<Vec<_>>>()
    })?;
    Ok(Box::new(Parallel::new(parts)))
}

/// A reward whose failures score `default` instead of stopping the run; the
/// failures are counted (report them, a silent default hides bugs).
pub struct WithDefault<R> {
    pub inner: R,
    pub default: f32,
    pub failures: u64,
}

impl<R: Reward> WithDefault<R> {
    pub fn new(inner: R, default: f32) -> Self {
        WithDefault {
            inner,
            default,
            failures: 0,
        }
    }
}

impl<R: Reward> Reward for WithDefault<R> {
    fn name(&self) -> String {
        self.inner.name()
    }

    fn score(&mut self, input: &RewardInput<'_>) -> Result<f32> {
        match self.inner.score(input) {
            Ok(s) => Ok(s),
            Err(_) => {
                self.failures += 1;
                Ok(self.default)
            }
        }
    }

    /// The inner reward's extras, sample by sample as [`Reward::score`]
    /// (a failed sample: the default and none).
    fn score_batch_extra(&mut self, inputs: &[RewardInput<'_>]) -> Result<Vec<Scored>> {
        let mut out = Vec::with_capacity(inputs.len());
        for input in inputs {
            match self.inner.score_batch_extra(std::slice::from_ref(input)) {
                Ok(mut s) if s.len() == 1 => out.push(s.remove(0)),
                _ => {
                    self.failures += 1;
                    out.push(Scored::plain(self.default));
                }
            }
        }
        Ok(out)
    }

    fn failures(&self) -> u64 {
        self.failures + self.inner.failures()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn input<'a>(completion: &'a str, truth: &'a str) -> RewardInput<'a> {
        RewardInput {
            sample: 3,
            prompt_id: 1,
            prompt: "q",
            completion,
            ground_truth: truth,
            extra: None,
        }
    }

    /// A weighted reward of two rules, as a config writes it.
    pub(crate) const NUMERIC_AND_FORMAT: &str = r#"
        kind = "weighted"
        [[terms]]
        weight = 0.75
        reward = { kind = "numeric", after = "Answer:" }
        [[terms]]
        weight = 0.25
        reward = { kind = "format", open = "<a>", close = "</a>" }
        "#;

    #[test]
    fn spec_parses_verl_like_toml() {
        let spec: RewardSpec = toml::from_str(NUMERIC_AND_FORMAT).unwrap();
        let mut r = build(&spec).unwrap();
        assert_eq!(r.score(&input("<a>Answer: 42</a>", "42")).unwrap(), 1.0);
        assert_eq!(r.score(&input("Answer: 42", "42")).unwrap(), 0.75);
        assert_eq!(r.score(&input("<a>41</a>", "42")).unwrap(), 0.25);
        let s = r
            .score_batch(&[input("<a>Answer: 42</a>", "42"), input("x", "42")])
            .unwrap();
        assert_eq!(s, vec![1.0, 0.0]);
    }

    #[test]
    fn unknown_fields_and_kinds_are_refused() {
        let e = toml::from_str::<RewardSpec>("kind = \"numeric\"\ntolerence = 0.1").unwrap_err();
        assert!(e.to_string().contains("tolerence"), "{e}");
        let e = toml::from_str::<RewardSpec>("kind = \"exact_match\"\nfoo = 1").unwrap_err();
        assert!(e.to_string().contains("foo"), "{e}");
        let e = toml::from_str::<RewardSpec>("kind = \"llm_judge\"").unwrap_err();
        assert!(e.to_string().contains("llm_judge"), "{e}");
    }

    #[test]
    fn invalid_settings_are_setup_errors() {
        let e = build(&RewardSpec::Numeric {
            tolerance: -1.0,
            after: None,
        })
        .err()
        .unwrap();
        assert!(e.to_string().contains("tolerance"), "{e}");
        let e = build(&RewardSpec::Weighted { terms: vec![] })
            .err()
            .unwrap();
        assert!(e.to_string().contains("at least one term"), "{e}");
    }

    struct Picky;
    impl Reward for Picky {
        fn name(&self) -> String {
            "picky".into()
        }
        fn score(&mut self, i: &RewardInput<'_>) -> Result<f32> {
            match i.completion {
                "ok" => Ok(1.0),
                _ => Err(i.fail("picky", "cannot judge")),
            }
        }
    }

    #[test]
    fn user_reward_errors_name_the_sample_or_default() {
        let e = Picky.score(&input("?", "")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "reward `picky` failed on sample 3 (prompt 1): cannot judge"
        );
        let mut d = WithDefault::new(Picky, -1.0);
        let s = d.score_batch(&[input("ok", ""), input("?", "")]).unwrap();
        assert_eq!((s, d.failures), (vec![1.0, -1.0], 1));
    }

    #[test]
    fn a_default_keeps_the_extras_of_the_samples_that_scored() {
        let terms = vec![WeightedTerm {
            weight: 1.0,
            reward: RewardSpec::ExactMatch {},
            name: Some("em".into()),
        }];
        let mut d = WithDefault::new(Weighted::build(&terms).unwrap(), -1.0);
        let s = d
            .score_batch_extra(&[input("a", "a"), input("b", "a")])
            .unwrap();
        assert_eq!(Scored::scores(s.clone()), vec![1.0, 0.0]);
        assert_eq!(s[0].extra.get("em"), Some(&1.0));
        assert_eq!(s[1].extra.get("em"), Some(&0.0));
        let mut d = WithDefault::new(Picky, -1.0);
        let s = d
            .score_batch_extra(&[input("ok", ""), input("?", "")])
            .unwrap();
        assert_eq!(s, vec![Scored::plain(1.0), Scored::plain(-1.0)]);
        assert_eq!(d.failures, 1);
    }
}

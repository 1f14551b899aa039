//! Prompts from JSONL or parquet files, and the batches of them a run
//! trains on.
//!
//! A file is parquet if it starts with parquet's magic bytes (verl's
//! datasets; see [`parquet`]), else JSONL: one object per line. Either way
//! each record is a JSON object. The prompt field (`prompt_key`, default `prompt`) is
//! a plain string, or a chat — a list of `{"role", "content"}` messages,
//! rendered with the tokenizer's chat template and a generation prompt. The
//! answer field (`answer_key`, default `answer`; a dotted path such as verl's
//! `reward_model.ground_truth` reaches into objects) is the ground truth the
//! reward compares with: a string, or a number as written; a list or an
//! object only for rewards that take one ([`Fields::structured_answers`]),
//! as its JSON text. The line's other fields ride along for rewards that
//! need them.
//!
//! Batches: each epoch is a seeded permutation of the prompts, cut into
//! batches of `train_batch_size` (a last, short batch is dropped, as verl's
//! `drop_last`). [`Batches::batch`] computes any step's batch directly, so a
//! resumed run sees exactly the prompts an uninterrupted one would.

use std::path::{Path, PathBuf};

use colo_model::{ChatMessage, Tokenizer};
use serde_json::{Map, Value};

use crate::rng::SplitMix64;
use crate::{Error, Result};

mod parquet;

/// Where verl's datasets keep the ground truth.
const VERL_ANSWER: &str = "reward_model.ground_truth";

/// Where in a line the prompt and the answer are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fields {
    pub prompt_key: String,
    /// A key, or a dotted path into nested objects.
    pub answer_key: String,
    /// Whether an answer that is a list or an object is read (as its JSON
    /// text), for rewards that take one
    /// ([`crate::RewardSpec::takes_structured_ground_truth`]); otherwise
    /// such a row is an error naming its file, line and field, as a rule
    /// that compares text would score it 0 without a word. Set from the
    /// run's reward when its config is read; `false` by default.
    pub structured_answers: bool,
}

impl Default for Fields {
    fn default() -> Self {
        Fields {
            prompt_key: "prompt".into(),
            answer_key: "answer".into(),
            structured_answers: false,
        }
    }
}

/// A reward's error about one of `prompts`, with where that prompt was read
/// (`file:line`): a ground truth a rule cannot read is mended in the data.
pub(crate) fn with_origin<'a>(
    e: crate::reward::Error,
    prompts: impl IntoIterator<Item = &'a Prompt>,
) -> Error {
    let origin = match &e {
        crate::reward::Error::Score { prompt_id, .. } => (prompts.into_iter())
            .find(|p| p.prompt_id == *prompt_id && !p.origin.is_empty())
            .map(|p| p.origin.clone()),
        _ => None,
    };
    match origin {
        Some(origin) => Error::context(format!("the prompt of {origin}"), e),
        None => e.into(),
    }
}

/// One prompt of a dataset.
#[derive(Debug, Clone, PartialEq)]
pub struct Prompt {
    /// Its index in the dataset it was loaded into; the n samples generated
    /// for it carry it, which is how group advantages (GRPO) find groups.
    pub prompt_id: u64,
    /// The text given to the model (a chat already rendered).
    pub text: String,
    /// Whether `text` is a rendered chat: the template wrote the special
    /// tokens it wants (Llama 3's BOS among them), so the text is encoded
    /// without the tokenizer adding its own, as verl and transformers'
    /// `apply_chat_template` do; a plain prompt gets them.
    pub chat: bool,
    /// The answer field as text (numbers as written, other JSON as JSON).
    pub ground_truth: String,
    /// The line's other fields.
    pub extra: Map<String, Value>,
    /// Where it was read (`file:line`, `file: row N`), for messages about
    /// it; empty for prompts made in code.
    pub origin: String,
}

impl Prompt {
    /// The prompt's token ids, encoded as the run encodes it (see
    /// [`Prompt::chat`]).
    pub fn encode(&self, tok: &Tokenizer) -> Result<Vec<u32>> {
        Ok(tok.encode(&self.text, !self.chat)?)
    }
}

/// A list of prompts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Dataset {
    pub prompts: Vec<Prompt>,
    /// Prompts left out for being longer than `max_prompt_length`
    /// ([`Overlong::Drop`]).
    pub dropped_overlong: usize,
}

/// What a prompt longer than `max_prompt_length` does when it is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overlong {
    /// Stops the read with an error naming it (verl's `truncation =
    /// "error"`: a silently cut prompt would train on a different
    /// question).
    Error,
    /// Leaves it out and counts it (verl's `filter_overlong_prompts`).
    Drop,
}

/// The length check of a read: the tokenizer, the limit, and what a
/// longer prompt does.
#[derive(Clone, Copy)]
struct Limit<'a> {
    tok: &'a Tokenizer,
    max: usize,
    overlong: Overlong,
}

/// How many of `n` prompts [`Dataset::split`] holds out for `fraction`:
/// the nearest whole number, at least one.
pub fn held_out_count(n: usize, fraction: f64) -> usize {
    ((n as f64) * fraction).round().max(1.0) as usize
}

impl Dataset {
    /// Loads and concatenates JSONL or parquet files; prompt ids run over
    /// all of them.
    /// `tokenizer` renders chat prompts (needed only if there are any).
    pub fn from_files(
        paths: &[PathBuf],
        fields: &Fields,
        tokenizer: Option<&Tokenizer>,
    ) -> Result<Self> {
        Self::read(paths, fields, tokenizer, None)
    }

    /// As [`Dataset::from_files`], and every prompt is measured against
    /// `max_prompt_length` tokens as the run encodes it (the tokenizer's
    /// special tokens included), before anything runs: a longer one is an
    /// error naming the file, the line and both lengths, or is left out
    /// and counted in [`Dataset::dropped_overlong`] (`overlong`).
    pub fn from_files_max_len(
        paths: &[PathBuf],
        fields: &Fields,
        tokenizer: &Tokenizer,
        max_prompt_length: usize,
        overlong: Overlong,
    ) -> Result<Self> {
        let limit = Limit {
            tok: tokenizer,
            max: max_prompt_length,
            overlong,
        };
        Self::read(paths, fields, Some(tokenizer), Some(limit))
    }

    fn read(
        paths: &[PathBuf],
        fields: &Fields,
        tokenizer: Option<&Tokenizer>,
        limit: Option<Limit>,
    ) -> Result<Self> {
        let mut data = Dataset::default();
        for path in paths {
            data.read_file(path, fields, tokenizer, limit)?;
        }
        if data.prompts.is_empty() {
            let dropped = match (data.dropped_overlong, limit) {
                (0, _) | (_, None) => String::new(),
                (n, Some(l)) => format!(
                    " ({n} left out as longer than data.max_prompt_length = {} tokens)",
                    l.max
                ),
            };
            return Err(Error::Dataset(format!("no prompts in {paths:?}{dropped}")));
        }
        Ok(data)
    }

    fn read_file(
        &mut self,
        path: &Path,
        fields: &Fields,
        tok: Option<&Tokenizer>,
        limit: Option<Limit>,
    ) -> Result<()> {
        if path.is_dir() {
            return Err(Error::Dataset(format!(
                "{}: a directory; data.train_files and data.val_files name JSONL or parquet files",
                path.display()
            )));
        }
        if !path.is_file() {
            return Err(Error::MissingFile {
                what: "dataset",
                path: path.to_owned(),
            });
        }
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        let parquet_name = path.extension().is_some_and(|e| e == "parquet");
        if parquet_name && !bytes.starts_with(parquet::MAGIC) {
            return Err(Error::Dataset(format!(
                "{}: named .parquet but not a parquet file (it does not start with `PAR1`)",
                path.display()
            )));
        }
        if bytes.starts_with(parquet::MAGIC) {
            for (i, row) in parquet::rows(path)?.into_iter().enumerate() {
                let bad = |field: Option<&str>, message: String| Error::DataRow {
                    path: path.to_owned(),
                    row: i + 1,
                    field: field.map(str::to_owned),
                    message,
                };
                let origin = format!("{}: row {}", path.display(), i + 1);
                self.push(row, origin, &bad, fields, tok, limit)?;
            }
            return Ok(());
        }
        let text = String::from_utf8(bytes).map_err(|e| {
            let at = e.utf8_error().valid_up_to();
            let line = 1 + e.as_bytes()[..at].iter().filter(|&&b| b == b'\n').count();
            Error::Dataset(format!(
                "{}:{line}: neither JSONL (not UTF-8 text at byte {at}) nor parquet",
                path.display()
            ))
        })?;
        // A byte-order mark (some Windows editors write one) is not JSON.
        let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let bad = |field: Option<&str>, message: String| Error::Data {
                path: path.to_owned(),
                line: i + 1,
                field: field.map(str::to_owned),
                message,
            };
            let row: Value =
                serde_json::from_str(line).map_err(|e| bad(None, format!("not JSON: {e}")))?;
            let origin = format!("{}:{}", path.display(), i + 1);
            self.push(row, origin, &bad, fields, tok, limit)?;
        }
        Ok(())
    }

    /// Adds one record (a JSONL line or a parquet row); `bad` makes the
    /// error naming where it is.
    fn push(
        &mut self,
        row: Value,
        origin: String,
        bad: &dyn Fn(Option<&str>, String) -> Error,
        fields: &Fields,
        tok: Option<&Tokenizer>,
        limit: Option<Limit>,
    ) -> Result<()> {
        let Value::Object(mut row) = row else {
            return Err(bad(None, "expected a JSON object".into()));
        };
        let pk = fields.prompt_key.as_str();
        let prompt = row
            .remove(pk)
            .ok_or_else(|| bad(Some(pk), "missing".into()))?;
        let text =
            prompt_text(&prompt, tok).map_err(|(sub, m)| bad(Some(&format!("{pk}{sub}")), m))?;
        if text.is_empty() {
            // The engine cannot generate from no tokens: say so here, not
            // at the step that draws this prompt.
            return Err(bad(Some(pk), "is empty".into()));
        }
        let chat = prompt.is_array();
        if let Some(Limit { tok, max, overlong }) = limit {
            let n = tok.encode(&text, !chat)?.len();
            match overlong {
                _ if n <= max => {}
                Overlong::Error => {
                    return Err(bad(
                        Some(pk),
                        format!(
                            "the prompt has {n} tokens, more than data.max_prompt_length = \
                             {max} (data.filter_overlong_prompts = true leaves such prompts out)"
                        ),
                    ))
                }
                Overlong::Drop => {
                    self.dropped_overlong += 1;
                    return Ok(());
                }
            }
        }
        let ak = fields.answer_key.as_str();
        let answer = lookup(&row, ak).ok_or_else(|| {
            let verl = lookup(&row, VERL_ANSWER).is_some();
            bad(
                Some(ak),
                match verl {
                    true => format!(
                        "missing (this is verl's layout: set data.answer_key = \"{VERL_ANSWER}\")"
                    ),
                    false => "missing".into(),
                },
            )
        })?;
        let ground_truth = match answer {
            Value::String(s) => s.clone(),
            Value::Null => return Err(bad(Some(ak), "is null".into())),
            Value::Array(_) | Value::Object(_) if !fields.structured_answers => {
                let what = match answer.is_array() {
                    true => "a list",
                    false => "an object",
                };
                return Err(bad(
                    Some(ak),
                    format!(
                        "is {what}; the reward compares with a string or a number (a list or \
                         an object is taken by reward.kind = \"verl\", \"python\" and \
                         \"external\", as its JSON text)"
                    ),
                ));
            }
            other => other.to_string(),
        };
        self.prompts.push(Prompt {
            prompt_id: self.prompts.len() as u64,
            text,
            chat,
            ground_truth,
            extra: row,
            origin,
        });
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.prompts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.prompts.is_empty()
    }

    /// Splits off a held-out set: `fraction` of the prompts (at least one),
    /// chosen by a seeded shuffle; returns `(train, eval)`. Prompt ids are
    /// kept, so they stay unique across both.
    pub fn split(self, fraction: f64, seed: u64) -> Result<(Dataset, Dataset)> {
        let n = self.len();
        let n_eval = held_out_count(n, fraction);
        if !(fraction > 0.0 && fraction < 1.0) || n_eval >= n {
            return Err(Error::Dataset(format!(
                "cannot hold out a fraction {fraction} of {n} prompts and keep some to train on"
            )));
        }
        let mut order: Vec<usize> = (0..n).collect();
        SplitMix64::derive(seed, 0x5EED_5917).shuffle(&mut order);
        let mut is_eval = vec![false; n];
        order[..n_eval].iter().for_each(|&i| is_eval[i] = true);
        let mut train = Dataset {
            dropped_overlong: self.dropped_overlong,
            ..Dataset::default()
        };
        let mut eval = Dataset::default();
        for (p, e) in self.prompts.into_iter().zip(is_eval) {
            if e { &mut eval } else { &mut train }.prompts.push(p);
        }
        Ok((train, eval))
    }
}

/// The prompt's text; `Err((sub-field, message))` names where it went wrong.
fn prompt_text(
    v: &Value,
    tok: Option<&Tokenizer>,
) -> std::result::Result<String, (String, String)> {
    let items = match v {
        Value::String(s) => return Ok(s.clone()),
        Value::Array(items) => items,
        _ => {
            return Err((
                String::new(),
                "expected a string or a list of chat messages".into(),
            ))
        }
    };
    if items.is_empty() {
        return Err((String::new(), "an empty list of chat messages".into()));
    }
    let mut messages = Vec::with_capacity(items.len());
    for (i, m) in items.iter().enumerate() {
        let get = |key: &str| {
            m.get(key)
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| (format!("[{i}].{key}"), "expected a string".to_owned()))
        };
        messages.push(ChatMessage {
            role: get("role")?,
            content: get("content")?,
        });
    }
    let tok = tok.ok_or_else(|| {
        (
            String::new(),
            "chat messages need a tokenizer with a chat template".to_owned(),
        )
    })?;
    tok.render_chat(&messages, true)
        .map_err(|e| (String::new(), e.to_string()))
}

/// `a.b.c` in nested objects.
fn lookup<'a>(row: &'a Map<String, Value>, path: &str) -> Option<&'a Value> {
    let mut parts = path.split('.');
    let mut v = row.get(parts.next()?)?;
    for p in parts {
        v = v.get(p)?;
    }
    Some(v)
}

/// One step's prompts.
#[derive(Debug, Clone)]
pub struct Batch<'a> {
    /// The training step (0-based) this batch is for.
    pub step: usize,
    pub epoch: usize,
    pub prompts: Vec<&'a Prompt>,
    /// With a tensor-parallel rollout: the prompts the rank's group
    /// generates together (its engines compute as one), and where
    /// `prompts` start among them.
    pub group: Option<(Vec<&'a Prompt>, usize)>,
}

/// The batches of a dataset, epoch after epoch: see the module doc.
#[derive(Debug, Clone)]
pub struct Batches<'a> {
    data: &'a Dataset,
    batch_size: usize,
    seed: u64,
    shuffle: bool,
}

impl<'a> Batches<'a> {
    /// Batches of `batch_size` prompts, which the setting `key` (for
    /// messages: `data.train_batch_size`) gave.
    pub fn new(
        data: &'a Dataset,
        batch_size: usize,
        seed: u64,
        shuffle: bool,
        key: &str,
    ) -> Result<Self> {
        if batch_size == 0 || batch_size > data.len() {
            return Err(Error::Dataset(format!(
                "{key} = {batch_size}, but the training set has {} prompts: \
                 a batch takes between 1 and all of them",
                data.len()
            )));
        }
        Ok(Batches {
            data,
            batch_size,
            seed,
            shuffle,
        })
    }

    /// A run's generation batches of `data`: `data.gen_batch_size` prompts
    /// with dynamic sampling, else the step's `data.train_batch_size`.
    pub fn of_run(data: &'a Dataset, config: &crate::Config) -> Result<Self> {
        let key = match config.algorithm.filter_groups.enable {
            true => "data.gen_batch_size",
            false => "data.train_batch_size",
        };
        let (seed, shuffle) = (config.data_seed(), config.data.shuffle);
        Self::new(data, config.batch.gen_batch_prompts, seed, shuffle, key)
    }

    pub fn batches_per_epoch(&self) -> usize {
        self.data.len() / self.batch_size
    }

    /// The order of the prompts in `epoch`.
    fn permutation(&self, epoch: usize) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.data.len()).collect();
        if self.shuffle {
            SplitMix64::derive(self.seed, epoch as u64).shuffle(&mut order);
        }
        order
    }

    /// The batch of training step `step`.
    pub fn batch(&self, step: usize) -> Batch<'a> {
        let per_epoch = self.batches_per_epoch();
        let (epoch, k) = (step / per_epoch, step % per_epoch);
        let order = self.permutation(epoch);
        Batch {
            step,
            epoch,
            prompts: order[k * self.batch_size..(k + 1) * self.batch_size]
                .iter()
                .map(|&i| &self.data.prompts[i])
                .collect(),
            group: None,
        }
    }

    /// Batches from `first_step` on, without end (the caller stops after its
    /// total steps).
    pub fn from_step(&self, first_step: usize) -> impl Iterator<Item = Batch<'a>> + '_ {
        (first_step..).map(|s| self.batch(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "data.train_batch_size";

    fn data(n: usize) -> Dataset {
        Dataset {
            prompts: (0..n as u64)
                .map(|i| Prompt {
                    prompt_id: i,
                    text: format!("{i}+0="),
                    chat: false,
                    ground_truth: i.to_string(),
                    extra: Map::new(),
                    origin: String::new(),
                })
                .collect(),
            ..Dataset::default()
        }
    }

    /// colo-reward's errors reach colo-rl's with their messages as they
    /// were, and a sample's error is given its prompt's file and line.
    #[test]
    fn reward_errors_keep_their_message_and_gain_the_prompts_origin() {
        let score = || crate::reward::Error::Score {
            reward: "numeric".into(),
            sample: 9,
            prompt_id: 1,
            reason: "cannot read the ground truth \"x\"".into(),
        };
        let mut d = data(3);
        assert_eq!(
            with_origin(score(), &d.prompts).to_string(),
            "reward `numeric` failed on sample 9 (prompt 1): cannot read the ground truth \"x\""
        );
        d.prompts[1].origin = "train.jsonl:2".into();
        let e = with_origin(score(), &d.prompts);
        assert_eq!(
            e.to_string(),
            "the prompt of train.jsonl:2: reward `numeric` failed on sample 9 (prompt 1): \
             cannot read the ground truth \"x\""
        );
        let setup = crate::reward::Error::Setup {
            reward: "external `score.py`".into(),
            reason: "cannot start `score.py`: not found".into(),
        };
        let e = with_origin(setup, &d.prompts);
        assert!(
            matches!(e, Error::Reward(crate::reward::Error::Setup { .. })),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "reward `external `score.py``: cannot start `score.py`: not found"
        );
    }

    #[test]
    fn epochs_are_seeded_permutations_and_drop_the_last_batch() {
        let d = data(10);
        let b = Batches::new(&d, 3, 7, true, KEY).unwrap();
        assert_eq!(b.batches_per_epoch(), 3);
        let ids =
            |s: usize| -> Vec<u64> { b.batch(s).prompts.iter().map(|p| p.prompt_id).collect() };
        let mut epoch0: Vec<u64> = (0..3).flat_map(ids).collect();
        assert_eq!(epoch0.len(), 9);
        epoch0.sort();
        epoch0.dedup();
        assert_eq!(epoch0.len(), 9, "no prompt twice in an epoch");
        assert_eq!(b.batch(3).epoch, 1);
        assert_ne!(ids(0), ids(3), "each epoch has its own order");
        let again = Batches::new(&d, 3, 7, true, KEY).unwrap();
        assert_eq!(
            again.batch(4).prompts,
            b.batch(4).prompts,
            "same seed, same batches"
        );
        let other = Batches::new(&d, 3, 8, true, KEY).unwrap();
        assert_ne!(other.batch(0).prompts, b.batch(0).prompts);
        let resumed: Vec<_> = b.from_step(2).take(2).map(|x| x.step).collect();
        assert_eq!(resumed, vec![2, 3]);
        let plain = Batches::new(&d, 5, 7, false, KEY).unwrap();
        assert_eq!(plain.batch(1).prompts[0].prompt_id, 5);
    }

    #[test]
    fn batch_size_must_fit() {
        assert!(Batches::new(&data(4), 5, 0, true, KEY).is_err());
        assert!(Batches::new(&data(4), 0, 0, true, KEY).is_err());
    }

    #[test]
    fn split_holds_out_a_seeded_fraction() {
        let (train, eval) = data(100).split(0.1, 3).unwrap();
        assert_eq!((train.len(), eval.len()), (90, 10));
        let (_, eval2) = data(100).split(0.1, 3).unwrap();
        assert_eq!(eval, eval2);
        assert!(eval
            .prompts
            .iter()
            .all(|e| !train.prompts.iter().any(|t| t.prompt_id == e.prompt_id)));
        assert!(data(3).split(0.9, 0).is_err());
        assert!(data(3).split(0.0, 0).is_err());
    }

    #[test]
    fn dotted_answer_path() {
        let row: Map<String, Value> =
            serde_json::from_str(r#"{"reward_model": {"ground_truth": 7}}"#).unwrap();
        assert_eq!(
            lookup(&row, "reward_model.ground_truth"),
            Some(&Value::from(7))
        );
        assert_eq!(lookup(&row, "reward_model.style"), None);
    }
}

//! The run's checkpoints, `checkpoints/step-N` (N: RL steps done).
//!
//! Each is written atomically by colo-train (a temporary sibling directory,
//! renamed into place; see `colo_train::checkpoint`) and is a complete
//! Hugging Face model directory: `config.json` and `model.safetensors`, the
//! starting model's tokenizer files and `generation_config.json` (one made
//! from the model's config when the starting model has none), so that
//! `colo generate --model …/step-N` and `model.path = "…/step-N"` load it.
//! Beside them, the optimizer state and `trainer_state.json`
//! (`global_step`: RL steps, `optimizer_steps`: optimizer steps), written
//! last, for a LoRA run the adapter in `lora_adapter/` (PEFT's format;
//! `model.safetensors` is then the merged model, and a resume reads the
//! adapter, colo-train's `lora`), for a GAE run the critic in `critic/`,
//! and `worker_state.json`:
//! what the memory choreography learnt of the steps so far (the largest
//! step, whether the reference stays resident), so that a resumed run
//! keeps and gives up what the uninterrupted one would have (optional:
//! older checkpoints resume without it), and `data_state.json`: the
//! generation batches drawn from the training data ([`DataState`]; a step
//! draws one, or more with dynamic sampling), so that a resumed run
//! continues where the uninterrupted one would (optional too: without it,
//! one batch a step).
//!
//! `--resume` continues from the newest *complete* checkpoint
//! ([`latest_complete`]): one whose `trainer_state.json` reads, whose
//! weights, optimizer state and config are there (and a complete
//! `critic/` when the run has a critic), and whose `global_step` (when it
//! has one) is its N. Newer directories that are not are skipped
//! with the reason, and the run says so.

use std::path::{Path, PathBuf};

use colo_model::ModelConfig;
use serde_json::{json, Value};

use crate::{Error, Result};

/// The directory of the checkpoints in a run directory.
pub const DIR: &str = "checkpoints";

/// Where a checkpoint holds the critic of a GAE run (a colo-train
/// checkpoint of the value model).
pub const CRITIC_DIR: &str = "critic";

/// Where a checkpoint says where the run is in its training data.
pub const DATA_STATE_FILE: &str = "data_state.json";

/// `data_state.json`: the generation batches a run has drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataState {
    /// Generation batches drawn so far (the next one's index).
    pub gen_batches: usize,
    /// Their size in prompts (`data.gen_batch_size`).
    pub gen_batch_size: usize,
}

impl DataState {
    /// Writes `dir/data_state.json`.
    pub fn write(&self, dir: &Path) -> Result<()> {
        let path = dir.join(DATA_STATE_FILE);
        let text = serde_json::to_string_pretty(self)? + "\n";
        std::fs::write(&path, text).map_err(|e| Error::io(&path, e))
    }

    /// The state of checkpoint `dir`, if it has one.
    pub fn read(dir: &Path) -> Result<Option<Self>> {
        let path = dir.join(DATA_STATE_FILE);
        if !path.exists() {
            return Ok(None);
        }
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        let state = serde_json::from_str(&text).map_err(|e| {
            Error::Resume(format!(
                "{}: {e} (expected {{\"gen_batches\": N, \"gen_batch_size\": N}})",
                path.display()
            ))
        })?;
        Ok(Some(state))
    }

    /// Why this state cannot be that of a run after `step` steps, if it
    /// cannot: a step draws at least one batch, and the prompts drawn are
    /// a number. (No upper bound: the run that wrote it may have had
    /// dynamic sampling without a limit, whatever the config is now.)
    pub fn implausible(&self, step: usize) -> Option<String> {
        if self.gen_batches < step {
            return Some(format!(
                "gen_batches = {} cannot follow {step} steps, which draw at least one generation \
                 batch each",
                self.gen_batches
            ));
        }
        if self.gen_batch_size == 0 || self.gen_batches.checked_mul(self.gen_batch_size).is_none() {
            return Some(format!(
                "gen_batches = {} of gen_batch_size = {} prompts is not a count of prompts",
                self.gen_batches, self.gen_batch_size
            ));
        }
        None
    }

    /// The generation batch a run resumed at `step` from the checkpoint
    /// `dir` continues at, with batches of `batch_size` prompts, and what
    /// to say about it when that is not simply where the checkpoint was;
    /// `dynamic`: whether steps may draw more than one batch (dynamic
    /// sampling).
    pub fn resume(
        dir: &Path,
        step: usize,
        batch_size: usize,
        dynamic: bool,
    ) -> Result<(usize, Option<String>)> {
        let saved = DataState::read(dir)?;
        if let Some(why) = saved.and_then(|s| s.implausible(step)) {
            return Err(Error::Resume(format!(
                "{}: {why}; the file is damaged (delete it to continue at one batch a step)",
                dir.join(DATA_STATE_FILE).display()
            )));
        }
        let (at, note) = DataState::resume_at(saved, step, batch_size);
        let note = match (saved, dynamic) {
            (None, true) => Some(format!(
                "--resume: {} has no {DATA_STATE_FILE}; the data continue at generation batch \
                 {step}, one a step, which repeats prompts if its steps drew more",
                dir.display()
            )),
            _ => note,
        };
        Ok((at, note))
    }

    /// The generation batch a run resumed at `step` from checkpoint state
    /// `saved` continues at, with batches of `batch_size` prompts; and what
    /// to say about it when that is not simply where the checkpoint was.
    pub fn resume_at(
        saved: Option<DataState>,
        step: usize,
        batch_size: usize,
    ) -> (usize, Option<String>) {
        match saved {
            // Written before the file existed: one batch a step.
            None => (step, None),
            Some(s) if s.gen_batch_size == batch_size => (s.gen_batches, None),
            Some(s) => {
                let prompts = s.gen_batches.saturating_mul(s.gen_batch_size);
                let at = prompts / batch_size.max(1);
                let note = format!(
                    "--resume: the checkpoint drew {} generation batches of {} prompts, and \
                     batches are now {batch_size} prompts; the data continue at batch {at} (the \
                     order differs from an uninterrupted run's)",
                    s.gen_batches, s.gen_batch_size
                );
                (at, Some(note))
            }
        }
    }
}

/// What [`latest_complete`] found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Found {
    /// The newest complete checkpoint: (its step, its directory).
    pub latest: Option<(usize, PathBuf)>,
    /// Newer `step-N` directories that are not complete checkpoints, newest
    /// first, each with the reason.
    pub skipped: Vec<(PathBuf, String)>,
}

/// The checkpoint of RL step `step` in the checkpoints directory `dir`:
/// `dir/step-N`.
pub fn step_dir(dir: &Path, step: usize) -> PathBuf {
    dir.join(format!("step-{step}"))
}

/// `dir/step-N` directories, newest first (none if `dir` does not exist).
pub fn step_dirs(dir: &Path) -> Result<Vec<(usize, PathBuf)>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(dir, e)),
    };
    let mut out = Vec::new();
    for e in entries {
        let e = e.map_err(|e| Error::io(dir, e))?;
        let name = e.file_name();
        let Some(step) = name
            .to_str()
            .and_then(|n| n.strip_prefix("step-"))
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|n| n.parse::<usize>().ok())
        else {
            continue;
        };
        out.push((step, e.path()));
    }
    out.sort_by_key(|s| std::cmp::Reverse(s.0));
    Ok(out)
}

/// Why `dir` (named `step-{step}`) is not a complete checkpoint, if it is
/// not; `critic`: the run has a critic, which the checkpoint must hold.
pub fn incomplete(dir: &Path, step: usize, critic: bool) -> Option<String> {
    let check = |d: &Path| match colo_train::checkpoint::check_complete(d) {
        Err(e) => Some(e.to_string()),
        Ok(s) => match s.global_step {
            Some(g) if g != step as u64 => Some(format!(
                "its trainer_state.json says global_step {g}, not {step}"
            )),
            _ => None,
        },
    };
    check(dir).or_else(|| critic.then(|| check(&dir.join(CRITIC_DIR))).flatten())
}

/// The newest complete checkpoint in `dir` (see [`incomplete`]), and the
/// newer directories skipped on the way.
///
/// A checkpoint complete but for a `critic/` it never had was written by a
/// run without a critic (each checkpoint, critic included, is renamed into
/// place at once): resuming it with a critic is refused, naming the
/// mismatch, rather than skipped for an older checkpoint of the other
/// estimator, which would rewind the run and drop the steps after it.
pub fn latest_complete(dir: &Path, critic: bool) -> Result<Found> {
    let mut found = Found::default();
    for (step, path) in step_dirs(dir)? {
        // The actor's part is read once; the critic's only when it counts.
        let why = match incomplete(&path, step, false) {
            None if critic && !path.join(CRITIC_DIR).exists() => {
                return Err(Error::Resume(format!(
                    "{} holds no critic (`{CRITIC_DIR}/`): the run that wrote it had \
                     none, and this config's `algorithm.adv_estimator = \"gae\"` needs one. \
                     Resume with the estimator the run used, or start the GAE run in another \
                     directory (--out)",
                    path.display()
                )))
            }
            None if critic => incomplete(&path.join(CRITIC_DIR), step, false),
            why => why,
        };
        match why {
            Some(why) => found.skipped.push((path, why)),
            None => {
                found.latest = Some((step, path));
                break;
            }
        }
    }
    Ok(found)
}

/// What of an earlier run the run directory `out` holds, if anything a
/// run from scratch would overwrite: its checkpoints, and the steps and
/// evaluations recorded in its `metrics.jsonl` (a run stopped before its
/// first evaluation leaves nothing worth keeping).
pub fn earlier_run(out: &Path) -> Result<Option<String>> {
    let mut what = Vec::new();
    let steps = step_dirs(&out.join(DIR))?;
    if !steps.is_empty() {
        let names: Vec<String> = steps.iter().map(|(s, _)| format!("step-{s}")).collect();
        what.push(format!("{DIR}/{}", names.join(", ")));
    }
    let metrics = out.join("metrics.jsonl");
    if metrics.is_file() {
        match crate::metrics::read(&metrics) {
            Ok(records) => {
                let steps = (records.iter())
                    .filter(|r| matches!(r, crate::metrics::Record::Step(_)))
                    .count();
                // An evaluation is work too (`trainer.val_only` does
                // nothing else).
                let evals = records.len() - steps;
                let count = |n: usize, one: &str| match n {
                    0 => None,
                    1 => Some(format!("1 {one}")),
                    n => Some(format!("{n} {one}s")),
                };
                let counted: Vec<String> = [count(steps, "step"), count(evals, "evaluation")]
                    .into_iter()
                    .flatten()
                    .collect();
                if !counted.is_empty() {
                    what.push(format!("{} in metrics.jsonl", counted.join(" and ")));
                }
            }
            Err(_) => what.push("metrics.jsonl".into()),
        }
    }
    Ok((!what.is_empty()).then(|| what.join("; ")))
}

/// `out` if a run from scratch may write into it, else the first of
/// `out-2`, `out-3`, … that holds no earlier run ([`earlier_run`]) and
/// no run under way ([`crate::run_lock`]): the
/// default run directory is numbered, never overwritten, as Lightning
/// numbers `version_N`.
pub fn next_free_dir(out: &Path) -> Result<PathBuf> {
    let mut dir = out.to_owned();
    for n in 2.. {
        if earlier_run(&dir)?.is_none() && !dir.is_file() && !crate::run_lock::in_use(&dir) {
            break;
        }
        dir = PathBuf::from(format!("{}-{n}", out.display()));
    }
    Ok(dir)
}

/// An error if a run from scratch into `out` would overwrite an earlier
/// run's work ([`earlier_run`]); `resume`: `--resume` was asked for and
/// found no complete checkpoint.
///
/// The error says the way on, and the two commands agree: a directory
/// with a complete checkpoint is continued by `--resume`; one whose run
/// wrote no checkpoint at all (it failed or was killed before its first
/// save) is started again from step 0 by `--resume`, replacing its
/// records, as verl's `resume_mode = "auto"` starts afresh where it finds
/// no checkpoint (`--resume` is then no error); one whose checkpoints are
/// all incomplete is refused both ways, since an interrupted save may
/// hold the only copy of a step.
pub fn check_fresh_start(out: &Path, resume: bool) -> Result<()> {
    let Some(what) = earlier_run(out)? else {
        return Ok(());
    };
    let ckpts = out.join(DIR);
    let how = if step_dirs(&ckpts)?.is_empty() {
        if resume {
            return Ok(());
        }
        "it wrote no checkpoint; --resume starts it again from step 0, replacing its records"
    } else if !resume && latest_complete(&ckpts, false)?.latest.is_some() {
        "--resume continues it"
    } else {
        "no checkpoint of it is complete, so --resume cannot continue it, and starting from \
         scratch would overwrite it"
    };
    Err(Error::RunExists {
        dir: out.to_owned(),
        what,
        how,
    })
}

/// Readies the checkpoints directory `dir` before a run's first step:
/// creates it and checks that a checkpoint can be written there (a
/// read-only directory is an error now, not after the steps it would
/// have saved), and removes what a crash during an earlier save left:
/// `.step-N.tmp-*` and `.step-N.old-*` directories beside a complete
/// `step-N` (without one they may hold its only copy, and are left and
/// named). Returns what it removed, for the run's notes.
pub fn prepare_dir(dir: &Path, critic: bool) -> Result<Vec<String>> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    tempfile::Builder::new()
        .prefix(".colo-write-check-")
        .tempdir_in(dir)
        .and_then(|t| t.close())
        .map_err(|e| Error::io(dir, e))?;
    let mut notes = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let path = entry.map_err(|e| Error::io(dir, e))?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some(step) = leftover_of(name) else {
            continue;
        };
        let target = step_dir(dir, step);
        match incomplete(&target, step, critic) {
            None => {
                std::fs::remove_dir_all(&path).map_err(|e| Error::io(&path, e))?;
                notes.push(format!(
                    "removed {}, left by an interrupted save of step-{step}",
                    path.display()
                ));
            }
            Some(_) => notes.push(format!(
                "{} was left by an interrupted save of step-{step}, which is not complete: \
                 it may hold that checkpoint; left in place",
                path.display()
            )),
        }
    }
    Ok(notes)
}

/// N of a directory name `.step-N.tmp-…` or `.step-N.old-…` (colo-train's
/// temporary names while it writes a checkpoint).
fn leftover_of(name: &str) -> Option<usize> {
    let rest = name.strip_prefix(".step-")?;
    let (n, kind) = rest.split_once('.')?;
    (kind.starts_with("tmp-") || kind.starts_with("old-"))
        .then(|| n.parse().ok())
        .flatten()
}

/// Makes the checkpoint directory `dst` (holding the trained `config.json`
/// and weights) a complete Hugging Face directory: copies the tokenizer
/// files and `generation_config.json` that the starting model `source` has,
/// and writes a `generation_config.json` from the model's config (its BOS,
/// EOS and PAD ids, as transformers' `GenerationConfig.from_model_config`)
/// when the source has none.
pub fn write_model_files(source: &Path, dst: &Path) -> Result<()> {
    colo_model::tokenizer::copy_tokenizer_files(source, dst)?;
    let path = dst.join("generation_config.json");
    if !path.is_file() {
        let cfg = ModelConfig::from_file(&dst.join("config.json"))?;
        let eos = match cfg.eos_token_ids.as_slice() {
            [] => Value::Null,
            [one] => json!(one),
            many => json!(many),
        };
        let v = json!({
            "_from_model_config": true,
            "bos_token_id": cfg.bos_token_id,
            "eos_token_id": eos,
            "pad_token_id": cfg.pad_token_id,
        });
        let text = serde_json::to_string_pretty(&v)? + "\n";
        std::fs::write(&path, text).map_err(|e| Error::io(&path, e))?;
    }
    Ok(())
}

/// An error if the checkpoint `dir` holds another model than `config`'s
/// `model.path` (a resume under another run's configuration, such as the
/// built-in job's for a run of a user's model): the fields that shape its
/// tensors are compared from the two `config.json` files, before anything
/// of the run directory is written. (Loading it failed on a tensor's
/// shape, after `config.toml` had been rewritten.)
pub fn check_same_model(config: &crate::Config, dir: &Path) -> Result<()> {
    let (start, named) = match &config.model.path {
        None => (
            crate::task::model_config(),
            "the built-in model (no model.path)".to_owned(),
        ),
        Some(p) => (
            ModelConfig::from_file(&p.join("config.json"))?,
            format!("model.path = {}", p.display()),
        ),
    };
    let saved = ModelConfig::from_file(&dir.join("config.json"))?;
    let shape = |m: &ModelConfig| {
        [
            ("model_type", format!("{:?}", m.arch).to_lowercase()),
            ("vocab_size", m.vocab_size.to_string()),
            ("hidden_size", m.hidden_size.to_string()),
            ("intermediate_size", m.intermediate_size.to_string()),
            ("num_hidden_layers", m.num_layers.to_string()),
            ("num_attention_heads", m.num_heads.to_string()),
            ("num_key_value_heads", m.num_kv_heads.to_string()),
            ("head_dim", m.head_dim.to_string()),
            ("tie_word_embeddings", m.tie_word_embeddings.to_string()),
            ("attention biases", format!("{}/{}", m.qkv_bias, m.o_bias)),
        ]
    };
    let diffs: Vec<String> = (shape(&saved).into_iter())
        .zip(shape(&start))
        .filter(|(a, b)| a.1 != b.1)
        .map(|((key, a), (_, b))| format!("{key} ({a}, not {b})"))
        .collect();
    if diffs.is_empty() {
        return Ok(());
    }
    let out = (dir.parent().and_then(Path::parent)).unwrap_or(Path::new("DIR"));
    Err(Error::Resume(format!(
        "{} holds another model than {named}: its config.json differs in {}. The run was \
         made with another configuration; resume with the one it used (without --config, \
         `colo train --out {} --resume` reads {})",
        dir.display(),
        diffs.join(", "),
        out.display(),
        out.join(crate::run_config::FILE).display()
    )))
}

/// A run resumed from the checkpoint `dir` computes in the dtype it was
/// saved in when its config says `trainer.dtype = "auto"` (which another
/// machine may decide otherwise: an f32 run resumed in bf16, or a bf16 run
/// continued in f32 from its rounded weights, would not be the run that
/// was checkpointed). An explicit dtype is kept, except f32 for a bf16
/// checkpoint, which is refused naming both (an f32 trainer cannot load its
/// master weights). Returns the config to run
/// and, when `auto` was settled by the checkpoint against this device's
/// choice, what to tell the user.
pub fn resume_dtype(config: &crate::Config, dir: &Path) -> Result<(crate::Config, Option<String>)> {
    use crate::config::Dtype;
    let mut config = config.clone();
    let saved = std::fs::read_to_string(dir.join("config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .and_then(|v| match v["torch_dtype"].as_str() {
            Some("float32") => Some(Dtype::F32),
            Some("bfloat16") => Some(Dtype::Bf16),
            _ => None,
        });
    let Some(saved) = saved else {
        return Ok((config, None));
    };
    if config.trainer.dtype != Dtype::Auto {
        if (saved, config.trainer.dtype) == (Dtype::Bf16, Dtype::F32) {
            // Refused before anything is written: an f32 trainer has no
            // place for a bf16 checkpoint's float32 master weights, and its
            // load failed on a tensor's name. (A bf16 trainer takes an f32
            // checkpoint: its masters come from the parameters.)
            return Err(Error::Resume(format!(
                "{} was saved in bf16, and this config's trainer.dtype = \"f32\" cannot \
                 continue it (its optimizer state holds bf16's float32 master weights). \
                 Set trainer.dtype = \"bf16\" (or \"auto\") to resume, or start the f32 run \
                 in another directory (--out)",
                dir.display()
            )));
        }
        return Ok((config, None));
    }
    let here = Dtype::Auto.resolve(config.trainer.device);
    config.trainer.dtype = saved;
    let note = (saved != here).then(|| {
        format!(
            "--resume: {} was saved in {}; trainer.dtype = \"auto\" continues in {} (on this device \"auto\" is {})",
            dir.display(),
            saved.name(),
            saved.name(),
            here.name()
        )
    });
    Ok((config, note))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_state_round_trips_and_says_where_a_resumed_run_continues() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(DataState::read(dir.path()).unwrap(), None);
        let state = DataState {
            gen_batches: 7,
            gen_batch_size: 12,
        };
        state.write(dir.path()).unwrap();
        let back = DataState::read(dir.path()).unwrap();
        assert_eq!(back, Some(state));
        assert_eq!(DataState::resume_at(back, 3, 12), (7, None));
        assert_eq!(DataState::resume_at(None, 3, 12), (3, None));
        let (at, note) = DataState::resume_at(back, 3, 8);
        assert_eq!(at, 10, "84 prompts drawn, in batches of 8");
        assert!(note.unwrap().contains("7 generation batches of 12 prompts"));
        // Checked on resume: at least a batch a step, prompts that count.
        let (at, note) = DataState::resume(dir.path(), 3, 12, true).unwrap();
        assert_eq!((at, note), (7, None));
        let state = |gen_batches, gen_batch_size| DataState {
            gen_batches,
            gen_batch_size,
        };
        assert!(state(2, 12)
            .implausible(3)
            .unwrap()
            .contains("at least one"));
        assert!(state(usize::MAX, 2).implausible(3).is_some());
        assert!(state(5, 0).implausible(3).is_some());
        state(2, 12).write(dir.path()).unwrap();
        let e = DataState::resume(dir.path(), 3, 12, true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("damaged") && e.contains(DATA_STATE_FILE), "{e}");
        std::fs::remove_file(dir.path().join(DATA_STATE_FILE)).unwrap();
        // None: one a step, said when steps may draw more.
        assert_eq!(
            DataState::resume(dir.path(), 3, 12, false).unwrap(),
            (3, None)
        );
        let (at, note) = DataState::resume(dir.path(), 3, 12, true).unwrap();
        assert!(at == 3 && note.unwrap().contains("no data_state.json"));
        std::fs::write(dir.path().join(DATA_STATE_FILE), "{\"gen_batches\": -1}").unwrap();
        let e = DataState::read(dir.path()).unwrap_err().to_string();
        assert!(
            e.contains(DATA_STATE_FILE) && e.contains("gen_batch_size"),
            "{e}"
        );
    }

    /// The built-in model's checkpoint directory gets the files colo's
    /// loaders need (tokenizer, tokenizer config) and a generation config.
    #[test]
    fn builtin_checkpoints_get_tokenizer_and_generation_config() {
        let root = std::env::temp_dir().join(format!("colo-rl-ckpt-files-{}", std::process::id()));
        let (base, dst) = (root.join("base"), root.join("step-1"));
        crate::task::builtin_checkpoint(&base).unwrap();
        std::fs::create_dir_all(&dst).unwrap();
        std::fs::copy(base.join("config.json"), dst.join("config.json")).unwrap();
        write_model_files(&base, &dst).unwrap();
        let tok = colo_model::Tokenizer::from_dir(&dst).unwrap();
        let eos = tok.special.eos.as_ref().unwrap().id;
        let text = std::fs::read_to_string(dst.join("generation_config.json")).unwrap();
        let gen: Value = serde_json::from_str(&text).unwrap();
        let ids = match &gen["eos_token_id"] {
            Value::Array(a) => a.clone(),
            one => vec![one.clone()],
        };
        assert!(ids.contains(&json!(eos)), "{text}");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn only_complete_step_directories_count() {
        let root = std::env::temp_dir().join(format!("colo-rl-ckpt-scan-{}", std::process::id()));
        for d in ["step-3", "step-12", "step-x", ".step-20.tmp-abc", "other"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        let steps: Vec<usize> = step_dirs(&root).unwrap().into_iter().map(|s| s.0).collect();
        assert_eq!(steps, vec![12, 3]);
        let found = latest_complete(&root, false).unwrap();
        assert_eq!(found.latest, None);
        assert_eq!(found.skipped.len(), 2);
        assert!(
            found.skipped[0].1.contains("config.json"),
            "{:?}",
            found.skipped
        );
        assert_eq!(
            latest_complete(&root.join("absent"), false).unwrap(),
            Found::default()
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}

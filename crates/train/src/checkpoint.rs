//! Checkpoints: the model in Hugging Face format, the optimizer state and
//! the step, written atomically.
//!
//! Layout of a checkpoint directory:
//!
//! | file | holds |
//! |---|---|
//! | `config.json`, `model.safetensors` | the model, loadable by transformers (colo-model's save) |
//! | `value_head.safetensors` | `v_head.weight`, for a critic |
//! | `optimizer.safetensors` | an unsharded trainer's: `{name}.exp_avg`, `{name}.exp_avg_sq` per parameter (PyTorch's state names, float32), and `{name}.master` (the float32 master weights) for a bf16 engine |
//! | `optimizer_shards.json`, `optimizer-rank-R-of-N.safetensors` | a sharded trainer's, in place of `optimizer.safetensors`: the units' layout and each peer's flat shards of them ([`crate::optimizer_shards`]) |
//! | `trainer_state.json` | format, `optimizer_steps` taken, the caller's `global_step` (colo-rl: RL steps) when it gives one, the next learning rate; written last |
//!
//! Atomicity: everything is written into a temporary sibling directory
//! (`.{name}.tmp-XXXXXX`, made by the `tempfile` crate and removed if the
//! save fails), each file and the directory are fsynced, then it is renamed
//! into place (an existing checkpoint of the same name is first renamed
//! aside and removed after). A crash leaves either the old checkpoint or
//! the new one, plus possibly a temporary directory, never a half-written
//! checkpoint under the final name.
//!
//! A directory is a *complete* checkpoint ([`check_complete`]) when its
//! `trainer_state.json` reads in this format, `config.json` is a non-empty
//! file, and `model.safetensors` and the optimizer state's files
//! (`optimizer.safetensors`, or else every shard `optimizer_shards.json`
//! names) hold what their headers describe. The state file is written
//! last, so a directory made some other way (by hand, copied half-way,
//! left by an older version) is recognised as incomplete.
//!
//! The scheduler needs no state of its own: the learning rate is a function
//! of the step and the (config-given) schedule.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tch::Tensor;

use crate::offload::{require_resident, OPTIMIZER, PARAMS};
use crate::optimizer_shards::{read_optimizer, shard_file, ShardLayout, OPTIMIZER_SHARDS_FILE};
use crate::trainer::ColoTrainer;
use crate::value_head::VALUE_HEAD_WEIGHT;
use crate::{Error, Result};

pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
pub const VALUE_HEAD_FILE: &str = "value_head.safetensors";
pub const STATE_FILE: &str = "trainer_state.json";
const FORMAT: &str = "colo-train/1";

/// The files every complete checkpoint has (a critic's also has
/// [`VALUE_HEAD_FILE`]), beside its optimizer state: [`OPTIMIZER_FILE`],
/// or a sharded trainer's shards and their layout
/// ([`crate::optimizer_shards`]).
pub const REQUIRED_FILES: &[&str] = &["config.json", colo_model::weights::WEIGHTS_FILE, STATE_FILE];

/// `trainer_state.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    pub format: String,
    /// Optimizer steps taken (`"step"` in files written before this name).
    #[serde(alias = "step")]
    pub optimizer_steps: u64,
    /// The caller's count of its own steps, when it gave one (colo-rl: RL
    /// steps, verl's `global_step`; each is one or more optimizer steps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_step: Option<u64>,
    /// For people reading the file; recomputed from the config on load.
    pub next_lr: f64,
}

/// Reads and checks `dir/trainer_state.json`.
pub fn read_state(dir: &Path) -> Result<TrainerState> {
    let path = dir.join(STATE_FILE);
    let text = std::fs::read_to_string(&path).map_err(io(&path))?;
    let state: TrainerState = serde_json::from_str(&text).map_err(|e| Error::CheckpointState {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    if state.format != FORMAT {
        return Err(Error::CheckpointState {
            path,
            reason: format!("format `{}`, expected `{FORMAT}`", state.format),
        });
    }
    Ok(state)
}

/// The state of `dir` if it is a complete checkpoint (see the module
/// documentation), else an error naming what is missing or wrong.
pub fn check_complete(dir: &Path) -> Result<TrainerState> {
    if !dir.is_dir() {
        return Err(Error::CheckpointState {
            path: dir.to_owned(),
            reason: "not a directory".into(),
        });
    }
    let optimizer = crate::optimizer_shards::optimizer_files(dir)?;
    for path in REQUIRED_FILES.iter().map(|f| dir.join(f)).chain(optimizer) {
        let name = path.to_string_lossy().into_owned();
        let reason = match std::fs::metadata(&path) {
            // A safetensors file holds what its header says (a copy cut
            // short is found here, and `--resume` passes over it).
            Ok(m) if m.is_file() && m.len() > 0 && name.ends_with(".safetensors") => {
                match colo_model::weights::check_length(&path) {
                    Ok(()) => continue,
                    Err(reason) => reason,
                }
            }
            Ok(m) if m.is_file() && m.len() > 0 => continue,
            Ok(_) => "empty, or not a file".into(),
            Err(_) => "missing file".into(),
        };
        return Err(Error::CheckpointState { path, reason });
    }
    read_state(dir)
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |e| Error::io(path, e)
}

fn fsync(path: &Path) -> Result<()> {
    File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(io(path))
}

/// `dir`'s parent (`.` for a bare name) and its file name.
fn split(dir: &Path) -> Result<(PathBuf, String)> {
    let name = dir.file_name().ok_or_else(|| Error::CheckpointState {
        path: dir.to_owned(),
        reason: "a checkpoint directory needs a name".into(),
    })?;
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    Ok((parent, name.to_string_lossy().into_owned()))
}

/// A fresh directory `.{name}.{what}-XXXXXX` beside the checkpoint,
/// removed (with its contents) when dropped.
fn temp_sibling(parent: &Path, name: &str, what: &str) -> Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix(&format!(".{name}.{what}-"))
        .tempdir_in(parent)
        .map_err(io(parent))
}

fn save_tensors(tensors: &[(String, Tensor)], path: &Path) -> Result<()> {
    Ok(Tensor::write_safetensors(tensors, path)?)
}

/// Renames the finished temporary directory to `dir`, replacing an
/// existing one (moved aside first, removed after).
fn commit(tmp: tempfile::TempDir, dir: &Path, parent: &Path, name: &str) -> Result<()> {
    let aside = match dir.exists() {
        true => {
            let a = temp_sibling(parent, name, "old")?;
            let old = a.path().join(name);
            std::fs::rename(dir, &old).map_err(io(dir))?;
            Some((a, old))
        }
        false => None,
    };
    if let Err(e) = std::fs::rename(tmp.path(), dir) {
        // Put the previous checkpoint back; `tmp` is removed on drop.
        if let Some((_, old)) = &aside {
            let _ = std::fs::rename(old, dir);
        }
        return Err(Error::io(dir, e));
    }
    // Renamed away: nothing is left for the guard to remove.
    let _ = tmp.keep();
    if let Some((a, _)) = aside {
        a.close().map_err(io(dir))?;
    }
    fsync(parent)
}

/// Tensors under their checkpoint names.
type Named = Vec<(String, Tensor)>;

/// A checkpoint's optimizer state as written: one file, or a sharded
/// trainer's shards (staged beside the checkpoint by every peer).
pub(crate) enum OptimizerOut {
    Whole(Named),
    Shards(ShardLayout),
}

/// Where peer `rank` of `world` stages its optimizer shard for the
/// checkpoint `dir`: a hidden sibling, moved in by the writer.
pub(crate) fn staged_shard(dir: &Path, rank: usize, world: usize) -> Result<PathBuf> {
    let (parent, name) = split(dir)?;
    Ok(parent.join(format!(".{name}.{}", shard_file(rank, world))))
}

/// Writes the layout into the temporary checkpoint `t` and moves every
/// peer's staged shard in.
fn move_shards_in(layout: &ShardLayout, dir: &Path, t: &Path) -> Result<()> {
    let path = t.join(OPTIMIZER_SHARDS_FILE);
    let json = serde_json::to_string_pretty(layout).expect("serialisable") + "\n";
    std::fs::write(&path, json).map_err(io(&path))?;
    for r in 0..layout.world {
        let staged = staged_shard(dir, r, layout.world)?;
        let to = t.join(shard_file(r, layout.world));
        std::fs::rename(&staged, &to).map_err(io(&staged))?;
    }
    Ok(())
}

impl ColoTrainer {
    pub(crate) fn save(&self, dir: &Path) -> Result<()> {
        self.save_checkpoint_with(dir, None, |_| Ok::<(), Error>(()))
    }

    /// Writes a checkpoint into `dir` atomically (see the module
    /// documentation) with `global_step`, the caller's step count, in its
    /// `trainer_state.json`. `extra` runs on the temporary directory after
    /// the engine's files are written and before the state file and the
    /// rename, so files a caller adds (a tokenizer, a generation config)
    /// are part of the same atomic checkpoint.
    pub fn save_checkpoint_with<E: From<Error>>(
        &self,
        dir: &Path,
        global_step: Option<u64>,
        extra: impl FnOnce(&Path) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        require_resident(&self.pool, "save a checkpoint", &[PARAMS, OPTIMIZER])?;
        if self.is_sharded() {
            // Every peer takes part in the gathers; the first writes what
            // an unsharded trainer would.
            // Each peer writes its optimizer shard beside `dir`; the
            // gathers that follow are the barrier after which the first
            // peer moves them in.
            let layout = self.stage_optimizer_shard(dir)?;
            let weights = self.gathered_host_weights()?;
            if !self.writes_checkpoints() {
                return Ok(());
            }
            let opt = OptimizerOut::Shards(layout);
            return self.write_checkpoint(dir, global_step, (Some(weights), opt), extra);
        }
        let opt = OptimizerOut::Whole(self.optimizer_tensors());
        self.write_checkpoint(dir, global_step, (None, opt), extra)
    }

    /// [`Self::save_checkpoint_with`]'s files, with the optimizer's
    /// tensors `opt` and, when given, the model's weights (else the
    /// model's own).
    fn write_checkpoint<E: From<Error>>(
        &self,
        dir: &Path,
        global_step: Option<u64>,
        (weights, opt): (Option<Named>, OptimizerOut),
        extra: impl FnOnce(&Path) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        let (parent, name) = split(dir)?;
        std::fs::create_dir_all(&parent).map_err(io(&parent))?;
        // Removed on any early return below.
        let tmp = temp_sibling(&parent, &name, "tmp")?;
        let t = tmp.path();
        match &weights {
            Some(w) => self.model.save_dir_with(t, w).map_err(Error::from)?,
            None => self.write_model(t)?,
        }
        if let Some(h) = &self.value_head {
            let w = [(VALUE_HEAD_WEIGHT.to_owned(), h.weight().detach())];
            save_tensors(&w, &t.join(VALUE_HEAD_FILE))?;
        }
        match opt {
            OptimizerOut::Whole(opt) => save_tensors(&opt, &t.join(OPTIMIZER_FILE))?,
            OptimizerOut::Shards(layout) => move_shards_in(&layout, dir, t)?,
        }
        extra(t)?;
        let state = TrainerState {
            format: FORMAT.into(),
            optimizer_steps: self.opt.t,
            global_step,
            next_lr: self.next_lr(),
        };
        let json = serde_json::to_string_pretty(&state).expect("serialisable") + "\n";
        let state_path = t.join(STATE_FILE);
        std::fs::write(&state_path, json).map_err(io(&state_path))?;
        for entry in std::fs::read_dir(t).map_err(io(t))? {
            fsync(&entry.map_err(io(t))?.path())?;
        }
        fsync(t)?;
        Ok(commit(tmp, dir, &parent, &name)?)
    }
}

impl ColoTrainer {
    pub(crate) fn load(&mut self, dir: &Path) -> Result<()> {
        require_resident(&self.pool, "load a checkpoint", &[PARAMS, OPTIMIZER])?;
        if self.is_sharded() {
            return self.sharded_load(dir);
        }
        let state = read_state(dir)?;
        // Read and check everything before changing anything.
        // With LoRA the adapters (`lora_adapter/`), else `model.safetensors`.
        let mut tensors = self.checkpoint_tensors(dir)?;
        if self.value_head.is_some() {
            tensors.extend(read_named(&dir.join(VALUE_HEAD_FILE))?);
        }
        let params = take_matching(&mut tensors, &self.parameters(), dir, false)?;
        let (mut moments, opt_path) = read_optimizer(dir)?;
        // A checkpoint without master weights (written by a float32
        // engine) gives the masters of a bf16 engine from its parameters.
        let masters = take_matching(&mut moments, &self.master_weights_named(), &opt_path, true)?;
        let wanted = self.optimizer_tensors_without_masters();
        let moments = take_matching(&mut moments, &wanted, &opt_path, false)?;

        let _no_grad = tch::no_grad_guard();
        for ((_, dst), src) in self.parameters().iter().zip(&params) {
            copy_into(dst, src.as_ref().expect("required"))?;
        }
        for ((_, dst), src) in wanted.iter().zip(&moments) {
            copy_into(dst, src.as_ref().expect("required"))?;
        }
        let param_of: HashMap<String, Tensor> = self.parameters().into_iter().collect();
        for ((name, dst), src) in self.master_weights_named().iter().zip(&masters) {
            let master_name = name.trim_end_matches(MASTER_SUFFIX);
            let src = src.as_ref().unwrap_or(&param_of[master_name]);
            copy_into(dst, src)?;
        }
        self.opt.t = state.optimizer_steps;
        Ok(())
    }
}

pub(crate) const MASTER_SUFFIX: &str = ".master";

impl ColoTrainer {
    /// The optimizer's tensors under their checkpoint names: moments,
    /// then master weights.
    fn optimizer_tensors(&self) -> Vec<(String, Tensor)> {
        let mut out = self.optimizer_tensors_without_masters();
        out.extend(self.master_weights_named());
        out
    }

    fn optimizer_tensors_without_masters(&self) -> Vec<(String, Tensor)> {
        self.optimizer_state()
            .into_iter()
            .flat_map(|(n, m, v)| [(format!("{n}.exp_avg"), m), (format!("{n}.exp_avg_sq"), v)])
            .collect()
    }

    fn master_weights_named(&self) -> Vec<(String, Tensor)> {
        self.master_weights()
            .into_iter()
            .map(|(n, t)| (format!("{n}{MASTER_SUFFIX}"), t))
            .collect()
    }
}

/// The tensors of a safetensors file, as stored, on the CPU. (A checkpoint
/// written by [`ColoTrainer::save`] has a single `model.safetensors`.) A
/// tensor holding NaN or an infinity is an error naming it: training never
/// writes one (it skips a step whose gradient is not finite), so the file
/// is damaged, and a run from it would skip every step.
pub(crate) fn read_named(path: &Path) -> Result<HashMap<String, Tensor>> {
    if !path.is_file() {
        return Err(Error::CheckpointState {
            path: path.to_owned(),
            reason: "missing file".into(),
        });
    }
    let tensors = Tensor::read_safetensors(path)?;
    for (name, t) in &tensors {
        if !colo_model::weights::all_finite(t)? {
            return Err(Error::CheckpointState {
                path: path.to_owned(),
                reason: format!(
                    "tensor `{name}` holds NaN or infinite values: the file is damaged or the \
                     training that wrote it diverged"
                ),
            });
        }
    }
    Ok(tensors.into_iter().collect())
}

fn dims(t: &Tensor) -> Vec<usize> {
    t.size().iter().map(|&d| d as usize).collect()
}

/// The tensors named in `wanted`, in its order, each checked against the
/// shape of the engine's tensor (`None` for a missing one if `optional`).
/// Unless `optional`, tensors left in `found` are an error too.
pub(crate) fn take_matching(
    found: &mut HashMap<String, Tensor>,
    wanted: &[(String, Tensor)],
    path: &Path,
    optional: bool,
) -> Result<Vec<Option<Tensor>>> {
    let mut out = Vec::with_capacity(wanted.len());
    for (name, dst) in wanted {
        let Some(src) = found.remove(name) else {
            match optional {
                true => {
                    out.push(None);
                    continue;
                }
                false => {
                    return Err(Error::CheckpointMissing {
                        path: path.to_owned(),
                        name: name.clone(),
                    })
                }
            }
        };
        if src.size() != dst.size() {
            return Err(Error::CheckpointShape {
                path: path.to_owned(),
                name: name.clone(),
                expected: dims(dst),
                found: dims(&src),
            });
        }
        out.push(Some(src));
    }
    if let Some(extra) = found.keys().filter(|_| !optional).min() {
        return Err(Error::CheckpointState {
            path: path.to_owned(),
            reason: format!("tensor `{extra}` has no counterpart in this engine"),
        });
    }
    Ok(out)
}

/// Copies `src` into `dst`'s storage in place (converting kind and
/// device). The caller holds a no-grad guard.
fn copy_into(dst: &Tensor, src: &Tensor) -> Result<()> {
    dst.shallow_clone().f_copy_(src)?;
    Ok(())
}

//! LoRA training: the base weights frozen, a low-rank adapter `(A, B)` on
//! each targeted projection trained (colo-model's [`colo_model::lora`]).
//!
//! - **State.** The frozen base weights stay in `train_params` (offloaded
//!   and reloaded with the adapters at every switch, so colo-rl's modes and
//!   offload switches need no new tag), without `requires_grad`, without a
//!   gradient accumulator, AdamW moments or a float32 master. The trained
//!   parameters — the engine's `names` / `params`, hence its accumulators,
//!   its optimizer state, its gradient norm and clipping, its data-parallel
//!   all-reduce and its checkpoints' `optimizer.safetensors` — are the
//!   adapters' `A` and `B`, in the engine's kind, named as PEFT names them
//!   under their projection (`model.layers.0.self_attn.q_proj.lora_A.weight`).
//! - **Initialisation** as PEFT's default (`init_lora_weights = True`): `A`
//!   Kaiming-uniform with `a = √5` (`U(−1/√in, 1/√in)`, what
//!   `nn.init.kaiming_uniform_(A, a=math.sqrt(5))` draws), from a seeded
//!   generator so two engines built alike start alike; `B` zero, so the
//!   adapted model starts as the base. Scale `alpha / rank`.
//! - **The rollout engine and checkpoints get merged weights**
//!   (`W + scale · B A`): `visit_parameters` hands them over one decoder
//!   layer at a time (the merged copies made in the `activations` tag and
//!   dropped after each layer's call), so the engine needs no change and the
//!   transient is one layer's targeted weights. A checkpoint holds the
//!   merged model (`model.safetensors`) and the adapter in PEFT's format
//!   ([`ADAPTER_DIR`]); resuming reads the adapter and the optimizer state,
//!   the base weights coming from the starting model as when the run began.
//! - **The reference is the base**: [`crate::ColoTrainer::base_model`] is the
//!   engine's model without its adapters, over the same weights.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use colo_algo::rng::SplitMix64;
use colo_mem::{tags, Pool};
use colo_model::lora::{a_name, b_name, Adapter, PEFT_PREFIX, PROJECTIONS};
use colo_model::Model;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tch::{Device, Kind, Tensor};

use crate::buffers::copy_in;
use crate::checkpoint::read_named;
use crate::engine::ParamVisitor;
use crate::offload::{require_resident, PARAMS};
use crate::trainer::ColoTrainer;
use crate::{Error, Result};

/// Where a checkpoint keeps the adapter, in PEFT's format.
pub const ADAPTER_DIR: &str = "lora_adapter";
/// PEFT's adapter config file.
pub const ADAPTER_CONFIG_FILE: &str = "adapter_config.json";
/// PEFT's adapter weights file.
pub const ADAPTER_WEIGHTS_FILE: &str = "adapter_model.safetensors";

/// The projections adapters go on: `"all-linear"` (every projection of the
/// decoder layers; PEFT's name, which leaves out the LM head), one module
/// name, or a list of them (`["q_proj", "v_proj"]`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TargetModules {
    One(String),
    Many(Vec<String>),
}

impl Default for TargetModules {
    fn default() -> Self {
        TargetModules::One(ALL_LINEAR.into())
    }
}

/// PEFT's `target_modules` for every linear layer but the output layer.
pub const ALL_LINEAR: &str = "all-linear";

impl TargetModules {
    /// The module names, in [`PROJECTIONS`] order; an error naming what is
    /// not one of them.
    pub fn resolve(&self) -> std::result::Result<Vec<&'static str>, String> {
        let names: Vec<&str> = match self {
            TargetModules::One(s) if s == ALL_LINEAR => return Ok(PROJECTIONS.to_vec()),
            TargetModules::One(s) => vec![s.as_str()],
            TargetModules::Many(v) => v.iter().map(String::as_str).collect(),
        };
        if names.is_empty() {
            return Err(format!(
                "is an empty list; give \"{ALL_LINEAR}\" or some of {PROJECTIONS:?}"
            ));
        }
        if let Some(bad) = names.iter().find(|n| !PROJECTIONS.contains(n)) {
            return Err(format!(
                "names `{bad}`, which is not a projection of these models; expected \
                 \"{ALL_LINEAR}\" or some of {PROJECTIONS:?}"
            ));
        }
        Ok(PROJECTIONS
            .into_iter()
            .filter(|p| names.contains(p))
            .collect())
    }
}

/// [`crate::TrainerConfig::lora`]: train LoRA adapters instead of the
/// weights (verl's `lora_rank`, `lora_alpha`, `target_modules`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoraConfig {
    /// The adapters' rank `r`, at least 1.
    pub rank: usize,
    /// `alpha`: the adapters' output is scaled by `alpha / rank`.
    pub alpha: f64,
    pub target_modules: TargetModules,
    /// Dropout on the adapters' input in training; only 0 is implemented.
    pub dropout: f64,
    /// Start from this saved PEFT adapter (a directory with
    /// `adapter_config.json` and `adapter_model.safetensors`) instead of
    /// fresh adapters; its rank, alpha and targets must be these.
    pub adapter_path: Option<PathBuf>,
    /// Seed of `A`'s initial values.
    pub seed: u64,
}

impl Default for LoraConfig {
    fn default() -> Self {
        LoraConfig {
            rank: 8,
            alpha: 16.0,
            target_modules: TargetModules::default(),
            dropout: 0.0,
            adapter_path: None,
            seed: 0,
        }
    }
}

/// A checked [`LoraConfig`].
#[derive(Clone, Debug, PartialEq)]
pub struct Lora {
    pub rank: usize,
    pub alpha: f64,
    /// `alpha / rank`.
    pub scale: f64,
    pub targets: Vec<&'static str>,
    pub adapter_path: Option<PathBuf>,
    pub seed: u64,
}

impl LoraConfig {
    /// Checks every field; errors name it (`lora.rank`, …).
    pub fn validate(&self) -> Result<Lora> {
        if self.rank == 0 {
            return Err(Error::config("lora.rank", 0, "must be at least 1"));
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            return Err(Error::config(
                "lora.alpha",
                self.alpha,
                "must be a positive finite number",
            ));
        }
        if self.dropout != 0.0 {
            return Err(Error::config(
                "lora.dropout",
                self.dropout,
                "only 0 is implemented (no dropout on the adapters' input)",
            ));
        }
        let targets = (self.target_modules.resolve())
            .map_err(|why| Error::config("lora.target_modules", self.targets_text(), &why))?;
        Ok(Lora {
            rank: self.rank,
            alpha: self.alpha,
            scale: self.alpha / self.rank as f64,
            targets,
            adapter_path: self.adapter_path.clone(),
            seed: self.seed,
        })
    }

    fn targets_text(&self) -> String {
        serde_json::to_string(&self.target_modules).unwrap_or_default()
    }
}

/// An engine's LoRA state beside its trained tensors.
#[derive(Clone, Debug)]
pub(crate) struct LoraState {
    pub(crate) lora: Lora,
    /// The adapted projections' paths, in the model's order; the engine's
    /// trained tensors are `A`, `B` of each in this order (then the value
    /// head, for a critic).
    pub(crate) paths: Vec<String>,
    /// `base_model_name_or_path` of the adapters a checkpoint writes: the
    /// starting model's directory when the engine was built from one.
    pub(crate) base_model: Option<String>,
}

/// What [`attach`] makes: the adapted model (sharing every tensor), the
/// state, and the adapters' tensors by name (`A`, `B` per projection).
pub(crate) type Attached = (Model, LoraState, Vec<(String, Tensor)>);

/// The adapters of `lora` on `model`'s targeted projections, their tensors
/// allocated in `train_params` (in `kind` on `device`, requiring a
/// gradient): fresh ones, or those of the PEFT adapter at
/// `lora.adapter_path`.
pub(crate) fn attach(
    pool: &Arc<Pool>,
    model: &Model,
    lora: Lora,
    kind: Kind,
    device: Device,
) -> Result<Attached> {
    let targets = model.projection_paths(&lora.targets);
    let paths: Vec<String> = targets.iter().map(|(p, _)| p.clone()).collect();
    let mut loaded = match &lora.adapter_path {
        Some(dir) => read_peft_adapter(dir, &lora, &targets)?,
        None => HashMap::new(),
    };
    let mut g = SplitMix64::new(lora.seed);
    let mut adapters = HashMap::new();
    let mut named = Vec::with_capacity(2 * targets.len());
    for (path, (inp, out)) in &targets {
        let (a, b) = match loaded.remove(path) {
            Some(ab) => ab,
            None => fresh(&mut g, lora.rank as i64, *inp, *out)?,
        };
        let a = copy_in(pool, tags::TRAIN_PARAMS, &a, kind, device, true)?;
        let b = copy_in(pool, tags::TRAIN_PARAMS, &b, kind, device, true)?;
        named.push((a_name(path), a.shallow_clone()));
        named.push((b_name(path), b.shallow_clone()));
        adapters.insert(path.clone(), Adapter::new(a, b, lora.scale));
    }
    let adapted = model.with_adapters(adapters)?;
    let state = LoraState {
        lora,
        paths,
        base_model: None,
    };
    Ok((adapted, state, named))
}

/// PEFT's initial adapter of a projection (in, out): `A` (rank, in) from
/// `U(−1/√in, 1/√in)` (Kaiming-uniform with `a = √5`), `B` (out, rank) zero;
/// float32 on the CPU.
fn fresh(g: &mut SplitMix64, rank: i64, inp: i64, out: i64) -> Result<(Tensor, Tensor)> {
    let bound = 1.0 / (inp as f64).sqrt();
    let values: Vec<f32> = (0..rank * inp)
        .map(|_| {
            let u = (g.next_u64() >> 11) as f64 / (1u64 << 53) as f64; // [0, 1)
            ((2.0 * u - 1.0) * bound) as f32
        })
        .collect();
    let a = Tensor::f_from_slice(&values)?.f_view([rank, inp])?;
    let b = Tensor::f_zeros([out, rank], (Kind::Float, Device::Cpu))?;
    Ok((a, b))
}

/// The adapters of the PEFT adapter directory `dir` for the projections
/// `targets` (path, (in, out)), by path: `(A, B)` as stored, on the CPU.
/// Its config must be a plain LoRA one with `lora`'s rank, alpha and
/// targets, and its weights file must hold exactly those adapters.
pub fn read_peft_adapter(
    dir: &Path,
    lora: &Lora,
    targets: &[(String, (i64, i64))],
) -> Result<HashMap<String, (Tensor, Tensor)>> {
    check_peft_config(dir, lora)?;
    let path = dir.join(ADAPTER_WEIGHTS_FILE);
    let mut found: HashMap<String, Tensor> = read_named(&path)?
        .into_iter()
        .map(|(n, t)| (n.strip_prefix(PEFT_PREFIX).unwrap_or(&n).to_owned(), t))
        .collect();
    let mut out = HashMap::new();
    let r = lora.rank as i64;
    for (p, (inp, o)) in targets {
        let mut take = |name: String, shape: [i64; 2]| -> Result<Tensor> {
            let t = found
                .remove(&name)
                .ok_or_else(|| Error::CheckpointMissing {
                    path: path.clone(),
                    name: format!("{PEFT_PREFIX}{name}"),
                })?;
            match t.size() == shape {
                true => Ok(t),
                false => Err(Error::CheckpointShape {
                    path: path.clone(),
                    name: format!("{PEFT_PREFIX}{name}"),
                    expected: shape.iter().map(|&d| d as usize).collect(),
                    found: t.size().iter().map(|&d| d as usize).collect(),
                }),
            }
        };
        let a = take(a_name(p), [r, *inp])?;
        let b = take(b_name(p), [*o, r])?;
        out.insert(p.clone(), (a, b));
    }
    if let Some(extra) = found.keys().min() {
        return Err(Error::CheckpointState {
            path,
            reason: format!(
                "tensor `{PEFT_PREFIX}{extra}` is not an adapter of this engine's targets {:?}",
                lora.targets
            ),
        });
    }
    Ok(out)
}

/// `dir/adapter_config.json` must describe what this engine trains.
fn check_peft_config(dir: &Path, lora: &Lora) -> Result<()> {
    let path = dir.join(ADAPTER_CONFIG_FILE);
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    let bad = |reason: String| Error::CheckpointState {
        path: path.clone(),
        reason,
    };
    let cfg: Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let field = |k: &str| cfg.get(k).unwrap_or(&Value::Null);
    if field("peft_type").as_str() != Some("LORA") {
        return Err(bad(format!(
            "peft_type is {}, expected \"LORA\"",
            field("peft_type")
        )));
    }
    for (key, refused) in [
        ("use_dora", field("use_dora").as_bool() == Some(true)),
        ("use_rslora", field("use_rslora").as_bool() == Some(true)),
        (
            "fan_in_fan_out",
            field("fan_in_fan_out").as_bool() == Some(true),
        ),
        (
            "bias",
            !matches!(field("bias").as_str(), None | Some("none")),
        ),
        ("modules_to_save", !is_empty(field("modules_to_save"))),
        ("rank_pattern", !is_empty(field("rank_pattern"))),
        ("alpha_pattern", !is_empty(field("alpha_pattern"))),
        (
            "layers_to_transform",
            !is_empty(field("layers_to_transform")),
        ),
        ("layer_replication", !is_empty(field("layer_replication"))),
        ("lora_bias", field("lora_bias").as_bool() == Some(true)),
        ("use_qalora", field("use_qalora").as_bool() == Some(true)),
        ("target_parameters", !is_empty(field("target_parameters"))),
        (
            "trainable_token_indices",
            !is_empty(field("trainable_token_indices")),
        ),
    ] {
        if refused {
            return Err(bad(format!(
                "{key} = {}: only plain LoRA adapters (no DoRA, rsLoRA, biases, extra \
                 modules or per-layer patterns) load",
                field(key)
            )));
        }
    }
    let r = field("r").as_u64();
    if r != Some(lora.rank as u64) {
        return Err(bad(format!(
            "r = {}, but lora_rank = {}",
            field("r"),
            lora.rank
        )));
    }
    let alpha = field("lora_alpha").as_f64();
    if alpha != Some(lora.alpha) {
        return Err(bad(format!(
            "lora_alpha = {}, but lora_alpha = {} here",
            field("lora_alpha"),
            lora.alpha
        )));
    }
    let targets: TargetModules = serde_json::from_value(field("target_modules").clone())
        .map_err(|e| bad(format!("target_modules: {e}")))?;
    // PEFT matches a module whose name is an entry or ends with `.entry`,
    // and saves "all-linear" as the full paths it matched.
    let short = |t: &String| t.rsplit('.').next().unwrap_or(t).to_owned();
    let targets = match targets {
        TargetModules::Many(v) => TargetModules::Many(v.iter().map(short).collect()),
        one => one,
    };
    match targets.resolve() {
        Ok(t) if t == lora.targets => Ok(()),
        Ok(t) => Err(bad(format!(
            "target_modules {t:?}, but this engine targets {:?}",
            lora.targets
        ))),
        Err(why) => Err(bad(format!("target_modules {why}"))),
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

/// Writes `dir/adapter_config.json` and `dir/adapter_model.safetensors` as
/// PEFT's `save_pretrained` does, for `state`'s adapters `named` (engine
/// names, saved under [`PEFT_PREFIX`]).
pub(crate) fn write_peft_adapter(
    dir: &Path,
    state: &LoraState,
    named: &[(String, Tensor)],
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let l = &state.lora;
    let targets: Vec<&str> = l.targets.to_vec();
    let cfg = json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": state.base_model,
        "r": l.rank,
        "lora_alpha": l.alpha,
        "lora_dropout": 0.0,
        "target_modules": targets,
        "bias": "none",
        "fan_in_fan_out": false,
        "init_lora_weights": true,
        "inference_mode": true,
        "use_rslora": false,
        "use_dora": false,
        "modules_to_save": null,
        "layers_to_transform": null,
        "layers_pattern": null,
        "rank_pattern": {},
        "alpha_pattern": {},
        "revision": null,
    });
    let path = dir.join(ADAPTER_CONFIG_FILE);
    let text = serde_json::to_string_pretty(&cfg).expect("a JSON value serialises") + "\n";
    std::fs::write(&path, text).map_err(|e| Error::io(&path, e))?;
    let tensors: Vec<(String, Tensor)> = named
        .iter()
        .map(|(n, t)| (format!("{PEFT_PREFIX}{n}"), t.detach()))
        .collect();
    Ok(Tensor::write_safetensors(
        &tensors,
        dir.join(ADAPTER_WEIGHTS_FILE),
    )?)
}

impl ColoTrainer {
    /// The LoRA settings, when the engine trains adapters.
    pub fn lora(&self) -> Option<&Lora> {
        self.lora.as_ref().map(|s| &s.lora)
    }

    /// The model without its adapters, over the engine's (frozen) weights:
    /// the base model, for scoring as the reference. The engine's model
    /// itself when it trains no adapters. Its tensors are the engine's: it
    /// needs the parameters resident when it runs.
    pub fn base_model(&self) -> Result<Model> {
        require_resident(&self.pool, "use the base model", &[PARAMS])?;
        Ok(self.model.without_adapters())
    }

    /// The adapters' tensors under their names (`A`, `B` per projection;
    /// empty without LoRA).
    pub(crate) fn adapter_tensors(&self) -> Vec<(String, Tensor)> {
        let Some(state) = &self.lora else {
            return Vec::new();
        };
        let n = 2 * state.paths.len();
        self.parameters().into_iter().take(n).collect()
    }

    /// Sets `base_model_name_or_path` of the adapters checkpoints write.
    pub(crate) fn set_lora_base(&mut self, dir: &Path) {
        if let Some(s) = &mut self.lora {
            let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_owned());
            s.base_model = Some(dir.display().to_string());
        }
    }

    /// [`crate::TrainEngine::visit_parameters`] with adapters: the weights
    /// outside the layers, then each decoder layer's with its adapters
    /// merged, the merged copies made in the `activations` tag and dropped
    /// after the call.
    pub(crate) fn visit_merged(&self, visit: &mut ParamVisitor<'_>) -> Result<()> {
        require_resident(&self.pool, "hand over the weights", &[PARAMS])?;
        let detached = |v: Vec<(String, Tensor)>| -> Vec<(String, Tensor)> {
            v.into_iter().map(|(n, t)| (n, t.detach())).collect()
        };
        visit(&detached(self.model.non_layer_parameters()))?;
        for i in 0..self.model.layers().len() {
            let guard = self.pool.region(tags::ACTIVATIONS)?;
            let merged = self.model.merged_layer_parameters(i);
            guard.finish()?;
            visit(&detached(merged?))?;
        }
        Ok(())
    }

    /// Writes the model into the checkpoint directory `dir`: with adapters
    /// the merged model (`config.json`, `model.safetensors`) and the
    /// adapter in PEFT's format in `dir/lora_adapter`; else the model.
    pub(crate) fn write_model(&self, dir: &Path) -> Result<()> {
        let Some(state) = &self.lora else {
            return Ok(self.model.save_dir(dir)?);
        };
        self.model.merged()?.save_dir(dir)?;
        write_peft_adapter(&dir.join(ADAPTER_DIR), state, &self.adapter_tensors())
    }

    /// The trained tensors a checkpoint in `dir` holds for this engine:
    /// with adapters those of `dir/lora_adapter` under the engine's names
    /// (the base weights are the starting model's, already loaded), else
    /// `model.safetensors`.
    pub(crate) fn checkpoint_tensors(&self, dir: &Path) -> Result<HashMap<String, Tensor>> {
        let adapter = dir.join(ADAPTER_DIR);
        let Some(state) = &self.lora else {
            if adapter.exists() {
                return Err(Error::CheckpointState {
                    path: dir.to_owned(),
                    reason: format!(
                        "it holds {ADAPTER_DIR}/: a LoRA engine wrote it, and this one trains \
                         every weight (its model.safetensors is the merged model, a starting \
                         point rather than a state to resume)"
                    ),
                });
            }
            return read_named(&dir.join(colo_model::weights::WEIGHTS_FILE));
        };
        if !adapter.is_dir() {
            return Err(Error::CheckpointState {
                path: dir.to_owned(),
                reason: format!(
                    "it holds no {ADAPTER_DIR}/: an engine that trains every weight wrote it, \
                     and this one trains LoRA adapters"
                ),
            });
        }
        let targets = self.model.projection_paths(&state.lora.targets);
        let adapters = read_peft_adapter(&dir.join(ADAPTER_DIR), &state.lora, &targets)?;
        Ok(adapters
            .into_iter()
            .flat_map(|(p, (a, b))| [(a_name(&p), a), (b_name(&p), b)])
            .collect())
    }

    /// Bytes of the frozen base weights (0 without adapters).
    pub(crate) fn frozen_bytes(&self) -> u64 {
        if self.lora.is_none() {
            return 0;
        }
        let elt = self.kind.elt_size_in_bytes() as u64;
        (self.model.named_parameters().iter())
            .map(|(_, t)| t.numel() as u64 * elt)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_resolve_in_projection_order_and_name_what_is_wrong() {
        let all = TargetModules::One(ALL_LINEAR.into()).resolve().unwrap();
        assert_eq!(all, PROJECTIONS.to_vec());
        let some = TargetModules::Many(vec!["v_proj".into(), "q_proj".into()]);
        assert_eq!(some.resolve().unwrap(), ["q_proj", "v_proj"]);
        let e = TargetModules::Many(vec!["q_proj".into(), "lm_head".into()])
            .resolve()
            .unwrap_err();
        assert!(e.contains("`lm_head`"), "{e}");
        assert!(TargetModules::Many(vec![]).resolve().is_err());
    }

    #[test]
    fn validation_names_the_field() {
        let err = |c: LoraConfig| c.validate().unwrap_err().to_string();
        let ok = LoraConfig::default().validate().unwrap();
        assert_eq!((ok.rank, ok.scale), (8, 2.0));
        assert!(err(LoraConfig {
            rank: 0,
            ..Default::default()
        })
        .contains("lora.rank"));
        assert!(err(LoraConfig {
            alpha: -1.0,
            ..Default::default()
        })
        .contains("lora.alpha"));
        let e = err(LoraConfig {
            dropout: 0.05,
            ..Default::default()
        });
        assert!(e.contains("lora.dropout") && e.contains("only 0"), "{e}");
        assert!(err(LoraConfig {
            target_modules: TargetModules::One("qproj".into()),
            ..Default::default()
        })
        .contains("lora.target_modules"));
    }

    #[test]
    fn fresh_a_is_kaiming_uniform_and_b_is_zero() {
        let mut g = SplitMix64::new(0);
        let (a, b) = fresh(&mut g, 8, 400, 30).unwrap();
        assert_eq!((a.size(), b.size()), (vec![8, 400], vec![30, 8]));
        let bound = 1.0 / 20.0;
        let max = a.abs().max().double_value(&[]);
        assert!(max <= bound && max > 0.95 * bound, "{max}");
        // U(−c, c) has variance c²/3.
        let var = a.square().mean(Kind::Double).double_value(&[]);
        assert!((var / (bound * bound / 3.0) - 1.0).abs() < 0.05, "{var}");
        assert_eq!(b.abs().sum(Kind::Double).double_value(&[]), 0.0);
        let (a2, _) = fresh(&mut SplitMix64::new(0), 8, 400, 30).unwrap();
        assert!(a.equal(&a2));
    }
}

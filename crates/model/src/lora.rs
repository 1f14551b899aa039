//! LoRA adapters (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large
//! Language Models", arXiv:2106.09685) on a model's projections, in PEFT's
//! form: a projection `y = x Wᵀ + b` with an adapter computes
//! `y + (x Aᵀ) Bᵀ · scale`, `A` (rank, in), `B` (out, rank), `scale =
//! alpha / rank` — PEFT's `LoraLayer.forward` without dropout, in its order
//! of operations.
//!
//! An adapter sits on a [`Linear`](crate::Linear) and shares its tensors
//! like every parameter here: [`Model::with_adapters`] makes a (shallow)
//! clone of a model with adapters on the projections it names,
//! [`Model::without_adapters`] one without — the base model, over the same
//! weights, with no copy (colo-rl's reference when the actor trains
//! adapters). [`Model::merged_layer_parameters`] and [`Model::merged`] fold
//! them into the weights, `W + scale · B A`, for an engine or a checkpoint
//! that knows nothing of adapters.
//!
//! Names are PEFT's under the projection's: `{path}.lora_A.weight` and
//! `{path}.lora_B.weight`, `path` being e.g. `model.layers.0.self_attn.q_proj`
//! (PEFT saves them with [`PEFT_PREFIX`] in front).

use std::collections::HashMap;

use tch::Tensor;

use crate::layers::linear;
use crate::model::Model;
use crate::weights::Weights;
use crate::{Error, Result};

/// The projections an adapter may target, by PEFT's module names; all of
/// them is PEFT's `"all-linear"` on these models (every linear layer but
/// the LM head).
pub const PROJECTIONS: [&str; 7] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
];

/// What PEFT puts before a model's parameter names in
/// `adapter_model.safetensors` (its `PeftModel.base_model.model`).
pub const PEFT_PREFIX: &str = "base_model.model.";

/// The name of `A` of the adapter on the projection at `path`.
pub fn a_name(path: &str) -> String {
    format!("{path}.lora_A.weight")
}

/// The name of `B` of the adapter on the projection at `path`.
pub fn b_name(path: &str) -> String {
    format!("{path}.lora_B.weight")
}

/// One projection's adapter: `A` (rank, in), `B` (out, rank) and the scale
/// `alpha / rank`. The tensors are shared, not copied.
#[derive(Debug)]
pub struct Adapter {
    a: Tensor,
    b: Tensor,
    scale: f64,
}

impl Clone for Adapter {
    /// Shares the tensors.
    fn clone(&self) -> Self {
        Adapter {
            a: self.a.shallow_clone(),
            b: self.b.shallow_clone(),
            scale: self.scale,
        }
    }
}

impl Adapter {
    pub fn new(a: Tensor, b: Tensor, scale: f64) -> Self {
        Adapter { a, b, scale }
    }

    /// `A`, (rank, in).
    pub fn a(&self) -> &Tensor {
        &self.a
    }

    /// `B`, (out, rank).
    pub fn b(&self) -> &Tensor {
        &self.b
    }

    pub fn scale(&self) -> f64 {
        self.scale
    }

    /// `y + (x Aᵀ) Bᵀ · scale` for the projection's output `y` of `x`.
    pub(crate) fn add_to(&self, x: &Tensor, y: Tensor) -> Result<Tensor> {
        let low = linear(x, &self.a, None)?;
        let up = linear(&low, &self.b, None)?;
        Ok(y.f_add(&up.f_mul_scalar(self.scale)?)?)
    }

    /// `w + (scale · B) A` in `w`'s kind: one `addmm`, whose product
    /// accumulates in float32 (a new tensor on `w`'s device, the only
    /// weight-sized one it makes; a float32 composition made three more,
    /// and took 0.55–0.9 s a switch at Qwen2.5-0.5B's shape on two cores).
    pub fn merged(&self, w: &Tensor) -> Result<Tensor> {
        let _no_grad = tch::no_grad_guard();
        let b = self.b.f_mul_scalar(self.scale)?.f_to_kind(w.kind())?;
        let a = self.a.f_to_kind(w.kind())?;
        Ok(w.f_addmm(&b, &a)?)
    }
}

impl Model {
    /// The projections whose module names are in `targets` (a subset of
    /// [`PROJECTIONS`]), in the model's order: each one's path (e.g.
    /// `model.layers.0.self_attn.q_proj`) and its (in, out) sizes.
    pub fn projection_paths(&self, targets: &[&str]) -> Vec<(String, (i64, i64))> {
        let mut out = Vec::new();
        for (i, layer) in self.layers().iter().enumerate() {
            for (name, p) in layer.projections() {
                let short = name.rsplit('.').next().expect("a name");
                if targets.contains(&short) {
                    let (o, n) = (p.weight().size()[0], p.weight().size()[1]);
                    out.push((format!("model.layers.{i}.{name}"), (n, o)));
                }
            }
        }
        out
    }

    /// A clone of this model (sharing every tensor) with `adapters`, keyed
    /// by projection path, on the projections they name, and none on the
    /// others. An unknown path, an adapter whose shapes do not fit its
    /// projection, or a model with fused projections is an error.
    pub fn with_adapters(&self, mut adapters: HashMap<String, Adapter>) -> Result<Model> {
        let mut model = self.clone();
        for (i, layer) in model.layers_mut().iter_mut().enumerate() {
            let Some(projections) = layer.projections_mut() else {
                return Err(Error::Input(
                    "LoRA adapters on a model with fused projections: its fused products \
                     would bypass them"
                        .into(),
                ));
            };
            for (name, p) in projections {
                let path = format!("model.layers.{i}.{name}");
                let adapter = adapters.remove(&path);
                if let Some(a) = &adapter {
                    check_fits(&path, a, p.weight())?;
                }
                p.set_adapter(adapter);
            }
        }
        if let Some(path) = adapters.keys().min() {
            return Err(Error::Input(format!(
                "LoRA adapter for `{path}`, which is not a projection of this model (one of \
                 model.layers.N.self_attn.{{q,k,v,o}}_proj, model.layers.N.mlp.{{gate,up,down}}_proj)"
            )));
        }
        Ok(model)
    }

    /// A clone of this model over the same weights with no adapters: the
    /// base model.
    pub fn without_adapters(&self) -> Model {
        self.with_adapters(HashMap::new())
            .unwrap_or_else(|_| self.clone())
    }

    /// The adapters, by projection path, in the model's order.
    pub fn adapters(&self) -> Vec<(String, Adapter)> {
        let mut out = Vec::new();
        for (i, layer) in self.layers().iter().enumerate() {
            for (name, p) in layer.projections() {
                if let Some(a) = p.adapter() {
                    out.push((format!("model.layers.{i}.{name}"), a.clone()));
                }
            }
        }
        out
    }

    /// Layer `i`'s parameters under their Hugging Face names, in
    /// [`Model::named_parameters`]' order, each adapted projection's
    /// weight merged (`W + scale · B A`, a new tensor), the others shared.
    pub fn merged_layer_parameters(&self, i: usize) -> Result<Vec<(String, Tensor)>> {
        let layer = self.layers().get(i).ok_or_else(|| {
            Error::Input(format!(
                "layer {i} of a model of {} layers",
                self.layers().len()
            ))
        })?;
        let prefix = format!("model.layers.{i}");
        let mut out = Vec::new();
        layer.push_params(&prefix, &mut out);
        for (name, p) in layer.projections() {
            let Some(a) = p.adapter() else { continue };
            let weight = format!("{prefix}.{name}.weight");
            let slot = out.iter_mut().find(|(n, _)| *n == weight);
            slot.expect("push_params names every projection's weight").1 = a.merged(p.weight())?;
        }
        Ok(out)
    }

    /// The parameters outside the decoder layers (embedding, final norm,
    /// untied head), which adapters never touch: shared.
    pub fn non_layer_parameters(&self) -> Vec<(String, Tensor)> {
        self.named_parameters()
            .into_iter()
            .filter(|(n, _)| !n.starts_with("model.layers."))
            .collect()
    }

    /// Every parameter with the adapters merged, in
    /// [`Model::named_parameters`]' order.
    pub fn merged_parameters(&self) -> Result<Vec<(String, Tensor)>> {
        let mut merged: HashMap<String, Tensor> = HashMap::new();
        for i in 0..self.layers().len() {
            merged.extend(self.merged_layer_parameters(i)?);
        }
        Ok(self
            .named_parameters()
            .into_iter()
            .map(|(n, t)| {
                let t = merged.remove(&n).unwrap_or(t);
                (n, t)
            })
            .collect())
    }

    /// A model with the adapters merged into new weight tensors and no
    /// adapters (what a checkpoint of an adapted model saves).
    pub fn merged(&self) -> Result<Model> {
        let tensors = self.merged_parameters()?.into_iter().collect();
        Model::load(self.config(), &Weights::from_tensors(tensors))
    }
}

/// `A` must be (rank, in) and `B` (out, rank) for a weight (out, in).
fn check_fits(path: &str, a: &Adapter, w: &Tensor) -> Result<()> {
    let (out, inp) = (w.size()[0], w.size()[1]);
    let (sa, sb) = (a.a.size(), a.b.size());
    let rank = sa.first().copied().unwrap_or(0);
    let misfit = |name: String, expected: String, found: Vec<i64>| {
        Err(Error::Input(format!(
            "LoRA tensor `{name}` has shape {found:?}, expected {expected} for the projection's \
             weight [{out}, {inp}]"
        )))
    };
    if sa.len() != 2 || sa[1] != inp || rank == 0 {
        return misfit(a_name(path), format!("[rank, {inp}]"), sa);
    }
    if sb != [out, rank] {
        return misfit(b_name(path), format!("[{out}, {rank}]"), sb);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ModelConfig;
    use tch::{Device, Kind};

    fn tiny() -> Model {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/tiny-qwen2");
        let cfg = ModelConfig::from_file(&dir.join("config.json")).unwrap();
        Model::load(
            &cfg,
            &Weights::from_dir(&dir, Kind::Float, Device::Cpu).unwrap(),
        )
        .unwrap()
    }

    fn random_adapters(m: &Model, targets: &[&str], rank: i64) -> HashMap<String, Adapter> {
        tch::manual_seed(3);
        m.projection_paths(targets)
            .into_iter()
            .map(|(path, (inp, out))| {
                let a = Tensor::randn([rank, inp], (Kind::Float, Device::Cpu)) * 0.1;
                let b = Tensor::randn([out, rank], (Kind::Float, Device::Cpu)) * 0.1;
                (path, Adapter::new(a, b, 2.0))
            })
            .collect()
    }

    fn ids() -> Tensor {
        Tensor::from_slice(&[1i64, 5, 9, 33, 7, 2, 11, 4]).view([2, 4])
    }

    #[test]
    fn adapted_forward_equals_the_merged_model_and_without_is_the_base() {
        let base = tiny();
        let all: Vec<&str> = PROJECTIONS.to_vec();
        let adapted = base.with_adapters(random_adapters(&base, &all, 4)).unwrap();
        assert_eq!(adapted.adapters().len(), 7 * base.layers().len());
        let (lb, la) = (
            base.forward(&ids()).unwrap(),
            adapted.forward(&ids()).unwrap(),
        );
        let moved = (&la - &lb).abs().max().double_value(&[]);
        assert!(moved > 1e-3, "the adapters change the logits ({moved})");
        let merged = adapted.merged().unwrap();
        assert!(merged.adapters().is_empty());
        let lm = merged.forward(&ids()).unwrap();
        let diff = (&la - &lm).abs().max().double_value(&[]);
        assert!(diff < 1e-4, "adapted vs merged logits: {diff}");
        let off = adapted.without_adapters().forward(&ids()).unwrap();
        assert!(off.equal(&lb), "without adapters is the base, exactly");
        // Merging made new tensors: the base weights are untouched.
        assert!(base.forward(&ids()).unwrap().equal(&lb));
    }

    #[test]
    fn zero_b_leaves_the_output_unchanged_and_only_targets_are_adapted() {
        let base = tiny();
        let mut adapters = random_adapters(&base, &["q_proj", "down_proj"], 2);
        for a in adapters.values_mut() {
            a.b = a.b.zeros_like();
        }
        let adapted = base.with_adapters(adapters).unwrap();
        let names: Vec<String> = adapted.adapters().into_iter().map(|(n, _)| n).collect();
        assert_eq!(
            names,
            [
                "model.layers.0.self_attn.q_proj",
                "model.layers.0.mlp.down_proj",
                "model.layers.1.self_attn.q_proj",
                "model.layers.1.mlp.down_proj"
            ]
        );
        assert!(adapted
            .forward(&ids())
            .unwrap()
            .equal(&base.forward(&ids()).unwrap()));
    }

    #[test]
    fn misfit_and_unknown_adapters_are_errors_naming_them() {
        let base = tiny();
        let bad = |path: &str, a: [i64; 2], b: [i64; 2]| {
            let ad = Adapter::new(
                Tensor::zeros(a, (Kind::Float, Device::Cpu)),
                Tensor::zeros(b, (Kind::Float, Device::Cpu)),
                1.0,
            );
            let map = HashMap::from([(path.to_owned(), ad)]);
            base.with_adapters(map).unwrap_err().to_string()
        };
        let e = bad("model.layers.0.self_attn.q_proj", [4, 63], [64, 4]);
        assert!(e.contains("q_proj.lora_A.weight"), "{e}");
        let e = bad("model.layers.0.self_attn.q_proj", [4, 64], [64, 3]);
        assert!(e.contains("q_proj.lora_B.weight"), "{e}");
        let e = bad("model.layers.7.self_attn.q_proj", [4, 64], [64, 4]);
        assert!(e.contains("model.layers.7.self_attn.q_proj"), "{e}");
    }
}

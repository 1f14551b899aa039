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

/// Adapters on the projections one product computes, as an inference
/// engine applies them at decode without merging (vLLM's "shrink" and
/// "expand" of punica): the parts' `A`s stacked in one matrix (Σ rank, in),
/// one product `x Aᵀ` for all of them, then per part `(x Aᵀ)[its ranks]
/// (scale · B)ᵀ` added into its output columns. On a fused q/k/v product
/// the parts are q, k and v (whichever have adapters); on a single
/// projection, one part. `B` is held already scaled, so a part costs two
/// small products and an add; the additions are in place, for a model run
/// without gradients (an engine's).
#[derive(Debug)]
pub struct StackedAdapter {
    a: Tensor,
    parts: Vec<StackedPart>,
}

/// One projection's share of a [`StackedAdapter`]: its first output column
/// in the product, its first row of the stacked `A`, and `scale · B`
/// (out rows, rank).
#[derive(Debug)]
pub struct StackedPart {
    pub out_start: i64,
    pub rank_start: i64,
    pub scaled_b: Tensor,
}

impl Clone for StackedAdapter {
    /// Shares the tensors.
    fn clone(&self) -> Self {
        StackedAdapter {
            a: self.a.shallow_clone(),
            parts: (self.parts.iter())
                .map(|p| StackedPart {
                    out_start: p.out_start,
                    rank_start: p.rank_start,
                    scaled_b: p.scaled_b.shallow_clone(),
                })
                .collect(),
        }
    }
}

impl StackedAdapter {
    /// `a` (Σ rank, in) and the parts (shared, not copied); a part whose
    /// `B` is not a matrix or whose ranks fall outside `a` is an error.
    pub fn new(a: Tensor, parts: Vec<StackedPart>) -> Result<Self> {
        let stacked = match a.size()[..] {
            [r, _] => r,
            _ => {
                return Err(Error::Input(format!(
                    "stacked LoRA A has shape {:?}, expected [ranks, in]",
                    a.size()
                )))
            }
        };
        for p in &parts {
            let ok = matches!(p.scaled_b.size()[..], [_, r] if p.rank_start >= 0 && p.rank_start + r <= stacked);
            if !ok {
                return Err(Error::Input(format!(
                    "stacked LoRA B of shape {:?} at rank {} does not fit A's {stacked} ranks",
                    p.scaled_b.size(),
                    p.rank_start
                )));
            }
        }
        Ok(StackedAdapter { a, parts })
    }

    /// The stacked `A`, (Σ rank, in).
    pub fn a(&self) -> &Tensor {
        &self.a
    }

    pub fn parts(&self) -> &[StackedPart] {
        &self.parts
    }

    /// Adds every part's low-rank path of `x` into its columns of `y`.
    ///
    /// Each product is one kernel on the calling thread: colo-kernels'
    /// `skinny_linear` for a few bfloat16 rows on the CPU (then an add),
    /// else an `addmm_` into the part's columns. Not [`linear`], which
    /// inside a wide pass would hand each of these rank-sized products to
    /// the pass's lanes.
    pub(crate) fn add_to(&self, x: &Tensor, y: Tensor) -> Result<Tensor> {
        let small = |x: &Tensor, w: &Tensor| -> Result<Tensor> {
            Ok(match colo_kernels::skinny_linear_fits(x, w, None) {
                true => colo_kernels::skinny_linear(x, w, None)?,
                false => x.f_linear::<&Tensor>(w, None)?,
            })
        };
        let low = small(x, &self.a)?;
        for p in &self.parts {
            let (rows, rank) = (p.scaled_b.size()[0], p.scaled_b.size()[1]);
            let part = low.f_narrow(-1, p.rank_start, rank)?;
            let mut cols = y.f_narrow(-1, p.out_start, rows)?;
            if colo_kernels::skinny_linear_fits(&part, &p.scaled_b, None) {
                let up = colo_kernels::skinny_linear(&part, &p.scaled_b, None)?;
                drop(cols.f_add_(&up)?);
            } else {
                // Rows of `y` (the leading sizes) flatten into a view.
                let mut cols = cols.f_view([-1, rows])?;
                let part = part.f_reshape([-1, rank])?;
                drop(cols.f_addmm_(&part, &p.scaled_b.f_transpose(0, 1)?)?);
            }
        }
        Ok(y)
    }

    /// Whether it fits a product of weight (out, in).
    fn check_fits(&self, product: &str, w: &Tensor) -> Result<()> {
        let (out, inp) = (w.size()[0], w.size()[1]);
        if self.a.size()[1] != inp {
            return Err(Error::Input(format!(
                "stacked LoRA A of `{product}` has shape {:?}, expected [ranks, {inp}]",
                self.a.size()
            )));
        }
        for p in &self.parts {
            let rows = p.scaled_b.size()[0];
            if p.out_start < 0 || p.out_start + rows > out {
                return Err(Error::Input(format!(
                    "stacked LoRA B of `{product}` covers output columns {}..{}, the product has {out}",
                    p.out_start,
                    p.out_start + rows
                )));
            }
        }
        Ok(())
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

    /// Puts `adapter` (or none) on the product `product` of layer `layer`,
    /// one of the names the layer's forward computes: `self_attn.qkv_proj`
    /// and `mlp.gate_up_proj` when the projections are fused
    /// ([`Model::fuse_projections`]), else `self_attn.q_proj` etc., and
    /// `self_attn.o_proj`, `mlp.down_proj`. An unknown product or an
    /// adapter that does not fit it is an error naming it.
    pub fn set_stacked_adapter(
        &mut self,
        layer: usize,
        product: &str,
        adapter: Option<StackedAdapter>,
    ) -> Result<()> {
        let layers = self.layers().len();
        let block = self
            .layers_mut()
            .get_mut(layer)
            .ok_or_else(|| Error::Input(format!("layer {layer} of a model of {layers} layers")))?;
        let mut products = block.products_mut();
        let names: Vec<&str> = products.iter().map(|(n, _)| *n).collect();
        let names = names.join(", ");
        let Some((_, linear)) = products.iter_mut().find(|(n, _)| *n == product) else {
            return Err(Error::Input(format!(
                "LoRA adapter for `model.layers.{layer}.{product}`, which this model does not \
                 compute (its products: {names})"
            )));
        };
        if let Some(a) = &adapter {
            a.check_fits(&format!("model.layers.{layer}.{product}"), linear.weight())?;
        }
        linear.set_stacked_adapter(adapter);
        Ok(())
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
    use crate::layers::Linear;
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

    /// A fused q/k/v product with stacked adapters on q and v computes
    /// the separate projections' adapted outputs, in float32 (`addmm_`)
    /// and in bfloat16 for a few rows (colo-kernels' kernel where the CPU
    /// has it) within a bfloat16 rounding.
    #[test]
    fn stacked_adapters_on_a_fused_product_equal_the_separate_ones() {
        let base = tiny();
        let mut adapters = random_adapters(&base, &["q_proj", "v_proj"], 3);
        for a in adapters.values_mut() {
            a.b = &a.b * 3.0;
        }
        let projections = base.layers()[0].projections();
        let (lq, lk, lv) = (projections[0].1, projections[1].1, projections[2].1);
        let x = Tensor::randn([2, 3, 64], (Kind::Float, Device::Cpu));
        let path = |p: &str| format!("model.layers.0.self_attn.{p}");
        let (q, v) = (&adapters[&path("q_proj")], &adapters[&path("v_proj")]);
        let want = |lin: &Linear, a: Option<&Adapter>| {
            let y = lin.forward(&x).unwrap();
            a.map_or(y.shallow_clone(), |a| a.add_to(&x, y).unwrap())
        };
        let want = Tensor::cat(&[want(lq, Some(q)), want(lk, None), want(lv, Some(v))], -1);
        let (qr, kvr) = (lq.weight().size()[0], lk.weight().size()[0]);
        for kind in [Kind::Float, Kind::BFloat16] {
            let w = Tensor::cat(&[lq.weight(), lk.weight(), lv.weight()], 0);
            let bias = ["q_proj", "k_proj", "v_proj"].map(|p| {
                base.named_parameters()
                    .into_iter()
                    .find(|(n, _)| *n == format!("{}.bias", path(p)))
                    .unwrap()
                    .1
            });
            let mut fused =
                Linear::from_parts(w.to_kind(kind), Some(Tensor::cat(&bias, 0).to_kind(kind)));
            let part = |a: &Adapter, out_start, rank_start| StackedPart {
                out_start,
                rank_start,
                scaled_b: (a.b() * a.scale()).to_kind(kind),
            };
            let stacked = StackedAdapter::new(
                Tensor::cat(&[q.a(), v.a()], 0).to_kind(kind),
                vec![part(q, 0, 0), part(v, qr + kvr, 3)],
            )
            .unwrap();
            stacked.check_fits("qkv", fused.weight()).unwrap();
            fused.set_stacked_adapter(Some(stacked));
            let _no_grad = tch::no_grad_guard();
            let got = fused
                .forward(&x.to_kind(kind))
                .unwrap()
                .to_kind(Kind::Float);
            let scale = want.abs().max().double_value(&[]);
            let diff = (&got - &want).abs().max().double_value(&[]) / scale;
            let tol = if kind == Kind::Float { 1e-5 } else { 2e-2 };
            assert!(diff < tol, "{kind:?}: relative difference {diff}");
        }
        // Columns past the product's are refused, naming it.
        let bad = StackedAdapter::new(
            Tensor::zeros([2, 64], (Kind::Float, Device::Cpu)),
            vec![StackedPart {
                out_start: 100,
                rank_start: 0,
                scaled_b: Tensor::zeros([64, 2], (Kind::Float, Device::Cpu)),
            }],
        )
        .unwrap();
        let e = bad.check_fits("qkv", lq.weight()).unwrap_err();
        assert!(e.to_string().contains("`qkv`"), "{e}");
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

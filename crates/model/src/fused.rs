//! Projections that read the same input, computed by one matrix product,
//! as inference engines store them (vLLM's `QKVParallelLinear` and
//! `MergedColumnParallelLinear`): per layer, q/k/v in one product and
//! gate/up in another. Fewer, wider products; on CUDA, where a small
//! model's decode step is bound by its kernels, seven fewer a layer (two
//! products, the gate/up one, and one rotation for the query and key heads
//! together).
//!
//! The parameters keep their Hugging Face names and shapes: each one is a
//! row block (a view) of its group's buffer, so whatever writes a
//! parameter in place by name (an engine's `update_weights`) writes the
//! fused product's weight too, and the separate projections still compute
//! the same thing over the same memory. A training model is never fused:
//! its parameters are leaves of their own.

use std::collections::HashMap;

use tch::Tensor;

use crate::config::ModelConfig;
use crate::layers::Linear;
use crate::model::Model;
use crate::{Error, Result};

/// One buffer whose row blocks (dimension 0) are several parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct FusedGroup {
    /// The buffer's name, e.g. `model.layers.0.self_attn.qkv_proj.weight`.
    pub name: String,
    /// The parameters in buffer order, with their rows.
    pub parts: Vec<(String, i64)>,
    /// Columns of a weight (the projections' input size); `None` for a
    /// bias, a vector.
    pub cols: Option<i64>,
}

impl FusedGroup {
    /// The buffer's shape: the parts' rows stacked.
    pub fn shape(&self) -> Vec<i64> {
        let rows = self.parts.iter().map(|(_, r)| r).sum();
        match self.cols {
            Some(c) => vec![rows, c],
            None => vec![rows],
        }
    }

    /// Each part's row block of `buffer`, by parameter name.
    pub fn views(&self, buffer: &Tensor) -> Result<Vec<(String, Tensor)>> {
        if buffer.size() != self.shape() {
            return Err(Error::Input(format!(
                "fused buffer `{}` has shape {:?}, expected {:?}",
                self.name,
                buffer.size(),
                self.shape()
            )));
        }
        let mut at = 0;
        let mut out = Vec::with_capacity(self.parts.len());
        for (name, rows) in &self.parts {
            out.push((name.clone(), buffer.f_narrow(0, at, *rows)?));
            at += rows;
        }
        Ok(out)
    }
}

/// The groups of `cfg`'s parameters that [`Model::fuse_projections`]
/// takes: per layer `self_attn.qkv_proj.weight` (q, k, v), its `.bias` when
/// the projections have biases, and `mlp.gate_up_proj.weight` (gate, up).
pub fn fused_groups(cfg: &ModelConfig) -> Vec<FusedGroup> {
    let (h, d) = (cfg.hidden_size as i64, cfg.head_dim as i64);
    let (q, kv) = (cfg.num_heads as i64 * d, cfg.num_kv_heads as i64 * d);
    let i = cfg.intermediate_size as i64;
    let group = |prefix: &str, fused: &str, parts: &[(&str, i64)], what: &str, cols| FusedGroup {
        name: format!("{prefix}.{fused}.{what}"),
        parts: parts
            .iter()
            .map(|(p, rows)| (format!("{prefix}.{p}.{what}"), *rows))
            .collect(),
        cols,
    };
    let mut out = Vec::new();
    for l in 0..cfg.num_layers {
        let attn = format!("model.layers.{l}.self_attn");
        let qkv = [("q_proj", q), ("k_proj", kv), ("v_proj", kv)];
        out.push(group(&attn, "qkv_proj", &qkv, "weight", Some(h)));
        if cfg.qkv_bias {
            out.push(group(&attn, "qkv_proj", &qkv, "bias", None));
        }
        let mlp = format!("model.layers.{l}.mlp");
        let gate_up = [("gate_proj", i), ("up_proj", i)];
        out.push(group(&mlp, "gate_up_proj", &gate_up, "weight", Some(h)));
    }
    out
}

/// Whether `part` is exactly `buffer`'s row block `view` (same address,
/// shape and strides): then the fused product computes what the part does.
fn aliases(part: &Tensor, view: &Tensor) -> bool {
    part.data_ptr() == view.data_ptr()
        && part.size() == view.size()
        && part.stride() == view.stride()
}

impl Model {
    /// Computes every layer's q/k/v projections with one product, and its
    /// gate/up projections with another, over `buffers`: for each of
    /// [`fused_groups`], the buffer under its name, whose row blocks
    /// ([`FusedGroup::views`]) must be this model's parameters' own memory
    /// (load the model over the views). Anything else is an error naming
    /// the parameter, and leaves the model as it was.
    pub fn fuse_projections(&mut self, buffers: &HashMap<String, Tensor>) -> Result<()> {
        let params: HashMap<String, Tensor> = self.named_parameters().into_iter().collect();
        let mut fused: HashMap<String, Tensor> = HashMap::new();
        for g in fused_groups(self.config()) {
            let buffer = buffers
                .get(&g.name)
                .ok_or_else(|| Error::Input(format!("fuse_projections: no buffer `{}`", g.name)))?;
            for (name, view) in g.views(buffer)? {
                if !aliases(&params[&name], &view) {
                    return Err(Error::Input(format!(
                        "fuse_projections: parameter `{name}` is not its row block of `{}` \
                         (load the model over the buffer's views)",
                        g.name
                    )));
                }
            }
            fused.insert(g.name, buffer.shallow_clone());
        }
        let take = |name: String| fused.get(&name).map(Tensor::shallow_clone);
        for (l, layer) in self.layers_mut().iter_mut().enumerate() {
            let attn = format!("model.layers.{l}.self_attn.qkv_proj");
            let qkv = take(format!("{attn}.weight")).expect("checked above");
            layer
                .self_attn
                .set_fused(Linear::from_parts(qkv, take(format!("{attn}.bias"))));
            let gate_up = take(format!("model.layers.{l}.mlp.gate_up_proj.weight"));
            layer
                .mlp
                .set_fused(Linear::from_parts(gate_up.expect("checked above"), None));
        }
        Ok(())
    }
}

//! Named tensors in and out of safetensors files, single or sharded.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use candle_core::{DType, Device, Tensor};

use crate::{Error, ModelConfig, Result};

/// The weights file of a single-file checkpoint.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// The index that maps tensor names to shards in a sharded checkpoint.
pub const WEIGHTS_INDEX_FILE: &str = "model.safetensors.index.json";

/// Tensors by their Hugging Face name, converted to one dtype on one device.
#[derive(Debug, Clone, Default)]
pub struct Weights {
    tensors: HashMap<String, Tensor>,
}

impl Weights {
    /// Wraps tensors already in memory (for tests, or weights handed over
    /// from a trainer).
    pub fn from_tensors(tensors: HashMap<String, Tensor>) -> Self {
        Weights { tensors }
    }

    /// Reads `model.safetensors`, or every shard that
    /// `model.safetensors.index.json` names, from a checkpoint directory.
    pub fn from_dir(dir: &Path, dtype: DType, device: &Device) -> Result<Self> {
        let single = dir.join(WEIGHTS_FILE);
        let index = dir.join(WEIGHTS_INDEX_FILE);
        let files = if single.is_file() {
            vec![single]
        } else if index.is_file() {
            shard_files(&index)?
                .into_iter()
                .map(|f| dir.join(f))
                .collect()
        } else {
            return Err(Error::MissingFile { path: single });
        };
        let mut tensors = HashMap::new();
        for file in files {
            let bytes = std::fs::read(&file).map_err(|e| Error::io(&file, e))?;
            for (name, t) in candle_core::safetensors::load_buffer(&bytes, device)? {
                let t = if t.dtype() == dtype {
                    t
                } else {
                    t.to_dtype(dtype)?
                };
                tensors.insert(name, t);
            }
        }
        Ok(Weights { tensors })
    }

    /// Freshly initialised weights for `cfg` (for tests, benchmarks and
    /// built-in toy models): matrices normal with standard deviation `std`
    /// as transformers' `initializer_range`, norms one, biases zero.
    pub fn random(cfg: &ModelConfig, std: f64, dtype: DType, device: &Device) -> Result<Self> {
        let mut tensors = HashMap::new();
        for (name, shape) in cfg.parameter_shapes() {
            let t = if name.ends_with("norm.weight") {
                Tensor::ones(shape, dtype, device)?
            } else if name.ends_with(".bias") {
                Tensor::zeros(shape, dtype, device)?
            } else {
                Tensor::randn(0f32, std as f32, shape, device)?.to_dtype(dtype)?
            };
            tensors.insert(name, t);
        }
        Ok(Weights { tensors })
    }

    /// The tensor `name`, which must have exactly `shape`.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let t = self.tensors.get(name).ok_or_else(|| Error::MissingTensor {
            name: name.to_owned(),
        })?;
        if t.dims() != shape {
            return Err(Error::ShapeMismatch {
                name: name.to_owned(),
                expected: shape.to_vec(),
                found: t.dims().to_vec(),
            });
        }
        Ok(t.clone())
    }

    /// Whether a tensor of this name is present.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// The tensor names, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.tensors.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }
}

/// The distinct shard file names in a safetensors index, in sorted order.
fn shard_files(index: &Path) -> Result<BTreeSet<String>> {
    #[derive(serde::Deserialize)]
    struct Index {
        weight_map: HashMap<String, String>,
    }
    let text = std::fs::read_to_string(index).map_err(|e| Error::io(index, e))?;
    let parsed: Index = serde_json::from_str(&text).map_err(|source| Error::Json {
        path: index.to_owned(),
        source,
    })?;
    Ok(parsed.weight_map.into_values().collect())
}

/// Writes named tensors to one safetensors file with the `format: pt`
/// metadata transformers expects.
pub fn save_safetensors(tensors: &[(String, Tensor)], path: &Path) -> Result<()> {
    let metadata = HashMap::from([("format".to_owned(), "pt".to_owned())]);
    let views: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    safetensors::serialize_to_file(views, Some(metadata), path)?;
    Ok(())
}

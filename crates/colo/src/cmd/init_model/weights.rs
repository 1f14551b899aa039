//! The weights: transformers' initialisation drawn tensor by tensor,
//! written as safetensors in one file or in shards with their index.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use rayon::prelude::*;
use safetensors::{Dtype, View};
use serde_json::json;

use super::normals::{mix, Normals};
use super::{write_json, WeightDtype, INITIALIZER_RANGE};

/// The index of a sharded checkpoint.
pub(super) const INDEX_FILE: &str = "model.safetensors.index.json";

pub(super) fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// How a tensor is initialised (transformers' `_init_weights` for Qwen2,
/// Qwen3 and Llama).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Init {
    Normal(f32),
    Ones,
    Zeros,
}

impl Init {
    fn of(name: &str) -> Init {
        if name.ends_with("norm.weight") {
            Init::Ones
        } else if name.ends_with(".bias") {
            Init::Zeros
        } else {
            Init::Normal(INITIALIZER_RANGE as f32)
        }
    }
}

/// One tensor, drawn when the writer asks for its bytes
/// ([`View::data`]): the file is written one tensor at a time.
struct Lazy {
    shape: Vec<usize>,
    dtype: WeightDtype,
    init: Init,
    seed: u64,
}

impl View for &Lazy {
    fn dtype(&self) -> Dtype {
        self.dtype.safetensors()
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Owned(fill(numel(&self.shape), self.dtype, self.init, self.seed))
    }
    fn data_len(&self) -> usize {
        numel(&self.shape) * self.dtype.bytes()
    }
}

/// Elements drawn from one generator: chunks are filled in parallel, each
/// from its own seed, so the bytes do not depend on the thread count.
const CHUNK: usize = 1 << 16;

/// `n` elements of `init` in `dtype`'s little-endian bytes.
fn fill(n: usize, dtype: WeightDtype, init: Init, seed: u64) -> Vec<u8> {
    let width = dtype.bytes();
    let mut out = vec![0u8; n * width];
    let one = |v: f32, dst: &mut [u8]| match dtype {
        WeightDtype::Bf16 => dst.copy_from_slice(&bf16_bits(v).to_le_bytes()),
        WeightDtype::F32 => dst.copy_from_slice(&v.to_le_bytes()),
    };
    match init {
        Init::Zeros => {}
        Init::Ones => out.chunks_exact_mut(width).for_each(|d| one(1.0, d)),
        Init::Normal(std) => {
            out.par_chunks_mut(CHUNK * width)
                .enumerate()
                .for_each(|(i, bytes)| {
                    let mut rng = Normals::new(mix(seed ^ mix(i as u64)));
                    for d in bytes.chunks_exact_mut(width) {
                        one(rng.next() * std, d);
                    }
                });
        }
    }
    out
}

/// `v` rounded to the nearest bfloat16 (ties to even), as torch's
/// `.to(torch.bfloat16)` rounds (finite values; the draws are).
fn bf16_bits(v: f32) -> u16 {
    let b = v.to_bits();
    ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) as u16
}

/// A tensor's seed: the run's seed and its name (FNV-1a), so that each
/// tensor's values depend on nothing else.
fn tensor_seed(seed: u64, name: &str) -> u64 {
    let fnv = name.bytes().fold(0xCBF2_9CE4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01B3)
    });
    mix(mix(seed) ^ fnv)
}

/// Splits tensors of `sizes` bytes (in the state dict's order) into shards
/// as huggingface_hub's `split_torch_state_dict_into_shards` does: a
/// tensor that would take a shard past `max` starts the next one; a
/// tensor larger than `max` is a shard of its own.
pub(super) fn plan_shards(sizes: &[u64], max: u64) -> Vec<std::ops::Range<usize>> {
    let mut shards = Vec::new();
    let (mut start, mut bytes) = (0, 0u64);
    for (i, &size) in sizes.iter().enumerate() {
        if i > start && bytes + size > max {
            shards.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes += size;
    }
    if start < sizes.len() {
        shards.push(start..sizes.len());
    }
    shards
}

/// The file name of shard `i` (from 0) of `n`, as transformers names it.
fn shard_name(i: usize, n: usize) -> String {
    if n == 1 {
        colo_model::weights::WEIGHTS_FILE.to_owned()
    } else {
        format!("model-{:05}-of-{n:05}.safetensors", i + 1)
    }
}

/// Writes the tensors `shapes` (name and shape, the state dict's order)
/// into `dir` in shards of at most `max_shard` bytes, with the index when
/// there are two or more. Returns the files and the tensor bytes.
pub(super) fn write_weights(
    dir: &Path,
    shapes: &[(String, Vec<usize>)],
    dtype: WeightDtype,
    seed: u64,
    max_shard: u64,
) -> Result<(Vec<String>, u64)> {
    let tensors: Vec<(&str, Lazy)> = shapes
        .iter()
        .map(|(name, shape)| {
            let lazy = Lazy {
                shape: shape.clone(),
                dtype,
                init: Init::of(name),
                seed: tensor_seed(seed, name),
            };
            (name.as_str(), lazy)
        })
        .collect();
    let sizes: Vec<u64> = tensors
        .iter()
        .map(|(_, t)| (&t).data_len() as u64)
        .collect();
    let shards = plan_shards(&sizes, max_shard);
    let mut files = Vec::with_capacity(shards.len());
    let mut weight_map = BTreeMap::new();
    for (i, range) in shards.iter().enumerate() {
        let file = shard_name(i, shards.len());
        let path = dir.join(&file);
        let bytes: u64 = sizes[range.clone()].iter().sum();
        let started = Instant::now();
        let views = tensors[range.clone()].iter().map(|(n, t)| (*n, t));
        let metadata = HashMap::from([("format".to_owned(), "pt".to_owned())]);
        let failed = || {
            format!(
                "writing {} ({} of tensors)",
                path.display(),
                colo_mem::fmt_bytes(bytes)
            )
        };
        // The crate writes a temporary file (mode 0600) and renames it into
        // place: the file gets the mode a file created here has (the
        // umask's), as the directory's other files do.
        let mode = std::fs::File::create(&path)
            .and_then(|f| f.metadata())
            .with_context(failed)?
            .permissions();
        if let Err(e) = safetensors::serialize_to_file(views, Some(metadata), &path) {
            // The crate removes its temporary file; the empty one made for
            // its mode goes too, so that no weights file is left half-made.
            let _ = std::fs::remove_file(&path);
            return Err(anyhow::Error::new(e).context(failed()));
        }
        std::fs::set_permissions(&path, mode).with_context(failed)?;
        if shards.len() > 1 {
            eprintln!(
                "wrote {file} ({}) in {:.1} s",
                colo_mem::fmt_bytes(bytes),
                started.elapsed().as_secs_f64()
            );
        }
        for (name, _) in &tensors[range.clone()] {
            weight_map.insert(name.to_string(), file.clone());
        }
        files.push(file);
    }
    let total: u64 = sizes.iter().sum();
    if shards.len() > 1 {
        let params: u64 = shapes.iter().map(|(_, s)| numel(s) as u64).sum();
        let index = json!({
            "metadata": {"total_parameters": params, "total_size": total},
            "weight_map": weight_map,
        });
        write_json(&dir.join(INDEX_FILE), &index)?;
    }
    Ok((files, total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_split_as_huggingface_hub_splits() {
        assert_eq!(plan_shards(&[3, 3, 3], 10), vec![0..3]);
        assert_eq!(plan_shards(&[3, 3, 3], 6), vec![0..2, 2..3]);
        // A tensor over the limit is a shard of its own.
        assert_eq!(plan_shards(&[2, 9, 2, 2], 5), vec![0..1, 1..2, 2..4]);
        assert_eq!(plan_shards(&[9], 5), vec![0..1]);
        assert_eq!(shard_name(0, 1), "model.safetensors");
        assert_eq!(shard_name(1, 3), "model-00002-of-00003.safetensors");
    }

    #[test]
    fn a_failed_write_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("gone");
        let shapes = [("model.norm.weight".to_owned(), vec![8])];
        let e = write_weights(&gone, &shapes, WeightDtype::Bf16, 0, 1 << 20).unwrap_err();
        let said = format!("{e:#}");
        assert!(
            said.starts_with(&format!(
                "writing {}",
                gone.join("model.safetensors").display()
            )),
            "{said}"
        );
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(bf16_bits(1.0), 0x3F80);
        assert_eq!(bf16_bits(-2.0), 0xC000);
        // 1 + 2^-8 is half-way between 1 and 1 + 2^-7: to even (1).
        assert_eq!(bf16_bits(1.0 + 1.0 / 256.0), 0x3F80);
        // 1 + 3·2^-8 is half-way between 1 + 2^-7 and 1 + 2^-6: to even (up).
        assert_eq!(bf16_bits(1.0 + 3.0 / 256.0), 0x3F82);
        assert_eq!(bf16_bits(0.02), 0x3CA4);
    }

    fn as_f32(bytes: &[u8]) -> Vec<f32> {
        bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn draws_are_normal_seeded_and_independent_of_threads() {
        let n = 16 * CHUNK + 17;
        let a = fill(n, WeightDtype::F32, Init::Normal(0.02), 7);
        let x = as_f32(&a);
        let moment = |k: i32| x.iter().map(|&v| (v as f64 / 0.02).powi(k)).sum::<f64>() / n as f64;
        // Standard errors at n ≈ 10⁶: 0.001 (mean), 0.0014 (variance),
        // 0.01 (fourth moment, 3 for a normal).
        assert!(moment(1).abs() < 0.005, "{}", moment(1));
        assert!((moment(2) - 1.0).abs() < 0.007, "{}", moment(2));
        assert!(moment(3).abs() < 0.02, "{}", moment(3));
        assert!((moment(4) - 3.0).abs() < 0.05, "{}", moment(4));
        // Two-sided tails: 31.73% past 1σ, 0.2700% past 3σ, 0.0465% past
        // 3.5σ (the ziggurat's own tail starts at 3.44σ).
        let past = |k: f32| x.iter().filter(|v| v.abs() > k * 0.02).count() as f64 / n as f64;
        assert!((past(1.0) - 0.3173).abs() < 0.003, "{}", past(1.0));
        assert!((past(3.0) - 0.0027).abs() < 0.0003, "{}", past(3.0));
        assert!((past(3.5) - 0.000465).abs() < 0.00012, "{}", past(3.5));
        let one_thread = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let b = one_thread.install(|| fill(n, WeightDtype::F32, Init::Normal(0.02), 7));
        assert_eq!(a, b);
        assert_ne!(a, fill(n, WeightDtype::F32, Init::Normal(0.02), 8));
        assert_ne!(tensor_seed(0, "a.weight"), tensor_seed(0, "b.weight"));
        let ones = fill(3, WeightDtype::Bf16, Init::Ones, 0);
        assert_eq!(ones, [0x80, 0x3F].repeat(3));
        assert_eq!(fill(3, WeightDtype::Bf16, Init::Zeros, 0), vec![0; 6]);
    }
}

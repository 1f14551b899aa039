//! `colo init-model`: a Hugging Face model directory with the published
//! shape of one of the planner's presets (`colo_plan::presets`), random
//! weights, a small tokenizer and a `colo train` config for it, so that
//! benchmarks and tests run at real sizes without downloading anything.
//!
//! What it writes into `--out`:
//!
//! - `config.json`: the keys and values of the base model's published
//!   `config.json` (the repository [`Published::repo`] names), in the
//!   dtype written, with `bos_token_id` / `eos_token_id` the small
//!   tokenizer's ids of the same tokens;
//! - the weights, named as transformers names them, drawn as transformers
//!   initialises them (`_init_weights`: normal(0, `initializer_range` =
//!   0.02) for every projection and the embedding, ones for RMSNorm
//!   weights, zeros for biases), seeded: the same `--seed` gives the same
//!   bytes on any machine and with any number of threads. Written one
//!   tensor at a time (the largest tensor is the only one in memory), in
//!   one `model.safetensors`, or, past `--max-shard-size`, in shards
//!   `model-0000i-of-0000N.safetensors` with their
//!   `model.safetensors.index.json`, split as transformers'
//!   `save_pretrained` splits them;
//! - `tokenizer.json`, `tokenizer_config.json`, `generation_config.json`: a
//!   byte-level BPE tokenizer without merges (one token per byte, so any
//!   text encodes) and the special tokens of the family's chat template
//!   (which `tokenizer_config.json` carries): a few hundred ids, far below
//!   the model's vocabulary (its other embedding rows are never used);
//! - `run.toml`: a `colo train` run of this model on the built-in
//!   arithmetic task (issue 36's job: 4 prompts × 4 samples × 16 new
//!   tokens, 5 steps).
//!
//! Measured here (2 cores, one disk): see the README's "Real model
//! shapes".

//!
//! The files: the command and the directory in this one; `config_json.rs`
//! the config; `tokenizer.rs` the small tokenizer; `weights.rs` the
//! initialisation and the safetensors shards, drawn from `normals.rs`;
//! `run_toml.rs` the run config.

mod config_json;
mod normals;
mod run_toml;
mod tokenizer;
mod weights;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use colo_plan::model::ModelSpec;
use colo_plan::presets::Published;
use safetensors::Dtype;
use serde_json::Value;

use config_json::config_json;
pub(crate) use run_toml::run_toml;
use tokenizer::SmallTokenizer;
use weights::{numel, write_weights, INDEX_FILE};

/// transformers' `initializer_range` of every preset's config.
const INITIALIZER_RANGE: f64 = 0.02;

/// The default shard limit: transformers' `max_shard_size` ("5GB").
const DEFAULT_MAX_SHARD: &str = "5GB";

#[derive(clap::Args)]
pub struct Args {
    /// The model's preset (`--list` shows them with their sizes): the
    /// published config.json's shape of e.g. qwen2.5-0.5b, qwen2.5-7b,
    /// qwen3-0.6b, qwen3-8b, llama-3.1-8b.
    #[arg(long, required_unless_present = "list")]
    preset: Option<String>,
    /// The directory to write (created; one that exists and holds files is
    /// refused unless --force).
    #[arg(long, required_unless_present = "list")]
    out: Option<PathBuf>,
    /// Seed of the random weights: the same seed writes the same bytes.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// dtype of the weights written (and config.json's torch_dtype).
    #[arg(long, value_enum, default_value_t = WeightDtype::Bf16)]
    dtype: WeightDtype,
    /// Largest weights file, as transformers' `max_shard_size` ("5GB":
    /// decimal units; "4GiB": binary); a model past it is written in
    /// shards with an index.
    #[arg(long, default_value = DEFAULT_MAX_SHARD, value_parser = parse_size)]
    max_shard_size: u64,
    /// Write into a directory that holds files (its config.json and
    /// weights files are removed first; other files are left).
    #[arg(long)]
    force: bool,
    /// List the presets with their parameters and bytes, and exit.
    #[arg(long)]
    list: bool,
}

/// The dtype of the weights written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WeightDtype {
    Bf16,
    F32,
}

impl WeightDtype {
    fn bytes(self) -> usize {
        match self {
            WeightDtype::Bf16 => 2,
            WeightDtype::F32 => 4,
        }
    }

    fn safetensors(self) -> Dtype {
        match self {
            WeightDtype::Bf16 => Dtype::BF16,
            WeightDtype::F32 => Dtype::F32,
        }
    }

    fn torch_name(self) -> &'static str {
        match self {
            WeightDtype::Bf16 => "bfloat16",
            WeightDtype::F32 => "float32",
        }
    }
}

fn parse_size(text: &str) -> std::result::Result<u64, String> {
    match text.parse::<bytesize::ByteSize>().map(|b| b.as_u64()) {
        Ok(0) => Err("must be more than 0 bytes".into()),
        Ok(b) => Ok(b),
        Err(e) => Err(format!("{e} (e.g. \"5GB\", \"500MB\", \"4GiB\")")),
    }
}

pub fn run(a: Args) -> Result<()> {
    if a.list {
        print!("{}", preset_table());
        return Ok(());
    }
    let (Some(name), Some(out)) = (a.preset.as_deref(), a.out.as_deref()) else {
        unreachable!("clap requires --preset and --out without --list");
    };
    let (spec, published) = colo_plan::presets::published(name).map_err(|e| {
        anyhow::anyhow!("{e}\n\n{}", preset_table()).context("colo init-model --preset")
    })?;
    prepare_dir(out, a.force)?;
    let start = Instant::now();
    let written = write_model(out, &spec, &published, a.dtype, a.seed, a.max_shard_size)?;
    let files = match written.files.len() {
        1 => written.files[0].clone(),
        n => format!("{n} shards and {}", INDEX_FILE),
    };
    eprintln!(
        "wrote {}: {} ({}, {} parameters), {} of {} weights in {files}, a {}-token tokenizer, run.toml; {:.1} s",
        out.display(),
        spec.name,
        published.family.architecture(),
        thousands(written.params),
        colo_mem::fmt_bytes(written.bytes),
        a.dtype.torch_name(),
        written.tokens,
        start.elapsed().as_secs_f64()
    );
    eprintln!(
        "train it: colo train --config {}",
        out.join("run.toml").display()
    );
    Ok(())
}

/// What [`write_model`] wrote.
#[derive(Debug)]
pub struct Written {
    /// The weights files, in order.
    pub files: Vec<String>,
    pub params: u64,
    /// Bytes of tensor data (the index's `total_size`).
    pub bytes: u64,
    /// The tokenizer's vocabulary.
    pub tokens: usize,
}

/// Writes the whole directory: weights first and `config.json` last, so
/// that a directory whose writing failed half-way does not load as a model.
pub fn write_model(
    dir: &Path,
    spec: &ModelSpec,
    published: &Published,
    dtype: WeightDtype,
    seed: u64,
    max_shard: u64,
) -> Result<Written> {
    let tok = SmallTokenizer::for_family(published.family);
    let config = config_json(spec, published, dtype, &tok);
    let shapes = parameter_shapes(&config)?;
    let (files, bytes) = write_weights(dir, &shapes, dtype, seed, max_shard)?;
    write_json(&dir.join("tokenizer.json"), &tok.tokenizer_json())?;
    let max_len = published.max_position_embeddings;
    write_json(
        &dir.join("tokenizer_config.json"),
        &tok.tokenizer_config_json(max_len),
    )?;
    write_json(
        &dir.join("generation_config.json"),
        &tok.generation_config_json(),
    )?;
    let run = run_toml(dir, &spec.name)?;
    write_text(&dir.join("run.toml"), &run)?;
    write_json(&dir.join("config.json"), &config)?;
    Ok(Written {
        files,
        params: shapes.iter().map(|(_, s)| numel(s) as u64).sum(),
        bytes,
        tokens: tok.len(),
    })
}

/// The parameters of the model `config` (a `config.json`) describes, as
/// colo-model reads it: names and shapes in the state dict's order.
fn parameter_shapes(config: &Value) -> Result<Vec<(String, Vec<usize>)>> {
    let model = serde_json::from_value::<colo_model::HfConfig>(config.clone())
        .context("the config.json written")?
        .into_config()
        .context("the config.json written")?;
    Ok(model.parameter_shapes())
}

/// Creates `dir`, refusing one that holds files unless `force`; with
/// `force`, the config.json and weights files of an earlier model there
/// are removed (a sharded model replaced by a single file would otherwise
/// leave its shards and index behind, and a write that fails would leave
/// the earlier config.json over half the weights).
fn prepare_dir(dir: &Path, force: bool) -> Result<()> {
    if dir.exists() && !dir.is_dir() {
        bail!("--out {}: exists and is not a directory", dir.display());
    }
    if dir.is_dir() {
        let entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .map(|e| e.map(|e| e.path()))
            .collect::<std::io::Result<_>>()
            .with_context(|| format!("reading {}", dir.display()))?;
        if !entries.is_empty() && !force {
            bail!(
                "--out {} exists and is not empty ({} entries): name a new directory, or pass --force to write into it",
                dir.display(),
                entries.len()
            );
        }
        for path in entries.iter().filter(|p| is_model_file(p)) {
            std::fs::remove_file(path)
                .with_context(|| format!("removing the earlier {}", path.display()))?;
        }
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
}

/// `config.json`, `model.safetensors`, `model-*.safetensors` and the
/// index: what a model is loaded from.
fn is_model_file(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name == "config.json"
        || name == INDEX_FILE
        || (name.starts_with("model") && name.ends_with(".safetensors"))
}

// ---------------------------------------------------------------------------
// --list, files

/// The presets, their families, parameters and bytes in bf16.
fn preset_table() -> String {
    let mut out = format!(
        "{:<14} {:<18} {:>15} {:>10}  {}\n",
        "preset", "architecture", "parameters", "bf16", "published config"
    );
    for name in colo_plan::presets::preset_names() {
        let (spec, p) = colo_plan::presets::published(name).expect("a listed preset");
        out.push_str(&format!(
            "{:<14} {:<18} {:>15} {:>10}  {}\n",
            name,
            p.family.architecture(),
            thousands(spec.params()),
            colo_mem::fmt_bytes(spec.params() * 2),
            p.repo
        ));
    }
    out
}

/// `1234567` as `1,234,567`.
pub(crate) fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn write_json(path: &Path, v: &Value) -> Result<()> {
    write_text(path, &(serde_json::to_string_pretty(v)? + "\n"))
}

fn write_text(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use colo_model::Checkpoint;
    use serde_json::json;
    use tch::{Device, Kind};
    use weights::plan_shards;

    /// Under transformers' default limit the models up to 1.5 B are one
    /// file, the 7–8 B ones four shards.
    #[test]
    fn the_default_limit_shards_the_large_presets() {
        let max = parse_size(DEFAULT_MAX_SHARD).unwrap();
        for (name, shards) in [
            ("qwen2.5-0.5b", 1),
            ("qwen2.5-1.5b", 1),
            ("qwen3-0.6b", 1),
            ("qwen2.5-7b", 4),
            ("qwen3-8b", 4),
            ("llama-3.1-8b", 4),
        ] {
            let (spec, published) = colo_plan::presets::published(name).unwrap();
            let tok = SmallTokenizer::for_family(published.family);
            let config = config_json(&spec, &published, WeightDtype::Bf16, &tok);
            let shapes = parameter_shapes(&config).unwrap();
            let sizes: Vec<u64> = shapes.iter().map(|(_, s)| 2 * numel(s) as u64).collect();
            assert_eq!(sizes.iter().sum::<u64>(), 2 * spec.params(), "{name}");
            let planned = plan_shards(&sizes, max);
            assert_eq!(planned.len(), shards, "{name}");
            for range in planned {
                assert!(sizes[range].iter().sum::<u64>() <= max, "{name}");
            }
        }
    }

    #[test]
    fn force_replaces_the_model_files_only() {
        let dir = tempfile::tempdir().unwrap();
        let stale = [
            "config.json",
            "model.safetensors",
            "model-00001-of-00002.safetensors",
            INDEX_FILE,
        ];
        for name in stale.iter().chain(&["notes.txt", "run.toml"]) {
            std::fs::write(dir.path().join(name), "x").unwrap();
        }
        let e = prepare_dir(dir.path(), false).unwrap_err().to_string();
        assert!(
            e.contains("is not empty (6 entries)") && e.contains("--force"),
            "{e}"
        );
        prepare_dir(dir.path(), true).unwrap();
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["notes.txt", "run.toml"]);
        let file = dir.path().join("notes.txt");
        let e = prepare_dir(&file, true).unwrap_err().to_string();
        assert!(e.contains("not a directory"), "{e}");
        // A directory that does not exist yet is made, parents included.
        prepare_dir(&dir.path().join("a/b"), false).unwrap();
        assert!(dir.path().join("a/b").is_dir());
    }

    #[test]
    fn sizes_parse_in_decimal_and_binary_units() {
        assert_eq!(parse_size("5GB"), Ok(5_000_000_000));
        assert_eq!(parse_size("1KiB"), Ok(1024));
        assert!(parse_size("0").is_err());
        assert!(parse_size("lots").unwrap_err().contains("5GB"));
    }

    /// A small Qwen3 (q/k norms) written in shards by the command's own
    /// writer loads through its index, every tensor as written.
    #[test]
    fn a_sharded_model_loads_through_its_index() {
        let dir = tempfile::tempdir().unwrap();
        let (mut spec, mut published) = colo_plan::presets::published("qwen3-0.6b").unwrap();
        (spec.hidden, spec.intermediate, spec.layers) = (64, 96, 3);
        (spec.heads, spec.kv_heads, spec.head_dim, spec.vocab) = (4, 2, 16, 300);
        published.max_position_embeddings = 256;
        // About 40 KB of weights in shards of at most 12 KB.
        let w = write_model(dir.path(), &spec, &published, WeightDtype::F32, 3, 12_000).unwrap();
        assert!(w.files.len() >= 3, "{:?}", w.files);
        let index: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join(INDEX_FILE)).unwrap())
                .unwrap();
        assert_eq!(index["metadata"]["total_size"], json!(w.bytes));
        assert_eq!(w.bytes, w.params * 4);
        let ckpt = Checkpoint::from_dir(dir.path(), Kind::Float, Device::Cpu).unwrap();
        let cfg = ckpt.model.config();
        assert_eq!(cfg.num_parameters() as u64, w.params);
        assert_eq!(spec.params(), w.params, "the planner counts q/k norms");
        let named = ckpt.model.named_parameters();
        let q_norm = &named
            .iter()
            .find(|(n, _)| n == "model.layers.2.self_attn.q_norm.weight")
            .unwrap()
            .1;
        assert_eq!(q_norm.size(), [16]);
        assert_eq!(q_norm.min().double_value(&[]), 1.0);
        let files: std::collections::BTreeSet<&str> = index["weight_map"]
            .as_object()
            .unwrap()
            .values()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(files.len(), w.files.len());
        // The same weights as one file.
        let single = tempfile::tempdir().unwrap();
        write_model(
            single.path(),
            &spec,
            &published,
            WeightDtype::F32,
            3,
            u64::MAX,
        )
        .unwrap();
        let one = Checkpoint::from_dir(single.path(), Kind::Float, Device::Cpu).unwrap();
        for ((n, a), (m, b)) in named.iter().zip(one.model.named_parameters()) {
            assert_eq!(n, &m);
            assert!(a.equal(&b), "{n}");
        }
    }
}

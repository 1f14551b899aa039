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

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use colo_plan::model::ModelSpec;
use colo_plan::presets::{Family, Published};
use rayon::prelude::*;
use safetensors::{Dtype, View};
use serde_json::{json, Value};

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
// config.json

/// The published `config.json` of `published.repo` with the shape of
/// `spec`: the same keys, sorted as transformers writes them, and the
/// token ids of `tok`.
fn config_json(
    spec: &ModelSpec,
    published: &Published,
    dtype: WeightDtype,
    tok: &SmallTokenizer,
) -> Value {
    let family = published.family;
    let mut c = json!({
        "architectures": [family.architecture()],
        "attention_dropout": 0.0,
        "bos_token_id": tok.id(tok.config_bos),
        "eos_token_id": tok.id(tok.config_eos),
        "hidden_act": "silu",
        "hidden_size": spec.hidden,
        "initializer_range": INITIALIZER_RANGE,
        "intermediate_size": spec.intermediate,
        "max_position_embeddings": published.max_position_embeddings,
        "model_type": family.model_type(),
        "num_attention_heads": spec.heads,
        "num_hidden_layers": spec.layers,
        "num_key_value_heads": spec.kv_heads,
        "rms_norm_eps": published.rms_norm_eps,
        "rope_theta": published.rope_theta,
        "tie_word_embeddings": spec.tie_embeddings,
        // transformers 4 reads `torch_dtype`, 5 writes `dtype`.
        "torch_dtype": dtype.torch_name(),
        "dtype": dtype.torch_name(),
        "use_cache": true,
        "vocab_size": spec.vocab,
    });
    let qwen_window = |c: &mut Value| {
        c["max_window_layers"] = json!(published.max_window_layers);
        c["sliding_window"] = json!(published.sliding_window);
        c["use_sliding_window"] = json!(false);
    };
    match family {
        Family::Qwen2 => {
            qwen_window(&mut c);
            c["use_mrope"] = json!(false);
        }
        Family::Qwen3 => {
            qwen_window(&mut c);
            c["attention_bias"] = json!(false);
            c["head_dim"] = json!(spec.head_dim);
            c["rope_scaling"] = Value::Null;
        }
        Family::Llama => {
            c["attention_bias"] = json!(false);
            c["head_dim"] = json!(spec.head_dim);
            c["mlp_bias"] = json!(false);
            c["pretraining_tp"] = json!(1);
            c["rope_scaling"] = json!(published.rope_llama3.map(|r| json!({
                "factor": r.factor,
                "low_freq_factor": r.low_freq_factor,
                "high_freq_factor": r.high_freq_factor,
                "original_max_position_embeddings": r.original_max_position_embeddings,
                "rope_type": "llama3",
            })));
        }
    }
    c
}

// ---------------------------------------------------------------------------
// The tokenizer

/// A byte-level BPE tokenizer without merges: ids 0–255 are the bytes (in
/// GPT-2's byte-to-character alphabet, as Qwen's and Llama 3's
/// tokenizers spell them), then the family's special and added tokens.
struct SmallTokenizer {
    /// Tokens after the 256 bytes: (text, special).
    added: Vec<(&'static str, bool)>,
    /// `tokenizer_config.json`'s bos, eos and pad tokens.
    bos: Option<&'static str>,
    eos: &'static str,
    pad: Option<&'static str>,
    /// `config.json`'s bos and eos (the published base model's).
    config_bos: &'static str,
    config_eos: &'static str,
    /// `generation_config.json`'s eos tokens: the chat's end of turn with
    /// the end of text, as the Instruct models list them, so that chat
    /// rollouts stop at the end of a turn.
    stop: &'static [&'static str],
    /// The post-processor puts `bos` before every encoding (Llama 3's).
    prepend_bos: bool,
    /// The chat template of Qwen2.5-Instruct, Qwen3 or Llama-3.1-Instruct
    /// as their tokenizer files ship it (`init_model/*.jinja`: copies of
    /// `testdata/chat-templates/`, whose renders colo-model's tests check
    /// against transformers').
    chat_template: &'static str,
}

const BYTES: usize = 256;

impl SmallTokenizer {
    fn for_family(family: Family) -> Self {
        const QWEN_SPECIAL: [(&str, bool); 3] = [
            ("<|endoftext|>", true),
            ("<|im_start|>", true),
            ("<|im_end|>", true),
        ];
        match family {
            Family::Qwen2 => SmallTokenizer {
                added: [
                    &QWEN_SPECIAL[..],
                    &[("<tool_call>", false), ("</tool_call>", false)],
                ]
                .concat(),
                bos: None,
                eos: "<|endoftext|>",
                pad: Some("<|endoftext|>"),
                config_bos: "<|endoftext|>",
                config_eos: "<|endoftext|>",
                stop: &["<|im_end|>", "<|endoftext|>"],
                prepend_bos: false,
                chat_template: include_str!("init_model/qwen2.5.jinja"),
            },
            Family::Qwen3 => SmallTokenizer {
                added: [
                    &QWEN_SPECIAL[..],
                    &[
                        ("<tool_call>", false),
                        ("</tool_call>", false),
                        ("<tool_response>", false),
                        ("</tool_response>", false),
                        ("<think>", false),
                        ("</think>", false),
                    ],
                ]
                .concat(),
                bos: None,
                eos: "<|im_end|>",
                pad: Some("<|endoftext|>"),
                config_bos: "<|endoftext|>",
                config_eos: "<|im_end|>",
                stop: &["<|im_end|>", "<|endoftext|>"],
                prepend_bos: false,
                chat_template: include_str!("init_model/qwen3.jinja"),
            },
            Family::Llama => SmallTokenizer {
                added: vec![
                    ("<|begin_of_text|>", true),
                    ("<|end_of_text|>", true),
                    ("<|start_header_id|>", true),
                    ("<|end_header_id|>", true),
                    ("<|eom_id|>", true),
                    ("<|eot_id|>", true),
                    ("<|python_tag|>", true),
                ],
                bos: Some("<|begin_of_text|>"),
                eos: "<|end_of_text|>",
                pad: None,
                config_bos: "<|begin_of_text|>",
                config_eos: "<|end_of_text|>",
                stop: &["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"],
                prepend_bos: true,
                chat_template: include_str!("init_model/llama-3.1.jinja"),
            },
        }
    }

    /// The vocabulary's size.
    fn len(&self) -> usize {
        BYTES + self.added.len()
    }

    /// The id of an added token of this tokenizer.
    fn id(&self, token: &str) -> u32 {
        let at = self.added.iter().position(|(t, _)| *t == token);
        (BYTES + at.expect("a token of the family's table")) as u32
    }

    fn tokenizer_json(&self) -> Value {
        let vocab: serde_json::Map<String, Value> = byte_alphabet()
            .iter()
            .enumerate()
            .map(|(id, c)| (c.to_string(), json!(id)))
            .collect();
        let added: Vec<Value> = self
            .added
            .iter()
            .map(|&(t, special)| {
                json!({"id": self.id(t), "content": t, "single_word": false, "lstrip": false,
                       "rstrip": false, "normalized": false, "special": special})
            })
            .collect();
        let post_processor = match (self.prepend_bos, self.bos) {
            (true, Some(bos)) => json!({
                "type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                         {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {bos: {"id": bos, "ids": [self.id(bos)], "tokens": [bos]}}
            }),
            _ => {
                json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false})
            }
        };
        json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": null,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
            "post_processor": post_processor,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {
                "type": "BPE", "dropout": null, "unk_token": null,
                "continuing_subword_prefix": null, "end_of_word_suffix": null,
                "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                "vocab": vocab, "merges": []
            }
        })
    }

    fn tokenizer_config_json(&self, model_max_length: u64) -> Value {
        let added_tokens_decoder: serde_json::Map<String, Value> = self
            .added
            .iter()
            .map(|&(t, special)| {
                let entry = json!({"content": t, "lstrip": false, "normalized": false,
                                   "rstrip": false, "single_word": false, "special": special});
                (self.id(t).to_string(), entry)
            })
            .collect();
        json!({
            "added_tokens_decoder": added_tokens_decoder,
            "bos_token": self.bos,
            "chat_template": self.chat_template,
            "clean_up_tokenization_spaces": false,
            "eos_token": self.eos,
            "model_max_length": model_max_length,
            "pad_token": self.pad,
            "tokenizer_class": "PreTrainedTokenizerFast",
        })
    }

    fn generation_config_json(&self) -> Value {
        let stop: Vec<u32> = self.stop.iter().map(|t| self.id(t)).collect();
        json!({
            "bos_token_id": self.id(self.config_bos),
            "eos_token_id": stop,
            "pad_token_id": self.pad.map(|p| self.id(p)),
        })
    }
}

/// GPT-2's byte-to-character table (`bytes_to_unicode`): printable bytes
/// stand for themselves, the others for the characters from U+0100 on.
fn byte_alphabet() -> [char; BYTES] {
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    let mut next = 256u32;
    std::array::from_fn(|b| {
        let b = b as u32;
        if printable(b) {
            char::from_u32(b).expect("a Latin-1 character")
        } else {
            let c = char::from_u32(next).expect("a Latin Extended character");
            next += 1;
            c
        }
    })
}

// ---------------------------------------------------------------------------
// The weights

/// The index of a sharded checkpoint.
const INDEX_FILE: &str = "model.safetensors.index.json";

fn numel(shape: &[usize]) -> usize {
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

/// SplitMix64's output function: a 64-bit mix (Steele et al. 2014).
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Standard normal draws: Marsaglia and Tsang's ziggurat (2000) with 128
/// layers over a SplitMix64 stream, the layer and the value from separate
/// bits of each draw (Doornik 2005); ~99% of draws are one product.
struct Normals {
    state: u64,
}

/// The ziggurat's tables: `k[i]` the acceptance bound of layer `i`, `w[i]`
/// its scale from a 32-bit integer to a value, `f[i]` the density at its
/// edge.
struct Ziggurat {
    k: [u32; 128],
    w: [f32; 128],
    f: [f32; 128],
}

/// The right edge of the base layer.
const ZIG_R: f64 = 3.442_619_855_899;

static ZIGGURAT: std::sync::LazyLock<Ziggurat> = std::sync::LazyLock::new(|| {
    let m1 = 2_147_483_648.0f64;
    let vn = 9.912_563_035_262_17e-3f64;
    let (mut dn, mut tn) = (ZIG_R, ZIG_R);
    let q = vn / (-0.5 * dn * dn).exp();
    let mut z = Ziggurat {
        k: [0; 128],
        w: [0.0; 128],
        f: [0.0; 128],
    };
    z.k[0] = ((dn / q) * m1) as u32;
    z.w[0] = (q / m1) as f32;
    z.w[127] = (dn / m1) as f32;
    z.f[0] = 1.0;
    z.f[127] = (-0.5 * dn * dn).exp() as f32;
    for i in (1..=126).rev() {
        dn = (-2.0 * (vn / dn + (-0.5 * dn * dn).exp()).ln()).sqrt();
        z.k[i + 1] = ((dn / tn) * m1) as u32;
        tn = dn;
        z.f[i] = (-0.5 * dn * dn).exp() as f32;
        z.w[i] = (dn / m1) as f32;
    }
    z
});

impl Normals {
    fn new(seed: u64) -> Self {
        Normals { state: seed }
    }

    fn bits(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.state)
    }

    /// A uniform in (0, 1].
    fn uniform(&mut self) -> f32 {
        ((self.bits() >> 40) as f32 + 1.0) * (1.0 / (1u32 << 24) as f32)
    }

    fn next(&mut self) -> f32 {
        let z = &*ZIGGURAT;
        loop {
            let r = self.bits();
            let hz = r as u32 as i32;
            let iz = ((r >> 32) & 127) as usize;
            let x = hz as f32 * z.w[iz];
            if hz.unsigned_abs() < z.k[iz] {
                return x;
            }
            if iz == 0 {
                // The tail beyond ZIG_R (Marsaglia 1964).
                let r = ZIG_R as f32;
                loop {
                    let x = -self.uniform().ln() / r;
                    let y = -self.uniform().ln();
                    if y + y >= x * x {
                        return if hz > 0 { r + x } else { -r - x };
                    }
                }
            }
            let u = self.uniform();
            if z.f[iz] + u * (z.f[iz - 1] - z.f[iz]) < (-0.5 * x * x).exp() {
                return x;
            }
        }
    }
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
fn plan_shards(sizes: &[u64], max: u64) -> Vec<std::ops::Range<usize>> {
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
fn write_weights(
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

// ---------------------------------------------------------------------------
// run.toml, --list, files

/// A `colo train` run of the model in `dir`: issue 36's job (4 prompts × 4
/// samples × 16 new tokens, one optimiser step a step) on the built-in
/// arithmetic task, whose prompts the byte-level tokenizer encodes.
fn run_toml(dir: &Path, name: &str) -> Result<String> {
    let abs = std::path::absolute(dir)
        .with_context(|| format!("the absolute path of {}", dir.display()))?;
    let path = toml_string(&abs.to_string_lossy());
    Ok(format!(
        r#"# `colo train --config {run}`: GRPO on the {name}-shaped model in this
# directory (random weights: it learns nothing, it measures), written by
# `colo init-model`. The job of issue 36: 4 prompts x 4 samples x 16 new
# tokens a step, one optimiser step a step, 5 steps, on the built-in
# arithmetic task. The run ends with a checkpoint (weights and AdamW's
# state: about 8 bytes a parameter more than the weights).

[data]
train_batch_size = 4          # prompts per step

[data.builtin]
val_size = 16                 # held-out prompts, evaluated once, at the end

[model]
path = {path}

[rollout]
n = 4                         # samples per prompt
max_new_tokens = 16
max_kv_tokens = 2048          # 16 samples x (64 prompt + 16 new) tokens, rounded up

[actor]
ppo_mini_batch_size = 4       # one optimiser step per RL step

[trainer]
total_steps = 5
val_before_train = false
test_freq = -1
save_freq = -1
dtype = "auto"
"#,
        run = dir.join("run.toml").display(),
    ))
}

/// `s` as a TOML basic string.
fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

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
fn thousands(n: u64) -> String {
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
    use colo_model::{Checkpoint, Tokenizer};
    use tch::{Device, Kind};

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
    fn sizes_parse_in_decimal_and_binary_units() {
        assert_eq!(parse_size("5GB"), Ok(5_000_000_000));
        assert_eq!(parse_size("1KiB"), Ok(1024));
        assert!(parse_size("0").is_err());
        assert!(parse_size("lots").unwrap_err().contains("5GB"));
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

    #[test]
    fn the_byte_alphabet_is_gpt2s() {
        let a = byte_alphabet();
        assert_eq!(
            (a[b'a' as usize], a[b' ' as usize], a[b'\n' as usize]),
            ('a', 'Ġ', 'Ċ')
        );
        let mut sorted = a.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), BYTES);
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

    #[test]
    fn the_tokenizers_encode_their_chats_with_ids_below_the_vocabulary() {
        let dir = tempfile::tempdir().unwrap();
        for family in [Family::Qwen2, Family::Qwen3, Family::Llama] {
            let tok = SmallTokenizer::for_family(family);
            write_json(&dir.path().join("tokenizer.json"), &tok.tokenizer_json()).unwrap();
            write_json(
                &dir.path().join("tokenizer_config.json"),
                &tok.tokenizer_config_json(4096),
            )
            .unwrap();
            let t = Tokenizer::from_dir(dir.path()).unwrap();
            assert_eq!(t.vocab_size(), tok.len());
            let chat = [colo_model::ChatMessage {
                role: "user".into(),
                content: "What is 12 + 7? Ünïcödé ✓".into(),
            }];
            let text = t.render_chat(&chat, true).unwrap();
            let ids = t.encode(&text, false).unwrap();
            assert!(ids.iter().all(|&i| (i as usize) < tok.len()));
            assert_eq!(t.decode(&ids, false).unwrap(), text, "{family:?}");
            let eos = t.special.eos.as_ref().unwrap();
            assert_eq!(eos.id, tok.id(tok.eos));
            let turn_end = match family {
                Family::Llama => "<|start_header_id|>",
                _ => "<|im_start|>",
            };
            // Special tokens are one id each.
            assert!(ids.contains(&tok.id(turn_end)), "{family:?}: {text}");
            assert_eq!(
                t.encode("12+7=", true).unwrap().len(),
                5 + tok.prepend_bos as usize
            );
        }
    }
}

//! `colo generate`: completions of one prompt from a Hugging Face
//! checkpoint with colo's rollout engine.

use std::path::PathBuf;

use anyhow::{anyhow, bail, Context};
use colo_mem::{Pool, PoolConfig};
use colo_rollout::{Engine, EngineConfig, Request, SamplingParams};

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["prompt_ids", "prompt"])))]
#[command(group(clap::ArgGroup::new("mode").args(["greedy", "temperature"])))]
pub struct Args {
    /// Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer.json).
    #[arg(long)]
    model: PathBuf,
    /// Prompt token ids, comma separated.
    #[arg(long, value_delimiter = ',', conflicts_with = "prompt")]
    prompt_ids: Option<Vec<u32>>,
    /// Prompt text, tokenized with the checkpoint's tokenizer.
    #[arg(long)]
    prompt: Option<String>,
    /// Send --prompt as a user message through the checkpoint's chat
    /// template (with the generation prompt), as an RL run sends a chat.
    #[arg(long, requires = "prompt")]
    chat: bool,
    /// Completions to sample.
    #[arg(long, default_value_t = 1)]
    n: usize,
    #[arg(long, default_value_t = 32)]
    max_new_tokens: usize,
    /// Greedy decoding (the default is sampling at temperature 1).
    #[arg(long)]
    greedy: bool,
    #[arg(long)]
    temperature: Option<f64>,
    #[arg(long, default_value_t = 1.0)]
    top_p: f64,
    #[arg(long)]
    top_k: Option<usize>,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Extra stop strings (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Do not stop at the checkpoint's end-of-sequence token(s).
    #[arg(long)]
    ignore_eos: bool,
    /// Print `{"completions": [{"tokens", "logprobs", "finish_reason"}]}` only.
    /// A log-probability is the sampled token's under the distribution it
    /// was drawn from with the temperature applied and before top-k/top-p
    /// (the policy's π_old, as an RL step uses it); greedy: the model's own.
    #[arg(long)]
    json: bool,
}

/// What a model whose outputs are not numbers is told (its weights are
/// finite, as loading checks, but overflow in the forward pass).
pub(crate) const NOT_A_NUMBER: &str = "the model's log-probabilities are not numbers (NaN): \
    its weights are finite but overflow in the forward pass, as after a training that diverged";

pub fn run(a: Args) -> anyhow::Result<()> {
    let cfg = colo_model::ModelConfig::from_file(&a.model.join("config.json"))
        .with_context(|| format!("loading {}", a.model.display()))?;
    let tokenizer = match a.model.join("tokenizer.json").is_file() {
        true => Some(colo_model::Tokenizer::from_dir(&a.model)?),
        false => None,
    };
    if !a.stop.is_empty() && tokenizer.is_none() {
        bail!(
            "--stop needs the checkpoint's tokenizer.json to match text, and {} has none",
            a.model.display()
        );
    }
    let prompt = prompt_ids(&a, tokenizer.as_ref())?;
    // The engine stops a sequence when the model's context is full.
    let room = cfg.max_position_embeddings.saturating_sub(prompt.len());
    if a.max_new_tokens > room && room > 0 {
        eprintln!(
            "colo generate: --max-new-tokens {} does not fit: the model's context is {} tokens \
             and the prompt has {}, so at most {room} new tokens are generated",
            a.max_new_tokens,
            cfg.max_position_embeddings,
            prompt.len()
        );
    }
    let params = sampling(&a, &cfg, tokenizer.as_ref())?;
    // A KV pool that holds all n samples at full length, each in blocks of
    // its own (the engine's padding block too).
    let full = (prompt.len().saturating_add(a.max_new_tokens)).min(cfg.max_position_embeddings);
    let block = EngineConfig::default().block_size;
    let kv_tokens = (full.div_ceil(block).checked_mul(a.n.max(1)))
        .and_then(|blocks| blocks.checked_add(1)?.checked_mul(block))
        .ok_or_else(|| {
            anyhow!(
                "--n {}: that many samples of up to {full} tokens cannot be held",
                a.n
            )
        })?;
    // Refused before anything is allocated when it cannot fit.
    memory_check(&a.model, a.n, full, block)?;
    let ecfg = EngineConfig::with_kv_tokens(kv_tokens);
    let pool = Pool::host(PoolConfig::default())?;
    let mut engine = Engine::from_dir(&a.model, pool, &ecfg)?;
    let out = engine
        .generate(vec![Request::new(prompt, params)])?
        .pop()
        .expect("one request, one result")
        .map_err(|e| anyhow!("{e}"))?;
    if out
        .completions
        .iter()
        .any(|c| c.logprobs.iter().any(|x| x.is_nan()))
    {
        bail!("{}: {NOT_A_NUMBER}", a.model.display());
    }
    print_completions(&a, &out, tokenizer.as_ref())
}

/// The prompt's token ids: `--prompt-ids`, or `--prompt` encoded by the
/// checkpoint's tokenizer (in its chat template with `--chat`).
fn prompt_ids(a: &Args, tokenizer: Option<&colo_model::Tokenizer>) -> anyhow::Result<Vec<u32>> {
    Ok(match (&a.prompt_ids, &a.prompt, tokenizer) {
        (Some(ids), _, _) => ids.clone(),
        (None, Some(text), Some(tok)) if a.chat => {
            let user = colo_model::ChatMessage {
                role: "user".into(),
                content: text.clone(),
            };
            tok.encode(&tok.render_chat(&[user], true)?, false)?
        }
        (None, Some(text), Some(tok)) => tok.encode(text, true)?,
        (None, Some(_), None) => bail!(
            "{} has no tokenizer.json; pass --prompt-ids",
            a.model.display()
        ),
        (None, None, _) => unreachable!("clap requires --prompt-ids or --prompt"),
    })
}

/// The sampling flags as the engine's parameters; the stop ids: none with
/// `--ignore-eos`, else the checkpoint's (found with its tokenizer, or
/// the model config's end-of-sequence ids without one).
fn sampling(
    a: &Args,
    cfg: &colo_model::ModelConfig,
    tokenizer: Option<&colo_model::Tokenizer>,
) -> anyhow::Result<SamplingParams> {
    Ok(SamplingParams {
        n: a.n,
        max_new_tokens: a.max_new_tokens,
        temperature: if a.greedy {
            0.0
        } else {
            a.temperature.unwrap_or(1.0)
        },
        top_k: a.top_k,
        top_p: a.top_p,
        stop_token_ids: match (a.ignore_eos, &tokenizer) {
            (true, _) => Vec::new(),
            (false, Some(tok)) => colo_model::tokenizer::stop_token_ids(&a.model, tok)?,
            (false, None) => cfg.eos_token_ids.clone(),
        },
        stop_strings: a.stop.clone(),
        seed: a.seed,
    })
}

/// The completions on stdout: one JSON object with `--json`, else each
/// with its length, finish reason and log-probability, then its text.
fn print_completions(
    a: &Args,
    out: &colo_rollout::RequestOutput,
    tokenizer: Option<&colo_model::Tokenizer>,
) -> anyhow::Result<()> {
    if a.json {
        #[derive(serde::Serialize)]
        struct C<'a> {
            tokens: &'a [u32],
            logprobs: &'a [f32],
            finish_reason: &'a str,
        }
        #[derive(serde::Serialize)]
        struct Out<'a> {
            completions: Vec<C<'a>>,
        }
        let completions = out
            .completions
            .iter()
            .map(|c| C {
                tokens: &c.tokens,
                logprobs: &c.logprobs,
                finish_reason: c.finish_reason.as_str(),
            })
            .collect();
        println!("{}", serde_json::to_string(&Out { completions })?);
        return Ok(());
    }
    for (i, c) in out.completions.iter().enumerate() {
        let total: f64 = c.logprobs.iter().map(|&v| v as f64).sum();
        println!(
            "[{i}] {} tokens, finish: {}, logprob {total:.4}",
            c.tokens.len(),
            c.finish_reason
        );
        match &tokenizer {
            Some(tok) => println!("{}", tok.decode(&c.tokens, false)?),
            None => println!("{:?}", c.tokens),
        }
    }
    Ok(())
}

/// colo-plan's estimate of what the engine holds for `n` samples of up to
/// `seq` tokens, decoded at once (the weights in float32, a KV cache with
/// blocks of `block` tokens of each sample's own, the decode step's
/// buffers), refused when it exceeds the machine's memory: the capacity
/// `colo train`'s plan check gives a run on the CPU. A config.json the
/// planner cannot read skips the check with a note: the engine's loader,
/// next, reads the same file and names what is wrong with it.
fn memory_check(model: &std::path::Path, n: usize, seq: usize, block: usize) -> anyhow::Result<()> {
    use colo_plan::generate::{estimate, GenerationMemory};
    use colo_plan::model::{DType, HfConfig};
    let path = model.join("config.json");
    let spec = match HfConfig::from_file(&path.to_string_lossy()).and_then(|c| c.into_spec("model"))
    {
        Ok(spec) => spec,
        Err(e) => {
            eprintln!("colo generate: memory check skipped ({e})");
            return Ok(());
        }
    };
    let seq_blocks = seq.div_ceil(block) as u64;
    let need = |n: u64| -> GenerationMemory {
        let kv_tokens = seq_blocks.saturating_mul(n).saturating_add(1);
        let kv_tokens = kv_tokens.saturating_mul(block as u64);
        estimate(&spec, DType::F32, kv_tokens, n, seq as u64)
    };
    let machine = match colo_mem::os::machine_memory_bytes() {
        Ok(bytes) => bytes,
        Err(e) => {
            eprintln!("colo generate: memory check skipped (the machine's memory: {e})");
            return Ok(());
        }
    };
    let all = need(n as u64);
    if all.total() <= machine {
        return Ok(());
    }
    // The estimate grows by the same bytes with each sample.
    let (one, two) = (need(1).total(), need(2).total());
    let per_sample = two - one;
    let fit = machine.saturating_sub(one - per_sample) / per_sample.max(1);
    let fmt = colo_mem::fmt_bytes;
    bail!(
        "--n {n}: the engine decodes a prompt's samples at once, and {n} samples of up to {seq} \
         tokens need about {} ({} of KV cache, {} of decode buffers, {} of weights), more than \
         the machine's {}. At most about {fit} fit: lower --n (several runs with other --seed \
         values give more samples)",
        fmt(all.total()),
        fmt(all.kv_cache),
        fmt(all.decode),
        fmt(all.weights),
        fmt(machine),
    )
}

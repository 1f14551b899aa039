//! `colo score`: teacher-forced log-probabilities of a token sequence under a
//! Hugging Face checkpoint.

use std::path::PathBuf;

use anyhow::{bail, Context};
use colo_model::{loss, Checkpoint};
use tch::{Device, Kind, Tensor};

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["ids", "text"])))]
pub struct Args {
    /// Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer.json).
    #[arg(long)]
    model: PathBuf,
    /// Token ids, comma separated.
    #[arg(long, value_delimiter = ',')]
    ids: Option<Vec<u32>>,
    /// Text, tokenized with the checkpoint's tokenizer (special tokens added as it specifies).
    #[arg(long)]
    text: Option<String>,
    /// Print `{"logprobs": [...]}` only.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let ckpt = Checkpoint::from_dir(&a.model, Kind::Float, Device::Cpu)
        .with_context(|| format!("loading {}", a.model.display()))?;
    let ids = match (a.ids, &a.text) {
        (Some(ids), _) => ids,
        (None, Some(text)) => match &ckpt.tokenizer {
            Some(tok) => tok.encode(text, true)?,
            None => bail!("{} has no tokenizer.json; pass --ids", a.model.display()),
        },
        (None, None) => unreachable!("clap requires --ids or --text"),
    };
    let logprobs = score(&ckpt, &ids)?;
    if logprobs.iter().any(|x| x.is_nan()) {
        anyhow::bail!("{}: {}", a.model.display(), super::generate::NOT_A_NUMBER);
    }
    if a.json {
        // Serialised as f32 (shortest representation that reads back to the
        // same float), not widened to f64 first as `json!` would.
        #[derive(serde::Serialize)]
        struct Out<'a> {
            logprobs: &'a [f32],
        }
        println!(
            "{}",
            serde_json::to_string(&Out {
                logprobs: &logprobs
            })?
        );
    } else {
        println!("{:>6} {:>8} {:>12}", "pos", "next", "logprob");
        for (i, lp) in logprobs.iter().enumerate() {
            println!("{i:>6} {:>8} {lp:>12.6}", ids[i + 1]);
        }
        println!(
            "total {:.6} over {} tokens",
            logprobs.iter().map(|&v| v as f64).sum::<f64>(),
            logprobs.len()
        );
    }
    Ok(())
}

/// For each position `i`, `log p(ids[i+1] | ids[..=i])`, float32.
pub fn score(ckpt: &Checkpoint, ids: &[u32]) -> anyhow::Result<Vec<f32>> {
    if ids.len() < 2 {
        bail!("scoring needs at least two tokens, got {}", ids.len());
    }
    let context = ckpt.model.config().max_position_embeddings;
    if ids.len() > context {
        bail!(
            "{} tokens are more than the model's context of {context} positions \
             (max_position_embeddings in config.json)",
            ids.len()
        );
    }
    let vocab = ckpt.model.config().vocab_size;
    if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
        bail!("token id {bad} is outside the vocabulary (size {vocab})");
    }
    let ids: Vec<i64> = ids.iter().map(|&t| t as i64).collect();
    let input = Tensor::from_slice(&ids).unsqueeze(0); // (1, seq)
    let _no_grad = tch::no_grad_guard();
    let logits = ckpt.model.forward(&input)?; // (1, seq, vocab)
    let lp = loss::next_token_logprobs(&logits, &input)?.squeeze_dim(0);
    Ok(Vec::<f32>::try_from(lp.to_kind(Kind::Float))?)
}

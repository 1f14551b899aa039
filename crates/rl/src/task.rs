//! The built-in task: small-number arithmetic (`"12+7="` → `"19"`), a
//! character-level tokenizer ([`crate::vocab`]) and a ~0.8M-parameter Qwen2
//! model, which `colo train` runs when given no arguments.
//!
//! # Why this task
//!
//! The default run must show RL *working* — held-out accuracy up by at least
//! 25 points — within 10 minutes on a 2-core CPU. That needs:
//!
//! - **A model small enough to train on a CPU**: [`model_config`] is Qwen2
//!   with hidden 128, 4 layers, 4 query / 2 key-value heads, MLP 384, tied
//!   embeddings: 0.80M parameters. One RL step of 32 prompts × 8 samples is
//!   ~256 × 10 tokens through forward/backward, well under a second of
//!   matrix work.
//! - **Short answers**: at most three digits and EOS, so a rollout is ≤ 4
//!   decode steps and `max_new_tokens = 6` bounds it.
//! - **Signal for GRPO**: the starting checkpoint is a *short* SFT of this
//!   model on the training prompts (`colo sft`, committed as
//!   [`BUILTIN_WEIGHTS`]; [`builtin_checkpoint`] writes it out). After
//!   a short SFT the model has the format and the units digit (a lookup)
//!   but not yet the carries, so greedy accuracy is partial (aim: 10–40%)
//!   while sampled answers are often right (aim: pass@8 ≥ 60%). With 8
//!   samples per prompt most groups then hold both right and wrong answers,
//!   so group-normalised advantages are non-zero, and RL's job is the one it
//!   is known to do well: turn pass@k into pass@1, lifting greedy accuracy
//!   towards the pass@8 level — more than 25 points when the two differ by
//!   that much, which is what the SFT checkpoint is chosen for.
//! - **A held-out set the model cannot memorise**: train and eval problems
//!   are disjoint pairs (a, b) from a space of 10,000, so eval accuracy
//!   measures addition, not recall.
//!
//! The data are written as JSONL and read back by [`crate::data`], so the
//! built-in path and a user's files go through the same code.

use std::io::Write;
use std::path::{Path, PathBuf};

use colo_model::{Arch, ModelConfig};
use serde::{Deserialize, Serialize};
use tch::Kind;

use crate::rng::SplitMix64;
use crate::{vocab, Error, Result};

/// An operation of the task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    #[serde(rename = "+")]
    Add,
    /// `a-b` with `a ≥ b`, so answers are never negative.
    #[serde(rename = "-")]
    Sub,
}

impl Op {
    fn symbol(self) -> char {
        match self {
            Op::Add => '+',
            Op::Sub => '-',
        }
    }
}

/// The arithmetic task's settings (`[data.builtin]` of a run's config).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, colo_keys::Keys)]
#[serde(default, deny_unknown_fields)]
pub struct ArithmeticTask {
    /// built-in task (used when train_files is empty): operands are
    /// 0..=max_operand
    #[key(unit = "integer")]
    pub max_operand: u32,
    /// built-in task: the operations
    #[key(unit = "list of \"+\", \"-\"")]
    pub ops: Vec<Op>,
    /// built-in task: training problems
    #[key(unit = "prompts")]
    pub train_size: usize,
    /// built-in task: held-out problems (disjoint from training)
    #[key(unit = "prompts")]
    pub val_size: usize,
    /// built-in task: seed of the problem generator
    #[key(unit = "integer")]
    pub seed: u64,
}

impl Default for ArithmeticTask {
    fn default() -> Self {
        ArithmeticTask {
            max_operand: 99,
            ops: vec![Op::Add],
            train_size: 8000,
            val_size: 500,
            seed: 20240607,
        }
    }
}

/// One problem: the prompt and its answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Problem {
    pub prompt: String,
    pub answer: String,
}

impl ArithmeticTask {
    /// Distinct problems there are (`a-b` needs `a ≥ b`).
    pub fn space(&self) -> usize {
        let n = self.max_operand as usize + 1;
        self.ops
            .iter()
            .map(|op| match op {
                Op::Add => n * n,
                Op::Sub => n * (n + 1) / 2,
            })
            .sum()
    }

    /// `(train, eval)`: disjoint problems drawn by a seeded shuffle of the
    /// whole space.
    pub fn generate(&self) -> Result<(Vec<Problem>, Vec<Problem>)> {
        let space = self.space();
        if self.ops.is_empty() || self.val_size == 0 || self.train_size == 0 {
            return Err(Error::Dataset(
                "the arithmetic task needs ops and non-zero train_size and val_size".into(),
            ));
        }
        if self.train_size + self.val_size > space {
            return Err(Error::Dataset(format!(
                "train_size {} + val_size {} exceed the {space} distinct problems with operands up to {}",
                self.train_size, self.val_size, self.max_operand
            )));
        }
        let mut all = Vec::with_capacity(space);
        for &op in &self.ops {
            for a in 0..=self.max_operand {
                for b in 0..=self.max_operand {
                    let answer = match op {
                        Op::Add => a + b,
                        Op::Sub if a >= b => a - b,
                        Op::Sub => continue,
                    };
                    all.push(Problem {
                        prompt: format!("{a}{}{b}=", op.symbol()),
                        answer: answer.to_string(),
                    });
                }
            }
        }
        SplitMix64::new(self.seed).shuffle(&mut all);
        let eval = all[..self.val_size].to_vec();
        let train = all[self.val_size..self.val_size + self.train_size].to_vec();
        Ok((train, eval))
    }

    /// Writes `train.jsonl` and `val.jsonl` (fields `prompt`, `answer`) into
    /// `dir` and returns their paths.
    pub fn write_jsonl(&self, dir: &Path) -> Result<(PathBuf, PathBuf)> {
        let (train, eval) = self.generate()?;
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let paths = (dir.join("train.jsonl"), dir.join("val.jsonl"));
        for (path, rows) in [(&paths.0, &train), (&paths.1, &eval)] {
            let mut out = Vec::new();
            for r in rows {
                serde_json::to_writer(&mut out, r)?;
                out.push(b'\n');
            }
            std::fs::File::create(path)
                .and_then(|mut f| f.write_all(&out))
                .map_err(|e| Error::io(path, e))?;
        }
        Ok(paths)
    }
}

/// The built-in model: see the module doc.
pub fn model_config() -> ModelConfig {
    ModelConfig {
        arch: Arch::Qwen2,
        vocab_size: vocab::vocab_size(),
        hidden_size: 128,
        intermediate_size: 384,
        num_layers: 4,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 32,
        rms_norm_eps: 1e-6,
        rope_theta: 10_000.0,
        rope_llama3: None,
        // Prompts are ≤ 8 characters and answers ≤ 4 tokens; room for chat.
        max_position_embeddings: 128,
        tie_word_embeddings: true,
        qkv_bias: true,
        o_bias: false,
        bos_token_id: Some(vocab::BOS_ID),
        eos_token_ids: vec![vocab::EOS_ID, vocab::IM_END_ID],
        pad_token_id: Some(vocab::PAD_ID),
    }
}

/// Writes the built-in model's `config.json` and tokenizer files into `dir`
/// (no weights: those come from `colo sft` or a random initialisation).
pub fn write_model_files(dir: &Path) -> Result<()> {
    vocab::write_tokenizer(dir)?;
    let path = dir.join("config.json");
    let text = serde_json::to_string_pretty(&model_config().to_hf_json(Kind::Float))?;
    std::fs::write(&path, text + "\n").map_err(|e| Error::io(&path, e))
}

/// The weights of `colo train`'s starting checkpoint: `colo sft` with its
/// defaults (the command and its measured accuracy are in
/// `crates/rl/README.md`). Embedded so that the binary runs the built-in
/// task from any directory; config and tokenizer are generated by code.
pub const BUILTIN_WEIGHTS: &[u8] = include_bytes!("../builtin/model.safetensors");

/// Writes the built-in starting checkpoint — `config.json`, the tokenizer
/// files and [`BUILTIN_WEIGHTS`] as `model.safetensors` — into `dir` and
/// returns `dir`, ready for any Hugging Face checkpoint loader.
pub fn builtin_checkpoint(dir: &Path) -> Result<PathBuf> {
    write_model_files(dir)?;
    let path = dir.join("model.safetensors");
    std::fs::write(&path, BUILTIN_WEIGHTS).map_err(|e| Error::io(&path, e))?;
    Ok(dir.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_are_correct_disjoint_and_seeded() {
        let t = ArithmeticTask {
            ops: vec![Op::Add, Op::Sub],
            ..Default::default()
        };
        assert_eq!(t.space(), 10_000 + 5_050);
        let (train, eval) = t.generate().unwrap();
        assert_eq!((train.len(), eval.len()), (8000, 500));
        for p in train.iter().chain(&eval) {
            let body = p.prompt.strip_suffix('=').unwrap();
            let (a, b, sum) = match body.split_once('+') {
                Some((a, b)) => (a, b, true),
                None => {
                    let (a, b) = body.split_once('-').unwrap();
                    (a, b, false)
                }
            };
            let (a, b): (i64, i64) = (a.parse().unwrap(), b.parse().unwrap());
            let want = if sum { a + b } else { a - b };
            assert!(want >= 0 && a <= 99 && b <= 99);
            assert_eq!(p.answer, want.to_string());
        }
        let seen: std::collections::HashSet<_> = train.iter().map(|p| &p.prompt).collect();
        assert!(eval.iter().all(|p| !seen.contains(&p.prompt)));
        assert!(train.iter().any(|p| p.prompt.contains('-')));
        assert_eq!(t.generate().unwrap().1, eval, "seeded");
        let other = ArithmeticTask {
            seed: 1,
            ..t.clone()
        };
        assert_ne!(other.generate().unwrap().1, eval);
    }

    #[test]
    fn too_many_problems_is_an_error() {
        let t = ArithmeticTask {
            max_operand: 9,
            ..Default::default()
        };
        let e = t.generate().unwrap_err();
        assert!(e.to_string().contains("100 distinct problems"), "{e}");
    }

    #[test]
    fn model_is_in_the_intended_size_range() {
        let n = model_config().num_parameters();
        assert!((500_000..3_000_000).contains(&n), "{n}");
    }
}

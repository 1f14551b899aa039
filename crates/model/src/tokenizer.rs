//! The tokenizer of a checkpoint: `tokenizer.json` through the `tokenizers`
//! crate, plus special tokens and the chat template from
//! `tokenizer_config.json`.

use std::path::Path;

use serde_json::Value;

use crate::{Error, Result};

/// A special token: its text and id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecialToken {
    pub text: String,
    pub id: u32,
}

/// The special tokens `tokenizer_config.json` names (those the vocabulary
/// has).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    pub bos: Option<SpecialToken>,
    pub eos: Option<SpecialToken>,
    pub pad: Option<SpecialToken>,
}

/// One message of a chat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

/// Tokenizer files copied along when a checkpoint is saved.
pub const TOKENIZER_FILES: &[&str] = &[
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "chat_template.jinja",
];

/// A loaded tokenizer with its special tokens and chat template.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    pub special: SpecialTokens,
    /// The Jinja chat template as written in `tokenizer_config.json`
    /// (or `chat_template.jinja`); not interpreted except by
    /// [`Tokenizer::render_chat`] for ChatML.
    pub chat_template: Option<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("special", &self.special)
            .field(
                "chat_template",
                &self.chat_template.as_ref().map(|t| t.len()),
            )
            .finish()
    }
}

fn tok_err(e: impl std::fmt::Display) -> Error {
    Error::Tokenizer(e.to_string())
}

impl Tokenizer {
    /// Loads `tokenizer.json` (required) and `tokenizer_config.json`
    /// (optional) from a checkpoint directory.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("tokenizer.json");
        if !path.is_file() {
            return Err(Error::MissingFile { path });
        }
        let inner = tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| Error::Tokenizer(format!("{}: {e}", path.display())))?;
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg: Value = match std::fs::read_to_string(&cfg_path) {
            Ok(text) => serde_json::from_str(&text).map_err(|reason| Error::Json {
                path: cfg_path,
                reason,
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Value::Null,
            Err(e) => return Err(Error::io(cfg_path, e)),
        };
        let special_token = |key: &str| {
            let text = match &cfg[key] {
                Value::String(s) => s.clone(),
                Value::Object(o) => o.get("content")?.as_str()?.to_owned(),
                _ => return None,
            };
            let id = inner.token_to_id(&text)?;
            Some(SpecialToken { text, id })
        };
        let special = SpecialTokens {
            bos: special_token("bos_token"),
            eos: special_token("eos_token"),
            pad: special_token("pad_token"),
        };
        let chat_template = chat_template(&cfg)
            .or_else(|| std::fs::read_to_string(dir.join("chat_template.jinja")).ok());
        Ok(Tokenizer {
            inner,
            special,
            chat_template,
        })
    }

    /// Token ids of `text`; `add_special_tokens` applies the tokenizer's
    /// post-processor (e.g. a leading BOS) as transformers does by default.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        Ok(self
            .inner
            .encode(text, add_special_tokens)
            .map_err(tok_err)?
            .get_ids()
            .to_vec())
    }

    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner.decode(ids, skip_special_tokens).map_err(tok_err)
    }

    /// The vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The `tokenizers` tokenizer, for anything not wrapped here.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// Renders a chat for templates in the ChatML family (Qwen's): each
    /// message as `<|im_start|>{role}\n{content}<|im_end|>\n`, then
    /// `<|im_start|>assistant\n` if `add_generation_prompt`. Other templates
    /// are an error rather than a wrong prompt; a Jinja engine is not
    /// included.
    pub fn render_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        match self.chat_template.as_deref() {
            Some(t) if t.contains("<|im_start|>") => {
                Ok(render_chatml(messages, add_generation_prompt))
            }
            Some(_) => Err(Error::Tokenizer(
                "only ChatML-style chat templates can be rendered".into(),
            )),
            None => Err(Error::Tokenizer(
                "the tokenizer has no chat template".into(),
            )),
        }
    }
}

/// `chat_template` is a string, or a list of `{name, template}` of which
/// `default` is the one to use.
fn chat_template(cfg: &Value) -> Option<String> {
    match &cfg["chat_template"] {
        Value::String(s) => Some(s.clone()),
        Value::Array(items) => items
            .iter()
            .find(|i| i["name"] == "default")
            .or_else(|| items.first())
            .and_then(|i| i["template"].as_str())
            .map(str::to_owned),
        _ => None,
    }
}

/// The ChatML rendering described at [`Tokenizer::render_chat`].
pub fn render_chatml(messages: &[ChatMessage], add_generation_prompt: bool) -> String {
    let mut out = String::new();
    for m in messages {
        out.push_str(&format!(
            "<|im_start|>{}\n{}<|im_end|>\n",
            m.role, m.content
        ));
    }
    if add_generation_prompt {
        out.push_str("<|im_start|>assistant\n");
    }
    out
}

/// Copies the tokenizer files that exist in `src` into `dst`.
pub fn copy_tokenizer_files(src: &Path, dst: &Path) -> Result<()> {
    std::fs::create_dir_all(dst).map_err(|e| Error::io(dst, e))?;
    for name in TOKENIZER_FILES {
        let from = src.join(name);
        if from.is_file() {
            std::fs::copy(&from, dst.join(name)).map_err(|e| Error::io(&from, e))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chatml_renders() {
        let m = [ChatMessage {
            role: "user".into(),
            content: "hi".into(),
        }];
        assert_eq!(
            render_chatml(&m, true),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn chat_template_forms() {
        assert_eq!(
            chat_template(&serde_json::json!({"chat_template": "x"})).as_deref(),
            Some("x")
        );
        let list = serde_json::json!({"chat_template": [{"name": "tool", "template": "t"}, {"name": "default", "template": "d"}]});
        assert_eq!(chat_template(&list).as_deref(), Some("d"));
    }
}

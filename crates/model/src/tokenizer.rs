//! The tokenizer of a checkpoint: `tokenizer.json` through the `tokenizers`
//! crate, plus special tokens and the chat template from
//! `tokenizer_config.json` (rendered by [`crate::chat_template`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use crate::chat_template::ChatTemplate;
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
    /// (or `chat_template.jinja`).
    pub chat_template: Option<String>,
    /// It compiled, for [`Tokenizer::render_chat`]; a template that does not
    /// compile (or is not text) is an error when a chat is rendered, not
    /// when the tokenizer loads (a run with plain-text prompts never needs
    /// it). The error's text names the file.
    compiled: Option<Arc<std::result::Result<ChatTemplate, String>>>,
    /// The file the template was read from, named in its errors.
    template_file: Option<PathBuf>,
    /// The checkpoint directory, named when it has no template.
    dir: PathBuf,
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
            if dir.join("tokenizer.model").is_file() {
                return Err(Error::Tokenizer(format!(
                    "{} has a sentencepiece tokenizer.model but no tokenizer.json, which colo reads; \
                     transformers writes one: AutoTokenizer.from_pretrained(dir).save_pretrained(dir)",
                    dir.display()
                )));
            }
            return Err(Error::io(&path, std::io::ErrorKind::NotFound.into()));
        }
        let inner = tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| Error::Tokenizer(format!("{}: {e}", path.display())))?;
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg: Value = match std::fs::read_to_string(&cfg_path) {
            Ok(text) => serde_json::from_str(&text).map_err(|reason| Error::Json {
                path: cfg_path.clone(),
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
        let jinja = dir.join("chat_template.jinja");
        let mut template_file = None;
        let (chat_template, compiled) = match chat_template(&cfg) {
            Err(kind) => {
                let e = format!(
                    "{}: `chat_template` is {kind}; expected a string or a list of {{name, template}}",
                    cfg_path.display()
                );
                (None, Some(Err(e)))
            }
            Ok(found) => {
                let found = match found {
                    Some(t) => Some((t, cfg_path)),
                    None => std::fs::read_to_string(&jinja).ok().map(|t| (t, jinja)),
                };
                match found {
                    Some((t, file)) => {
                        let c = ChatTemplate::new(t.clone()).map_err(|e| in_file(e, &file));
                        template_file = Some(file);
                        (Some(t), Some(c))
                    }
                    None => (None, None),
                }
            }
        };
        Ok(Tokenizer {
            inner,
            special,
            chat_template,
            compiled: compiled.map(Arc::new),
            template_file,
            dir: dir.to_owned(),
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

    /// Renders a chat with the checkpoint's chat template, as transformers'
    /// `apply_chat_template(messages, tokenize=False,
    /// add_generation_prompt=…)` does (see [`crate::chat_template`]).
    pub fn render_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let Some(compiled) = &self.compiled else {
            return Err(Error::Tokenizer(format!(
                "the tokenizer of {} has no chat template (no `chat_template` in its \
                 tokenizer_config.json, no chat_template.jinja)",
                self.dir.display()
            )));
        };
        let template = compiled
            .as_ref()
            .as_ref()
            .map_err(|e| Error::Tokenizer(e.clone()))?;
        template
            .render(
                messages,
                add_generation_prompt,
                self.special.bos.as_ref().map(|t| t.text.as_str()),
                self.special.eos.as_ref().map(|t| t.text.as_str()),
            )
            .map_err(|e| match &self.template_file {
                Some(file) => Error::Tokenizer(in_file(e, file)),
                None => e,
            })
    }
}

/// A chat template's error as text naming the file it came from.
fn in_file(e: Error, file: &Path) -> String {
    match e {
        Error::Tokenizer(m) => format!("{m} (the template of {})", file.display()),
        other => format!("{other} (the chat template of {})", file.display()),
    }
}

/// `chat_template` is a string, or a list of `{name, template}` of which
/// `default` is the one to use; `Err` names what it is instead.
fn chat_template(cfg: &Value) -> std::result::Result<Option<String>, &'static str> {
    match &cfg["chat_template"] {
        Value::Null => Ok(None),
        Value::String(s) => Ok(Some(s.clone())),
        Value::Array(items) => items
            .iter()
            .find(|i| i["name"] == "default")
            .or_else(|| items.first())
            .and_then(|i| i["template"].as_str())
            .map(|t| Some(t.to_owned()))
            .ok_or("a list without a {name, template} entry"),
        Value::Bool(_) => Err("a boolean"),
        Value::Number(_) => Err("a number"),
        Value::Object(_) => Err("an object"),
    }
}

/// The tokens that end a completion of the checkpoint in `dir`, as vLLM
/// (verl's rollout) gathers them: the tokenizer's end-of-sequence token,
/// then `config.json`'s and `generation_config.json`'s `eos_token_id`s
/// (Qwen2.5-Instruct ends turns with `<|im_end|>` and text with
/// `<|endoftext|>`; Llama 3.1 lists three), each once.
pub fn stop_token_ids(dir: &Path, tok: &Tokenizer) -> Result<Vec<u32>> {
    let mut ids: Vec<u32> = tok.special.eos.iter().map(|t| t.id).collect();
    for name in ["config.json", "generation_config.json"] {
        let path = dir.join(name);
        if !path.is_file() {
            continue;
        }
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        let v: Value = serde_json::from_str(&text).map_err(|reason| Error::Json {
            path: path.clone(),
            reason,
        })?;
        let bad = |what: String| Error::Config(format!("{}: eos_token_id {what}", path.display()));
        let field = &v["eos_token_id"];
        let listed: Vec<&Value> = match field {
            Value::Null => Vec::new(),
            Value::Array(a) => a.iter().collect(),
            one => vec![one],
        };
        for id in listed {
            let id = (id.as_u64())
                .and_then(|i| u32::try_from(i).ok())
                .ok_or_else(|| bad(format!("{field}: expected a token id or a list of them")))?;
            if id as usize >= tok.vocab_size() {
                return Err(bad(format!(
                    "{id} is not a token of the tokenizer (its vocabulary has {})",
                    tok.vocab_size()
                )));
            }
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
    }
    Ok(ids)
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
    fn chat_template_forms() {
        assert_eq!(
            chat_template(&serde_json::json!({"chat_template": "x"})),
            Ok(Some("x".into()))
        );
        let list = serde_json::json!({"chat_template": [{"name": "tool", "template": "t"}, {"name": "default", "template": "d"}]});
        assert_eq!(chat_template(&list), Ok(Some("d".into())));
        assert_eq!(chat_template(&serde_json::json!({})), Ok(None));
        assert_eq!(
            chat_template(&serde_json::json!({"chat_template": 42})),
            Err("a number")
        );
    }
}

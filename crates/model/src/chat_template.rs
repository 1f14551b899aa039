//! A checkpoint's chat template, rendered as transformers'
//! `apply_chat_template` renders it: Jinja (minijinja) with `trim_blocks`
//! and `lstrip_blocks`, Python's string methods (`startswith`, `split`,
//! `strip`, … through minijinja-contrib's pycompat), `raise_exception`,
//! and the tokenizer's `bos_token` / `eos_token` in the context.
//!
//! One departure, for reproducibility: `strftime_now` is not defined, so a
//! template that stamps today's date (Llama 3.x) takes its own fallback
//! date, and a run's prompts do not change with the day it runs on.

use std::fmt;

use minijinja::syntax::SyntaxConfig;
use minijinja::{context, Environment, ErrorKind};

use crate::tokenizer::ChatMessage;
use crate::{Error, Result};

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
}

impl fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ChatTemplate")
    }
}

/// The template's name inside its environment.
const NAME: &str = "chat_template";

impl ChatTemplate {
    /// Compiles `source`; a syntax error names the line.
    pub fn new(source: String) -> Result<Self> {
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(jinja_err)?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> std::result::Result<String, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_template_owned(NAME, source).map_err(jinja_err)?;
        Ok(ChatTemplate { env })
    }

    /// The prompt text of `messages`, ending with the assistant's header
    /// when `add_generation_prompt`.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
    ) -> Result<String> {
        let messages: Vec<_> = messages
            .iter()
            .map(|m| context! { role => &m.role, content => &m.content })
            .collect();
        self.env
            .get_template(NAME)
            .and_then(|t| {
                t.render(context! {
                    messages,
                    add_generation_prompt,
                    bos_token,
                    eos_token,
                })
            })
            .map_err(jinja_err)
    }
}

/// A minijinja error with its cause chain and location (its line; not the
/// alternate form's dump of the template and its variables).
fn jinja_err(e: minijinja::Error) -> Error {
    let mut text = format!("chat template: {e}");
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        text.push_str(&format!(": {c}"));
        cause = c.source();
    }
    Error::Tokenizer(text)
}

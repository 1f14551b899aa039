//! The built-in model's tokenizer: one token per character, written as a
//! real Hugging Face `tokenizer.json` so that it is loaded by the same code
//! (and the same `tokenizers` crate) as any checkpoint's.
//!
//! Ids: the special tokens `<pad>` 0, `<s>` 1 (BOS, added by the
//! post-processor when special tokens are requested), `</s>` 2 (EOS),
//! `<unk>` 3, `<|im_start|>` 4 and `<|im_end|>` 5 (so ChatML prompts work),
//! then `\n` and the printable ASCII characters ` `..=`~`.
//!
//! Encoded as a BPE model with no merges and no pre-tokenizer — BPE starts
//! from single characters, so without merges it *is* a character tokenizer —
//! and the `Fuse` decoder, which joins tokens without inserting spaces.

use std::path::Path;

use serde_json::{json, Value};

use crate::{Error, Result};

/// The special tokens, in id order.
pub const SPECIAL: [&str; 6] = [
    "<pad>",
    "<s>",
    "</s>",
    "<unk>",
    "<|im_start|>",
    "<|im_end|>",
];
pub const PAD_ID: u32 = 0;
pub const BOS_ID: u32 = 1;
pub const EOS_ID: u32 = 2;
pub const IM_END_ID: u32 = 5;

/// ChatML, as Qwen's templates render it (what `render_chat` implements).
pub const CHAT_TEMPLATE: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// The ordinary (non-special) characters, in id order after the specials.
pub fn characters() -> Vec<char> {
    std::iter::once('\n').chain(' '..='~').collect()
}

/// The number of tokens (specials and characters).
pub fn vocab_size() -> usize {
    SPECIAL.len() + characters().len()
}

/// `tokenizer.json`.
pub fn tokenizer_json() -> Value {
    let mut vocab = serde_json::Map::new();
    for (id, tok) in SPECIAL.iter().enumerate() {
        vocab.insert((*tok).to_owned(), json!(id));
    }
    for (i, c) in characters().into_iter().enumerate() {
        vocab.insert(c.to_string(), json!(SPECIAL.len() + i));
    }
    let added: Vec<Value> = SPECIAL
        .iter()
        .enumerate()
        .map(|(id, tok)| {
            json!({"id": id, "content": tok, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let bos = SPECIAL[BOS_ID as usize];
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": null,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [BOS_ID], "tokens": [bos]}}
        },
        "decoder": {"type": "Fuse"},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": SPECIAL[3],
            "continuing_subword_prefix": null, "end_of_word_suffix": null,
            "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": []
        }
    })
}

/// `tokenizer_config.json`: the special tokens and the chat template.
pub fn tokenizer_config_json() -> Value {
    json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": SPECIAL[BOS_ID as usize],
        "eos_token": SPECIAL[EOS_ID as usize],
        "pad_token": SPECIAL[PAD_ID as usize],
        "unk_token": SPECIAL[3],
        "add_bos_token": true,
        "clean_up_tokenization_spaces": false,
        "chat_template": CHAT_TEMPLATE,
    })
}

/// Writes `tokenizer.json` and `tokenizer_config.json` into `dir`.
pub fn write_tokenizer(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    for (name, v) in [
        ("tokenizer.json", tokenizer_json()),
        ("tokenizer_config.json", tokenizer_config_json()),
    ] {
        let path = dir.join(name);
        let text = serde_json::to_string_pretty(&v)?;
        std::fs::write(&path, text + "\n").map_err(|e| Error::io(&path, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_dense_and_unique() {
        let v = tokenizer_json();
        let vocab = v["model"]["vocab"].as_object().unwrap();
        assert_eq!(vocab.len(), vocab_size());
        let mut ids: Vec<u64> = vocab.values().map(|x| x.as_u64().unwrap()).collect();
        ids.sort();
        assert_eq!(ids, (0..vocab_size() as u64).collect::<Vec<_>>());
        assert_eq!(
            vocab["0"],
            json!(SPECIAL.len() + 17),
            "'0' after '\\n', ' ' and 15 symbols"
        );
    }
}

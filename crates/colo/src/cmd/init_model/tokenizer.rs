//! The small tokenizer: one token per byte and the family's special
//! tokens, with the files transformers reads it from.

use colo_plan::presets::Family;
use serde_json::{json, Value};

/// A byte-level BPE tokenizer without merges: ids 0–255 are the bytes (in
/// GPT-2's byte-to-character alphabet, as Qwen's and Llama 3's
/// tokenizers spell them), then the family's special and added tokens.
pub(super) struct SmallTokenizer {
    /// Tokens after the 256 bytes: (text, special).
    added: Vec<(&'static str, bool)>,
    /// `tokenizer_config.json`'s bos, eos and pad tokens.
    bos: Option<&'static str>,
    eos: &'static str,
    pad: Option<&'static str>,
    /// `config.json`'s bos and eos (the published base model's).
    pub(super) config_bos: &'static str,
    pub(super) config_eos: &'static str,
    /// `generation_config.json`'s eos tokens: the chat's end of turn with
    /// the end of text, as the Instruct models list them, so that chat
    /// rollouts stop at the end of a turn.
    stop: &'static [&'static str],
    /// The post-processor puts `bos` before every encoding (Llama 3's).
    prepend_bos: bool,
    /// The chat template of Qwen2.5-Instruct, Qwen3 or Llama-3.1-Instruct
    /// as their tokenizer files ship it (`*.jinja` beside this file: copies of
    /// `testdata/chat-templates/`, whose renders colo-model's tests check
    /// against transformers').
    chat_template: &'static str,
}

const BYTES: usize = 256;

impl SmallTokenizer {
    pub(super) fn for_family(family: Family) -> Self {
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
                chat_template: include_str!("qwen2.5.jinja"),
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
                chat_template: include_str!("qwen3.jinja"),
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
                chat_template: include_str!("llama-3.1.jinja"),
            },
        }
    }

    /// The vocabulary's size.
    pub(super) fn len(&self) -> usize {
        BYTES + self.added.len()
    }

    /// The id of an added token of this tokenizer.
    pub(super) fn id(&self, token: &str) -> u32 {
        let at = self.added.iter().position(|(t, _)| *t == token);
        (BYTES + at.expect("a token of the family's table")) as u32
    }

    pub(super) fn tokenizer_json(&self) -> Value {
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

    pub(super) fn tokenizer_config_json(&self, model_max_length: u64) -> Value {
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

    pub(super) fn generation_config_json(&self) -> Value {
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

#[cfg(test)]
mod tests {
    use super::super::write_json;
    use super::*;
    use colo_model::Tokenizer;

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

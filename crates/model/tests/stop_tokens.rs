//! The tokens that end a completion of a checkpoint.

use std::path::PathBuf;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/tiny-qwen2")
}

/// The tokens that end a completion: the tokenizer's end-of-sequence
/// token, then config.json's and generation_config.json's (as vLLM gathers
/// them), each once; a malformed id is an error naming the file.
#[test]
fn stop_tokens_gather_the_tokenizers_and_the_configs() {
    use colo_model::tokenizer::{stop_token_ids, Tokenizer};
    let fixture = fixture();
    let tmp = std::env::temp_dir().join(format!("colo-model-{}-stop", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json", "config.json"] {
        std::fs::copy(fixture.join(f), tmp.join(f)).unwrap();
    }
    let tok = Tokenizer::from_dir(&tmp).unwrap();
    let eos = tok.special.eos.as_ref().unwrap().id;
    assert_eq!(
        stop_token_ids(&tmp, &tok).unwrap(),
        vec![eos],
        "config.json repeats it"
    );
    std::fs::write(
        tmp.join("generation_config.json"),
        format!("{{\"eos_token_id\": [7, {eos}, 9]}}"),
    )
    .unwrap();
    assert_eq!(stop_token_ids(&tmp, &tok).unwrap(), vec![eos, 7, 9]);
    std::fs::write(
        tmp.join("generation_config.json"),
        "{\"eos_token_id\": 99999999999}",
    )
    .unwrap();
    let e = stop_token_ids(&tmp, &tok).unwrap_err().to_string();
    assert!(
        e.contains("generation_config.json") && e.contains("99999999999"),
        "{e}"
    );
    // A token the tokenizer does not have, and an id written as text, are
    // errors, not stop tokens that never match.
    let vocab = tok.vocab_size();
    for (written, says) in [
        (
            format!("{vocab}"),
            format!("{vocab} is not a token of the tokenizer"),
        ),
        ("\"7\"".to_owned(), "\"7\": expected a token id".to_owned()),
    ] {
        let text = format!("{{\"eos_token_id\": {written}}}");
        std::fs::write(tmp.join("generation_config.json"), text).unwrap();
        let e = stop_token_ids(&tmp, &tok).unwrap_err().to_string();
        assert!(
            e.contains("generation_config.json: eos_token_id") && e.contains(&says),
            "{e}"
        );
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

//! Chat templates render as transformers renders them: the chat templates
//! of Qwen2.5-Instruct, Qwen3 and Llama-3.1-Instruct
//! (`testdata/chat-templates`) on a few conversations, against the texts
//! transformers' `render_jinja_template` wrote (`render.py` there).

use std::path::PathBuf;

use colo_model::chat_template::ChatTemplate;
use colo_model::tokenizer::ChatMessage;
use serde_json::Value;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/chat-templates")
}

#[test]
fn templates_render_as_transformers_renders_them() {
    let cases: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(dir().join("expected.json")).unwrap())
            .unwrap();
    assert_eq!(cases.len(), 18);
    for case in &cases {
        let name = case["template"].as_str().unwrap();
        let source = std::fs::read_to_string(dir().join(format!("{name}.jinja"))).unwrap();
        let messages: Vec<ChatMessage> = case["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| ChatMessage {
                role: m["role"].as_str().unwrap().into(),
                content: m["content"].as_str().unwrap().into(),
            })
            .collect();
        let gen = case["add_generation_prompt"].as_bool().unwrap();
        let got = ChatTemplate::new(source)
            .unwrap()
            .render(
                &messages,
                gen,
                case["bos_token"].as_str(),
                case["eos_token"].as_str(),
            )
            .unwrap();
        assert_eq!(
            got,
            case["text"].as_str().unwrap(),
            "{name}, {} messages, add_generation_prompt {gen}",
            messages.len()
        );
    }
}

#[test]
fn template_errors_say_what_and_where() {
    let e = ChatTemplate::new("{% for m in messages %}{{ m.content }".into()).unwrap_err();
    assert!(
        e.to_string().starts_with("tokenizer: chat template: "),
        "{e}"
    );
    let raising = ChatTemplate::new(
        "{% if messages[0].role != 'user' %}{{ raise_exception('Conversations must start with a user message') }}{% endif %}".into(),
    )
    .unwrap();
    let system = [ChatMessage {
        role: "system".into(),
        content: "x".into(),
    }];
    let e = raising
        .render(&system, true, None, None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("Conversations must start with a user message"),
        "{e}"
    );
}

/// Through a checkpoint's tokenizer, a template's errors name the file it
/// came from, once, without a dump of the template; a checkpoint without
/// one names its directory; a `chat_template` that is not text says so.
#[test]
fn a_checkpoints_template_errors_name_its_file() {
    let dir = std::env::temp_dir().join(format!("colo-model-{}-tmpl", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/tiny-qwen2");
    std::fs::copy(fixture.join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    let chat = [ChatMessage {
        role: "user".into(),
        content: "x".into(),
    }];
    let render = || {
        colo_model::tokenizer::Tokenizer::from_dir(&dir)
            .unwrap()
            .render_chat(&chat, true)
            .unwrap_err()
            .to_string()
    };
    let e = render();
    assert!(
        e.contains(&format!(
            "the tokenizer of {} has no chat template",
            dir.display()
        )),
        "{e}"
    );
    let cfg = dir.join("tokenizer_config.json");
    std::fs::write(&cfg, r#"{"chat_template": "{{ messages }"}"#).unwrap();
    let e = render();
    assert!(
        e.starts_with("tokenizer: chat template: syntax error")
            && e.ends_with(&format!("(the template of {})", cfg.display()))
            && !e.contains("tokenizer: tokenizer")
            && !e.contains("referenced variables"),
        "{e}"
    );
    std::fs::write(&cfg, r#"{"chat_template": 42}"#).unwrap();
    let e = render();
    assert!(
        e.contains("`chat_template` is a number; expected a string"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

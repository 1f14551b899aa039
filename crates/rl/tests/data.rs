//! Loading prompts: both prompt forms, configurable fields, and errors that
//! name the file, line and field.

mod common;

use colo_model::Tokenizer;
use colo_rl::{vocab, Dataset, Error, Fields};
use common::TempDir;

fn fields(prompt: &str, answer: &str) -> Fields {
    Fields {
        prompt_key: prompt.into(),
        answer_key: answer.into(),
        ..Fields::default()
    }
}

#[test]
fn plain_and_chat_prompts_with_nested_answers() {
    let dir = TempDir::new("data-ok");
    vocab::write_tokenizer(&dir.0).unwrap();
    let tok = Tokenizer::from_dir(&dir.0).unwrap();
    let path = dir.write(
        "d.jsonl",
        concat!(
            r#"{"question": "2+2=", "reward_model": {"ground_truth": 4}, "source": "x"}"#, "\n",
            "\n",
            r#"{"question": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "3+3="}], "reward_model": {"ground_truth": "6"}}"#, "\n",
        ),
    );
    let d = Dataset::from_files(
        &[path.clone(), path],
        &fields("question", "reward_model.ground_truth"),
        Some(&tok),
    )
    .unwrap();
    assert_eq!(d.len(), 4, "two files' prompts, blank lines skipped");
    assert_eq!(d.prompts[0].text, "2+2=");
    assert_eq!(d.prompts[0].ground_truth, "4", "numbers as written");
    assert_eq!(d.prompts[0].extra["source"], "x");
    assert_eq!(
        d.prompts[1].text,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n3+3=<|im_end|>\n<|im_start|>assistant\n"
    );
    let ids: Vec<u64> = d.prompts.iter().map(|p| p.prompt_id).collect();
    assert_eq!(ids, vec![0, 1, 2, 3]);
}

/// A rendered chat carries the special tokens its template wrote, so it is
/// encoded without the tokenizer adding its own (verl tokenizes
/// `apply_chat_template`'s text with `add_special_tokens=False`: a Llama 3
/// prompt would otherwise start with two BOS); a plain prompt gets them.
#[test]
fn chat_prompts_are_encoded_without_the_tokenizers_own_special_tokens() {
    let dir = TempDir::new("data-encode");
    vocab::write_tokenizer(&dir.0).unwrap();
    let tok = Tokenizer::from_dir(&dir.0).unwrap();
    let path = dir.write(
        "d.jsonl",
        concat!(
            r#"{"prompt": "1+1=", "answer": "2"}"#,
            "\n",
            r#"{"prompt": [{"role": "user", "content": "1+1="}], "answer": "2"}"#,
            "\n",
        ),
    );
    let d = Dataset::from_files(&[path], &Fields::default(), Some(&tok)).unwrap();
    let (plain, chat) = (&d.prompts[0], &d.prompts[1]);
    assert!(!plain.chat && chat.chat);
    let plain_ids = plain.encode(&tok).unwrap();
    assert_eq!(plain_ids[0], vocab::BOS_ID, "the post-processor's BOS");
    assert_eq!(plain_ids[1..], tok.encode("1+1=", false).unwrap());
    let chat_ids = chat.encode(&tok).unwrap();
    assert_eq!(chat_ids, tok.encode(&chat.text, false).unwrap());
    assert_ne!(chat_ids[0], vocab::BOS_ID);
}

/// A ground truth that is a list or an object is refused, naming the file,
/// the line and the field, unless the run's reward takes one (verl's
/// rules, a Python function, an external command): then it is its JSON
/// text, as verl passes it on.
#[test]
fn structured_ground_truths_are_refused_unless_the_reward_takes_them() {
    let rows = concat!(
        r#"{"prompt": "a", "answer": "7"}"#,
        "\n",
        r#"{"prompt": "b", "answer": ["7", "seven"]}"#,
        "\n",
    );
    let (msg, e) = load_err(rows, &Fields::default());
    assert!(
        matches!(e, Error::Data { line: 2, .. })
            && msg.contains(
                "bad.jsonl:2: field `answer`: is a list; the reward compares with a \
                 string or a number"
            ),
        "{msg}"
    );
    let (msg, _) = load_err(
        r#"{"prompt": "a", "answer": {"target": ["7"]}}"#,
        &Fields::default(),
    );
    assert!(msg.contains(":1: field `answer`: is an object;"), "{msg}");

    let taking = Fields {
        structured_answers: true,
        ..Fields::default()
    };
    let dir = TempDir::new("data-structured");
    let path = dir.write("ok.jsonl", rows);
    let d = Dataset::from_files(&[path], &taking, None).unwrap();
    assert_eq!(d.prompts[1].ground_truth, r#"["7","seven"]"#);

    // The run's reward decides.
    let takes = |reward: &str| {
        let text = format!("[reward]\n{reward}\n");
        let c = colo_rl::Config::from_toml(&text, std::path::Path::new("run.toml")).unwrap();
        c.fields().structured_answers
    };
    assert!(!takes("kind = \"numeric\""));
    assert!(!takes("kind = \"exact_match\""));
    assert!(takes("kind = \"verl\""));
    assert!(takes("kind = \"external\"\ncommand = [\"x\"]"));
    assert!(takes("kind = \"python\"\npath = \"r.py\""));
    let weighted = |second: &str| {
        format!(
            "kind = \"weighted\"\n[[reward.terms]]\nweight = 1.0\nreward = {{ kind = \"verl\" }}\n\
             [[reward.terms]]\nweight = 0.5\nreward = {{ {second} }}"
        )
    };
    assert!(takes(&weighted(
        "kind = \"format\", open = \"<a>\", close = \"</a>\""
    )));
    assert!(!takes(&weighted("kind = \"boxed\"")));
}

fn load_err(text: &str, f: &Fields) -> (String, Error) {
    let dir = TempDir::new("data-err");
    let path = dir.write("bad.jsonl", text);
    let e = Dataset::from_files(&[path], f, None).unwrap_err();
    (e.to_string(), e)
}

#[test]
fn errors_name_the_line_and_field() {
    let f = Fields::default();
    let (msg, e) = load_err(
        "{\"prompt\": \"a\", \"answer\": \"1\"}\n{\"prompt\": \"b\",\n",
        &f,
    );
    assert!(
        matches!(
            e,
            Error::Data {
                line: 2,
                field: None,
                ..
            }
        ),
        "{msg}"
    );
    assert!(msg.contains("bad.jsonl:2: not JSON"), "{msg}");

    let (msg, _) = load_err("{\"prompt\": \"a\"}\n", &f);
    assert!(
        msg.ends_with("bad.jsonl:1: field `answer`: missing"),
        "{msg}"
    );

    let (msg, _) = load_err("{\"text\": \"a\", \"answer\": 1}\n", &f);
    assert!(msg.contains(":1: field `prompt`: missing"), "{msg}");

    let (msg, _) = load_err("{\"prompt\": 5, \"answer\": 1}\n", &f);
    assert!(
        msg.contains("field `prompt`: expected a string or a list of chat messages"),
        "{msg}"
    );

    let (msg, _) = load_err("{\"prompt\": [{\"role\": \"user\"}], \"answer\": 1}\n", &f);
    assert!(
        msg.contains("field `prompt[0].content`: expected a string"),
        "{msg}"
    );

    let (msg, _) = load_err(
        "{\"prompt\": [{\"role\": \"user\", \"content\": \"x\"}], \"answer\": 1}\n",
        &f,
    );
    assert!(msg.contains("chat messages need a tokenizer"), "{msg}");

    let (msg, _) = load_err("{\"prompt\": \"a\", \"answer\": null}\n", &f);
    assert!(msg.contains("field `answer`: is null"), "{msg}");

    let (msg, _) = load_err("[1, 2]\n", &f);
    assert!(msg.contains(":1: expected a JSON object"), "{msg}");

    let (msg, _) = load_err("\n\n", &f);
    assert!(msg.contains("no prompts"), "{msg}");

    // Caught when read, not at the step that draws the prompt.
    let (msg, _) = load_err(
        "{\"prompt\": \"a\", \"answer\": 1}\n{\"prompt\": \"\", \"answer\": 1}\n",
        &f,
    );
    assert!(
        msg.ends_with("bad.jsonl:2: field `prompt`: is empty"),
        "{msg}"
    );
    let (msg, _) = load_err("{\"prompt\": [], \"answer\": 1}\n", &f);
    assert!(
        msg.contains(":1: field `prompt`: an empty list of chat messages"),
        "{msg}"
    );

    // A byte-order mark is skipped; bytes that are not UTF-8 name their line.
    let dir = TempDir::new("data-bytes");
    let bom = dir.write("bom.jsonl", "\u{feff}{\"prompt\": \"a\", \"answer\": 1}\n");
    assert_eq!(Dataset::from_files(&[bom], &f, None).unwrap().len(), 1);
    let latin1 = dir.0.join("latin1.jsonl");
    let mut bytes = b"{\"prompt\": \"a\", \"answer\": 1}\n{\"prompt\": \"".to_vec();
    bytes.extend([0xe9, b'"', b'}', b'\n']);
    std::fs::write(&latin1, bytes).unwrap();
    let msg = Dataset::from_files(&[latin1], &f, None)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("latin1.jsonl:2: neither JSONL (not UTF-8 text at byte 41)"),
        "{msg}"
    );
}

#[test]
fn missing_file_is_named() {
    let e = Dataset::from_files(
        &["/nonexistent/train.jsonl".into()],
        &Fields::default(),
        None,
    )
    .unwrap_err();
    assert_eq!(e.to_string(), "dataset not found: /nonexistent/train.jsonl");
    // A directory, and a text file named .parquet, say what they are.
    let dir = TempDir::new("data-kinds");
    let e =
        Dataset::from_files(std::slice::from_ref(&dir.0), &Fields::default(), None).unwrap_err();
    assert!(
        e.to_string().contains(": a directory; data.train_files"),
        "{e}"
    );
    let fake = dir.write("train.parquet", "{\"prompt\": \"a\", \"answer\": 1}\n");
    let e = Dataset::from_files(&[fake], &Fields::default(), None).unwrap_err();
    assert!(
        e.to_string()
            .contains("train.parquet: named .parquet but not a parquet file"),
        "{e}"
    );
}

/// The fixtures `tests/data/make_verl_parquet.py` wrote with pyarrow, in
/// verl's gsm8k layout.
fn verl_fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

#[test]
fn a_verl_parquet_file_reads_as_its_jsonl_twin() {
    let dir = TempDir::new("data-parquet");
    vocab::write_tokenizer(&dir.0).unwrap();
    let tok = Tokenizer::from_dir(&dir.0).unwrap();
    let f = fields("prompt", "reward_model.ground_truth");
    // The same prompts; each knows where it was read.
    let load = |name: &str| {
        let mut d = Dataset::from_files(&[verl_fixture(name)], &f, Some(&tok)).unwrap();
        for (i, p) in d.prompts.iter_mut().enumerate() {
            let origin = std::mem::take(&mut p.origin);
            let (row, line) = (
                format!("{name}: row {}", i + 1),
                format!("{name}:{}", i + 1),
            );
            assert!(
                origin.ends_with(&row) || origin.ends_with(&line),
                "{origin}"
            );
        }
        d
    };
    let (parquet, jsonl) = (load("gsm8k-verl.parquet"), load("gsm8k-verl.jsonl"));
    assert_eq!(parquet, jsonl);
    assert_eq!(
        load("gsm8k-verl-zstd.parquet"),
        jsonl,
        "zstd (polars' default) too"
    );
    assert_eq!(parquet.len(), 3);
    let p = &parquet.prompts[1];
    assert_eq!(p.ground_truth, "150");
    assert!(
        p.text
            .starts_with("<|im_start|>user\nA train travels 60 km")
            && p.text.ends_with("<|im_start|>assistant\n"),
        "the chat prompt rendered with the template: {:?}",
        p.text
    );
    assert_eq!(p.extra["data_source"], "openai/gsm8k");
    assert_eq!(
        p.extra["extra_info"]["index"], 1,
        "nested structs as objects, int64 as numbers"
    );
    let both = Dataset::from_files(
        &[
            verl_fixture("gsm8k-verl.jsonl"),
            verl_fixture("gsm8k-verl.parquet"),
        ],
        &f,
        Some(&tok),
    )
    .unwrap();
    let ids: Vec<u64> = both.prompts.iter().map(|p| p.prompt_id).collect();
    assert_eq!(ids, (0..6).collect::<Vec<_>>(), "ids run over both formats");
}

#[test]
fn parquet_errors_name_the_file_the_row_and_what_to_do() {
    let dir = TempDir::new("data-parquet-err");
    vocab::write_tokenizer(&dir.0).unwrap();
    let tok = Tokenizer::from_dir(&dir.0).unwrap();
    let load = |path: std::path::PathBuf, f: &Fields| {
        Dataset::from_files(&[path], f, Some(&tok))
            .unwrap_err()
            .to_string()
    };

    let msg = load(verl_fixture("gsm8k-verl.parquet"), &Fields::default());
    assert!(
        msg.contains("gsm8k-verl.parquet: row 1: field `answer`: missing")
            && msg.contains("data.answer_key = \"reward_model.ground_truth\""),
        "{msg}"
    );

    let f = fields("prompt", "reward_model.ground_truth");
    let msg = load(verl_fixture("gsm8k-verl-gzip.parquet"), &f);
    assert!(
        msg.contains("gsm8k-verl-gzip.parquet: compressed with ")
            && msg.to_lowercase().contains("gzip")
            && msg.contains("compression=\"snappy\""),
        "{msg}"
    );

    let mut cut = std::fs::read(verl_fixture("gsm8k-verl.parquet")).unwrap();
    cut.truncate(cut.len() / 2);
    let path = dir.0.join("cut.parquet");
    std::fs::write(&path, cut).unwrap();
    let msg = load(path, &f);
    assert!(
        msg.contains("cut.parquet: not a readable parquet file"),
        "{msg}"
    );

    let path = dir.0.join("binary.jsonl");
    std::fs::write(&path, [0xffu8, 0xfe, 0x00, 0x01]).unwrap();
    let msg = load(path, &f);
    assert!(msg.contains("binary.jsonl:1: neither JSONL"), "{msg}");
}

//! The built-in task through the same code as a user's: its tokenizer loaded
//! by colo-model, its config and data read back.

mod common;

use colo_model::{ChatMessage, Model, ModelConfig, Tokenizer, Weights};
use colo_rl::task::{self, ArithmeticTask};
use colo_rl::{vocab, Batches, Config, Dataset, Fields};
use common::TempDir;
use tch::{Device, Kind, Tensor};

#[test]
fn tokenizer_round_trips_through_colo_model() {
    let dir = TempDir::new("tok");
    vocab::write_tokenizer(&dir.0).unwrap();
    let tok = Tokenizer::from_dir(&dir.0).unwrap();
    assert_eq!(tok.vocab_size(), vocab::vocab_size());
    assert_eq!(tok.special.bos.as_ref().unwrap().id, vocab::BOS_ID);
    assert_eq!(tok.special.eos.as_ref().unwrap().id, vocab::EOS_ID);
    assert_eq!(tok.special.pad.as_ref().unwrap().id, vocab::PAD_ID);

    // One token per character, BOS first when special tokens are asked for.
    let ids = tok.encode("12+7=", true).unwrap();
    assert_eq!(ids.len(), 6);
    assert_eq!(ids[0], vocab::BOS_ID);
    assert_eq!(tok.encode("12+7=", false).unwrap(), ids[1..].to_vec());
    let digit = |c: char| tok.token_to_id(&c.to_string()).unwrap();
    assert_eq!(
        ids[1..],
        [digit('1'), digit('2'), digit('+'), digit('7'), digit('=')]
    );

    for text in [
        "12+7=19",
        "What is 3 + 4?\nIt is 7.",
        "  spaces  and ~{}[]|\\ symbols ",
    ] {
        let ids = tok.encode(text, true).unwrap();
        assert_eq!(ids.len(), text.chars().count() + 1, "{text:?}");
        assert_eq!(tok.decode(&ids, true).unwrap(), text, "decode skips BOS");
    }
    // Generation ends with EOS, which decoding drops.
    let mut answer = tok.encode("19", false).unwrap();
    answer.push(vocab::EOS_ID);
    assert_eq!(tok.decode(&answer, true).unwrap(), "19");
    assert_eq!(tok.decode(&answer, false).unwrap(), "19</s>");
    // Characters outside the vocabulary become <unk>.
    assert_eq!(tok.encode("é", false).unwrap(), vec![3]);

    // ChatML through the chat template.
    let chat = tok
        .render_chat(
            &[ChatMessage {
                role: "user".into(),
                content: "1+1=".into(),
            }],
            true,
        )
        .unwrap();
    let ids = tok.encode(&chat, false).unwrap();
    assert_eq!(ids[0], 4, "<|im_start|> is one token");
    assert!(ids.contains(&vocab::IM_END_ID));
}

#[test]
fn model_config_loads_and_runs_with_random_weights() {
    let dir = TempDir::new("model");
    task::write_model_files(&dir.0).unwrap();
    let cfg = ModelConfig::from_file(&dir.0.join("config.json")).unwrap();
    assert_eq!(cfg, task::model_config(), "config.json round-trips");
    let n = cfg.num_parameters();
    assert!((700_000..900_000).contains(&n), "{n} parameters");

    let tok = Tokenizer::from_dir(&dir.0).unwrap();
    let w = Weights::random(&cfg, 0.02, Kind::Float, Device::Cpu).unwrap();
    let model = Model::load(&cfg, &w).unwrap();
    let ids = tok.encode("12+7=", true).unwrap();
    let ids: Vec<i64> = ids.iter().map(|&t| t as i64).collect();
    let ids = Tensor::from_slice(&ids).unsqueeze(0);
    let logits = model.forward(&ids).unwrap();
    assert_eq!(logits.size(), [1, 6, vocab::vocab_size() as i64]);
}

#[test]
fn task_data_go_through_the_user_loader() {
    let dir = TempDir::new("task");
    let t = ArithmeticTask {
        train_size: 300,
        val_size: 50,
        ..Default::default()
    };
    let (train_path, val_path) = t.write_jsonl(&dir.0).unwrap();
    let train = Dataset::from_files(&[train_path], &Fields::default(), None).unwrap();
    let val = Dataset::from_files(&[val_path], &Fields::default(), None).unwrap();
    assert_eq!((train.len(), val.len()), (300, 50));
    let (gen_train, _) = t.generate().unwrap();
    assert_eq!(train.prompts[7].text, gen_train[7].prompt);
    assert_eq!(train.prompts[7].ground_truth, gen_train[7].answer);

    // The built-in run's batches from that data.
    let c = Config::builtin();
    let b = Batches::new(
        &train,
        c.batch.prompts_per_step,
        c.data_seed(),
        c.data.shuffle,
        "data.train_batch_size",
    )
    .unwrap();
    assert_eq!(b.batches_per_epoch(), 300 / 32);
    // Answers fit the run's generation budget (digits + EOS).
    let longest = train
        .prompts
        .iter()
        .map(|p| p.ground_truth.len())
        .max()
        .unwrap();
    assert!(longest < c.rollout.max_new_tokens, "{longest}");
}

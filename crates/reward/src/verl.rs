//! verl's default reward: the rule is chosen per sample by the dataset row's
//! `data_source` (verl's `default_compute_score`), so verl's preprocessed
//! datasets train with the reward verl would give them.
//!
//! | `data_source` | rule |
//! |---|---|
//! | `openai/gsm8k` | the number after the last `####` ([`NumericMatch`], verl's strict GSM8K rule) |
//! | `lighteval/MATH`, `DigitalLearningGmbH/MATH-lighteval`, `HuggingFaceH4/MATH-500` | the last `\boxed{…}` ([`BoxedMatch`]) |
//! | `math_dapo`, `math`, `math_dapo_reasoning`, `aime…` | DAPO's: the last `Answer:`, Minerva-normalised, +1 or −1 ([`DapoMath`]) |
//! | `searchR1_nq`, `searchR1_triviaqa`, … (Search-R1's seven sets) | the last `<answer>…</answer>`, SQuAD-normalised, against the ground truth's targets ([`SearchR1Em`]) |
//!
//! verl's other sources (PRIME's math and code, code sandboxes,
//! geometry3k) have no colo rule: a sample from one is an error naming its
//! source, which says to write the rule as an external reward.

use super::dapo::DapoMath;
use super::rules::{BoxedMatch, NumericMatch};
use super::search_r1::{self, SearchR1Em};
use super::{Reward, RewardInput, Scored};
use crate::Result;

/// The field of a dataset row that names its source.
pub const DATA_SOURCE: &str = "data_source";

/// The rule verl applies to rows of `source`, if colo has it.
pub fn rule_for(source: &str) -> Option<Box<dyn Reward>> {
    match source {
        "openai/gsm8k" => Some(Box::new(NumericMatch {
            tolerance: 1e-6,
            after: Some("####".into()),
        })),
        "lighteval/MATH" | "DigitalLearningGmbH/MATH-lighteval" | "HuggingFaceH4/MATH-500" => {
            Some(Box::new(BoxedMatch { tolerance: 1e-6 }))
        }
        "math_dapo" | "math" | "math_dapo_reasoning" => Some(Box::new(DapoMath)),
        s if s.starts_with("aime") => Some(Box::new(DapoMath)),
        s if search_r1::SOURCES.contains(&s) => Some(Box::new(SearchR1Em)),
        _ => None,
    }
}

/// verl's `default_compute_score`: each sample scored by its row's
/// `data_source`'s rule.
#[derive(Debug, Clone, Copy, Default)]
pub struct VerlDefault;

impl Reward for VerlDefault {
    fn name(&self) -> String {
        "verl".into()
    }

    fn score(&mut self, i: &RewardInput<'_>) -> Result<f32> {
        rule_of(i)?.score(i)
    }

    /// The rule's numbers beside its score (DAPO's `acc`), as verl's
    /// reward manager keeps a rule's result dict.
    fn score_batch_extra(&mut self, inputs: &[RewardInput<'_>]) -> Result<Vec<Scored>> {
        let mut out = Vec::with_capacity(inputs.len());
        for i in inputs {
            out.extend(rule_of(i)?.score_batch_extra(std::slice::from_ref(i))?);
        }
        Ok(out)
    }
}

/// The rule of sample `i`'s row, or the error naming what is missing.
fn rule_of(i: &RewardInput<'_>) -> Result<Box<dyn Reward>> {
    let Some(source) = i
        .extra
        .and_then(|e| e.get(DATA_SOURCE))
        .and_then(|v| v.as_str())
    else {
        return Err(i.fail(
            "verl",
            format!(
                "the row has no `{DATA_SOURCE}` string, by which verl's default reward \
                     picks its rule"
            ),
        ));
    };
    match rule_for(source) {
        Some(rule) => Ok(rule),
        None => Err(i.fail(
            "verl",
            format!(
                "data_source {source:?} has no rule in colo (it has openai/gsm8k, \
                     lighteval/MATH, DAPO's math_dapo and Search-R1's searchR1_*): write verl's \
                     rule as an external reward (reward.kind = \"external\")"
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Map, Value};

    use super::*;
    use crate::{build, RewardSpec};

    fn row(source: Option<&str>) -> Map<String, Value> {
        let mut m = Map::new();
        if let Some(s) = source {
            m.insert(DATA_SOURCE.into(), json!(s));
        }
        m.insert("ability".into(), json!("math"));
        m
    }

    fn score(source: Option<&str>, completion: &str, truth: &str) -> Result<f32> {
        let extra = row(source);
        let mut reward = build(&toml::from_str::<RewardSpec>("kind = \"verl\"").unwrap()).unwrap();
        reward.score(&RewardInput {
            sample: 5,
            prompt_id: 2,
            prompt: "q",
            completion,
            ground_truth: truth,
            extra: Some(&extra),
        })
    }

    #[test]
    fn gsm8k_rows_score_the_number_after_the_last_marker() {
        let gsm8k = Some("openai/gsm8k");
        assert_eq!(
            score(gsm8k, "3 boxes × 12 = 36, minus 9. #### 27", "27").unwrap(),
            1.0
        );
        assert_eq!(score(gsm8k, "#### 26 no, #### 1,027", "1027").unwrap(), 1.0);
        assert_eq!(score(gsm8k, "#### 26", "27").unwrap(), 0.0);
        assert_eq!(
            score(gsm8k, "27", "27").unwrap(),
            0.0,
            "no marker: verl's strict rule gives 0"
        );
    }

    #[test]
    fn math_rows_score_the_last_box() {
        let math = Some("lighteval/MATH");
        assert_eq!(
            score(math, "so \\boxed{\\frac{1}{2}}", "\\frac{1}{2}").unwrap(),
            1.0
        );
        assert_eq!(score(math, "\\boxed{3}", "\\boxed{4}").unwrap(), 0.0);
    }

    #[test]
    fn math_500_rows_score_the_last_box() {
        let math500 = Some("HuggingFaceH4/MATH-500");
        assert_eq!(score(math500, "\\boxed{12}", "12").unwrap(), 1.0);
        assert_eq!(score(math500, "Answer: 12", "12").unwrap(), 0.0);
    }

    /// DAPO's sources: the last `Answer:`, +1 right and −1 wrong.
    #[test]
    fn dapo_rows_score_the_last_answer_plus_or_minus_one() {
        for source in [
            "math_dapo",
            "math",
            "math_dapo_reasoning",
            "aime2024",
            "aime25",
        ] {
            assert_eq!(
                score(Some(source), "so\nAnswer: 34", "34").unwrap(),
                1.0,
                "{source}"
            );
            assert_eq!(
                score(Some(source), "Answer: 35", "34").unwrap(),
                -1.0,
                "{source}"
            );
            assert_eq!(score(Some(source), "34", "34").unwrap(), -1.0, "{source}");
        }
    }

    /// verl's `math_dapo` returns `acc` beside its score; GSM8K's rule a
    /// plain number.
    #[test]
    fn dapo_rows_say_acc_beside_the_score() {
        let (dapo, gsm8k) = (row(Some("math_dapo")), row(Some("openai/gsm8k")));
        let input = |completion, extra| RewardInput {
            sample: 0,
            prompt_id: 0,
            prompt: "q",
            completion,
            ground_truth: "34",
            extra: Some(extra),
        };
        let mut reward = build(&toml::from_str::<RewardSpec>("kind = \"verl\"").unwrap()).unwrap();
        let scored = reward
            .score_batch_extra(&[
                input("Answer: 34", &dapo),
                input("Answer: 3", &dapo),
                input("#### 34", &gsm8k),
            ])
            .unwrap();
        let got: Vec<(f32, Option<f64>)> = (scored.iter())
            .map(|s| (s.score, s.extra.get("acc").copied()))
            .collect();
        assert_eq!(got, [(1.0, Some(1.0)), (-1.0, Some(0.0)), (1.0, None)]);
    }

    /// Search-R1's sets: exact match of the last `<answer>`, with verl's
    /// `{"target": [...]}` ground truth as colo reads it (JSON text).
    #[test]
    fn search_r1_rows_match_the_last_answer_against_the_targets() {
        let truth = r#"{"target":["Barack Obama","Obama"]}"#;
        for source in search_r1::SOURCES {
            let s = Some(source);
            assert_eq!(score(s, "<answer>obama</answer>", truth).unwrap(), 1.0);
            assert_eq!(score(s, "<answer>Bush</answer>", truth).unwrap(), 0.0);
        }
    }

    #[test]
    fn rows_without_a_rule_are_errors_naming_the_sample_and_what_to_do() {
        let e = score(Some("codecontests"), "print(3)", "3")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"codecontests\"") && e.contains("reward.kind = \"external\""),
            "{e}"
        );
        assert!(e.contains("sample 5"), "{e}");
        let e = score(None, "#### 3", "3").unwrap_err().to_string();
        assert!(e.contains("no `data_source`"), "{e}");
    }
}

//! verl's Search-R1 exact-match rule (`verl.utils.reward_score.
//! search_r1_like_qa_em.compute_score`), which verl's default reward
//! applies to rows whose `data_source` is one of Search-R1's question
//! answering sets ([`SOURCES`]).
//!
//! The answer is the content of the last `<answer>…</answer>` (across
//! lines), trimmed. It is right when, normalised as SQuAD's evaluation
//! normalises (lower case, ASCII punctuation removed, the articles `a`,
//! `an`, `the` removed, whitespace collapsed), it equals one of the ground
//! truth's targets normalised alike. Scores: 1 right, 0.25 right but with
//! more than ten `<answer>` or `</answer>` tags (verl's guard against a
//! flood of them), 0 wrong or without an answer.
//!
//! **The ground truth** is verl's `{"target": [...]}` (Search-R1's
//! preprocessing stores `reward_model.ground_truth` so), which colo reads
//! as its JSON text; a bare list of answers is taken as the targets, and a
//! `target` that is one string, or a ground truth that is plain text, is
//! one target. Answers must be strings, and there must be one at least.

use std::sync::LazyLock;

use regex::Regex;
use serde_json::Value;

use super::{Reward, RewardInput};
use crate::Result;

/// The `data_source` values verl scores with this rule.
pub const SOURCES: [&str; 7] = [
    "searchR1_nq",
    "searchR1_triviaqa",
    "searchR1_popqa",
    "searchR1_hotpotqa",
    "searchR1_2wikimultihopqa",
    "searchR1_musique",
    "searchR1_bamboogle",
];

static ANSWER: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?s)<answer>(.*?)</answer>").expect("a valid pattern"));
static ARTICLE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\b(a|an|the)\b").expect("a valid pattern"));

/// Search-R1's exact match (see the module).
#[derive(Debug, Clone, Copy, Default)]
pub struct SearchR1Em;

impl Reward for SearchR1Em {
    fn name(&self) -> String {
        "search_r1_em".into()
    }

    fn score(&mut self, i: &RewardInput<'_>) -> Result<f32> {
        let targets = targets(i.ground_truth).map_err(|why| i.fail("search_r1_em", why))?;
        let Some(answer) = ANSWER.captures_iter(i.completion).last() else {
            return Ok(0.0);
        };
        let answer = normalize(answer[1].trim());
        if !targets.iter().any(|t| normalize(t) == answer) {
            return Ok(0.0);
        }
        let flood = |tag: &str| i.completion.matches(tag).count() > 10;
        Ok(match flood("<answer>") || flood("</answer>") {
            true => 0.25,
            false => 1.0,
        })
    }
}

/// The ground truth's targets (see the module).
fn targets(ground_truth: &str) -> std::result::Result<Vec<String>, String> {
    let target = match serde_json::from_str::<Value>(ground_truth) {
        Ok(Value::Object(row)) => row.get("target").cloned().ok_or_else(|| {
            format!(
                "the ground truth {ground_truth} has no \"target\" (Search-R1's layout: \
                 {{\"target\": [answers]}})"
            )
        })?,
        // A list of answers as it stands.
        Ok(list @ Value::Array(_)) => list,
        _ => return Ok(vec![ground_truth.to_owned()]),
    };
    let one = |v: &Value| match v {
        Value::String(s) => Ok(s.clone()),
        other => Err(format!(
            "the ground truth's answers are strings, and {ground_truth} holds {other}"
        )),
    };
    let all = match &target {
        Value::Array(all) => all
            .iter()
            .map(one)
            .collect::<std::result::Result<Vec<_>, _>>()?,
        single => vec![one(single)?],
    };
    match all.is_empty() {
        true => Err(format!("the ground truth {ground_truth} lists no answer")),
        false => Ok(all),
    }
}

/// SQuAD's answer normalisation, as verl's `normalize_answer`.
fn normalize(s: &str) -> String {
    let lower = s.to_lowercase();
    let no_punct: String = lower
        .chars()
        .filter(|c| !c.is_ascii_punctuation())
        .collect();
    let no_articles = ARTICLE.replace_all(&no_punct, " ");
    no_articles.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn score(completion: &str, truth: &str) -> Result<f32> {
        SearchR1Em.score(&RewardInput {
            sample: 1,
            prompt_id: 4,
            prompt: "q",
            completion,
            ground_truth: truth,
            extra: None,
        })
    }

    /// Cases whose expected scores are what verl's Python function returned
    /// for them (run once, with its `{"target": [...]}` dicts).
    #[test]
    fn the_last_answer_is_matched_after_normalisation() {
        let paris = r#"{"target": ["Paris", "Paris, France"]}"#;
        assert_eq!(score("<answer>paris</answer>", paris).unwrap(), 1.0);
        assert_eq!(
            score("<think>x</think><answer> The   PARIS! </answer>", paris).unwrap(),
            1.0,
            "case, punctuation, articles and spaces"
        );
        assert_eq!(score("<answer>paris france</answer>", paris).unwrap(), 1.0);
        assert_eq!(
            score(
                "<answer>Paris</answer> no, <answer>\nLyon\n</answer>",
                paris
            )
            .unwrap(),
            0.0,
            "the last answer counts"
        );
        assert_eq!(score("Paris", paris).unwrap(), 0.0, "no answer tags");
        assert_eq!(score("<answer>Paris", paris).unwrap(), 0.0, "unclosed");
        assert_eq!(
            score("<answer>theatre</answer>", r#"{"target": "theatre"}"#).unwrap(),
            1.0,
            "a word that starts with an article keeps it"
        );
        assert_eq!(
            score("<answer>42</answer>", "42").unwrap(),
            1.0,
            "plain text"
        );
        assert_eq!(
            score("<answer>lyon</answer>", r#"["Paris", "Lyon"]"#).unwrap(),
            1.0,
            "a bare list of answers"
        );
        let flood = "<answer>x</answer>".repeat(11) + "<answer>Paris</answer>";
        assert_eq!(score(&flood, paris).unwrap(), 0.25);
    }

    #[test]
    fn a_ground_truth_without_targets_is_an_error_naming_it() {
        let e = score("<answer>a</answer>", r#"{"answer": "a"}"#).unwrap_err();
        assert!(e.to_string().contains("no \"target\""), "{e}");
        let e = score("<answer>a</answer>", r#"{"target": [1]}"#).unwrap_err();
        assert!(e.to_string().contains("answers are strings"), "{e}");
        let e = score("<answer>a</answer>", r#"{"target": []}"#).unwrap_err();
        assert!(e.to_string().contains("lists no answer"), "{e}");
        let e = score("<answer>a</answer>", "[]").unwrap_err();
        assert!(e.to_string().contains("lists no answer"), "{e}");
    }
}

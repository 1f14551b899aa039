//! verl's DAPO math rule (`verl.utils.reward_score.math_dapo`), which
//! verl's default reward applies to rows whose `data_source` is
//! `math_dapo`, `math`, `math_dapo_reasoning` or starts with `aime` (the
//! DAPO recipe's DAPO-Math-17k and its AIME evaluation sets).
//!
//! Of the completion's last 300 characters, the answer is what follows the
//! last `Answer:` (any case) on its line, or, when there is none, the
//! content of the last `\boxed{…}` in the last 100 characters. It is right
//! when it equals the ground truth after both are normalised as Minerva's
//! answers are (lm-evaluation-harness's `normalize_final_answer`: units
//! and words removed, `$…$`, `\text{…}` and `\boxed{…}` unwrapped,
//! `\frac12` spelt out, thousands separators dropped from numbers).
//!
//! The score is DAPO's: **+1 right, −1 wrong** (not 1 / 0), so a
//! wrong answer and a missing one are punished alike; accuracy still counts
//! the +1s (colo-rl's `eval::RIGHT`, a score of at least 1). A port of verl's code, checked against
//! its outputs on the cases in the tests, quirks included (`1, 2`
//! normalises to `12`). One departure: Python's `str.isdigit` also accepts
//! non-ASCII digits (`²`); here only ASCII digits make a number whose
//! commas are dropped.

use std::sync::LazyLock;

use regex::Regex;

use super::{Reward, RewardInput, Scored};
use crate::Result;

/// verl's text when no answer was found.
const INVALID: &str = "[INVALID]";

/// Replaced in order, before [`REMOVED`].
const SUBSTITUTIONS: [(&str, &str); 10] = [
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    (r"\$", ""),
    (r"\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (r",\text{and}", ","),
    (r"\text{and}", ","),
    (r"\text{m}", r"\text{}"),
];

/// Deleted in order.
const REMOVED: [&str; 41] = [
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "hours",
    "km",
    "units",
    r"\ldots",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
    r"\text{s}",
    r"\text{.}",
    "\\text{\ns}",
    r"\text{}^2",
    r"\text{}^3",
    "\\text{\n}",
    r"\text{}",
    r"\mathrm{th}",
    r"^\circ",
    r"^{\circ}",
    r"\;",
    r",\!",
    "{,}",
    "\"",
    r"\dots",
];

fn re(pattern: &str) -> Regex {
    Regex::new(pattern).expect("a fixed pattern compiles")
}

/// The rewrites after the plain replacements, in order: (pattern,
/// replacement in `regex`'s syntax).
static REWRITES: LazyLock<Vec<(Regex, &'static str)>> = LazyLock::new(|| {
    vec![
        // The first `$…$` of a line, alone.
        (re(r"(.*?)(\$)(.*?)(\$)(.*)"), "$$${3}$$"),
        (re(r"(\\text\{)(.*?)(\})"), "${2}"),
        (re(r"(\\textbf\{)(.*?)(\})"), "${2}"),
        (re(r"(\\overline\{)(.*?)(\})"), "${2}"),
        (re(r"(\\boxed\{)(.*)(\})"), "${2}"),
        // \fracab → \frac{a}{b}, \sqrta → \sqrt{a}.
        (re(r"(frac)([^{])(.)"), "frac{${2}}{${3}}"),
        (re(r"(sqrt)([^{])"), "sqrt{${2}}"),
    ]
});

static ANSWER: LazyLock<Regex> = LazyLock::new(|| re(r"(?i)Answer\s*:\s*([^\n]+)"));

/// Minerva's `normalize_final_answer`.
pub fn normalize(answer: &str) -> String {
    let mut s = answer.rsplit('=').next().unwrap_or("").to_owned();
    for (before, after) in SUBSTITUTIONS {
        s = s.replace(before, after);
    }
    for expr in REMOVED {
        s = s.replace(expr, "");
    }
    for (pattern, with) in REWRITES.iter() {
        s = pattern.replace_all(&s, *with).into_owned();
    }
    s = s.replace('$', "");
    let digits = s.replace(',', "");
    if !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit()) {
        s = digits;
    }
    s.trim().to_owned()
}

/// The last `n` characters of `s` (all of it when shorter).
fn last_chars(s: &str, n: usize) -> &str {
    match s.char_indices().rev().nth(n.saturating_sub(1)) {
        Some((at, _)) if n > 0 => &s[at..],
        _ if n == 0 => "",
        _ => s,
    }
}

/// The content of the last `\boxed{…}` whose braces close, if any.
///
/// Not [`super::rules::last_boxed`], which also reads `\fbox{…}` and
/// `\boxed {…}`: verl's DAPO rule takes only `\boxed{` as written, and the
/// port keeps its answers.
fn last_boxed(s: &str) -> Option<&str> {
    const OPEN: &str = "\\boxed{";
    let start = s.rfind(OPEN)?;
    let mut depth = 0usize;
    for (i, c) in s[start..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(&s[start + OPEN.len()..start + i]);
                }
            }
            _ => {}
        }
    }
    None
}

/// Whether the completion is right, and the normalised answer it gave
/// (`[INVALID]` when it gave none): verl's `verify` without
/// `strict_box_verify`.
pub fn judge(completion: &str, ground_truth: &str) -> (bool, String) {
    let tail = last_chars(completion, 300);
    let truth = normalize(ground_truth);
    let extracted = ANSWER
        .captures_iter(tail)
        .last()
        .and_then(|c| c.get(1))
        .map_or(INVALID, |m| m.as_str());
    let pred = normalize(extracted);
    if pred != INVALID {
        return (pred == truth, pred);
    }
    match last_boxed(last_chars(tail, 100)) {
        Some(boxed) => {
            let boxed = normalize(boxed);
            (boxed == truth, boxed)
        }
        None => (pred == truth, pred),
    }
}

/// The rule as a reward: +1 right, −1 wrong.
#[derive(Debug, Clone, Copy, Default)]
pub struct DapoMath;

impl Reward for DapoMath {
    fn name(&self) -> String {
        "math_dapo".into()
    }

    fn score(&mut self, i: &RewardInput<'_>) -> Result<f32> {
        Ok(self.score_extra(i).score)
    }

    /// verl's result dict: the score and `acc` (its text `pred` is not a
    /// number, and colo keeps numbers only).
    fn score_batch_extra(&mut self, inputs: &[RewardInput<'_>]) -> Result<Vec<Scored>> {
        Ok(inputs.iter().map(|i| self.score_extra(i)).collect())
    }
}

impl DapoMath {
    fn score_extra(&self, i: &RewardInput<'_>) -> Scored {
        let right = judge(i.completion, i.ground_truth).0;
        Scored {
            score: if right { 1.0 } else { -1.0 },
            extra: [("acc".to_owned(), f64::from(u8::from(right)))].into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (completion, ground truth, verl's score, verl's normalised answer),
    /// from verl's `math_dapo.compute_score` (verl-project/verl at
    /// 57565332) on these inputs.
    const VERL: [(&str, &str, f32, &str); 26] = [
        ("Thus the total is 34.\nAnswer: 34", "34", 1.0, "34"),
        ("answer : 1,234 dollars", "1234", 1.0, "1234"),
        ("ANSWER:   $\\frac12$", "\\frac{1}{2}", 1.0, "\\frac{1}{2}"),
        ("Answer: x = 5", "5", 1.0, "5"),
        ("Answer: \\boxed{7}", "7", 1.0, "7"),
        ("Answer: 3\nThen more text\nAnswer: 4", "4", 1.0, "4"),
        ("Answer: 3\nThen more text\nAnswer: 4", "3", -1.0, "4"),
        (
            "the result is \\boxed{\\sqrt2}",
            "\\sqrt{2}",
            1.0,
            "\\sqrt{2}",
        ),
        ("no marker at all, 42", "42", -1.0, "[INVALID]"),
        ("Answer: \\text{(A)}", "(A)", 1.0, "(A)"),
        ("Answer: 90^\\circ", "90", 1.0, "90"),
        ("Answer: 12 students", "12", 1.0, "12"),
        ("Answer: an apple", "apple", 1.0, "apple"),
        ("Answer: \\textbf{9}", "9", 1.0, "9"),
        ("Answer: 0.5", "\\frac{1}{2}", -1.0, "0.5"),
        ("Answer: 1,2,3", "1,2,3", 1.0, "123"),
        ("Answer: 1, 2", "1,2", 1.0, "12"),
        ("Answer: $5$ and $6$", "5", 1.0, "5"),
        ("Answer: \\overline{12}", "12", 1.0, "12"),
        (
            "The answer is \\boxed{\\frac{3}{4}}.",
            "\\frac34",
            1.0,
            "\\frac{3}{4}",
        ),
        ("Answer: 5 \\text{ cm}^2", "5", 1.0, "5"),
        ("Answer:", "1", -1.0, "[INVALID]"),
        ("Answer: 3 \\; \\text{and} \\; 4", "3,4", 1.0, "34"),
        ("answer: -7", "-7", 1.0, "-7"),
        ("Answer: 1{,}000", "1000", 1.0, "1000"),
        ("Answer: ²", "²", 1.0, "²"),
    ];

    #[test]
    fn matches_verl_on_its_rules() {
        for (completion, truth, score, pred) in VERL {
            let (right, got) = judge(completion, truth);
            assert_eq!(
                (if right { 1.0 } else { -1.0 }, got.as_str()),
                (score, pred),
                "{completion:?} against {truth:?}"
            );
        }
    }

    /// Only the last 300 characters are read, and a box only in the last
    /// 100 of them (verl's cuts, measured in characters, not bytes).
    #[test]
    fn reads_the_tail_only() {
        let long = "é".repeat(400);
        assert!(judge(&format!("{long}\nAnswer: 8"), "8").0);
        assert_eq!(judge(&format!("Answer: 8\n{long}"), "8").1, INVALID);
        assert!(!judge(&format!("\\boxed{{8}}{}", "y".repeat(120)), "8").0);
        assert!(judge(&format!("{}\\boxed{{8}}", "y".repeat(120)), "8").0);
        assert_eq!(last_chars("abc", 0), "");
        assert_eq!(last_chars("abc", 5), "abc");
        assert_eq!(last_chars("aéc", 2), "éc");
    }

    #[test]
    fn unclosed_boxes_give_nothing() {
        assert_eq!(last_boxed("\\boxed{1} and \\boxed{2"), None);
        assert_eq!(last_boxed("\\boxed{\\frac{1}{2}} x"), Some("\\frac{1}{2}"));
        assert_eq!(judge("\\boxed{2", "2").1, INVALID);
    }
}

//! Rule-based rewards and the text extraction they share. All score 1 or 0
//! and never fail on the completion: an answer that cannot be read is wrong.
//! A ground truth that cannot be read is the dataset's fault and an error.

use super::{Reward, RewardInput};
use crate::Result;

/// 1 if the trimmed completion equals the trimmed ground truth.
#[derive(Debug, Clone, Copy, Default)]
pub struct ExactMatch;

impl Reward for ExactMatch {
    fn name(&self) -> String {
        "exact_match".into()
    }

    fn score(&mut self, i: &RewardInput<'_>) -> Result<f32> {
        Ok(hit(i.completion.trim() == i.ground_truth.trim()))
    }
}

/// 1 if the completion's number is within `tolerance` (absolute) of the
/// ground truth's. The completion's number is the first one after the last
/// `after` marker, or else its last number; the ground truth's is its last.
#[derive(Debug, Clone, Default)]
pub struct NumericMatch {
    pub tolerance: f64,
    pub after: Option<String>,
}

impl Reward for NumericMatch {
    fn name(&self) -> String {
        "numeric".into()
    }

    fn score(&mut self, i: &RewardInput<'_>) -> Result<f32> {
        let truth = last_number(i.ground_truth).ok_or_else(|| {
            i.fail(
                "numeric",
                format!("ground truth {:?} has no number", i.ground_truth),
            )
        })?;
        let answer = match &self.after {
            Some(marker) => i
                .completion
                .rfind(marker.as_str())
                .and_then(|at| numbers(&i.completion[at + marker.len()..]).first().copied()),
            None => last_number(i.completion),
        };
        Ok(hit(answer.is_some_and(|a| close(a, truth, self.tolerance))))
    }
}

/// 1 if the content of the completion's last `\boxed{…}` matches the ground
/// truth (itself boxed or not): equal after normalisation (spaces and
/// surrounding `$` removed), or both numbers within `tolerance`.
#[derive(Debug, Clone, Default)]
pub struct BoxedMatch {
    pub tolerance: f64,
}

impl Reward for BoxedMatch {
    fn name(&self) -> String {
        "boxed".into()
    }

    fn score(&mut self, i: &RewardInput<'_>) -> Result<f32> {
        let truth = last_boxed(i.ground_truth).unwrap_or(i.ground_truth);
        let Some(answer) = last_boxed(i.completion) else {
            return Ok(0.0);
        };
        let (a, t) = (normalize(answer), normalize(truth));
        let numeric = || match (parse_whole_number(&a), parse_whole_number(&t)) {
            (Some(x), Some(y)) => close(x, y, self.tolerance),
            _ => false,
        };
        Ok(hit(a == t || numeric()))
    }
}

/// 1 if the completion contains `open`, then a non-blank answer, then
/// `close` (e.g. `<answer>` … `</answer>`) — a check of form, not content.
#[derive(Debug, Clone, Default)]
pub struct FormatReward {
    pub open: String,
    pub close: String,
}

impl Reward for FormatReward {
    fn name(&self) -> String {
        "format".into()
    }

    fn score(&mut self, i: &RewardInput<'_>) -> Result<f32> {
        Ok(hit(
            delimited(i.completion, &self.open, &self.close).is_some_and(|s| !s.trim().is_empty())
        ))
    }
}

fn hit(b: bool) -> f32 {
    if b {
        1.0
    } else {
        0.0
    }
}

fn close(a: f64, b: f64, tolerance: f64) -> bool {
    (a - b).abs() <= tolerance
}

/// The text between the first `open` and the next `close` after it.
pub fn delimited<'a>(text: &'a str, open: &str, close: &str) -> Option<&'a str> {
    let start = text.find(open)? + open.len();
    let len = text[start..].find(close)?;
    Some(&text[start..start + len])
}

/// The content of the last `\boxed{…}` (or `\fbox{…}`), braces nested;
/// `None` if there is none or its braces do not close.
pub fn last_boxed(text: &str) -> Option<&str> {
    let at = ["\\boxed", "\\fbox"]
        .iter()
        .filter_map(|m| text.rfind(m).map(|i| i + m.len()))
        .max()?;
    let rest = text[at..].trim_start();
    let body = rest.strip_prefix('{')?;
    let mut depth = 1usize;
    for (i, c) in body.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(&body[..i]);
                }
            }
            _ => {}
        }
    }
    None
}

fn normalize(s: &str) -> String {
    s.trim()
        .trim_matches('$')
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect()
}

/// Every number in `text`, in order: an optional `-`, digits with optional
/// `,` thousands separators (`1,234`), an optional fraction (`.5`, `3.25`).
pub fn numbers(text: &str) -> Vec<f64> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let starts_fraction = b[i] == b'.' && b.get(i + 1).is_some_and(u8::is_ascii_digit);
        if !(b[i].is_ascii_digit() || starts_fraction) {
            i += 1;
            continue;
        }
        // `-` is a sign unless it follows a word or number (`5-3` is 5 and 3).
        let negative = i > 0 && b[i - 1] == b'-' && (i < 2 || !b[i - 2].is_ascii_alphanumeric());
        let mut digits = String::new();
        let mut seen_dot = false;
        while i < b.len() {
            let c = b[i];
            let next_digit = b.get(i + 1).is_some_and(u8::is_ascii_digit);
            if c.is_ascii_digit() {
                digits.push(c as char);
            } else if c == b',' && !seen_dot && !digits.is_empty() && thousands_group(&b[i + 1..]) {
                // a separator: skip it
            } else if c == b'.' && !seen_dot && next_digit {
                seen_dot = true;
                digits.push('.');
            } else {
                break;
            }
            i += 1;
        }
        if let Ok(v) = digits.parse::<f64>() {
            out.push(if negative { -v } else { v });
        }
    }
    out
}

/// Exactly three digits follow, and then no further digit.
fn thousands_group(rest: &[u8]) -> bool {
    rest.len() >= 3
        && rest[..3].iter().all(u8::is_ascii_digit)
        && !rest.get(3).is_some_and(u8::is_ascii_digit)
}

/// The last number of `text`.
pub fn last_number(text: &str) -> Option<f64> {
    numbers(text).last().copied()
}

/// `text` as one number and nothing else (after normalisation).
fn parse_whole_number(text: &str) -> Option<f64> {
    let n = numbers(text);
    let only_number = text
        .chars()
        .all(|c| c.is_ascii_digit() || matches!(c, '-' | '.' | ','));
    (n.len() == 1 && only_number).then(|| n[0])
}

#[cfg(test)]
mod tests {
    use super::super::tests::input;
    use super::*;

    #[test]
    fn exact_match_trims() {
        assert_eq!(ExactMatch.score(&input(" 19\n", "19")).unwrap(), 1.0);
        assert_eq!(ExactMatch.score(&input("190", "19")).unwrap(), 0.0);
        assert_eq!(ExactMatch.score(&input("", "19")).unwrap(), 0.0);
    }

    #[test]
    fn numbers_are_read_with_signs_separators_and_fractions() {
        assert_eq!(
            numbers("x=-3, then 1,234.5 and .5 or 7. Also 12,34 and 5-2"),
            vec![-3.0, 1234.5, 0.5, 7.0, 12.0, 34.0, 5.0, 2.0]
        );
        assert_eq!(last_number("no digits"), None);
        assert_eq!(last_number("2 apples and 40"), Some(40.0));
    }

    #[test]
    fn numeric_match_with_tolerance_and_marker() {
        let mut r = NumericMatch {
            tolerance: 0.01,
            after: None,
        };
        assert_eq!(r.score(&input("so it is 3.141", "3.14")).unwrap(), 1.0);
        assert_eq!(r.score(&input("so it is 3.16", "3.14")).unwrap(), 0.0);
        assert_eq!(r.score(&input("no idea", "3.14")).unwrap(), 0.0);
        r.after = Some("####".into());
        assert_eq!(
            r.score(&input("5 + 7 = 12 #### 12 (from 5)", "12"))
                .unwrap(),
            1.0
        );
        assert_eq!(r.score(&input("answer 12", "12")).unwrap(), 0.0);
        let e = r.score(&input("12", "twelve")).unwrap_err();
        assert!(e.to_string().contains("sample 3"), "{e}");
        assert!(e.to_string().contains("\"twelve\""), "{e}");
    }

    #[test]
    fn boxed_extraction_nests_braces() {
        assert_eq!(last_boxed(r"so \boxed{\frac{1}{2}}."), Some(r"\frac{1}{2}"));
        assert_eq!(last_boxed(r"\boxed{1} then \boxed {2}"), Some("2"));
        assert_eq!(last_boxed(r"\fbox{x}"), Some("x"));
        assert_eq!(last_boxed(r"\boxed{unclosed {x}"), None);
        assert_eq!(last_boxed("none"), None);
    }

    #[test]
    fn boxed_match_compares_text_or_numbers() {
        let mut r = BoxedMatch { tolerance: 1e-6 };
        assert_eq!(
            r.score(&input(r"thus \boxed{ \frac{1}{2} }", r"\frac{1}{2}"))
                .unwrap(),
            1.0
        );
        assert_eq!(
            r.score(&input(r"\boxed{1,000}", r"$\boxed{1000}$"))
                .unwrap(),
            1.0
        );
        assert_eq!(r.score(&input(r"\boxed{0.50}", "0.5")).unwrap(), 1.0);
        assert_eq!(r.score(&input(r"\boxed{x+1}", "x+2")).unwrap(), 0.0);
        assert_eq!(
            r.score(&input("0.5", "0.5")).unwrap(),
            0.0,
            "no box, no reward"
        );
    }

    #[test]
    fn format_needs_a_nonblank_delimited_answer() {
        let mut r = FormatReward {
            open: "<answer>".into(),
            close: "</answer>".into(),
        };
        assert_eq!(
            r.score(&input("think <answer>4</answer>", "")).unwrap(),
            1.0
        );
        assert_eq!(r.score(&input("<answer> </answer>", "")).unwrap(), 0.0);
        assert_eq!(r.score(&input("</answer>4<answer>", "")).unwrap(), 0.0);
        assert_eq!(r.score(&input("<answer>4", "")).unwrap(), 0.0);
    }
}

//! [`Weighted`]: Σ weight · reward over named terms, each term's own score
//! reported beside the total (TRL logs each reward function's mean the
//! same way, as `rewards/{name}/mean`).

use std::collections::BTreeMap;

use super::{build, Reward, RewardInput, RewardSpec, Scored, WeightedTerm};
use crate::Result;

/// One term of a [`Weighted`] reward.
pub struct Term {
    /// Its key among the extras: its score is `extra[name]`, its own
    /// extras `extra["{name}/{key}"]`.
    pub name: String,
    pub weight: f32,
    pub reward: Box<dyn Reward>,
}

/// Σ weight · reward over its terms.
pub struct Weighted {
    pub terms: Vec<Term>,
}

impl Weighted {
    /// The terms of a config, started, with their names: each term's
    /// `name`, else its kind (a Python term: its function's name), `_2`,
    /// `_3`, … added where a name repeats.
    pub fn build(terms: &[WeightedTerm]) -> Result<Self> {
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        let terms = terms
            .iter()
            .map(|t| {
                let base = t.name.clone().unwrap_or_else(|| default_name(&t.reward));
                let count = seen.entry(base.clone()).or_default();
                *count += 1;
                let name = match *count {
                    1 => base,
                    k => format!("{base}_{k}"),
                };
                Ok(Term {
                    name,
                    weight: t.weight,
                    reward: build(&t.reward)?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(Weighted { terms })
    }
}

/// A term's default name: its kind, or a Python term's function.
fn default_name(spec: &RewardSpec) -> String {
    let kind = match spec {
        RewardSpec::Python { name, .. } => return name.clone(),
        RewardSpec::ExactMatch {} => "exact_match",
        RewardSpec::Numeric { .. } => "numeric",
        RewardSpec::Boxed { .. } => "boxed",
        RewardSpec::Format { .. } => "format",
        RewardSpec::Weighted { .. } => "weighted",
        RewardSpec::Verl {} => "verl",
        RewardSpec::External { .. } => "external",
    };
    kind.to_owned()
}

impl Reward for Weighted {
    fn name(&self) -> String {
        let parts: Vec<String> = (self.terms.iter())
            .map(|t| format!("{}·{}", t.weight, t.reward.name()))
            .collect();
        parts.join(" + ")
    }

    fn score(&mut self, input: &RewardInput<'_>) -> Result<f32> {
        let mut total = 0.0;
        for t in &mut self.terms {
            total += t.weight * t.reward.score(input)?;
        }
        Ok(total)
    }

    /// Summed over the terms (a sample two terms failed on counts twice).
    fn failures(&self) -> u64 {
        self.terms.iter().map(|t| t.reward.failures()).sum()
    }

    fn score_batch(&mut self, inputs: &[RewardInput<'_>]) -> Result<Vec<f32>> {
        let mut total = vec![0.0; inputs.len()];
        for t in &mut self.terms {
            for (sum, s) in total.iter_mut().zip(t.reward.score_batch(inputs)?) {
                *sum += t.weight * s;
            }
        }
        Ok(total)
    }

    /// The weighted sum, with each term's unweighted score under its name
    /// and its own extras under `{name}/{key}`.
    fn score_batch_extra(&mut self, inputs: &[RewardInput<'_>]) -> Result<Vec<Scored>> {
        let mut out = vec![Scored::default(); inputs.len()];
        for t in &mut self.terms {
            for (sum, s) in out.iter_mut().zip(t.reward.score_batch_extra(inputs)?) {
                sum.score += t.weight * s.score;
                sum.extra.insert(t.name.clone(), f64::from(s.score));
                for (key, v) in s.extra {
                    sum.extra.insert(format!("{}/{key}", t.name), v);
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::{input, NUMERIC_AND_FORMAT};

    fn spec(toml: &str) -> Vec<WeightedTerm> {
        match toml::from_str::<RewardSpec>(toml).unwrap() {
            RewardSpec::Weighted { terms } => terms,
            other => panic!("not weighted: {other:?}"),
        }
    }

    #[test]
    fn terms_are_named_by_kind_or_name_and_numbered_when_repeated() {
        let w = Weighted::build(&spec(
            r#"
            kind = "weighted"
            [[terms]]
            weight = 1.0
            reward = { kind = "exact_match" }
            [[terms]]
            weight = 0.5
            reward = { kind = "exact_match" }
            [[terms]]
            weight = 0.1
            name = "has_answer"
            reward = { kind = "format", open = "<a>", close = "</a>" }
            "#,
        ))
        .unwrap();
        let names: Vec<&str> = w.terms.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["exact_match", "exact_match_2", "has_answer"]);
    }

    #[test]
    fn each_term_score_is_an_extra_beside_the_weighted_sum() {
        let mut w = Weighted::build(&spec(NUMERIC_AND_FORMAT)).unwrap();
        let batch = [input("<a>Answer: 41</a>", "42"), input("Answer: 42", "42")];
        let s = w.score_batch_extra(&batch).unwrap();
        assert_eq!(Scored::scores(s.clone()), w.score_batch(&batch).unwrap());
        assert_eq!(s[0].score, 0.25);
        assert_eq!(s[1].score, 0.75);
        let extra = |i: usize| s[i].extra.clone().into_iter().collect::<Vec<_>>();
        assert_eq!(
            extra(0),
            [("format".to_owned(), 1.0), ("numeric".to_owned(), 0.0)]
        );
        assert_eq!(
            extra(1),
            [("format".to_owned(), 0.0), ("numeric".to_owned(), 1.0)]
        );
    }

    /// A term's own extras keep their names under the term's.
    struct WithAcc;
    impl Reward for WithAcc {
        fn name(&self) -> String {
            "with_acc".into()
        }
        fn score(&mut self, _: &RewardInput<'_>) -> Result<f32> {
            Ok(2.0)
        }
        fn score_batch_extra(&mut self, inputs: &[RewardInput<'_>]) -> Result<Vec<Scored>> {
            let one = Scored {
                score: 2.0,
                extra: [("acc".to_owned(), 1.0)].into(),
            };
            Ok(vec![one; inputs.len()])
        }
    }

    #[test]
    fn a_terms_extras_are_kept_under_its_name() {
        let mut w = Weighted {
            terms: vec![Term {
                name: "judge".into(),
                weight: 0.5,
                reward: Box::new(WithAcc),
            }],
        };
        let s = w.score_batch_extra(&[input("x", "y")]).unwrap();
        assert_eq!(s[0].score, 1.0);
        assert_eq!(s[0].extra.get("judge"), Some(&2.0));
        assert_eq!(s[0].extra.get("judge/acc"), Some(&1.0));
    }
}

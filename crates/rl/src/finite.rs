//! A step's numbers checked finite: its advantages and returns, its
//! losses, and its optimizer steps (the scores are checked where they are
//! made, [`crate::reward::finite`]).
//!
//! A number that is not finite does not stay in one place: one NaN
//! advantage makes its mini-batch's loss and gradient NaN, the trainer
//! skips that optimizer step, and a run whose every step is skipped ends
//! "done" with its weights unchanged. So each is an error naming the
//! sample and the step where it starts; only a gradient that overflows
//! from finite losses is skipped (as verl's actor skips it), until
//! [`MAX_SKIPPED_IN_A_ROW`] optimizer steps in a row stop the run.

use std::ops::Range;

use colo_train::{CriticMetrics, PolicyMetrics};
use tch::{Kind, Tensor};

use crate::data::Prompt;
use crate::rollouts::Rollouts;
use crate::{Error, Result};

/// Optimizer steps whose gradient norm is not finite that a run skips in a
/// row before it stops with an error. The trainer skips such a step, as
/// verl's actor does; verl has no limit (a run whose every step is skipped
/// goes on to the end, its weights unchanged), nor a key for one. One or
/// two in a row are a bad batch that a healthy run gets past; three are a
/// run that stopped learning (weights that overflow in the backward pass,
/// damaged or diverged).
pub const MAX_SKIPPED_IN_A_ROW: usize = 3;

/// Scores above this overflow float32 when a group's variance squares
/// them (its square root of `f32::MAX`, rounded down).
const SQUARE_OVERFLOWS: f32 = 1.8e19;

/// One step's samples, as errors name them.
pub(crate) struct Samples<'a> {
    /// 0-based; messages say `step + 1`.
    pub step: usize,
    pub rollouts: &'a Rollouts,
    /// (samples,) the training score of each row.
    pub scores: &'a [f32],
    /// (samples,) each row's index among the step's samples as they were
    /// scored (the rows are reordered for training).
    pub order: &'a [usize],
    /// The step's prompts (`rollouts.batch_prompt` indexes them).
    pub prompts: &'a [&'a Prompt],
}

impl Samples<'_> {
    /// An error naming the first sample with a value in `rows`, its
    /// `what` ("advantage"), that is not finite, with its group's scores.
    pub fn check_rows(&self, what: &str, rows: &[Vec<f32>]) -> Result<()> {
        let found = (rows.iter().enumerate())
            .find_map(|(j, r)| r.iter().find(|v| !v.is_finite()).map(|&v| (j, v)));
        let Some((j, v)) = found else {
            return Ok(());
        };
        let k = self.rollouts.batch_prompt[j];
        let group: Vec<f32> = (0..self.rollouts.len())
            .filter(|&i| self.rollouts.batch_prompt[i] == k)
            .map(|i| self.scores[i])
            .collect();
        let why = match group.iter().any(|s| s.abs() > SQUARE_OVERFLOWS) {
            true => format!(
                "scores this large overflow float32 arithmetic (a group's variance squares \
                 them, beyond {SQUARE_OVERFLOWS:e}): scale the reward down"
            ),
            false => "the scores are finite, so the critic's values or the KL penalty are not: \
                      training has diverged (lower actor.lr, set actor.grad_clip)"
                .into(),
        };
        Err(Error::Diverged(format!(
            "step {}: the {what} of {} is {v}, not a finite number; the scores of its group \
             are {group:?}: {why}",
            self.step + 1,
            self.name(j)
        )))
    }

    /// An error for the first update whose loss is not finite, naming its
    /// mini-batch and, where one has them, the sample whose policy
    /// log-probabilities (`old`, (samples, seq), at `mask`'s response
    /// tokens) are not finite. `mini_batches`: per epoch, of
    /// `mini_batch_samples` rows each.
    pub fn check_losses(
        &self,
        (actor, critic): (&[PolicyMetrics], &[CriticMetrics]),
        (mini_batches, mini_batch_samples): (usize, usize),
        old: &Tensor,
        mask: &Tensor,
    ) -> Result<()> {
        let bad = |v: f64| !v.is_finite();
        let found = (actor.iter().enumerate())
            .find_map(|(u, m)| {
                let kl = m.kl_loss.filter(|&l| bad(l));
                (bad(m.pg_loss) || kl.is_some()).then(|| match kl {
                    Some(l) if !bad(m.pg_loss) => (u, "KL loss", l),
                    _ => (u, "policy loss", m.pg_loss),
                })
            })
            .or_else(|| {
                (critic.iter().enumerate())
                    .find(|(_, m)| bad(m.vf_loss))
                    .map(|(u, m)| (u, "value loss", m.vf_loss))
            });
        let Some((u, which, v)) = found else {
            return Ok(());
        };
        let k = u % mini_batches.max(1);
        let rows = k * mini_batch_samples..(k + 1) * mini_batch_samples;
        let why = match first_row_not_finite(old, mask, rows.clone())? {
            Some(j) => format!(
                "the policy's log-probabilities of {}'s response are not finite: the weights \
                 overflow in the forward pass (damaged, or a training that diverged)",
                self.name(j)
            ),
            None => "its samples' log-probabilities and advantages are finite here (a data-\
                     parallel peer's samples may not be): training has diverged (lower \
                     actor.lr, set actor.grad_clip)"
                .into(),
        };
        Err(Error::Diverged(format!(
            "step {}: the {which} of mini-batch {} of {mini_batches} (samples {}–{}) is {v}, not \
             a finite number: {why}",
            self.step + 1,
            k + 1,
            rows.start,
            rows.end - 1
        )))
    }

    /// "sample 5 (prompt 2, data.jsonl:3)" for row `j`.
    fn name(&self, j: usize) -> String {
        let origin = &self.prompts[self.rollouts.batch_prompt[j]].origin;
        format!(
            "sample {} (prompt {}{}{origin})",
            self.order[j],
            self.rollouts.prompt_ids[j],
            match origin.is_empty() {
                true => "",
                false => ", ",
            }
        )
    }
}

/// Counts the optimizer steps of `updates` (in order) skipped in a row
/// from `in_a_row` on, and stops the run when they reach
/// [`MAX_SKIPPED_IN_A_ROW`].
pub(crate) fn count_skipped(
    step: usize,
    in_a_row: &mut usize,
    updates: &[PolicyMetrics],
) -> Result<()> {
    let mut most = 0;
    for u in updates {
        *in_a_row = match u.grad_norm.is_finite() {
            true => 0,
            false => *in_a_row + 1,
        };
        most = most.max(*in_a_row);
    }
    if most < MAX_SKIPPED_IN_A_ROW {
        return Ok(());
    }
    Err(Error::Diverged(format!(
        "step {}: the gradient norm was not finite in {most} optimizer steps in a row, which \
         were skipped: the run has stopped learning. Its losses are finite, so the backward \
         pass overflows: the weights are damaged or have diverged (check the starting \
         checkpoint; lower actor.lr, set actor.grad_clip). The checkpoints written so far are \
         as they were",
        step + 1
    )))
}

/// The first of `rows` (of `t`, (samples, seq)) with a value that is not
/// finite where `mask` is not 0.
fn first_row_not_finite(t: &Tensor, mask: &Tensor, rows: Range<usize>) -> Result<Option<usize>> {
    let bad = (t.f_isfinite()?.f_logical_not()?)
        .f_logical_and(&mask.f_ne(0)?)?
        .f_any_dim(1, false)?
        .f_to_kind(Kind::Int64)?;
    let bad = Vec::<i64>::try_from(bad)?;
    Ok(rows
        .into_iter()
        .find(|&j| bad.get(j).is_some_and(|&b| b != 0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(grad_norm: f64) -> PolicyMetrics {
        PolicyMetrics {
            grad_norm,
            ..Default::default()
        }
    }

    #[test]
    fn three_skipped_optimizer_steps_in_a_row_stop_the_run() {
        let (ok, skip) = (update(1.0), update(f64::INFINITY));
        let mut in_a_row = 0;
        // Two in a row, then one that counts: no error, the count starts over.
        count_skipped(0, &mut in_a_row, &[skip, skip, ok]).unwrap();
        assert_eq!(in_a_row, 0);
        // Across RL steps: two at the end of one and one at the start of the next.
        count_skipped(1, &mut in_a_row, &[ok, skip, skip]).unwrap();
        assert_eq!(in_a_row, 2);
        let e = count_skipped(2, &mut in_a_row, &[update(f64::NAN), ok])
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("step 3: the gradient norm was not finite in 3 optimizer steps in a row"),
            "{e}"
        );
        // Three within one step.
        let mut in_a_row = 0;
        assert!(count_skipped(0, &mut in_a_row, &[skip, skip, skip]).is_err());
        // The critic's warmup updates no actor: the count stays.
        let mut in_a_row = 2;
        count_skipped(0, &mut in_a_row, &[]).unwrap();
        assert_eq!(in_a_row, 2);
    }

    fn prompt(id: u64, origin: &str) -> Prompt {
        Prompt {
            prompt_id: id,
            text: String::new(),
            chat: false,
            ground_truth: String::new(),
            extra: Default::default(),
            origin: origin.into(),
        }
    }

    /// Two prompts of two samples, rows reordered as training reorders them.
    fn rollouts() -> Rollouts {
        Rollouts {
            prompt_ids: vec![7, 7, 9, 9],
            batch_prompt: vec![0, 0, 1, 1],
            responses: vec![vec![1]; 4],
            ..Default::default()
        }
    }

    #[test]
    fn a_value_that_is_not_finite_names_its_sample_and_group() {
        let (a, b) = (prompt(7, "train.jsonl:8"), prompt(9, ""));
        let prompts = [&a, &b];
        let r = rollouts();
        let scores = [1.0, 0.0, 3e38, 3e38];
        let s = Samples {
            step: 4,
            rollouts: &r,
            scores: &scores,
            order: &[1, 0, 3, 2],
            prompts: &prompts,
        };
        let rows = |v: f32| vec![vec![0.5], vec![-0.5], vec![0.0, v], vec![0.0]];
        s.check_rows("advantage", &rows(1.0)).unwrap();
        let e = s
            .check_rows("advantage", &rows(f32::NAN))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(
                "step 5: the advantage of sample 3 (prompt 9) is NaN, not a finite number; \
                 the scores of its group are [3e38, 3e38]: scores this large overflow float32"
            ),
            "{e}"
        );
        let scores = [1.0, 0.0, 1.0, 1.0];
        let s = Samples {
            scores: &scores,
            ..s
        };
        let e = s
            .check_rows("return", &[vec![f32::INFINITY]])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("the return of sample 1 (prompt 7, train.jsonl:8) is inf")
                && e.contains("the critic's values or the KL penalty are not"),
            "{e}"
        );
    }

    #[test]
    fn a_loss_that_is_not_finite_names_its_mini_batch_and_sample() {
        let (a, b) = (prompt(7, ""), prompt(9, ""));
        let prompts = [&a, &b];
        let r = rollouts();
        let s = Samples {
            step: 0,
            rollouts: &r,
            scores: &[0.0; 4],
            order: &[0, 1, 3, 2],
            prompts: &prompts,
        };
        // (samples, seq): row 3 is -inf at a response token, row 0 at a
        // prompt token (masked out).
        let old = Tensor::from_slice(&[
            f32::NEG_INFINITY,
            -1.0, //
            -1.0,
            -1.0, //
            -1.0,
            -1.0, //
            -1.0,
            f32::NEG_INFINITY,
        ])
        .view([4, 2]);
        let mask = Tensor::from_slice(&[0f32, 1., 0., 1., 0., 1., 0., 1.]).view([4, 2]);
        let fine = [PolicyMetrics::default(); 2];
        let nan = PolicyMetrics {
            pg_loss: f64::NAN,
            ..Default::default()
        };
        let shape = (2, 2);
        s.check_losses((&fine, &[]), shape, &old, &mask).unwrap();
        // The second update of the first epoch: mini-batch 2, samples 2–3.
        let e = s
            .check_losses((&[fine[0], nan], &[]), shape, &old, &mask)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(
                "step 1: the policy loss of mini-batch 2 of 2 (samples 2–3) is NaN, not a finite \
                 number: the policy's log-probabilities of sample 2 (prompt 9)'s response"
            ),
            "{e}"
        );
        // Mini-batch 1's rows are finite at their response tokens.
        let e = s
            .check_losses((&[nan], &[]), shape, &old, &mask)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("(samples 0–1)") && e.contains("are finite here"),
            "{e}"
        );
        let critic = CriticMetrics {
            vf_loss: f64::INFINITY,
            ..Default::default()
        };
        let e = s
            .check_losses(
                (&fine, &[CriticMetrics::default(), critic]),
                shape,
                &old,
                &mask,
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("the value loss of mini-batch 2 of 2"), "{e}");
    }
}

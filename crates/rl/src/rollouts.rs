//! What generation hands to training: one step's samples as a typed
//! struct, and its conversions to the trainer's (batch, seq) layout and to
//! colo-algo's (batch, response_len) layout.
//!
//! Rows are samples, grouped by prompt: prompt `k`'s `n` samples are rows
//! `k·n .. (k+1)·n`, so a mini-batch of whole prompts is a contiguous run
//! of rows.

use colo_train::SeqBatch;
use tch::Tensor;

use crate::Result;

/// One step's generated samples.
#[derive(Debug, Clone, Default)]
pub struct Rollouts {
    /// (samples,) the dataset's prompt id of each row (GRPO's groups).
    pub prompt_ids: Vec<u64>,
    /// (samples,) index of the row's prompt in the step's batch.
    pub batch_prompt: Vec<usize>,
    /// (samples, prompt_len_i) prompt token ids.
    pub prompts: Vec<Vec<u32>>,
    /// (samples, response_len_i) generated token ids (a final stop token
    /// included).
    pub responses: Vec<Vec<u32>>,
    /// (samples, response_len_i) the rollout engine's log-probabilities.
    pub logprobs: Vec<Vec<f32>>,
    /// (samples,) whether the response was cut at `max_new_tokens`.
    pub truncated: Vec<bool>,
    /// (samples,) the response's text, special tokens removed.
    pub texts: Vec<String>,
}

impl Rollouts {
    pub fn len(&self) -> usize {
        self.responses.len()
    }

    pub fn is_empty(&self) -> bool {
        self.responses.is_empty()
    }

    /// The rows of the batch's prompts `prompts`, in that order, with
    /// `batch_prompt` renumbered to the position in `prompts`; and the rows
    /// taken, for the caller's per-row data.
    pub fn select_prompts(self, prompts: &[usize]) -> (Rollouts, Vec<usize>) {
        // Each prompt's rows, found in one pass.
        let mut of_prompt: Vec<Vec<usize>> = Vec::new();
        for (i, &k) in self.batch_prompt.iter().enumerate() {
            if of_prompt.len() <= k {
                of_prompt.resize_with(k + 1, Vec::new);
            }
            of_prompt[k].push(i);
        }
        let (renumbered, rows): (Vec<usize>, Vec<usize>) = (prompts.iter().enumerate())
            .flat_map(|(j, &k)| of_prompt.get(k).into_iter().flatten().map(move |&i| (j, i)))
            .unzip();
        let mut out = self.into_rows(&rows);
        out.batch_prompt = renumbered;
        (out, rows)
    }

    /// The rows of each run of `span` rows (a mini-batch), longest
    /// (prompt and response) first; rows of equal length keep their order.
    pub fn longest_first(&self, span: usize) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.len()).collect();
        for run in order.chunks_mut(span.max(1)) {
            run.sort_by_key(|&i| {
                std::cmp::Reverse(self.prompts[i].len() + self.responses[i].len())
            });
        }
        order
    }

    /// Rows `order` (each at most once), in that order (`batch_prompt`
    /// unchanged), moved out rather than copied.
    pub fn into_rows(mut self, order: &[usize]) -> Rollouts {
        let mut out = Rollouts::default();
        for &i in order {
            out.prompt_ids.push(self.prompt_ids[i]);
            out.batch_prompt.push(self.batch_prompt[i]);
            out.prompts.push(std::mem::take(&mut self.prompts[i]));
            out.responses.push(std::mem::take(&mut self.responses[i]));
            out.logprobs.push(std::mem::take(&mut self.logprobs[i]));
            out.truncated.push(self.truncated[i]);
            out.texts.push(std::mem::take(&mut self.texts[i]));
        }
        out
    }

    /// `other`'s rows after these, its batch prompts counted from
    /// `prompt_offset` (the prompts these rows cover).
    pub fn append(&mut self, other: Rollouts, prompt_offset: usize) {
        self.prompt_ids.extend(other.prompt_ids);
        (self.batch_prompt).extend(other.batch_prompt.iter().map(|k| k + prompt_offset));
        self.prompts.extend(other.prompts);
        self.responses.extend(other.responses);
        self.logprobs.extend(other.logprobs);
        self.truncated.extend(other.truncated);
        self.texts.extend(other.texts);
    }

    /// The longest response, at least 1 (the width of the algo layout).
    pub fn max_response_len(&self) -> usize {
        self.responses
            .iter()
            .map(Vec::len)
            .max()
            .unwrap_or(0)
            .max(1)
    }

    /// The padded tokens of all rows as one trainer batch: rows × the
    /// longest prompt and response (what [`Rollouts::seq_batch`] makes).
    pub fn padded_tokens(&self) -> u64 {
        let longest = (self.prompts.iter().zip(&self.responses))
            .map(|(p, r)| p.len() + r.len())
            .max()
            .unwrap_or(0);
        (self.len() as u64).saturating_mul(longest as u64)
    }

    /// Rows `rows` as the trainer's right-padded sequences.
    pub fn seq_batch(&self, rows: std::ops::Range<usize>, pad_id: u32) -> Result<SeqBatch> {
        let pairs: Vec<(&[u32], &[u32])> = rows
            .map(|i| (self.prompts[i].as_slice(), self.responses[i].as_slice()))
            .collect();
        Ok(SeqBatch::from_prompt_response(&pairs, pad_id)?)
    }

    /// Per-response values (one `Vec` per row, as long as its response)
    /// placed in the trainer's layout for rows `rows`: (rows, seq_len) with
    /// row `i`'s values at columns `prompt_len_i ..`, zero elsewhere.
    pub fn to_token_layout(
        &self,
        values: &[Vec<f32>],
        rows: std::ops::Range<usize>,
        seq_len: usize,
    ) -> Result<Tensor> {
        let n = rows.len();
        let mut out = vec![0f32; n * seq_len];
        for (r, i) in rows.enumerate() {
            let start = r * seq_len + self.prompts[i].len();
            out[start..start + values[i].len()].copy_from_slice(&values[i]);
        }
        Ok(Tensor::f_from_slice(&out)?.f_view([n as i64, seq_len as i64])?)
    }

    /// The inverse of `to_token_layout` for every row: (samples, seq) → one
    /// `Vec` per row, as long as its response.
    pub fn from_token_layout(&self, t: &Tensor) -> Result<Vec<Vec<f32>>> {
        let rows = Vec::<Vec<f32>>::try_from(t.f_to_kind(tch::Kind::Float)?)?;
        Ok(rows
            .into_iter()
            .enumerate()
            .map(|(i, row)| {
                let p = self.prompts[i].len();
                row[p..p + self.responses[i].len()].to_vec()
            })
            .collect())
    }

    /// colo-algo's layout, (samples, max_response_len): `values` left-aligned
    /// per row, and the response mask.
    pub fn response_layout(&self, values: &[Vec<f32>]) -> Result<(Tensor, Tensor)> {
        let (n, w) = (self.len(), self.max_response_len());
        let mut v = vec![0f32; n * w];
        let mut m = vec![0f32; n * w];
        for i in 0..n {
            let len = self.responses[i].len();
            v[i * w..i * w + len].copy_from_slice(&values[i]);
            m[i * w..i * w + len].fill(1.0);
        }
        let shape = [n as i64, w as i64];
        Ok((
            Tensor::f_from_slice(&v)?.f_view(shape)?,
            Tensor::f_from_slice(&m)?.f_view(shape)?,
        ))
    }

    /// Outcome scores as token-level rewards: each row's score on its last
    /// response token (verl's `token_level_scores`), one `Vec` per row.
    pub fn outcome_rewards(&self, scores: &[f32]) -> Vec<Vec<f32>> {
        self.responses
            .iter()
            .zip(scores)
            .map(|(r, &s)| {
                let mut v = vec![0f32; r.len()];
                if let Some(last) = v.last_mut() {
                    *last = s;
                }
                v
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two() -> Rollouts {
        Rollouts {
            prompt_ids: vec![7, 7],
            batch_prompt: vec![0, 0],
            prompts: vec![vec![1, 2, 3], vec![1, 2, 3]],
            responses: vec![vec![9, 2], vec![8, 8, 2]],
            logprobs: vec![vec![-0.5, -0.25], vec![-1.0, -2.0, -3.0]],
            truncated: vec![false, false],
            texts: vec!["a".into(), "bb".into()],
        }
    }

    #[test]
    fn token_layout_round_trips_and_aligns_with_the_response_mask() {
        let r = two();
        let seqs = r.seq_batch(0..2, 0).unwrap();
        let t = r
            .to_token_layout(&r.logprobs, 0..2, seqs.seq_len())
            .unwrap();
        assert_eq!(
            Vec::<Vec<f32>>::try_from(&t).unwrap(),
            vec![
                vec![0., 0., 0., -0.5, -0.25, 0.],
                vec![0., 0., 0., -1., -2., -3.]
            ]
        );
        // Non-zero exactly where the trainer's response mask is 1.
        let mask = Vec::<Vec<f32>>::try_from(seqs.response_mask()).unwrap();
        assert_eq!(
            mask,
            vec![vec![0., 0., 0., 1., 1., 0.], vec![0., 0., 0., 1., 1., 1.]]
        );
        assert_eq!(r.from_token_layout(&t).unwrap(), r.logprobs);
    }

    #[test]
    fn prompts_are_selected_in_order_and_appended_renumbered() {
        let mut r = two(); // prompt 0: rows 0, 1
        r.append(
            Rollouts {
                prompt_ids: vec![9, 8],
                batch_prompt: vec![0, 1],
                prompts: vec![vec![4], vec![5]],
                responses: vec![vec![6], vec![7]],
                logprobs: vec![vec![-0.1], vec![-0.2]],
                truncated: vec![true, false],
                texts: vec!["c".into(), "d".into()],
            },
            1,
        );
        assert_eq!(r.batch_prompt, [0, 0, 1, 2]);
        assert_eq!(r.prompt_ids, [7, 7, 9, 8]);
        let (picked, rows) = r.clone().select_prompts(&[2, 0]);
        assert_eq!(rows, [3, 0, 1]);
        assert_eq!(picked.batch_prompt, [0, 1, 1]);
        assert_eq!(picked.prompt_ids, [8, 7, 7]);
        assert_eq!(picked.responses, [vec![7], vec![9, 2], vec![8, 8, 2]]);
        assert_eq!(picked.logprobs[0], [-0.2]);
        assert_eq!(picked.truncated, [false, false, false]);
        assert_eq!(picked.texts, ["d", "a", "bb"]);
        assert_eq!(picked.prompts[0], [5]);
    }

    #[test]
    fn each_mini_batch_is_ordered_longest_first() {
        let mut r = two(); // lengths 5 and 6
        r.append(two(), 1); // 5 and 6 again
        assert_eq!(r.longest_first(2), [1, 0, 3, 2]);
        assert_eq!(
            r.longest_first(4),
            [1, 3, 0, 2],
            "equal lengths keep their order"
        );
        let sorted = r.into_rows(&[1, 0]);
        assert_eq!(sorted.responses, [vec![8, 8, 2], vec![9, 2]]);
        assert_eq!(sorted.logprobs[0], [-1.0, -2.0, -3.0]);
        assert_eq!(sorted.batch_prompt, [0, 0]);
    }

    #[test]
    fn response_layout_and_outcome_rewards() {
        let r = two();
        let rewards = r.outcome_rewards(&[1.0, 0.0]);
        assert_eq!(rewards, vec![vec![0.0, 1.0], vec![0.0, 0.0, 0.0]]);
        let (v, m) = r.response_layout(&rewards).unwrap();
        assert_eq!(
            Vec::<Vec<f32>>::try_from(&v).unwrap(),
            vec![vec![0., 1., 0.], vec![0., 0., 0.]]
        );
        assert_eq!(
            Vec::<Vec<f32>>::try_from(&m).unwrap(),
            vec![vec![1., 1., 0.], vec![1., 1., 1.]]
        );
    }
}

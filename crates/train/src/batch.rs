//! Typed batches the engine trains on, and their micro-batches.
//!
//! Every per-token tensor is **(batch, seq)**, aligned with `input_ids`:
//! column `t` of a log-probability, an advantage or a value refers to token
//! `t` (its log-probability is `log p(ids[t] | ids[..t])`, computed from
//! the hidden state at `t − 1`). Column 0 never has one. Sequences are
//! **right-padded**: each row is its real tokens (prompt then response),
//! then padding.
//!
//! Batches may live on any device; the engine moves each micro-batch to
//! its own device (a no-op when they already match). Cloning a batch
//! shares its tensors (nothing here writes a batch's tensors in place).

use std::collections::HashMap;

use colo_model::SharedPrompts;
use tch::{Device, Kind, Tensor};

use crate::config::Split;
use crate::{Error, Result};

/// Where one row's tokens are, read once from the masks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RowSpan {
    /// Real tokens (the rest of the row is padding).
    pub(crate) len: usize,
    /// Response tokens: `resp.0..resp.1` (empty if the row has none).
    pub(crate) resp: (usize, usize),
}

/// Token sequences with their masks.
#[derive(Debug)]
pub struct SeqBatch {
    input_ids: Tensor,
    attention_mask: Tensor,
    response_mask: Tensor,
    rows: Vec<RowSpan>,
}

impl Clone for SeqBatch {
    /// Shares the tensors.
    fn clone(&self) -> Self {
        SeqBatch {
            input_ids: self.input_ids.shallow_clone(),
            attention_mask: self.attention_mask.shallow_clone(),
            response_mask: self.response_mask.shallow_clone(),
            rows: self.rows.clone(),
        }
    }
}

fn dims(t: &Tensor) -> Vec<usize> {
    t.size().iter().map(|&d| d as usize).collect()
}

fn rows_f32(arg: &'static str, t: &Tensor, shape: (usize, usize)) -> Result<Vec<Vec<f32>>> {
    if dims(t) != [shape.0, shape.1] {
        return Err(Error::batch(
            arg,
            format!("has shape {:?}, expected {:?}", dims(t), [shape.0, shape.1]),
        ));
    }
    Ok(Vec::<Vec<f32>>::try_from(&t.f_to_kind(Kind::Float)?)?)
}

fn mask_value(arg: &'static str, v: f32) -> Result<bool> {
    match v {
        0.0 => Ok(false),
        1.0 => Ok(true),
        _ => Err(Error::batch(arg, format!("holds {v}; masks are 0 or 1"))),
    }
}

impl SeqBatch {
    /// `input_ids` (batch, seq) of an integer kind; `attention_mask`
    /// (batch, seq), 1 for real tokens then 0 for padding (right padding
    /// only); `response_mask` (batch, seq), 1 on the tokens whose
    /// log-probabilities are trained or scored — a contiguous run of real
    /// tokens, never column 0. Masks may have any numeric kind; they are
    /// kept as float32, the ids as int64, on the ids' device.
    pub fn new(
        input_ids: &Tensor,
        attention_mask: &Tensor,
        response_mask: &Tensor,
    ) -> Result<Self> {
        let [b, s] = dims(input_ids)[..] else {
            return Err(Error::batch(
                "input_ids",
                format!("must be (batch, seq), got {:?}", dims(input_ids)),
            ));
        };
        if b == 0 || s < 2 {
            return Err(Error::batch(
                "input_ids",
                format!("shape {:?} is too small (need seq ≥ 2)", [b, s]),
            ));
        }
        let attn = rows_f32("attention_mask", attention_mask, (b, s))?;
        let resp = rows_f32("response_mask", response_mask, (b, s))?;
        let mut rows = Vec::with_capacity(b);
        for (i, (a, r)) in attn.iter().zip(&resp).enumerate() {
            let a: Vec<bool> = a
                .iter()
                .map(|&v| mask_value("attention_mask", v))
                .collect::<Result<_>>()?;
            let r: Vec<bool> = r
                .iter()
                .map(|&v| mask_value("response_mask", v))
                .collect::<Result<_>>()?;
            let len = a.iter().take_while(|&&x| x).count();
            if a[len..].iter().any(|&x| x) {
                return Err(Error::batch(
                    "attention_mask",
                    format!("row {i} is not right-padded"),
                ));
            }
            let start = r.iter().position(|&x| x).unwrap_or(0);
            let end = r.iter().rposition(|&x| x).map_or(0, |e| e + 1);
            if r[start..end].iter().any(|&x| !x) {
                return Err(Error::batch(
                    "response_mask",
                    format!("row {i} is not one contiguous run"),
                ));
            }
            if end > start && (start == 0 || end > len) {
                return Err(Error::batch(
                    "response_mask",
                    format!("row {i} marks tokens {start}..{end}, which must lie in 1..{len} (real tokens after the first)"),
                ));
            }
            rows.push(RowSpan {
                len,
                resp: (start, end),
            });
        }
        let input_ids = match input_ids.kind() {
            Kind::Int64 => input_ids.shallow_clone(),
            Kind::Int | Kind::Int16 | Kind::Int8 | Kind::Uint8 => {
                input_ids.f_to_kind(Kind::Int64)?
            }
            other => {
                return Err(Error::batch(
                    "input_ids",
                    format!("has kind {other:?}, expected an integer kind"),
                ))
            }
        };
        let dev = input_ids.device();
        let float =
            |t: &Tensor| -> Result<Tensor> { Ok(t.f_to_kind(Kind::Float)?.f_to_device(dev)?) };
        Ok(SeqBatch {
            attention_mask: float(attention_mask)?,
            response_mask: float(response_mask)?,
            input_ids,
            rows,
        })
    }

    /// Builds a right-padded batch on the CPU from (prompt, response)
    /// pairs; the response tokens are the ones trained. Padding uses
    /// `pad_id`.
    pub fn from_prompt_response(pairs: &[(&[u32], &[u32])], pad_id: u32) -> Result<Self> {
        let s = pairs
            .iter()
            .map(|(p, r)| p.len() + r.len())
            .max()
            .unwrap_or(0);
        if pairs.iter().any(|(p, _)| p.is_empty()) {
            return Err(Error::batch(
                "prompt",
                "is empty; a response needs at least one token before it",
            ));
        }
        let (mut ids, mut attn, mut resp) = (vec![], vec![], vec![]);
        for (p, r) in pairs {
            let n = p.len() + r.len();
            ids.extend(
                p.iter()
                    .chain(r.iter())
                    .chain(std::iter::repeat_n(&pad_id, s - n))
                    .map(|&t| t as i64),
            );
            attn.extend((0..s).map(|t| (t < n) as u8 as f32));
            resp.extend((0..s).map(|t| (t >= p.len() && t < n) as u8 as f32));
        }
        let shape = [pairs.len() as i64, s as i64];
        SeqBatch::new(
            &Tensor::f_from_slice(&ids)?.f_view(shape)?,
            &Tensor::f_from_slice(&attn)?.f_view(shape)?,
            &Tensor::f_from_slice(&resp)?.f_view(shape)?,
        )
    }

    /// (batch, seq), int64.
    pub fn input_ids(&self) -> &Tensor {
        &self.input_ids
    }
    /// (batch, seq), float32.
    pub fn attention_mask(&self) -> &Tensor {
        &self.attention_mask
    }
    /// (batch, seq), float32.
    pub fn response_mask(&self) -> &Tensor {
        &self.response_mask
    }
    pub fn batch_size(&self) -> usize {
        self.rows.len()
    }
    pub fn seq_len(&self) -> usize {
        self.input_ids.size()[1] as usize
    }
    pub fn device(&self) -> Device {
        self.input_ids.device()
    }
    /// Response tokens in the whole batch.
    pub fn num_response_tokens(&self) -> usize {
        self.rows.iter().map(|r| r.resp.1 - r.resp.0).sum()
    }
    /// Rows with at least one response token.
    pub fn num_nonempty_rows(&self) -> usize {
        self.rows.iter().filter(|r| r.resp.1 > r.resp.0).count()
    }

    /// The columns `t0..t1` that hold every response token of the batch,
    /// or `None` if there are none. `t0 ≥ 1`.
    pub(crate) fn response_window(&self) -> Option<(usize, usize)> {
        let spans = self.rows.iter().filter(|r| r.resp.1 > r.resp.0);
        let t0 = spans.clone().map(|r| r.resp.0).min()?;
        let t1 = spans.map(|r| r.resp.1).max()?;
        Some((t0, t1))
    }

    /// Rows `start..start + len` on `device`, with trailing columns that
    /// are padding in all of them cut off.
    pub(crate) fn micro(&self, start: usize, len: usize, device: Device) -> Result<Micro> {
        let rows = self.rows[start..start + len].to_vec();
        let w = rows.iter().map(|r| r.len).max().unwrap_or(0).max(2);
        let seqs = SeqBatch {
            input_ids: cut(&self.input_ids, start, len, 0, w, device)?,
            attention_mask: cut(&self.attention_mask, start, len, 0, w, device)?,
            response_mask: cut(&self.response_mask, start, len, 0, w, device)?,
            rows,
        };
        let window = seqs.response_window();
        let mask = window
            .map(|(t0, t1)| seqs.response_mask.f_narrow(1, t0 as i64, (t1 - t0) as i64))
            .transpose()?;
        // Read on the host, before the rows go to the device.
        let host_ids = cut(&self.input_ids, start, len, 0, w, Device::Cpu)?;
        let shared = shared_prompts(&host_ids, &seqs.rows)?;
        Ok(Micro {
            seqs,
            start,
            window,
            mask,
            shared,
        })
    }
}

/// Rows (`ids` on the host, `rows` their spans) as responses to shared
/// prompts (the prompt: the tokens before the response), when at least two
/// rows share each prompt on average and every row has a prompt and a
/// response; `None` otherwise. With the prompt length of every row.
fn shared_prompts(ids: &Tensor, rows: &[RowSpan]) -> Result<Option<(SharedPrompts, Vec<usize>)>> {
    let ok = |r: &RowSpan| r.resp.0 > 0 && r.resp.1 > r.resp.0;
    if rows.len() < 2 || !rows.iter().all(ok) {
        return Ok(None);
    }
    let ids = Vec::<Vec<i64>>::try_from(ids)?;
    let mut index: HashMap<&[i64], usize> = HashMap::new();
    let mut shared = SharedPrompts {
        prompts: Vec::new(),
        rows: Vec::with_capacity(rows.len()),
    };
    for (row, span) in ids.iter().zip(rows) {
        let prompt = &row[..span.resp.0];
        let g = *index.entry(prompt).or_insert_with(|| {
            shared
                .prompts
                .push(prompt.iter().map(|&t| t as u32).collect());
            shared.prompts.len() - 1
        });
        let resp = row[span.resp.0..span.len]
            .iter()
            .map(|&t| t as u32)
            .collect();
        shared.rows.push((g, resp));
    }
    if 2 * shared.prompts.len() > shared.rows.len() {
        return Ok(None);
    }
    let lens = rows.iter().map(|r| r.resp.0).collect();
    Ok(Some((shared, lens)))
}

/// Rows `start..start + len` and columns `c0..c1` of `t`, on `device`.
fn cut(t: &Tensor, start: usize, len: usize, c0: usize, c1: usize, dev: Device) -> Result<Tensor> {
    Ok(t.f_narrow(0, start as i64, len as i64)?
        .f_narrow(1, c0 as i64, (c1 - c0) as i64)?
        .f_to_device(dev)?)
}

/// One micro-batch: its rows (cut to their longest row), and the window of
/// columns `t0..t1` that holds all their response tokens. Per-token
/// tensors of a micro-batch are cut to the window: the losses and the LM
/// head only ever see those columns.
#[derive(Debug)]
pub(crate) struct Micro {
    pub(crate) seqs: SeqBatch,
    /// First row in the whole batch.
    pub(crate) start: usize,
    /// `None` when the rows have no response token.
    pub(crate) window: Option<(usize, usize)>,
    /// The response mask in the window, (rows, t1 − t0).
    pub(crate) mask: Option<Tensor>,
    /// The rows as responses to shared prompts, and each row's prompt
    /// length, when they share them two to one or more.
    pub(crate) shared: Option<(SharedPrompts, Vec<usize>)>,
}

impl Micro {
    /// Writes `src` (rows, window) into this micro-batch's rows and window
    /// of the whole-batch tensor `dst`, on `dst`'s device.
    pub(crate) fn write_window(&self, dst: &Tensor, src: &Tensor) -> Result<()> {
        let (t0, t1) = self.window.expect("a micro-batch with response tokens");
        let mut view = dst
            .f_narrow(0, self.start as i64, self.seqs.batch_size() as i64)?
            .f_narrow(1, t0 as i64, (t1 - t0) as i64)?;
        view.f_copy_(src)?;
        Ok(())
    }

    /// Rows of this micro-batch and window columns of a whole-batch
    /// per-token tensor. Panics without a window.
    pub(crate) fn window_of(&self, t: &Tensor) -> Result<Tensor> {
        let (t0, t1) = self.window.expect("a micro-batch with response tokens");
        cut(
            t,
            self.start,
            self.seqs.batch_size(),
            t0,
            t1,
            self.seqs.device(),
        )
    }
}

/// Per-token float32 tensors (batch, seq) of a batch, checked.
fn check_per_token(arg: &'static str, t: &Tensor, seqs: &SeqBatch) -> Result<Tensor> {
    let want = [seqs.batch_size(), seqs.seq_len()];
    if dims(t) != want {
        return Err(Error::batch(
            arg,
            format!("has shape {:?}, expected {want:?} (batch, seq)", dims(t)),
        ));
    }
    if t.kind() != Kind::Float {
        return Err(Error::batch(
            arg,
            format!("has kind {:?}, expected float32", t.kind()),
        ));
    }
    Ok(t.shallow_clone())
}

/// What a policy update trains on. All per-token tensors are (batch, seq)
/// float32, aligned with the sequences' tokens; values outside the
/// response mask are ignored (NaN there is harmless).
#[derive(Debug)]
pub struct PolicyBatch {
    pub seqs: SeqBatch,
    /// log π_old of each token (the trainer's own scoring before the update).
    pub old_log_probs: Tensor,
    pub advantages: Tensor,
    /// log π_ref, needed when the loss has a KL term.
    pub ref_log_probs: Option<Tensor>,
    /// The rollout engine's log-probs, for truncated importance sampling.
    pub rollout_log_probs: Option<Tensor>,
    /// π_old is the policy about to be updated (see
    /// [`PolicyBatch::old_from_update`]).
    pub old_from_update: bool,
}

impl Clone for PolicyBatch {
    /// Shares the tensors.
    fn clone(&self) -> Self {
        let opt = |t: &Option<Tensor>| t.as_ref().map(Tensor::shallow_clone);
        PolicyBatch {
            seqs: self.seqs.clone(),
            old_log_probs: self.old_log_probs.shallow_clone(),
            advantages: self.advantages.shallow_clone(),
            ref_log_probs: opt(&self.ref_log_probs),
            rollout_log_probs: opt(&self.rollout_log_probs),
            old_from_update: self.old_from_update,
        }
    }
}

impl PolicyBatch {
    pub fn new(
        seqs: SeqBatch,
        old_log_probs: &Tensor,
        advantages: &Tensor,
        ref_log_probs: Option<&Tensor>,
        rollout_log_probs: Option<&Tensor>,
    ) -> Result<Self> {
        Ok(PolicyBatch {
            old_log_probs: check_per_token("old_log_probs", old_log_probs, &seqs)?,
            advantages: check_per_token("advantages", advantages, &seqs)?,
            ref_log_probs: ref_log_probs
                .map(|t| check_per_token("ref_log_probs", t, &seqs))
                .transpose()?,
            rollout_log_probs: rollout_log_probs
                .map(|t| check_per_token("rollout_log_probs", t, &seqs))
                .transpose()?,
            seqs,
            old_from_update: false,
        })
    }

    /// Marks the batch on-policy: no optimizer step has been taken since
    /// its samples were drawn, so π_old is the policy being updated and the
    /// update's own log-probs, detached, are π_old (the ratio is exactly 1
    /// and the gradient is the policy gradient). The update writes them into
    /// `old_log_probs` as its micro-batches run (what the tensor held is
    /// ignored), so a later epoch or a metric reads them there. This saves
    /// the separate scoring pass before the first update, as TRL does with
    /// `num_iterations = 1`; verl always rescores.
    pub fn old_from_update(mut self) -> Self {
        self.old_from_update = true;
        self
    }
}

/// What a critic update trains on: (batch, seq) float32, aligned with the
/// tokens like [`PolicyBatch`].
#[derive(Debug)]
pub struct CriticBatch {
    pub seqs: SeqBatch,
    /// The critic's values when the batch was collected.
    pub values: Tensor,
    /// Targets (e.g. GAE returns).
    pub returns: Tensor,
}

impl Clone for CriticBatch {
    /// Shares the tensors.
    fn clone(&self) -> Self {
        CriticBatch {
            seqs: self.seqs.clone(),
            values: self.values.shallow_clone(),
            returns: self.returns.shallow_clone(),
        }
    }
}

impl CriticBatch {
    pub fn new(seqs: SeqBatch, values: &Tensor, returns: &Tensor) -> Result<Self> {
        Ok(CriticBatch {
            values: check_per_token("values", values, &seqs)?,
            returns: check_per_token("returns", returns, &seqs)?,
            seqs,
        })
    }
}

/// `(start, len)` of each micro-batch of `n` rows, `size` rows at most.
/// The micro-batches of `batch` under `split`, as (first row, rows), in
/// order, every row in exactly one.
pub(crate) fn micro_batches(batch: &SeqBatch, split: Split) -> Vec<(usize, usize)> {
    match split {
        Split::Rows(n) => chunks(batch.batch_size(), n).collect(),
        // A micro-batch is as wide as its longest row, at least 2 (`micro`).
        Split::Tokens(budget) => token_chunks(batch.rows.iter().map(|r| r.len.max(2)), budget),
    }
}

/// Consecutive rows while rows × the longest stays within `budget`; a row
/// longer than the budget alone.
fn token_chunks(lens: impl Iterator<Item = usize>, budget: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let (mut start, mut rows, mut width) = (0, 0usize, 0);
    for (i, len) in lens.enumerate() {
        if rows > 0 && (rows + 1).saturating_mul(width.max(len)) > budget {
            out.push((start, rows));
            (start, rows, width) = (i, 0, 0);
        }
        rows += 1;
        width = width.max(len);
    }
    if rows > 0 {
        out.push((start, rows));
    }
    out
}

pub(crate) fn chunks(n: usize, size: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..n)
        .step_by(size.max(1))
        .map(move |s| (s, size.min(n - s)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_right_padded_rows_and_windows() {
        let b = SeqBatch::from_prompt_response(&[(&[1, 2], &[3, 4, 5]), (&[1, 2, 3], &[4])], 0)
            .unwrap();
        assert_eq!(b.seq_len(), 5);
        assert_eq!(b.num_response_tokens(), 4);
        assert_eq!(b.response_window(), Some((2, 5)));
        let ids = Vec::<Vec<i64>>::try_from(b.input_ids()).unwrap();
        assert_eq!(ids[1], vec![1, 2, 3, 4, 0]);
        let mb = b.micro(1, 1, Device::Cpu).unwrap();
        assert_eq!(
            (mb.seqs.seq_len(), mb.window, mb.seqs.response_window()),
            (4, Some((3, 4)), Some((3, 4)))
        );
        let resp = Vec::<Vec<f32>>::try_from(b.response_mask()).unwrap();
        let cut = Vec::<Vec<f32>>::try_from(&mb.window_of(b.response_mask()).unwrap()).unwrap();
        assert_eq!(cut, vec![vec![resp[1][3]]]);
    }

    #[test]
    fn rejects_left_padding_and_bad_response_masks() {
        let ids = Tensor::zeros([1, 4], (Kind::Int64, Device::Cpu));
        let t = |v: [f32; 4]| Tensor::from_slice(&v).view([1, 4]);
        let left = SeqBatch::new(&ids, &t([0., 1., 1., 1.]), &t([0., 0., 1., 1.]));
        assert!(left.unwrap_err().to_string().contains("right-padded"));
        let first = SeqBatch::new(&ids, &t([1., 1., 1., 1.]), &t([1., 1., 0., 0.]));
        assert!(first.unwrap_err().to_string().contains("response_mask"));
        let padding = SeqBatch::new(&ids, &t([1., 1., 0., 0.]), &t([0., 1., 1., 0.]));
        assert!(padding.unwrap_err().to_string().contains("1..2"));
        let holes = SeqBatch::new(&ids, &t([1., 1., 1., 1.]), &t([0., 1., 0., 1.]));
        assert!(holes.unwrap_err().to_string().contains("contiguous"));
        let floats = SeqBatch::new(&t([1., 1., 1., 1.]), &t([1.; 4]), &t([0., 1., 1., 1.]));
        assert!(floats.unwrap_err().to_string().contains("integer kind"));
    }

    #[test]
    fn chunks_cover_every_row_once() {
        let c: Vec<_> = chunks(5, 2).collect();
        assert_eq!(c, vec![(0, 2), (2, 2), (4, 1)]);
    }

    #[test]
    fn token_chunks_cover_every_row_once_within_the_budget() {
        let lens = [3, 5, 2, 9, 4, 4, 4, 20, 1];
        let c = token_chunks(lens.iter().copied(), 12);
        assert_eq!(c, vec![(0, 2), (2, 1), (3, 1), (4, 3), (7, 1), (8, 1)]);
        for &(s, n) in &c {
            let width = lens[s..s + n].iter().max().unwrap();
            assert!(n == 1 || n * width <= 12, "{s}+{n}");
        }
        assert!(token_chunks(std::iter::empty(), 12).is_empty());

        // On a batch: rows of 5 and 3 tokens (padded to 5), then 4 and 2.
        let b = SeqBatch::from_prompt_response(
            &[
                (&[1, 2], &[3, 4, 5]),
                (&[1], &[2, 3]),
                (&[1, 2], &[3, 4]),
                (&[1], &[2]),
            ],
            0,
        )
        .unwrap();
        assert_eq!(
            micro_batches(&b, Split::Tokens(8)),
            vec![(0, 1), (1, 2), (3, 1)]
        );
        assert_eq!(micro_batches(&b, Split::Tokens(10)), vec![(0, 2), (2, 2)]);
        assert_eq!(micro_batches(&b, Split::Rows(3)), vec![(0, 3), (3, 1)]);
    }
}

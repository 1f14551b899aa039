//! Typed batches the engine trains on, and their micro-batches.
//!
//! Every per-token tensor is **(batch, seq)**, aligned with `input_ids`:
//! column `t` of a log-probability, an advantage or a value refers to token
//! `t` (its log-probability is `log p(ids[t] | ids[..t])`, computed from
//! the hidden state at `t − 1`). Column 0 never has one. Sequences are
//! **right-padded**: each row is its real tokens (prompt then response),
//! then padding.

use candle_core::{DType, Device, Tensor};

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
#[derive(Clone, Debug)]
pub struct SeqBatch {
    input_ids: Tensor,
    attention_mask: Tensor,
    response_mask: Tensor,
    rows: Vec<RowSpan>,
}

fn rows_f32(arg: &'static str, t: &Tensor, shape: (usize, usize)) -> Result<Vec<Vec<f32>>> {
    if t.dims() != [shape.0, shape.1] {
        return Err(Error::batch(
            arg,
            format!(
                "has shape {:?}, expected {:?}",
                t.dims(),
                [shape.0, shape.1]
            ),
        ));
    }
    Ok(t.to_dtype(DType::F32)?.to_vec2::<f32>()?)
}

fn mask_value(arg: &'static str, v: f32) -> Result<bool> {
    match v {
        0.0 => Ok(false),
        1.0 => Ok(true),
        _ => Err(Error::batch(arg, format!("holds {v}; masks are 0 or 1"))),
    }
}

impl SeqBatch {
    /// `input_ids` (batch, seq) of an integer dtype; `attention_mask`
    /// (batch, seq), 1 for real tokens then 0 for padding (right padding
    /// only); `response_mask` (batch, seq), 1 on the tokens whose
    /// log-probabilities are trained or scored — a contiguous run of real
    /// tokens, never column 0. Masks may have any numeric dtype; they are
    /// kept as float32.
    pub fn new(
        input_ids: &Tensor,
        attention_mask: &Tensor,
        response_mask: &Tensor,
    ) -> Result<Self> {
        let (b, s) = input_ids.dims2().map_err(|_| {
            Error::batch(
                "input_ids",
                format!("must be (batch, seq), got {:?}", input_ids.dims()),
            )
        })?;
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
        let input_ids = match input_ids.dtype() {
            DType::U32 => input_ids.clone(),
            DType::I64 | DType::U8 => input_ids.to_dtype(DType::U32)?,
            other => {
                return Err(Error::batch(
                    "input_ids",
                    format!("has dtype {other:?}, expected u32 or i64"),
                ))
            }
        };
        Ok(SeqBatch {
            input_ids,
            attention_mask: attention_mask.to_dtype(DType::F32)?,
            response_mask: response_mask.to_dtype(DType::F32)?,
            rows,
        })
    }

    /// Builds a right-padded batch from (prompt, response) pairs; the
    /// response tokens are the ones trained. Padding uses `pad_id`.
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
                    .copied()
                    .chain(std::iter::repeat_n(pad_id, s - n)),
            );
            attn.extend((0..s).map(|t| (t < n) as u8 as f32));
            resp.extend((0..s).map(|t| (t >= p.len() && t < n) as u8 as f32));
        }
        let dev = Device::Cpu;
        let shape = (pairs.len(), s);
        SeqBatch::new(
            &Tensor::from_vec(ids, shape, &dev)?,
            &Tensor::from_vec(attn, shape, &dev)?,
            &Tensor::from_vec(resp, shape, &dev)?,
        )
    }

    /// (batch, seq), u32.
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
        self.input_ids.dim(1).expect("checked in new")
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

    /// Rows `start..start + len`, with trailing columns that are padding in
    /// all of them cut off. Returns the micro-batch and its width.
    pub(crate) fn micro(&self, start: usize, len: usize) -> Result<(SeqBatch, usize)> {
        let rows = self.rows[start..start + len].to_vec();
        let w = rows.iter().map(|r| r.len).max().unwrap_or(0).max(2);
        let cut = |t: &Tensor| -> Result<Tensor> { Ok(t.narrow(0, start, len)?.narrow(1, 0, w)?) };
        let mb = SeqBatch {
            input_ids: cut(&self.input_ids)?,
            attention_mask: cut(&self.attention_mask)?,
            response_mask: cut(&self.response_mask)?,
            rows,
        };
        Ok((mb, w))
    }
}

/// Per-token float32 tensors (batch, seq) of a batch, checked.
fn check_per_token(arg: &'static str, t: &Tensor, seqs: &SeqBatch) -> Result<Tensor> {
    let want = [seqs.batch_size(), seqs.seq_len()];
    if t.dims() != want {
        return Err(Error::batch(
            arg,
            format!("has shape {:?}, expected {want:?} (batch, seq)", t.dims()),
        ));
    }
    if t.dtype() != DType::F32 {
        return Err(Error::batch(
            arg,
            format!("has dtype {:?}, expected f32", t.dtype()),
        ));
    }
    Ok(t.clone())
}

fn cut(t: &Tensor, start: usize, len: usize, w: usize) -> Result<Tensor> {
    Ok(t.narrow(0, start, len)?.narrow(1, 0, w)?)
}

/// What a policy update trains on. All per-token tensors are (batch, seq)
/// float32, aligned with the sequences' tokens; values outside the
/// response mask are ignored (NaN there is harmless).
#[derive(Clone, Debug)]
pub struct PolicyBatch {
    pub seqs: SeqBatch,
    /// log π_old of each token (the trainer's own scoring before the update).
    pub old_log_probs: Tensor,
    pub advantages: Tensor,
    /// log π_ref, needed when the loss has a KL term.
    pub ref_log_probs: Option<Tensor>,
    /// The rollout engine's log-probs, for truncated importance sampling.
    pub rollout_log_probs: Option<Tensor>,
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
        })
    }

    pub(crate) fn micro(&self, start: usize, len: usize) -> Result<PolicyBatch> {
        let (seqs, w) = self.seqs.micro(start, len)?;
        let opt = |t: &Option<Tensor>| t.as_ref().map(|t| cut(t, start, len, w)).transpose();
        Ok(PolicyBatch {
            seqs,
            old_log_probs: cut(&self.old_log_probs, start, len, w)?,
            advantages: cut(&self.advantages, start, len, w)?,
            ref_log_probs: opt(&self.ref_log_probs)?,
            rollout_log_probs: opt(&self.rollout_log_probs)?,
        })
    }
}

/// What a critic update trains on: (batch, seq) float32, aligned with the
/// tokens like [`PolicyBatch`].
#[derive(Clone, Debug)]
pub struct CriticBatch {
    pub seqs: SeqBatch,
    /// The critic's values when the batch was collected.
    pub values: Tensor,
    /// Targets (e.g. GAE returns).
    pub returns: Tensor,
}

impl CriticBatch {
    pub fn new(seqs: SeqBatch, values: &Tensor, returns: &Tensor) -> Result<Self> {
        Ok(CriticBatch {
            values: check_per_token("values", values, &seqs)?,
            returns: check_per_token("returns", returns, &seqs)?,
            seqs,
        })
    }

    pub(crate) fn micro(&self, start: usize, len: usize) -> Result<CriticBatch> {
        let (seqs, w) = self.seqs.micro(start, len)?;
        Ok(CriticBatch {
            seqs,
            values: cut(&self.values, start, len, w)?,
            returns: cut(&self.returns, start, len, w)?,
        })
    }
}

/// `(start, len)` of each micro-batch of `n` rows, `size` rows at most.
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
        assert_eq!(
            b.input_ids().to_vec2::<u32>().unwrap()[1],
            vec![1, 2, 3, 4, 0]
        );
        let (mb, w) = b.micro(1, 1).unwrap();
        assert_eq!(
            (w, mb.seq_len(), mb.response_window()),
            (4, 4, Some((3, 4)))
        );
    }

    #[test]
    fn rejects_left_padding_and_bad_response_masks() {
        let ids = Tensor::zeros((1, 4), DType::U32, &Device::Cpu).unwrap();
        let t = |v: [f32; 4]| Tensor::new(&[v], &Device::Cpu).unwrap();
        let left = SeqBatch::new(&ids, &t([0., 1., 1., 1.]), &t([0., 0., 1., 1.]));
        assert!(left.unwrap_err().to_string().contains("right-padded"));
        let first = SeqBatch::new(&ids, &t([1., 1., 1., 1.]), &t([1., 1., 0., 0.]));
        assert!(first.unwrap_err().to_string().contains("response_mask"));
        let padding = SeqBatch::new(&ids, &t([1., 1., 0., 0.]), &t([0., 1., 1., 0.]));
        assert!(padding.unwrap_err().to_string().contains("1..2"));
        let holes = SeqBatch::new(&ids, &t([1., 1., 1., 1.]), &t([0., 1., 0., 1.]));
        assert!(holes.unwrap_err().to_string().contains("contiguous"));
    }

    #[test]
    fn chunks_cover_every_row_once() {
        let c: Vec<_> = chunks(5, 2).collect();
        assert_eq!(c, vec![(0, 2), (2, 2), (4, 1)]);
    }
}

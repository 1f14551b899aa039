//! A trainer's forward cut at the decoder layers' boundaries: the input of
//! the first layer ([`Stages::embed`]), one layer at a time
//! ([`Stages::layer`]), and what follows the last ([`Stages::finish`]).
//! The inputs every layer shares — RoPE tables, masks, the shared-prompt
//! bookkeeping — are built once, in [`Model::stages`] and
//! [`Model::stages_shared_prompts`].
//!
//! [`Model::hidden_states`] and [`Model::hidden_states_shared_prompts`] are
//! these stages run in a row, so a caller that runs them itself computes
//! the same thing. colo-train's activation checkpointing does: it keeps
//! only the boundaries of a forward without a graph, then recomputes one
//! layer at a time, with a graph, for the backward.

use tch::{Kind, Tensor};

use crate::layers::{self, masked_value, RopeTables};
use crate::model::{check_dims, check_rank, Model, Visible};
use crate::shared_prompt::SharedPrompts;
use crate::{Error, Result};

/// One forward's shared inputs; see the module doc.
pub struct Stages<'m> {
    model: &'m Model,
    inputs: Inputs,
}

enum Inputs {
    /// Rows through every position ([`Model::hidden_states`]).
    Rows {
        input_ids: Tensor,
        rope: RopeTables,
        mask: Option<Tensor>,
        causal: bool,
    },
    /// Prompts once, responses per row ([`Model::hidden_states_shared_prompts`]).
    Shared(Box<Shared>),
}

/// The shared-prompt forward's bookkeeping (see `shared_prompt.rs`).
struct Shared {
    /// (prompts, longest prompt) and (rows, longest response) token grids.
    prompt_ids: Tensor,
    resp_ids: Tensor,
    /// (rows, R, P + R) additive mask of the responses' attention.
    mask: Tensor,
    /// Each row's prompt, (rows,).
    of: Tensor,
    rope_p: RopeTables,
    rope_r: RopeTables,
    /// Distinct prompts, rows, longest prompt, longest response.
    u: i64,
    b: i64,
    p: i64,
    r: i64,
    /// Each row's prompt's last position in the prompts' stream, (rows,).
    last: Tensor,
    /// (rows, R, 1): 1 at a row's real response positions, else 0.
    real: Tensor,
}

impl Model {
    /// The stages of [`Model::hidden_states`] (arguments as there).
    pub fn stages(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        position_ids: Option<&Tensor>,
    ) -> Result<Stages<'_>> {
        check_rank("input_ids", input_ids, 2)?;
        let (b, s) = input_ids.size2()?;
        let rope = match (position_ids, attention_mask) {
            (Some(p), _) => {
                let pd = p.size();
                if pd.len() != 2 || (pd[0] != 1 && pd[0] != b) || pd[1] != s {
                    return Err(Error::Input(format!(
                        "position_ids has shape {pd:?}, expected [{b}, {s}] or [1, {s}]"
                    )));
                }
                self.rope_tables_for_positions(p)?
            }
            (None, Some(m)) => {
                check_dims("attention_mask", m, &[b, s])?;
                self.rope_tables_for_positions(&layers::position_ids_from_mask(m)?)?
            }
            (None, None) => self.rope_tables_for_range(0, s as usize)?,
        };
        let mask = match attention_mask {
            Some(m) => {
                check_dims("attention_mask", m, &[b, s])?;
                let m = m.f_to_device(self.device())?;
                Some(layers::causal_padded(&m, s as usize, self.dtype())?)
            }
            None => None,
        };
        Ok(Stages {
            model: self,
            inputs: Inputs::Rows {
                input_ids: input_ids.shallow_clone(),
                rope,
                mask,
                causal: s > 1,
            },
        })
    }

    /// The stages of [`Model::hidden_states_shared_prompts`].
    pub fn stages_shared_prompts(&self, batch: &SharedPrompts) -> Result<Stages<'_>> {
        let (u, b) = (batch.prompts.len(), batch.rows.len());
        let p_len: Vec<usize> = batch.prompts.iter().map(Vec::len).collect();
        if u == 0 || b == 0 || p_len.contains(&0) {
            return Err(Error::Input(
                "shared prompts: need at least one row and non-empty prompts".into(),
            ));
        }
        if let Some((r, _)) = batch.rows.iter().enumerate().find(|(_, (g, _))| *g >= u) {
            return Err(Error::Input(format!(
                "shared prompts: row {r} names prompt {} of {u}",
                batch.rows[r].0
            )));
        }
        let p = *p_len.iter().max().expect("u > 0");
        let r = batch
            .rows
            .iter()
            .map(|(_, t)| t.len())
            .max()
            .unwrap_or(0)
            .max(1);
        let (dev, kind) = (self.device(), self.dtype());
        let ids = |v: Vec<i64>, rows: usize| -> Result<Tensor> {
            Ok(Tensor::from_slice(&v)
                .f_view([rows as i64, -1])?
                .f_to_device(dev)?)
        };
        // Right-padded token grids; positions of each response token.
        let mut prompt_ids = vec![0i64; u * p];
        for (g, t) in batch.prompts.iter().enumerate() {
            for (i, &x) in t.iter().enumerate() {
                prompt_ids[g * p + i] = x as i64;
            }
        }
        let (mut resp_ids, mut pos) = (vec![0i64; b * r], vec![0i64; b * r]);
        let mut hide = vec![false; b * r * (p + r)];
        let of: Vec<i64> = batch.rows.iter().map(|&(g, _)| g as i64).collect();
        for (row, (g, t)) in batch.rows.iter().enumerate() {
            for i in 0..r {
                let at = row * r + i;
                resp_ids[at] = t.get(i).map_or(0, |&x| x as i64);
                pos[at] = (p_len[*g] + i) as i64;
                // Query i sees its prompt's real keys and responses 0..=i.
                let keys = &mut hide[at * (p + r)..(at + 1) * (p + r)];
                keys[p_len[*g]..p].fill(true);
                keys[p + i + 1..].fill(true);
            }
        }
        let mask = Tensor::f_zeros([b as i64, r as i64, (p + r) as i64], (kind, dev))?
            .f_masked_fill(
                &ids(hide.into_iter().map(i64::from).collect(), b)?
                    .f_view([b as i64, r as i64, (p + r) as i64])?
                    .f_to_kind(Kind::Bool)?,
                masked_value(kind),
            )?;
        let last: Vec<i64> = batch
            .rows
            .iter()
            .map(|&(g, _)| (g * p + p_len[g] - 1) as i64)
            .collect();
        // Response positions past each row's end hold padding's states.
        let real: Vec<f32> = batch
            .rows
            .iter()
            .flat_map(|(_, t)| (0..r).map(move |i| f32::from(u8::from(i < t.len()))))
            .collect();
        let real = Tensor::from_slice(&real)
            .f_view([b as i64, r as i64, 1])?
            .f_to_device(dev)?
            .f_to_kind(kind)?;
        let shared = Shared {
            prompt_ids: ids(prompt_ids, u)?,
            resp_ids: ids(resp_ids, b)?,
            mask,
            of: ids(of, b)?.f_view([-1])?,
            rope_p: self.rope_tables_for_range(0, p)?,
            rope_r: self.rope_tables_for_positions(&ids(pos, b)?)?,
            u: u as i64,
            b: b as i64,
            p: p as i64,
            r: r as i64,
            last: ids(last, 1)?.f_view([-1])?,
            real,
        };
        Ok(Stages {
            model: self,
            inputs: Inputs::Shared(Box::new(shared)),
        })
    }
}

impl Stages<'_> {
    /// The decoder layers' count: [`Stages::layer`] takes `0..layers()`.
    pub fn layers(&self) -> usize {
        self.model.layers().len()
    }

    /// The first layer's input: the token embeddings — (rows, seq, hidden),
    /// or for shared prompts one stream of the prompts' tokens then the
    /// responses' (tokens, hidden).
    pub fn embed(&self) -> Result<Tensor> {
        match &self.inputs {
            Inputs::Rows { input_ids, .. } => self.model.embed(input_ids),
            Inputs::Shared(s) => {
                let hidden = self.model.config().hidden_size as i64;
                Ok(Tensor::f_cat(
                    &[
                        self.model.embed(&s.prompt_ids)?.f_reshape([-1, hidden])?,
                        self.model.embed(&s.resp_ids)?.f_reshape([-1, hidden])?,
                    ],
                    0,
                )?)
            }
        }
    }

    /// Layer `l` on its input `x` (the previous stage's output).
    pub fn layer(&self, l: usize, x: &Tensor) -> Result<Tensor> {
        let layer = self.model.layers().get(l).ok_or_else(|| {
            Error::Input(format!("layer {l} of a model of {} layers", self.layers()))
        })?;
        match &self.inputs {
            Inputs::Rows {
                rope, mask, causal, ..
            } => {
                let vis = match (mask, causal) {
                    (Some(m), _) => Visible::Mask(m),
                    (None, true) => Visible::Causal,
                    (None, false) => Visible::All,
                };
                layer.forward_visible(x, rope, vis)
            }
            Inputs::Shared(s) => {
                // The norms, projections and MLP run once over the stream;
                // only the attention is per part.
                let attn = &layer.self_attn;
                let parts = [(s.u, s.p, &s.rope_p), (s.b, s.r, &s.rope_r)];
                let qkv = attn.project_parts(&layer.input_layernorm.forward(x)?, &parts)?;
                let [(qp, kp, vp), (qr, kr, vr)] = <[_; 2]>::try_from(qkv).expect("two parts");
                let ap = attn.attention(&qp, &kp, &vp, Visible::Causal)?; // (u, p, q_dim)
                let k = Tensor::f_cat(&[kp.f_index_select(0, &s.of)?, kr], 2)?;
                let v = Tensor::f_cat(&[vp.f_index_select(0, &s.of)?, vr], 2)?;
                let ar = attn.attention(&qr, &k, &v, Visible::Mask(&s.mask))?; // (b, r, q_dim)
                let q_dim = ap.size()[2];
                let a =
                    Tensor::f_cat(&[ap.f_reshape([-1, q_dim])?, ar.f_reshape([-1, q_dim])?], 0)?;
                layer.finish(&(x + attn.o_proj().forward(&a)?))
            }
        }
    }

    /// The final norm on the last layer's output, as the forward returns
    /// it: (rows, seq, hidden); for shared prompts (rows, 1 + longest
    /// response, hidden) — column 0 the prompt's last token, then the
    /// response's, zero past a row's response.
    pub fn finish(&self, x: &Tensor) -> Result<Tensor> {
        let x = self.model.final_norm(x)?;
        let Inputs::Shared(s) = &self.inputs else {
            return Ok(x);
        };
        let hidden = self.model.config().hidden_size as i64;
        // (b, 1, hidden): each row's prompt's last token.
        let last = x.f_index_select(0, &s.last)?.f_unsqueeze(1)?;
        // The responses' rows by `split` (its backward is one `cat`).
        let resp = x.f_split_with_sizes([s.u * s.p, s.b * s.r], 0)?[1]
            .f_view([s.b, s.r, hidden])?
            .f_mul(&s.real)?;
        Ok(Tensor::f_cat(&[last, resp], 1)?)
    }

    /// Every stage in a row: the forward's result.
    pub fn run(&self) -> Result<Tensor> {
        let mut x = self.embed()?;
        for l in 0..self.layers() {
            x = self.layer(l, &x)?;
        }
        self.finish(&x)
    }
}

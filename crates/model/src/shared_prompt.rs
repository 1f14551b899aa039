//! The forward of GRPO-style batches, where the `n` samples of a prompt
//! share it: each distinct prompt runs through the layers once, and each
//! row runs only its response tokens, attending to its prompt's keys and
//! values and to its own response so far.
//!
//! A transformer's prompt positions do not depend on what follows them
//! (causal attention), so this is exactly the full forward of every
//! `(prompt, response)` row; with `n` samples per prompt it runs about
//! `(P / n + R) / (P + R)` of the tokens (the built-in job: ~40%). It is
//! differentiable like any libtorch composition: a prompt's keys, values
//! and last hidden state are gathered once per row, so their gradients
//! are the sums over the prompt's rows, as in the full forward.
//!
//! The same idea serves prefix-sharing trainers elsewhere (e.g. the
//! "shared prefix" GRPO forwards of recent RL frameworks); here it needs
//! no kernel of its own: the rows' attention is libtorch's fused
//! attention over `[prompt keys ‖ response keys]` under an additive mask
//! that hides the prompt's padding and the response's future.

use tch::{Kind, Tensor};

use crate::layers::masked_value;
use crate::model::{Model, Visible};
use crate::{Error, Result};

/// A batch of responses to shared prompts, on the host.
#[derive(Debug, Clone)]
pub struct SharedPrompts {
    /// The distinct prompts' tokens.
    pub prompts: Vec<Vec<u32>>,
    /// Each row's prompt (an index into `prompts`) and response tokens.
    pub rows: Vec<(usize, Vec<u32>)>,
}

impl Model {
    /// Final-normalised hidden states (rows, 1 + longest response,
    /// hidden): column `j` of row `r` is the hidden state at position
    /// `P − 1 + j`, where `P` is the length of the row's prompt — column 0
    /// the prompt's last token (it predicts the response's first), then
    /// the response's tokens. Columns past a row's response are zero.
    pub fn hidden_states_shared_prompts(&self, batch: &SharedPrompts) -> Result<Tensor> {
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
        let of = ids(of, b)?.f_view([-1])?;
        let rope_p = self.rope_tables_for_range(0, p)?;
        let rope_r = self.rope_tables_for_positions(&ids(pos, b)?)?;
        // One stream of tokens, the prompts' then the responses', (n,
        // hidden): the norms, projections and MLP run once over both; only
        // the attention is per part.
        let (np, hidden) = ((u * p) as i64, self.config().hidden_size as i64);
        let mut x = Tensor::f_cat(
            &[
                self.embed(&ids(prompt_ids, u)?)?.f_reshape([-1, hidden])?,
                self.embed(&ids(resp_ids, b)?)?.f_reshape([-1, hidden])?,
            ],
            0,
        )?;
        let parts = [(u as i64, p as i64, &rope_p), (b as i64, r as i64, &rope_r)];
        for layer in self.layers() {
            let attn = &layer.self_attn;
            let qkv = attn.project_parts(&layer.input_layernorm.forward(&x)?, &parts)?;
            let [(qp, kp, vp), (qr, kr, vr)] = <[_; 2]>::try_from(qkv).expect("two parts");
            let ap = attn.attention(&qp, &kp, &vp, Visible::Causal)?; // (u, p, q_dim)
            let k = Tensor::f_cat(&[kp.f_index_select(0, &of)?, kr], 2)?;
            let v = Tensor::f_cat(&[vp.f_index_select(0, &of)?, vr], 2)?;
            let ar = attn.attention(&qr, &k, &v, Visible::Mask(&mask))?; // (b, r, q_dim)
            let q_dim = ap.size()[2];
            let a = Tensor::f_cat(&[ap.f_reshape([-1, q_dim])?, ar.f_reshape([-1, q_dim])?], 0)?;
            x = layer.finish(&(&x + attn.o_proj().forward(&a)?))?;
        }
        let x = self.final_norm(&x)?;
        let last: Vec<i64> = batch
            .rows
            .iter()
            .map(|&(g, _)| (g * p + p_len[g] - 1) as i64)
            .collect();
        let last = x
            .f_index_select(0, &ids(last, 1)?.f_view([-1])?)?
            .f_unsqueeze(1)?; // (b, 1, hidden)
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
        let resp = x
            .f_narrow(0, np, (b * r) as i64)?
            .f_view([b as i64, r as i64, hidden])?
            .f_mul(&real)?;
        Ok(Tensor::f_cat(&[last, resp], 1)?)
    }
}

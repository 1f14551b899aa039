//! What a tensor-parallel inference engine needs from a layer beyond the
//! pieces every engine uses: attention over this rank's heads without the
//! output projection, which such an engine runs row-parallel (its slice
//! of `o_proj`'s input columns, a sum over the group, then the bias once).
//!
//! A model over one rank's slice is an ordinary [`crate::Model`] built
//! with that rank's head and intermediate counts in its
//! [`crate::ModelConfig`]; nothing here changes the model the trainer
//! runs.

use tch::Tensor;

use crate::model::{Attention, Visible};
use crate::Result;

impl Attention {
    /// [`Attention::attend`] without the output projection: attention of
    /// `q` (batch, heads, q_len, head_dim) over `k`, `v` (batch, kv_heads,
    /// k_len, head_dim) under the additive `mask` (`None`: every key),
    /// returned as (batch, q_len, heads · head_dim), `o_proj`'s input.
    pub fn attend_heads(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        self.attention(q, k, v, mask.map_or(Visible::All, Visible::Mask))
    }
}

#[cfg(test)]
mod tests {
    use tch::{Device, Kind, Tensor};

    use crate::{Model, ModelConfig, Weights};

    /// `o_proj(attend_heads(…))` is `attend(…)`.
    #[test]
    fn attend_is_the_output_projection_of_attend_heads() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/tiny-qwen2");
        let cfg = ModelConfig::from_file(&dir.join("config.json")).unwrap();
        let w = Weights::from_dir(&dir, Kind::Float, Device::Cpu).unwrap();
        let model = Model::load(&cfg, &w).unwrap();
        let attn = &model.layers()[0].self_attn;
        let x = Tensor::randn([2, 5, cfg.hidden_size as i64], (Kind::Float, Device::Cpu));
        let rope = model.rope_tables_for_range(0, 5).unwrap();
        let (q, k, v) = attn.qkv(&x, &rope).unwrap();
        let mask = crate::mask::causal(5, 5, Kind::Float, Device::Cpu).unwrap();
        let heads = attn.attend_heads(&q, &k, &v, Some(&mask)).unwrap();
        assert_eq!(heads.size(), [2, 5, (cfg.num_heads * cfg.head_dim) as i64]);
        let full = attn.attend(&q, &k, &v, Some(&mask)).unwrap();
        let projected = attn.o_proj().forward(&heads).unwrap();
        assert!(full.allclose(&projected, 0.0, 0.0, false));
    }
}

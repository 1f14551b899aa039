//! The whole decoder: embedding → layers → final norm → LM head.

use std::path::Path;

use candle_core::{DType, Device, Tensor, Var};

use crate::block::Block;
use crate::cache::KvCache;
use crate::config::ModelConfig;
use crate::layers::RmsNorm;
use crate::mask;
use crate::rope::{position_rows, positions_from_mask, RopeTables, RotaryEmbedding};
use crate::weights::Weights;
use crate::{Error, Result};

/// A Qwen2 / Llama causal language model.
///
/// Cloning is cheap (tensors are reference counted) and shares weights.
#[derive(Debug, Clone)]
pub struct Model {
    cfg: ModelConfig,
    embed_tokens: Tensor,
    layers: Vec<Block>,
    norm: RmsNorm,
    /// `None` when the head is tied to `embed_tokens`.
    lm_head: Option<Tensor>,
    rotary: RotaryEmbedding,
}

impl Model {
    /// Builds the model from Hugging Face-named weights, checking every
    /// tensor's shape against `cfg`. The tensors are shared, not copied.
    pub fn load(cfg: &ModelConfig, w: &Weights) -> Result<Self> {
        let (v, h) = (cfg.vocab_size, cfg.hidden_size);
        let embed_tokens = w.get("model.embed_tokens.weight", &[v, h])?;
        let layers = (0..cfg.num_layers)
            .map(|i| Block::load(w, &format!("model.layers.{i}"), cfg))
            .collect::<Result<Vec<_>>>()?;
        let lm_head = match cfg.tie_word_embeddings {
            true => None,
            false => Some(w.get("lm_head.weight", &[v, h])?),
        };
        Ok(Model {
            cfg: cfg.clone(),
            embed_tokens,
            layers,
            norm: RmsNorm::load(w, "model.norm", h, cfg.rms_norm_eps)?,
            lm_head,
            rotary: RotaryEmbedding::new(cfg.head_dim, cfg.rope_theta),
        })
    }

    /// Like [`Model::load`], but every parameter becomes a fresh
    /// [`candle_core::Var`] (a copy of the loaded tensor), so a loss computed
    /// from this model's forward has gradients for all of them. Get the vars
    /// with [`Model::vars`].
    pub fn load_trainable(cfg: &ModelConfig, w: &Weights) -> Result<Self> {
        let model = Model::load(cfg, w)?;
        let vars = model
            .named_parameters()
            .into_iter()
            .map(|(name, t)| Ok((name, Var::from_tensor(&t)?.as_tensor().clone())))
            .collect::<Result<_>>()?;
        Model::load(cfg, &Weights::from_tensors(vars))
    }

    /// Reads `config.json` and the safetensors weights of a Hugging Face
    /// checkpoint directory.
    pub fn from_dir(dir: &Path, dtype: DType, device: &Device) -> Result<Self> {
        let cfg = ModelConfig::from_file(&dir.join("config.json"))?;
        Model::load(&cfg, &Weights::from_dir(dir, dtype, device)?)
    }

    /// Writes `config.json` and `model.safetensors` into `dir` (created if
    /// needed) in the layout transformers loads. A tied head is not written.
    pub fn save_dir(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let cfg_path = dir.join("config.json");
        let json = serde_json::to_string_pretty(&self.cfg.to_hf_json(self.dtype()))
            .expect("a JSON value serialises");
        std::fs::write(&cfg_path, json + "\n").map_err(|e| Error::io(&cfg_path, e))?;
        crate::weights::save_safetensors(
            &self.named_parameters(),
            &dir.join(crate::weights::WEIGHTS_FILE),
        )
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    pub fn dtype(&self) -> DType {
        self.embed_tokens.dtype()
    }

    pub fn device(&self) -> &Device {
        self.embed_tokens.device()
    }

    /// The decoder layers, for engines that run them one by one.
    pub fn layers(&self) -> &[Block] {
        &self.layers
    }

    /// Every parameter once, under its Hugging Face name, in a stable order.
    pub fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut out = vec![(
            "model.embed_tokens.weight".to_owned(),
            self.embed_tokens.clone(),
        )];
        for (i, layer) in self.layers.iter().enumerate() {
            layer.push_params(&format!("model.layers.{i}"), &mut out);
        }
        self.norm.push_params("model.norm", &mut out);
        if let Some(head) = &self.lm_head {
            out.push(("lm_head.weight".to_owned(), head.clone()));
        }
        out
    }

    /// The parameters as [`Var`]s sharing storage with the model: updating a
    /// var (`Var::set`, an optimizer step) updates the model. Errors unless
    /// the model came from [`Model::load_trainable`].
    pub fn vars(&self) -> Result<Vec<(String, Var)>> {
        self.named_parameters()
            .into_iter()
            .map(|(name, t)| match t.is_variable() {
                true => Ok((name, Var::from_tensor(&t)?)),
                false => Err(Error::Input(format!(
                    "parameter `{name}` is not trainable: load with Model::load_trainable"
                ))),
            })
            .collect()
    }

    // ------------------------------------------------------------ pieces

    /// Token embeddings: `input_ids` (batch, seq), u32 or i64 → (batch, seq, hidden).
    pub fn embed(&self, input_ids: &Tensor) -> Result<Tensor> {
        let (b, s) = input_ids.dims2()?;
        let flat = self
            .embed_tokens
            .index_select(&input_ids.flatten_all()?, 0)?;
        Ok(flat.reshape((b, s, self.cfg.hidden_size))?)
    }

    /// RoPE tables for explicit positions, one row per sequence.
    pub fn rope_tables(&self, positions: &[Vec<u32>]) -> Result<RopeTables> {
        self.rotary.tables(positions, self.dtype(), self.device())
    }

    /// RoPE tables for positions `start..start + len`, shared by all rows.
    pub fn rope_tables_for_range(&self, start: usize, len: usize) -> Result<RopeTables> {
        self.rotary
            .tables_for_range(start, len, self.dtype(), self.device())
    }

    /// The final RMSNorm: (…, hidden) → same shape.
    pub fn final_norm(&self, x: &Tensor) -> Result<Tensor> {
        self.norm.forward(x)
    }

    /// The LM head on normalised hidden states: (batch, seq, hidden) →
    /// (batch, seq, vocab).
    pub fn lm_head(&self, hidden: &Tensor) -> Result<Tensor> {
        let (b, s, h) = hidden.dims3()?;
        let w = self.lm_head.as_ref().unwrap_or(&self.embed_tokens);
        let logits = hidden.reshape((b * s, h))?.matmul(&w.t()?)?;
        Ok(logits.reshape((b, s, self.cfg.vocab_size))?)
    }

    // ------------------------------------------------------------ forwards

    /// Logits (batch, seq, vocab) of an unpadded batch: every row is a full
    /// sequence starting at position 0.
    pub fn forward(&self, input_ids: &Tensor) -> Result<Tensor> {
        self.lm_head(&self.hidden_states(input_ids, None, None)?)
    }

    /// Logits of a padded batch. `attention_mask` (batch, seq): 1 for real
    /// tokens, 0 for padding, on either side. `position_ids` (batch, seq)
    /// default to the count of real tokens before each one (so a
    /// right-padded row is numbered 0, 1, 2, … like an unpadded one and a
    /// left-padded row starts at 0 at its first real token). Logits at
    /// padding positions are meaningless.
    pub fn forward_masked(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        position_ids: Option<&Tensor>,
    ) -> Result<Tensor> {
        self.lm_head(&self.hidden_states(input_ids, Some(attention_mask), position_ids)?)
    }

    /// Final-normalised hidden states (batch, seq, hidden) — the input of
    /// the LM head, and of a critic's value head. Arguments as in
    /// [`Model::forward_masked`], both optional.
    pub fn hidden_states(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        position_ids: Option<&Tensor>,
    ) -> Result<Tensor> {
        let (b, s) = input_ids.dims2()?;
        let positions = match (position_ids, attention_mask) {
            (Some(p), _) => position_rows(p)?,
            (None, Some(m)) => positions_from_mask(m)?,
            (None, None) => vec![(0..s as u32).collect()],
        };
        let rope = self.rope_tables(&positions)?;
        let mask = match attention_mask {
            Some(m) => {
                check_dims("attention_mask", m, &[b, s])?;
                Some(mask::causal_padded(m, s, self.dtype())?)
            }
            None if s > 1 => Some(mask::causal(s, s, self.dtype(), self.device())?),
            None => None,
        };
        let mut x = self.embed(input_ids)?;
        for layer in &self.layers {
            x = layer.forward(&x, &rope, mask.as_ref())?;
        }
        self.final_norm(&x)
    }

    /// Incremental forward: runs the new tokens `input_ids` (batch, seq)
    /// after the keys and values already in `cache`, appends theirs, and
    /// returns logits (batch, seq, vocab) for the new tokens.
    ///
    /// `attention_mask`, if given, covers the cached and the new tokens
    /// (batch, cached + seq); positions are derived from it as in
    /// [`Model::forward_masked`]. Without it positions continue from
    /// `cache.len()`.
    pub fn forward_with_cache(
        &self,
        input_ids: &Tensor,
        cache: &mut KvCache,
        attention_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let (b, s) = input_ids.dims2()?;
        let past = cache.len();
        let (rope, mask) = match attention_mask {
            Some(m) => {
                check_dims("attention_mask", m, &[b, past + s])?;
                let positions: Vec<Vec<u32>> = positions_from_mask(m)?
                    .into_iter()
                    .map(|r| r[past..].to_vec())
                    .collect();
                (
                    self.rope_tables(&positions)?,
                    Some(mask::causal_padded(m, s, self.dtype())?),
                )
            }
            None => {
                let causal = (s > 1)
                    .then(|| mask::causal(s, past + s, self.dtype(), self.device()))
                    .transpose()?;
                (self.rope_tables_for_range(past, s)?, causal)
            }
        };
        let mut x = self.embed(input_ids)?;
        for (i, layer) in self.layers.iter().enumerate() {
            let (q, k, v) = layer
                .self_attn
                .qkv(&layer.input_layernorm.forward(&x)?, &rope)?;
            let (k, v) = cache.append(i, &k, &v)?;
            let h = (&x + layer.self_attn.attend(&q, &k, &v, mask.as_ref())?)?;
            x = layer.finish(&h)?;
        }
        cache.advance(s);
        self.lm_head(&self.final_norm(&x)?)
    }

    /// An empty contiguous cache sized for this model.
    pub fn new_cache(&self) -> KvCache {
        KvCache::new(self.layers.len())
    }
}

fn check_dims(what: &str, t: &Tensor, expected: &[usize]) -> Result<()> {
    if t.dims() != expected {
        return Err(Error::Input(format!(
            "{what} has shape {:?}, expected {expected:?}",
            t.dims()
        )));
    }
    Ok(())
}

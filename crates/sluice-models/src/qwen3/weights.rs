//! The Qwen3 tensor roster: every tensor of the checkpoint resolved once at load into typed
//! handles, with dtype and shape checked against the config. A checkpoint that contradicts its
//! config fails here with the shard file and tensor named; the forward pass never formats a name
//! or looks one up.
//!
//! Names follow transformers' `Qwen3ForCausalLM` state dict:
//!
//! | tensor | shape |
//! |---|---|
//! | `model.embed_tokens.weight` | `[vocab, d]` |
//! | `model.layers.{i}.input_layernorm.weight` | `[d]` |
//! | `model.layers.{i}.self_attn.{q,k,v,o}_proj.weight` | `[H·hd, d]`, `[KV·hd, d]` ×2, `[d, H·hd]` |
//! | `model.layers.{i}.self_attn.{q,k}_norm.weight` | `[hd]` (one RMSNorm shared by all heads) |
//! | `model.layers.{i}.post_attention_layernorm.weight` | `[d]` |
//! | `model.layers.{i}.mlp.{gate,up,down}_proj.weight` | `[I, d]` ×2, `[d, I]` |
//! | `model.norm.weight` | `[d]` |
//! | `lm_head.weight` | `[vocab, d]`, absent when `tie_word_embeddings` |
//!
//! Matrices may be BF16, F32 or row-int8 with an F16 `NAME_scale` per row (`sluice convert`,
//! docs/INT8.md), widened inside the matmul kernel; norm weights are widened to f32 once here.

use super::config::Qwen3Config;
use crate::ModelError;
use sluice_checkpoint::{Checkpoint, CheckpointError, TensorEntry};
use sluice_core::{bf16_to_f32, DType};
use sluice_kernels::WeightFormat;

/// A resolved weight matrix `[rows, cols]` (PyTorch `Linear` layout `[out, in]`): the weight
/// handle every family shares.
pub use crate::linear::Linear;

/// One layer's attention (`Qwen3Attention`; Qwen3-MoE's `Qwen3MoeAttention` is the same).
#[derive(Debug)]
pub struct AttnWeights {
    pub(crate) q_proj: Linear,
    pub(crate) k_proj: Linear,
    pub(crate) v_proj: Linear,
    pub(crate) o_proj: Linear,
    /// Per-head RMSNorm weights `[head_dim]` (`Qwen3Attention.q_norm` / `k_norm`).
    pub(crate) q_norm: Vec<f32>,
    pub(crate) k_norm: Vec<f32>,
}

impl AttnWeights {
    /// Resolves `{p}.self_attn.*` for the shapes `c` gives.
    pub(crate) fn load(r: &Roster<'_>, p: &str, c: &Qwen3Config) -> Result<Self, ModelError> {
        let (d, hd) = (c.hidden_size, c.head_dim);
        Ok(Self {
            q_proj: r.mat(&format!("{p}.self_attn.q_proj.weight"), c.q_width(), d)?,
            k_proj: r.mat(&format!("{p}.self_attn.k_proj.weight"), c.kv_width(), d)?,
            v_proj: r.mat(&format!("{p}.self_attn.v_proj.weight"), c.kv_width(), d)?,
            o_proj: r.mat(&format!("{p}.self_attn.o_proj.weight"), d, c.q_width())?,
            q_norm: r.vec(&format!("{p}.self_attn.q_norm.weight"), hd)?,
            k_norm: r.vec(&format!("{p}.self_attn.k_norm.weight"), hd)?,
        })
    }

    /// The four projections, in the order a pass reads them.
    pub(crate) fn mats(&self) -> [&Linear; 4] {
        [&self.q_proj, &self.k_proj, &self.v_proj, &self.o_proj]
    }

    /// Bytes of the f32 vectors kept whatever the spine placement (the q/k norms).
    pub(crate) fn small_bytes(&self) -> u64 {
        (self.q_norm.len() + self.k_norm.len()) as u64 * 4
    }

    /// Bytes of the four projections in the checkpoint.
    pub(crate) fn byte_len(&self) -> u64 {
        [&self.q_proj, &self.k_proj, &self.v_proj, &self.o_proj].iter().map(|m| m.byte_len()).sum()
    }
}

/// One decoder layer (`Qwen3DecoderLayer`).
#[derive(Debug)]
pub struct LayerWeights {
    pub(crate) input_norm: Vec<f32>,
    pub(crate) post_norm: Vec<f32>,
    pub(crate) attn: AttnWeights,
    pub(crate) gate: Linear,
    pub(crate) up: Linear,
    pub(crate) down: Linear,
}

/// Every tensor of the model.
#[derive(Debug)]
pub struct Qwen3Weights {
    pub(crate) embed: Linear,
    /// `lm_head.weight`, or the embedding again when tied.
    pub(crate) lm_head: Linear,
    pub(crate) norm: Vec<f32>,
    pub(crate) layers: Vec<LayerWeights>,
}

impl Qwen3Weights {
    /// Resolves and checks every tensor the config names.
    pub fn load(ckpt: &Checkpoint, c: &Qwen3Config) -> Result<Self, ModelError> {
        let r = Roster { ckpt, prefix: ckpt.name_prefix() };
        let (d, inter) = (c.hidden_size, c.intermediate_size);
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let p = format!("model.layers.{i}");
            layers.push(LayerWeights {
                input_norm: r.vec(&format!("{p}.input_layernorm.weight"), d)?,
                post_norm: r.vec(&format!("{p}.post_attention_layernorm.weight"), d)?,
                attn: AttnWeights::load(&r, &p, c)?,
                gate: r.mat(&format!("{p}.mlp.gate_proj.weight"), inter, d)?,
                up: r.mat(&format!("{p}.mlp.up_proj.weight"), inter, d)?,
                down: r.mat(&format!("{p}.mlp.down_proj.weight"), d, inter)?,
            });
        }
        let (embed, lm_head, norm) = r.ends(c.vocab_size, d, c.tie_word_embeddings)?;
        Ok(Self { embed, lm_head, norm, layers })
    }

    /// Bytes of the weight matrices in the checkpoint (a tied lm_head counted once; the norm
    /// vectors, widened to f32 at load, are not included).
    pub fn byte_len(&self, tied: bool) -> u64 {
        let layer: u64 = self
            .layers
            .iter()
            .map(|l| {
                l.attn.byte_len()
                    + [&l.gate, &l.up, &l.down].iter().map(|m| m.byte_len()).sum::<u64>()
            })
            .sum();
        layer + self.embed.byte_len() + if tied { 0 } else { self.lm_head.byte_len() }
    }
}

/// Names a checkpoint error after `family`: what a family's `load` maps its roster errors
/// through.
pub(crate) fn in_family(family: &'static str) -> impl Fn(ModelError) -> ModelError {
    move |e| match e {
        ModelError::Checkpoint(source) => ModelError::FamilyTensor { family, source },
        e => e,
    }
}

/// Name lookups with the checkpoint's prefix and errors that name the shard file and tensor
/// (shared with Qwen3-MoE, whose dense tensors are Qwen3's).
pub(crate) struct Roster<'a> {
    pub(crate) ckpt: &'a Checkpoint,
    pub(crate) prefix: &'a str,
}

impl Roster<'_> {
    pub(crate) fn entry(&self, name: &str) -> Result<&TensorEntry, ModelError> {
        Ok(self.ckpt.tensor(&format!("{}{name}", self.prefix))?)
    }

    pub(crate) fn shape_err(&self, name: &str, e: &TensorEntry, expected: &[usize]) -> ModelError {
        ModelError::Checkpoint(CheckpointError::ShapeMismatch {
            file: self.ckpt.shard_file(e).to_path_buf(),
            tensor: format!("{}{name}", self.prefix),
            expected: expected.iter().map(|&v| v as u64).collect(),
            got: e.shape.clone(),
        })
    }

    fn dtype_err(&self, name: &str, e: &TensorEntry) -> ModelError {
        ModelError::Checkpoint(CheckpointError::DTypeMismatch {
            file: self.ckpt.shard_file(e).to_path_buf(),
            tensor: format!("{}{name}", self.prefix),
            expected: DType::BF16,
            got: e.dtype,
        })
    }

    /// A BF16, F32 or row-int8 (I8 with its `NAME_scale` F16 `[rows]`) matrix of exactly
    /// `[rows, cols]`.
    pub(crate) fn mat(&self, name: &str, rows: usize, cols: usize) -> Result<Linear, ModelError> {
        let e = self.entry(name)?;
        let format = match e.dtype {
            DType::BF16 => WeightFormat::Bf16,
            DType::F32 => WeightFormat::F32,
            DType::I8 => WeightFormat::Int8Row,
            _ => return Err(self.dtype_err(name, e)),
        };
        if e.shape != [rows as u64, cols as u64] {
            return Err(self.shape_err(name, e, &[rows, cols]));
        }
        let scale = if format == WeightFormat::Int8Row {
            let scale =
                format!("{}{name}{}", self.prefix, sluice_checkpoint::convert::SCALE_SUFFIX);
            Some(self.ckpt.expect(&scale, DType::F16, &[rows as u64])?.clone())
        } else {
            None
        };
        Ok(Linear::new(e.clone(), scale, rows, cols, format))
    }

    /// The two ends of the decoder stack, in this order: the embedding
    /// (`model.embed_tokens.weight` `[vocab, d]`), the lm_head and the final norm
    /// (`model.norm.weight` `[d]`). Qwen3ForCausalLM._tied_weights_keys (and every family that
    /// ties): with `tied` the lm_head *is* the embedding, whether or not a stale
    /// `lm_head.weight` was saved alongside it.
    pub(crate) fn ends(
        &self,
        vocab: usize,
        d: usize,
        tied: bool,
    ) -> Result<(Linear, Linear, Vec<f32>), ModelError> {
        let embed = self.mat("model.embed_tokens.weight", vocab, d)?;
        let lm_head = if tied { embed.clone() } else { self.mat("lm_head.weight", vocab, d)? };
        Ok((embed, lm_head, self.vec("model.norm.weight", d)?))
    }

    /// A BF16 or F32 vector of `len` values, widened to f32.
    pub(crate) fn vec(&self, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
        let e = self.entry(name)?;
        if e.shape != [len as u64] {
            return Err(self.shape_err(name, e, &[len]));
        }
        self.vec_of(name, e)
    }

    /// The values of the BF16 or F32 tensor `e` (called `name`), whatever its shape, widened
    /// to f32 in storage order.
    pub(crate) fn vec_of(&self, name: &str, e: &TensorEntry) -> Result<Vec<f32>, ModelError> {
        let b = self.ckpt.bytes(e);
        let v = match e.dtype {
            DType::BF16 => Ok(b
                .chunks_exact(2)
                .map(|c| bf16_to_f32(u16::from_le_bytes([c[0], c[1]])))
                .collect()),
            DType::F32 => Ok(b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()),
            _ => Err(self.dtype_err(name, e)),
        }?;
        crate::finite::checked(self.ckpt, e, v)
    }
}

//! The GPT-OSS tensor roster: every tensor of the checkpoint resolved once at load into typed
//! handles, with dtype and shape checked against the config. A checkpoint that contradicts its
//! config, or lacks a tensor (an expert's `*_scales`, say), fails here with the family, the
//! tensor and the shard file named.
//!
//! Names and formats are those of the published gpt-oss-20b / 120b files:
//!
//! | tensor | dtype, shape |
//! |---|---|
//! | `model.embed_tokens.weight`, `lm_head.weight` | bf16 `[vocab, d]` |
//! | `model.layers.{i}.{input,post_attention}_layernorm.weight`, `model.norm.weight` | bf16 `[d]` |
//! | `model.layers.{i}.self_attn.{q,k,v,o}_proj.{weight,bias}` | bf16 `[H·hd, d]`, `[KV·hd, d]` ×2, `[d, H·hd]` (+ `[rows]`) |
//! | `model.layers.{i}.self_attn.sinks` | bf16/f32 `[H]` |
//! | `model.layers.{i}.mlp.router.{weight,bias}` | bf16 `[E, d]`, `[E]` |
//! | `model.layers.{i}.mlp.experts.gate_up_proj_blocks` | U8 `[E, 2I, d/32, 16]` |
//! | `model.layers.{i}.mlp.experts.gate_up_proj_scales` | U8 `[E, 2I, d/32]` (E8M0) |
//! | `model.layers.{i}.mlp.experts.gate_up_proj_bias` | bf16 `[E, 2I]` |
//! | `model.layers.{i}.mlp.experts.down_proj_{blocks,scales,bias}` | U8 `[E, d, I/32, 16]`, U8 `[E, d, I/32]`, bf16 `[E, d]` |
//!
//! MXFP4 as GPT-OSS packs it: rows are output features blocked along the input axis; byte `k` of
//! a 16-byte block holds element `2k` in its low nibble and `2k + 1` in its high nibble; value =
//! `E2M1[nibble] · 2^(scale − 127)`. Flattened per expert that is `[out, in/2]` packed bytes and
//! `[out, in/32]` scales, exactly the layout of `sluice_kernels::Matrix::mxfp4`, so one expert's
//! matrices are kernel operands over the published bytes, no repacking. `gate_up` rows interleave
//! gate (row `2j`) and up (row `2j + 1`).
//!
//! The expert store serves expert `e` as its slice of each stacked `*_blocks` / `*_scales`
//! tensor ([`GptOssExpertLayout`]: four parts, read as four spans when streamed); the expert
//! biases are small (`[E, 2I]`, `[E, d]`) and stay with the spine, widened to f32 at load.

use super::config::GptOssConfig;
use crate::qwen3::weights::{in_family, Linear, Roster};
use crate::{spine, ModelError};
use sluice_checkpoint::Checkpoint;
use sluice_core::DType;
use sluice_store::{ExpertLayout, ExpertPart, SpineIndex};

/// The family name errors carry.
pub(crate) const FAMILY: &str = "gpt_oss";

/// One layer's attention.
#[derive(Debug)]
pub struct AttnWeights {
    pub(crate) q_proj: Linear,
    pub(crate) k_proj: Linear,
    pub(crate) v_proj: Linear,
    pub(crate) o_proj: Linear,
    pub(crate) q_bias: Vec<f32>,
    pub(crate) k_bias: Vec<f32>,
    pub(crate) v_bias: Vec<f32>,
    pub(crate) o_bias: Vec<f32>,
    /// One sink logit per query head.
    pub(crate) sinks: Vec<f32>,
}

/// The layout of one GPT-OSS routed expert for the expert store: expert `e`'s slice of
/// `gate_up_proj_blocks`, `gate_up_proj_scales`, `down_proj_blocks`, `down_proj_scales`.
#[derive(Debug, Clone, Copy)]
pub struct GptOssExpertLayout {
    /// `num_local_experts`.
    pub experts: u64,
    /// `intermediate_size`.
    pub inter: u64,
    /// `hidden_size`.
    pub hidden: u64,
}

impl GptOssExpertLayout {
    /// Bytes of one expert (packed values and scales of both matrices).
    pub fn expert_bytes(&self) -> u64 {
        let (i, d) = (self.inter, self.hidden);
        (2 * i * d + d * i) / 2 + (2 * i * d + d * i) / 32
    }
}

impl ExpertLayout for GptOssExpertLayout {
    fn parts(&self, layer: usize, expert: usize) -> Vec<ExpertPart> {
        let p = format!("model.layers.{layer}.mlp.experts");
        let (e, i, d) = (self.experts, self.inter, self.hidden);
        let (gu, dn) = ([e, 2 * i, d / 32], [e, d, i / 32]);
        let part = |name: &str, shape: &[u64]| {
            ExpertPart::stacked(format!("{p}.{name}"), DType::U8, shape, expert as u64)
        };
        vec![
            part("gate_up_proj_blocks", &[gu[0], gu[1], gu[2], 16]),
            part("gate_up_proj_scales", &gu),
            part("down_proj_blocks", &[dn[0], dn[1], dn[2], 16]),
            part("down_proj_scales", &dn),
        ]
    }
}

/// One layer's router and experts.
#[derive(Debug)]
pub struct MoeWeights {
    pub(crate) router: Linear,
    pub(crate) router_bias: Vec<f32>,
    /// `[E · 2I]`, interleaving gate and up like the `gate_up` rows.
    pub(crate) gate_up_bias: Vec<f32>,
    /// `[E · d]`.
    pub(crate) down_bias: Vec<f32>,
}

/// One decoder layer.
#[derive(Debug)]
pub struct LayerWeights {
    pub(crate) input_norm: Vec<f32>,
    pub(crate) post_norm: Vec<f32>,
    pub(crate) attn: AttnWeights,
    pub(crate) moe: MoeWeights,
}

/// Every tensor of the model.
#[derive(Debug)]
pub struct GptOssWeights {
    pub(crate) embed: Linear,
    pub(crate) lm_head: Linear,
    pub(crate) norm: Vec<f32>,
    pub(crate) layers: Vec<LayerWeights>,
}

impl GptOssWeights {
    /// Resolves and checks every tensor the config names.
    pub fn load(ckpt: &Checkpoint, c: &GptOssConfig) -> Result<Self, ModelError> {
        Self::load_inner(ckpt, c).map_err(in_family(FAMILY))
    }

    fn load_inner(ckpt: &Checkpoint, c: &GptOssConfig) -> Result<Self, ModelError> {
        let r = Roster { ckpt, prefix: ckpt.name_prefix() };
        let (d, e, inter) = (c.hidden_size, c.num_local_experts, c.intermediate_size);
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let a = format!("{p}.self_attn");
            let attn = AttnWeights {
                q_proj: r.mat(&format!("{a}.q_proj.weight"), c.q_width(), d)?,
                k_proj: r.mat(&format!("{a}.k_proj.weight"), c.kv_width(), d)?,
                v_proj: r.mat(&format!("{a}.v_proj.weight"), c.kv_width(), d)?,
                o_proj: r.mat(&format!("{a}.o_proj.weight"), d, c.q_width())?,
                q_bias: r.vec(&format!("{a}.q_proj.bias"), c.q_width())?,
                k_bias: r.vec(&format!("{a}.k_proj.bias"), c.kv_width())?,
                v_bias: r.vec(&format!("{a}.v_proj.bias"), c.kv_width())?,
                o_bias: r.vec(&format!("{a}.o_proj.bias"), d)?,
                sinks: r.vec(&format!("{a}.sinks"), c.num_attention_heads)?,
            };
            let x = format!("{p}.mlp.experts");
            let router = r.mat(&format!("{p}.mlp.router.weight"), e, d)?;
            let router_bias = r.vec(&format!("{p}.mlp.router.bias"), e)?;
            // The stacked expert tensors are checked here, in roster order, so a missing
            // `*_scales` is named like any other tensor; the store slices them per expert.
            mxfp4(&r, &format!("{x}.gate_up_proj"), e, 2 * inter, d)?;
            let gate_up_bias = matrix_vec(&r, &format!("{x}.gate_up_proj_bias"), e, 2 * inter)?;
            mxfp4(&r, &format!("{x}.down_proj"), e, d, inter)?;
            let down_bias = matrix_vec(&r, &format!("{x}.down_proj_bias"), e, d)?;
            let moe = MoeWeights { router, router_bias, gate_up_bias, down_bias };
            layers.push(LayerWeights {
                input_norm: r.vec(&format!("{p}.input_layernorm.weight"), d)?,
                post_norm: r.vec(&format!("{p}.post_attention_layernorm.weight"), d)?,
                attn,
                moe,
            });
        }
        let (embed, lm_head, norm) = r.ends(c.vocab_size, d, c.tie_word_embeddings)?;
        Ok(Self { embed, lm_head, norm, layers })
    }

    /// Bytes of the non-expert weight matrices a pass reads (attention, routers, embedding, an
    /// untied lm_head).
    pub fn dense_byte_len(&self, tied: bool) -> u64 {
        let layer: u64 = self
            .layers
            .iter()
            .map(|l| {
                [&l.attn.q_proj, &l.attn.k_proj, &l.attn.v_proj, &l.attn.o_proj, &l.moe.router]
                    .iter()
                    .map(|m| m.byte_len())
                    .sum::<u64>()
            })
            .sum();
        layer + self.embed.byte_len() + if tied { 0 } else { self.lm_head.byte_len() }
    }
}

impl GptOssWeights {
    /// The spine pieces in pass order (embedding; per layer its attention projections and
    /// router; the head) over `ckpt`'s shards, for placing the spine piece by piece.
    pub fn spine_index(&self, ckpt: &Checkpoint) -> Result<SpineIndex, ModelError> {
        let layers = self
            .layers
            .iter()
            .map(|l| {
                let a = &l.attn;
                [&a.q_proj, &a.k_proj, &a.v_proj, &a.o_proj, &l.moe.router]
                    .into_iter()
                    .flat_map(spine::ranges)
                    .collect()
            })
            .collect();
        spine::index(ckpt, &self.embed, layers, &self.lm_head)
    }

    /// Bytes of the f32 vectors the model keeps whatever the spine placement: norms,
    /// attention biases and sinks, router and expert biases.
    pub fn small_bytes(&self) -> u64 {
        let f = |v: &Vec<f32>| v.len() as u64 * 4;
        let layers: u64 = self
            .layers
            .iter()
            .map(|l| {
                let (a, m) = (&l.attn, &l.moe);
                f(&l.input_norm)
                    + f(&l.post_norm)
                    + [&a.q_bias, &a.k_bias, &a.v_bias, &a.o_bias, &a.sinks]
                        .map(f)
                        .iter()
                        .sum::<u64>()
                    + f(&m.router_bias)
                    + f(&m.gate_up_bias)
                    + f(&m.down_bias)
            })
            .sum();
        layers + f(&self.norm)
    }
}

/// Checks `{p}_blocks` U8 `[E, rows, cols/32, 16]` and `{p}_scales` U8 `[E, rows, cols/32]`.
fn mxfp4(r: &Roster<'_>, p: &str, e: usize, rows: usize, cols: usize) -> Result<(), ModelError> {
    let (e64, r64, b64) = (e as u64, rows as u64, (cols / 32) as u64);
    let name = |s: &str| format!("{}{p}_{s}", r.prefix);
    // Located, not mapped: a stream install's routed experts are holes its checkpoint does not map.
    r.ckpt.locate(&name("blocks"), DType::U8, &[e64, r64, b64, 16])?;
    r.ckpt.locate(&name("scales"), DType::U8, &[e64, r64, b64])?;
    Ok(())
}

/// A bf16/f32 `[e, n]` tensor widened to f32, row-major.
fn matrix_vec(r: &Roster<'_>, name: &str, e: usize, n: usize) -> Result<Vec<f32>, ModelError> {
    let entry = r.entry(name)?;
    if entry.shape != [e as u64, n as u64] {
        return Err(r.shape_err(name, entry, &[e, n]));
    }
    // The same widening as a vector of e·n values.
    r.vec_of(name, entry)
}

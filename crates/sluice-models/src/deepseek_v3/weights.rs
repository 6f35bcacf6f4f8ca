//! The DeepSeek-V3 family's tensor roster: every tensor resolved once at load into typed handles,
//! dtype and shape checked against the config (an FP8 weight's `weight_scale_inv` against the
//! weight's own shape, an INT4 weight's `weight_shape` against the config), and the expert count
//! of every MoE layer checked against `n_routed_experts`. Errors name the family, the tensor and
//! the shard file.
//!
//! | tensor | published dtype, shape |
//! |---|---|
//! | `model.embed_tokens.weight`, `lm_head.weight` | bf16 `[vocab, d]` |
//! | `model.layers.{i}.{input,post_attention}_layernorm.weight`, `model.norm.weight` | bf16 `[d]` |
//! | `…self_attn.q_a_proj` / `q_b_proj` (or `q_proj` without q LoRA) | `[q_lora, d]`, `[H·(nope+rope), q_lora]` |
//! | `…self_attn.{q_a,kv_a}_layernorm.weight` | bf16 `[q_lora]`, `[kv_lora]` |
//! | `…self_attn.kv_a_proj_with_mqa` | `[kv_lora + rope, d]` |
//! | `…self_attn.kv_b_proj` | `[H·(nope + v), kv_lora]` |
//! | `…self_attn.o_proj` | `[d, H·v]` |
//! | `…mlp.{gate,up,down}_proj` (dense layers) | `[I, d]` ×2, `[d, I]` |
//! | `…mlp.gate.weight`, `…mlp.gate.e_score_correction_bias` | bf16 `[E, d]`, F32 `[E]` |
//! | `…mlp.experts.{e}.{gate,up,down}_proj`, `…mlp.shared_experts.{…}` | `[I_moe, d]` ×2, `[d, I_moe]` |
//!
//! Each linear layer `P` is stored one of three ways, told apart by its tensors: `P.weight` in
//! bf16 / f32 (or sluice's row-int8); `P.weight` FP8 e4m3 with `P.weight_scale_inv`; or
//! `P.weight_packed` / `P.weight_scale` / `P.weight_shape` (INT4). See [`super::quant`].

use super::config::DeepseekV3Config;
use super::experts::{same_format, ExpertFormat};
use super::quant::{Weight, FP8_BLOCK, INT4_GROUP};
use crate::qwen3::weights::{in_family, Linear, Roster};
use crate::{spine, ModelError};
use sluice_checkpoint::{Checkpoint, CheckpointError, TensorEntry};
use sluice_core::DType;
use sluice_store::spine::TensorRange;
use sluice_store::SpineIndex;

/// An MLP (dense, routed expert or the shared experts): `down(silu(gate x) · up x)`.
#[derive(Debug)]
pub struct Mlp {
    pub(crate) gate: Weight,
    pub(crate) up: Weight,
    pub(crate) down: Weight,
}

/// The q LoRA: `q_b_proj(q_a_layernorm(q_a_proj x))`.
#[derive(Debug)]
pub struct QLora {
    pub(crate) a: Weight,
    /// `q_a_layernorm.weight`.
    pub(crate) norm: Vec<f32>,
    pub(crate) b: Weight,
}

/// The q path: through the q LoRA or one projection.
#[derive(Debug)]
pub enum QProj {
    /// `q_b_proj(q_a_layernorm(q_a_proj x))`.
    Lora(Box<QLora>),
    /// `q_proj x` (`q_lora_rank` null).
    Plain(Box<Weight>),
}

/// One layer's MLA.
#[derive(Debug)]
pub struct AttnWeights {
    pub(crate) q: QProj,
    pub(crate) kv_a: Weight,
    pub(crate) kv_a_norm: Vec<f32>,
    pub(crate) kv_b: Weight,
    pub(crate) o_proj: Weight,
}

/// `DeepseekV3MoE`: router, routed and shared experts.
#[derive(Debug)]
pub struct MoeWeights {
    /// `mlp.gate.weight` `[E, d]`.
    pub(crate) router: Linear,
    /// `mlp.gate.e_score_correction_bias` `[E]`.
    pub(crate) bias: Vec<f32>,
    /// `mlp.shared_experts`.
    pub(crate) shared: Mlp,
}

/// The feed-forward half of a layer.
#[derive(Debug)]
pub enum Ffn {
    /// `DeepseekV3MLP` (the first `first_k_dense_replace` layers).
    Dense(Box<Mlp>),
    /// `DeepseekV3MoE`.
    Moe(Box<MoeWeights>),
}

/// One decoder layer.
#[derive(Debug)]
pub struct LayerWeights {
    pub(crate) input_norm: Vec<f32>,
    pub(crate) post_norm: Vec<f32>,
    pub(crate) attn: AttnWeights,
    pub(crate) ffn: Ffn,
}

/// Every tensor of the model.
#[derive(Debug)]
pub struct DeepseekV3Weights {
    pub(crate) embed: Linear,
    pub(crate) lm_head: Linear,
    pub(crate) norm: Vec<f32>,
    pub(crate) layers: Vec<LayerWeights>,
    /// How the routed experts are stored (`None` without MoE layers); the experts themselves
    /// are checked here and then served by the expert store (see [`super::experts`]).
    pub(crate) expert_format: Option<ExpertFormat>,
}

impl DeepseekV3Weights {
    /// Resolves and checks every tensor the config names.
    pub fn load(ckpt: &Checkpoint, c: &DeepseekV3Config) -> Result<Self, ModelError> {
        Self::load_inner(ckpt, c).map_err(in_family(c.model_type))
    }

    fn load_inner(ckpt: &Checkpoint, c: &DeepseekV3Config) -> Result<Self, ModelError> {
        let r = Roster { ckpt, prefix: ckpt.name_prefix() };
        let d = c.hidden_size;
        let h = c.num_attention_heads;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        let mut expert_format = None;
        for i in 0..c.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let a = format!("{p}.self_attn");
            let q_rows = h * c.qk_head_dim();
            let q = match c.q_lora_rank {
                Some(ql) => QProj::Lora(Box::new(QLora {
                    a: linear(&r, &format!("{a}.q_a_proj"), ql, d, true)?,
                    norm: r.vec(&format!("{a}.q_a_layernorm.weight"), ql)?,
                    b: linear(&r, &format!("{a}.q_b_proj"), q_rows, ql, true)?,
                })),
                None => {
                    QProj::Plain(Box::new(linear(&r, &format!("{a}.q_proj"), q_rows, d, true)?))
                }
            };
            let kl = c.kv_lora_rank;
            let attn = AttnWeights {
                q,
                kv_a: linear(
                    &r,
                    &format!("{a}.kv_a_proj_with_mqa"),
                    kl + c.qk_rope_head_dim,
                    d,
                    true,
                )?,
                kv_a_norm: r.vec(&format!("{a}.kv_a_layernorm.weight"), kl)?,
                kv_b: linear(
                    &r,
                    &format!("{a}.kv_b_proj"),
                    h * (c.qk_nope_head_dim + c.v_head_dim),
                    kl,
                    true,
                )?,
                o_proj: linear(&r, &format!("{a}.o_proj"), d, h * c.v_head_dim, true)?,
            };
            let ffn = if c.is_moe(i) {
                check_expert_count(&r, &p, c)?;
                let e = c.n_routed_experts;
                for x in 0..e {
                    let ep = format!("{p}.mlp.experts.{x}");
                    let m = expert_mlp(&r, &ep, c.moe_intermediate_size, d)?;
                    for (w, proj) in
                        [(&m.gate, "gate_proj"), (&m.up, "up_proj"), (&m.down, "down_proj")]
                    {
                        let f = expert_format_of(&r, w, &format!("{ep}.{proj}"))?;
                        same_format(&mut expert_format, f, &format!("{}{ep}.{proj}", r.prefix))?;
                    }
                }
                let shared_w = c.moe_intermediate_size * c.n_shared_experts;
                Ffn::Moe(Box::new(MoeWeights {
                    router: r.mat(&format!("{p}.mlp.gate.weight"), e, d)?,
                    bias: r.vec(&format!("{p}.mlp.gate.e_score_correction_bias"), e)?,
                    shared: mlp(&r, &format!("{p}.mlp.shared_experts"), shared_w, d)?,
                }))
            } else {
                Ffn::Dense(Box::new(mlp(&r, &format!("{p}.mlp"), c.intermediate_size, d)?))
            };
            layers.push(LayerWeights {
                input_norm: r.vec(&format!("{p}.input_layernorm.weight"), d)?,
                post_norm: r.vec(&format!("{p}.post_attention_layernorm.weight"), d)?,
                attn,
                ffn,
            });
        }
        let (embed, lm_head, norm) = r.ends(c.vocab_size, d, c.tie_word_embeddings)?;
        Ok(Self { embed, lm_head, norm, layers, expert_format })
    }

    /// Bytes of the weights a pass reads besides the routed experts (attention, dense MLPs,
    /// routers, shared experts, embedding, an untied lm_head), as stored.
    pub fn dense_byte_len(&self, tied: bool) -> u64 {
        let mlp_len = |m: &Mlp| m.gate.byte_len() + m.up.byte_len() + m.down.byte_len();
        let layer: u64 = self
            .layers
            .iter()
            .map(|l| {
                let a = &l.attn;
                let q = match &a.q {
                    QProj::Lora(l) => l.a.byte_len() + l.b.byte_len(),
                    QProj::Plain(w) => w.byte_len(),
                };
                q + a.kv_a.byte_len()
                    + a.kv_b.byte_len()
                    + a.o_proj.byte_len()
                    + match &l.ffn {
                        Ffn::Dense(m) => mlp_len(m),
                        Ffn::Moe(m) => m.router.byte_len() + mlp_len(&m.shared),
                    }
            })
            .sum();
        layer + self.embed.byte_len() + if tied { 0 } else { self.lm_head.byte_len() }
    }
}

impl DeepseekV3Weights {
    /// The spine pieces in pass order (embedding; per layer its attention, and its dense MLP
    /// or router and shared experts; the head) over `ckpt`'s shards, for placing the spine
    /// piece by piece.
    pub fn spine_index(&self, ckpt: &Checkpoint) -> Result<SpineIndex, ModelError> {
        let layers = self
            .layers
            .iter()
            .map(|l| {
                let a = &l.attn;
                let mut r: Vec<TensorRange> = match &a.q {
                    QProj::Lora(q) => [q.a.ranges(), q.b.ranges()].concat(),
                    QProj::Plain(w) => w.ranges(),
                };
                for w in [&a.kv_a, &a.kv_b, &a.o_proj] {
                    r.extend(w.ranges());
                }
                let m = match &l.ffn {
                    Ffn::Dense(m) => m,
                    Ffn::Moe(m) => {
                        r.extend(spine::ranges(&m.router));
                        &m.shared
                    }
                };
                for w in [&m.gate, &m.up, &m.down] {
                    r.extend(w.ranges());
                }
                r
            })
            .collect();
        spine::index(ckpt, &self.embed, layers, &self.lm_head)
    }

    /// Bytes of the f32 vectors the model keeps whatever the spine placement: norms, latent
    /// norms and routing biases.
    pub fn small_bytes(&self) -> u64 {
        let f = |v: &Vec<f32>| v.len() as u64 * 4;
        let layers: u64 = self
            .layers
            .iter()
            .map(|l| {
                let q = match &l.attn.q {
                    QProj::Lora(q) => f(&q.norm),
                    QProj::Plain(_) => 0,
                };
                let b = match &l.ffn {
                    Ffn::Moe(m) => f(&m.bias),
                    Ffn::Dense(_) => 0,
                };
                f(&l.input_norm) + f(&l.post_norm) + f(&l.attn.kv_a_norm) + q + b
            })
            .sum();
        layers + f(&self.norm)
    }

    /// The storage of the spine's projections (attention, dense MLPs, shared experts): its
    /// format's name when they all share one (`fp8`, `bf16`, ...), `mixed` otherwise. The
    /// embedding, head and routers are bf16 in every published checkpoint and are not counted.
    pub fn spine_format(&self, ckpt: &dyn spine::TensorBytes) -> &'static str {
        let mut names = Vec::new();
        let mut add = |w: &Weight| names.push(w.get(ckpt).format().name());
        for l in &self.layers {
            let a = &l.attn;
            match &a.q {
                QProj::Lora(q) => {
                    add(&q.a);
                    add(&q.b);
                }
                QProj::Plain(w) => add(w),
            }
            for w in [&a.kv_a, &a.kv_b, &a.o_proj] {
                add(w);
            }
            let m = match &l.ffn {
                Ffn::Dense(m) => m,
                Ffn::Moe(m) => &m.shared,
            };
            for w in [&m.gate, &m.up, &m.down] {
                add(w);
            }
        }
        match names.split_first() {
            Some((first, rest)) if rest.iter().all(|n| n == first) => first,
            Some(_) => "mixed",
            None => "bf16",
        }
    }
}

/// `{p}.{gate,up,down}_proj` of width `inter`.
fn mlp(r: &Roster<'_>, p: &str, inter: usize, d: usize) -> Result<Mlp, ModelError> {
    Ok(Mlp {
        gate: linear(r, &format!("{p}.gate_proj"), inter, d, true)?,
        up: linear(r, &format!("{p}.up_proj"), inter, d, true)?,
        down: linear(r, &format!("{p}.down_proj"), d, inter, true)?,
    })
}

/// A routed expert's projections, checked from the headers only: reading the block scales of
/// every expert at load would touch every expert's pages (tens of thousands of small reads on
/// a full model); a non-finite scale of a routed expert is caught by the logits check of the
/// first pass that uses it.
fn expert_mlp(r: &Roster<'_>, p: &str, inter: usize, d: usize) -> Result<Mlp, ModelError> {
    Ok(Mlp {
        gate: linear(r, &format!("{p}.gate_proj"), inter, d, false)?,
        up: linear(r, &format!("{p}.up_proj"), inter, d, false)?,
        down: linear(r, &format!("{p}.down_proj"), d, inter, false)?,
    })
}

/// How the checked routed-expert projection `w` (tensors `{p}.*`) is stored.
fn expert_format_of(r: &Roster<'_>, w: &Weight, p: &str) -> Result<ExpertFormat, ModelError> {
    Ok(match w {
        Weight::Fp8 { .. } => ExpertFormat::Fp8,
        Weight::Int4 { .. } => ExpertFormat::Int4,
        Weight::Mapped(l) => match l.entry().dtype {
            DType::BF16 => ExpertFormat::Bf16,
            DType::F32 => ExpertFormat::F32,
            _ => return Err(dtype_err(r, &format!("{p}.weight"), l.entry(), DType::BF16)),
        },
    })
}

fn dtype_err(r: &Roster<'_>, name: &str, e: &TensorEntry, expected: DType) -> ModelError {
    ModelError::Checkpoint(CheckpointError::DTypeMismatch {
        file: r.ckpt.shard_file(e).to_path_buf(),
        tensor: format!("{}{name}", r.prefix),
        expected,
        got: e.dtype,
    })
}

/// The entry of tensor `name` (without the checkpoint's prefix): a mapped one for a spine
/// weight; for a routed expert (`routed`) only located, never mapped, since a stream install's
/// routed experts are holes of its sparse shards that only the expert store reads.
fn entry<'r>(r: &'r Roster<'_>, name: &str, routed: bool) -> Result<&'r TensorEntry, ModelError> {
    if !routed {
        return r.entry(name);
    }
    let full = format!("{}{name}", r.prefix);
    r.ckpt.get(&full).ok_or_else(|| {
        ModelError::Checkpoint(CheckpointError::MissingTensor {
            dir: r.ckpt.dir().to_path_buf(),
            tensor: full,
        })
    })
}

/// The linear layer `p` of shape `[rows, cols]`, in whichever of the three storages it has.
/// `scan`: a spine weight, whose FP8 block scales are read to refuse a non-finite one at load;
/// otherwise a routed expert's, checked from the headers only (see [`entry`]).
fn linear(
    r: &Roster<'_>,
    p: &str,
    rows: usize,
    cols: usize,
    scan: bool,
) -> Result<Weight, ModelError> {
    let wname = format!("{p}.weight");
    let packed = format!("{p}.weight_packed");
    if r.ckpt.get(&format!("{}{wname}", r.prefix)).is_none()
        && r.ckpt.get(&format!("{}{packed}", r.prefix)).is_some()
    {
        return int4(r, p, rows, cols, !scan);
    }
    let e = entry(r, &wname, !scan)?;
    if e.dtype != DType::F8E4M3 && scan {
        return Ok(Weight::Mapped(r.mat(&wname, rows, cols)?));
    }
    if e.dtype != DType::F8E4M3 {
        // A bf16 / f32 routed expert, as `Roster::mat` checks a spine matrix.
        let format = match e.dtype {
            DType::BF16 => sluice_kernels::WeightFormat::Bf16,
            DType::F32 => sluice_kernels::WeightFormat::F32,
            _ => return Err(dtype_err(r, &wname, e, DType::BF16)),
        };
        if e.shape != [rows as u64, cols as u64] {
            return Err(r.shape_err(&wname, e, &[rows, cols]));
        }
        return Ok(Weight::Mapped(Linear::new(e.clone(), None, rows, cols, format)));
    }
    if e.shape != [rows as u64, cols as u64] {
        return Err(r.shape_err(&wname, e, &[rows, cols]));
    }
    // The block scales follow the weight's own shape: a scale tensor whose shape contradicts
    // it would silently apply the wrong scale to every block past the first row/column.
    let sname = format!("{p}.weight_scale_inv");
    let s = entry(r, &sname, !scan)?;
    if s.dtype != DType::F32 {
        return Err(dtype_err(r, &sname, s, DType::F32));
    }
    let (bm, bn) = (rows.div_ceil(FP8_BLOCK), cols.div_ceil(FP8_BLOCK));
    if s.shape != [bm as u64, bn as u64] {
        return Err(r.shape_err(&sname, s, &[bm, bn]));
    }
    // A NaN or infinite block scale would poison a whole block; name the scale tensor. (The
    // scales are 1/16384 of the weight's bytes; the weights themselves are not scanned at load,
    // a NaN code among them is caught by the logits check of the first pass that uses it.)
    if scan {
        r.vec_of(&sname, s)?;
    }
    Ok(Weight::Fp8 { weight: e.clone(), scale: s.clone(), rows, cols })
}

/// A compressed-tensors pack-quantized INT4 linear layer (a routed expert's when `routed`: its
/// packed weight and scales located, not mapped; its small `weight_shape` is always read).
fn int4(
    r: &Roster<'_>,
    p: &str,
    rows: usize,
    cols: usize,
    routed: bool,
) -> Result<Weight, ModelError> {
    let packed = format!("{p}.weight_packed");
    let e = entry(r, &packed, routed)?;
    if e.dtype != DType::I32 {
        return Err(dtype_err(r, &packed, e, DType::I32));
    }
    if !cols.is_multiple_of(INT4_GROUP) || e.shape != [rows as u64, (cols / 8) as u64] {
        return Err(r.shape_err(&packed, e, &[rows, cols / 8]));
    }
    let sname = format!("{p}.weight_scale");
    let s = entry(r, &sname, routed)?;
    if s.dtype != DType::BF16 {
        return Err(dtype_err(r, &sname, s, DType::BF16));
    }
    if s.shape != [rows as u64, (cols / INT4_GROUP) as u64] {
        return Err(r.shape_err(&sname, s, &[rows, cols / INT4_GROUP]));
    }
    // `weight_shape` holds the unpacked shape: I32 in the published files, I64 as
    // compressed-tensors writes it.
    let shname = format!("{p}.weight_shape");
    let sh = r.entry(&shname)?;
    let b = r.ckpt.bytes(sh);
    let dims: Vec<u64> = match sh.dtype {
        DType::I32 => b
            .chunks_exact(4)
            .map(|c| u64::try_from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])).unwrap_or(0))
            .collect(),
        DType::I64 => b
            .chunks_exact(8)
            .map(|c| {
                let a: [u8; 8] = c.try_into().unwrap_or([0; 8]);
                u64::try_from(i64::from_le_bytes(a)).unwrap_or(0)
            })
            .collect(),
        _ => return Err(dtype_err(r, &shname, sh, DType::I32)),
    };
    if dims != [rows as u64, cols as u64] {
        return Err(ModelError::Config(format!(
            "{}{shname} says [{}] but the config implies [{rows}, {cols}] ({})",
            r.prefix,
            dims.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
            r.ckpt.shard_file(sh).display()
        )));
    }
    Ok(Weight::Int4 { packed: e.clone(), scale: s.clone(), extra: sh.len, rows, cols })
}

/// Refuses a layer whose experts are not exactly `0 .. n_routed_experts` (too few: a missing
/// tensor; too many: experts the router can never pick, which means the config is wrong).
fn check_expert_count(r: &Roster<'_>, p: &str, c: &DeepseekV3Config) -> Result<(), ModelError> {
    let has = |e: usize| {
        let base = format!("{}{p}.mlp.experts.{e}.gate_proj", r.prefix);
        r.ckpt.get(&format!("{base}.weight")).is_some()
            || r.ckpt.get(&format!("{base}.weight_packed")).is_some()
    };
    let n = c.n_routed_experts;
    let present = (0..=n).take_while(|&e| has(e)).count();
    if present == n {
        return Ok(());
    }
    let (what, e) = if present < n { ("is missing", present) } else { ("exists", n) };
    Err(ModelError::Config(format!(
        "{}: config.json says n_routed_experts = {n} but expert {e} of {p} {what} in the \
         checkpoint (tensor {}{p}.mlp.experts.{e}.gate_proj.*)",
        c.model_type, r.prefix
    )))
}

//! Synthetic Kimi K3 checkpoints in the published layout (K3.md §3): `config.json` in the
//! multimodal form with `text_config`, one shard per layer plus a last shard for the globals,
//! named `model-{i:05}-of-{n:06}.safetensors`, tensor names under `language_model.`, MXFP4
//! experts (six tensors back to back), F32 KDA small tensors, BF16 elsewhere. Values are
//! random but deterministic from a seed, at any scale: the built-in demo model is tiny; a K3
//! "slice" keeps K3's real per-layer dimensions with fewer layers and experts.

use super::config::{AttnKind, K3Config};
use super::expert_tensor_names;
use crate::ModelError;
use serde_json::{json, Value};
use sluice_checkpoint::{write_index, write_json_atomic, ShardWriter, TensorSpec};
use sluice_core::{f32_to_bf16_rne, DType};
use std::collections::BTreeMap;
use std::path::Path;

/// Deterministic SplitMix64 stream.
#[derive(Debug, Clone)]
pub struct SplitMix(u64);

impl SplitMix {
    /// A stream from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        #[allow(clippy::cast_precision_loss)]
        let u = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        2.0 * u - 1.0
    }
}

/// How a tensor's values are drawn.
#[derive(Debug, Clone, Copy)]
enum Init {
    /// Uniform ±a.
    Uniform(f32),
    /// 1 ± a (norm weights).
    AroundOne(f32),
    /// `ln(U(1, 16))` for the first `n` entries, zeros after (A_log padding).
    ALog(usize),
    /// Random nibbles.
    Packed,
    /// E8M0 scales uniformly in `lo..=hi`.
    Scale(u8, u8),
    /// Uniform ±a, with rows from `quiet_from` on (reserved special tokens) scaled by 1/20 so
    /// random weights rarely pick them, like untrained rows of a real model.
    Head { a: f32, cols: usize, quiet_from: usize },
}

struct Tensor {
    name: String,
    dtype: DType,
    shape: Vec<u64>,
    init: Init,
}

fn t(name: String, dtype: DType, shape: &[usize], init: Init) -> Tensor {
    Tensor { name, dtype, shape: shape.iter().map(|&s| s as u64).collect(), init }
}

fn lin(name: String, rows: usize, cols: usize) -> Tensor {
    #[allow(clippy::cast_precision_loss)]
    let a = (3.0 / cols as f32).sqrt();
    t(name, DType::BF16, &[rows, cols], Init::Uniform(a))
}

fn norm(name: String, n: usize) -> Tensor {
    t(name, DType::BF16, &[n], Init::AroundOne(0.1))
}

/// The tensors of layer `i`, in storage order.
fn layer_tensors(c: &K3Config, i: usize) -> Vec<Tensor> {
    let p = format!("language_model.model.layers.{i}");
    let d = c.hidden_size;
    let mut v = vec![
        norm(format!("{p}.input_layernorm.weight"), d),
        norm(format!("{p}.post_attention_layernorm.weight"), d),
    ];
    if c.attn_res_block_size.is_some() {
        for s in ["self_attention_res", "mlp_res"] {
            v.push(norm(format!("{p}.{s}_norm.weight"), d));
            v.push(t(format!("{p}.{s}_proj.weight"), DType::BF16, &[1, d], Init::Uniform(0.5)));
        }
    }
    let a = format!("{p}.self_attn");
    match c.attn_kind(i) {
        AttnKind::Kda => {
            let la = &c.linear_attn_config;
            let pw = c.kda_proj();
            let k = la.short_conv_kernel_size;
            for n in ["q", "k", "v"] {
                v.push(lin(format!("{a}.{n}_proj.weight"), pw, d));
            }
            for n in ["q", "k", "v"] {
                v.push(t(
                    format!("{a}.{n}_conv1d.weight"),
                    DType::F32,
                    &[pw, 1, k],
                    Init::Uniform(0.5),
                ));
            }
            v.push(lin(format!("{a}.f_a_proj.weight"), la.head_dim, d));
            v.push(lin(format!("{a}.f_b_proj.weight"), pw, la.head_dim));
            v.push(lin(format!("{a}.b_proj.weight"), la.num_heads, d));
            let a_len = la.num_heads.max(la.head_dim);
            v.push(t(format!("{a}.A_log"), DType::F32, &[a_len], Init::ALog(la.num_heads)));
            v.push(t(format!("{a}.dt_bias"), DType::F32, &[pw], Init::Uniform(1.0)));
            v.push(t(
                format!("{a}.o_norm.weight"),
                DType::F32,
                &[la.head_dim],
                Init::AroundOne(0.1),
            ));
            v.push(lin(format!("{a}.g_proj.weight"), pw, d));
            v.push(lin(format!("{a}.o_proj.weight"), d, pw));
        }
        AttnKind::Mla => {
            let h = c.num_attention_heads;
            v.push(lin(format!("{a}.q_a_proj.weight"), c.q_lora_rank, d));
            v.push(norm(format!("{a}.q_a_layernorm.weight"), c.q_lora_rank));
            v.push(lin(format!("{a}.q_b_proj.weight"), h * c.mla_qk_dim(), c.q_lora_rank));
            v.push(lin(
                format!("{a}.kv_a_proj_with_mqa.weight"),
                c.kv_lora_rank + c.qk_rope_head_dim,
                d,
            ));
            v.push(norm(format!("{a}.kv_a_layernorm.weight"), c.kv_lora_rank));
            v.push(lin(
                format!("{a}.kv_b_proj.weight"),
                h * (c.qk_nope_head_dim + c.v_head_dim),
                c.kv_lora_rank,
            ));
            v.push(lin(format!("{a}.g_proj.weight"), h * c.v_head_dim, d));
            v.push(lin(format!("{a}.o_proj.weight"), d, h * c.v_head_dim));
        }
    }
    if c.is_moe(i) {
        let m = format!("{p}.block_sparse_moe");
        let (e, lat, inter) = (c.num_experts, c.expert_width(), c.moe_intermediate_size);
        let sh = inter * c.num_shared_experts;
        v.push(lin(format!("{m}.gate.weight"), e, d));
        v.push(t(
            format!("{m}.gate.e_score_correction_bias"),
            DType::F32,
            &[e],
            Init::Uniform(0.05),
        ));
        v.push(lin(format!("{m}.routed_expert_down_proj.weight"), lat, d));
        v.push(norm(format!("{m}.routed_expert_norm.weight"), lat));
        v.push(lin(format!("{m}.routed_expert_up_proj.weight"), d, lat));
        v.push(lin(format!("{m}.shared_experts.gate_proj.weight"), sh, d));
        v.push(lin(format!("{m}.shared_experts.up_proj.weight"), sh, d));
        v.push(lin(format!("{m}.shared_experts.down_proj.weight"), d, sh));
        // Scales 2^-9..2^-5 keep E2M1 (|v| ≤ 6) weights near 1/√fan_in for typical widths.
        let shapes = [
            [inter, lat / 2],
            [inter, lat / 32],
            [lat, inter / 2],
            [lat, inter / 32],
            [inter, lat / 2],
            [inter, lat / 32],
        ];
        for ex in 0..e {
            for (k, name) in expert_tensor_names("language_model.", i, ex).into_iter().enumerate() {
                let init = if k % 2 == 0 { Init::Packed } else { Init::Scale(118, 122) };
                v.push(t(name, DType::U8, &shapes[k], init));
            }
        }
    } else {
        let mp = format!("{p}.mlp");
        v.push(lin(format!("{mp}.gate_proj.weight"), c.intermediate_size, d));
        v.push(lin(format!("{mp}.up_proj.weight"), c.intermediate_size, d));
        v.push(lin(format!("{mp}.down_proj.weight"), d, c.intermediate_size));
    }
    v
}

fn global_tensors(c: &K3Config, quiet_from: usize) -> Vec<Tensor> {
    let d = c.hidden_size;
    let g = "language_model.";
    let mut v = vec![
        t(
            format!("{g}model.embed_tokens.weight"),
            DType::BF16,
            &[c.vocab_size, d],
            Init::Uniform(1.0),
        ),
        norm(format!("{g}model.norm.weight"), d),
        {
            #[allow(clippy::cast_precision_loss)]
            let a = (3.0 / d as f32).sqrt();
            t(
                format!("{g}lm_head.weight"),
                DType::BF16,
                &[c.vocab_size, d],
                Init::Head { a, cols: d, quiet_from },
            )
        },
    ];
    if c.attn_res_block_size.is_some() {
        v.push(norm(format!("{g}model.output_attn_res_norm.weight"), d));
        v.push(t(
            format!("{g}model.output_attn_res_proj.weight"),
            DType::BF16,
            &[1, d],
            Init::Uniform(0.5),
        ));
    }
    v
}

/// Fills `out` with `n` values of `init` encoded as `dtype`.
fn fill(rng: &mut SplitMix, init: Init, dtype: DType, n: usize, out: &mut Vec<u8>) {
    out.clear();
    if let Init::Packed = init {
        // Eight random bytes per draw: expert nibbles are most of a large checkpoint.
        while out.len() < n {
            let take = (n - out.len()).min(8);
            out.extend_from_slice(&rng.next_u64().to_le_bytes()[..take]);
        }
        return;
    }
    for i in 0..n {
        let x = match init {
            Init::Uniform(a) => a * rng.uniform(),
            Init::AroundOne(a) => 1.0 + a * rng.uniform(),
            Init::Head { a, cols, quiet_from } => {
                let v = a * rng.uniform();
                if i / cols >= quiet_from {
                    v / 20.0
                } else {
                    v
                }
            }
            Init::ALog(h) => {
                if i < h {
                    (8.5 + 7.5 * rng.uniform()).ln()
                } else {
                    0.0
                }
            }
            Init::Packed => unreachable!("invariant: packed nibbles are filled before this loop"),
            Init::Scale(lo, hi) => {
                let span = u64::from(hi - lo) + 1;
                #[allow(clippy::cast_possible_truncation)]
                out.push(lo + (rng.next_u64() % span) as u8);
                continue;
            }
        };
        match dtype {
            DType::F32 => out.extend_from_slice(&x.to_le_bytes()),
            _ => out.extend_from_slice(&f32_to_bf16_rne(x).to_le_bytes()),
        }
    }
}

/// The multimodal `config.json` wrapping `text_config` as the release does, with the release's
/// `quantization_config` (compressed-tensors MXFP4 on the routed experts only), which other
/// readers of the checkpoint (llama.cpp's converter) need to find the packed experts.
pub fn release_config(text_config: &Value, vocab_base: u64) -> Value {
    json!({
        "architectures": ["KimiK3ForConditionalGeneration"],
        "model_type": "kimi_k3",
        "bos_token_id": vocab_base,
        "eos_token_id": vocab_base + 2,
        "pad_token_id": vocab_base + 255,
        "dtype": "bfloat16",
        "tie_word_embeddings": false,
        "quantization_config": release_quantization_config(),
        "text_config": text_config,
    })
}

/// The release's `quantization_config`: MXFP4 groups of 32 with E8M0 (`uint8`) scales on every
/// Linear except attention, shared experts, dense MLPs, lm_head and the vision side — so only the
/// routed experts are packed, as [`write_checkpoint`] writes them.
pub fn release_quantization_config() -> Value {
    json!({
        "quant_method": "compressed-tensors",
        "format": "mxfp4-pack-quantized",
        "config_groups": {
            "group_0": {
                "weights": {
                    "num_bits": 4,
                    "type": "float",
                    "strategy": "group",
                    "group_size": 32,
                    "symmetric": true,
                    "scale_dtype": "torch.uint8",
                    "observer": "minmax",
                    "dynamic": false
                },
                "input_activations": null,
                "output_activations": null,
                "targets": ["Linear"]
            }
        },
        "ignore": [
            "re:.*self_attn.*",
            "re:.*shared_experts.*",
            "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
            "re:.*lm_head.*",
            "re:.*vision_tower.*",
            "re:.*mm_projector.*"
        ],
        "quantization_status": "compressed"
    })
}

/// Bytes of tensor data [`write_checkpoint`] writes for `text_config`, known before it starts
/// (so that a caller can say how much it will write).
pub fn checkpoint_bytes(text_config: &Value) -> Result<u64, ModelError> {
    let c = K3Config::from_json(text_config)?;
    let mut groups: Vec<Vec<Tensor>> =
        (0..c.num_hidden_layers).map(|i| layer_tensors(&c, i)).collect();
    groups.push(global_tensors(&c, 0));
    Ok(groups.iter().flatten().map(|t| t.shape.iter().product::<u64>() * t.dtype.size()).sum())
}

/// Writes a synthetic checkpoint of `text_config` into `dir` (created if needed). `config` is
/// the full `config.json` to write; lm_head rows from `special_from` on (the reserved specials)
/// are drawn small. `progress(done, total)` is called with bytes written. Returns the bytes of
/// tensor data written.
pub fn write_checkpoint(
    dir: &Path,
    config: &Value,
    text_config: &Value,
    seed: u64,
    special_from: usize,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<u64, ModelError> {
    let c = K3Config::from_json(text_config)?;
    std::fs::create_dir_all(dir)
        .map_err(|e| ModelError::Config(format!("cannot create {}: {e}", dir.display())))?;
    let mut groups: Vec<Vec<Tensor>> =
        (0..c.num_hidden_layers).map(|i| layer_tensors(&c, i)).collect();
    groups.push(global_tensors(&c, special_from));
    let n = groups.len();
    let bytes_of = |t: &Tensor| t.shape.iter().product::<u64>() * t.dtype.size();
    let total: u64 = groups.iter().flatten().map(bytes_of).sum();
    let mut weight_map = BTreeMap::new();
    let mut done = 0u64;
    let mut buf = Vec::new();
    for (gi, g) in groups.iter().enumerate() {
        let file = format!("model-{:05}-of-{:06}.safetensors", gi + 1, n);
        let specs: Vec<TensorSpec> =
            g.iter().map(|t| TensorSpec::new(t.name.clone(), t.dtype, t.shape.clone())).collect();
        let mut w = ShardWriter::create(&dir.join(&file), specs, None)?;
        for tensor in g {
            // One stream per tensor name keeps every tensor's values independent of the others.
            let mut rng = SplitMix::new(seed ^ fnv1a(&tensor.name));
            let numel = usize::try_from(tensor.shape.iter().product::<u64>()).map_err(|_| {
                ModelError::Config(format!("{} is too large for this platform", tensor.name))
            })?;
            fill(&mut rng, tensor.init, tensor.dtype, numel, &mut buf);
            w.write_tensor(&tensor.name, &buf)?;
            done += bytes_of(tensor);
            progress(done, total);
            weight_map.insert(tensor.name.clone(), file.clone());
        }
        w.finish()?;
    }
    write_index(dir, &weight_map, total)?;
    write_json_atomic(&dir.join("config.json"), config)?;
    Ok(total)
}

/// FNV-1a hash of a name (seeds per-tensor streams).
fn fnv1a(s: &str) -> u64 {
    s.bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// The dimensions that tell one synthetic Kimi K3 text config from another; everything else
/// (SiTU betas, sigmoid router with `noaux_tc`, 2 shared experts, NoPE MLA with output gate,
/// latent MoE norm, short conv 4, full-rank KDA gate) is K3's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct K3Dims {
    /// Embedding and lm_head rows.
    pub vocab: usize,
    /// Model width.
    pub hidden: usize,
    /// Decoder layers.
    pub layers: usize,
    /// 1-based indices of the KDA layers; the others are MLA.
    pub kda_layers: Vec<usize>,
    /// Attention heads (MLA and KDA).
    pub heads: usize,
    /// KDA head dimension.
    pub kda_head_dim: usize,
    /// Dense MLP width (dense layers).
    pub intermediate: usize,
    /// Layers per AttnRes block.
    pub attn_res_block: usize,
    /// MLA query and key-value LoRA ranks.
    pub q_lora: usize,
    /// MLA key-value LoRA rank (the latent cache width).
    pub kv_lora: usize,
    /// MLA per-head no-position and rotary dims.
    pub qk_nope: usize,
    /// MLA rotary dims per head.
    pub qk_rope: usize,
    /// MLA value dims per head.
    pub v_head: usize,
    /// Leading dense (non-MoE) layers.
    pub dense_layers: usize,
    /// Routed experts per MoE layer.
    pub experts: usize,
    /// Experts chosen per token.
    pub top_k: usize,
    /// Expert (and shared expert) width.
    pub moe_intermediate: usize,
    /// The latent width routed experts work in.
    pub expert_hidden: usize,
}

impl K3Dims {
    /// A Kimi K3 "slice": K3's real per-layer dimensions (hidden 7168, KDA 96×128, MLA 96 heads
    /// with q_lora 1536 / kv_lora 512 / 128+64 / v 128, latent 3584, expert width 3072, MXFP4
    /// experts of 17,547,264 bytes, top-16, 2 shared experts, SiTU, AttnRes block 12) with
    /// `layers` MoE layers (every fourth and the last MLA, the rest KDA; no dense layer),
    /// `experts` routed experts per layer and a `vocab`-row embedding and lm_head.
    pub fn k3_slice(layers: usize, experts: usize, vocab: usize) -> Self {
        Self {
            vocab,
            hidden: 7168,
            layers,
            kda_layers: (1..=layers).filter(|&l| l % 4 != 0 && l != layers).collect(),
            heads: 96,
            kda_head_dim: 128,
            intermediate: 33792,
            attn_res_block: 12,
            q_lora: 1536,
            kv_lora: 512,
            qk_nope: 128,
            qk_rope: 64,
            v_head: 128,
            dense_layers: 0,
            experts,
            top_k: 16.min(experts),
            moe_intermediate: 3072,
            expert_hidden: 3584,
        }
    }

    /// The text config (`config.json`'s `text_config`) with these dimensions.
    pub fn text_config(&self) -> Value {
        let full: Vec<usize> = (1..=self.layers).filter(|l| !self.kda_layers.contains(l)).collect();
        json!({
            "model_type": "kimi_linear",
            "architectures": ["KimiLinearForCausalLM"],
            "vocab_size": self.vocab,
            "hidden_size": self.hidden,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.heads,
            "intermediate_size": self.intermediate,
            "rms_norm_eps": 1e-5,
            "linear_attn_config": {
                "kda_layers": self.kda_layers, "full_attn_layers": full, "num_heads": self.heads,
                "head_dim": self.kda_head_dim, "short_conv_kernel_size": 4,
                "use_full_rank_gate": true, "gate_lower_bound": -5.0
            },
            "hidden_act": "situ",
            "activation_situ_beta": 4.0,
            "activation_situ_linear_beta": 25.0,
            "attn_res_block_size": self.attn_res_block,
            "q_lora_rank": self.q_lora,
            "kv_lora_rank": self.kv_lora,
            "qk_nope_head_dim": self.qk_nope,
            "qk_rope_head_dim": self.qk_rope,
            "v_head_dim": self.v_head,
            "mla_use_nope": true,
            "mla_use_output_gate": true,
            "first_k_dense_replace": self.dense_layers,
            "moe_layer_freq": 1,
            "num_experts": self.experts,
            "num_experts_per_token": self.top_k,
            "num_shared_experts": 2,
            "moe_intermediate_size": self.moe_intermediate,
            "routed_expert_hidden_size": self.expert_hidden,
            "latent_moe_use_norm": true,
            "moe_router_activation_func": "sigmoid",
            "topk_method": "noaux_tc",
            "use_grouped_topk": true,
            "num_expert_group": 1,
            "topk_group": 1,
            "moe_renormalize": true,
            "routed_scaling_factor": 1.0,
            "num_nextn_predict_layers": 0,
            "max_position_embeddings": 1_048_576,
            "tie_word_embeddings": false
        })
    }
}

/// The text config of [`K3Dims::k3_slice`].
pub fn k3_slice_text_config(layers: usize, experts: usize, vocab: usize) -> Value {
    K3Dims::k3_slice(layers, experts, vocab).text_config()
}

//! The DeepSeek-V3 architecture (`DeepseekV3ForCausalLM`): DeepSeek V3 / R1 (`model_type`
//! `deepseek_v3`) and Kimi K2 (`kimi_k2`). Pre-norm decoder layers of multi-head latent attention
//! (q LoRA or a plain q projection, kv LoRA, decoupled RoPE with YaRN) and, from layer
//! `first_k_dense_replace` on, a mixture of SiLU-GLU experts with group-limited sigmoid routing
//! and shared experts; the first layers are dense.
//!
//! It follows transformers' `models/deepseek_v3/modeling_deepseek_v3.py` (5.17) in f32, with the
//! router of DeepSeek-V3's own `inference/model.py` (see [`moe`]), and is checked stage by stage
//! against goldens that transformers produced from tiny checkpoints in the published layouts —
//! FP8 block-quantized (DeepSeek V3/R1) and compressed-tensors INT4 experts (Kimi K2 Thinking)
//! (`tools/gen_deepseek_v3_goldens.py`, `tests/fixtures/deepseek_v3`).
//!
//! Sequence state: the MLA latent cache per layer (normalised `c_kv` and rotated `k_pe`), held in
//! the same [`K3State`] of MLA layers as Kimi K3's MLA layers, so commit / rollback / snapshots
//! are shared. Every kernel is batch-invariant and attention always runs in the absorbed form, so
//! a T-row pass gives bit for bit the logits of T single-row passes.
//!
//! Routed experts come from an expert store over the published tensors ([`experts`]: FP8 weight
//! and block scales, or INT4 packed weight and group scales, per projection): mapped in place
//! until [`crate::Model::set_experts`] attaches another store, streamed from the shards when the
//! memory plan says so. [`DeepseekV3::memory_needs`] is what the plan charges besides them.

mod boundary;
pub mod config;
pub mod experts;
mod mla;
pub mod moe;
pub mod quant;
pub mod synth;
pub mod weights;

use crate::family::{add_into, moe_step, put, Experts, MemoryNeeds, RoutedExperts};
use crate::gpt_oss::rope::YarnRope;
use crate::kimi_k3::state::{K3State, LayerShape, LayerState};
use crate::kimi_k3::Trace;
use crate::qwen3_moe::moe::At;
use crate::served::{finite_logits, norm_rows, Served};
use crate::spine::{head_piece, layer_piece, TensorBytes};
use crate::{LogitRows, ModelError};
use config::DeepseekV3Config;
use experts::{DeepseekV3ExpertLayout, ExpertFormat};
use quant::Weight;
use sluice_checkpoint::Checkpoint;
use sluice_kernels::matmul;
use sluice_store::SpineIndex;
use std::sync::Arc;
use weights::{DeepseekV3Weights, Ffn, MoeWeights};

/// `x [t, cols] → [t, rows]` through a weight whose bytes `src` holds (the mapped checkpoint or
/// the layer's placed spine piece).
pub(crate) fn mm(src: &dyn TensorBytes, w: &Weight, x: &[f32], t: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; t * w.rows()];
    matmul(&w.get(src), x, t, &mut out);
    out
}

/// The rotary table of the `qk_rope_head_dim` dims (`DeepseekV3RotaryEmbedding`): plain or
/// YaRN inverse frequencies and the cos/sin scale (`attention_factor`), whose half-width rows
/// are computed as GPT-OSS's YaRN table computes its own.
pub type Rope = YarnRope;

/// The rotary table `c` describes.
pub fn rope(c: &DeepseekV3Config) -> Rope {
    let dim = c.qk_rope_head_dim;
    match &c.yarn {
        Some(y) => YarnRope::new(dim, c.rope_theta, y),
        None => {
            // inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
            #[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
            let inv_freq = (0..dim / 2)
                .map(|j| {
                    let e = (2 * j) as f32 / dim as f32;
                    1.0f32 / (c.rope_theta.powf(f64::from(e)) as f32)
                })
                .collect();
            YarnRope::from_inv_freq(inv_freq, 1.0)
        }
    }
}

/// The loaded model.
pub struct DeepseekV3 {
    cfg: DeepseekV3Config,
    weights: DeepseekV3Weights,
    rope: Rope,
    layout: DeepseekV3ExpertLayout,
    /// The checkpoint, the expert store, the prefetch switch and the spine placement.
    served: Served,
}

impl DeepseekV3 {
    /// Loads the model from an opened checkpoint: parses `config.json`, resolves and checks every
    /// tensor once (FP8 / INT4 weights are dequantized here), settles the routed experts'
    /// storage, builds the rotary table, then takes the routed experts from `experts`: in place
    /// from the mapped shards, or from a given store (a stream install, whose routed experts
    /// are not mapped), whose storage read from the tensors must then be the one `config.json`
    /// announces ([`Self::routed_for_config`]): it is what `sluice pull --stream` left out.
    pub fn load(ckpt: Arc<Checkpoint>, experts: Experts) -> Result<Self, ModelError> {
        let text = ckpt.config().text_config();
        let cfg = DeepseekV3Config::from_json(text)?;
        let weights = DeepseekV3Weights::load(&ckpt, &cfg)?;
        let announced = expert_format_of_config(text);
        let layout = DeepseekV3ExpertLayout {
            // In place, a model without MoE layers has no experts; the format is then never
            // used. A given store serves what `config.json` announces.
            format: weights.expert_format.unwrap_or(if experts.is_mapped() {
                ExpertFormat::Bf16
            } else {
                announced
            }),
            inter: cfg.moe_intermediate_size as u64,
            hidden: cfg.hidden_size as u64,
        };
        if !experts.is_mapped() && layout.format != announced {
            return Err(ModelError::Config(format!(
                "{}: config.json's quantization_config announces {} routed experts but the checkpoint's are {}; a stream install of it left out the wrong tensors",
                cfg.model_type,
                announced.name(),
                layout.format.name()
            )));
        }
        let rope = rope(&cfg);
        let served = Served::open(ckpt, experts, &Self::routed(&cfg, layout))?;
        Ok(Self { cfg, weights, rope, layout, served })
    }

    /// Where the routed experts of a checkpoint with config `text` (its text config) are, from
    /// the config alone (no shard is opened; `sluice pull --stream` has only `config.json`):
    /// their storage is the one its `quantization_config` announces — FP8 blocks for `fp8`,
    /// pack-quantized INT4 for `compressed-tensors` (Kimi K2 Thinking), bf16 without one.
    pub fn routed_for_config(text: &serde_json::Value) -> Result<RoutedExperts, ModelError> {
        let cfg = DeepseekV3Config::from_json(text)?;
        let layout = DeepseekV3ExpertLayout {
            format: expert_format_of_config(text),
            inter: cfg.moe_intermediate_size as u64,
            hidden: cfg.hidden_size as u64,
        };
        Ok(Self::routed(&cfg, layout))
    }

    /// Where the routed experts of a model of config `c` stored as `layout` are.
    fn routed(c: &DeepseekV3Config, layout: DeepseekV3ExpertLayout) -> RoutedExperts {
        RoutedExperts {
            num_layers: c.num_hidden_layers,
            moe_layers: c.moe_layers(),
            per_layer: c.n_routed_experts,
            expert_bytes: layout.expert_bytes(),
            layout: Arc::new(layout),
        }
    }

    /// Where this model's routed experts are (for opening an expert store over them).
    pub fn routed_experts(&self) -> RoutedExperts {
        Self::routed(&self.cfg, self.layout)
    }

    /// The spine pieces (embedding, each decoder layer's attention and dense MLP or router and
    /// shared experts, head) and their byte spans, for placing the spine piece by piece.
    pub fn spine_index(&self) -> Result<SpineIndex, ModelError> {
        self.weights.spine_index(&self.served.ckpt)
    }

    /// Bytes of the f32 vectors (norms, routing biases) the model keeps whatever the placement.
    pub fn spine_small_bytes(&self) -> u64 {
        self.weights.small_bytes()
    }

    /// How the routed experts are stored.
    pub fn expert_format(&self) -> ExpertFormat {
        self.layout.format
    }

    /// What the model holds besides its expert cache: the spine (attention, dense MLPs,
    /// routers, shared experts, embedding and head, as stored), the MLA latent cache per
    /// position (`kv_lora_rank + qk_rope_head_dim` f32 per layer), the `kv_b_proj` rows each
    /// thread keeps widened for attention's parts (fixed), and a pass's activations per row.
    pub fn memory_needs(&self) -> MemoryNeeds {
        let c = &self.cfg;
        let (h, kl, rd) = (c.num_attention_heads, c.kv_lora_rank, c.qk_rope_head_dim);
        let vd = c.v_head_dim;
        // Per row: q (and its LoRA), the latent row, the per-head latent query and attention
        // output, the heads' values (see `mla::forward`).
        let attn = c.q_lora_rank.unwrap_or(0) + h * c.qk_head_dim() + (kl + rd) + 2 * h * vd;
        let threads = sluice_kernels::pool::with_current(sluice_kernels::pool::Pool::threads);
        let (pass_per_row, prefill_per_row) = crate::working::row_charges(
            c.hidden_size,
            attn,
            c.n_routed_experts,
            c.num_experts_per_tok,
            c.moe_intermediate_size.max(c.intermediate_size),
            c.vocab_size,
            true,
        );
        MemoryNeeds {
            spine: self.dense_weight_bytes(),
            state_fixed: crate::latent_parts::widened_bytes(
                threads,
                h,
                c.qk_nope_head_dim + vd,
                kl,
            ),
            state_per_position: (c.num_hidden_layers * (kl + rd) * 4) as u64,
            pass_per_row,
            prefill_per_row,
        }
    }

    /// The spine's storage: `fp8`, `int4`, `bf16` / `f32`, or `mixed` when its matrices
    /// (attention, dense MLPs, shared experts, embedding, head) are not all stored one way.
    pub fn spine_format(&self) -> &'static str {
        self.weights.spine_format(&*self.served.ckpt)
    }

    /// The typed configuration.
    pub fn config(&self) -> &DeepseekV3Config {
        &self.cfg
    }

    /// The rotary table.
    pub fn rope(&self) -> &Rope {
        &self.rope
    }

    /// Bytes of the non-expert weights a pass reads, as stored.
    pub fn dense_weight_bytes(&self) -> u64 {
        self.weights.dense_byte_len(self.cfg.tie_word_embeddings)
    }

    /// A fresh state: one MLA latent cache per layer.
    pub fn new_state(&self) -> K3State {
        let shape =
            LayerShape::Mla { lat_dim: self.cfg.kv_lora_rank, pe_dim: self.cfg.qk_rope_head_dim };
        K3State::new(&vec![shape; self.cfg.num_hidden_layers])
    }

    /// Whether `s` was made for this model.
    fn fits(&self, s: &K3State) -> bool {
        s.layers.len() == self.cfg.num_hidden_layers
            && s.layers.iter().all(|l| {
                matches!(l, LayerState::Mla(m)
                    if m.lat_dim == self.cfg.kv_lora_rank && m.pe_dim == self.cfg.qk_rope_head_dim)
            })
    }

    /// Runs `tokens` (T ≥ 1 positions after the committed ones), staging T latent-cache rows per
    /// layer, and returns the logits of the rows `rows` asks for. The caller must `commit(n)` or
    /// `rollback()` afterwards.
    ///
    /// With a trace, records `embed`, `layer{i}.{attn_in,attn_out,mlp_in,mlp_out,out}` (`[T, d]`),
    /// `layer{i}.router_logits` (`[T, E]`, MoE layers), `final_norm`, and the routes.
    pub fn forward(
        &self,
        state: &mut K3State,
        tokens: &[u32],
        rows: LogitRows,
        mut trace: Option<&mut Trace>,
    ) -> Result<Vec<f32>, ModelError> {
        let c = &self.cfg;
        let t = tokens.len();
        crate::family::check_pass(
            c.model_type,
            tokens,
            state.pending(),
            self.fits(state),
            c.vocab_size,
        )?;
        let d = c.hidden_size;
        // One pass at a time through streamed spine pieces; held until the logits are out.
        let _pass = self.served.spine.begin_pass();
        let mut h = vec![0.0f32; t * d];
        self.served.embed(&self.weights.embed, tokens, &mut h)?;
        put(&mut trace, || "embed".into(), &h);
        // MLA layers only: a partial commit truncates, so every pass may keep it possible.
        state.begin(t, false);
        let layers = &self.weights.layers;
        let moe_of = |j: usize| match layers.get(j).map(|l| &l.ffn) {
            Some(Ffn::Moe(w)) => Some(w),
            _ => None,
        };
        let next_moe = |i: usize| (i + 1..layers.len()).find_map(|j| moe_of(j).map(|w| (j, w)));
        let first_moe = (0..layers.len()).find(|&j| moe_of(j).is_some());
        // A guess of the experts MoE weights `w` (read from `src`) route `x [t, d]` to.
        let guess_with = |src: &dyn TensorBytes, w: &MoeWeights, x: &[f32]| {
            let mut logits = vec![0.0f32; t * c.n_routed_experts];
            matmul(&w.router.get(src), x, t, &mut logits);
            moe::guess(&logits, &w.bias, c)
        };
        for (i, lw) in layers.iter().enumerate() {
            // This layer's spine piece: mapped, resident, or its stream buffer (read during the
            // previous layer); every weight of the layer is read from it.
            let piece = self.served.piece(layer_piece(i), state)?;
            let src: &dyn TensorBytes = &piece;
            let LayerState::Mla(cache) = &mut state.layers[i] else {
                return Err(ModelError::Config("invariant: checked by fits".into()));
            };
            // The first MoE layer has no MoE layer before it to guess its experts: guess them
            // from its input (normed as its block will norm it) while its attention computes.
            if let (true, Some(w)) = (self.served.prefetch && first_moe == Some(i), moe_of(i)) {
                let g = self.norm_rows(&h, &lw.post_norm);
                self.served.experts.prefetch(i, &guess_with(src, w, &g));
            }
            let a_in = self.norm_rows(&h, &lw.input_norm);
            put(&mut trace, || format!("layer{i}.attn_in"), &a_in);
            let a = mla::forward(src, &lw.attn, c, &self.rope, cache, &a_in, t);
            put(&mut trace, || format!("layer{i}.attn_out"), &a);
            add_into(&mut h, &a);
            let m_in = self.norm_rows(&h, &lw.post_norm);
            put(&mut trace, || format!("layer{i}.mlp_in"), &m_in);
            let m = match &lw.ffn {
                Ffn::Dense(w) => moe::mlp(src, w, &m_in, t),
                Ffn::Moe(w) => {
                    let store = self.served.experts.as_ref();
                    let next = if self.served.prefetch { next_moe(i) } else { None };
                    // The next layer's router is in its own piece: guessed only when that piece
                    // is at hand (mapped, resident, or already read), never waited for.
                    let guess = || {
                        let (j, nw) = next?;
                        let nsrc = self.served.peek(layer_piece(j))?;
                        Some((j, guess_with(&nsrc, nw, &m_in)))
                    };
                    let at = At { layer: i, guess: &guess };
                    moe_step(state, &mut trace, i, || {
                        moe::forward(src, w, c, store, &self.layout, at, &m_in, t)
                    })?
                }
            };
            put(&mut trace, || format!("layer{i}.mlp_out"), &m);
            add_into(&mut h, &m);
            put(&mut trace, || format!("layer{i}.out"), &h);
        }
        let sel = rows.range(t);
        let n = sel.len();
        let normed = self.norm_rows(&h[sel.start * d..sel.end * d], &self.weights.norm);
        put(&mut trace, || "final_norm".into(), &normed);
        let head = self.served.piece(head_piece(c.num_hidden_layers), state)?;
        let mut logits = vec![0.0f32; n * c.vocab_size];
        matmul(&self.weights.lm_head.get(&head), &normed, n, &mut logits);
        finite_logits(logits, state)
    }

    /// `DeepseekV3RMSNorm(hidden_size, eps=rms_norm_eps)` on every row of `x [n, d]`.
    fn norm_rows(&self, x: &[f32], w: &[f32]) -> Vec<f32> {
        norm_rows(x, w, self.cfg.hidden_size, self.cfg.rms_norm_eps)
    }
}
/// How the routed experts of a checkpoint with text config `text` are stored, as its
/// `quantization_config` announces: `fp8` quantizes every linear layer (DeepSeek V3/R1, Kimi K2
/// Instruct), `compressed-tensors` the routed experts to pack-quantized INT4 (Kimi K2
/// Thinking); without one they are bf16 (f32 when `torch_dtype` says so).
fn expert_format_of_config(text: &serde_json::Value) -> ExpertFormat {
    let q = text.get("quantization_config").and_then(|q| q.get("quant_method"));
    match q.and_then(serde_json::Value::as_str) {
        Some("fp8") => ExpertFormat::Fp8,
        Some("compressed-tensors") => ExpertFormat::Int4,
        _ if text.get("torch_dtype").and_then(serde_json::Value::as_str) == Some("float32") => {
            ExpertFormat::F32
        }
        _ => ExpertFormat::Bf16,
    }
}

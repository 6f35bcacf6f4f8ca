//! GPT-OSS (`GptOssForCausalLM`: gpt-oss-20b, gpt-oss-120b): pre-norm decoder layers of
//! grouped-query attention with q/k/v/o biases, learned attention sinks and YaRN RoPE, alternating
//! sliding-window and full attention (`layer_types`), and a top-k MoE whose router has a bias and
//! whose MXFP4 experts (as published: `*_blocks` / `*_scales`, with biases) use a clamped SwiGLU.
//!
//! It follows transformers' `models/gpt_oss/modeling_gpt_oss.py` (5.17) operation for operation in
//! f32 and is checked stage by stage, routing included, against goldens that transformers produced
//! from checkpoints in the published layout (`tools/gen_gpt_oss_goldens.py`,
//! `tests/fixtures/gpt_oss`); the generator checks that the reference's dequantized experts equal
//! the values the published bytes encode. Norms, the tensor-roster helpers, the matmul context and
//! the sequence state are Qwen3's ([`crate::qwen3`]).
//!
//! A pass runs T positions layer-major; keys and values are staged in the [`Qwen3State`] until
//! `commit(n)` / `rollback()`. A T-row pass gives bit for bit the logits of T single-row passes.

pub mod attention;
mod boundary;
pub mod config;
pub mod moe;
pub mod rope;
pub mod synth;
pub mod weights;

use crate::family::{add_into, moe_step, put, Experts, MemoryNeeds, RoutedExperts};
use crate::qwen3::{Ctx, Qwen3State, Trace};
use crate::served::{norm_rows, Served};
use crate::spine::{head_piece, layer_piece, TensorBytes};
use crate::{LogitRows, ModelError};
use config::GptOssConfig;
use rope::YarnRope;
use sluice_checkpoint::Checkpoint;
use sluice_store::SpineIndex;
use std::sync::Arc;
use weights::{GptOssExpertLayout, GptOssWeights};

/// The loaded GPT-OSS model.
pub struct GptOss {
    cfg: GptOssConfig,
    weights: GptOssWeights,
    rope: YarnRope,
    /// The checkpoint, the expert store, the prefetch switch and the spine placement.
    served: Served,
}

impl GptOss {
    /// Loads the model from an opened checkpoint: parses `config.json`, resolves and checks every
    /// tensor once and builds the rotary tables, then takes the routed experts from `experts`:
    /// in place from the mapped shards, or from a given store (a stream install, whose routed
    /// experts are not mapped).
    pub fn load(ckpt: Arc<Checkpoint>, experts: Experts) -> Result<Self, ModelError> {
        let cfg = GptOssConfig::from_json(ckpt.config().text_config())?;
        let weights = GptOssWeights::load(&ckpt, &cfg)?;
        let rope = YarnRope::new(cfg.head_dim, cfg.rope_theta, &cfg.yarn);
        let served = Served::open(ckpt, experts, &Self::routed(&cfg))?;
        Ok(Self { cfg, weights, rope, served })
    }

    /// A guess of the experts `layer`'s router picks for `x [t, d]` (see
    /// [`crate::qwen3_moe::moe::guess_union`]), its router read from `src` (`None`: `layer`'s
    /// spine piece when it is at hand without waiting for a read).
    fn guess(
        &self,
        src: Option<&dyn TensorBytes>,
        layer: usize,
        x: &[f32],
        t: usize,
    ) -> Option<(usize, Vec<u32>)> {
        let w = &self.weights.layers.get(layer)?.moe;
        let peeked;
        let src = match src {
            Some(s) => s,
            None => {
                peeked = self.served.peek(layer_piece(layer))?;
                &peeked
            }
        };
        let mut logits = Ctx { src }.mm(&w.router, x, t);
        attention::add_bias(&mut logits, &w.router_bias);
        let (e, k) = (self.cfg.num_local_experts, self.cfg.num_experts_per_tok);
        Some((layer, crate::qwen3_moe::moe::guess_union(&logits, e, k)))
    }

    /// Where the routed experts of a model of config `c` are: every layer is an MoE layer.
    pub fn routed(c: &GptOssConfig) -> RoutedExperts {
        let layout = GptOssExpertLayout {
            experts: c.num_local_experts as u64,
            inter: c.intermediate_size as u64,
            hidden: c.hidden_size as u64,
        };
        RoutedExperts {
            num_layers: c.num_hidden_layers,
            moe_layers: (0..c.num_hidden_layers).collect(),
            per_layer: c.num_local_experts,
            expert_bytes: layout.expert_bytes(),
            layout: Arc::new(layout),
        }
    }

    /// Where this model's routed experts are (for opening an expert store over them).
    pub fn routed_experts(&self) -> RoutedExperts {
        Self::routed(&self.cfg)
    }

    /// What the model holds besides its expert cache: the spine, a KV cache of keys and values
    /// (f32) per position, and a pass's activations per row (see [`crate::working`]).
    pub fn memory_needs(&self) -> MemoryNeeds {
        let c = &self.cfg;
        let (pass_per_row, prefill_per_row) = crate::working::row_charges(
            c.hidden_size,
            c.q_width() + 2 * c.kv_width(),
            c.num_local_experts,
            c.num_experts_per_tok,
            2 * c.intermediate_size,
            c.vocab_size,
            false,
        );
        MemoryNeeds {
            spine: self.dense_weight_bytes(),
            state_fixed: 0,
            state_per_position: (c.num_hidden_layers * c.kv_cache_row() * 2 * 4) as u64,
            pass_per_row,
            prefill_per_row,
        }
    }

    /// The typed configuration.
    pub fn config(&self) -> &GptOssConfig {
        &self.cfg
    }

    /// The YaRN rotary embedding.
    pub fn rope(&self) -> &YarnRope {
        &self.rope
    }

    /// The spine pieces (embedding, each decoder layer's attention and router, head) and
    /// their byte spans, for placing the spine piece by piece.
    pub fn spine_index(&self) -> Result<SpineIndex, ModelError> {
        self.weights.spine_index(&self.served.ckpt)
    }

    /// Bytes of the f32 vectors (norms, biases, sinks) the model keeps whatever the placement.
    pub fn spine_small_bytes(&self) -> u64 {
        self.weights.small_bytes()
    }

    /// Bytes of the non-expert weight matrices a pass reads.
    pub fn dense_weight_bytes(&self) -> u64 {
        self.weights.dense_byte_len(self.cfg.tie_word_embeddings)
    }

    /// Bytes of one routed expert (MXFP4 values and scales of both matrices).
    pub fn expert_bytes(&self) -> u64 {
        self.routed_experts().expert_bytes
    }

    /// A fresh, empty sequence state.
    pub fn new_state(&self) -> Qwen3State {
        Qwen3State::new(self.cfg.num_hidden_layers, self.cfg.kv_width())
    }

    /// Runs `tokens` (T ≥ 1 positions after the state's committed ones) through the model,
    /// staging the new keys and values, and returns the logits of the rows `rows` asks for. The
    /// caller must `commit(n)` or `rollback()` the state afterwards.
    ///
    /// With a trace, records `embed`, `layer{i}.{attn_in,attn_out,mlp_in,mlp_out,out}`,
    /// `layer{i}.router_logits`, `final_norm`, and each layer's routes in `trace.routes`.
    pub fn forward(
        &self,
        state: &mut Qwen3State,
        tokens: &[u32],
        rows: LogitRows,
        mut trace: Option<&mut Trace>,
    ) -> Result<Vec<f32>, ModelError> {
        let c = &self.cfg;
        let t = tokens.len();
        crate::family::check_pass(
            "gpt_oss",
            tokens,
            state.pending(),
            state.fits(c.num_hidden_layers, c.kv_width()),
            c.vocab_size,
        )?;
        let d = c.hidden_size;
        // One pass at a time through streamed spine pieces; held until the logits are out.
        let _pass = self.served.spine.begin_pass();
        let mut h = vec![0.0f32; t * d];
        self.served.embed(&self.weights.embed, tokens, &mut h)?;
        put(&mut trace, || "embed".into(), &h);
        let rope = self.rope.rows(state.len(), t);
        state.begin(t);
        for (i, lw) in self.weights.layers.iter().enumerate() {
            // This layer's spine piece: mapped, resident, or its stream buffer (read during the
            // previous layer); every matrix of the layer is read from it.
            let piece = self.served.piece(layer_piece(i), state)?;
            let ctx = Ctx { src: &piece };
            // Layer 0 has no layer before it to guess its experts: guess them from its input
            // (normed as its block will norm it) while its attention computes.
            if self.served.prefetch && i == 0 {
                let x = self.norm_rows(&h, &lw.post_norm);
                if let Some((l, ids)) = self.guess(Some(&piece), 0, &x, t) {
                    self.served.experts.prefetch(l, &ids);
                }
            }
            let a_in = self.norm_rows(&h, &lw.input_norm);
            put(&mut trace, || format!("layer{i}.attn_in"), &a_in);
            let kind = c.layer_types[i];
            let cache = &mut state.layers[i];
            let a = attention::forward(&ctx, &lw.attn, c, kind, cache, &a_in, t, &rope);
            put(&mut trace, || format!("layer{i}.attn_out"), &a);
            add_into(&mut h, &a);
            let m_in = self.norm_rows(&h, &lw.post_norm);
            put(&mut trace, || format!("layer{i}.mlp_in"), &m_in);
            let store = self.served.experts.as_ref();
            let guess =
                || if self.served.prefetch { self.guess(None, i + 1, &m_in, t) } else { None };
            let at = crate::qwen3_moe::moe::At { layer: i, guess: &guess };
            let m = moe_step(state, &mut trace, i, || {
                moe::forward(&ctx, &lw.moe, store, at, c, &m_in, t)
            })?;
            put(&mut trace, || format!("layer{i}.mlp_out"), &m);
            add_into(&mut h, &m);
            put(&mut trace, || format!("layer{i}.out"), &h);
        }
        let sel = rows.range(t);
        let n = sel.len();
        let normed = self.norm_rows(&h[sel.start * d..sel.end * d], &self.weights.norm);
        put(&mut trace, || "final_norm".into(), &normed);
        let head = self.served.piece(head_piece(c.num_hidden_layers), state)?;
        Ok(Ctx { src: &head }.mm(&self.weights.lm_head, &normed, n))
    }

    /// GptOssRMSNorm on every row of `x [n, d]`.
    fn norm_rows(&self, x: &[f32], w: &[f32]) -> Vec<f32> {
        norm_rows(x, w, self.cfg.hidden_size, self.cfg.rms_norm_eps)
    }
}

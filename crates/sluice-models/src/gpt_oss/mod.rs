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

use crate::family::{add_into, moe_step, put, MemoryNeeds, RoutedExperts};
use crate::qwen3::{Ctx, Qwen3State, Trace};
use crate::spine::{head_piece, layer_piece, Spine, TensorBytes};
use crate::{LogitRows, ModelError};
use config::GptOssConfig;
use rope::YarnRope;
use sluice_checkpoint::Checkpoint;
use sluice_kernels::ops::rms_norm;
use sluice_store::{ExpertStore, SpineIndex, SpineStats, SpineStore};
use std::sync::Arc;
use weights::{GptOssExpertLayout, GptOssWeights};

/// The loaded GPT-OSS model.
pub struct GptOss {
    cfg: GptOssConfig,
    ckpt: Arc<Checkpoint>,
    weights: GptOssWeights,
    rope: YarnRope,
    experts: Arc<dyn ExpertStore>,
    /// Guess the next layer's experts for the store to prefetch (see [`Self::set_prefetch`]).
    prefetch: bool,
    /// Where a pass reads its spine matrices: mapped, or placed by a spine store.
    spine: Spine,
}

impl std::fmt::Debug for GptOss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GptOss")
            .field("layers", &self.cfg.num_hidden_layers)
            .field("experts", &self.cfg.num_local_experts)
            .field("top_k", &self.cfg.num_experts_per_tok)
            .finish_non_exhaustive()
    }
}

impl GptOss {
    /// Loads the model from an opened checkpoint: parses `config.json` and resolves and checks
    /// every tensor once. Experts are served in place from the mapped shards until
    /// [`Self::set_experts`] gives the model another store.
    pub fn load(ckpt: Arc<Checkpoint>) -> Result<Self, ModelError> {
        Self::assemble(ckpt, |cfg, ckpt| {
            let mapped: Arc<dyn ExpertStore> = Arc::new(Self::routed(cfg).mapped(ckpt.clone())?);
            Ok(mapped)
        })
    }

    /// Loads the model with its routed experts served by `experts` from the start: for a
    /// checkpoint whose routed experts are not mapped (a stream install's sparse shards), where
    /// [`Self::load`]'s in-place store cannot open.
    pub fn with_store(
        ckpt: Arc<Checkpoint>,
        experts: Arc<dyn ExpertStore>,
    ) -> Result<Self, ModelError> {
        Self::assemble(ckpt, |_, _| Ok(experts))
    }

    /// What [`Self::load`] and [`Self::with_store`] share: the config parsed, every tensor
    /// resolved and checked, the rotary tables built, then the routed experts `experts` serves.
    fn assemble(
        ckpt: Arc<Checkpoint>,
        experts: impl FnOnce(
            &GptOssConfig,
            &Arc<Checkpoint>,
        ) -> Result<Arc<dyn ExpertStore>, ModelError>,
    ) -> Result<Self, ModelError> {
        let cfg = GptOssConfig::from_json(ckpt.config().text_config())?;
        let weights = GptOssWeights::load(&ckpt, &cfg)?;
        let rope = YarnRope::new(cfg.head_dim, cfg.rope_theta, &cfg.yarn);
        let experts = experts(&cfg, &ckpt)?;
        Ok(Self { cfg, ckpt, weights, rope, experts, prefetch: false, spine: Spine::Mapped })
    }

    /// Turns next-layer expert prefetch on or off (worth it when experts stream): each layer
    /// guesses the next one's experts with that layer's router (and bias) on its own input, and
    /// layer 0's are guessed before its attention runs.
    pub fn set_prefetch(&mut self, on: bool) {
        self.prefetch = on;
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
                peeked = self.spine.peek(&self.ckpt, layer_piece(layer))?;
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

    /// Takes routed experts from `experts` from now on.
    pub fn set_experts(&mut self, experts: Arc<dyn ExpertStore>) {
        self.experts = experts;
    }

    /// The expert store in use.
    pub fn experts(&self) -> &Arc<dyn ExpertStore> {
        &self.experts
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
            state_per_position: (c.num_hidden_layers * c.kv_width() * 2 * 4) as u64,
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
        self.weights.spine_index(&self.ckpt)
    }

    /// Bytes of the f32 vectors (norms, biases, sinks) the model keeps whatever the placement.
    pub fn spine_small_bytes(&self) -> u64 {
        self.weights.small_bytes()
    }

    /// Takes spine bytes from `store` (opened on [`Self::spine_index`]) instead of the mapped
    /// checkpoint.
    pub fn set_spine(&mut self, store: Arc<SpineStore>) -> Result<(), ModelError> {
        self.spine = Spine::placed(store, &self.spine_index()?)?;
        Ok(())
    }

    /// Spine I/O counters (all zero while the spine is mapped).
    pub fn spine_stats(&self) -> SpineStats {
        self.spine.stats()
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
        let _pass = self.spine.begin_pass();
        let mut h = vec![0.0f32; t * d];
        self.spine.embed(&self.ckpt, &self.weights.embed, tokens, &mut h)?;
        put(&mut trace, || "embed".into(), &h);
        let rope = self.rope.rows(state.len(), t);
        state.begin(t);
        for (i, lw) in self.weights.layers.iter().enumerate() {
            // This layer's spine piece: mapped, resident, or its stream buffer (read during the
            // previous layer); every matrix of the layer is read from it.
            let piece = match self.spine.piece(&self.ckpt, layer_piece(i)) {
                Ok(p) => p,
                Err(e) => {
                    state.rollback();
                    return Err(e);
                }
            };
            let ctx = Ctx { src: &piece };
            // Layer 0 has no layer before it to guess its experts: guess them from its input
            // (normed as its block will norm it) while its attention computes.
            if self.prefetch && i == 0 {
                let x = self.norm_rows(&h, &lw.post_norm);
                if let Some((l, ids)) = self.guess(Some(&piece), 0, &x, t) {
                    self.experts.prefetch(l, &ids);
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
            let store = self.experts.as_ref();
            let guess = || if self.prefetch { self.guess(None, i + 1, &m_in, t) } else { None };
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
        let head = match self.spine.piece(&self.ckpt, head_piece(c.num_hidden_layers)) {
            Ok(p) => p,
            Err(e) => {
                state.rollback();
                return Err(e);
            }
        };
        Ok(Ctx { src: &head }.mm(&self.weights.lm_head, &normed, n))
    }

    /// GptOssRMSNorm on every row of `x [n, d]`.
    fn norm_rows(&self, x: &[f32], w: &[f32]) -> Vec<f32> {
        let (d, eps) = (self.cfg.hidden_size, self.cfg.rms_norm_eps);
        let mut out = vec![0.0f32; x.len()];
        for (i, o) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
            rms_norm(i, Some(w), eps, o);
        }
        out
    }
}

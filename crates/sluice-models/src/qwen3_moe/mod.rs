//! Qwen3-MoE (`Qwen3MoeForCausalLM`: Qwen3-30B-A3B, 235B-A22B, Coder-480B): Qwen3's pre-norm
//! decoder layers (GQA with per-head q/k RMSNorm and RoPE) whose MLP is, on the sparse layers, a
//! softmax-routed top-k mixture of bf16 SiLU-GLU experts, and on the `mlp_only_layers` /
//! `decoder_sparse_step`-skipped layers a dense MLP.
//!
//! It follows transformers' `models/qwen3_moe/modeling_qwen3_moe.py` (5.17) operation for
//! operation in f32 and is checked stage by stage, routing included, against goldens that
//! transformers produced from checkpoints in the published layout
//! (`tools/gen_qwen3_moe_goldens.py`, `tests/fixtures/qwen3_moe`). The attention, RoPE, norms,
//! the tensor roster helpers and the sequence state are Qwen3's own ([`crate::qwen3`]); this
//! module adds the config keys of the sparse block, the expert roster and the router.
//!
//! A pass runs T positions layer-major; keys and values are staged in the [`Qwen3State`] until
//! `commit(n)` / `rollback()`. Every kernel is batch-invariant and the expert combination is per
//! row, so a T-row pass gives bit for bit the logits of T single-row passes.

mod boundary;
pub mod config;
pub mod moe;
pub mod synth;
pub mod weights;

use crate::family::{add_into, moe_step, put, Experts, MemoryNeeds, RoutedExperts};
use crate::qwen3::attention::{self, Rope};
use crate::qwen3::{Ctx, Qwen3State, Trace};
use crate::served::{norm_rows, Served};
use crate::spine::{head_piece, layer_piece};
use crate::{LogitRows, ModelError};
use config::Qwen3MoeConfig;
use sluice_checkpoint::Checkpoint;
use sluice_store::SpineIndex;
use std::sync::Arc;
use weights::{Ffn, Qwen3MoeExpertLayout, Qwen3MoeWeights};

/// The loaded Qwen3-MoE model.
pub struct Qwen3Moe {
    cfg: Qwen3MoeConfig,
    weights: Qwen3MoeWeights,
    rope: Rope,
    /// The checkpoint, the expert store, the prefetch switch and the spine placement.
    served: Served,
}

impl Qwen3Moe {
    /// Loads the model from an opened checkpoint: parses `config.json`, resolves and checks every
    /// tensor once and builds the rotary tables, then takes the routed experts from `experts`:
    /// in place from the mapped shards, or from a given store (a stream install, whose routed
    /// experts are not mapped).
    pub fn load(ckpt: Arc<Checkpoint>, experts: Experts) -> Result<Self, ModelError> {
        let cfg = Qwen3MoeConfig::from_json(ckpt.config().text_config())?;
        let weights = Qwen3MoeWeights::load(&ckpt, &cfg)?;
        let rope = Rope::new(cfg.base.head_dim, cfg.base.rope_theta);
        let served = Served::open(ckpt, experts, &Self::routed(&cfg))?;
        Ok(Self { cfg, weights, rope, served })
    }

    /// Where the routed experts of a model of config `c` are.
    pub fn routed(c: &Qwen3MoeConfig) -> RoutedExperts {
        let layout = Qwen3MoeExpertLayout {
            inter: c.moe_intermediate_size as u64,
            hidden: c.base.hidden_size as u64,
        };
        RoutedExperts {
            num_layers: c.base.num_hidden_layers,
            moe_layers: c.moe_layers(),
            per_layer: c.num_experts,
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
        let b = &c.base;
        let (pass_per_row, prefill_per_row) = crate::working::row_charges(
            b.hidden_size,
            b.q_width() + 2 * b.kv_width(),
            c.num_experts,
            c.num_experts_per_tok,
            c.moe_intermediate_size.max(b.intermediate_size),
            b.vocab_size,
            false,
        );
        MemoryNeeds {
            spine: self.dense_weight_bytes(),
            state_fixed: 0,
            state_per_position: (b.num_hidden_layers * b.kv_cache_row() * 2 * 4) as u64,
            pass_per_row,
            prefill_per_row,
        }
    }

    /// The spine pieces (embedding, each decoder layer's attention and dense MLP or router,
    /// head) and their byte spans, for placing the spine piece by piece.
    pub fn spine_index(&self) -> Result<SpineIndex, ModelError> {
        self.weights.spine_index(&self.served.ckpt)
    }

    /// Bytes of the f32 norm vectors the model keeps whatever the spine placement.
    pub fn spine_small_bytes(&self) -> u64 {
        self.weights.small_bytes()
    }

    /// The typed configuration.
    pub fn config(&self) -> &Qwen3MoeConfig {
        &self.cfg
    }

    /// The rotary embedding (`inv_freq` and cos/sin rows, as HF's `model.rotary_emb`).
    pub fn rope(&self) -> &Rope {
        &self.rope
    }

    /// Bytes of the non-expert weight matrices a pass reads (a tied lm_head counted once).
    pub fn dense_weight_bytes(&self) -> u64 {
        self.weights.dense_byte_len(self.cfg.base.tie_word_embeddings)
    }

    /// Bytes of one routed expert's three bf16 matrices.
    pub fn expert_bytes(&self) -> u64 {
        self.routed_experts().expert_bytes
    }

    /// A fresh, empty sequence state (Qwen3's KV caches).
    pub fn new_state(&self) -> Qwen3State {
        Qwen3State::new(self.cfg.base.num_hidden_layers, self.cfg.base.kv_width())
    }

    /// Runs `tokens` (T ≥ 1 positions after the state's committed ones) through the model,
    /// staging the new keys and values, and returns the logits of the rows `rows` asks for
    /// (`[rows, vocab]`). The caller must `commit(n)` or `rollback()` the state afterwards.
    ///
    /// With a trace, records `embed`, `layer{i}.attn_in`, `layer{i}.attn_out`, `layer{i}.mlp_in`,
    /// `layer{i}.mlp_out`, `layer{i}.out` (`[T, d]` each), `layer{i}.router_logits` (`[T, E]`,
    /// MoE layers), `final_norm` (`[rows, d]`), and each MoE layer's routes in `trace.routes`.
    pub fn forward(
        &self,
        state: &mut Qwen3State,
        tokens: &[u32],
        rows: LogitRows,
        mut trace: Option<&mut Trace>,
    ) -> Result<Vec<f32>, ModelError> {
        let c = &self.cfg.base;
        let t = tokens.len();
        crate::family::check_pass(
            "qwen3_moe",
            tokens,
            state.pending(),
            state.fits(c.num_hidden_layers, c.kv_width()),
            c.vocab_size,
        )?;
        let d = c.hidden_size;
        // One pass at a time through streamed spine pieces; held until the logits are out.
        let _pass = self.served.spine.begin_pass();
        // inputs_embeds = self.embed_tokens(input_ids)
        let mut h = vec![0.0f32; t * d];
        self.served.embed(&self.weights.embed, tokens, &mut h)?;
        put(&mut trace, || "embed".into(), &h);
        let rope = self.rope.rows(state.len(), t);
        state.begin(t);
        let layers = &self.weights.layers;
        let router = |j: usize| match layers.get(j).map(|l| &l.ffn) {
            Some(Ffn::Moe { router }) => Some(router),
            _ => None,
        };
        let next_moe = |i: usize| (i + 1..layers.len()).find_map(|j| router(j).map(|r| (j, r)));
        let first_moe = (0..layers.len()).find(|&j| router(j).is_some());
        let (e, k) = (self.cfg.num_experts, self.cfg.num_experts_per_tok);
        for (i, lw) in layers.iter().enumerate() {
            // This layer's spine piece: mapped, resident, or its stream buffer (read during the
            // previous layer); every matrix of the layer is read from it.
            let piece = self.served.piece(layer_piece(i), state)?;
            let ctx = Ctx { src: &piece };
            // The first MoE layer has no MoE layer before it to guess its experts: guess them
            // from its input (normed as its block will norm it) while its attention computes.
            if let (true, Some(r)) = (self.served.prefetch && first_moe == Some(i), router(i)) {
                let g = self.norm_rows(&h, &lw.post_norm);
                self.served.experts.prefetch(i, &moe::guess_union(&ctx.mm(r, &g, t), e, k));
            }
            // Qwen3MoeDecoderLayer.forward: pre-norm attention and MLP, each added to the residual.
            let a_in = self.norm_rows(&h, &lw.input_norm);
            put(&mut trace, || format!("layer{i}.attn_in"), &a_in);
            let a = attention::forward(&ctx, &lw.attn, c, &mut state.layers[i], &a_in, t, &rope);
            put(&mut trace, || format!("layer{i}.attn_out"), &a);
            add_into(&mut h, &a);
            let m_in = self.norm_rows(&h, &lw.post_norm);
            put(&mut trace, || format!("layer{i}.mlp_in"), &m_in);
            let m = match &lw.ffn {
                Ffn::Dense(w) => crate::qwen3::mlp(&ctx, [&w.gate, &w.up, &w.down], &m_in, t),
                Ffn::Moe { router } => {
                    let store = self.served.experts.as_ref();
                    let next = if self.served.prefetch { next_moe(i) } else { None };
                    // The next layer's router is in its own piece: guessed only when that piece
                    // is at hand (mapped, resident, or already read), never waited for.
                    let guess = || {
                        let (j, r) = next?;
                        let src = self.served.peek(layer_piece(j))?;
                        Some((j, moe::guess_union(&Ctx { src: &src }.mm(r, &m_in, t), e, k)))
                    };
                    let at = moe::At { layer: i, guess: &guess };
                    moe_step(state, &mut trace, i, || {
                        moe::forward(&ctx, router, store, at, &self.cfg, &m_in, t)
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
        let head = self.served.piece(head_piece(layers.len()), state)?;
        Ok(Ctx { src: &head }.mm(&self.weights.lm_head, &normed, n))
    }

    /// Qwen3MoeRMSNorm on every row of `x [n, d]`.
    fn norm_rows(&self, x: &[f32], w: &[f32]) -> Vec<f32> {
        norm_rows(x, w, self.cfg.base.hidden_size, self.cfg.base.rms_norm_eps)
    }
}

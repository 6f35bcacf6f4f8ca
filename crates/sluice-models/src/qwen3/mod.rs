//! Qwen3 dense (`Qwen3ForCausalLM`): pre-norm decoder layers of grouped-query attention with
//! per-head q/k RMSNorm and rotary embeddings, and a SiLU-GLU MLP; tied or untied lm_head.
//!
//! sluice uses it as a small draft model for exact speculative decoding, so it follows
//! transformers' `models/qwen3/modeling_qwen3.py` (5.17) operation for operation in f32, and is
//! checked stage by stage against goldens that transformers produced
//! (`tools/gen_qwen3_goldens.py`, `tests/fixtures/qwen3`). Each file cites the reference code it
//! ports.
//!
//! A pass runs T positions layer-major; the pass's keys and values are staged in
//! [`Qwen3State`] until `commit(n)` / `rollback()`. Every kernel is batch-invariant, so a T-row
//! pass gives bit for bit the logits of T single-row passes.

pub mod attention;
mod boundary;
pub mod config;
pub mod state;
pub mod weights;

use crate::combine::gated_mlp;
use crate::family::{add_into, put};
use crate::{LogitRows, ModelError};
use attention::Rope;
use config::Qwen3Config;
use sluice_checkpoint::Checkpoint;
use sluice_kernels::matmul;
use sluice_kernels::ops::silu_glu;
use std::sync::Arc;
use weights::{Linear, Qwen3Weights};

pub use crate::kimi_k3::Trace;
pub use state::Qwen3State;

/// What a layer needs besides its weights: the bytes of its matrices (the mapped checkpoint, or
/// the layer's placed spine piece in a family that places its spine, see [`crate::spine`]).
pub(crate) struct Ctx<'a> {
    pub(crate) src: &'a dyn crate::spine::TensorBytes,
}

impl Ctx<'_> {
    /// `x [t, cols] → [t, rows]` through a weight matrix.
    pub(crate) fn mm(&self, m: &Linear, x: &[f32], t: usize) -> Vec<f32> {
        let mut out = vec![0.0f32; t * m.rows()];
        matmul(&m.get(self.src), x, t, &mut out);
        out
    }
}

/// The loaded Qwen3 model.
pub struct Qwen3 {
    cfg: Qwen3Config,
    ckpt: Arc<Checkpoint>,
    weights: Qwen3Weights,
    rope: Rope,
}

impl std::fmt::Debug for Qwen3 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qwen3")
            .field("layers", &self.cfg.num_hidden_layers)
            .field("hidden_size", &self.cfg.hidden_size)
            .field("vocab_size", &self.cfg.vocab_size)
            .finish_non_exhaustive()
    }
}

impl Qwen3 {
    /// Loads the model from an opened checkpoint: parses `config.json` and resolves and checks
    /// every tensor once.
    pub fn load(ckpt: Arc<Checkpoint>) -> Result<Self, ModelError> {
        let cfg = Qwen3Config::from_json(ckpt.config().text_config())?;
        let weights = Qwen3Weights::load(&ckpt, &cfg)?;
        let rope = Rope::new(cfg.head_dim, cfg.rope_theta);
        Ok(Self { cfg, ckpt, weights, rope })
    }

    /// The typed configuration.
    pub fn config(&self) -> &Qwen3Config {
        &self.cfg
    }

    /// The rotary embedding (`inv_freq` and cos/sin rows, as HF's `model.rotary_emb`).
    pub fn rope(&self) -> &Rope {
        &self.rope
    }

    /// Bytes of the weight matrices a pass reads from the checkpoint (a tied lm_head counted once).
    pub fn weight_bytes(&self) -> u64 {
        self.weights.byte_len(self.cfg.tie_word_embeddings)
    }

    /// What the model holds, for the memory plan: its weights (mapped whole), its KV cache per
    /// position and the working memory of a pass row.
    pub fn memory_needs(&self) -> crate::MemoryNeeds {
        let c = self.config();
        let (pass_per_row, prefill_per_row) = crate::working::row_charges(
            c.hidden_size,
            c.q_width() + 2 * c.kv_width(),
            0,
            0,
            c.intermediate_size,
            c.vocab_size,
            false,
        );
        crate::MemoryNeeds {
            spine: self.weight_bytes(),
            state_fixed: 0,
            state_per_position: (c.num_hidden_layers * c.kv_cache_row() * 2 * 4) as u64,
            pass_per_row,
            prefill_per_row,
        }
    }

    /// A fresh, empty sequence state.
    pub fn new_state(&self) -> Qwen3State {
        Qwen3State::new(self.cfg.num_hidden_layers, self.cfg.kv_width())
    }

    /// Runs `tokens` (T ≥ 1 positions after the state's committed ones) through the model,
    /// staging the new keys and values, and returns the logits of the rows `rows` asks for
    /// (`[rows, vocab]`). The caller must `commit(n)` or `rollback()` the state afterwards.
    ///
    /// With a trace, records `embed`, `layer{i}.attn_in`, `layer{i}.attn_out`, `layer{i}.mlp_in`,
    /// `layer{i}.mlp_out`, `layer{i}.out` (`[T, d]` each) and `final_norm` (`[rows, d]`).
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
            "qwen3",
            tokens,
            state.pending(),
            state.fits(c.num_hidden_layers, c.kv_width()),
            c.vocab_size,
        )?;
        let d = c.hidden_size;
        let ctx = Ctx { src: &self.ckpt };
        // inputs_embeds = self.embed_tokens(input_ids)
        let embed = self.weights.embed.get(&self.ckpt);
        let mut h = vec![0.0f32; t * d];
        for (row, &id) in h.chunks_exact_mut(d).zip(tokens) {
            embed.row_to_f32(id as usize, row);
        }
        put(&mut trace, || "embed".into(), &h);
        // position_ids = arange(T) + past_seen_tokens; one cos/sin table serves every layer.
        let rope = self.rope.rows(state.len(), t);
        state.begin(t);
        for (i, (lw, cache)) in self.weights.layers.iter().zip(&mut state.layers).enumerate() {
            // Qwen3DecoderLayer.forward: pre-norm attention and MLP, each added to the residual.
            let a_in = self.norm_rows(&h, &lw.input_norm);
            put(&mut trace, || format!("layer{i}.attn_in"), &a_in);
            let a = attention::forward(&ctx, &lw.attn, c, cache, &a_in, t, &rope);
            put(&mut trace, || format!("layer{i}.attn_out"), &a);
            add_into(&mut h, &a);
            let m_in = self.norm_rows(&h, &lw.post_norm);
            put(&mut trace, || format!("layer{i}.mlp_in"), &m_in);
            let m = mlp(&ctx, [&lw.gate, &lw.up, &lw.down], &m_in, t);
            put(&mut trace, || format!("layer{i}.mlp_out"), &m);
            add_into(&mut h, &m);
            put(&mut trace, || format!("layer{i}.out"), &h);
        }
        // hidden_states = self.norm(hidden_states); logits = self.lm_head(hidden_states[:, slice])
        let sel = rows.range(t);
        let n = sel.len();
        let normed = self.norm_rows(&h[sel.start * d..sel.end * d], &self.weights.norm);
        put(&mut trace, || "final_norm".into(), &normed);
        crate::served::finite_logits(ctx.mm(&self.weights.lm_head, &normed, n), state)
    }

    /// Qwen3RMSNorm on every row of `x [n, d]`.
    fn norm_rows(&self, x: &[f32], w: &[f32]) -> Vec<f32> {
        crate::served::norm_rows(x, w, self.cfg.hidden_size, self.cfg.rms_norm_eps)
    }
}

/// Qwen3MLP: `down_proj(silu(gate_proj(x)) * up_proj(x))`, [`crate::ROW_BLOCK`] rows at a time
/// (its gate, up and activation rows are the widest buffers; rows are independent, so the
/// result is bit-identical to one call over all rows).
/// Qwen3-MoE's dense layers run the same MLP.
pub(crate) fn mlp(
    ctx: &Ctx<'_>,
    [w_gate, w_up, w_down]: [&Linear; 3],
    x: &[f32],
    t: usize,
) -> Vec<f32> {
    let src = ctx.src;
    gated_mlp([&w_gate.get(src), &w_up.get(src), &w_down.get(src)], &silu_glu, x, t)
}

//! Kimi K3 (`KimiK3ForConditionalGeneration`, text model `kimi_linear`): AttnRes over KDA and
//! gated NoPE MLA layers, a dense layer 0, latent MoE with MXFP4 routed experts, untied lm_head.
//! The math follows K3.md §2 and mlx-lm 0.32.2 `models/kimi_k3.py`, the golden reference; each
//! file cites the reference function it ports.
//!
//! A pass runs T positions layer-major. Everything a pass changes in sequence state is staged in
//! [`K3State`] until `commit(n)` / `rollback()`.

pub mod boundary;
pub mod config;
pub mod inventory;
mod kda;
mod mla;
pub mod moe;
pub mod spine;
pub mod state;
pub mod synth;
pub mod weights;
pub mod working;

use crate::{LogitRows, ModelError};
use config::K3Config;
use sluice_checkpoint::Checkpoint;
use sluice_core::DType;
use sluice_core::MemoryBudget;
use sluice_kernels::matmul;
use sluice_kernels::ops::{rms_norm, softmax_inplace};
use sluice_store::{
    ExpertIndex, ExpertLayout, ExpertPart, ExpertStore, MappedExperts, SpineIndex, SpineStats,
    SpineStore, StreamingConfig, StreamingExperts,
};
use spine::{PieceRef, Spine, TensorBytes};
use state::{K3State, LayerShape, LayerState};
use std::collections::BTreeMap;
use std::sync::Arc;
use weights::{Attn, Ffn, K3Weights, Mat};

pub use moe::Route;

/// Per-stage tensors captured during a pass, for stage-by-stage comparison with goldens.
#[derive(Debug, Default)]
pub struct Trace {
    /// Stage name (`embed`, `layer{i}.attn_in`, `layer{i}.attn_out`, `layer{i}.mlp_in`,
    /// `layer{i}.mlp_out`, `final_hidden`) → `[T, d]` row-major f32.
    pub tensors: BTreeMap<String, Vec<f32>>,
    /// MoE layer → per-row routes.
    pub routes: BTreeMap<usize, Vec<Route>>,
    /// Record only the routes, no stage tensors (`--trace-routes`: a trace on every pass of a
    /// run must not copy every activation).
    pub routes_only: bool,
}

impl Trace {
    /// A trace that records the routes of a pass and nothing else.
    pub fn routes_only() -> Self {
        Self { routes_only: true, ..Self::default() }
    }

    fn put(trace: &mut Option<&mut Trace>, name: impl FnOnce() -> String, v: &[f32]) {
        if let Some(t) = trace.as_deref_mut().filter(|t| !t.routes_only) {
            t.tensors.insert(name(), v.to_vec());
        }
    }
}

/// What a layer needs besides its weights: its spine bytes, the expert store, and a way to
/// reach the next layer's spine piece (for the expert prefetch).
pub(crate) struct Ctx<'a> {
    pub(crate) spine: &'a dyn TensorBytes,
    pub(crate) experts: &'a dyn ExpertStore,
    placed: &'a Spine,
    ckpt: &'a Checkpoint,
}

impl<'a> Ctx<'a> {
    /// `x [t, cols] → [t, rows]` through a matrix of this layer.
    pub(crate) fn mm(&self, m: &Mat, x: &[f32], t: usize) -> Vec<f32> {
        self.mm_from(self.spine, m, x, t)
    }

    /// `x [t, cols] → [t, rows]` through a matrix whose bytes `src` holds.
    pub(crate) fn mm_from(&self, src: &dyn TensorBytes, m: &Mat, x: &[f32], t: usize) -> Vec<f32> {
        let mut out = vec![0.0f32; t * m.rows()];
        matmul(&m.get(src), x, t, &mut out);
        out
    }

    /// Layer `i`'s spine piece if it is at hand without starting a read.
    pub(crate) fn peek_layer(&self, i: usize) -> Option<PieceRef<'a>> {
        self.placed.peek(self.ckpt, spine::layer_piece(i))
    }
}

/// The loaded Kimi K3 model.
pub struct KimiK3 {
    cfg: K3Config,
    ckpt: Arc<Checkpoint>,
    weights: K3Weights,
    experts: Arc<dyn ExpertStore>,
    spine: Spine,
    prefetch: bool,
}

impl std::fmt::Debug for KimiK3 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KimiK3")
            .field("layers", &self.cfg.num_hidden_layers)
            .finish_non_exhaustive()
    }
}

/// Names of one K3 expert's six tensors (w1 gate, w2 down, w3 up; packed + scale).
pub fn expert_tensor_names(prefix: &str, layer: usize, e: usize) -> [String; 6] {
    let p = format!("{prefix}model.layers.{layer}.block_sparse_moe.experts.{e}");
    [
        format!("{p}.w1.weight_packed"),
        format!("{p}.w1.weight_scale"),
        format!("{p}.w2.weight_packed"),
        format!("{p}.w2.weight_scale"),
        format!("{p}.w3.weight_packed"),
        format!("{p}.w3.weight_scale"),
    ]
}

/// The layout of one K3 routed expert for the expert store: its six MXFP4 tensors in the order
/// of [`expert_tensor_names`] (packed `[inter, width/2]` / `[width, inter/2]`, E8M0 scales one
/// per 32 values).
#[derive(Debug, Clone, Copy)]
pub struct K3ExpertLayout {
    /// Expert FFN width (rows of w1/w3, cols of w2).
    pub inter: u64,
    /// Expert input width (cols of w1/w3, rows of w2): the latent width.
    pub hidden: u64,
}

impl ExpertLayout for K3ExpertLayout {
    fn parts(&self, layer: usize, expert: usize) -> Vec<ExpertPart> {
        let (i, h) = (self.inter, self.hidden);
        let shapes = [[i, h / 2], [i, h / 32], [h, i / 2], [h, i / 32], [i, h / 2], [i, h / 32]];
        expert_tensor_names("", layer, expert)
            .into_iter()
            .zip(shapes)
            .map(|(name, shape)| ExpertPart::whole(name, DType::U8, &shape))
            .collect()
    }
}

impl KimiK3 {
    /// Loads the model from an opened checkpoint, serving experts in place from its shards.
    pub fn load(ckpt: Arc<Checkpoint>) -> Result<Self, ModelError> {
        let cfg = K3Config::from_json(ckpt.config().text_config())?;
        let (n, moe, names) =
            (cfg.num_hidden_layers, Self::moe_layers(&cfg), Self::expert_layout(&cfg));
        let experts = MappedExperts::open(ckpt.clone(), n, &moe, cfg.num_experts, &names)?;
        Self::with_store(ckpt, Arc::new(experts))
    }

    /// The 0-based layers with routed experts.
    pub fn moe_layers(cfg: &K3Config) -> Vec<usize> {
        (0..cfg.num_hidden_layers).filter(|&i| cfg.is_moe(i)).collect()
    }

    /// How this family lays out one routed expert (for expert stores).
    pub fn expert_layout(cfg: &K3Config) -> K3ExpertLayout {
        K3ExpertLayout {
            inter: cfg.moe_intermediate_size as u64,
            hidden: cfg.expert_width() as u64,
        }
    }

    /// Where the routed experts of this model are (for opening an expert store over them).
    pub fn routed_experts(&self) -> crate::RoutedExperts {
        Self::routed(&self.cfg)
    }

    /// Where the routed experts of a model of config `cfg` are.
    pub fn routed(cfg: &K3Config) -> crate::RoutedExperts {
        let layout = Self::expert_layout(cfg);
        crate::RoutedExperts {
            num_layers: cfg.num_hidden_layers,
            moe_layers: Self::moe_layers(cfg),
            per_layer: cfg.num_experts,
            expert_bytes: layout.parts(0, 0).iter().map(ExpertPart::len).sum(),
            layout: Arc::new(layout),
        }
    }

    /// The index of every routed expert of `ckpt` (config `cfg`) in place in its shards.
    pub fn expert_index(ckpt: &Checkpoint, cfg: &K3Config) -> Result<ExpertIndex, ModelError> {
        let (n, moe, names) =
            (cfg.num_hidden_layers, Self::moe_layers(cfg), Self::expert_layout(cfg));
        Ok(ExpertIndex::build(ckpt, n, &moe, cfg.num_experts, &names)?)
    }

    /// A store that streams the routed experts of `ckpt` (config `cfg`) from its shards through
    /// the slot cache `config` describes, charged to `budget`.
    pub fn streaming_experts(
        ckpt: &Checkpoint,
        cfg: &K3Config,
        config: &StreamingConfig,
        budget: &MemoryBudget,
    ) -> Result<StreamingExperts, ModelError> {
        let (n, moe, names) =
            (cfg.num_hidden_layers, Self::moe_layers(cfg), Self::expert_layout(cfg));
        Ok(StreamingExperts::open(ckpt, n, &moe, cfg.num_experts, &names, config, budget)?)
    }

    /// Loads the spine from `ckpt` and takes routed experts from `experts`.
    pub fn with_store(
        ckpt: Arc<Checkpoint>,
        experts: Arc<dyn ExpertStore>,
    ) -> Result<Self, ModelError> {
        let cfg = K3Config::from_json(ckpt.config().text_config())?;
        let weights = K3Weights::load(&ckpt, &cfg)?;
        Ok(Self { cfg, ckpt, weights, experts, spine: Spine::Mapped, prefetch: false })
    }

    /// The spine pieces of this model (embedding, layers, head) and their byte spans, for
    /// planning a placement and opening a [`SpineStore`] over them.
    pub fn spine_index(&self) -> Result<SpineIndex, ModelError> {
        spine::index(&self.weights, &self.ckpt)
    }

    /// Bytes of the small f32 vectors the model keeps whatever the spine placement.
    pub fn spine_small_bytes(&self) -> u64 {
        spine::small_bytes(&self.weights)
    }

    /// Takes spine bytes from `store` instead of the mapped checkpoint. The store must have
    /// been opened on [`Self::spine_index`].
    pub fn set_spine(&mut self, store: Arc<SpineStore>) -> Result<(), ModelError> {
        if *store.index() != self.spine_index()? {
            return Err(ModelError::Config(
                "the spine store was opened on another model's spine index".into(),
            ));
        }
        self.spine = Spine::Placed(store);
        Ok(())
    }

    /// Spine I/O counters (all zero while the spine is mapped).
    pub fn spine_stats(&self) -> SpineStats {
        self.spine.stats()
    }

    /// Takes routed experts from `experts` from now on.
    pub fn set_experts(&mut self, experts: Arc<dyn ExpertStore>) {
        self.experts = experts;
    }

    /// Turns next-layer expert prefetch on or off (worth it when experts stream from disk).
    pub fn set_prefetch(&mut self, on: bool) {
        self.prefetch = on;
    }

    /// The first MoE layer, if any.
    fn first_moe(&self) -> Option<usize> {
        self.weights.layers.iter().position(|l| matches!(l.ffn, Ffn::Moe(_)))
    }

    /// The next MoE layer after `i` and its weights.
    fn next_moe(&self, i: usize) -> Option<(usize, &weights::MoeWeights)> {
        self.weights.layers.iter().enumerate().skip(i + 1).find_map(|(j, l)| match &l.ffn {
            Ffn::Moe(w) => Some((j, &**w)),
            Ffn::Dense(_) => None,
        })
    }

    /// Weight bytes every pass sweeps besides routed experts: the spine without the embedding
    /// table, of which a pass reads only its own rows.
    pub fn spine_bytes_per_pass(&self) -> u64 {
        let inv = inventory::inventory(&self.ckpt, &self.cfg);
        let (_, embed) = inv.kinds.get("embedding").copied().unwrap_or_default();
        inv.spine_bytes.saturating_sub(embed)
    }

    /// The typed configuration.
    pub fn config(&self) -> &K3Config {
        &self.cfg
    }

    /// The expert store in use.
    pub fn experts(&self) -> &Arc<dyn ExpertStore> {
        &self.experts
    }

    /// A fresh, empty sequence state.
    pub fn new_state(&self) -> K3State {
        K3State::new(&LayerShape::of_config(&self.cfg))
    }

    /// Runs `tokens` (T ≥ 1 positions after the state's committed ones) through the model,
    /// staging the state changes, and returns the logits of the rows `rows` asks for
    /// (`[rows, vocab]`). The caller must `commit(n)` or `rollback()` the state afterwards.
    pub fn forward(
        &self,
        state: &mut K3State,
        tokens: &[u32],
        rows: LogitRows,
        mut trace: Option<&mut Trace>,
    ) -> Result<Vec<f32>, ModelError> {
        let c = &self.cfg;
        let t = tokens.len();
        crate::family::check_pass("kimi_k3", tokens, state.pending(), true, c.vocab_size)?;
        let d = c.hidden_size;
        // One pass at a time through streamed pieces; held until the logits are out.
        let _pass = self.spine.begin_pass();
        let mut h = vec![0.0f32; t * d];
        self.spine.embed(&self.ckpt, &self.weights.embed, tokens, &mut h)?;
        if !crate::finite::all_finite(&h) {
            let bad = h.chunks_exact(d).position(|r| !crate::finite::all_finite(r)).unwrap_or(0);
            return Err(ModelError::NonFiniteActivation {
                stage: format!("the embedding of token {}", tokens[bad]),
                cause: self.culprit_rows(&self.weights.embed, tokens[bad] as usize),
            });
        }
        Trace::put(&mut trace, || "embed".into(), &h);
        state.begin(t, rows == LogitRows::Prefill);
        match self.layers_and_head(state, h, t, rows, &mut trace) {
            Ok(logits) => Ok(logits),
            Err(e) => {
                state.rollback();
                Err(e)
            }
        }
    }

    /// The decoder layers, the final norm and the lm_head of a pass whose state is begun.
    fn layers_and_head(
        &self,
        state: &mut K3State,
        h: Vec<f32>,
        t: usize,
        rows: LogitRows,
        trace: &mut Option<&mut Trace>,
    ) -> Result<Vec<f32>, ModelError> {
        let c = &self.cfg;
        let d = c.hidden_size;
        let hidden = self.layers(state, h, t, trace)?;
        Trace::put(trace, || "final_hidden".into(), &hidden);
        let sel: Vec<usize> = match rows {
            LogitRows::All => (0..t).collect(),
            LogitRows::Last | LogitRows::Prefill => vec![t - 1],
        };
        let mut normed = vec![0.0f32; sel.len() * d];
        for (j, &ti) in sel.iter().enumerate() {
            rms_norm(
                &hidden[ti * d..(ti + 1) * d],
                Some(&self.weights.norm),
                c.rms_norm_eps,
                &mut normed[j * d..(j + 1) * d],
            );
        }
        let head = self.spine.piece(&self.ckpt, spine::head_piece(c.num_hidden_layers))?;
        let ctx = self.ctx(&head);
        let logits = ctx.mm(&self.weights.lm_head, &normed, sel.len());
        if !crate::finite::all_finite(&logits) {
            return Err(ModelError::NonFiniteActivation {
                stage: "the logits".into(),
                cause: self.culprit(&[&self.weights.lm_head], "the lm_head"),
            });
        }
        Ok(logits)
    }

    /// Names the first of `mats` that holds a non-finite value, scanning their bytes in the
    /// mapped checkpoint (only after a check failed, so the cost never lands on a good pass).
    fn culprit(&self, mats: &[&Mat], what: &str) -> String {
        for m in mats {
            for e in std::iter::once(m.entry()).chain(m.scale_entry()) {
                if let Some((i, x)) = crate::finite::scan_bytes(e.dtype, self.ckpt.bytes(e)) {
                    return format!(
                        "tensor {} ({}) holds {} at element {i}",
                        e.name,
                        self.ckpt.shard_file(e).display(),
                        crate::finite::name(x)
                    );
                }
            }
        }
        format!(
            "no weight of {what} holds NaN/Inf, so a routed expert's weights do or the arithmetic \
             overflowed"
        )
    }

    /// Names the embedding row `row` if it holds a non-finite value.
    fn culprit_rows(&self, m: &Mat, row: usize) -> String {
        let e = m.entry();
        let rb = usize::try_from(m.row_bytes()).unwrap_or(usize::MAX);
        let b = self.ckpt.bytes(e);
        let r = b.get(row.saturating_mul(rb)..row.saturating_add(1).saturating_mul(rb));
        match r.and_then(|r| crate::finite::scan_bytes(e.dtype, r)) {
            Some((i, x)) => format!(
                "tensor {} ({}) holds {} in row {row}, column {i}",
                e.name,
                self.ckpt.shard_file(e).display(),
                crate::finite::name(x)
            ),
            None => self.culprit(&[m], "the embedding"),
        }
    }

    fn ctx<'a>(&'a self, piece: &'a PieceRef<'a>) -> Ctx<'a> {
        Ctx { spine: piece, experts: self.experts.as_ref(), placed: &self.spine, ckpt: &self.ckpt }
    }

    fn layers(
        &self,
        state: &mut K3State,
        embed: Vec<f32>,
        t: usize,
        trace: &mut Option<&mut Trace>,
    ) -> Result<Vec<f32>, ModelError> {
        let c = &self.cfg;
        let d = c.hidden_size;
        let eps = c.rms_norm_eps;
        let mut anchors: Vec<Vec<f32>> = Vec::new();
        let mut prefix: Option<Vec<f32>> = Some(embed);
        // Rows in chunks on the kernel pool (each row's norm is the same code on any thread).
        let norm_rows = |x: &[f32], w: &[f32]| crate::served::norm_rows(x, w, d, eps);
        for (i, lw) in self.weights.layers.iter().enumerate() {
            // This layer's spine piece: resident, or its stream buffer (read during the
            // previous layer); the guard is dropped at the end of the layer.
            let piece = self.spine.piece(&self.ckpt, spine::layer_piece(i))?;
            let ctx = &self.ctx(&piece);
            let cur = prefix.take().expect("invariant: prefix is set between layers");
            // mlx-lm KimiK3DecoderLayer.__call__: mix with the old anchors, then bank the raw
            // layer input at a block boundary and restart the partial sum at the attention output.
            let mixed = match &lw.attn_res {
                Some(wr) => attn_res(&anchors, &cur, wr, d, eps),
                None => cur.clone(),
            };
            let block_start = c.attn_res_block_size.is_some_and(|b| i % b == 0);
            let partial = if block_start {
                anchors.push(cur);
                None
            } else {
                Some(cur)
            };
            if let (true, Ffn::Moe(w)) = (self.prefetch && self.first_moe() == Some(i), &lw.ffn) {
                moe::guess_first(ctx, w, c, i, &norm_rows(&mixed, &lw.post_norm), t);
            }
            let a_in = norm_rows(&mixed, &lw.input_norm);
            // Each residual-stream buffer is dropped once used, not at the end of the layer:
            // a long prompt pass holds a few hidden rows per prompt row, not six.
            drop(mixed);
            Trace::put(trace, || format!("layer{i}.attn_in"), &a_in);
            let a = match (&lw.attn, &mut state.layers[i]) {
                (Attn::Kda(w), LayerState::Kda(s)) => kda::forward(ctx, w, c, s, &a_in, t),
                (Attn::Mla(w), LayerState::Mla(s)) => mla::forward(ctx, w, c, s, &a_in, t),
                _ => {
                    return Err(ModelError::Config(format!(
                        "layer {i}: state kind does not match weights"
                    )))
                }
            };
            drop(a_in);
            Trace::put(trace, || format!("layer{i}.attn_out"), &a);
            // Without AttnRes `partial` is the layer input, so this is the plain residual.
            let mut p = match partial {
                Some(mut p) => {
                    add_into(&mut p, &a);
                    drop(a);
                    p
                }
                None => a,
            };
            let m_in = match &lw.mlp_res {
                Some(wr) => norm_rows(&attn_res(&anchors, &p, wr, d, eps), &lw.post_norm),
                None => norm_rows(&p, &lw.post_norm),
            };
            Trace::put(trace, || format!("layer{i}.mlp_in"), &m_in);
            // The MoE block takes its input by value and drops it once dead.
            let m = match &lw.ffn {
                Ffn::Dense(w) => moe::mlp(ctx, w, c, &m_in, t),
                Ffn::Moe(w) => {
                    let next = if self.prefetch { self.next_moe(i) } else { None };
                    moe::forward(ctx, w, c, moe::Position { layer: i, next }, m_in, t, trace)?
                }
            };
            Trace::put(trace, || format!("layer{i}.mlp_out"), &m);
            add_into(&mut p, &m);
            if !crate::finite::all_finite(&p) {
                return Err(ModelError::NonFiniteActivation {
                    stage: format!("the output of layer {i}"),
                    cause: self.culprit(&lw.mats(), &format!("layer {i}")),
                });
            }
            prefix = Some(p);
        }
        let last = prefix.expect("invariant: prefix is set after the last layer");
        Ok(match &self.weights.output_res {
            Some(wr) => attn_res(&anchors, &last, wr, d, eps),
            None => last,
        })
    }
}

fn add_into(dst: &mut [f32], src: &[f32]) {
    for (a, b) in dst.iter_mut().zip(src) {
        *a += b;
    }
}

/// Block Attention Residuals for every row (mlx-lm `_attn_res_combine`): logits
/// `(v · w_eff) · rsqrt(mean(v²) + eps)` for each anchor and the partial sum, softmax over the
/// sources (prefix last), and the softmax-weighted sum of the **raw** sources. With no anchors
/// the partial sum passes through unchanged.
fn attn_res(anchors: &[Vec<f32>], partial: &[f32], w_eff: &[f32], d: usize, eps: f32) -> Vec<f32> {
    if anchors.is_empty() {
        return partial.to_vec();
    }
    let t = partial.len() / d;
    let mut out = vec![0.0f32; partial.len()];
    // Rows are independent, so blocks of them go to the pool's threads (a prompt pass ran
    // every row of every layer's two combinations on the engine thread alone).
    let threads = sluice_kernels::pool::with_current(sluice_kernels::Pool::threads);
    let rows = t.div_ceil(threads * 2).max(1);
    sluice_kernels::pool::map_chunks_mut(&mut out, rows * d, |i, block| {
        let mut logits = vec![0.0f32; anchors.len() + 1];
        for (bi, o) in block.chunks_exact_mut(d).enumerate() {
            let ti = i * rows + bi;
            attn_res_row(anchors, partial, w_eff, ti * d..(ti + 1) * d, eps, &mut logits, o);
        }
    });
    out
}

/// [`attn_res`] of the row at `r`, into `o` (zeroed), with `logits` as scratch.
fn attn_res_row(
    anchors: &[Vec<f32>],
    partial: &[f32],
    w_eff: &[f32],
    r: std::ops::Range<usize>,
    eps: f32,
    logits: &mut [f32],
    o: &mut [f32],
) {
    let d = r.len();
    let sources =
        || anchors.iter().map(|a| &a[r.clone()]).chain(std::iter::once(&partial[r.clone()]));
    for (j, src) in sources().enumerate() {
        let dot: f64 = src.iter().zip(w_eff).map(|(&v, &w)| f64::from(v) * f64::from(w)).sum();
        let ss: f64 = src.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        #[allow(clippy::cast_precision_loss)]
        let inv = 1.0 / (ss / d as f64 + f64::from(eps)).sqrt();
        #[allow(clippy::cast_possible_truncation)]
        {
            logits[j] = (dot * inv) as f32;
        }
    }
    softmax_inplace(logits);
    for (j, src) in sources().enumerate() {
        let pj = logits[j];
        for (a, &v) in o.iter_mut().zip(src) {
            *a += pj * v;
        }
    }
}

//! The order in which a routed MoE block adds its experts' outputs, shared by every family.
//!
//! A row's routed output is `Σ weight_e · expert_e(x)` over the row's k experts, an f32 sum
//! whose rounding depends on the order of its terms. Every family adds them in **ascending
//! expert id**, starting from zero, into one running sum per row, as each expert's batch of
//! rows finishes: the expert store hands a layer's experts over in ascending id order
//! ([`sluice_store::ExpertStore::for_each`]), whatever order their reads finish in, so no row
//! keeps its k expert outputs until the layer's last expert arrives (at Kimi K3's widths that
//! was 229 KB per prompt row, the largest part of a prefill row's working memory).
//!
//! The order depends only on the row's own routing: never on how many rows a pass has, how it
//! is chunked, the thread count, the order reads finish in, or whether experts are streamed or
//! mapped, so a T-row pass equals T single-row passes bit for bit, and streamed output equals
//! mapped. For Qwen3-MoE, GPT-OSS and DeepSeek-V3 it is also the reference's order
//! (transformers' `index_add_` loop over `expert_hit`); Kimi K3's reference (mlx-lm) sums over
//! the router's top-k axis, which this order matches to within the goldens' tolerances.
//!
//! A store that holds a layer's experts resident at once (mapped) hands them over together
//! ([`sluice_store::ExpertStore::with_all`]); [`GluExpert::run_layer`] then runs them in
//! batches of [`LAYER_BATCH_BYTES`], three kernel-pool calls a batch (every expert's gate, up
//! and activation; every down projection; the weighted sums, split over columns, each cell
//! taking its experts' terms in ascending id), instead of two calls per expert. The cells and
//! the order of each sum are the per-expert path's, so the bits are too (`batch.rs`). GPT-OSS's
//! experts (interleaved gate/up rows with biases) batch the same way through the same loop and
//! buffers (`gpt_oss::moe::run_batches`).

mod batch;

pub use batch::layer_batch_held;
pub(crate) use batch::{batches, pair_bytes, with_batch, Batch, Laid};

use sluice_kernels::{matmul, matmul_add_rows, matmul_pair, Matrix};
use sluice_store::StoreError;

/// Bytes the buffers of a batch of a layer's experts may take in [`GluExpert::run_layer`]:
/// each (prompt row, expert) pair of a batch needs `2 · inter + max(d_in, d_out) + 1` f32
/// (gate and activation, up, the gathered input row that then takes the output, its weight)
/// and its prompt row's index; a GPT-OSS pair `3 · inter + d + 1` (gate_up, activation, input
/// then output row, weight: 46 KB at gpt-oss-20b's widths, so 364 pairs a batch). Experts are batched in ascending id while their sum fits; an
/// expert that alone does not fit runs the per-expert path. At 16 MiB a Qwen3-30B-A3B decode
/// token's 8 experts take 115 KB and a 256-row prompt's 2,048 pairs two batches. The buffers
/// are kept for the thread's life and never hold more than this ([`layer_batch_held`]); the
/// memory plan charges it as scratch (the engine's `place::plan_headroom`), whatever the pass.
pub const LAYER_BATCH_BYTES: usize = 16 << 20;

/// Each row's route from router `logits [t, e]` by `route`, rows in chunks on the kernel
/// pool (each route is a function of its own row, so the split changes nothing): a 256-row
/// prefill's softmaxes and sorts took the engine thread alone.
pub(crate) fn routes_on_pool(
    logits: &[f32],
    e: usize,
    route: impl Fn(&[f32]) -> crate::kimi_k3::Route + Sync,
) -> Vec<crate::kimi_k3::Route> {
    let per = crate::served::ROWS_PER_CHUNK * e.max(1);
    if logits.len() <= per {
        return logits.chunks_exact(e.max(1)).map(route).collect();
    }
    let chunks = logits.len().div_ceil(per);
    sluice_kernels::pool::map(chunks, |i| {
        let rows = &logits[i * per..((i + 1) * per).min(logits.len())];
        rows.chunks_exact(e).map(&route).collect::<Vec<_>>()
    })
    .into_iter()
    .flatten()
    .collect()
}

/// The routed experts of a pass: for each of the `e` experts the (row, slot) pairs whose
/// routes chose it, and the ids of those chosen by any row, ascending (the union a MoE block
/// asks the store for: each expert read once per pass, whatever its number of rows).
pub(crate) fn users(
    routes: &[crate::kimi_k3::Route],
    e: usize,
) -> (Vec<Vec<(usize, usize)>>, Vec<u32>) {
    let mut users: Vec<Vec<(usize, usize)>> = vec![Vec::new(); e];
    for (row, r) in routes.iter().enumerate() {
        for (slot, &id) in r.ids.iter().enumerate() {
            users[id as usize].push((row, slot));
        }
    }
    let ids: Vec<u32> =
        (0..e).filter(|&i| !users[i].is_empty()).filter_map(|i| u32::try_from(i).ok()).collect();
    (users, ids)
}

/// Checks that the experts of one MoE block reach the combination in ascending id order (the
/// store's contract, which the running sums rely on for their rounding).
pub(crate) struct IdOrder {
    layer: usize,
    last: Option<u32>,
}

impl IdOrder {
    /// A block of `layer` that has added no expert yet.
    pub(crate) fn new(layer: usize) -> Self {
        Self { layer, last: None }
    }

    /// Records that expert `id` is added next; an error if it does not come after the last.
    pub(crate) fn next(&mut self, id: u32) -> Result<(), StoreError> {
        if self.last.is_some_and(|l| l >= id) {
            return Err(StoreError::Consumer(format!(
                "the expert store handed expert {id} of layer {} after expert {}: a row's \
                 experts are added in ascending id order",
                self.layer,
                self.last.unwrap_or(0)
            )));
        }
        self.last = Some(id);
        Ok(())
    }
}

/// The batch buffers of a gated expert (`down(glu(gate x, up x))`), reused from expert to expert:
/// three, not five. The gate's buffer takes the activation in place ([`gate_up_act`]), and
/// the input rows, dead once the gate and up projections have read them, take the output.
#[derive(Default)]
pub(crate) struct GluExpert {
    xs: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    /// The block's prompt rows and their routing weights.
    to: Vec<usize>,
    weights: Vec<f32>,
}

impl GluExpert {
    /// Runs one expert on the `(row, slot)` pairs that chose it, `block` rows at a time (the
    /// buffers hold one block however many prompt rows chose it; rows are independent in the
    /// kernels, so the block changes no bit), reading each row's input from `x [T, d_in]` and adding
    /// `weight(row, slot) · y` into that row's running sum in `out [T, d_out]`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run(
        &mut self,
        [gate_w, up_w, down_w]: [&Matrix<'_>; 3],
        glu: impl Fn(&[f32], &[f32], &mut [f32]) + Sync,
        users: &[(usize, usize)],
        block: usize,
        x: &[f32],
        weight: impl Fn(usize, usize) -> f32,
        out: &mut [f32],
    ) {
        let (d_in, inter, d_out) = (gate_w.cols(), gate_w.rows(), down_w.rows());
        let Self { xs, gate, up, to, weights } = self;
        for us in users.chunks(block.max(1)) {
            let n = us.len();
            set_len(xs, n * d_in);
            for (&(row, _), xr) in us.iter().zip(xs.chunks_exact_mut(d_in)) {
                xr.copy_from_slice(&x[row * d_in..(row + 1) * d_in]);
            }
            set_len(gate, n * inter);
            set_len(up, n * inter);
            gate_up_act(gate_w, up_w, &glu, xs, n, gate, up);
            let y = &mut *xs;
            set_len(y, n * d_out);
            to.clear();
            to.extend(us.iter().map(|&(row, _)| row));
            weights.clear();
            weights.extend(us.iter().map(|&(row, slot)| weight(row, slot)));
            // Each chunk of the down projection adds its cells into the rows' running sums.
            matmul_add_rows(down_w, gate, n, y, to, weights, out);
        }
    }
}

/// The activation a chunk of a gate/up call applies in place to its cells: `g = glu(g, u)`
/// through a small copy of the gate values (the activation reads them whole).
pub(super) fn activate(
    glu: &(impl Fn(&[f32], &[f32], &mut [f32]) + Sync),
) -> impl Fn(&mut [f32], &mut [f32]) + Sync + '_ {
    move |g: &mut [f32], u: &mut [f32]| {
        let mut held = [0.0f32; 64];
        for (gc, uc) in g.chunks_mut(held.len()).zip(u.chunks(held.len())) {
            let held = &mut held[..gc.len()];
            held.copy_from_slice(gc);
            glu(held, uc, gc);
        }
    }
}

/// `gate = glu(x · Gᵀ, x · Uᵀ)` for `x [n, d_in]`: the gate and up projections and the
/// activation in one kernel-pool call ([`matmul_pair`]), each chunk activating its own cells
/// in place as soon as it has computed them; `up` is the up projection's buffer. The
/// activation is elementwise and every cell is computed as [`matmul`] computes it, so the
/// result is bit for bit that of two calls and an activation over the whole. As three calls,
/// each ended with the engine thread waiting for the helpers' last chunks, and the activation
/// ran on the engine thread alone: in a one-row decode pass, Kimi K3's 16 experts of 3,072
/// SiTU values a layer were half of its work outside the pool (a 2-thread profile on the K3
/// slice).
pub(crate) fn gate_up_act(
    gate_w: &Matrix<'_>,
    up_w: &Matrix<'_>,
    glu: &(impl Fn(&[f32], &[f32], &mut [f32]) + Sync),
    x: &[f32],
    n: usize,
    gate: &mut [f32],
    up: &mut [f32],
) {
    matmul_pair(gate_w, up_w, x, n, gate, up, &activate(glu));
}

/// A gated MLP, `down(glu(gate x, up x))`, on `x [t, d_in]`, [`crate::ROW_BLOCK`] rows at a
/// time (its gate and up rows are the widest buffers of a dense layer; rows are independent,
/// so the result is bit-identical to one call over all rows).
pub(crate) fn gated_mlp(
    [gate_w, up_w, down_w]: [&Matrix<'_>; 3],
    glu: &(impl Fn(&[f32], &[f32], &mut [f32]) + Sync),
    x: &[f32],
    t: usize,
) -> Vec<f32> {
    crate::row_blocks(x, t, |xb, n| {
        let mut gate = vec![0.0f32; n * gate_w.rows()];
        let mut up = vec![0.0f32; n * up_w.rows()];
        gate_up_act(gate_w, up_w, glu, xb, n, &mut gate, &mut up);
        drop(up);
        let mut out = vec![0.0f32; n * down_w.rows()];
        matmul(down_w, &gate, n, &mut out);
        out
    })
}

/// Makes `v` `len` elements long for values about to be overwritten; when its allocation must
/// grow, it grows to exactly `len` (the buffers change width from one use to the next, and a
/// doubling could leave one twice what the block needs).
fn set_len(v: &mut Vec<f32>, len: usize) {
    if v.capacity() < len {
        v.clear();
        v.reserve_exact(len);
    }
    v.resize(len, 0.0);
}

#[cfg(test)]
mod tests;

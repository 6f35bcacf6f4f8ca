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
//! the order of each sum are the per-expert path's, so the bits are too.

use sluice_kernels::{
    add_rows_many, matmul, matmul_add_rows, matmul_many, matmul_pair, matmul_pair_many, AddRows,
    Job, Matrix, PairJob,
};
use sluice_store::{ExpertStore, ExpertView, StoreError};

/// Bytes the buffers of a batch of a layer's experts may take in [`GluExpert::run_layer`]:
/// each (prompt row, expert) pair of a batch needs `2 · inter + max(d_in, d_out) + 1` f32
/// (gate and activation, up, the gathered input row that then takes the output, its weight)
/// and its prompt row's index. Experts are batched in ascending id while their sum fits; an
/// expert that alone does not fit runs the per-expert path. At 16 MiB a Qwen3-30B-A3B decode
/// token's 8 experts take 115 KB and a 256-row prompt's 2,048 pairs two batches. The buffers
/// are kept for the thread's life and never hold more than this ([`layer_batch_held`]); the
/// memory plan charges it as scratch (the engine's `place::plan_headroom`), whatever the pass.
pub const LAYER_BATCH_BYTES: usize = 16 << 20;

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

/// The buffers of the batched path ([`LAYER_BATCH_BYTES`] at most): every pair's f32 values
/// (input then output row, gate and activation, up, weight), and its prompt row.
#[derive(Default)]
struct Batch {
    vals: Vec<f32>,
    to: Vec<usize>,
}

impl Batch {
    /// Room for `vals` values and `pairs` rows. Values are overwritten before they are read,
    /// so a buffer long enough already is not filled again; one too small is replaced with
    /// both buffers exactly as large as asked, so what is held is one batch's need, never more
    /// than the cap.
    fn fit(&mut self, vals: usize, pairs: usize) {
        if self.vals.capacity() < vals || self.to.capacity() < pairs {
            *self = Self::default();
            self.vals.reserve_exact(vals);
            self.to.reserve_exact(pairs);
        }
        if self.vals.len() < vals {
            self.vals.resize(vals, 0.0);
        }
        self.to.clear();
    }

    /// Bytes held.
    fn held(&self) -> usize {
        self.vals.capacity() * size_of::<f32>() + self.to.capacity() * size_of::<usize>()
    }
}

/// Bytes one (prompt row, expert) pair of a batch takes (see [`LAYER_BATCH_BYTES`]).
fn pair_bytes([g, _, d]: &[Matrix<'_>; 3]) -> usize {
    (2 * g.rows() + g.cols().max(d.rows()) + 1) * size_of::<f32>() + size_of::<usize>()
}

thread_local! {
    /// This thread's batch buffers, kept for its life: made afresh for each layer, their zero
    /// fill and first-touch page faults took 1.5% of a pp256's wall on the engine thread alone
    /// (5.5% → 4.0%, the Qwen3-30B-A3B slice, 2 threads).
    static BATCH: std::cell::RefCell<Batch> = std::cell::RefCell::default();
}

/// Bytes the calling thread's batch buffers hold ([`LAYER_BATCH_BYTES`] at most), for tests
/// that measure a pass's working memory apart from the plan's fixed charges.
pub fn layer_batch_held() -> usize {
    BATCH.with_borrow(Batch::held)
}

impl GluExpert {
    /// Runs the routed experts `ids` of `layer` (ascending), taken from `store`, each on the
    /// `(row, slot)` pairs `users[id]` that chose it, adding `weight(row, slot) · y` into the
    /// rows' running sums in `out [T, d_out]`, in ascending id; then hands `next` to the store
    /// to prefetch. `matrices` makes an expert's gate, up and down matrices from its view.
    ///
    /// When the store hands the layer's experts all at once ([`ExpertStore::with_all`]), they
    /// run in batches of [`LAYER_BATCH_BYTES`], each batch in three kernel-pool calls: gate,
    /// up and the activation of every expert of the batch ([`matmul_pair_many`]), every down
    /// projection into its own buffer ([`matmul_many`]), and the weighted sums
    /// ([`add_rows_many`], on the calling thread when small). Small experts made two calls
    /// each (Qwen3-30B-A3B: 16 a decode token and layer), each costing about what its work
    /// did. Otherwise (a streaming store, whose per-expert path overlaps reads with compute)
    /// each expert runs as it arrives ([`GluExpert::run`], `block` rows at a time). Every cell
    /// is computed by the same kernel code either way and each row's sum takes its experts'
    /// terms in ascending id, so the two paths give the same bits.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run_layer<M, G>(
        &mut self,
        store: &dyn ExpertStore,
        layer: usize,
        ids: &[u32],
        next: Option<(usize, &[u32])>,
        matrices: M,
        glu: G,
        users: &[Vec<(usize, usize)>],
        block: usize,
        x: &[f32],
        weight: impl Fn(usize, usize) -> f32,
        out: &mut [f32],
    ) -> Result<(), StoreError>
    where
        M: for<'v> Fn(u32, &ExpertView<'v>) -> Result<[Matrix<'v>; 3], StoreError>,
        G: Fn(&[f32], &[f32], &mut [f32]) + Sync,
    {
        let mut order = IdOrder::new(layer);
        let all = store.with_all(layer, ids, &mut |all| {
            let mut ms = Vec::with_capacity(all.len());
            for (id, v) in all {
                order.next(*id)?;
                ms.push((*id, matrices(*id, v)?));
            }
            BATCH.with_borrow_mut(|b| {
                self.run_batches(b, &ms, LAYER_BATCH_BYTES, &glu, users, block, x, &weight, out);
            });
            Ok(())
        })?;
        if all {
            if let Some((l, guess)) = next {
                store.prefetch(l, guess);
            }
            return Ok(());
        }
        store.for_each_then_prefetch(layer, ids, next, &mut |id, v| {
            order.next(id)?;
            let [g, u, d] = matrices(id, &v)?;
            self.run([&g, &u, &d], &glu, &users[id as usize], block, x, &weight, out);
            Ok(())
        })
    }

    /// The experts `ms` (ascending id) in batches of at most `cap` bytes of buffers
    /// ([`LAYER_BATCH_BYTES`]) held in `b`, in ascending id; an expert too large for a batch
    /// of its own runs [`GluExpert::run`].
    #[allow(clippy::too_many_arguments)]
    fn run_batches(
        &mut self,
        b: &mut Batch,
        ms: &[(u32, [Matrix<'_>; 3])],
        cap: usize,
        glu: &(impl Fn(&[f32], &[f32], &mut [f32]) + Sync),
        users: &[Vec<(usize, usize)>],
        block: usize,
        x: &[f32],
        weight: &impl Fn(usize, usize) -> f32,
        out: &mut [f32],
    ) {
        let bytes = |(id, m): &(u32, [Matrix<'_>; 3])| users[*id as usize].len() * pair_bytes(m);
        let mut start = 0;
        while start < ms.len() {
            let (mut end, mut sum) = (start + 1, bytes(&ms[start]));
            while end < ms.len() && sum + bytes(&ms[end]) <= cap {
                sum += bytes(&ms[end]);
                end += 1;
            }
            if sum > cap {
                let (id, [g, u, d]) = &ms[start];
                self.run([g, u, d], glu, &users[*id as usize], block, x, weight, out);
            } else {
                batch(b, &ms[start..end], glu, users, x, weight, out);
            }
            start = end;
        }
    }
}

/// One batch of experts `ms` (ascending id) in three kernel-pool calls (see
/// [`GluExpert::run_layer`]), in the buffers `b`. Each expert's region of the input rows holds
/// its gathered rows, then, once the gate and up projections have read them, its output rows.
fn batch(
    b: &mut Batch,
    ms: &[(u32, [Matrix<'_>; 3])],
    glu: &(impl Fn(&[f32], &[f32], &mut [f32]) + Sync),
    users: &[Vec<(usize, usize)>],
    x: &[f32],
    weight: &impl Fn(usize, usize) -> f32,
    out: &mut [f32],
) {
    let rows = |id: u32| users[id as usize].len();
    let wide = |[g, _, d]: &[Matrix<'_>; 3]| g.cols().max(d.rows());
    let n_xs: usize = ms.iter().map(|(id, m)| rows(*id) * wide(m)).sum();
    let n_gate: usize = ms.iter().map(|(id, [g, ..])| rows(*id) * g.rows()).sum();
    let pairs: usize = ms.iter().map(|(id, _)| rows(*id)).sum();
    b.fit(n_xs + 2 * n_gate + pairs, pairs);
    let Batch { vals, to } = b;
    let (xs, rest) = vals.split_at_mut(n_xs);
    let (gate, rest) = rest.split_at_mut(n_gate);
    let (up, rest) = rest.split_at_mut(n_gate);
    let weights = &mut rest[..pairs];
    let mut at = 0;
    for (id, m) in ms {
        let d_in = m[0].cols();
        for (j, &(row, slot)) in users[*id as usize].iter().enumerate() {
            let xr = &mut xs[at + j * d_in..at + (j + 1) * d_in];
            xr.copy_from_slice(&x[row * d_in..(row + 1) * d_in]);
            weights[to.len()] = weight(row, slot);
            to.push(row);
        }
        at += rows(*id) * wide(m);
    }
    // Each expert's slices of the three buffers, in id order.
    let mut regions = Vec::with_capacity(ms.len());
    let (mut xr, mut gr, mut ur) = (xs, gate, up);
    for (id, m) in ms {
        let n = rows(*id);
        let (xe, xrest) = std::mem::take(&mut xr).split_at_mut(n * wide(m));
        let (ge, grest) = std::mem::take(&mut gr).split_at_mut(n * m[0].rows());
        let (ue, urest) = std::mem::take(&mut ur).split_at_mut(n * m[0].rows());
        (xr, gr, ur) = (xrest, grest, urest);
        regions.push((n, xe, ge, ue));
    }
    let mut pairs: Vec<PairJob<'_>> = ms
        .iter()
        .zip(regions.iter_mut())
        .map(|((_, [g, u, _]), (n, xe, ge, ue))| PairJob {
            a: *g,
            b: *u,
            x: &xe[..*n * g.cols()],
            t: *n,
            out_a: ge,
            out_b: ue,
        })
        .collect();
    matmul_pair_many(&mut pairs, &activate(glu));
    drop(pairs);
    // The down projections, each into its expert's (now dead) input rows.
    let mut downs: Vec<Job<'_>> = ms
        .iter()
        .zip(regions.iter_mut())
        .map(|((_, [_, _, d]), (n, xe, ge, _))| Job {
            m: *d,
            x: ge,
            t: *n,
            out: &mut xe[..*n * d.rows()],
        })
        .collect();
    matmul_many(&mut downs);
    drop(downs);
    // out[row] += weight · y, experts in ascending id (the order of `ms`).
    let mut parts = Vec::with_capacity(ms.len());
    let mut k = 0;
    for ((_, [_, _, d]), (n, xe, _, _)) in ms.iter().zip(&regions) {
        parts.push(AddRows {
            y: &xe[..*n * d.rows()],
            to: &to[k..k + *n],
            weight: &weights[k..k + *n],
        });
        k += *n;
    }
    let width = ms.first().map_or(1, |(_, [_, _, d])| d.rows());
    add_rows_many(&parts, width, out);
}

/// The activation a chunk of a gate/up call applies in place to its cells: `g = glu(g, u)`
/// through a small copy of the gate values (the activation reads them whole).
fn activate(
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
mod tests {
    use super::*;
    use sluice_store::AllExperts;

    #[test]
    fn an_expert_activation_run_whole_on_the_engine_thread_left_the_helpers_idle() {
        // gate, up and the activation in one pool call, in place: bit for bit the two
        // projections and an activation over the whole, on any pool.
        let (n, d_in, inter) = (3, 200, 300);
        let vals = |k: usize, s: f32| -> Vec<f32> {
            (0..k).map(|i| (i as f32 * s).sin() * 3.0).collect::<Vec<f32>>()
        };
        let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let (gw, uw) = (bytes(&vals(inter * d_in, 0.37)), bytes(&vals(inter * d_in, 0.11)));
        let g = Matrix::f32(inter, d_in, &gw).expect("gate");
        let u = Matrix::f32(inter, d_in, &uw).expect("up");
        let x = vals(n * d_in, 0.23);
        let glu = |g: &[f32], u: &[f32], o: &mut [f32]| {
            sluice_kernels::ops::situ_glu(g, u, 4.0, Some(8.0), o);
        };
        let (mut gate, mut up) = (vec![0.0f32; n * inter], vec![0.0f32; n * inter]);
        matmul(&g, &x, n, &mut gate);
        matmul(&u, &x, n, &mut up);
        let mut whole = vec![0.0f32; n * inter];
        glu(&gate, &up, &mut whole);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for threads in [1, 2, 3, 16] {
            let pool = sluice_kernels::Pool::new(threads).expect("pool");
            for rows in 1..=n {
                let (mut a, mut b) = (vec![f32::NAN; rows * inter], vec![f32::NAN; rows * inter]);
                pool.install(|| gate_up_act(&g, &u, &glu, &x[..rows * d_in], rows, &mut a, &mut b));
                assert_eq!(
                    bits(&a),
                    bits(&whole[..rows * inter]),
                    "{threads} threads, {rows} rows"
                );
            }
        }
    }

    /// Experts held in memory: a store that hands them all at once when `all`, else one by one.
    struct Held<'a> {
        experts: &'a [Vec<Vec<u8>>],
        all: bool,
    }

    impl Held<'_> {
        fn view(&self, id: u32) -> ExpertView<'_> {
            let parts: Vec<&[u8]> = self.experts[id as usize].iter().map(Vec::as_slice).collect();
            ExpertView::new(&parts).expect("at most MAX_PARTS parts")
        }
    }

    impl ExpertStore for Held<'_> {
        fn for_each(
            &self,
            _layer: usize,
            ids: &[u32],
            f: &mut dyn FnMut(u32, ExpertView<'_>) -> Result<(), StoreError>,
        ) -> Result<(), StoreError> {
            let mut order = ids.to_vec();
            order.sort_unstable();
            order.into_iter().try_for_each(|id| f(id, self.view(id)))
        }

        fn with_all(
            &self,
            _layer: usize,
            ids: &[u32],
            f: &mut AllExperts<'_>,
        ) -> Result<bool, StoreError> {
            if !self.all {
                return Ok(false);
            }
            let mut order = ids.to_vec();
            order.sort_unstable();
            let all: Vec<_> = order.into_iter().map(|id| (id, self.view(id))).collect();
            f(&all)?;
            Ok(true)
        }

        fn stats(&self) -> sluice_store::StoreStats {
            sluice_store::StoreStats::default()
        }
    }

    /// A small deterministic generator (xorshift).
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn unit(&mut self) -> f32 {
            // 24 random bits, in [-1, 1).
            (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        }

        fn bytes(&mut self, n: usize, f: impl Fn(u8) -> u8) -> Vec<u8> {
            (0..n).map(|_| f(self.next().to_le_bytes()[3])).collect()
        }
    }

    /// Hidden width, expert width, experts, experts a row.
    const D: usize = 256;
    const INTER: usize = 64;
    const E: usize = 12;
    const K: usize = 8;

    /// `E` experts' parts in `mxfp4` or bf16: gate, up, down (MXFP4: each packed, then scales).
    fn experts(mxfp4: bool, rng: &mut Rng) -> Vec<Vec<Vec<u8>>> {
        let matrix = |rng: &mut Rng, rows: usize, cols: usize| -> Vec<Vec<u8>> {
            if mxfp4 {
                // Scales near 2^0, so sums stay finite.
                vec![
                    rng.bytes(rows * cols / 2, |b| b),
                    rng.bytes(rows * cols / 32, |b| 122 + b % 8),
                ]
            } else {
                let v: Vec<u8> = (0..rows * cols)
                    .flat_map(|_| {
                        let hi = (rng.unit() * 0.2).to_bits() >> 16;
                        u16::try_from(hi).expect("16 bits").to_le_bytes()
                    })
                    .collect();
                vec![v]
            }
        };
        (0..E)
            .map(|_| {
                let mut parts = matrix(rng, INTER, D);
                parts.extend(matrix(rng, INTER, D));
                parts.extend(matrix(rng, D, INTER));
                parts
            })
            .collect()
    }

    /// An expert's gate, up and down matrices from its view.
    fn matrices<'v>(mxfp4: bool, v: &ExpertView<'v>) -> Result<[Matrix<'v>; 3], StoreError> {
        let m = if mxfp4 {
            [
                Matrix::mxfp4(INTER, D, v.part(0), v.part(1)),
                Matrix::mxfp4(INTER, D, v.part(2), v.part(3)),
                Matrix::mxfp4(D, INTER, v.part(4), v.part(5)),
            ]
        } else {
            [
                Matrix::bf16(INTER, D, v.part(0)),
                Matrix::bf16(INTER, D, v.part(1)),
                Matrix::bf16(D, INTER, v.part(2)),
            ]
        };
        let [Ok(g), Ok(u), Ok(d)] = m else {
            return Err(StoreError::Consumer("expert shape".into()));
        };
        Ok([g, u, d])
    }

    /// `t` rows' routes: each row's `K` distinct experts, with weights.
    struct Routes {
        users: Vec<Vec<(usize, usize)>>,
        ids: Vec<u32>,
        weights: Vec<[f32; K]>,
    }

    fn routes(t: usize, rng: &mut Rng) -> Routes {
        let mut users = vec![Vec::new(); E];
        let mut weights = Vec::new();
        for row in 0..t {
            let mut ids: Vec<usize> = (0..E).collect();
            for i in 0..K {
                let j = i + usize::try_from(rng.next() % (E - i) as u64).expect("small");
                ids.swap(i, j);
                users[ids[i]].push((row, i));
            }
            weights.push(std::array::from_fn(|_| rng.unit().abs() + 0.01));
        }
        let ids = (0..E)
            .filter(|&i| !users[i].is_empty())
            .map(|i| u32::try_from(i).expect("few"))
            .collect();
        Routes { users, ids, weights }
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn a_layers_small_experts_made_two_pool_calls_each_now_three_for_the_layer() {
        // The whole layer handed at once: three pool calls (gate/up/activation, down, the
        // weighted sums; the last on the engine thread when small), bit for bit the per-expert
        // path's sums, at every T up to 40 and on pools of 1 to 16 threads, bf16 and MXFP4.
        let pools: Vec<_> =
            [1, 2, 3, 16].map(|n| sluice_kernels::Pool::new(n).expect("pool")).into();
        let mut rng = Rng(0x5EED_0020);
        for mxfp4 in [false, true] {
            let held = experts(mxfp4, &mut rng);
            for t in 1..=40 {
                let r = routes(t, &mut rng);
                let x: Vec<f32> = (0..t * D).map(|_| rng.unit()).collect();
                for pool in &pools {
                    let layer = |all: bool| {
                        let store = Held { experts: &held, all };
                        let mut out = vec![0.0f32; t * D];
                        let before = pool.counters();
                        pool.install(|| {
                            GluExpert::default().run_layer(
                                &store,
                                0,
                                &r.ids,
                                None,
                                |_, v| matrices(mxfp4, v),
                                sluice_kernels::ops::silu_glu,
                                &r.users,
                                crate::ROW_BLOCK,
                                &x,
                                |row, slot| r.weights[row][slot],
                                &mut out,
                            )
                        })
                        .expect("layer");
                        (out, pool.counters().since(&before).calls)
                    };
                    let ((each, each_calls), (all, all_calls)) = (layer(false), layer(true));
                    let at = format!("mxfp4 {mxfp4}, {t} rows, {} threads", pool.threads());
                    assert_eq!(bits(&all), bits(&each), "{at}");
                    assert!(all_calls <= 3, "{at}: {all_calls} pool calls");
                    // Experts of 4 rows or more are worth splitting: two calls each, one by one.
                    if pool.threads() > 1 && r.users.iter().all(|u| u.is_empty() || u.len() >= 4) {
                        assert!(each_calls >= 2 * r.ids.len() as u64, "{at}: {each_calls}");
                        assert!(all_calls >= 2, "{at}: {all_calls} pool calls");
                    }
                }
            }
        }
    }

    #[test]
    fn a_layer_over_the_batch_cap_runs_in_batches_with_the_same_bits() {
        // Batches of a few experts, and experts too large for any batch (cap 0) on the
        // per-expert path: the same sums as every expert one by one.
        let mut rng = Rng(0xCA9_0020);
        let held = experts(true, &mut rng);
        let pool = sluice_kernels::Pool::new(3).expect("pool");
        let t = 29;
        let r = routes(t, &mut rng);
        let x: Vec<f32> = (0..t * D).map(|_| rng.unit()).collect();
        let store = Held { experts: &held, all: true };
        let ms: Vec<_> = r
            .ids
            .iter()
            .map(|&id| (id, matrices(true, &store.view(id)).expect("matrices")))
            .collect();
        let weight = |row: usize, slot: usize| r.weights[row][slot];
        let mut each = vec![0.0f32; t * D];
        let mut batch = GluExpert::default();
        pool.install(|| {
            for (id, [g, u, d]) in &ms {
                let users = &r.users[*id as usize];
                batch.run(
                    [g, u, d],
                    sluice_kernels::ops::silu_glu,
                    users,
                    7,
                    &x,
                    weight,
                    &mut each,
                );
            }
        });
        let one = t * K / E * ((2 * INTER + D + 1) * 4 + size_of::<usize>());
        for cap in [0, one, 3 * one, LAYER_BATCH_BYTES] {
            let mut out = vec![0.0f32; t * D];
            let glu = sluice_kernels::ops::silu_glu;
            let mut b = Batch::default();
            pool.install(|| {
                batch.run_batches(&mut b, &ms, cap, &glu, &r.users, 7, &x, &weight, &mut out);
            });
            assert!(b.held() <= cap, "cap {cap}: {} bytes held", b.held());
            assert_eq!(bits(&out), bits(&each), "cap {cap}");
        }
    }

    #[test]
    fn an_expert_out_of_id_order_is_an_error_naming_both() {
        let mut o = IdOrder::new(3);
        o.next(1).expect("first");
        o.next(5).expect("ascending");
        let e = o.next(4).expect_err("descending").to_string();
        assert!(e.contains("expert 4 of layer 3 after expert 5"), "{e}");
        assert!(o.next(5).is_err(), "a repeated id is out of order too");
    }
}

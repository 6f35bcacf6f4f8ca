//! A layer's resident experts in batches of [`LAYER_BATCH_BYTES`], three kernel-pool calls a
//! batch ([`GluExpert::run_layer`]), in buffers each thread keeps for its life.

use super::{activate, GluExpert, IdOrder, LAYER_BATCH_BYTES};
use sluice_kernels::{add_rows_many, matmul_many, matmul_pair_many, AddRows, Job, Matrix, PairJob};
use sluice_store::{ExpertStore, ExpertView, StoreError};

/// The buffers of the batched path ([`LAYER_BATCH_BYTES`] at most): every pair's f32 values
/// (input then output row, gate and activation, up, weight), and its prompt row.
#[derive(Default)]
pub(super) struct Batch {
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
    pub(super) fn held(&self) -> usize {
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
    pub(super) fn run_batches(
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

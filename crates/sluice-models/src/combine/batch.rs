//! A layer's resident experts in batches of [`LAYER_BATCH_BYTES`], three kernel-pool calls a
//! batch, in buffers each thread keeps for its life: what every family's batch shares (the
//! batching loop [`batches`], the buffers and their layout [`Batch::gather`], the weighted
//! sums [`Sums::add`]), and the gated experts' batch ([`GluExpert::run_layer`]; GPT-OSS's is
//! `gpt_oss::moe::run_batches`).

use super::{activate, GluExpert, IdOrder, LAYER_BATCH_BYTES};
use sluice_kernels::{add_rows_many, matmul_many, matmul_pair_many, AddRows, Job, Matrix, PairJob};
use sluice_store::{ExpertStore, ExpertView, StoreError};

/// The buffers of the batched path ([`LAYER_BATCH_BYTES`] at most): every pair's f32 values
/// (for a gated expert: input then output row, gate and activation, up, weight), and its
/// prompt row.
#[derive(Default)]
pub(crate) struct Batch {
    vals: Vec<f32>,
    to: Vec<usize>,
}

/// A batch laid out in [`Batch`]'s buffers by [`Batch::gather`].
pub(crate) struct Laid<'b, const N: usize> {
    /// `regions[k][e]`: expert `e`'s region of kind `k`, its pairs' values of that kind.
    pub(crate) regions: [Vec<&'b mut [f32]>; N],
    /// The pairs' weights and prompt rows.
    pub(crate) sums: Sums<'b>,
}

/// The pairs of a batch, expert by expert in ascending id: what [`Sums::add`] adds.
pub(crate) struct Sums<'b> {
    /// Each expert's pairs.
    pub(crate) rows: Vec<usize>,
    to: &'b [usize],
    weights: &'b [f32],
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
    pub(crate) fn held(&self) -> usize {
        self.vals.capacity() * size_of::<f32>() + self.to.capacity() * size_of::<usize>()
    }

    /// Lays out a batch of experts in the buffers and gathers its inputs. Each expert
    /// `(id, widths)` of `experts` (ascending id) gets `N` regions, region `k` holding
    /// `widths[k]` values for each of its pairs `users[id]` (every expert's region of a kind
    /// before the next kind); the pairs' input rows (`d_in` values of `x [T, d_in]` each) are
    /// packed at the start of the expert's first region, and each pair's weight
    /// `weight(row, slot)` and prompt row are kept, expert by expert. A pair takes
    /// [`pair_bytes`] of the buffers.
    pub(crate) fn gather<const N: usize>(
        &mut self,
        experts: &[(u32, [usize; N])],
        d_in: usize,
        users: &[Vec<(usize, usize)>],
        x: &[f32],
        weight: &impl Fn(usize, usize) -> f32,
    ) -> Laid<'_, N> {
        let rows: Vec<usize> = experts.iter().map(|(id, _)| users[*id as usize].len()).collect();
        let size =
            |k: usize| -> usize { experts.iter().zip(&rows).map(|((_, w), n)| n * w[k]).sum() };
        let pairs: usize = rows.iter().sum();
        self.fit((0..N).map(size).sum::<usize>() + pairs, pairs);
        let Self { vals, to } = self;
        let mut rest = vals.as_mut_slice();
        let mut regions: [Vec<&mut [f32]>; N] = std::array::from_fn(|k| {
            let mut each = Vec::with_capacity(experts.len());
            for ((_, w), n) in experts.iter().zip(&rows) {
                let (e, more) = std::mem::take(&mut rest).split_at_mut(n * w[k]);
                rest = more;
                each.push(e);
            }
            each
        });
        let weights = &mut rest[..pairs];
        if let Some(xs) = regions.first_mut() {
            for (id, _) in experts {
                for &(row, slot) in &users[*id as usize] {
                    weights[to.len()] = weight(row, slot);
                    to.push(row);
                }
            }
            // The input rows, expert by expert: on the kernel pool when there are many (a
            // 256-row prefill of Qwen3-30B-A3B copies 16 MB a layer, which took the engine
            // thread alone), on the calling thread for a few decode rows.
            let mut jobs: Vec<GatherJob<'_>> = experts
                .iter()
                .zip(xs.iter_mut())
                .map(|((id, _), xe)| (&mut **xe, users[*id as usize].as_slice()))
                .collect();
            let copy = |jobs: &mut [GatherJob<'_>]| {
                for (xe, pairs) in jobs {
                    for (j, &(row, _)) in pairs.iter().enumerate() {
                        xe[j * d_in..(j + 1) * d_in]
                            .copy_from_slice(&x[row * d_in..(row + 1) * d_in]);
                    }
                }
            };
            if pairs * d_in < GATHER_ON_POOL {
                copy(&mut jobs);
            } else {
                sluice_kernels::pool::map_chunks_mut(&mut jobs, 1, |_, job| copy(job));
            }
        }
        Laid { regions, sums: Sums { rows, to, weights } }
    }
}

impl Sums<'_> {
    /// `out[row] += weight · y` for every pair of the batch, `ys` holding each expert's output
    /// rows (`width` values each, from its region's start), experts in ascending id: one pool
    /// call over column ranges of `out` ([`add_rows_many`], on the calling thread when
    /// small), each cell taking its experts' terms in that order.
    pub(crate) fn add<'y>(
        &self,
        ys: impl Iterator<Item = &'y [f32]>,
        width: usize,
        out: &mut [f32],
    ) {
        let mut parts = Vec::with_capacity(self.rows.len());
        let mut k = 0;
        for (y, &n) in ys.zip(&self.rows) {
            parts.push(AddRows {
                y: &y[..n * width],
                to: &self.to[k..k + n],
                weight: &self.weights[k..k + n],
            });
            k += n;
        }
        add_rows_many(&parts, width, out);
    }
}

/// One expert's part of a gather: its region for the input rows, and its (row, slot) pairs.
type GatherJob<'a> = (&'a mut [f32], &'a [(usize, usize)]);

/// Input values of a batch from which its gather runs on the kernel pool (256 KiB).
const GATHER_ON_POOL: usize = 1 << 16;

/// Bytes one (prompt row, expert) pair of a batch takes in the buffers: `widths` values in
/// its expert's regions ([`Batch::gather`]), its weight and its prompt row (see
/// [`LAYER_BATCH_BYTES`]).
pub(crate) fn pair_bytes<const N: usize>(widths: [usize; N]) -> usize {
    (widths.iter().sum::<usize>() + 1) * size_of::<f32>() + size_of::<usize>()
}

/// The batches of a layer's experts `ms` (ascending id), in order: each the longest run of
/// the experts left whose buffers (`bytes(m)` each) fit in `cap` bytes, with `true`; an expert
/// that alone does not fit, alone, with `false` (it runs its family's per-expert path).
pub(crate) fn batches<'m, E>(
    ms: &'m [E],
    cap: usize,
    bytes: impl Fn(&E) -> usize + 'm,
) -> impl Iterator<Item = (&'m [E], bool)> + 'm {
    let mut start = 0;
    std::iter::from_fn(move || {
        let first = ms.get(start)?;
        let (mut end, mut sum) = (start + 1, bytes(first));
        while end < ms.len() && sum + bytes(&ms[end]) <= cap {
            sum += bytes(&ms[end]);
            end += 1;
        }
        let run = &ms[start..end];
        start = end;
        Some((run, sum <= cap))
    })
}

thread_local! {
    /// This thread's batch buffers, kept for its life: made afresh for each layer, their zero
    /// fill and first-touch page faults took 1.5% of a pp256's wall on the engine thread alone
    /// (5.5% → 4.0%, the Qwen3-30B-A3B slice, 2 threads).
    static BATCH: std::cell::RefCell<Batch> = std::cell::RefCell::default();
}

/// Runs `f` on the calling thread's batch buffers.
pub(crate) fn with_batch<R>(f: impl FnOnce(&mut Batch) -> R) -> R {
    BATCH.with_borrow_mut(f)
}

/// Bytes the calling thread's batch buffers hold ([`LAYER_BATCH_BYTES`] at most), for tests
/// that measure a pass's working memory apart from the plan's fixed charges.
pub fn layer_batch_held() -> usize {
    BATCH.with_borrow(Batch::held)
}

/// A gated expert's region widths in a batch ([`Batch::gather`]): the input row that then
/// takes the output, the gate and activation, the up projection.
fn glu_widths([g, _, d]: &[Matrix<'_>; 3]) -> [usize; 3] {
    [g.cols().max(d.rows()), g.rows(), g.rows()]
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
            with_batch(|b| {
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
        let bytes = |(id, m): &(u32, [Matrix<'_>; 3])| {
            users[*id as usize].len() * pair_bytes(glu_widths(m))
        };
        for (run, fits) in batches(ms, cap, bytes) {
            if fits {
                batch(b, run, glu, users, x, weight, out);
            } else {
                let (id, [g, u, d]) = &run[0];
                self.run([g, u, d], glu, &users[*id as usize], block, x, weight, out);
            }
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
    let shapes: Vec<(u32, [usize; 3])> = ms.iter().map(|(id, m)| (*id, glu_widths(m))).collect();
    let d_in = ms.first().map_or(0, |(_, [g, ..])| g.cols());
    let Laid { regions: [mut xs, mut gate, mut up], sums } =
        b.gather(&shapes, d_in, users, x, weight);
    let mut pairs: Vec<PairJob<'_>> = ms
        .iter()
        .zip(&sums.rows)
        .zip(xs.iter().zip(gate.iter_mut().zip(up.iter_mut())))
        .map(|(((_, [g, u, _]), &n), (xe, (ge, ue)))| PairJob {
            a: *g,
            b: *u,
            x: &xe[..n * g.cols()],
            t: n,
            out_a: ge,
            out_b: ue,
        })
        .collect();
    matmul_pair_many(&mut pairs, &activate(glu));
    drop(pairs);
    // The down projections, each into its expert's (now dead) input rows.
    let mut downs: Vec<Job<'_>> = ms
        .iter()
        .zip(&sums.rows)
        .zip(xs.iter_mut().zip(&gate))
        .map(|(((_, [_, _, d]), &n), (xe, ge))| Job {
            m: *d,
            x: ge,
            t: n,
            out: &mut xe[..n * d.rows()],
        })
        .collect();
    matmul_many(&mut downs);
    drop(downs);
    // out[row] += weight · y, experts in ascending id (the order of `ms`).
    let width = ms.first().map_or(1, |(_, [_, _, d])| d.rows());
    sums.add(xs.iter().map(|y| &**y), width, out);
}

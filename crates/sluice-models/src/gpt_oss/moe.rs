//! The GPT-OSS MoE block over the T rows of a pass (transformers `GptOssMLP`, `GptOssTopKRouter`,
//! `GptOssExperts`, 5.17).
//!
//! Router: `logits = x · Wᵀ + b` in f32, `topk` over the logits (descending; ties, which the golden
//! generator rejects, by lower id), weights = softmax over the k chosen logits. Each chosen expert:
//!
//! ```python
//! gate_up = x @ W_gate_up + b_gate_up          # 2I columns, gate even, up odd
//! gate = gate.clamp(max=limit); up = up.clamp(-limit, limit)
//! out = ((up + 1) * gate * sigmoid(gate * alpha)) @ W_down + b_down
//! ```
//!
//! with the MXFP4 experts served by the expert store (see [`super::weights`]). A row's output is the sum of
//! `expert_out · weight` over its experts in ascending expert id from zero, the order of HF's
//! `index_add_` loop, added into one running sum per row as each expert finishes (the store
//! hands experts over in ascending id order; see [`crate::combine`]). The union of experts over
//! the pass runs each expert once on all its rows ([`crate::ROW_BLOCK`] at a time) through the
//! batch-invariant matmul; the combination is per row, so rows never interact.
//!
//! A streamed layer's expert is two kernel-pool calls as it arrives ([`Expert::add_into`],
//! [`sluice_kernels::matmul_then`]): each chunk of the gate_up projection adds the bias to its
//! cells and writes their clamped SwiGLU, and each chunk of the down projection adds the bias
//! and the weighted cells into the rows' running sums, right after computing them. As separate
//! passes over whole buffers (bias, activation, bias, weighted add), that work ran on the
//! engine thread alone while the pool's helpers waited: 6% of a 256-token prefill's wall time
//! on a 2-vCPU VM, 2.4% after (docs/PERFORMANCE.md, session 18). The roundings per cell are
//! those of the separate passes, so the bits are too.
//!
//! A layer whose experts the store hands over at once (mapped experts,
//! [`sluice_store::ExpertStore::with_all`]) runs them in batches of
//! [`crate::LAYER_BATCH_BYTES`] ([`run_batches`], sharing the batching loop and buffers of
//! [`crate::combine`]), three pool calls a batch: every expert's gate_up projection, bias and
//! clamped SwiGLU ([`sluice_kernels::matmul_then_many`], each chunk finishing its own cells
//! as above); every down projection and bias, into the expert's own output rows; and the
//! weighted sums (`add_rows_many`, each row taking its experts in ascending id). A
//! gpt-oss-20b decode token made two calls per expert, 8 a layer; now 3 at most (2 when the
//! sums are small enough for the engine thread), and a prefill 3 a layer instead of 2 per
//! used expert (docs/PERFORMANCE.md, session 19). Each cell is computed and finished as on
//! the per-expert path, and each sum takes the same terms in the same order, so the bits are
//! the same.

use super::attention::add_bias;
use super::config::{GptOssConfig, SWIGLU_ALPHA};
use super::weights::MoeWeights;
use crate::combine::{batches, pair_bytes, with_batch, Batch, IdOrder, Laid, LAYER_BATCH_BYTES};
use crate::kimi_k3::Route;
use crate::qwen3::Ctx;
use crate::qwen3_moe::moe::{At, BlockOut};
use crate::ModelError;
use sluice_kernels::ops::{sigmoid, softmax_inplace};
use sluice_kernels::{add_weighted, matmul_then, matmul_then_many, Matrix, Target, ThenJob};
use sluice_store::{ExpertStore, ExpertView, StoreError};
use std::ops::Range;

/// Selects the top-k experts of one row of (biased) router logits.
pub(crate) fn route(logits: &[f32], k: usize) -> Route {
    let mut order: Vec<u32> = (0..u32::try_from(logits.len()).unwrap_or(u32::MAX)).collect();
    order.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b)));
    order.truncate(k);
    // softmax(router_top_value, dim=1)
    let mut weights: Vec<f32> = order.iter().map(|&i| logits[i as usize]).collect();
    softmax_inplace(&mut weights);
    Route { ids: order, weights }
}

/// The clamped SwiGLU of one row of `gate_up [2I]` (interleaved) into `out [I]`.
pub(crate) fn clamped_swiglu(gate_up: &[f32], limit: f32, out: &mut [f32]) {
    for (o, gu) in out.iter_mut().zip(gate_up.chunks_exact(2)) {
        let gate = gu[0].min(limit);
        let up = gu[1].clamp(-limit, limit);
        let glu = gate * sigmoid(gate * SWIGLU_ALPHA);
        *o = (up + 1.0) * glu;
    }
}

/// One routed expert as its two pool calls read it.
#[derive(Clone, Copy)]
pub(crate) struct Expert<'a> {
    /// `[2I, d]`, rows interleaved: gate even, up odd.
    pub(crate) gate_up: Matrix<'a>,
    /// `[d, I]`.
    pub(crate) down: Matrix<'a>,
    /// `[2I]`, interleaved as `gate_up`'s rows.
    pub(crate) gate_up_bias: &'a [f32],
    /// `[d]`.
    pub(crate) down_bias: &'a [f32],
    /// The SwiGLU clamp.
    pub(crate) limit: f32,
}

/// The batch buffers of [`Expert::add_into`], reused from expert to expert.
#[derive(Default)]
pub(crate) struct ExpertBuffers {
    gate_up: Vec<f32>,
    act: Vec<f32>,
    y: Vec<f32>,
}

/// The buffers of the per-expert path ([`Expert::run`]), reused from expert to expert: a
/// block's gathered rows, their prompt rows and weights, and the expert's own.
#[derive(Default)]
pub(crate) struct EachBuffers {
    xs: Vec<f32>,
    to: Vec<usize>,
    weights: Vec<f32>,
    expert: ExpertBuffers,
}

impl Expert<'_> {
    /// Runs the expert on `xs [n, d]`, the gathered rows of the prompt rows `to` (strictly
    /// increasing), and adds `(y + b_down) · weights[j]` into row `to[j]` of `out [T, d]`: two
    /// pool calls whose chunks finish their own cells (see the module docs).
    pub(crate) fn add_into(
        &self,
        xs: &[f32],
        to: &[usize],
        weights: &[f32],
        b: &mut ExpertBuffers,
        out: &mut [f32],
    ) {
        let n = to.len();
        assert_eq!(weights.len(), n, "gpt_oss expert: one routing weight per row");
        let (two_i, d) = (self.gate_up.rows(), self.down.rows());
        b.gate_up.resize(n * two_i, 0.0);
        b.act.resize(n * two_i / 2, 0.0);
        b.y.resize(n * d, 0.0);
        // gate_up = x @ W_gate_up + b_gate_up; then the clamped SwiGLU of each (gate, up) pair.
        // A chunk's rows start and end at multiples of 16 or at 2I, so it holds whole pairs,
        // and its pairs `r / 2` are its cells of `act` (`Target::rows(.., 2)` checks this).
        let act = |_: usize, r: Range<usize>, gu: &mut [f32], a: &mut [f32]| {
            add_bias(gu, &self.gate_up_bias[r]);
            clamped_swiglu(gu, self.limit, a);
        };
        matmul_then(&self.gate_up, xs, n, &mut b.gate_up, Target::rows(&mut b.act, 2), &act);
        // index_add_((act @ W_down + b_down) * weight), experts ascending, into the running sums.
        let add = |j: usize, r: Range<usize>, y: &mut [f32], o: &mut [f32]| {
            add_bias(y, &self.down_bias[r]);
            add_weighted(o, y, weights[j]);
        };
        matmul_then(&self.down, &b.act, n, &mut b.y, Target::scatter(out, to), &add);
    }
}

impl Expert<'_> {
    /// Runs the expert on the `(row, slot)` pairs `users` that chose it, [`crate::ROW_BLOCK`]
    /// rows at a time (the buffers hold one block however many prompt rows chose it; rows are
    /// independent in the kernels, so the block changes no bit), reading each row from
    /// `x [T, d]` and adding `(y + b_down) · weight(row, slot)` into its running sum in `out`.
    fn run(
        &self,
        users: &[(usize, usize)],
        x: &[f32],
        weight: &impl Fn(usize, usize) -> f32,
        b: &mut EachBuffers,
        out: &mut [f32],
    ) {
        let d = self.gate_up.cols();
        let EachBuffers { xs, to, weights, expert } = b;
        for us in users.chunks(crate::ROW_BLOCK) {
            xs.clear();
            to.clear();
            weights.clear();
            for &(row, slot) in us {
                xs.extend_from_slice(&x[row * d..(row + 1) * d]);
                to.push(row);
                weights.push(weight(row, slot));
            }
            self.add_into(xs, to, weights, expert, out);
        }
    }

    /// The expert's region widths in a layer batch ([`Batch::gather`]): the input row that then
    /// takes the output, the gate_up row, the activation.
    fn widths(&self) -> [usize; 3] {
        let two_i = self.gate_up.rows();
        [self.gate_up.cols().max(self.down.rows()), two_i, two_i / 2]
    }
}

/// Expert `id` of `layer` from its view (parts in the order of `GptOssExpertLayout`: gate_up
/// blocks, scales; down blocks, scales) and its biases in `w`.
fn expert<'a>(
    w: &'a MoeWeights,
    c: &GptOssConfig,
    layer: usize,
    id: u32,
    v: &ExpertView<'a>,
) -> Result<Expert<'a>, StoreError> {
    let (d, inter) = (c.hidden_size, c.intermediate_size);
    let (Ok(gate_up), Ok(down)) = (
        Matrix::mxfp4(2 * inter, d, v.part(0), v.part(1)),
        Matrix::mxfp4(d, inter, v.part(2), v.part(3)),
    ) else {
        return Err(StoreError::Consumer(format!(
            "expert {id} of layer {layer} has byte lengths that do not match its shape"
        )));
    };
    let id = id as usize;
    Ok(Expert {
        gate_up,
        down,
        gate_up_bias: &w.gate_up_bias[id * 2 * inter..(id + 1) * 2 * inter],
        down_bias: &w.down_bias[id * d..(id + 1) * d],
        limit: c.swiglu_limit,
    })
}

/// The experts `es` of a layer (ascending id, handed at once by the store) in batches of at
/// most `cap` bytes of the buffers `b` ([`LAYER_BATCH_BYTES`]), each in three kernel-pool
/// calls (see the module docs), in ascending id; an expert too large for a batch of its own
/// runs the per-expert path ([`Expert::run`]), as every expert of a streamed layer does.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_batches(
    b: &mut Batch,
    es: &[(u32, Expert<'_>)],
    cap: usize,
    users: &[Vec<(usize, usize)>],
    x: &[f32],
    weight: &impl Fn(usize, usize) -> f32,
    each: &mut EachBuffers,
    out: &mut [f32],
) {
    let bytes = |(id, e): &(u32, Expert<'_>)| users[*id as usize].len() * pair_bytes(e.widths());
    for (run, fits) in batches(es, cap, bytes) {
        if fits {
            batch(b, run, users, x, weight, out);
        } else {
            let (id, e) = &run[0];
            e.run(&users[*id as usize], x, weight, each, out);
        }
    }
}

/// One batch of experts `es` (ascending id) in three kernel-pool calls, in the buffers `b`:
/// the cells and the roundings of [`Expert::add_into`], each row's sum taking its experts'
/// terms in ascending id, so the bits of the per-expert path. Each expert's region of the
/// input rows holds its gathered rows, then, once the gate_up projection has read them, its
/// output rows.
fn batch(
    b: &mut Batch,
    es: &[(u32, Expert<'_>)],
    users: &[Vec<(usize, usize)>],
    x: &[f32],
    weight: &impl Fn(usize, usize) -> f32,
    out: &mut [f32],
) {
    let shapes: Vec<(u32, [usize; 3])> = es.iter().map(|(id, e)| (*id, e.widths())).collect();
    let d_in = es.first().map_or(0, |(_, e)| e.gate_up.cols());
    let Laid { regions: [mut xs, mut gate_up, mut act], sums } =
        b.gather(&shapes, d_in, users, x, weight);
    // gate_up = x @ W_gate_up + b_gate_up, then the clamped SwiGLU of each (gate, up) pair,
    // each chunk finishing its own cells, whole pairs (as in `Expert::add_into`).
    let mut jobs: Vec<ThenJob<'_>> = es
        .iter()
        .zip(&sums.rows)
        .zip(xs.iter().zip(gate_up.iter_mut().zip(act.iter_mut())))
        .map(|(((_, e), &n), (xe, (gu, a)))| ThenJob {
            m: e.gate_up,
            x: &xe[..n * e.gate_up.cols()],
            t: n,
            y: gu,
            target: Some(Target::rows(a, 2)),
        })
        .collect();
    matmul_then_many(&mut jobs, &|j, _, r, gu, a| {
        let e = &es[j].1;
        add_bias(gu, &e.gate_up_bias[r]);
        clamped_swiglu(gu, e.limit, a);
    });
    drop(jobs);
    // act @ W_down + b_down, into each expert's (now dead) input rows.
    let mut jobs: Vec<ThenJob<'_>> = es
        .iter()
        .zip(&sums.rows)
        .zip(xs.iter_mut().zip(&act))
        .map(|(((_, e), &n), (xe, a))| ThenJob {
            m: e.down,
            x: a,
            t: n,
            y: &mut xe[..n * e.down.rows()],
            target: None,
        })
        .collect();
    matmul_then_many(&mut jobs, &|j, _, r, y, _| add_bias(y, &es[j].1.down_bias[r]));
    drop(jobs);
    // index_add_(y * weight), experts in ascending id (the order of `es`).
    let width = es.first().map_or(1, |(_, e)| e.down.rows());
    sums.add(xs.iter().map(|y| &**y), width, out);
}

/// Runs the MoE block of `layer` on `x [t, d]` (the `post_attention_layernorm` output), its
/// experts served by `store`; returns the block output `[t, d]`, the router logits `[t, E]`
/// and each row's route.
pub(crate) fn forward(
    ctx: &Ctx<'_>,
    w: &MoeWeights,
    store: &dyn ExpertStore,
    at: At<'_>,
    c: &GptOssConfig,
    x: &[f32],
    t: usize,
) -> Result<BlockOut, ModelError> {
    let layer = at.layer;
    let (d, e, k) = (c.hidden_size, c.num_local_experts, c.num_experts_per_tok);
    let mut logits = ctx.mm(&w.router, x, t);
    add_bias(&mut logits, &w.router_bias);
    let routes = crate::combine::routes_on_pool(&logits, e, |l| route(l, k));

    let (users, ids) = crate::combine::users(&routes, e);
    // The misses start reading now; the next layer's guess is computed while they are in flight
    // and handed to the store, which reads it once this layer's experts hold their slots.
    store.read_ahead(layer, &ids);
    let guess = (at.guess)();
    let next = guess.as_ref().map(|(l, g)| (*l, g.as_slice()));
    let weight = |row: usize, slot: usize| routes[row].weights[slot];
    let mut out = vec![0.0f32; t * d];
    let mut order = IdOrder::new(layer);
    let mut each = EachBuffers::default();
    let all = store.with_all(layer, &ids, &mut |all| {
        let mut es = Vec::with_capacity(all.len());
        for (id, v) in all {
            order.next(*id)?;
            es.push((*id, expert(w, c, layer, *id, v)?));
        }
        with_batch(|b| {
            run_batches(b, &es, LAYER_BATCH_BYTES, &users, x, &weight, &mut each, &mut out);
        });
        Ok(())
    })?;
    if all {
        if let Some((l, g)) = next {
            store.prefetch(l, g);
        }
    } else {
        store.for_each_then_prefetch(layer, &ids, next, &mut |id, v| {
            order.next(id)?;
            expert(w, c, layer, id, &v)?.run(&users[id as usize], x, &weight, &mut each, &mut out);
            Ok(())
        })?;
    }
    Ok((out, logits, routes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_kernels::matmul;

    #[test]
    fn router_softmaxes_only_the_chosen_logits() {
        let r = route(&[0.5, 3.0, -1.0, 2.0], 2);
        assert_eq!(r.ids, [1, 3]);
        let e = (-1.0f32).exp();
        assert!((r.weights[0] - 1.0 / (1.0 + e)).abs() < 1e-6);
        assert!((r.weights.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    }

    /// The old expert: a pool call per projection, and the biases, the activation and the
    /// weighted add as passes over whole buffers on the calling thread.
    fn separate_passes(e: &Expert<'_>, xs: &[f32], to: &[usize], weights: &[f32], out: &mut [f32]) {
        let (n, two_i, d) = (to.len(), e.gate_up.rows(), e.down.rows());
        let mut gu = vec![0.0f32; n * two_i];
        matmul(&e.gate_up, xs, n, &mut gu);
        add_bias(&mut gu, e.gate_up_bias);
        let mut act = vec![0.0f32; n * two_i / 2];
        for (a, g) in act.chunks_exact_mut(two_i / 2).zip(gu.chunks_exact(two_i)) {
            clamped_swiglu(g, e.limit, a);
        }
        let mut y = vec![0.0f32; n * d];
        matmul(&e.down, &act, n, &mut y);
        add_bias(&mut y, e.down_bias);
        for (j, &row) in to.iter().enumerate() {
            for (o, &v) in out[row * d..(row + 1) * d].iter_mut().zip(&y[j * d..(j + 1) * d]) {
                *o += v * weights[j];
            }
        }
    }

    /// A test weight of `format` from its weight and scale bytes.
    fn matrix<'a>(
        format: &str,
        rows: usize,
        cols: usize,
        (w, s): &'a (Vec<u8>, Vec<u8>),
    ) -> Matrix<'a> {
        match format {
            "mxfp4" => Matrix::mxfp4(rows, cols, w, s).expect("mxfp4"),
            _ => Matrix::f32(rows, cols, w).expect("f32"),
        }
    }

    #[test]
    fn a_gpt_oss_expert_activation_and_weighted_add_ran_on_the_engine_thread_alone() {
        // Two pool calls whose chunks finish their own cells give the bits of the separate
        // passes for every block size and pool, in MXFP4 (the published experts) and f32.
        let vals = |k: usize, s: f32, a: f32| -> Vec<f32> {
            (0..k).map(|i| (i as f32 * s).sin() * a).collect::<Vec<f32>>()
        };
        let f32_bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        // Scales 2^-4 … 2^0: gate and up values on both sides of the clamp.
        let mx = |rows: usize, cols: usize, seed: usize| -> (Vec<u8>, Vec<u8>) {
            let packed = (0..rows * cols / 2)
                .map(|i| u8::try_from((i * 37 + seed) % 251).expect("a byte"))
                .collect();
            let scales = (0..rows * cols / 32)
                .map(|i| u8::try_from(123 + (i * 7 + seed) % 5).expect("a byte"))
                .collect();
            (packed, scales)
        };
        let t_max = 70;
        for (format, d, inter) in [("mxfp4", 96, 96), ("f32", 40, 40), ("f32", 200, 24)] {
            let (gu_w, down_w) = match format {
                "mxfp4" => (mx(2 * inter, d, 1), mx(d, inter, 2)),
                _ => (
                    (f32_bytes(&vals(2 * inter * d, 0.37, 1.5)), Vec::new()),
                    (f32_bytes(&vals(d * inter, 0.11, 0.5)), Vec::new()),
                ),
            };
            let (gub, db) = (vals(2 * inter, 0.7, 3.0), vals(d, 0.3, 1.0));
            let e = Expert {
                gate_up: matrix(format, 2 * inter, d, &gu_w),
                down: matrix(format, d, inter, &down_w),
                gate_up_bias: &gub,
                down_bias: &db,
                limit: 7.0,
            };
            let x = vals(t_max * d, 0.23, 2.0);
            let weights = vals(t_max, 0.9, 1.0);
            // Every other prompt row from row 1, onto running sums already holding values.
            let to: Vec<usize> = (0..t_max).map(|j| 2 * j + 1).collect();
            let base = vals((2 * t_max + 1) * d, 0.05, 1.0);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            for threads in [1, 2, 3, 16] {
                let pool = sluice_kernels::Pool::new(threads).expect("pool");
                let mut b = ExpertBuffers::default();
                for n in 1..=t_max {
                    let (xs, to, w) = (&x[..n * d], &to[..n], &weights[..n]);
                    let (mut want, mut got) = (base.clone(), base.clone());
                    pool.install(|| {
                        separate_passes(&e, xs, to, w, &mut want);
                        e.add_into(xs, to, w, &mut b, &mut got);
                    });
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "{format} d={d} I={inter}, {threads} threads, {n} rows"
                    );
                }
            }
        }
    }

    #[test]
    fn gpt_oss_experts_made_two_pool_calls_each_now_three_for_the_layer() {
        // A layer's experts handed at once: three pool calls (gate_up with its bias and the
        // clamped SwiGLU, down with its bias, the weighted sums; the last on the engine thread
        // when small), bit for bit the per-expert path's sums at every T up to 40, on pools of
        // 1 to 16 threads, and at every batch cap (experts too large for a batch of their own
        // on the per-expert path).
        const D: usize = 128;
        const INTER: usize = 64;
        const E: usize = 12;
        const K: usize = 4;
        let vals = |k: usize, s: f32, a: f32| -> Vec<f32> {
            (0..k).map(|i| (i as f32 * s).sin() * a).collect::<Vec<f32>>()
        };
        // Scales 2^-4 … 2^0: gate and up values on both sides of the clamp.
        let mx = |rows: usize, cols: usize, seed: usize| -> (Vec<u8>, Vec<u8>) {
            let packed = (0..rows * cols / 2)
                .map(|i| u8::try_from((i * 37 + seed) % 251).expect("a byte"))
                .collect();
            let scales = (0..rows * cols / 32)
                .map(|i| u8::try_from(123 + (i * 7 + seed) % 5).expect("a byte"))
                .collect();
            (packed, scales)
        };
        let ws: Vec<_> =
            (0..E).map(|i| (mx(2 * INTER, D, 3 * i + 1), mx(D, INTER, 3 * i + 2))).collect();
        let (gub, db) = (vals(E * 2 * INTER, 0.7, 3.0), vals(E * D, 0.3, 1.0));
        let es: Vec<(u32, Expert<'_>)> = ws
            .iter()
            .enumerate()
            .map(|(i, (gu, dn))| {
                let e = Expert {
                    gate_up: matrix("mxfp4", 2 * INTER, D, gu),
                    down: matrix("mxfp4", D, INTER, dn),
                    gate_up_bias: &gub[i * 2 * INTER..(i + 1) * 2 * INTER],
                    down_bias: &db[i * D..(i + 1) * D],
                    limit: 7.0,
                };
                (u32::try_from(i).expect("few"), e)
            })
            .collect();
        let pools: Vec<_> =
            [1, 2, 3, 16].map(|n| sluice_kernels::Pool::new(n).expect("pool")).into();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let mut rng = 0x6055_0020u64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            usize::try_from(rng % 1024).expect("small")
        };
        for t in 1..=40 {
            // Each row's K distinct experts, with weights.
            let mut users = vec![Vec::new(); E];
            let mut wts = vec![[0.0f32; K]; t];
            for (row, w) in wts.iter_mut().enumerate() {
                let mut ids: Vec<usize> = (0..E).collect();
                for slot in 0..K {
                    ids.swap(slot, slot + next() % (E - slot));
                    users[ids[slot]].push((row, slot));
                    w[slot] = (next() as f32 + 1.0) / 1024.0;
                }
            }
            let used: Vec<_> =
                es.iter().copied().filter(|(id, _)| !users[*id as usize].is_empty()).collect();
            let x = vals(t * D, 0.23 + t as f32 * 0.01, 2.0);
            let base = vals(t * D, 0.05, 1.0);
            let weight = |row: usize, slot: usize| wts[row][slot];
            let one = t * K / E * pair_bytes(used[0].1.widths());
            for pool in &pools {
                let threads = pool.threads();
                let mut want = base.clone();
                let before = pool.counters();
                pool.install(|| {
                    let mut each = EachBuffers::default();
                    for (id, e) in &used {
                        e.run(&users[*id as usize], &x, &weight, &mut each, &mut want);
                    }
                });
                let each_calls = pool.counters().since(&before).calls;
                for cap in [0, one, 3 * one, LAYER_BATCH_BYTES] {
                    let (mut got, mut b) = (base.clone(), Batch::default());
                    let before = pool.counters();
                    pool.install(|| {
                        let mut each = EachBuffers::default();
                        run_batches(&mut b, &used, cap, &users, &x, &weight, &mut each, &mut got);
                    });
                    let calls = pool.counters().since(&before).calls;
                    let at = format!("{t} rows, {threads} threads, cap {cap}");
                    assert_eq!(bits(&got), bits(&want), "{at}");
                    assert!(b.held() <= cap, "{at}: {} bytes held", b.held());
                    if cap == LAYER_BATCH_BYTES {
                        assert!(calls <= 3, "{at}: {calls} pool calls");
                    }
                }
                // Experts of 8 rows or more are worth splitting: two calls each, one by one.
                if threads > 1 && used.iter().all(|(id, _)| users[*id as usize].len() >= 8) {
                    assert!(each_calls >= 2 * used.len() as u64, "{t} rows: {each_calls}");
                }
            }
        }
    }

    #[test]
    fn swiglu_clamps_gate_above_and_up_both_ways() {
        let mut out = [0.0f32; 3];
        clamped_swiglu(&[10.0, 20.0, -10.0, -20.0, 1.0, 0.5], 7.0, &mut out);
        let glu = |g: f32| g * sigmoid(g * SWIGLU_ALPHA);
        assert_eq!(out[0], 8.0 * glu(7.0), "gate 10 → 7, up 20 → 7");
        assert_eq!(out[1], -6.0 * glu(-10.0), "gate is not clamped below, up −20 → −7");
        assert_eq!(out[2], 1.5 * glu(1.0));
    }
}

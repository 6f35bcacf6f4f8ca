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

use sluice_kernels::{matmul, Matrix};
use sluice_store::StoreError;

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
/// three, not five. The input rows are dead once the gate and up projections have read them, so
/// their buffer takes the activation, and the gate's buffer, once the activation has read it,
/// takes the output.
#[derive(Default)]
pub(crate) struct GluExpert {
    xs: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
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
        let Self { xs, gate, up } = self;
        for us in users.chunks(block.max(1)) {
            let n = us.len();
            set_len(xs, n * d_in);
            for (&(row, _), xr) in us.iter().zip(xs.chunks_exact_mut(d_in)) {
                xr.copy_from_slice(&x[row * d_in..(row + 1) * d_in]);
            }
            set_len(gate, n * inter);
            set_len(up, n * inter);
            matmul(gate_w, xs, n, gate);
            matmul(up_w, xs, n, up);
            let act = &mut *xs;
            set_len(act, n * inter);
            glu_on_pool(&glu, gate, up, act);
            let y = &mut *gate;
            set_len(y, n * d_out);
            matmul(down_w, act, n, y);
            for (j, &(row, slot)) in us.iter().enumerate() {
                let acc = &mut out[row * d_out..(row + 1) * d_out];
                add_weighted(acc, &y[j * d_out..(j + 1) * d_out], weight(row, slot));
            }
        }
    }
}

/// `glu(gate, up, out)` over pieces of the rows on the kernels' thread pool. The activation is
/// elementwise, so the pieces change no bit. Run whole on the calling thread, its libm
/// `tanhf`/`expf` calls were a stretch of every expert during which the pool's other threads
/// had nothing to do: in a one-row decode pass, Kimi K3's 16 experts of 3,072 SiTU values a
/// layer were half of the engine thread's work outside the pool (a 2-thread profile on the
/// K3 slice), so even one row's activation is split, a few pieces per thread.
pub(crate) fn glu_on_pool(
    glu: &(impl Fn(&[f32], &[f32], &mut [f32]) + Sync),
    gate: &[f32],
    up: &[f32],
    out: &mut [f32],
) {
    let threads = sluice_kernels::pool::with_current(sluice_kernels::Pool::threads);
    let piece = glu_piece(out.len(), threads);
    if out.len() <= piece {
        glu(gate, up, out);
        return;
    }
    sluice_kernels::pool::map_chunks_mut(out, piece, |i, o| {
        let s = i * piece;
        glu(&gate[s..s + o.len()], &up[s..s + o.len()], o);
    });
}

/// Values per piece of an activation of `len` values on `threads` threads: a few pieces per
/// thread, none smaller than a handoff to a helper is worth, whole vectors of 16.
fn glu_piece(len: usize, threads: usize) -> usize {
    /// Fewest values in a piece (a handoff costs about a microsecond; SiTU takes tens of
    /// nanoseconds a value).
    const MIN_PIECE: usize = 512;
    /// Pieces per thread.
    const PIECES_PER_THREAD: usize = 2;
    if threads <= 1 {
        return len;
    }
    len.div_ceil(threads * PIECES_PER_THREAD).max(MIN_PIECE).next_multiple_of(16)
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

/// Adds `weight · y` into the running sum `acc` of one row.
pub(crate) fn add_weighted(acc: &mut [f32], y: &[f32], weight: f32) {
    for (a, &v) in acc.iter_mut().zip(y) {
        *a += v * weight;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_rows_expert_activation_ran_on_the_calling_thread_alone() {
        // K3's 3,072 values of one decode row: split on 2 and 16 threads, whole on one.
        assert_eq!(glu_piece(3072, 1), 3072);
        assert!(glu_piece(3072, 2) < 3072);
        assert!(3072usize.div_ceil(glu_piece(3072, 16)) >= 4);
        // Tiny activations stay whole.
        assert!(glu_piece(100, 16) >= 100);
    }

    #[test]
    fn an_expert_activation_split_over_the_pool_equals_one_piece() {
        let n = 3000;
        let gate: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 9.0).collect();
        let up: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos() * 5.0).collect();
        let glu = |g: &[f32], u: &[f32], o: &mut [f32]| {
            sluice_kernels::ops::situ_glu(g, u, 4.0, Some(8.0), o);
        };
        let mut whole = vec![0.0f32; n];
        glu(&gate, &up, &mut whole);
        for threads in [1, 2, 3, 16] {
            let pool = sluice_kernels::Pool::new(threads).expect("pool");
            let mut split = vec![0.0f32; n];
            pool.install(|| glu_on_pool(&glu, &gate, &up, &mut split));
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&split), bits(&whole), "{threads} threads");
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

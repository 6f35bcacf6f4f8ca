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

/// The batch buffers of a gated expert (`down(glu(gate x, up x))`), reused from expert to expert.
#[derive(Default)]
pub(crate) struct GluExpert {
    xs: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    act: Vec<f32>,
    y: Vec<f32>,
}

impl GluExpert {
    /// Runs one expert on the `(row, slot)` pairs that chose it, [`crate::ROW_BLOCK`] rows at a
    /// time (the buffers hold one block however many prompt rows chose it; rows are
    /// independent in the kernels), reading each row's input from `x [T, d_in]` and adding
    /// `weight(row, slot) · y` into that row's running sum in `out [T, d_out]`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run(
        &mut self,
        [gate_w, up_w, down_w]: [&Matrix<'_>; 3],
        glu: impl Fn(&[f32], &[f32], &mut [f32]),
        users: &[(usize, usize)],
        x: &[f32],
        weight: impl Fn(usize, usize) -> f32,
        out: &mut [f32],
    ) {
        let (d_in, inter, d_out) = (gate_w.cols(), gate_w.rows(), down_w.rows());
        let Self { xs, gate, up, act, y } = self;
        for us in users.chunks(crate::ROW_BLOCK) {
            let n = us.len();
            xs.clear();
            for &(row, _) in us {
                xs.extend_from_slice(&x[row * d_in..(row + 1) * d_in]);
            }
            gate.resize(n * inter, 0.0);
            up.resize(n * inter, 0.0);
            act.resize(n * inter, 0.0);
            y.resize(n * d_out, 0.0);
            matmul(gate_w, xs, n, gate);
            matmul(up_w, xs, n, up);
            glu(gate, up, act);
            matmul(down_w, act, n, y);
            for (j, &(row, slot)) in us.iter().enumerate() {
                let acc = &mut out[row * d_out..(row + 1) * d_out];
                add_weighted(acc, &y[j * d_out..(j + 1) * d_out], weight(row, slot));
            }
        }
    }
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
    fn an_expert_out_of_id_order_is_an_error_naming_both() {
        let mut o = IdOrder::new(3);
        o.next(1).expect("first");
        o.next(5).expect("ascending");
        let e = o.next(4).expect_err("descending").to_string();
        assert!(e.contains("expert 4 of layer 3 after expert 5"), "{e}");
        assert!(o.next(5).is_err(), "a repeated id is out of order too");
    }
}

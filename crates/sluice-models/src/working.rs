//! The working memory of a pass per row for the families whose pass is the plain pre-norm
//! decoder (Qwen3-MoE, GPT-OSS): what `forward` holds for each of the T positions it runs, so the
//! memory plan can charge a prompt pass and choose how many rows one pass may take. (Kimi K3's
//! count, with its AttnRes anchors and KDA replay rows, is `kimi_k3::working`.)
//!
//! Per row, at the peak of one layer: the residual stream and the rows a layer keeps (hidden,
//! attention input and output, MLP input and output: five `d` rows, plus one spare), the q/k/v
//! projections (or MLA's projections and head outputs), the router logits and the row's route
//! (k ids and weights; a row adds its experts' outputs into one running sum as they come, in
//! ascending id, see [`crate::combine`], so it keeps no k expert outputs), one expert's
//! gate/up/activation rows (the rows batched for one expert), and at the end a logits row
//! (every row's logits when drafts are verified). Every buffer is counted at 2× for the
//! allocator's rounding and the copies made while batching; an estimate, not a measurement
//! like K3's.
//!
//! A prompt chunk (`LogitRows::Prefill`, committed whole) holds less per row: a routed
//! expert's batch and the dense and shared MLPs run [`crate::ROW_BLOCK`] rows at a time, and so
//! does MLA attention (DeepSeek-V3), so their buffers are charged with the pass's first block
//! of rows (at the pass row), not per prompt row; nor is a logits row.

/// Bytes of one `f32`.
const F: u64 = 4;

/// Heap bytes a pass holds per row at its peak, beyond the sequence state, for a model of
/// hidden width `d`, q+k+v projection width `qkv`, `experts` routed experts of which `k` are
/// chosen, expert (or dense MLP) width `inter` and vocabulary `vocab`.
pub fn pass_bytes_per_row(
    d: usize,
    qkv: usize,
    experts: usize,
    k: usize,
    inter: usize,
    vocab: usize,
) -> u64 {
    let [d, qkv, experts, k, inter, vocab] = [d, qkv, experts, k, inter, vocab].map(|x| x as u64);
    let layer = 6 * d + qkv + d + experts + 2 * k + 3 * inter;
    2 * (layer + vocab) * F
}

/// The two per-row charges of a family's [`crate::MemoryNeeds`], from the arguments of
/// [`pass_bytes_per_row`] and whether the attention runs in row blocks (`attention_in_blocks`:
/// MLA): a pass row's, and a prompt chunk's (`LogitRows::Prefill`: the layer buffers that are
/// not per block, without a logits row; one row's logits and one block's buffers are charged
/// with the pass's first rows).
pub fn row_charges(
    d: usize,
    qkv: usize,
    experts: usize,
    k: usize,
    inter: usize,
    vocab: usize,
    attention_in_blocks: bool,
) -> (u64, u64) {
    let pass = pass_bytes_per_row(d, qkv, experts, k, inter, vocab);
    let attention = if attention_in_blocks { qkv as u64 } else { 0 };
    (pass, pass - 2 * (vocab as u64 + 3 * inter as u64 + attention) * F)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_logits_row_and_the_routes_are_counted() {
        let small = super::pass_bytes_per_row(64, 192, 8, 2, 32, 100);
        let more_experts = super::pass_bytes_per_row(64, 192, 8, 4, 32, 100);
        let bigger_vocab = super::pass_bytes_per_row(64, 192, 8, 2, 32, 1000);
        assert!(small < more_experts && small < bigger_vocab);
        assert_eq!(bigger_vocab - small, 2 * 900 * 4);
    }

    #[test]
    fn a_prompt_row_holds_no_expert_outputs_and_no_block_buffers() {
        let (pass, prefill) = super::row_charges(64, 192, 8, 4, 32, 100, false);
        // Residual rows, attention output, q/k/v, router logits and the route.
        assert_eq!(prefill, 2 * (7 * 64 + 192 + 8 + 2 * 4) * 4);
        assert_eq!(pass - prefill, 2 * (100 + 3 * 32) * 4);
        let (_, mla) = super::row_charges(64, 192, 8, 4, 32, 100, true);
        assert_eq!(prefill - mla, 2 * 192 * 4, "MLA's buffers are per block");
    }
}

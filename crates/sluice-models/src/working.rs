//! The working memory of a pass per row for the families whose pass is the plain pre-norm
//! decoder (Qwen3-MoE, GPT-OSS): what `forward` holds for each of the T positions it runs, so the
//! memory plan can charge a prompt pass and choose how many rows one pass may take. (Kimi K3's
//! count, with its AttnRes anchors and KDA replay rows, is `kimi_k3::working`.)
//!
//! Per row, at the peak of one layer: the residual stream and the rows a layer keeps (hidden,
//! attention input and output, MLP input and output: five `d` rows, plus one spare), the q/k/v
//! projections and the attention output, the router logits, the k expert outputs a row waits
//! for until its experts are combined, one expert's gate/up/activation rows (the rows batched
//! for one expert), and at the end a logits row (every row's logits when drafts are verified).
//! Every buffer is counted at 2× for the allocator's rounding and the copies made while
//! batching; an estimate, not a measurement like K3's.

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
    let layer = 6 * d + qkv + d + experts + k * d + 3 * inter;
    2 * (layer + vocab) * F
}

/// The two per-row charges of a family's [`crate::MemoryNeeds`], from the arguments of
/// [`pass_bytes_per_row`]: a pass row's, and a prompt chunk's (`LogitRows::Prefill`: the same
/// layer buffers without a logits row; one row's logits is charged with the pass's first rows).
pub fn row_charges(
    d: usize,
    qkv: usize,
    experts: usize,
    k: usize,
    inter: usize,
    vocab: usize,
) -> (u64, u64) {
    let pass = pass_bytes_per_row(d, qkv, experts, k, inter, vocab);
    (pass, pass - 2 * vocab as u64 * F)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_logits_row_and_the_expert_outputs_are_counted() {
        let small = super::pass_bytes_per_row(64, 192, 8, 2, 32, 100);
        let more_experts = super::pass_bytes_per_row(64, 192, 8, 4, 32, 100);
        let bigger_vocab = super::pass_bytes_per_row(64, 192, 8, 2, 32, 1000);
        assert!(small < more_experts && small < bigger_vocab);
        assert_eq!(bigger_vocab - small, 2 * 900 * 4);
    }
}

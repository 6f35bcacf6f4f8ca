//! The working memory of a Kimi K3 pass, per row: what `forward` allocates for each of the T
//! positions it runs, at the moment the most is live, so the memory plan can charge a prompt
//! pass and choose how many rows one pass may take.
//!
//! A pass runs layer-major, so per row it holds, for the whole pass: the AttnRes anchors
//! (one hidden row per block started) and, for every KDA layer, the row's recurrence inputs
//! (`KdaRow`: pre-conv q/k/v, q, k, v, decay, β), kept until `commit` so that `commit(n < T)`
//! can replay them. On top of that, one layer at a time: the residual-stream rows a layer keeps
//! (two at a time: the input and its normed copy during attention, the residual sum and the MLP
//! input during the MLP; the rest is dropped once used), and the largest of the attention's and
//! the MLP's own buffers (KDA projections and recurrence
//! output; MLA q/kv projections and per-head outputs; router logits, routes, the row's running
//! sum of its experts' latent outputs, the expert batch buffers, the shared experts). At the end: a hidden
//! row and a logits row (the engine asks for every row's logits when it verifies drafts).
//!
//! The count follows the code in `mod.rs`, `kda.rs`, `mla.rs` and `moe.rs` (capacities, not
//! lengths: a route's id list keeps the capacity of all experts) plus 16 bytes of allocator
//! header per allocation made per row. `tests/working_memory.rs` measures the real peak of
//! live heap bytes of passes of several lengths with a counting allocator and checks that this
//! count covers it without charging far more. The sequence state (KDA matrices, MLA cache rows)
//! is charged separately, for the planned context.
//!
//! A prompt chunk (`LogitRows::Prefill`, committed whole) holds less per row
//! ([`prefill_bytes_per_row`]): no KDA replay rows, and no buffer that a layer fills
//! [`crate::ROW_BLOCK`] rows at a time (KDA projections and recurrence inputs, MLA projections
//! and per-head outputs, the dense and shared MLPs' intermediates, a routed expert's batch) nor
//! a logits row: the plan charges those for the first `ROW_BLOCK` rows of a pass at
//! [`pass_bytes_per_row`]. What is left per row is the residual stream, the AttnRes anchors,
//! the attention's output rows and the MoE block's routing, latent input, running sum and
//! output. The MoE block frees each buffer once it is dead (its input row too, which becomes
//! the shared experts' output), so at its peak a row holds one residual row, the block's input
//! (or shared output) row, its routes, latent input and running sum. A row keeps no k latent expert outputs (229 KB per row at K3's widths before
//! session 11): experts come in ascending id order and each is added into its rows' running
//! sums as it finishes ([`crate::combine`]).

use super::config::{AttnKind, K3Config};

/// Bytes of one `f32`.
const F: u64 = 4;
/// Allocator header bytes per allocation.
const HEADER: u64 = 16;
/// Bytes of a `Vec` header.
const VEC: u64 = 24;

/// Heap bytes a pass holds per row (position) at its peak, beyond the sequence state.
pub fn pass_bytes_per_row(c: &K3Config) -> u64 {
    let d = c.hidden_size as u64;
    let layers = c.num_hidden_layers;
    let anchors =
        c.attn_res_block_size.map_or(0, |b| (0..layers).filter(|i| i % b.max(1) == 0).count());
    let kda_layers = (0..layers).filter(|&i| c.attn_kind(i) == AttnKind::Kda).count() as u64;
    let has_kda = kda_layers > 0;
    let has_mla = (0..layers).any(|i| c.attn_kind(i) == AttnKind::Mla);
    let has_moe = (0..layers).any(|i| c.is_moe(i));
    let has_dense = (0..layers).any(|i| !c.is_moe(i));

    // Kept for the whole pass.
    let kept = anchors as u64 * d * F + kda_layers * kda_row(c);

    // One layer at a time: the residual rows plus the attention's or the MLP's buffers.
    let la = &c.linear_attn_config;
    let (p, h) = ((la.num_heads * la.head_dim) as u64, la.num_heads as u64);
    let kda = if has_kda { (8 * p + h + la.head_dim as u64 + d) * F } else { 0 };
    let mla = if has_mla { mla_row(c) } else { 0 };
    let dense = if has_dense { (3 * c.intermediate_size as u64 + d) * F } else { 0 };
    let moe = if has_moe { moe_row(c) } else { 0 };
    // Two residual rows besides the attention's or the MLP's own buffers (its output
    // included): during attention the layer input and its normed copy, during the MLP the
    // residual sum and the MLP input; three rows for a moment while a mix is normed.
    let layer = (3 * d * F).max(2 * d * F + kda.max(mla).max(dense).max(moe));

    // The end of the pass: the final hidden row (and its AttnRes mix), its normed copy and
    // a logits row.
    let head = (3 * d + c.vocab_size as u64) * F + 3 * HEADER;
    kept + layer.max(head) + 4 * HEADER
}

/// Heap bytes a whole prompt pass (`LogitRows::Prefill`) holds per row beyond its first
/// [`crate::ROW_BLOCK`] rows, which the plan charges at [`pass_bytes_per_row`] (see the module
/// docs).
pub fn prefill_bytes_per_row(c: &K3Config) -> u64 {
    let d = c.hidden_size as u64;
    let layers = c.num_hidden_layers;
    let anchors =
        c.attn_res_block_size.map_or(0, |b| (0..layers).filter(|i| i % b.max(1) == 0).count());
    let has_kda = (0..layers).any(|i| c.attn_kind(i) == AttnKind::Kda);
    let has_mla = (0..layers).any(|i| c.attn_kind(i) == AttnKind::Mla);
    let has_moe = (0..layers).any(|i| c.is_moe(i));
    let has_dense = (0..layers).any(|i| !c.is_moe(i));
    let kept = anchors as u64 * d * F;
    // KDA: the layer's output rows (its block buffers are per block).
    let kda = if has_kda { d * F } else { 0 };
    // MLA: the layer's output rows (its projections and head outputs are per block).
    let mla = if has_mla { d * F } else { 0 };
    // A dense MLP: its output rows.
    let dense = if has_dense { d * F } else { 0 };
    // The MoE block takes its input row (the second residual row) and frees it once read.
    let moe = if has_moe { d * F + moe_row_whole(c) } else { 0 };
    let layer = (3 * d * F).max(2 * d * F + kda.max(mla).max(dense)).max(d * F + moe);
    // The end: the final hidden rows and their AttnRes mix (the norm and logits are one row).
    let head = 2 * d * F + 3 * HEADER;
    kept + layer.max(head) + 4 * HEADER
}

/// The MLA layer's buffers per row: q and kv projections, per-head q and outputs.
fn mla_row(c: &K3Config) -> u64 {
    let d = c.hidden_size as u64;
    let heads = c.num_attention_heads as u64;
    let (ql, kl, rope) = (c.q_lora_rank as u64, c.kv_lora_rank as u64, c.qk_rope_head_dim as u64);
    let qd = c.mla_qk_dim() as u64;
    let vd = c.v_head_dim as u64;
    (2 * ql + heads * qd + kl + rope + 3 * heads * vd + d) * F
}

/// [`moe_row`] in a whole pass, beyond the block's input row: the expert batch buffers, the
/// shared experts' intermediates, the norm's row and the up projection are per block; per row
/// the block holds its routes and (row, slot) lists throughout, and at the peak either the
/// router logits, or the next layer's guess, or its latent input and running sum (the input
/// row by then holds the shared experts' output). `moe::forward` drops each buffer once dead:
/// before, the router logits, the guess, the latent input and the running sum's normed copy
/// were all live at once next to a separate shared output and up projection (a K3-slice prompt
/// row was charged 205,264 bytes, now 116,688).
fn moe_row_whole(c: &K3Config) -> u64 {
    let d = c.hidden_size as u64;
    let e = c.num_experts as u64;
    let k = c.num_experts_per_token as u64;
    let lat = c.expert_width() as u64;
    // A route's ids (capacity: every expert) and weights with their headers, and the (row,
    // slot) lists (see `moe_row`).
    let kept = (e + k) * F + 2 * (VEC + HEADER) + 3 * k * 16;
    let logits = e * F;
    let guess = e * F + 2 * k * 16;
    // The latent input (a copy of the input row without a down projection) and the running sum.
    let z = if c.routed_expert_hidden_size.is_some() { lat * F } else { d * F };
    kept + logits.max(guess).max(z + lat * F)
}

/// What one KDA layer keeps per row until commit: `KdaRow` (pre-conv 3P, q, k, v, g of P,
/// β of H) and its six allocations.
fn kda_row(c: &K3Config) -> u64 {
    let la = &c.linear_attn_config;
    let (p, h) = ((la.num_heads * la.head_dim) as u64, la.num_heads as u64);
    (7 * p + h) * F + 6 * (VEC + HEADER)
}

/// The MoE block's buffers per row at its peak (the end of the block, when every buffer but
/// the shared experts' intermediates is still live).
fn moe_row(c: &K3Config) -> u64 {
    let d = c.hidden_size as u64;
    let e = c.num_experts as u64;
    let k = c.num_experts_per_token as u64;
    let lat = c.expert_width() as u64;
    let inter = c.moe_intermediate_size as u64;
    let shared = c.num_shared_experts as u64 * inter;
    // Router logits; a route's ids (capacity: every expert) and weights, and their headers;
    // the (row, slot) lists of each expert (16 bytes a pair, grown by doubling: up to twice
    // their length, plus the old buffer of the list being regrown while it is copied, so 3×).
    // 2× was charged before, and a long pass whose lists had just doubled held more per row
    // than that (33,655 bytes against 33,632 charged, the working-memory test).
    let routing = e * F + (e + k) * F + 2 * (VEC + HEADER) + 3 * k * 16;
    // The next layer's guess: its router logits and the ranked (rank, id) pairs.
    let guess = e * F + 2 * k * 16;
    let z = if c.routed_expert_hidden_size.is_some() { lat * F } else { 0 };
    // The batch buffers of an expert all rows chose: the input (then the activation), the gate
    // (then the output) and the up rows, for a block of up to `EXPERT_BLOCK` = 2 × `ROW_BLOCK`
    // rows, charged with the first `ROW_BLOCK` rows at twice their width.
    let experts = 2 * (2 * lat.max(inter) + inter) * F;
    // The running sum, its norm and the up projection, next to the shared output.
    let combine = (2 * lat).max(lat + d) * F + d * F;
    let with_shared_running = routing + guess + z + (3 * shared + d) * F;
    let at_end = routing + guess + z + experts + combine;
    with_shared_running.max(at_end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kimi_k3::synth::K3Dims;

    #[test]
    fn a_k3_row_is_dominated_by_the_kda_rows_kept_until_commit() {
        // Full K3 widths: hidden 7168, 96 KDA heads of 128, top-16 of 896.
        let mut dims = K3Dims::k3_slice(92, 896, 163_840);
        dims.kda_layers = (1..=92).filter(|l| l % 4 != 0).collect();
        let c = K3Config::from_json(&dims.text_config()).expect("config");
        let row = pass_bytes_per_row(&c);
        let kda = 69 * kda_row(&c);
        assert!(kda > row / 2, "KDA rows {kda} of {row}");
        // Roughly 24 MiB of KDA rows and a few MiB of layer buffers.
        assert!((20 << 20..40 << 20).contains(&row), "{row}");
    }

    #[test]
    fn a_k3_prompt_row_held_its_sixteen_expert_outputs_and_the_mla_buffers() {
        // The brief's slice (`synth --preset k3-slice --layers 2 --experts 192 --ranks 4096`):
        // a prompt row was charged 548,560 bytes, 229,376 of them its 16 latent expert outputs
        // and ~264 KB MLA buffers (session 10). A row now keeps one running sum and MLA runs in
        // row blocks.
        let c = K3Config::from_json(&K3Dims::k3_slice(2, 192, 4096 + 256).text_config())
            .expect("config");
        let pre = prefill_bytes_per_row(&c);
        let lat = c.expert_width() as u64 * F;
        eprintln!("K3 slice: prompt row {pre} bytes, pass row {}", pass_bytes_per_row(&c));
        assert!(pre < 548_560 / 2, "{pre}");
        assert!(pre < c.num_experts_per_token as u64 * lat, "{pre}: no k expert outputs");
    }

    #[test]
    fn a_k3_prompt_row_was_charged_buffers_the_moe_block_had_finished_with() {
        // `synth --preset k3-slice --layers 2 --experts 256`: a prompt row was charged 205,264
        // bytes, the router logits, the next layer's guess, the latent input, the running sum
        // and its normed copy, the shared output, the up projection and the block's input all
        // at once. The block drops each once dead; what is live at its peak is the anchor, the
        // residual row, the input (then shared output) row, the routes, the latent input and
        // the running sum.
        let c = K3Config::from_json(&K3Dims::k3_slice(2, 256, 32_768 + 256).text_config())
            .expect("config");
        let (d, lat) = (c.hidden_size as u64 * F, c.expert_width() as u64 * F);
        let pre = prefill_bytes_per_row(&c);
        assert_eq!(pre, 116_688);
        let routes = (256 + 16) * F + 2 * (VEC + HEADER) + 3 * 16 * 16;
        assert_eq!(pre, d + 2 * d + routes + 2 * lat + 4 * HEADER, "{pre}");
        assert!(pre < 205_264 * 6 / 10);
    }
}

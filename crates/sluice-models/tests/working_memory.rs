//! The memory plan charges a pass `pass_bytes_per_row` bytes per row; this measures what a pass
//! really allocates. A counting global allocator records the peak of live heap bytes during
//! passes of several lengths over both Kimi K3 fixtures and a synthetic K3 whose latent
//! experts are wide and its shared experts wider than the rest (prefill with the last row's logits,
//! verification with every row's), and the growth per row between a short and a long pass
//! (the per-pass constants cancel) must be covered by the charge, which must not be several
//! times too high either. The sequence state's own growth (MLA cache rows, charged with the
//! context) is taken out, and so are the batched experts' buffers, which the plan charges as
//! a fixed scratch (made by a largest pass first, and checked against that charge). One test
//! in this binary, so no other test allocates meanwhile.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::cast_precision_loss)]

mod common;

use common::load;
use sluice_checkpoint::Checkpoint;
use sluice_models::kimi_k3::synth::{release_config, write_checkpoint, K3Dims};
use sluice_models::kimi_k3::working::{pass_bytes_per_row, prefill_bytes_per_row};
use sluice_models::kimi_k3::KimiK3;
use sluice_models::LogitRows;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; the counters only
// observe sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc` is passed through.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::SeqCst) + layout.size();
            PEAK.fetch_max(now, Ordering::SeqCst);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract for `dealloc` is passed through.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::SeqCst);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract for `realloc` is passed through.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            // Counted as the new block allocated before the old one is freed (what a moving
            // reallocation holds for a moment).
            let now = LIVE.fetch_add(new_size, Ordering::SeqCst) + new_size;
            PEAK.fetch_max(now, Ordering::SeqCst);
            LIVE.fetch_sub(layout.size(), Ordering::SeqCst);
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Peak live heap bytes above the start of one pass of `t` rows from a fresh state, less
/// what the state itself grew by.
fn pass_peak(m: &KimiK3, t: usize, rows: LogitRows) -> usize {
    let tokens: Vec<u32> = (0..t).map(|i| u32::try_from(i * 37 % 400 + 1).unwrap()).collect();
    let mut st = m.new_state();
    let before = st.byte_len();
    let base = LIVE.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);
    let logits = m.forward(&mut st, &tokens, rows, None).expect("pass");
    let peak = PEAK.load(Ordering::SeqCst);
    drop(logits);
    st.commit(t);
    let state_growth = st.byte_len() - before;
    peak - base - state_growth
}

/// The many-experts shape of `sluice synth` (K3 layout at width 128; latent experts 128 ×
/// 1024, two shared experts of 1024) with a KDA and an MLA layer after the dense one.
fn wide_experts(dir: &std::path::Path) -> KimiK3 {
    let mut dims = K3Dims::k3_slice(3, 16, 512);
    dims.hidden = 128;
    dims.kda_layers = vec![2];
    dims.heads = 4;
    dims.kda_head_dim = 32;
    dims.intermediate = 256;
    dims.attn_res_block = 3;
    (dims.q_lora, dims.kv_lora, dims.qk_nope, dims.qk_rope, dims.v_head) = (64, 32, 32, 16, 32);
    dims.dense_layers = 1;
    dims.top_k = 4;
    (dims.moe_intermediate, dims.expert_hidden) = (1024, 128);
    let text = dims.text_config();
    write_checkpoint(dir, &release_config(&text, 256), &text, 3, 256, &mut |_, _| {})
        .expect("synth");
    KimiK3::load(Arc::new(Checkpoint::open(dir).expect("opens"))).expect("loads")
}

#[test]
fn the_plan_charged_no_working_memory_for_a_prompt_pass() {
    // Every kernel thread's wide scratch, made first and measured on its own: a fixed cost per
    // thread, whatever the rows, that the plan's headroom covers. Left to the passes, a pool
    // thread's first wide call could land inside a measured pass, and which thread takes which
    // row chunk varies from run to run (warm-up passes made that rarer, never impossible: one
    // run still measured tiny-a's Last pass at 20,666 bytes per row against 19,760 charged).
    let pool = sluice_kernels::pool::global();
    let scratch = pool.threads() * sluice_kernels::WIDE_SCRATCH_BYTES
        + sluice_kernels::pool_scratch_bytes(pool.pack_buffers());
    // Every helper thread running (what a thread allocates as it starts is not scratch) and
    // the tier chosen.
    pool.on_every_thread(&|_| {}).expect("nothing else runs on the pool");
    let _ = sluice_kernels::isa();
    let before = LIVE.load(Ordering::SeqCst);
    sluice_kernels::reserve_scratch(pool).expect("nothing else runs on the pool");
    let reserved = LIVE.load(Ordering::SeqCst) - before;
    // The test harness's own thread allocates a little now and then (under 1 KiB seen, in
    // about a third of runs), which the process-wide count cannot tell apart.
    let harness = 4096;
    assert!(reserved <= scratch + harness, "{reserved} bytes of kernel scratch, {scratch} named");
    let before = LIVE.load(Ordering::SeqCst);
    sluice_kernels::reserve_scratch(pool).expect("nothing else runs on the pool");
    assert_eq!(LIVE.load(Ordering::SeqCst), before, "a thread's scratch is made once");
    let tmp = tempfile::tempdir().expect("tempdir");
    let models = [("tiny-a", load("tiny-a")), ("tiny-b", load("tiny-b"))];
    let wide = ("wide experts", wide_experts(tmp.path()));
    for (name, m) in models.iter().chain(std::iter::once(&wide)) {
        // The plan charges a pass of T rows `T × pre + min(T, ROW_BLOCK) × row`.
        let row = pass_bytes_per_row(m.config()) as f64;
        let pre = prefill_bytes_per_row(m.config()) as f64;
        // Lazily built tables first (every pool thread's scratch is already made, above).
        pass_peak(m, sluice_models::ROW_BLOCK, LogitRows::All);
        // A layer's experts run batched in buffers this thread keeps for its life, which the
        // plan charges as a fixed scratch (`LAYER_BATCH_BYTES`), whatever the pass: made by
        // the largest pass first, so the measured passes below do not grow them, and never
        // more than the charge.
        pass_peak(m, 1024, LogitRows::Prefill);
        let held = sluice_models::layer_batch_held();
        assert!(
            held <= sluice_models::LAYER_BATCH_BYTES,
            "{name}: the batched experts hold {held} bytes, over the {} charged",
            sluice_models::LAYER_BATCH_BYTES
        );
        // Passes the caller may commit in part: verification, at most ROW_BLOCK rows, each
        // charged `row + pre` (past them a layer's block buffers stop growing).
        let full = row + pre;
        for rows in [LogitRows::Last, LogitRows::All] {
            let (short, long) = (16, sluice_models::ROW_BLOCK);
            let a = pass_peak(m, short, rows);
            let b = pass_peak(m, long, rows);
            let per_row = (b - a) as f64 / (long - short) as f64;
            eprintln!(
                "{name} {rows:?}: {a} bytes at {short} rows, {b} at {long}: {per_row:.0} per \
                 row; charged {full:.0} per row"
            );
            assert!(per_row <= full, "{name} {rows:?}: a pass holds {per_row:.0} bytes per row, more than the {full:.0} charged");
            assert!(
                per_row >= full / 3.0,
                "{name} {rows:?}: {full:.0} bytes charged per row, over 3× the {per_row:.0} held"
            );
            // The charge covers the whole pass, constants included, from a few rows on (the
            // kernels' scratch per thread, made above, is the plan's headroom's).
            assert!(
                (b as f64) <= long as f64 * full,
                "{name} {rows:?}: {b} > {long} × {full:.0} charged"
            );
        }
        // A prompt chunk (committed whole) is charged `prefill_bytes_per_row` per row past its
        // first ROW_BLOCK rows, which are charged at the full row: the plan's
        // `chunk × prefill + min(chunk, ROW_BLOCK) × row`.
        let block = sluice_models::ROW_BLOCK as f64;
        let (short, long) = (128, 1024);
        let a = pass_peak(m, short, LogitRows::Prefill);
        let b = pass_peak(m, long, LogitRows::Prefill);
        let per_row = (b - a) as f64 / (long - short) as f64;
        eprintln!(
            "{name} Prefill: {a} bytes at {short} rows, {b} at {long}: {per_row:.0} per row; \
             charged {pre:.0} per row ({row:.0} for the first {block} rows)"
        );
        assert!(
            per_row <= pre,
            "{name} Prefill: {per_row:.0} bytes per row held, {pre:.0} charged"
        );
        assert!(
            per_row >= pre / 3.0,
            "{name} Prefill: {pre:.0} charged, over 3× the {per_row:.0} held"
        );
        let charged = long as f64 * pre + block * row;
        assert!((b as f64) <= charged, "{name} Prefill: {b} > {charged:.0} charged");
    }
}

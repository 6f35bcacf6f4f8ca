//! Tests of the memory plan: sizes, slots and refusals, spine placement, and the prefill
//! chunk's charge.

use super::*;

#[test]
fn sizes_parse() {
    assert_eq!(parse_size("4096"), Ok(4096));
    assert_eq!(parse_size("2K"), Ok(2048));
    assert_eq!(parse_size("1.5G"), Ok(3 << 29));
    assert_eq!(parse_size("512MiB"), Ok(512 << 20));
    assert_eq!(parse_size("6GB"), Ok(6 << 30));
    assert!(parse_size("lots").is_err());
    assert!(parse_size("5X").is_err());
    assert!(parse_size("0").is_err());
}

fn needs(layers: Vec<u64>) -> Needs {
    let pieces = SpinePieces { embed: 300, layers, head: 200, small: 10, rows: 5 };
    let spine = pieces.embed + pieces.head + pieces.layers.iter().sum::<u64>();
    Needs {
        spine,
        pieces,
        state: 100,
        sessions: 0,
        state_cache: 0,
        draft: 0,
        slot: 50,
        experts: 64,
        min_slots: 4,
        headroom: 0,
        pass_row: 0,
        prefill_row: 0,
        prefill_chunk: 0,
        max_rows: 0,
        serving: false,
        checkpoint_every: 0,
    }
}

#[test]
fn plans_slots_and_refuses_with_the_shortfall() {
    // Spine 300 + 200 + 4 × 100 = 900 (+ 10 small), state 100, 4 slots of 50.
    let n = needs(vec![100; 4]);
    let p = Plan::compute(2000, n.clone(), SpineMode::Auto).expect("fits");
    assert_eq!(p.spine.charged, 910);
    assert_eq!(p.spine.resident_layers, 4);
    assert!(p.spine.embed_resident && p.spine.head_resident);
    assert_eq!(p.slots, (2000 - 910 - 100) / 50);
    assert!(!p.all_experts_resident);
    let all = Plan::compute(1_000_000, n.clone(), SpineMode::Auto).expect("fits");
    assert_eq!(all.slots, 64);
    // Least: every layer and the head streamed through 2 × 200, rows 5, small 10 = 415.
    let e = Plan::compute(600, n, SpineMode::Auto).expect_err("too small");
    assert_eq!(e.minimum, 415 + 100 + 200);
    assert_eq!(e.short, 115);
    assert_eq!(e.largest_piece, 200);
    assert!(e.to_string().contains("115 more"), "{e}");
    let serve = Needs { sessions: 300, ..needs(vec![100; 4]) };
    let p = Plan::compute(2000, serve.clone(), SpineMode::Auto).expect("fits");
    assert_eq!(p.slots, (2000 - 910 - 100 - 300) / 50);
    let e = Plan::compute(600 + 300, serve, SpineMode::Auto).expect_err("sessions do not fit");
    assert_eq!(e.short, 115);
    assert!(e.to_string().contains("stored conversation state 300"), "{e}");
    let draft = Needs { draft: 250, ..needs(vec![100; 4]) };
    let p = Plan::compute(2000, draft.clone(), SpineMode::Auto).expect("fits");
    assert_eq!(p.slots, (2000 - 910 - 100 - 250) / 50);
    assert!(p.to_string().contains("draft model"), "{p}");
    let e = Plan::compute(600 + 250, draft, SpineMode::Auto).expect_err("draft does not fit");
    assert_eq!(e.short, 115);
    assert!(e.to_string().contains("the draft model 250"), "{e}");
}

#[test]
fn state_cache_restore_was_not_charged_to_the_plan() {
    // What a --state-cache holds in memory (a restored snapshot, the writer's queue) takes
    // cache slots like any other charge, and a budget that cannot hold it is refused by name.
    let cached = Needs { state_cache: 400, ..needs(vec![100; 4]) };
    let p = Plan::compute(2000, cached.clone(), SpineMode::Auto).expect("fits");
    assert_eq!(p.slots, (2000 - 910 - 100 - 400) / 50);
    assert!(p.to_string().contains("prompt-state cache snapshots"), "{p}");
    let e = Plan::compute(600 + 400, cached, SpineMode::Auto).expect_err("snapshots do not fit");
    assert_eq!(e.short, 115);
    assert!(e.to_string().contains("prompt-state cache snapshots 400"), "{e}");
    assert!(e.to_string().contains("no --state-cache"), "{e}");
}

#[test]
fn the_plan_charged_no_working_memory_for_a_prompt_pass() {
    // Fixed parts: spine 910, state 100; 4 slots of 50 at least; 64 experts; 10 per row.
    let n = Needs { prefill_row: 10, max_rows: 4096, ..needs(vec![100; 4]) };
    // Explicit: charged as asked, the rest is cache.
    let e = Needs { prefill_chunk: 30, ..n.clone() };
    let p = Plan::compute(2000, e.clone(), SpineMode::Auto).expect("fits");
    assert_eq!((p.chunk, p.work), (30, 300));
    assert_eq!(p.slots, (2000 - 910 - 100 - 300) / 50);
    assert!(p.to_string().contains("prefill chunk 30 tokens"), "{p}");
    // One that does not fit is refused with the numbers.
    let big = Needs { prefill_chunk: 1000, ..n.clone() };
    let huge = Needs { prefill_chunk: u64::MAX, ..n.clone() };
    let err = Plan::compute(2000, huge, SpineMode::Auto).expect_err("refused, no overflow");
    assert_eq!(err.chunk, u64::MAX);
    let err = Plan::compute(2000, big, SpineMode::Layers(4)).expect_err("10000 bytes");
    assert_eq!((err.chunk, err.work, err.minimum), (1000, 10_000, 910 + 100 + 200 + 10_000));
    let msg = err.to_string();
    assert!(msg.contains("a pass of 1000 prompt rows 10000 (10 per row, 0 more"), "{msg}");
    assert!(msg.contains("--prefill-chunk"), "{msg}");
    // Auto, short of a full cache (64 × 50): half of what is past the minimum cache.
    let p = Plan::compute(3000, n.clone(), SpineMode::Auto).expect("fits");
    let spare = 3000 - 910 - 100 - 200;
    assert_eq!(p.chunk, spare / 2 / 10);
    assert_eq!(p.slots, 4 + (spare - p.work) / 50);
    // Room for every expert and more: the surplus, at most the context.
    let p = Plan::compute(10_000, n.clone(), SpineMode::Auto).expect("fits");
    assert_eq!(p.chunk, (10_000 - 910 - 100 - 64 * 50) / 10);
    assert!(p.all_experts_resident);
    let p = Plan::compute(1 << 30, n.clone(), SpineMode::Auto).expect("fits");
    assert_eq!(p.chunk, 4096);
    // The floor of 64 rows (640 bytes) is reserved before the spine: the embedding is
    // read by rows rather than the chunk shrinking below it (without the floor, the whole
    // spine would be resident and the chunk 31 rows).
    // (The 4 slots cannot hold a layer's experts, so the chunk then takes all of the spare
    // past the floor, not half of it: at least the 64 rows, never fewer.)
    let p = Plan::compute(910 + 100 + 200 + 639, n.clone(), SpineMode::Auto).expect("fits");
    assert!(p.chunk >= 64 && !p.spine.embed_resident, "{p}");
    // Below the floor, one row is the least; less than that is refused.
    let least = 415 + 100 + 200;
    let p = Plan::compute(least + 10, n.clone(), SpineMode::Auto).expect("one row fits");
    assert_eq!(p.chunk, 1);
    let err = Plan::compute(least + 9, n, SpineMode::Auto).expect_err("no row fits");
    assert_eq!((err.chunk, err.short), (1, 1));
}

#[test]
fn the_largest_resident_prefix_that_fits_is_kept_and_the_rest_streams() {
    let n = needs(vec![100; 6]);
    // After state 100 and 4 slots (200): avail = budget − 300.
    // Head + 2 layers resident (400) + 2 × 100 buffers + rows 5 + small 10 = 615.
    let p = Plan::compute(915, n.clone(), SpineMode::Auto).expect("fits");
    assert_eq!((p.spine.resident_layers, p.spine.head_resident), (2, true));
    assert!(!p.spine.embed_resident);
    assert_eq!((p.spine.buffers, p.spine.buffer_bytes), (2, 100));
    assert_eq!(p.spine.streamed_bytes, 400);
    assert_eq!(p.spine.charged, 615);
    assert_eq!(p.slots, 4);
    let text = p.to_string();
    assert!(text.contains("spine: 2 of 6 layers resident"), "{text}");
    assert!(text.contains("4 streamed via 2×"), "{text}");
    assert!(text.contains("embedding rows read per pass"), "{text}");
    // One byte less: one layer fewer.
    let q = Plan::compute(914, n.clone(), SpineMode::Auto).expect("fits");
    assert_eq!(q.spine.resident_layers, 1);
    // No layer, only the head: 200 + 2 × 100 + 15.
    let r = Plan::compute(300 + 415, n.clone(), SpineMode::Auto).expect("fits");
    assert_eq!((r.spine.resident_layers, r.spine.head_resident), (0, true));
    // A head smaller than a layer streams too when that is all that fits: 2 × 100 + 15.
    let mut small_head = needs(vec![100; 6]);
    small_head.pieces.head = 50;
    let h = Plan::compute(300 + 215, small_head.clone(), SpineMode::Auto).expect("fits");
    assert_eq!((h.spine.resident_layers, h.spine.head_resident), (0, false));
    assert_eq!(h.spine.placements()[0], Placement::Rows);
    assert_eq!(h.spine.placements()[7], Placement::Streamed);
    let e = Plan::compute(300 + 214, small_head, SpineMode::Auto).expect_err("too small");
    assert_eq!(e.short, 1);
    // Forced splits, whatever the budget allows.
    let f = Plan::compute(1_000_000, n.clone(), SpineMode::Layers(1)).expect("fits");
    assert_eq!((f.spine.resident_layers, f.spine.head_resident), (1, true));
    let z = Plan::compute(1_000_000, n.clone(), SpineMode::Layers(0)).expect("fits");
    assert_eq!(z.spine.placements().iter().filter(|&&p| p == Placement::Resident).count(), 0);
    let a = Plan::compute(1_000_000, n, SpineMode::Layers(99)).expect("fits");
    assert!(a.spine.placements().iter().all(|&p| p == Placement::Resident));
}

#[test]
fn a_pass_is_charged_its_prompt_rows_and_one_block_of_full_rows() {
    let block = sluice_models::ROW_BLOCK as u64;
    let n = Needs { prefill_row: 10, pass_row: 100, max_rows: 4096, ..needs(vec![100; 4]) };
    assert_eq!(work(&n, 1), 110);
    assert_eq!(work(&n, block), block * 110);
    assert_eq!(work(&n, 1000), 1000 * 10 + block * 100);
    assert_eq!(work(&n, u64::MAX), u64::MAX, "saturates");
    for room in [0, 109, 110, 5000, block * 110 - 1, block * 110, block * 110 + 9, 100_000] {
        let rows = rows_in(&n, room);
        assert!(work(&n, rows) <= room, "{rows} rows in {room}");
        assert!(work(&n, rows + 1) > room, "{} rows fit in {room}", rows + 1);
    }
    let e = Needs { prefill_chunk: 1000, ..n.clone() };
    let p = Plan::compute(1 << 20, e, SpineMode::Auto).expect("fits");
    assert_eq!((p.chunk, p.work), (1000, 1000 * 10 + block * 100));
}

#[test]
fn the_chunk_got_half_of_a_budget_whose_cache_could_not_hold_a_layer() {
    // 4 layers of 16 experts (64 slots of 50); fixed 910 + 100 and 4 slots (200) at least.
    let n = Needs { prefill_row: 1, max_rows: 1 << 20, ..needs(vec![100; 4]) };
    // Half of a spare of 1000 is 10 slots, fewer than a layer's 16: the chunk takes it all.
    let spare = 1000;
    let p = Plan::compute(910 + 100 + 200 + spare, n.clone(), SpineMode::Auto).expect("fits");
    assert_eq!((p.chunk, p.slots), (spare, 4), "{p}");
    // Half of a spare of 1600 is 16 slots, a layer's worth: half each, as before.
    let spare = 1600;
    let p = Plan::compute(910 + 100 + 200 + spare, n.clone(), SpineMode::Auto).expect("fits");
    assert_eq!((p.chunk, p.slots), (spare / 2, 4 + 16), "{p}");
    // At most the planned context: the rest is cache.
    let short = Needs { max_rows: 300, ..n };
    let p = Plan::compute(910 + 100 + 200 + 1000, short, SpineMode::Auto).expect("fits");
    assert_eq!((p.chunk, p.slots), (300, 4 + 700 / 50), "{p}");
}

#[test]
fn a_server_gave_the_prefill_chunk_every_spare_byte_and_the_cache_two_slots() {
    // As above: half of a spare of 1000 holds fewer slots than a layer has experts, so a run's
    // chunk takes it all and the cache keeps its minimum. A server planned the same way,
    // though its passes end at the checkpoint past MAX_CAPTURES (4) captured ones: with
    // --checkpoint-every 150 no pass takes more than 750 rows.
    let n = Needs { prefill_row: 1, max_rows: 1 << 20, ..needs(vec![100; 4]) };
    let budget = 910 + 100 + 200 + 1000;
    let run = Plan::compute(budget, n.clone(), SpineMode::Auto).expect("fits");
    assert_eq!((run.chunk, run.slots, run.spare), (1000, 4, 1000), "{run}");
    // The serve rule: the chunk is planned for the rows a pass can take, the rest is cache
    // (a server that keeps no conversation states).
    let serve = Needs { serving: true, checkpoint_every: 150, ..n.clone() };
    let p = Plan::compute(budget, serve, SpineMode::Auto).expect("fits");
    assert_eq!((p.chunk, p.slots, p.sessions), (750, 4 + 250 / 50, 0), "{p}");
    assert!(p.to_string().contains("passes up to 750 rows (4 states captured each"), "{p}");
    // 5 slots past the minimum are fewer than a layer's 16 experts: a server that keeps
    // conversation states gives them the rest instead, and the cache keeps its minimum.
    let keeps = Needs { serving: true, checkpoint_every: 150, sessions: 50, ..n.clone() };
    let p = Plan::compute(budget + 50, keeps.clone(), SpineMode::Auto).expect("fits");
    assert_eq!((p.chunk, p.slots, p.sessions), (750, 4, 50 + 250), "{p}");
    assert!(p.to_string().contains("the rest conversation states"), "{p}");
    // With room for a layer's experts past the minimum, the rest is cache again.
    let p = Plan::compute(budget + 50 + 600, keeps, SpineMode::Auto).expect("fits");
    assert_eq!((p.chunk, p.slots, p.sessions), (750, 1050 / 50, 50), "{p}");
    // Where a pass can take all the spare, the server plans as a run does.
    for every in [0, 300, 800] {
        let serve = Needs { serving: true, checkpoint_every: every, ..n.clone() };
        let p = Plan::compute(budget, serve, SpineMode::Auto).expect("fits");
        assert_eq!((p.chunk, p.slots), (1000, 4), "--checkpoint-every {every}: {p}");
    }
    // One interval is reserved before the spine: a budget 600 smaller streams spine layers
    // instead of cutting passes below the interval.
    let serve = Needs { serving: true, checkpoint_every: 800, ..n.clone() };
    let p = Plan::compute(budget - 600, serve.clone(), SpineMode::Auto).expect("fits");
    assert!(p.chunk >= 800, "{p}");
    assert!(p.spine.resident_layers < 4, "{p}");
    // Where even an all-streamed spine leaves no room for it, the chunk takes what there is
    // (past the usual floor of 64 rows).
    let p = Plan::compute(415 + 100 + 200 + 100, serve, SpineMode::Auto).expect("fits");
    assert_eq!(p.chunk, 100, "{p}");
    assert!(p.to_string().contains("below --checkpoint-every 800"), "{p}");
}

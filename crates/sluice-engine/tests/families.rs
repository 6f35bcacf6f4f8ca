//! Every MoE family through the engine's one opening path (`load::open`), never named: for each
//! committed fixture of each family, experts streamed through the planner with a 2-slot cache
//! give the tokens and logits of experts mapped in place, n-gram and replay speculation give
//! the tokens and logits of plain greedy decoding, and the spine placed piece by piece (k layers
//! resident, under a budget of exactly what that plan charges) gives those of the spine mapped.
// Fixture ids, shapes and lengths are small; casts between them cannot truncate.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs, clippy::cast_possible_truncation)]

use sluice_engine::load::{self, ExpertMode, LoadOptions};
use sluice_engine::state_cache::held_bytes;
use sluice_engine::{generate, Drafter, GenerateOptions, Generation, NgramDrafter, ScriptDrafter};
use sluice_models::Model;
use std::path::PathBuf;

#[path = "../../sluice-models/tests/common/moe_fixtures.rs"]
mod moe_fixtures;

/// Every MoE family's fixtures (family folder, fixture; shared with the models' family tests).
const FIXTURES: [(&str, &str); 7] = moe_fixtures::MOE_FIXTURES;

fn dir(family: &str, name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(family).join(name)
}

fn open(family: &str, name: &str, experts: ExpertMode) -> load::Loaded {
    let opts = LoadOptions {
        memory: Some(1 << 30),
        experts,
        slots: (experts == ExpertMode::Stream).then_some(2),
        readers: 3,
        ..LoadOptions::default()
    };
    load::open(&dir(family, name), &opts).unwrap()
}

fn run(m: &Model, prompt: &[u32], draft_max: usize, d: Option<&mut dyn Drafter>) -> Generation {
    let opts =
        GenerateOptions { max_new: 12, keep_logits: true, draft_max, ..GenerateOptions::default() };
    let mut st = m.new_state();
    generate(m, &mut st, prompt, &opts, d, None).unwrap()
}

fn bits(g: &Generation) -> Vec<Vec<u32>> {
    g.logits.iter().map(|r| r.iter().map(|x| x.to_bits()).collect()).collect()
}

/// A prompt with repeats, so the n-gram drafter has something to propose.
fn prompt(m: &Model) -> Vec<u32> {
    let v = m.vocab_size() as u32;
    [5u32, 17, 30, 42, 5, 17, 30, 42, 5, 17].iter().map(|t| t % v).collect()
}

#[test]
fn streamed_through_the_planner_with_two_slots_equals_mapped_for_every_family() {
    for (family, name) in FIXTURES {
        let mapped = open(family, name, ExpertMode::Mapped);
        assert_eq!(mapped.mode, "mapped");
        let want = run(&mapped.model, &prompt(&mapped.model), 0, None);
        let streamed = open(family, name, ExpertMode::Stream);
        assert_eq!(streamed.mode, "stream", "{family}/{name}");
        let plan = streamed.plan.as_ref().expect("an MoE model is planned");
        assert_eq!(plan.slots, 2, "{family}/{name}: --cache-slots 2");
        let got = run(&streamed.model, &prompt(&streamed.model), 0, None);
        assert_eq!(got.tokens, want.tokens, "{family}/{name}: streamed tokens");
        assert!(bits(&got) == bits(&want), "{family}/{name}: streamed logits differ");
        let s = streamed.model.store_stats();
        assert!(s.bytes_read > 0 && s.misses > 2, "{family}/{name}: read from the shards: {s:?}");
        assert!(
            streamed.budget.used() <= streamed.budget.limit(),
            "{family}/{name}: within --memory"
        );
    }
}

#[test]
fn speculative_output_equals_plain_for_every_family() {
    for (family, name) in FIXTURES {
        let loaded = open(family, name, ExpertMode::Auto);
        let m = &loaded.model;
        let p = prompt(m);
        let plain = run(m, &p, 0, None);
        for width in [1usize, 3, 8] {
            let mut ngram = NgramDrafter::default();
            let spec = run(m, &p, width, Some(&mut ngram));
            assert_eq!(spec.tokens, plain.tokens, "{family}/{name} n-gram width {width}");
            assert!(bits(&spec) == bits(&plain), "{family}/{name} n-gram width {width}: logits");
            let mut replay =
                ScriptDrafter { base: p.len() + 1, script: plain.tokens[1..].to_vec() };
            let spec = run(m, &p, width, Some(&mut replay));
            assert_eq!(spec.tokens, plain.tokens, "{family}/{name} replay width {width}");
            assert!(bits(&spec) == bits(&plain), "{family}/{name} replay width {width}: logits");
            assert_eq!(spec.stats.accepted, spec.stats.drafted, "{family}/{name}: all accepted");
        }
    }
}

#[test]
fn deepseek_v3_experts_were_not_charged_to_memory() {
    // DeepSeek-V3 once mapped its experts unplanned: nothing was charged and no budget was too
    // small. Now a budget below its spine and state is refused with the shortfall named, and a
    // budget that holds the spine but not every expert streams them.
    for name in ["tiny-a", "tiny-b"] {
        let opts = LoadOptions { memory: Some(64 << 10), readers: 3, ..LoadOptions::default() };
        let err = load::open(&dir("deepseek_v3", name), &opts).expect_err("refused").to_string();
        assert!(err.contains("memory budget of 65536 bytes is too small"), "{name}: {err}");
        assert!(err.contains("Raise --memory"), "{name}: {err}");
        let base = LoadOptions { prefill_chunk: 16, readers: 3, ..LoadOptions::default() };
        let opts =
            LoadOptions { memory: Some(1 << 30), experts: ExpertMode::Mapped, ..base.clone() };
        let mapped = load::open(&dir("deepseek_v3", name), &opts).unwrap();
        let plan = mapped.plan.as_ref().expect("planned");
        // Room for the spine, the state, a 16-row pass and 4 slots, not for every expert.
        let n = &plan.needs;
        let spine = plan.spine.charged;
        let tight = spine + n.state + n.headroom + plan.work + 4 * n.slot;
        assert!(tight < spine + n.state + n.headroom + plan.work + n.experts * n.slot);
        let opts = LoadOptions { memory: Some(tight), ..base };
        let auto = load::open(&dir("deepseek_v3", name), &opts).unwrap();
        assert_eq!(auto.mode, "stream", "{name}: a budget below the experts streams them");
        assert!(auto.budget.used() <= auto.budget.limit(), "{name}: within --memory");
        let want = run(&mapped.model, &prompt(&mapped.model), 0, None);
        let got = run(&auto.model, &prompt(&auto.model), 0, None);
        assert!(bits(&got) == bits(&want), "{name}: streamed under a tight budget differs");
    }
}

#[test]
fn spine_placed_under_a_tight_budget_equals_mapped_for_every_family() {
    // The planner places every family's spine piece by piece: with exactly k layers resident
    // and the rest streamed through two buffers, under a --memory that holds exactly what that
    // plan charges, tokens and logits are those of the spine mapped, and nothing charged
    // exceeds --memory.
    use sluice_engine::plan::SpineMode;
    for (family, name) in FIXTURES {
        let base = LoadOptions {
            memory: Some(1 << 30),
            experts: ExpertMode::Stream,
            slots: Some(2),
            readers: 3,
            prefill_chunk: 16,
            ..LoadOptions::default()
        };
        let mapped = load::open(
            &dir(family, name),
            &LoadOptions { spine_placement: SpineMode::Mapped, ..base.clone() },
        )
        .unwrap();
        assert!(mapped.spine.is_none(), "{family}/{name}: --spine-placement mapped");
        let want = run(&mapped.model, &prompt(&mapped.model), 0, None);
        let layers = mapped.model.shape().layers;
        for k in [0, 1, layers - 1] {
            let opts = LoadOptions { spine_placement: SpineMode::Layers(k), ..base.clone() };
            let roomy = load::open(&dir(family, name), &opts).unwrap();
            let p = roomy.plan.as_ref().expect("planned");
            // The budget this plan needs and not a byte more: state, headroom, a 16-row pass,
            // the spine as placed and the two expert slots.
            let n = &p.needs;
            let tight = n.state + n.headroom + p.work + p.spine.charged + 2 * n.slot;
            drop(roomy);
            let opts = LoadOptions { memory: Some(tight), ..opts };
            let placed = load::open(&dir(family, name), &opts).unwrap();
            let plan = placed.plan.as_ref().expect("planned").to_string();
            assert!(
                plan.contains(&format!("spine: {k} of {layers} layers resident")),
                "{family}/{name}: {plan}"
            );
            let got = run(&placed.model, &prompt(&placed.model), 0, None);
            assert_eq!(got.tokens, want.tokens, "{family}/{name}: {k} resident layers");
            assert!(bits(&got) == bits(&want), "{family}/{name}: {k} resident layers: logits");
            let s = placed.model.spine_stats();
            assert!(s.piece_reads > 0 && s.bytes_read > 0, "{family}/{name}: {k}: {s:?}");
            assert!(
                placed.budget.used() <= placed.budget.limit(),
                "{family}/{name}: {k} resident layers under {tight} bytes"
            );
        }
    }
}

/// A dimension of a fixture's config.json, by key (from its `text_config` where it nests one).
fn config_dims(family: &str, name: &str) -> impl Fn(&str) -> u64 {
    let text: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir(family, name).join("config.json")).unwrap(),
    )
    .unwrap();
    let config = text.get("text_config").cloned().unwrap_or(text);
    move |k| config[k].as_u64().unwrap()
}

/// DeepSeek-V3's plan charged each kernel thread one head's widened `kv_b_proj` rows, while a
/// latent attention part widens every head it takes (up to 32, a decode step's four lane sets)
/// and, since session 33, each thread keeps them: the fixed charge now counts them all.
#[test]
fn deepseek_charged_one_heads_widened_kv_b_rows_a_thread_where_a_part_widens_all_its_heads() {
    let l = load::open(&dir("deepseek_v3", "tiny-a"), &LoadOptions::default()).unwrap();
    let mem = l.model.memory_needs().expect("planned");
    let dim = config_dims("deepseek_v3", "tiny-a");
    let threads = sluice_kernels::pool::global().threads() as u64;
    let heads = dim("num_attention_heads");
    assert!(heads > 1, "the fixture has several heads");
    let per_head = (dim("qk_nope_head_dim") + dim("v_head_dim")) * dim("kv_lora_rank") * 4;
    assert_eq!(mem.state_fixed, threads * heads.min(32) * per_head);
}

#[test]
fn the_state_cache_charge_counted_each_snapshot_at_the_live_states_size() {
    // Each snapshot the state cache holds (restored, being written, queued) keeps the
    // committed fixed-size state only: Kimi K3's live state also keeps a working copy of every
    // KDA state, and DeepSeek-V3 per-thread scratch, which the plan's `state_fixed` counts and
    // no snapshot holds. The charge used `state_fixed`, twice a K3 snapshot's size.
    for (family, name) in
        [("kimi_k3", "tiny-a"), ("deepseek_v3", "tiny-a"), ("qwen3_moe", "tiny-a")]
    {
        let opts = LoadOptions {
            memory: Some(1 << 30),
            experts: ExpertMode::Stream,
            readers: 3,
            state_cache: true,
            ..LoadOptions::default()
        };
        let l = load::open(&dir(family, name), &opts).unwrap();
        let m = &l.model;
        let mem = m.memory_needs().expect("planned");
        let fixed = m.state_shape().fixed_bytes() as u64;
        assert_eq!(fixed, m.new_state().snapshot_bytes() as u64, "{family}");
        let want = held_bytes(fixed, mem.state_per_position, opts.context, m.vocab_size());
        let plan = l.plan.as_ref().expect("an MoE model is planned");
        assert_eq!(plan.needs.state_cache, want, "{family}/{name}");
        if family == "kimi_k3" {
            // A working copy of the KDA states, and the W_UK rows each kernel thread keeps
            // widened for MLA's parts (at most 32 heads a part).
            let dim = config_dims(family, name);
            let threads = sluice_kernels::pool::global().threads() as u64;
            let w_uk = threads
                * dim("num_attention_heads").min(32)
                * dim("qk_nope_head_dim")
                * dim("kv_lora_rank")
                * 4;
            assert_eq!(
                mem.state_fixed,
                2 * fixed + w_uk,
                "the live state keeps a working copy; each thread its widened W_UK"
            );
        }
    }
}

#[test]
fn the_kernel_threads_scratch_was_left_to_the_fixed_io_headroom() {
    let pool = sluice_kernels::pool::global();
    let threads = pool.threads();
    for (family, name) in FIXTURES {
        for experts in [ExpertMode::Auto, ExpertMode::Stream] {
            let l = open(family, name, experts);
            let plan = l.plan.as_ref().expect("an MoE fixture is planned");
            // A model in memory rotates its packs through one buffer for every two threads; a
            // streamed one keeps one, and the pool keeps no more than the plan charged (other
            // tests' models only ever lower it).
            let buffers =
                if l.mode == "mapped" { sluice_kernels::pack_buffers(threads) } else { 1 };
            assert!(pool.pack_buffers() <= buffers, "{family}/{name} {experts:?}");
            let scratch = threads as u64 * sluice_kernels::WIDE_SCRATCH_BYTES as u64
                + sluice_kernels::pool_scratch_bytes(buffers) as u64;
            assert!(
                plan.needs.headroom >= (64 << 20) + scratch,
                "{family}/{name} {experts:?}: headroom {} does not hold 64 MiB and {threads} \
                 threads' scratch and the pool's ({scratch} bytes)",
                plan.needs.headroom
            );
        }
    }
}

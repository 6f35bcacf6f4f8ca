//! The golden harness every family's `<family>_goldens.rs` calls. A [`Suite`] names the fixture
//! folder, its fixtures and the stages its generator dumped (`tools/golden_common.py` writes them
//! for the `transformers` families, `tools/gen_k3_goldens.py` for Kimi K3), and runs the checks
//! every family owes its reference:
//! - every `[T, d]` stage, the router logits (where dumped) and the logits within relative L2
//!   [`STAGE_TOL`] ([`Suite::stages_match`]);
//! - every MoE layer's expert ids identical row by row, its weights within the family's
//!   tolerance;
//! - prefill-then-decode logits within [`DECODE_ABS_TOL`] per step and its greedy tokens
//!   identical ([`Suite::decode_matches`]), greedy generation identical
//!   ([`Suite::greedy_matches`]);
//! - a T-row pass bit-identical to T single rows, rolled-back rows leaving no trace (and a
//!   snapshot restoring exactly), a verified draft with a wrong tail continuing exactly as plain
//!   decoding.
//!
//! Models load through the family table (`sluice_models::load`), as the engine loads them, so
//! the harness names no family; a failure names the fixture, the prompt, the stage, the layer
//! and the row.

use super::argmax;
use sluice_checkpoint::{parse_header, Checkpoint};
use sluice_core::DType;
use sluice_models::{FamilyModel, LogitRows, Model, Trace};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The checks every `transformers` MoE family owes its goldens, one `#[test]` each, over the
/// suite `$suite` (a `const` [`Suite`]): every stage with the routing, prefill then decode,
/// greedy generation, a T-row pass against T single rows, rollback (and snapshots) on fixture
/// `$rollback`, a verified draft with a wrong tail on fixture `$draft`. A family's test file
/// adds only what is its own (its rotary rows, config facts its goldens pin).
#[allow(unused_macros)]
macro_rules! moe_golden_tests {
    ($suite:ident, rollback: $rollback:literal, draft: $draft:literal) => {
        #[test]
        fn stages_routing_and_logits_match_transformers() {
            $suite.stages_match();
        }

        #[test]
        fn prefill_then_decode_matches_transformers() {
            $suite.decode_matches();
        }

        #[test]
        fn greedy_generation_matches_transformers() {
            $suite.greedy_matches();
        }

        #[test]
        fn a_t_row_pass_is_bit_identical_to_t_single_rows() {
            $suite.t_rows_are_bit_identical();
        }

        #[test]
        fn rolled_back_rows_leave_no_trace_and_snapshots_restore_exactly() {
            $suite.rollback_leaves_no_trace($rollback);
        }

        #[test]
        fn a_verified_draft_with_a_wrong_tail_continues_exactly_as_plain_decoding() {
            $suite.verified_draft_continues_as_plain($draft);
        }
    };
}
#[allow(unused_imports)]
pub(crate) use moe_golden_tests;

/// Relative L2 bound of every stage, the router logits and the logits.
pub const STAGE_TOL: f64 = 1e-4;
/// Absolute bound of the cached-decode logits, per step.
pub const DECODE_ABS_TOL: f32 = 1e-4;
/// The per-layer stages of the `transformers` generators (`tools/golden_common.py`).
pub const HF_LAYER_STAGES: &[&str] = &["attn_in", "attn_out", "mlp_in", "mlp_out", "out"];

/// How a family's goldens hold each MoE layer's routing.
pub struct Routing {
    /// Golden suffix of the chosen expert ids: `p{j}.layer{i}.{ids}`, `[T, k]` i32.
    pub ids: &'static str,
    /// Golden suffix of their weights: `p{j}.layer{i}.{weights}`, `[T, k]` f32.
    pub weights: &'static str,
    /// Whether the goldens list each row's experts by id rather than in the order chosen
    /// (mlx-lm's `argpartition` leaves the order arbitrary, so K3's generator sorts them).
    pub sorted_by_id: bool,
    /// Relative L2 bound of the weights.
    pub weight_tol: f64,
    /// Whether the goldens hold `layer{i}.router_logits`, compared as a stage.
    pub router_logits: bool,
}

/// The routing of the `transformers` generators: ids in the order chosen, weights within
/// [`STAGE_TOL`], router logits dumped.
pub const HF_ROUTING: Routing = Routing {
    ids: "topk_ids",
    weights: "topk_weights",
    sorted_by_id: false,
    weight_tol: STAGE_TOL,
    router_logits: true,
};

/// One family's goldens: where they are and what they hold.
pub struct Suite {
    /// The fixture folder under `tests/fixtures/`, also the family's name in the family table.
    pub family: &'static str,
    /// The fixtures the whole-suite checks run over.
    pub fixtures: &'static [&'static str],
    /// The stages dumped per layer (`layer{i}.{stage}`).
    pub layer_stages: &'static [&'static str],
    /// The stage dumped after the last layer (`final_norm`, `final_hidden`).
    pub final_stage: &'static str,
    /// How the MoE layers' routing is dumped (`None`: a dense family).
    pub routing: Option<Routing>,
}

impl Suite {
    /// The goldens of a `transformers` generator (`tools/golden_common.py`): its per-layer stages,
    /// `final_norm`, and for an MoE family ([`HF_ROUTING`]) its routing.
    pub const fn transformers(
        family: &'static str,
        fixtures: &'static [&'static str],
        moe: bool,
    ) -> Self {
        let routing = if moe { Some(HF_ROUTING) } else { None };
        Self { family, fixtures, layer_stages: HF_LAYER_STAGES, final_stage: "final_norm", routing }
    }

    /// The directory of fixture `name`.
    pub fn dir(&self, name: &str) -> PathBuf {
        super::fixture_of(self.family, name)
    }

    /// Fixture `name` loaded through the family table, as the engine loads it.
    pub fn model(&self, name: &str) -> Model {
        let ckpt = Arc::new(Checkpoint::open(&self.dir(name)).expect("fixture opens"));
        let m = sluice_models::load(ckpt).expect("fixture loads");
        assert_eq!(m.family(), self.family, "{name}: loaded as another family");
        m
    }

    /// Fixture `name` as the family's own model type (for what only the family has: its rope,
    /// its config).
    pub fn family_model<T: FamilyModel>(&self, name: &str) -> T {
        self.model(name).into_family::<T>().unwrap_or_else(|_| panic!("{name}: not this type"))
    }

    /// The goldens of fixture `name`.
    pub fn golden(&self, name: &str) -> Golden {
        Golden::load_dir(&self.dir(name))
    }

    /// Every fixture has MoE layers and dense layers, as the family's goldens mean to cover.
    pub fn fixtures_hold_moe_and_dense_layers(&self) {
        for name in self.fixtures {
            let m = self.model(name);
            let moe = m.routed_experts().map(|r| r.moe_layers).unwrap_or_default();
            let layers = m.shape().layers;
            assert!(!moe.is_empty() && moe.len() < layers, "{name}: MoE {moe:?} of {layers}");
        }
    }

    /// Fixture `name`'s rotary tables against the goldens' `rope.*`: `inv_freq` bit-exact, the
    /// cos and sin rows `rows(n)` gives for positions `0..n` within `tol`. The goldens hold
    /// `width` values per position, of which the model's rows hold the first `take` (HF's
    /// `cat(freqs, freqs)` rows hold each angle twice).
    pub fn rope_matches_in(
        &self,
        name: &str,
        tol: f32,
        inv_freq: &[f32],
        (width, take): (usize, usize),
        rows: impl FnOnce(usize) -> (Vec<f32>, Vec<f32>),
    ) {
        let g = self.golden(name);
        assert_eq!(inv_freq, g.f("rope.inv_freq"), "{name}: inv_freq differs from HF's buffer");
        let n = g.f("rope.cos").len() / width;
        let (cos, sin) = rows(n);
        let head = |v: &[f32]| -> Vec<f32> {
            v.chunks_exact(width).flat_map(|r| r[..take].to_vec()).collect()
        };
        let dc = max_abs(&cos, &head(g.f("rope.cos")));
        let ds = max_abs(&sin, &head(g.f("rope.sin")));
        eprintln!("{name}: rope cos max abs {dc:.3e}, sin max abs {ds:.3e} over {n} positions");
        assert!(dc <= tol && ds <= tol, "{name}: cos {dc:e} sin {ds:e}");
        assert_eq!(cos.len(), n * take, "{name}: rope rows");
    }

    /// [`Suite::stages_match_in`] over every fixture.
    pub fn stages_match(&self) {
        self.fixtures.iter().for_each(|n| self.stages_match_in(n));
    }

    /// Every prompt of fixture `name` in one pass with a trace: each stage, each MoE layer's
    /// routing and the logits against the goldens.
    pub fn stages_match_in(&self, name: &str) {
        let m = self.model(name);
        let g = self.golden(name);
        let shape = m.shape();
        let moe = m.routed_experts().map(|r| r.moe_layers).unwrap_or_default();
        assert_eq!(moe.is_empty(), self.routing.is_none(), "{name}: MoE layers vs routing");
        let mut stages = vec!["embed".to_string()];
        for i in 0..shape.layers {
            stages.extend(self.layer_stages.iter().map(|s| format!("layer{i}.{s}")));
        }
        if self.routing.as_ref().is_some_and(|r| r.router_logits) {
            stages.extend(moe.iter().map(|i| format!("layer{i}.router_logits")));
        }
        stages.push(self.final_stage.into());
        let mut worst = (0.0f64, String::new());
        for j in 0..g.json["prompts"].as_array().expect("prompts").len() {
            let ids = g.ids(&format!("p{j}.ids"));
            let mut st = m.new_state();
            let mut tr = Trace::default();
            let logits = m.forward(&mut st, &ids, LogitRows::All, Some(&mut tr)).expect("forward");
            st.commit(ids.len());
            for s in &stages {
                let got = tr.tensors.get(s).unwrap_or_else(|| panic!("{name} p{j}: no stage {s}"));
                let e = rel_l2(got, g.f(&format!("p{j}.{s}")));
                assert!(e <= STAGE_TOL, "{name} p{j} stage {s}: relL2 {e:.3e} > {STAGE_TOL:e}");
                if e > worst.0 {
                    worst = (e, format!("p{j}.{s}"));
                }
            }
            if let Some(r) = &self.routing {
                let got: Vec<usize> = tr.routes.keys().copied().collect();
                assert_eq!(got, moe, "{name} p{j}: the trace's MoE layers");
                for &i in &moe {
                    self.routes_match(r, &g, &tr, (name, j, i), ids.len(), shape.experts_per_token);
                }
            }
            let e = rel_l2(&logits, g.f(&format!("p{j}.logits")));
            assert!(e <= STAGE_TOL, "{name} p{j}: logits relL2 {e:.3e} > {STAGE_TOL:e}");
            eprintln!("{name} p{j} (T={}): logits relL2 {e:.3e}", ids.len());
        }
        eprintln!("{name}: worst stage relL2 {:.3e} at {}", worst.0, worst.1);
    }

    /// Layer `i`'s routes of prompt `j` against the goldens: ids row by row, weights in bulk.
    fn routes_match(
        &self,
        r: &Routing,
        g: &Golden,
        tr: &Trace,
        (name, j, i): (&str, usize, usize),
        t: usize,
        k: usize,
    ) {
        let routes = &tr.routes[&i];
        assert_eq!(routes.len(), t, "{name} p{j} layer {i}: routed rows");
        let want_ids = g.ids(&format!("p{j}.layer{i}.{}", r.ids));
        assert_eq!(want_ids.len(), t * k, "{name} p{j} layer {i}: golden ids");
        let mut got_w = Vec::with_capacity(t * k);
        for (row, route) in routes.iter().enumerate() {
            let mut pairs: Vec<(u32, f32)> =
                route.ids.iter().copied().zip(route.weights.iter().copied()).collect();
            if r.sorted_by_id {
                pairs.sort_by_key(|p| p.0);
            }
            let ids: Vec<u32> = pairs.iter().map(|p| p.0).collect();
            let want = &want_ids[row * k..(row + 1) * k];
            assert_eq!(ids, want, "{name} p{j} layer {i} row {row}: routing differs");
            got_w.extend(pairs.iter().map(|p| p.1));
        }
        let e = rel_l2(&got_w, g.f(&format!("p{j}.layer{i}.{}", r.weights)));
        assert!(e <= r.weight_tol, "{name} p{j} layer {i}: weights relL2 {e:.3e}");
    }

    /// [`Suite::decode_matches_in`] over every fixture.
    pub fn decode_matches(&self) {
        self.fixtures.iter().for_each(|n| self.decode_matches_in(n));
    }

    /// The goldens' prefill-then-decode run of fixture `name`, one committed pass per token: each
    /// step's logits within [`DECODE_ABS_TOL`], each greedy token identical.
    pub fn decode_matches_in(&self, name: &str) {
        let m = self.model(name);
        let g = self.golden(name);
        let (prompt, tokens) = (g.ids("decode.prompt"), g.ids("decode.tokens"));
        let want = g.f("decode.logits");
        let v = m.vocab_size();
        let mut st = m.new_state();
        let mut logits = m.forward(&mut st, &prompt, LogitRows::Last, None).unwrap();
        st.commit(prompt.len());
        let mut worst = 0.0f32;
        for (s, &tok) in tokens.iter().enumerate() {
            let d = max_abs(&logits, &want[s * v..(s + 1) * v]);
            assert!(d <= DECODE_ABS_TOL, "{name} decode step {s}: max abs {d:.3e}");
            worst = worst.max(d);
            assert_eq!(argmax(&logits), tok, "{name} decode step {s}: greedy token");
            logits = m.forward(&mut st, &[tok], LogitRows::Last, None).unwrap();
            st.commit(1);
        }
        eprintln!("{name}: decode logits max abs {worst:.3e} over {} steps", tokens.len());
    }

    /// [`Suite::greedy_matches_in`] over every fixture.
    pub fn greedy_matches(&self) {
        self.fixtures.iter().for_each(|n| self.greedy_matches_in(n));
    }

    /// Every greedy run of fixture `name`'s `golden.json`, token for token.
    pub fn greedy_matches_in(&self, name: &str) {
        let m = self.model(name);
        let g = self.golden(name);
        for run in g.json["greedy"].as_array().expect("greedy runs") {
            let (prompt, want) = (json_ids(&run["prompt"]), json_ids(&run["tokens"]));
            assert_eq!(greedy(&m, &prompt, want.len()), want, "{name}: greedy for {prompt:?}");
        }
    }

    /// For every fixture, its prompt `p2` in one T-row pass and in T single-row passes: the logits
    /// bit-identical.
    pub fn t_rows_are_bit_identical(&self) {
        for name in self.fixtures {
            let m = self.model(name);
            let ids = self.golden(name).ids("p2.ids");
            let mut st = m.new_state();
            let all = m.forward(&mut st, &ids, LogitRows::All, None).unwrap();
            let mut one = Vec::new();
            let mut st = m.new_state();
            for &id in &ids {
                one.extend(m.forward(&mut st, &[id], LogitRows::All, None).unwrap());
                st.commit(1);
            }
            assert_eq!(bits(&all), bits(&one), "{name}: T-row pass differs from single rows");
        }
    }

    /// Fixture `name`: a pass committed in part, then a pass rolled back, continues exactly as a
    /// state that only ever saw the committed rows; a snapshot taken after the rollback restores
    /// to the same continuation.
    pub fn rollback_leaves_no_trace(&self, name: &str) {
        let m = self.model(name);
        let ids = [5u32, 17, 300, 42, 99];
        let mut a = m.new_state();
        m.forward(&mut a, &ids, LogitRows::Last, None).unwrap();
        a.commit(3);
        m.forward(&mut a, &[7, 8, 9], LogitRows::All, None).unwrap();
        a.rollback();
        let snap = a.snapshot(None);
        let got = m.forward(&mut a, &[1], LogitRows::Last, None).unwrap();
        let mut b = m.new_state();
        m.forward(&mut b, &ids[..3], LogitRows::Last, None).unwrap();
        b.commit(3);
        let want = m.forward(&mut b, &[1], LogitRows::Last, None).unwrap();
        assert_eq!(bits(&got), bits(&want), "{name}: the rolled-back rows changed the state");
        let mut r = snap.restore();
        let restored = m.forward(&mut r, &[1], LogitRows::Last, None).unwrap();
        assert_eq!(bits(&restored), bits(&want), "{name}: the snapshot restores another state");
    }

    /// Fixture `name`, its second greedy run: a verified draft `[t0, t1, t2, wrong, wrong]`
    /// confirms t1..t3, commits three rows, and decoding continues exactly as the goldens.
    pub fn verified_draft_continues_as_plain(&self, name: &str) {
        let m = self.model(name);
        let g = self.golden(name);
        let run = &g.json["greedy"].as_array().expect("greedy runs")[1];
        let (prompt, want) = (json_ids(&run["prompt"]), json_ids(&run["tokens"]));
        let mut st = m.new_state();
        let first = m.forward(&mut st, &prompt, LogitRows::Last, None).unwrap();
        st.commit(prompt.len());
        assert_eq!(argmax(&first), want[0]);
        let wrong = (want[3] + 1) % 7;
        let draft = [want[0], want[1], want[2], wrong, wrong];
        let rows = m.forward(&mut st, &draft, LogitRows::All, None).unwrap();
        let got: Vec<u32> = rows.chunks_exact(m.vocab_size()).map(argmax).collect();
        assert_eq!(got[..3], want[1..4], "{name}: the verified rows give the greedy tokens");
        st.commit(3);
        let mut tok = got[2];
        let mut out = want[..3].to_vec();
        while out.len() < want.len() {
            out.push(tok);
            let l = m.forward(&mut st, &[tok], LogitRows::Last, None).unwrap();
            st.commit(1);
            tok = argmax(&l);
        }
        assert_eq!(out, want, "{name}: decoding after the draft");
    }
}

/// `n` greedy tokens after `prompt`, one committed pass per token.
pub fn greedy(m: &Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut st = m.new_state();
    let mut logits = m.forward(&mut st, prompt, LogitRows::Last, None).unwrap();
    st.commit(prompt.len());
    let mut got = Vec::new();
    while got.len() < n {
        let tok = argmax(&logits);
        got.push(tok);
        logits = m.forward(&mut st, &[tok], LogitRows::Last, None).unwrap();
        st.commit(1);
    }
    got
}

/// The bits of `v`, for bit-identity checks.
pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Golden tensors of one fixture: `golden.safetensors` (f32 and i32 tensors) and `golden.json`.
pub struct Golden {
    pub f32s: BTreeMap<String, (Vec<u64>, Vec<f32>)>,
    pub i32s: BTreeMap<String, (Vec<u64>, Vec<i32>)>,
    pub json: serde_json::Value,
}

impl Golden {
    /// The goldens in a fixture directory.
    pub fn load_dir(dir: &Path) -> Self {
        let path = dir.join("golden.safetensors");
        let bytes = std::fs::read(&path).expect("golden.safetensors");
        let h = parse_header(&path, &bytes).expect("golden header");
        let mut f32s = BTreeMap::new();
        let mut i32s = BTreeMap::new();
        for t in h.tensors {
            let b = &bytes[t.data_start as usize..(t.data_start + t.len) as usize];
            let words = b.chunks_exact(4).map(|c| <[u8; 4]>::try_from(c).unwrap());
            match t.dtype {
                DType::F32 => {
                    f32s.insert(t.name, (t.shape, words.map(f32::from_le_bytes).collect()));
                }
                DType::I32 => {
                    i32s.insert(t.name, (t.shape, words.map(i32::from_le_bytes).collect()));
                }
                other => panic!("unexpected golden dtype {other}"),
            }
        }
        let json =
            serde_json::from_slice(&std::fs::read(dir.join("golden.json")).unwrap()).unwrap();
        Self { f32s, i32s, json }
    }

    /// The f32 golden `name`.
    pub fn f(&self, name: &str) -> &[f32] {
        &self.f32s.get(name).unwrap_or_else(|| panic!("golden {name}")).1
    }

    /// The i32 golden `name` as token or expert ids.
    pub fn ids(&self, name: &str) -> Vec<u32> {
        let v = &self.i32s.get(name).unwrap_or_else(|| panic!("golden {name}")).1;
        v.iter().map(|&x| u32::try_from(x).expect("a non-negative id")).collect()
    }
}

/// A golden's JSON array of token ids (`golden.json`'s greedy runs).
pub fn json_ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| u32::try_from(x.as_u64().unwrap()).unwrap()).collect()
}

/// Relative L2 distance ‖a − b‖ / ‖b‖ in f64.
pub fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    let num: f64 = a.iter().zip(b).map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2)).sum();
    let den: f64 = b.iter().map(|&y| f64::from(y).powi(2)).sum();
    (num / den.max(1e-300)).sqrt()
}

/// Largest absolute difference.
pub fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

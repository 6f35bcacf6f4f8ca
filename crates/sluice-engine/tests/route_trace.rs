//! Route traces (`--trace-routes`): a traced generation has the same output as an untraced
//! one, its trace holds exactly the routes the model computes (checked against a one-pass
//! stage trace of the same tokens), the committed rows cover the prompt and every generated
//! token, the file is complete or absent, and the store's policy simulation replays it.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use sluice_checkpoint::Checkpoint;
use sluice_engine::route_trace::{self, RouteTap, RouteTraceError, RouteTraceWriter};
use sluice_engine::{generate, GenerateOptions, ScriptDrafter};
use sluice_models::kimi_k3::Trace;
use sluice_models::{LogitRows, Model};
use sluice_store::policy::{simulate, PolicyKind};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

fn model() -> Model {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/kimi_k3/tiny-a");
    sluice_models::load(Arc::new(Checkpoint::open(&dir).unwrap())).unwrap()
}

#[test]
fn a_traced_run_records_every_pass_and_the_routes_the_model_computes() {
    let m = model();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("routes.jsonl");
    let prompt: Vec<u32> = [5u32, 9, 13, 5, 9, 13, 5, 9, 13, 5, 9].to_vec();
    let plain = generate(
        &m,
        &mut m.new_state(),
        &prompt,
        &GenerateOptions { max_new: 12, ..GenerateOptions::default() },
        None,
        None,
    )
    .unwrap();
    let tap = RouteTap(Arc::new(Mutex::new(
        RouteTraceWriter::create(&path, "tiny-a", prompt.len(), 0).unwrap(),
    )));
    let opts = GenerateOptions {
        max_new: 12,
        draft_max: 4,
        prefill_chunk: 5,
        route_tap: Some(tap.clone()),
        ..GenerateOptions::default()
    };
    // Drafts from the plain run's own tokens: every decode pass verifies several rows.
    let mut script = ScriptDrafter { base: prompt.len() + 1, script: plain.tokens.clone() };
    let traced = generate(&m, &mut m.new_state(), &prompt, &opts, Some(&mut script), None).unwrap();
    assert_eq!(traced.tokens, plain.tokens, "tracing changed the output");
    drop(opts);
    assert!(!path.exists(), "the trace appeared before it was finished");
    let writer = Arc::try_unwrap(tap.0).unwrap().into_inner().unwrap();
    let written = writer.finish().unwrap();

    let (header, passes) = route_trace::read(&path).unwrap();
    assert_eq!(header.prompt_tokens, prompt.len());
    assert_eq!(written, passes.len());
    assert_eq!(passes.len(), traced.stats.prefill_passes + traced.stats.passes - 1);
    // Committed rows follow one another from position 0 and cover the prompt and every
    // generated token but the last (still pending when generation stopped).
    let mut pos = 0;
    for (i, p) in passes.iter().enumerate() {
        assert_eq!((p.pass, p.start), (i, pos), "pass {i}");
        assert!(p.committed >= 1 && p.committed <= p.rows);
        pos += p.committed;
    }
    assert_eq!(pos, prompt.len() + traced.tokens.len() - 1);
    assert!(passes.iter().any(|p| p.phase == "decode" && p.rows > 1), "no pass verified drafts");

    // The committed rows' routes equal one pass over the same tokens with a full stage trace.
    let mut all = prompt.clone();
    all.extend_from_slice(&traced.tokens[..traced.tokens.len() - 1]);
    let mut st = m.new_state();
    let mut reference = Trace::default();
    m.forward(&mut st, &all, LogitRows::Last, Some(&mut reference)).unwrap();
    assert!(!reference.routes.is_empty());
    for (layer, routes) in &reference.routes {
        let mut got_ids = Vec::new();
        let mut got_w = Vec::new();
        for p in &passes {
            let l = p.layers.iter().find(|l| l.layer == *layer).expect("layer in every pass");
            got_ids.extend(l.ids[..p.committed].iter().cloned());
            got_w.extend(l.weights[..p.committed].iter().cloned());
        }
        let want_ids: Vec<Vec<u32>> = routes.iter().map(|r| r.ids.clone()).collect();
        let want_w: Vec<Vec<f32>> = routes.iter().map(|r| r.weights.clone()).collect();
        assert_eq!(got_ids, want_ids, "layer {layer} ids");
        assert_eq!(got_w, want_w, "layer {layer} weights (JSON must round-trip f32 exactly)");
    }

    // The replay sees every pass's distinct experts per layer once.
    let keys = route_trace::store_keys(&passes, false);
    let r = simulate(PolicyKind::S3Fifo, 8, keys.iter().copied());
    assert_eq!(r.hits + r.misses, keys.len() as u64);
    let per_row = route_trace::store_keys(&passes, true);
    assert!(per_row.len() >= keys.len());
}

#[test]
fn a_malformed_trace_line_is_an_error_naming_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.jsonl");
    let w = RouteTraceWriter::create(&path, "m", 1, 4).unwrap();
    w.finish().unwrap();
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str("{\"pass\":0,\"phase\":\"decode\"}\n");
    std::fs::write(&path, text).unwrap();
    match route_trace::read(&path) {
        Err(RouteTraceError::Malformed { line, .. }) => assert_eq!(line, 2),
        other => panic!("expected a malformed-line error, got {other:?}"),
    }
    std::fs::write(&path, "{\"format\":\"other\",\"version\":1,\"model\":\"m\",\"prompt_tokens\":1,\"experts_per_layer\":0}\n").unwrap();
    assert!(matches!(route_trace::read(&path), Err(RouteTraceError::Malformed { line: 1, .. })));
}

#[test]
fn an_unfinished_trace_leaves_no_file_behind() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.jsonl");
    drop(RouteTraceWriter::create(&path, "m", 1, 0).unwrap());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

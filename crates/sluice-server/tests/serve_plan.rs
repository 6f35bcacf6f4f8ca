//! The serve rule of the memory plan (`sluice_engine::plan::Plan::compute`), read from the plan
//! line a real `sluice serve` process prints at start: the prefill chunk is planned for at most
//! the rows a pass takes before its in-pass captures run out (`MAX_CAPTURES` checkpoints of
//! `--checkpoint-every`), and the rest of the spare goes to the caches. No request is needed: the
//! plan is printed before the server listens.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::{sluice_bin, Server};
use std::process::Command;

/// A `many-experts` synth model (6 layers of 256 experts, 317 MiB) in a temporary directory.
fn synth() -> (tempfile::TempDir, String) {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("m");
    let o = Command::new(sluice_bin())
        .args(["synth", "--preset", "many-experts", "--layers", "6", "--experts", "256"])
        .args(["--seed", "5", "--out", model.to_str().unwrap()])
        .output()
        .expect("spawn synth");
    assert!(o.status.success(), "synth: {}", String::from_utf8_lossy(&o.stderr));
    let m = model.to_str().unwrap().to_owned();
    (tmp, m)
}

/// The number after `before` in the plan line, e.g. `prefill chunk ` → 16.
fn number_after(line: &str, before: &str) -> u64 {
    let rest = line.split(before).nth(1).unwrap_or_else(|| panic!("no {before:?} in {line}"));
    rest.split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
}

fn plan_line(server: &Server) -> String {
    let log = server.log.lock().unwrap().clone();
    log.lines().find(|l| l.contains("memory plan:")).unwrap_or_else(|| panic!("{log}")).to_owned()
}

/// Under 96 MiB with 8 MiB of conversation states, a server planned its chunk like a run: 771
/// rows (all the spare: the cache could not hold a layer's experts), while its passes stopped
/// at every 16-row checkpoint (after in-pass captures, at the fifth: 80 rows), and the expert
/// cache got the minimum of two slots. (The budget is 104 MiB since every kernel thread's
/// fixed scratch grew by the 4 MiB pack buffer of the AVX-512 prefill nest, session 23: at 96
/// MiB the two threads' 8 MiB left the chunk 44 rows, short of the rule's 80. Since session
/// 24 the pack is one 8 MiB buffer of the pool's, the same 8 MiB at two threads.)
#[test]
fn a_server_gave_the_prefill_chunk_every_spare_byte_and_the_cache_two_slots() {
    let (_tmp, m) = synth();
    let flags = ["--memory", "104M", "--context", "4096", "--checkpoint-every", "16"];
    // A cache that cannot hold a layer's 256 experts gets no prefill hits, so the stored
    // states take the rest and the cache keeps its two slots.
    let keeps = Server::start(&[&["--model", &m, "--session-memory", "8M"][..], &flags].concat());
    let line = plan_line(&keeps);
    assert_eq!(number_after(&line, "prefill chunk "), 80, "{line}");
    assert!(line.contains("the rest conversation states (+"), "{line}");
    assert_eq!(number_after(&line, "expert cache "), 2, "{line}");
    drop(keeps);
    // A server that keeps no conversation states takes no checkpoints: no pass is cut, and it
    // plans as a run, the chunk taking the spare.
    let whole = Server::start(&[
        "--model",
        &m,
        "--memory",
        "104M",
        "--context",
        "4096",
        "--session-memory",
        "0",
        "--checkpoint-every",
        "16",
    ]);
    let line = plan_line(&whole);
    assert!(number_after(&line, "prefill chunk ") > 80 * 4, "{line}");
    assert!(!line.contains("serve rule"), "{line}");
}

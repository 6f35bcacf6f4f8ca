//! The `sluice` binary as a user runs it: real processes, real files.
// Fixture ids, shapes and lengths are small; casts between them cannot truncate.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

mod common;

use common::{k3_fixture, sluice, sluice_with_env};
use std::path::PathBuf;
use std::process::{Command, Output};

fn json_out(o: &Output) -> serde_json::Value {
    assert!(o.status.success(), "sluice failed: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("one JSON object on stdout")
}

fn golden_greedy(name: &str) -> Vec<(Vec<u64>, Vec<u64>)> {
    let g: serde_json::Value = serde_json::from_slice(
        &std::fs::read(PathBuf::from(k3_fixture(name)).join("golden.json")).unwrap(),
    )
    .unwrap();
    g["greedy"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let ids =
                |k: &str| r[k].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
            (ids("prompt"), ids("tokens"))
        })
        .collect()
}

#[test]
fn run_json_reproduces_the_mlx_greedy_tokens() {
    let cache = tempfile::tempdir().unwrap();
    for name in ["tiny-a", "tiny-b"] {
        for (prompt, want) in golden_greedy(name) {
            let ids = prompt.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
            let n = want.len().to_string();
            let v = json_out(&sluice(
                &[
                    "run",
                    "--model",
                    &k3_fixture(name),
                    "--prompt-ids",
                    &ids,
                    "--max-new",
                    &n,
                    "--json",
                ],
                cache.path(),
            ));
            let got: Vec<u64> = v["generated_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap())
                .collect();
            assert_eq!(got, want, "{name} prompt {ids}");
            assert_eq!(v["prompt_ids"].as_array().unwrap().len(), prompt.len());
            assert!(v["text"].is_string());
            assert!(v["stats"]["s_per_token"].is_number());
        }
    }
}

/// A benchmark's JSON did not say which kernel tier ran, so a run with `SLUICE_ISA` forced could
/// not be told from one on the CPU's best tier: `run --json` names it, and a forced tier still
/// gives the reference's greedy tokens.
#[test]
fn run_json_did_not_name_the_kernel_tier_it_ran() {
    let cache = tempfile::tempdir().unwrap();
    let (prompt, want) = golden_greedy("tiny-a").remove(0);
    let ids = prompt.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    let n = want.len().to_string();
    let args = ["run", "--model", &k3_fixture("tiny-a"), "--prompt-ids", &ids, "--max-new", &n];
    let auto = json_out(&sluice(&[&args[..], &["--json"]].concat(), cache.path()));
    let best = auto["isa"].as_str().expect("isa is named").to_string();
    assert!(["avx512", "avx2", "neon", "scalar"].contains(&best.as_str()), "{best}");
    let forced = sluice_with_env(
        &[&args[..], &["--json"]].concat(),
        cache.path(),
        &[("SLUICE_ISA", "scalar")],
    );
    let forced = json_out(&forced);
    assert_eq!(forced["isa"], "scalar");
    for v in [&auto, &forced] {
        let got: Vec<u64> =
            v["generated_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
        assert_eq!(got, want, "{}", v["isa"]);
    }
}

#[test]
fn dump_logits_writes_an_npy_of_steps_by_vocab() {
    let cache = tempfile::tempdir().unwrap();
    let out = cache.path().join("logits.npy");
    let o = sluice(
        &[
            "run",
            "--model",
            &k3_fixture("tiny-a"),
            "--prompt-ids",
            "60",
            "--max-new",
            "3",
            "--dump-logits",
            out.to_str().unwrap(),
        ],
        cache.path(),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let b = std::fs::read(&out).unwrap();
    assert_eq!(&b[..6], b"\x93NUMPY");
    let hlen = u16::from_le_bytes([b[8], b[9]]) as usize;
    let header = std::str::from_utf8(&b[10..10 + hlen]).unwrap();
    assert!(header.contains("'shape': (3, 712)"), "{header}");
    assert_eq!((10 + hlen) % 64, 0);
    assert_eq!(b.len(), 10 + hlen + 3 * 712 * 4);
}

#[test]
fn text_prompts_and_chat_use_the_checkpoint_tokenizer() {
    let cache = tempfile::tempdir().unwrap();
    let v = json_out(&sluice(
        &[
            "run",
            "--model",
            &k3_fixture("tiny-a"),
            "--prompt",
            "the model",
            "--max-new",
            "2",
            "--json",
        ],
        cache.path(),
    ));
    assert!(!v["prompt_ids"].as_array().unwrap().is_empty());
    let c = json_out(&sluice(
        &[
            "run",
            "--model",
            &k3_fixture("tiny-a"),
            "--prompt",
            "hi",
            "--chat",
            "--max-new",
            "2",
            "--json",
        ],
        cache.path(),
    ));
    // The chat prompt starts with <|open|> (first special id + 3) and is longer than the text.
    let open = 456 + 3;
    assert_eq!(c["prompt_ids"][0].as_u64().unwrap(), open);
}

#[test]
fn builtin_model_runs_without_a_model_and_is_deterministic() {
    let cache = tempfile::tempdir().unwrap();
    let a = sluice(&["run", "--prompt", "Hello", "--max-new", "8", "--json"], cache.path());
    let b_cache = tempfile::tempdir().unwrap();
    let b = sluice(&["run", "--prompt", "Hello", "--max-new", "8", "--json"], b_cache.path());
    let (va, vb) = (json_out(&a), json_out(&b));
    assert_eq!(va["generated_ids"], vb["generated_ids"], "two fresh copies must agree");
    assert_eq!(va["demo_model"], true);
    let err = String::from_utf8_lossy(&a.stderr);
    assert!(err.contains("mini-K3, a 31.6M-parameter Kimi K3-architecture model"), "{err}");
    assert!(!err.contains("RANDOM"), "{err}");
    // The built-in directory is a real checkpoint: inspect reads it.
    let dir = cache.path().join("mini-k3");
    let i = sluice(&["inspect", dir.to_str().unwrap(), "--json"], cache.path());
    let iv = json_out(&i);
    assert_eq!(iv["architecture"], "KimiK3ForConditionalGeneration");
}

#[test]
fn damaged_builtin_model_in_the_cache_was_run() {
    let cache = tempfile::tempdir().unwrap();
    let args = ["run", "--prompt", "fn main", "--max-new", "4", "--json"];
    let good = json_out(&sluice(&args, cache.path()));
    // Flip one byte in a shard of the cached copy: the next run replaces it, then runs as before.
    let shard = cache.path().join("mini-k3/model-00003-of-000003.safetensors");
    let mut b = std::fs::read(&shard).unwrap();
    let last = b.len() - 1;
    b[last] ^= 1;
    std::fs::write(&shard, &b).unwrap();
    let o = sluice(&args, cache.path());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("model-00003-of-000003.safetensors fails its SHA-256 check"), "{err}");
    assert_eq!(json_out(&o)["generated_ids"], good["generated_ids"], "{err}");
}

#[test]
fn builtin_draft_changes_no_output_token() {
    // The built-in draft model (`--draft builtin`) only proposes, the target verifies, so the
    // tokens equal those of a run without drafts (`auto`, the default, drafts nothing).
    let cache = tempfile::tempdir().unwrap();
    let mut accepted = 0;
    for prompt in ["The Python interpreter", "fn main() {\n    let v = Vec::new();"] {
        let base = ["run", "--prompt", prompt, "--max-new", "24", "--json"];
        let with = sluice(&[&base[..], &["--draft", "builtin"]].concat(), cache.path());
        let err = String::from_utf8_lossy(&with.stderr).into_owned();
        assert!(err.contains("drafting with the built-in draft model"), "{err}");
        let with = json_out(&with);
        let without = json_out(&sluice(&base, cache.path()));
        assert_eq!(with["generated_ids"], without["generated_ids"], "{prompt:?}");
        let st = &with["stats"];
        assert!(st["drafter"].as_str().unwrap().contains("mini-draft"), "{st}");
        // The width policy's second decode pass runs at full width whatever the timings, so
        // these counts do not depend on the machine's speed.
        assert!(st["drafted"].as_u64().unwrap() > 0, "{st}");
        accepted += st["accepted"].as_u64().unwrap();
        assert_eq!(without["stats"]["drafted"].as_u64().unwrap(), 0);
    }
    assert!(accepted > 0, "mini-draft's drafts are accepted (measured: 7 and 3 of 12 and 14)");
    // `auto` drafts nothing for another model either.
    let o = sluice(
        &["run", "--model", &k3_fixture("tiny-a"), "--prompt-ids", "1,2", "--json"],
        cache.path(),
    );
    assert_eq!(json_out(&o)["stats"]["drafted"].as_u64().unwrap(), 0);
}

#[test]
fn damaged_builtin_draft_in_the_cache_was_run() {
    let cache = tempfile::tempdir().unwrap();
    let args = ["run", "--prompt", "import os", "--max-new", "6", "--json", "--draft", "builtin"];
    let good = json_out(&sluice(&args, cache.path()));
    let weights = cache.path().join("mini-draft/model.safetensors");
    let mut b = std::fs::read(&weights).unwrap();
    b.truncate(b.len() / 2);
    std::fs::write(&weights, &b).unwrap();
    let o = sluice(&args, cache.path());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("built-in draft is damaged (model.safetensors fails its SHA-256"),
        "{err}"
    );
    let again = json_out(&o);
    assert_eq!(again["generated_ids"], good["generated_ids"], "{err}");
    // The policy's second decode pass always runs at full width: the fresh copy drafted.
    assert!(again["stats"]["drafted"].as_u64().unwrap() > 0, "{}", again["stats"]);
}

#[test]
fn bad_input_is_a_clear_error() {
    let cache = tempfile::tempdir().unwrap();
    let fx = k3_fixture("tiny-a");
    let cases: [(&[&str], &str); 5] = [
        (&["run", "--model", &fx, "--prompt-ids", "1,99999"], "out of vocabulary"),
        (&["run", "--model", &fx, "--prompt", ""], "empty prompt"),
        (&["run", "--model", "/nonexistent/model", "--prompt", "x"], "/nonexistent/model"),
        (&["run", "--model", &fx], "--prompt"),
        (&["inspect", "/nonexistent/model"], "/nonexistent/model"),
    ];
    for (args, needle) in cases {
        let o = sluice(args, cache.path());
        assert!(!o.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    }
}

/// A `sluice run` child with piped stdout and stderr, each read line by line on its own thread
/// into a channel, so a test can wait for an event (a first byte, a log line) and then signal it.
struct Running {
    child: std::process::Child,
    stdout: std::sync::mpsc::Receiver<Vec<u8>>,
    stderr: std::sync::mpsc::Receiver<String>,
    err_log: String,
}

/// How long a test waits for an event before failing: far above what any event here takes, so
/// it only ends a test that would otherwise hang (on a build where the event never comes).
const EVENT_DEADLINE: std::time::Duration = std::time::Duration::from_secs(120);

impl Running {
    fn start(args: &[&str], cache: &std::path::Path) -> Self {
        use std::io::{BufRead, Read};
        use std::process::Stdio;
        let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(args)
            .env("SLUICE_CACHE", cache)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn sluice");
        let (out_tx, stdout) = std::sync::mpsc::channel();
        let mut out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = out.read(&mut buf) {
                if n == 0 || out_tx.send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        let (err_tx, stderr) = std::sync::mpsc::channel();
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
                if err_tx.send(line).is_err() {
                    break;
                }
            }
        });
        Running { child, stdout, stderr, err_log: String::new() }
    }

    /// Waits for the first stdout bytes.
    fn first_output(&mut self) -> Vec<u8> {
        match self.stdout.recv_timeout(EVENT_DEADLINE) {
            Ok(b) => b,
            Err(_) => {
                let _ = self.child.kill();
                panic!("nothing was streamed to stdout; stderr: {}", self.drain_stderr());
            }
        }
    }

    /// Waits for a stderr line containing `needle`.
    fn stderr_line(&mut self, needle: &str) {
        loop {
            match self.stderr.recv_timeout(EVENT_DEADLINE) {
                Ok(line) => {
                    let hit = line.contains(needle);
                    self.err_log.push_str(&line);
                    self.err_log.push('\n');
                    if hit {
                        return;
                    }
                }
                Err(_) => {
                    let _ = self.child.kill();
                    panic!("no stderr line with {needle:?}: {}", self.err_log);
                }
            }
        }
    }

    fn signal(&self, sig: i32) {
        let pid = i32::try_from(self.child.id()).unwrap();
        // SAFETY: `kill` takes any pid and signal number; the pid is our own live child.
        let rc = unsafe { libc::kill(pid, sig) };
        assert_eq!(rc, 0, "kill failed");
    }

    fn drain_stderr(&mut self) -> String {
        while let Ok(line) = self.stderr.recv_timeout(std::time::Duration::from_secs(30)) {
            self.err_log.push_str(&line);
            self.err_log.push('\n');
        }
        self.err_log.clone()
    }

    /// Waits for the exit; the status, all of stdout after `first` and all of stderr.
    fn finish(mut self, first: Vec<u8>) -> (std::process::ExitStatus, Vec<u8>, String) {
        let status = self.child.wait().unwrap();
        let mut out = first;
        while let Ok(b) = self.stdout.recv() {
            out.extend_from_slice(&b);
        }
        let err = self.drain_stderr();
        (status, out, err)
    }
}

#[test]
fn run_output_was_lost_on_sigint() {
    // Greedy on tiny-a never emits the stop token: 100000 tokens would run for minutes, so
    // the output can only come from streaming, and the run only ends early by the signal.
    let cache = tempfile::tempdir().unwrap();
    let fx = k3_fixture("tiny-a");
    let args =
        ["run", "--model", &fx, "--prompt", "Hello", "--max-new", "100000", "--context", "100010"];
    let mut r = Running::start(&[&args[..], &["--stats"]].concat(), cache.path());
    let first = r.first_output();
    r.signal(libc::SIGINT);
    let (status, out, err) = r.finish(first);
    assert_eq!(status.code(), Some(130), "the conventional status after SIGINT: {err}");
    let text = String::from_utf8(out).expect("streamed text is UTF-8 (characters never split)");
    assert!(text.len() > 1 && text.ends_with('\n'), "{text:?}");
    assert!(err.contains("finish interrupted"), "the stats line is printed: {err}");
    assert!(err.contains("stopped by SIGINT"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn run_json_was_lost_on_sigterm() {
    let cache = tempfile::tempdir().unwrap();
    let fx = k3_fixture("tiny-a");
    let logits = cache.path().join("logits.npy");
    let mut r = Running::start(
        &[
            "run",
            "--model",
            &fx,
            "--prompt-ids",
            "60,7",
            "--max-new",
            "100000",
            "--context",
            "100010",
            "--json",
            "--dump-logits",
            logits.to_str().unwrap(),
        ],
        cache.path(),
    );
    r.stderr_line("sluice: generating");
    r.signal(libc::SIGTERM);
    let (status, out, err) = r.finish(Vec::new());
    assert_eq!(status.code(), Some(143), "the conventional status after SIGTERM: {err}");
    let v: serde_json::Value = serde_json::from_slice(&out).expect("one JSON object on stdout");
    assert_eq!(v["finish_reason"], "interrupted", "{v}");
    assert_eq!(v["stats"]["finish_reason"], "interrupted");
    let n = v["generated_ids"].as_array().unwrap().len();
    assert!(n < 100_000, "stopped early: {n}");
    // The logits of exactly the generated steps were written.
    let b = std::fs::read(&logits).unwrap();
    let hlen = u16::from_le_bytes([b[8], b[9]]) as usize;
    assert_eq!(b.len(), 10 + hlen + n * 712 * 4, "{n} steps of logits");
}

#[test]
fn streamed_text_equals_the_json_text() {
    // The random demo model's weights emit byte tokens that split characters: the streamed
    // bytes must still equal the text decoded from all ids at once.
    let cache = tempfile::tempdir().unwrap();
    let demo = cache.path().join("demo");
    let d = demo.to_str().unwrap();
    let o = sluice(&["synth", "--preset", "demo", "--out", d], cache.path());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let args = ["run", "--model", d, "--prompt", "Hello, sluice", "--max-new", "64"];
    let v = json_out(&sluice(&[&args[..], &["--json"]].concat(), cache.path()));
    let o = sluice(&args, cache.path());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = v["text"].as_str().unwrap();
    assert_eq!(String::from_utf8(o.stdout).unwrap(), format!("{text}\n"));
}

/// Whether a run got as far as loading the model (the plan line comes right after the load).
fn loaded(stderr: &str) -> bool {
    stderr.contains("memory plan") || stderr.contains("experts mapped")
}

#[test]
fn run_ignored_its_context() {
    let cache = tempfile::tempdir().unwrap();
    let fx = k3_fixture("tiny-a");
    let o = sluice(
        &["run", "--model", &fx, "--prompt-ids", "1,2,3", "--max-new", "10", "--context", "8"],
        cache.path(),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "3 + 10 tokens do not fit a context of 8: {err}");
    assert!(err.contains("13 tokens") && err.contains("context of 8"), "{err}");
    assert!(!loaded(&err), "refused before loading: {err}");
    assert!(err.contains("pass --context 13 or more"), "says how to fit: {err}");
    // Without --context the context is planned for the run, up to the checkpoint's limit.
    let o =
        sluice(&["run", "--model", &fx, "--prompt-ids", "1", "--max-new", "1048576"], cache.path());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("allows at most 1048576"), "{err}");
    assert!(!loaded(&err), "{err}");
    let o = sluice(&["run", "--model", &fx, "--prompt-ids", "1", "--context", "0"], cache.path());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("--context") && !loaded(&err), "{err}");
}

#[test]
fn argument_errors_were_reported_after_loading() {
    let cache = tempfile::tempdir().unwrap();
    let fx = k3_fixture("tiny-a");
    let base = ["run", "--model", fx.as_str()];
    let cases: &[(&[&str], &str)] = &[
        (&["--prompt-ids", "1,99999"], "out of vocabulary"),
        (&["--prompt", ""], "empty prompt"),
        (&["--prompt", "hi", "--chat", "--prompt-ids", "1"], "cannot be used with"),
        (&["--prompt-ids", "1", "--chat"], "cannot be used with"),
        (&["--prompt-ids", "1", "--dump-logits", "/nonexistent-dir/l.npy"], "--dump-logits"),
        (&["--prompt-ids", "1", "--max-new", "-1"], "cannot be negative"),
        (&["--prompt-ids", "1,-2"], "cannot be negative"),
        (&["--prompt-ids", "1", "--readers", "-3"], "cannot be negative"),
        (&["--prompt-ids", "1", "--memory", "-1G"], "cannot be negative"),
        (&["--prompt-ids", "1", "--prefetch-min-precision", "-0.5"], "between 0 and 1"),
        (&["--prompt-ids", "1", "--experts", "bogus"], "possible values"),
        (&["--prompt-ids", "1", "--draft", "/nonexistent-draft"], "draft model directory"),
    ];
    for (args, needle) in cases {
        let o = sluice(&[&base[..], args].concat(), cache.path());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} should fail");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!loaded(&err), "{args:?} was reported only after loading: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    // serve checks its numbers the same way.
    let o = sluice(&["serve", "--model", &fx, "--max-tokens", "-1"], cache.path());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("cannot be negative"), "{err}");
    // A budget above what the machine has is the user's call, but said before loading.
    let o = sluice(&[&base[..], &["--prompt-ids", "1", "--memory", "100T"]].concat(), cache.path());
    let err = String::from_utf8_lossy(&o.stderr);
    let warn =
        err.find("more than this machine has").unwrap_or_else(|| panic!("no warning: {err}"));
    assert!(err[..warn].lines().all(|l| !loaded(l)), "warned before loading: {err}");
}

#[test]
fn run_kept_generating_after_its_reader_left() {
    // `sluice run … | head -c 10`: once the reader is gone, generation stops at once and the run
    // ends quietly (100000 tokens would otherwise run for minutes).
    let cache = tempfile::tempdir().unwrap();
    let fx = k3_fixture("tiny-a");
    let args =
        ["run", "--model", &fx, "--prompt", "Hello", "--max-new", "100000", "--context", "100010"];
    let mut r = Running::start(&[&args[..], &["--stats"]].concat(), cache.path());
    r.first_output();
    // Hang up: dropping the receiver ends the reader thread, which closes the pipe.
    drop(std::mem::replace(&mut r.stdout, std::sync::mpsc::channel().1));
    let (status, _, err) = r.finish(Vec::new());
    assert!(status.success(), "a closed stdout ends the run quietly: {err}");
    assert!(err.contains("finish cancelled") && !err.contains("panicked"), "{err}");
}

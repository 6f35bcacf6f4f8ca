//! Stream install vs full install, served by the test hub on 127.0.0.1.
//!
//! ```text
//! cargo run --release -p sluice-engine --example stream_bench -- MODEL_DIR RUNS WORKDIR
//! ```
//!
//! Serves `MODEL_DIR` (a checkpoint, e.g. from `sluice synth`) from memory, pulls it once in
//! full and, for every run, afresh in stream mode, then times in one process, interleaved per
//! run: the full install (experts streamed from local disk with O_DIRECT, so the page cache
//! does not help it), the stream install with a cold expert cache (every expert fetched from
//! the hub), and the same stream install warm (every expert local). Each measures load +
//! prefill + 1 token ("first token") and load + 8 tokens, greedy, and checks the tokens equal
//! the full install's. Prints the medians.

use sluice_engine::load::{self, ExpertMode, LoadOptions};
use sluice_engine::{generate, GenerateOptions};
use sluice_hub::testhub::{HubRepo, TestHub};
use sluice_hub::{
    HubClient, HubConfig, ModeRequest, NoProgress, PlanOptions, PullOptions, StatvfsFreeSpace,
};
use std::path::{Path, PathBuf};
use std::time::Instant;

const PROMPT: [u32; 8] = [1, 2, 3, 4, 5, 6, 7, 8];

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn pull(hub: &TestHub, dir: &Path, mode: ModeRequest) -> Res<()> {
    let client = HubClient::new(HubConfig::new(hub.endpoint()))?;
    let info = client.resolve("bench/model", "main")?;
    let opts = PlanOptions {
        mode,
        dir: Some(dir.to_path_buf()),
        reuse_cache: None,
        routed: sluice_engine::install::routed_tensors_remote(&client, &info)?,
        ..PlanOptions::default()
    };
    let plan = client.plan(&info, &opts, &StatvfsFreeSpace)?;
    client.pull(&plan, &PullOptions::default(), &NoProgress)?;
    Ok(())
}

/// Seconds for load + generation of `max_new` tokens, and the tokens.
fn time_run(dir: &Path, max_new: usize) -> Res<(f64, Vec<u32>)> {
    let opts = LoadOptions {
        experts: ExpertMode::Stream,
        memory: Some(6 << 30),
        ..LoadOptions::default()
    };
    let t0 = Instant::now();
    let loaded = load::open(dir, &opts)?;
    let mut state = loaded.model.new_state();
    let g = GenerateOptions { max_new, ..GenerateOptions::default() };
    let out = generate(&loaded.model, &mut state, &PROMPT, &g, None, None)?;
    Ok((t0.elapsed().as_secs_f64(), out.tokens))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, model, runs, work] = args.as_slice() else {
        return Err("usage: stream_bench MODEL_DIR RUNS WORKDIR".into());
    };
    let runs: usize = runs.parse()?;
    let work = PathBuf::from(work);
    let hub = TestHub::start(vec![HubRepo::from_dir("bench/model", Path::new(model))?])?;
    let full = work.join("full");
    pull(&hub, &full, ModeRequest::Full)?;
    let (_, reference) = time_run(&full, 8)?;
    let same = |toks: &[u32], n: usize| -> Res<()> {
        if toks == &reference[..n] {
            Ok(())
        } else {
            Err(format!("tokens {toks:?} differ from the full install's {reference:?}").into())
        }
    };
    let mut t: [Vec<f64>; 6] = Default::default();
    for r in 0..runs {
        let stream = work.join(format!("stream{r}"));
        pull(&hub, &stream, ModeRequest::Stream)?;
        let (a, toks) = time_run(&full, 1)?;
        same(&toks, 1)?;
        let (b, toks) = time_run(&full, 8)?;
        same(&toks, 8)?;
        hub.reset_stats();
        let (c, toks) = time_run(&stream, 1)?;
        same(&toks, 1)?;
        let cold_bytes = hub.stats().content_bytes;
        let (d, toks) = time_run(&stream, 8)?;
        same(&toks, 8)?;
        hub.reset_stats();
        let (e, toks) = time_run(&stream, 1)?;
        same(&toks, 1)?;
        let (f, toks) = time_run(&stream, 8)?;
        same(&toks, 8)?;
        if hub.stats().content_requests != 0 {
            return Err("a warm run fetched from the hub".into());
        }
        eprintln!(
            "run {r}: full first {a:.3}s / 8 tok {b:.3}s; stream cold first {c:.3}s \
             ({cold_bytes} bytes fetched), then 8 tok {d:.3}s; warm first {e:.3}s / 8 tok {f:.3}s"
        );
        for (v, x) in t.iter_mut().zip([a, b, c, d, e, f]) {
            v.push(x);
        }
        std::fs::remove_dir_all(&stream)?;
    }
    let m: Vec<f64> = t.into_iter().map(median).collect();
    println!("medians of {runs} runs (seconds, load included):");
    println!("full install:        first token {:.3}, 8 tokens {:.3}", m[0], m[1]);
    println!("stream, cold cache:  first token {:.3} ({:.2}x full)", m[2], m[2] / m[0]);
    println!("stream, after cold:  8 tokens {:.3} ({:.2}x full)", m[3], m[3] / m[1]);
    println!(
        "stream, warm cache:  first token {:.3} ({:.2}x full), 8 tokens {:.3} ({:.2}x full)",
        m[4],
        m[4] / m[0],
        m[5],
        m[5] / m[1]
    );
    Ok(())
}

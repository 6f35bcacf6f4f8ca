//! Speculation at controlled acceptance: drafts replay the target's own greedy output (from a
//! plain run) with each position corrupted with probability `1 − accept`, so the per-draft
//! acceptance is known whatever the model's weights. Runs one configuration per process (fresh
//! expert cache) and prints one JSON line: the configuration, whether the tokens equal the
//! oracle, and the run statistics.
//!
//! ```text
//! sluice run --model DIR --prompt-ids 1,2,3 --max-new 16 --json > plain.json
//! cargo run --release -p sluice-engine --example spec_policy -- \
//!     DIR plain.json ACCEPT WIDTH policy|fixed [MEMORY_BYTES]
//! ```

use sluice_engine::load::{self, LoadOptions};
use sluice_engine::{generate, GenerateOptions, ScriptDrafter};
use std::path::PathBuf;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn ids(v: &serde_json::Value) -> Res<Vec<u32>> {
    let arr = v.as_array().ok_or("expected an array of ids")?;
    arr.iter()
        .map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| "bad id".into()))
        .collect()
}

/// A deterministic uniform draw in [0, 1) for position `i` (splitmix64).
fn draw(seed: u64, i: u64) -> f64 {
    let mut z = seed.wrapping_add(i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    #[allow(clippy::cast_precision_loss)]
    let u = (z >> 11) as f64 / (1u64 << 53) as f64;
    u
}

fn main() -> Res<()> {
    let a: Vec<String> = std::env::args().skip(1).collect();
    if a.len() < 5 {
        return Err("usage: spec_policy DIR PLAIN_JSON ACCEPT WIDTH policy|fixed [MEMORY]".into());
    }
    let dir = PathBuf::from(&a[0]);
    let plain: serde_json::Value = serde_json::from_slice(&std::fs::read(&a[1])?)?;
    let accept: f64 = a[2].parse()?;
    let width: usize = a[3].parse()?;
    let fixed = match a[4].as_str() {
        "fixed" => true,
        "policy" => false,
        other => return Err(format!("{other:?}: expected policy or fixed").into()),
    };
    let memory = a.get(5).map(|m| m.parse::<u64>()).transpose()?;
    let prompt = ids(&plain["prompt_ids"])?;
    let oracle = ids(&plain["generated_ids"])?;
    let loaded = load::open(&dir, &LoadOptions { memory, ..LoadOptions::default() })?;
    let vocab = u32::try_from(loaded.model.vocab_size())?;
    // Position i of the script proposes the token after oracle[i]; a corrupted position proposes
    // a token the target will not choose.
    let script: Vec<u32> = oracle[1..]
        .iter()
        .enumerate()
        .map(|(i, &t)| if draw(7, i as u64) < accept { t } else { (t + 1) % vocab })
        .collect();
    let mut d = ScriptDrafter { base: prompt.len() + 1, script };
    let opts = GenerateOptions {
        max_new: oracle.len(),
        draft_max: width,
        fixed_width: fixed,
        ..GenerateOptions::default()
    };
    let mut state = loaded.model.new_state();
    let d_opt: Option<&mut dyn sluice_engine::Drafter> = (width > 0).then_some(&mut d as _);
    let out = generate(&loaded.model, &mut state, &prompt, &opts, d_opt, None)?;
    let v = serde_json::json!({
        "accept": accept,
        "width": width,
        "mode": a[4],
        "exact": out.tokens == oracle,
        "stats": out.stats,
    });
    println!("{v}");
    Ok(())
}

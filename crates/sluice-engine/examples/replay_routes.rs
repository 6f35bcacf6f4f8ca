//! Replays route traces (`sluice run --trace-routes FILE`) through the store's cache-policy
//! simulation, and scores simple expert predictors on them (docs/PERFORMANCE.md, "Trained
//! routing").
//!
//! ```text
//! cargo run --release -p sluice-engine --example replay_routes -- [--per-row] TRACE...
//! ```
//!
//! For each trace and each cache size (4, 8, 16 and 32% of all routed experts, K3's 64 GB :
//! 1.45 TB being about 4%), the hit rate of LRU and of S3-FIFO over the whole run and over its
//! decode passes alone (the cache warmed by the prefill), and per MoE layer; then per layer the
//! precision of two predictors a prefetcher could use without the model: the previous
//! position's experts in the same layer, and the experts that most often followed this
//! position's experts of the layer before (counts learnt online from earlier positions). Each
//! request is a pass's union per layer, as the store sees it; `--per-row` replays one row at a
//! time instead. Prints one JSON object per trace.

use serde_json::json;
use sluice_engine::route_trace::{self, TracePass};
use sluice_store::policy::{simulate_each, PolicyKind};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

const FRACTIONS: [f64; 4] = [0.04, 0.08, 0.16, 0.32];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let per_row = args.iter().any(|a| a == "--per-row");
    let files: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    if files.is_empty() {
        return Err("usage: replay_routes [--per-row] TRACE...".into());
    }
    for f in files {
        let (header, passes) = route_trace::read(Path::new(f))?;
        let layers: Vec<usize> =
            passes.first().map(|p| p.layers.iter().map(|l| l.layer).collect()).unwrap_or_default();
        let per_layer = if header.experts_per_layer > 0 {
            header.experts_per_layer
        } else {
            passes
                .iter()
                .flat_map(|p| p.layers.iter().flat_map(|l| l.ids.iter().flatten()))
                .map(|&e| e as usize + 1)
                .max()
                .unwrap_or(1)
        };
        let total = per_layer * layers.len();
        let mut sizes = Vec::new();
        for frac in FRACTIONS {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let slots = ((total as f64 * frac).round() as usize).max(1);
            let mut row = json!({ "fraction": frac, "slots": slots });
            for (name, kind) in [("lru", PolicyKind::Lru), ("s3fifo", PolicyKind::S3Fifo)] {
                row[name] = replay(&passes, per_row, kind, slots);
            }
            sizes.push(row);
        }
        let v = json!({
            "trace": f,
            "passes": passes.len(),
            "prefill_passes": passes.iter().filter(|p| p.phase == "prefill").count(),
            "decode_rows": passes.iter().filter(|p| p.phase == "decode").map(|p| p.rows).sum::<usize>(),
            "moe_layers": layers,
            "experts_per_layer": per_layer,
            "experts": total,
            "per_row": per_row,
            "caches": sizes,
            "predictors": predictors(&passes),
        });
        println!("{v}");
    }
    Ok(())
}

/// Hit rates of one policy at one size: whole run, prefill and decode passes apart, per layer
/// (whole run). With `--per-row` the prefill's rows are replayed one at a time, which is how a
/// cache would see the prompt's real text decoded position by position.
fn replay(
    passes: &[TracePass],
    per_row: bool,
    kind: PolicyKind,
    slots: usize,
) -> serde_json::Value {
    let mut keys = Vec::new();
    let mut decode = Vec::new();
    for p in passes {
        let k = route_trace::store_keys(std::slice::from_ref(p), per_row);
        decode.extend(std::iter::repeat_n(p.phase == "decode", k.len()));
        keys.extend(k);
    }
    let mut by_layer: BTreeMap<u64, [u64; 2]> = BTreeMap::new();
    // [prefill, decode] × [misses, hits].
    let mut phase = [[0u64; 2]; 2];
    let mut i = 0usize;
    let all = simulate_each(kind, slots, keys.iter().copied(), |k, hit| {
        let e = by_layer.entry(k >> 32).or_default();
        e[usize::from(hit)] += 1;
        phase[usize::from(decode[i])][usize::from(hit)] += 1;
        i += 1;
    });
    let rate = |c: [u64; 2]| {
        let n = c[0] + c[1];
        #[allow(clippy::cast_precision_loss)]
        if n == 0 {
            None
        } else {
            Some(c[1] as f64 / n as f64)
        }
    };
    json!({
        "hit_rate": all.hit_rate(),
        "prefill_hit_rate": rate(phase[0]),
        "decode_hit_rate": rate(phase[1]),
        "per_layer": by_layer.iter().map(|(l, c)| json!({"layer": l, "hit_rate": rate(*c)})).collect::<Vec<_>>(),
    })
}

/// Per-layer precision of two model-free predictors over the committed rows, in order.
fn predictors(passes: &[TracePass]) -> serde_json::Value {
    // The committed rows' routes in position order: rows[pos][layer index] = ids.
    let mut rows: Vec<Vec<Vec<u32>>> = Vec::new();
    for p in passes {
        for r in 0..p.committed.min(p.rows) {
            rows.push(p.layers.iter().map(|l| l.ids[r].clone()).collect());
        }
    }
    let Some(first) = rows.first() else { return json!([]) };
    let layers: Vec<usize> = passes[0].layers.iter().map(|l| l.layer).collect();
    let mut out = Vec::new();
    for li in 0..first.len() {
        let (mut prev_hit, mut prev_n) = (0usize, 0usize);
        let (mut co_hit, mut co_n) = (0usize, 0usize);
        let mut follow: HashMap<u32, HashMap<u32, u32>> = HashMap::new();
        for pos in 0..rows.len() {
            let cur: HashSet<u32> = rows[pos][li].iter().copied().collect();
            let k = cur.len();
            if pos > 0 {
                prev_hit += rows[pos - 1][li].iter().filter(|e| cur.contains(e)).count();
                prev_n += k;
            }
            if li > 0 {
                // Guess from this position's experts of the layer before, with counts so far.
                let mut score: HashMap<u32, u32> = HashMap::new();
                for a in &rows[pos][li - 1] {
                    for (&b, &c) in follow.get(a).into_iter().flatten() {
                        *score.entry(b).or_default() += c;
                    }
                }
                if !score.is_empty() {
                    let mut ranked: Vec<(u32, u32)> = score.into_iter().collect();
                    ranked.sort_by(|x, y| y.1.cmp(&x.1).then(x.0.cmp(&y.0)));
                    co_hit += ranked.iter().take(k).filter(|(e, _)| cur.contains(e)).count();
                    co_n += k;
                }
                for a in &rows[pos][li - 1] {
                    for &b in &rows[pos][li] {
                        *follow.entry(*a).or_default().entry(b).or_default() += 1;
                    }
                }
            }
        }
        #[allow(clippy::cast_precision_loss)]
        let p = |h: usize, n: usize| (n > 0).then(|| h as f64 / n as f64);
        out.push(json!({
            "layer": layers[li],
            "previous_position": p(prev_hit, prev_n),
            "layer_before_cooccurrence": p(co_hit, co_n),
        }));
    }
    json!(out)
}

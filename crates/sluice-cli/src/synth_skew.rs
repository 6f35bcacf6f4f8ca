//! `sluice synth --route-skew`: a **benchmark knob**, not a model property. A synthetic K3
//! slice's routers are random, so every expert is about as likely as any other and an expert
//! cache or a warm hot set can gain nothing; a trained model's routing is skewed. This option
//! rewrites each MoE layer's `e_score_correction_bias` (which K3 adds to the router scores for
//! the choice only, not for the weights) so that expert popularity follows the curve measured on
//! the built-in mini-K3 ([`MINI_K3_POPULARITY`]), with a different expert order per layer.
//!
//! The biases are fitted, not guessed: with the synthetic router's scores modelled as
//! σ(z), z ~ N(0, 1) independent per expert (an RMS-normed input of unit scale times gate rows
//! drawn uniform in ±√(3/d) gives unit-variance logits), a fixed sample of score rows is
//! routed top-k with the current biases and each rank's bias moves by the log ratio of its
//! target share to the share it got, until they agree. The shares a real run then gets are
//! whatever the model's hidden states give: measure them with `sluice run --trace-routes`.

use anyhow::{bail, Context, Result};
use sluice_models::kimi_k3::synth::SplitMix;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Share of all routed choices taken by the most used, second most used, … expert of a layer
/// of the built-in mini-K3 (64 experts, top-4): the mean over its 7 MoE layers of the prose,
/// code and tools workloads' route traces (128 new tokens each; `sluice bench --workload W
/// --trace-routes`, December 2026). The top quarter of experts takes 53% of the choices.
pub const MINI_K3_POPULARITY: [f64; 64] = [
    0.06120, 0.05104, 0.04442, 0.04109, 0.03770, 0.03506, 0.03253, 0.03078, 0.02913, 0.02784,
    0.02641, 0.02539, 0.02347, 0.02302, 0.02223, 0.02163, 0.02085, 0.01972, 0.01884, 0.01836,
    0.01764, 0.01704, 0.01639, 0.01599, 0.01542, 0.01482, 0.01431, 0.01386, 0.01333, 0.01289,
    0.01256, 0.01203, 0.01167, 0.01133, 0.01105, 0.01072, 0.01029, 0.00989, 0.00947, 0.00915,
    0.00885, 0.00862, 0.00827, 0.00796, 0.00758, 0.00727, 0.00711, 0.00682, 0.00639, 0.00594,
    0.00566, 0.00542, 0.00522, 0.00490, 0.00465, 0.00440, 0.00411, 0.00387, 0.00351, 0.00335,
    0.00300, 0.00266, 0.00222, 0.00165,
];

/// Score rows the fit routes (fixed across iterations, so the fit is deterministic).
const ROWS: usize = 4000;
/// Fit iterations.
const ITERS: usize = 150;
/// Step of the bias update per unit of log share error.
const STEP: f64 = 0.06;

/// The mini-K3 curve resampled to `experts` ranks (linear in rank fraction), summing to 1.
pub fn target_shares(experts: usize) -> Vec<f64> {
    let n = MINI_K3_POPULARITY.len();
    #[allow(clippy::cast_precision_loss)]
    let v: Vec<f64> = (0..experts)
        .map(|r| {
            let x = ((r as f64 + 0.5) / experts as f64 * n as f64 - 0.5).clamp(0.0, (n - 1) as f64);
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let i = (x.floor() as usize).min(n - 2);
            let f = x - i as f64;
            MINI_K3_POPULARITY[i] * (1.0 - f) + MINI_K3_POPULARITY[i + 1] * f
        })
        .collect();
    let s: f64 = v.iter().sum();
    v.into_iter().map(|x| x / s).collect()
}

/// A standard normal draw (Box–Muller).
fn normal(rng: &mut SplitMix) -> f64 {
    let u1 = (f64::from(rng.uniform()) + 1.0) / 2.0;
    let u2 = f64::from(rng.uniform());
    (-2.0 * (u1.max(1e-12)).ln()).sqrt() * (std::f64::consts::PI * u2).cos()
}

/// Biases per popularity rank for `experts` experts chosen `top_k` at a time; returns them
/// and the shares they give on the fit's sample.
pub fn fit_bias(experts: usize, top_k: usize, seed: u64) -> (Vec<f64>, Vec<f64>) {
    let target = target_shares(experts);
    let mut rng = SplitMix::new(seed ^ 0x5ce3_d0c0_ffee);
    let scores: Vec<f64> =
        (0..ROWS * experts).map(|_| 1.0 / (1.0 + (-normal(&mut rng)).exp())).collect();
    let mut bias = vec![0.0f64; experts];
    let mut got = vec![0.0f64; experts];
    let mut order: Vec<usize> = (0..experts).collect();
    for _ in 0..ITERS {
        let mut count = vec![0u64; experts];
        for row in scores.chunks_exact(experts) {
            let key = |e: &usize| -(row[*e] + bias[*e]);
            order.select_nth_unstable_by(top_k - 1, |a, b| key(a).total_cmp(&key(b)));
            for &e in &order[..top_k] {
                count[e] += 1;
            }
        }
        #[allow(clippy::cast_precision_loss)]
        let total = (ROWS * top_k) as f64;
        for e in 0..experts {
            #[allow(clippy::cast_precision_loss)]
            let share = count[e] as f64 / total;
            got[e] = share;
            bias[e] += STEP * (target[e].ln() - share.max(1e-6).ln());
        }
        #[allow(clippy::cast_precision_loss)]
        let mean = bias.iter().sum::<f64>() / experts as f64;
        bias.iter_mut().for_each(|b| *b -= mean);
    }
    (bias, got)
}

/// Rewrites the `e_score_correction_bias` of every MoE layer of the K3 checkpoint in `dir`
/// (written by synth just before) with the fitted biases, each layer's experts in its own
/// seeded order. Returns the top-quarter share the fit reached.
pub fn apply(dir: &Path, experts: usize, top_k: usize, seed: u64) -> Result<f64> {
    let (bias, got) = fit_bias(experts, top_k, seed);
    let index: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.join("model.safetensors.index.json")).context("reading the index")?,
    )
    .context("parsing the index")?;
    let map = index["weight_map"].as_object().context("the index has no weight_map")?;
    let mut layers = 0u64;
    for (name, file) in map {
        if !name.ends_with(".gate.e_score_correction_bias") {
            continue;
        }
        let file = dir.join(file.as_str().context("a weight_map entry is not a file name")?);
        let mut rng = SplitMix::new(seed ^ 0xb1a5 ^ layers.wrapping_mul(0x9e37));
        // Fisher–Yates: which expert of this layer gets which popularity rank.
        let mut who: Vec<usize> = (0..experts).collect();
        for i in (1..experts).rev() {
            #[allow(clippy::cast_possible_truncation)]
            let j = (rng.next_u64() % (i as u64 + 1)) as usize;
            who.swap(i, j);
        }
        let mut values = vec![0f32; experts];
        for (rank, &e) in who.iter().enumerate() {
            #[allow(clippy::cast_possible_truncation)]
            let b = bias[rank] as f32;
            values[e] = b;
        }
        overwrite_f32(&file, name, &values)?;
        layers += 1;
    }
    if layers == 0 {
        bail!("no router bias (e_score_correction_bias) found in {}", dir.display());
    }
    Ok(got[..experts / 4].iter().sum())
}

/// Overwrites tensor `name` (F32, `values.len()` elements) in the safetensors file `path`,
/// in place, and fsyncs it.
fn overwrite_f32(path: &Path, name: &str, values: &[f32]) -> Result<()> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    let mut len = [0u8; 8];
    f.read_exact_at(&mut len, 0)?;
    let n = usize::try_from(u64::from_le_bytes(len)).context("header length")?;
    let mut header = vec![0u8; n];
    f.read_exact_at(&mut header, 8)?;
    let h: serde_json::Value = serde_json::from_slice(&header).context("safetensors header")?;
    let t = &h[name];
    let (Some(start), Some(end)) = (t["data_offsets"][0].as_u64(), t["data_offsets"][1].as_u64())
    else {
        bail!("{name} is not in {}", path.display());
    };
    if t["dtype"] != "F32" || end - start != 4 * values.len() as u64 {
        bail!("{name} in {} is not {} f32 values", path.display(), values.len());
    }
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    f.write_all_at(&bytes, 8 + n as u64 + start)?;
    f.sync_all()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fitted_biases_give_the_mini_k3_popularity() {
        for (experts, top_k) in [(64, 16), (128, 16), (64, 4)] {
            let target = target_shares(experts);
            assert!((target.iter().sum::<f64>() - 1.0).abs() < 1e-9);
            let (bias, got) = fit_bias(experts, top_k, 7);
            let quarter = |v: &[f64]| v[..experts / 4].iter().sum::<f64>();
            assert!(
                (quarter(&got) - quarter(&target)).abs() < 0.02,
                "{experts}/{top_k}: top quarter {} vs {}",
                quarter(&got),
                quarter(&target)
            );
            assert!(bias[0] > bias[experts - 1], "the most popular rank has the largest bias");
        }
    }
}

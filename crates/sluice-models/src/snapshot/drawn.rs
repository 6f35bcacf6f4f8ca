//! States of drawn values, for benchmarks of what a prompt state costs to store and restore
//! (`sluice bench --snapshot-io`) at sizes too large to compute here: never for generation. They
//! live behind the family boundary so that the benchmark never names a family.

use crate::kimi_k3::config::K3Config;
use crate::kimi_k3::state::{K3State, LayerState};
use crate::kimi_k3::synth::{K3Dims, SplitMix};
use crate::qwen3::state::{KvCache, Qwen3State};
use crate::state::State;
use crate::ModelError;

/// Kimi K3's published vocabulary.
const K3_VOCAB: usize = 163_840;
/// Kimi K3's decoder layers; [`K3Dims::k3_slice`] makes every fourth and the last MLA, which
/// gives the published 69 KDA and 24 MLA layers.
const K3_LAYERS: usize = 93;

/// `n` values drawn from `rng`.
fn draw(rng: &mut SplitMix, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.uniform()).collect()
}

/// A Kimi K3 state with `positions` drawn positions, in place of `s` (same layer shapes).
pub(super) fn fill_k3(s: &mut K3State, positions: usize, seed: u64) {
    let mut rng = SplitMix::new(seed);
    let mut layers = std::mem::take(&mut s.layers);
    for l in &mut layers {
        match l {
            LayerState::Kda(k) => {
                k.committed.s = draw(&mut rng, k.committed.s.len());
                k.committed.conv = draw(&mut rng, k.committed.conv.len());
                k.work.clone_from(&k.committed);
                k.rows.clear();
            }
            LayerState::Mla(m) => {
                m.lat = draw(&mut rng, positions * m.lat_dim).into();
                m.pe = draw(&mut rng, positions * m.pe_dim).into();
            }
        }
    }
    *s = K3State::restored(layers, positions);
}

/// A Qwen3-style state with `positions` drawn positions, in place of `s` (same widths).
pub(super) fn fill_kv(s: &mut Qwen3State, positions: usize, seed: u64) {
    let mut rng = SplitMix::new(seed);
    let mut layers = std::mem::take(&mut s.layers);
    for l in &mut layers {
        let (k, v) = (draw(&mut rng, positions * l.width), draw(&mut rng, positions * l.width));
        *l = KvCache::new(l.width);
        l.push(&k, &v);
    }
    *s = Qwen3State::restored(layers, positions);
}

/// The state `sluice bench --snapshot-io` measures without a model, and its model's
/// vocabulary (the logits row a prompt-end state keeps): Kimi K3's at its published
/// dimensions (93 layers: 69 KDA with 96 heads of 128 and a conv window of 3 × 3 × 12,288,
/// 24 MLA with a 512 + 64 latent per position), the largest state of the families sluice
/// runs, with `positions` drawn positions.
pub fn reference_state(positions: usize, seed: u64) -> Result<(State, usize), ModelError> {
    let text = K3Dims::k3_slice(K3_LAYERS, 896, K3_VOCAB).text_config();
    let cfg = K3Config::from_json(&text)?;
    Ok((State::new("kimi_k3", K3State::synthetic(&cfg, positions, seed)), K3_VOCAB))
}

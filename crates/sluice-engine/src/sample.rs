//! Choosing a token from logits: greedy, or seeded sampling with temperature, top-k and top-p.
//!
//! Sampling draws the uniform number for generated position `i` from a stream seeded by
//! `(seed, i)`, not from one running stream. A token therefore depends only on its logits and
//! its position, so speculative verification (which compares each draft with the token the
//! target would choose at that position) gives exactly the output of plain sampling.

use serde::{Deserialize, Serialize};

/// How to pick tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Sampling {
    /// 0 means greedy (argmax).
    pub temperature: f32,
    /// Keep only the k most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches p (1.0 = all).
    pub top_p: f32,
    /// Seed; the same seed and prompt give the same output.
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Self {
        Self { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0 }
    }
}

impl Sampling {
    /// Greedy decoding.
    pub fn greedy() -> Self {
        Self::default()
    }

    /// Whether this is plain argmax.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }

    /// The token for generated position `pos` from `logits`.
    pub fn choose(&self, logits: &[f32], pos: usize) -> u32 {
        if self.is_greedy() {
            return crate::argmax(logits);
        }
        let mut idx: Vec<usize> = (0..logits.len()).filter(|&i| logits[i].is_finite()).collect();
        if idx.is_empty() {
            return crate::argmax(logits);
        }
        // Most likely first; ties by lower id so the order is total and deterministic.
        idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        if self.top_k > 0 {
            idx.truncate(self.top_k);
        }
        let t = f64::from(self.temperature);
        let max = f64::from(logits[idx[0]]);
        let mut probs: Vec<f64> =
            idx.iter().map(|&i| ((f64::from(logits[i]) - max) / t).exp()).collect();
        let sum: f64 = probs.iter().sum();
        for p in &mut probs {
            *p /= sum;
        }
        if self.top_p < 1.0 {
            let mut acc = 0.0;
            let mut keep = probs.len();
            for (j, p) in probs.iter().enumerate() {
                acc += p;
                if acc >= f64::from(self.top_p) {
                    keep = j + 1;
                    break;
                }
            }
            probs.truncate(keep);
            idx.truncate(keep);
            let s: f64 = probs.iter().sum();
            for p in &mut probs {
                *p /= s;
            }
        }
        let u = unit(self.seed, pos as u64);
        let mut acc = 0.0;
        for (j, p) in probs.iter().enumerate() {
            acc += p;
            if u < acc {
                return u32::try_from(idx[j]).unwrap_or(u32::MAX);
            }
        }
        u32::try_from(idx[idx.len() - 1]).unwrap_or(u32::MAX)
    }
}

/// A uniform number in [0, 1) from `(seed, pos)` (SplitMix64 finaliser over both).
fn unit(seed: u64, pos: u64) -> f64 {
    let mut z = seed ^ pos.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(0xD1B5_4A32_D192_ED03);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    #[allow(clippy::cast_precision_loss)]
    let u = (z >> 11) as f64 / (1u64 << 53) as f64;
    u
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_is_argmax_and_sampling_is_seeded() {
        let l = [0.1f32, 2.0, 1.9, -1.0];
        assert_eq!(Sampling::greedy().choose(&l, 0), 1);
        let s = Sampling { temperature: 1.0, seed: 7, ..Sampling::default() };
        let a: Vec<u32> = (0..50).map(|p| s.choose(&l, p)).collect();
        let b: Vec<u32> = (0..50).map(|p| s.choose(&l, p)).collect();
        assert_eq!(a, b);
        assert!(a.contains(&1) && a.contains(&2), "both likely tokens appear: {a:?}");
        let k1 = Sampling { temperature: 1.0, top_k: 1, seed: 3, ..Sampling::default() };
        assert!((0..20).all(|p| k1.choose(&l, p) == 1));
        let p_small = Sampling { temperature: 1.0, top_p: 0.01, seed: 3, ..Sampling::default() };
        assert!((0..20).all(|p| p_small.choose(&l, p) == 1));
    }
}

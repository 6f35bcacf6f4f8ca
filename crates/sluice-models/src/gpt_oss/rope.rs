//! YaRN rotary position embedding for GPT-OSS, computed the way transformers computes it, in f32.
//!
//! The reference (`modeling_rope_utils._compute_yarn_parameters` and `GptOssRotaryEmbedding`,
//! transformers 5.17):
//!
//! ```python
//! pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)          # f32
//! inv_freq_extrapolation = 1.0 / pos_freqs
//! inv_freq_interpolation = 1.0 / (factor * pos_freqs)
//! low, high = find_correction_range(beta_fast, beta_slow, dim, base, original_max, truncate)  # f64
//! ramp = clamp((arange(dim // 2).float() - low) / (high - low), 0, 1)  # f32
//! extra = 1 - ramp
//! inv_freq = inv_freq_interpolation * (1 - extra) + inv_freq_extrapolation * extra
//! freqs = inv_freq * position                                          # no cat: half-width
//! cos, sin = freqs.cos() * attention_factor, freqs.sin() * attention_factor
//! # _apply_rotary_emb: x1, x2 = chunk(x, 2); cat(x1 * cos - x2 * sin, x2 * cos + x1 * sin)
//! ```
//!
//! Every intermediate is rounded to f32 where torch rounds it (Python scalars meet f32 tensors
//! as f32); the power, cosine and sine are evaluated in f64 and rounded once.

use super::config::Yarn;

/// YaRN inverse frequencies and the cos/sin scale of one head width.
#[derive(Debug, Clone)]
pub struct YarnRope {
    inv_freq: Vec<f32>,
    scale: f32,
}

/// cos and sin rows `[t, head_dim / 2]` for the consecutive positions of one pass.
#[derive(Debug, Clone)]
pub struct HalfRows {
    /// `cos(pos · inv_freq) · attention_factor`.
    pub cos: Vec<f32>,
    /// `sin(pos · inv_freq) · attention_factor`.
    pub sin: Vec<f32>,
}

/// `find_correction_dim`: the dimension at which `rot` full rotations fit the training context.
fn correction_dim(rot: f64, dim: f64, base: f64, orig: f64) -> f64 {
    (dim * (orig / (rot * 2.0 * std::f64::consts::PI)).ln()) / (2.0 * base.ln())
}

impl YarnRope {
    /// The YaRN table for `head_dim` (even), base `theta` and `y`.
    #[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
    pub fn new(head_dim: usize, theta: f64, y: &Yarn) -> Self {
        let dim = head_dim as f64;
        let base = f64::from(theta as f32);
        let (mut low, mut high) = (
            correction_dim(y.beta_fast, dim, theta, y.original_max_position_embeddings),
            correction_dim(y.beta_slow, dim, theta, y.original_max_position_embeddings),
        );
        if y.truncate {
            (low, high) = (low.floor(), high.ceil());
        }
        (low, high) = (low.max(0.0), high.min(dim - 1.0));
        if low == high {
            high += 0.001;
        }
        let (low32, span32) = (low as f32, (high - low) as f32);
        let factor = y.factor as f32;
        let inv_freq = (0..head_dim / 2)
            .map(|j| {
                let e = (2 * j) as f32 / head_dim as f32;
                let pos = base.powf(f64::from(e)) as f32;
                let extrapolation = 1.0f32 / pos;
                let interpolation = 1.0f32 / (factor * pos);
                let ramp = ((j as f32 - low32) / span32).clamp(0.0, 1.0);
                let extra = 1.0f32 - ramp;
                interpolation * (1.0 - extra) + extrapolation * extra
            })
            .collect();
        Self { inv_freq, scale: y.attention_factor as f32 }
    }

    /// The table of inverse frequencies `inv_freq` whose cos/sin are scaled by `scale`: another
    /// family's (DeepSeek-V3's plain RoPE), rotated as this one is.
    pub(crate) fn from_inv_freq(inv_freq: Vec<f32>, scale: f32) -> Self {
        Self { inv_freq, scale }
    }

    /// `inv_freq [head_dim / 2]` (HF's `model.rotary_emb.inv_freq`).
    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    /// cos/sin rows for positions `pos0 .. pos0 + t`.
    pub fn rows(&self, pos0: usize, t: usize) -> HalfRows {
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(t * half);
        let mut sin = Vec::with_capacity(t * half);
        for ti in 0..t {
            #[allow(clippy::cast_precision_loss)]
            let pos = (pos0 + ti) as f32;
            for &f in &self.inv_freq {
                let angle = f64::from(pos * f);
                #[allow(clippy::cast_possible_truncation)]
                let (c, s) = (angle.cos() as f32, angle.sin() as f32);
                cos.push(c * self.scale);
                sin.push(s * self.scale);
            }
        }
        HalfRows { cos, sin }
    }
}

/// Rotates one head `x [head_dim]` in place by half-width `cos`/`sin` rows.
pub fn apply(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = x.len() / 2;
    debug_assert_eq!(cos.len(), half);
    for i in 0..half {
        let (a, b) = (x[i], x[i + half]);
        x[i] = a * cos[i] - b * sin[i];
        x[i + half] = b * cos[i] + a * sin[i];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yarn(factor: f64) -> Yarn {
        Yarn {
            factor,
            beta_fast: 32.0,
            beta_slow: 1.0,
            original_max_position_embeddings: 4096.0,
            truncate: false,
            attention_factor: 0.1 * factor.ln() + 1.0,
        }
    }

    #[test]
    fn high_frequencies_extrapolate_and_low_ones_interpolate() {
        let r = YarnRope::new(64, 150_000.0, &yarn(32.0));
        let inv = r.inv_freq();
        assert_eq!(inv[0], 1.0, "the fastest pair keeps its frequency");
        let plain = 150_000f64.powf(-62.0 / 64.0);
        let last = f64::from(inv[31]);
        assert!(
            (last - plain / 32.0).abs() < plain * 1e-5,
            "the slowest pair is divided by factor"
        );
    }

    #[test]
    fn factor_one_is_plain_rope_scaled_by_one() {
        let r = YarnRope::new(16, 10_000.0, &yarn(1.0));
        let rows = r.rows(3, 1);
        let want = (3.0f64 * f64::from(r.inv_freq()[1])).cos();
        assert!((f64::from(rows.cos[1]) - want).abs() < 1e-7);
        let mut x = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        let zero = r.rows(0, 1);
        let before = x;
        apply(&mut x, &zero.cos[..4], &zero.sin[..4]);
        assert_eq!(x, before, "position 0 with scale 1 is the identity");
    }
}

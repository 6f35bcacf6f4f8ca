//! Log-probabilities of generated tokens, from the logits the target chose them from.
//!
//! The distribution is the model's own (log-softmax of the raw logits, accumulated in f64), not
//! the temperature/top-k/top-p-adjusted one a token was sampled from: that is what vLLM reports by
//! default and what makes logprobs comparable across sampling settings. Non-finite logits count as
//! probability zero; their log-probability is reported as [`FLOOR`] because JSON has no `-inf`.

/// Log-probability reported for a token of probability zero.
pub const FLOOR: f32 = -9999.0;

/// The log-probability of the chosen token and the most likely alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    /// The chosen token.
    pub id: u32,
    /// Its log-probability.
    pub logprob: f32,
    /// The `top_n` most likely tokens with their log-probabilities, most likely first (ties by
    /// lower id).
    pub top: Vec<(u32, f32)>,
}

/// Log-softmax of `logits` at `chosen`, plus the `top_n` most likely tokens.
pub fn token_logprobs(logits: &[f32], chosen: u32, top_n: usize) -> TokenLogprobs {
    let max = logits.iter().copied().filter(|x| x.is_finite()).fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = if max.is_finite() {
        logits
            .iter()
            .filter(|x| x.is_finite())
            .map(|&x| (f64::from(x) - f64::from(max)).exp())
            .sum()
    } else {
        0.0
    };
    let lse = f64::from(max) + sum.ln();
    let lp = |x: f32| -> f32 {
        if x.is_finite() && lse.is_finite() {
            #[allow(clippy::cast_possible_truncation)]
            let v = (f64::from(x) - lse) as f32;
            v.max(FLOOR)
        } else {
            FLOOR
        }
    };
    let chosen_lp = logits.get(chosen as usize).map_or(FLOOR, |&x| lp(x));
    let mut top = Vec::new();
    if top_n > 0 {
        let mut idx: Vec<u32> = (0..logits.len()).filter_map(|i| u32::try_from(i).ok()).collect();
        let key = |i: u32| {
            let x = logits[i as usize];
            if x.is_nan() {
                f32::NEG_INFINITY
            } else {
                x
            }
        };
        let order = |a: &u32, b: &u32| key(*b).total_cmp(&key(*a)).then(a.cmp(b));
        let n = top_n.min(idx.len());
        if n > 0 && n < idx.len() {
            idx.select_nth_unstable_by(n - 1, order);
        }
        idx.truncate(n);
        idx.sort_by(order);
        top = idx.into_iter().map(|i| (i, lp(logits[i as usize]))).collect();
    }
    TokenLogprobs { id: chosen, logprob: chosen_lp, top }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_a_normalised_log_softmax() {
        let l = [1.0f32, 2.0, 3.0, 2.0];
        let t = token_logprobs(&l, 2, 3);
        let z: f64 = l.iter().map(|&x| f64::from(x).exp()).sum();
        let want = (3.0f64.exp() / z).ln();
        assert!((f64::from(t.logprob) - want).abs() < 1e-6);
        assert_eq!(t.top.iter().map(|p| p.0).collect::<Vec<_>>(), vec![2, 1, 3]);
        let total: f64 = (0..4).map(|i| f64::from(token_logprobs(&l, i, 0).logprob).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
    }

    #[test]
    fn non_finite_logits_and_bad_ids_floor() {
        let l = [f32::NEG_INFINITY, 0.0, f32::NAN];
        let t = token_logprobs(&l, 0, 5);
        assert_eq!(t.logprob, FLOOR);
        assert_eq!(t.top[0], (1, 0.0));
        assert_eq!(t.top.len(), 3);
        assert_eq!(token_logprobs(&l, 99, 0).logprob, FLOOR);
        let all_bad = [f32::NAN, f32::NEG_INFINITY];
        assert_eq!(token_logprobs(&all_bad, 0, 1).logprob, FLOOR);
    }
}

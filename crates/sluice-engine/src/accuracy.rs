//! Measured accuracy of a lossy model against its reference (the int8 spine against the
//! published checkpoint): greedy decoding of seeded prompts, compared position by position.
//!
//! For each prompt the reference decodes greedily for `max_new` steps, and the candidate is fed
//! the same tokens (teacher forcing), so both score the same positions. At each step the two
//! next-token distributions are compared: whether their top-1 tokens agree, the KL divergence
//! `KL(reference ‖ candidate)` of their softmaxes (in f64, nats), and the largest absolute
//! difference of any logit. Because greedy decoding is deterministic, the candidate's own greedy
//! continuation equals the reference's exactly up to the first step where top-1 disagrees,
//! which is reported per prompt as the first divergence. For a mixture of experts it also
//! counts, per position and MoE layer, whether both chose the same routed experts.

use crate::generate::argmax;
use serde::Serialize;
use sluice_models::kimi_k3::Trace;
use sluice_models::{LogitRows, Model, ModelError, State};

/// What to compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AccuracyOptions {
    /// Prompts (random token ids drawn from `seed`).
    pub prompts: usize,
    /// Tokens per prompt.
    pub prompt_len: usize,
    /// Greedy steps compared per prompt.
    pub max_new: usize,
    /// Seed of the prompt ids.
    pub seed: u64,
}

impl Default for AccuracyOptions {
    fn default() -> Self {
        Self { prompts: 8, prompt_len: 16, max_new: 32, seed: 1 }
    }
}

/// The comparison of one prompt.
#[derive(Debug, Clone, Serialize)]
pub struct PromptAccuracy {
    /// The prompt ids.
    pub prompt: Vec<u32>,
    /// The reference's greedy tokens.
    pub reference_tokens: Vec<u32>,
    /// First step where the candidate's top-1 differs (its greedy output diverges there);
    /// `None` when its greedy output is identical.
    pub first_divergence: Option<usize>,
}

/// The comparison over every prompt and step.
#[derive(Debug, Clone, Serialize)]
pub struct Accuracy {
    /// Prompts compared.
    pub prompts: usize,
    /// Positions compared (`prompts × max_new`).
    pub positions: usize,
    /// Positions whose top-1 tokens agree.
    pub top1_agree: usize,
    /// `top1_agree / positions`.
    pub top1_agreement: f64,
    /// Mean of `KL(reference ‖ candidate)` over positions, nats.
    pub kl_mean: f64,
    /// Largest `KL(reference ‖ candidate)`, nats.
    pub kl_max: f64,
    /// Largest `|logit_reference − logit_candidate|` over positions and vocabulary.
    pub max_abs_logit_diff: f64,
    /// (Position, MoE layer) pairs compared for routing (0 for a dense model).
    pub routes: usize,
    /// Fraction of those where both models chose the same set of routed experts (1 for a
    /// dense model): int8 error near a router's selection margin swaps an expert.
    pub route_agreement: f64,
    /// Prompts whose candidate greedy continuation equals the reference's.
    pub greedy_identical: usize,
    /// Per prompt.
    pub per_prompt: Vec<PromptAccuracy>,
}

/// `log softmax(logits)` in f64.
fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().copied().map(f64::from).fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = logits.iter().map(|&l| (f64::from(l) - max).exp()).sum();
    let log_z = max + sum.ln();
    logits.iter().map(|&l| f64::from(l) - log_z).collect()
}

/// `KL(P ‖ Q)` of the softmaxes of logits `p` and `q`, nats.
pub fn kl_divergence(p: &[f32], q: &[f32]) -> f64 {
    let (lp, lq) = (log_softmax(p), log_softmax(q));
    lp.iter()
        .zip(&lq)
        .map(|(&a, &b)| if a == f64::NEG_INFINITY { 0.0 } else { a.exp() * (a - b) })
        .sum()
}

/// Seeded prompt ids in `0..vocab` (SplitMix64), the same on every machine.
pub fn seeded_prompts(opts: &AccuracyOptions, vocab: usize) -> Vec<Vec<u32>> {
    let mut x = opts.seed;
    let mut next = move || {
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let vocab = u64::try_from(vocab.max(1)).unwrap_or(u64::MAX);
    (0..opts.prompts)
        .map(|_| (0..opts.prompt_len).map(|_| u32::try_from(next() % vocab).unwrap_or(0)).collect())
        .collect()
}

/// Compares `candidate` against `reference` on seeded prompts (see the module docs).
/// `on_prompt(done, total)` is called after each prompt.
pub fn compare(
    reference: &Model,
    candidate: &Model,
    opts: &AccuracyOptions,
    mut on_prompt: impl FnMut(usize, usize),
) -> Result<Accuracy, ModelError> {
    if reference.vocab_size() != candidate.vocab_size() {
        return Err(ModelError::Config(format!(
            "the models have different vocabularies ({} and {})",
            reference.vocab_size(),
            candidate.vocab_size()
        )));
    }
    let prompts = seeded_prompts(opts, reference.vocab_size());
    let mut acc = Accuracy {
        prompts: prompts.len(),
        positions: 0,
        top1_agree: 0,
        top1_agreement: 0.0,
        kl_mean: 0.0,
        kl_max: 0.0,
        max_abs_logit_diff: 0.0,
        routes: 0,
        route_agreement: 1.0,
        greedy_identical: 0,
        per_prompt: Vec::new(),
    };
    let (mut kl_sum, mut routes_same) = (0.0, 0usize);
    // One pass of `tokens` on both models; returns both logits of the last row and counts
    // whether each MoE layer routed that row to the same experts.
    let mut pass = |sa: &mut State, sb: &mut State, tokens: &[u32], acc: &mut Accuracy| {
        let (mut ta, mut tb) = (Trace::default(), Trace::default());
        let la = reference.forward(sa, tokens, LogitRows::Last, Some(&mut ta))?;
        sa.commit(tokens.len());
        let lb = candidate.forward(sb, tokens, LogitRows::Last, Some(&mut tb))?;
        sb.commit(tokens.len());
        for (layer, ra) in &ta.routes {
            let (Some(a), Some(b)) = (ra.last(), tb.routes.get(layer).and_then(|r| r.last()))
            else {
                continue;
            };
            let sorted = |ids: &[u32]| {
                let mut v = ids.to_vec();
                v.sort_unstable();
                v
            };
            acc.routes += 1;
            routes_same += usize::from(sorted(&a.ids) == sorted(&b.ids));
        }
        Ok::<_, ModelError>((la, lb))
    };
    for (i, prompt) in prompts.iter().enumerate() {
        let (mut sa, mut sb) = (reference.new_state(), candidate.new_state());
        let (mut la, mut lb) = pass(&mut sa, &mut sb, prompt, &mut acc)?;
        let mut tokens = Vec::with_capacity(opts.max_new);
        let mut first_divergence = None;
        for step in 0..opts.max_new {
            let (ta, tb) = (argmax(&la), argmax(&lb));
            acc.positions += 1;
            if ta == tb {
                acc.top1_agree += 1;
            } else if first_divergence.is_none() {
                first_divergence = Some(step);
            }
            let kl = kl_divergence(&la, &lb);
            kl_sum += kl;
            acc.kl_max = acc.kl_max.max(kl);
            let diff = la.iter().zip(&lb).map(|(&a, &b)| (f64::from(a) - f64::from(b)).abs());
            acc.max_abs_logit_diff = diff.fold(acc.max_abs_logit_diff, f64::max);
            tokens.push(ta);
            if step + 1 < opts.max_new {
                (la, lb) = pass(&mut sa, &mut sb, &[ta], &mut acc)?;
            }
        }
        acc.greedy_identical += usize::from(first_divergence.is_none());
        acc.per_prompt.push(PromptAccuracy {
            prompt: prompt.clone(),
            reference_tokens: tokens,
            first_divergence,
        });
        on_prompt(i + 1, prompts.len());
    }
    #[allow(clippy::cast_precision_loss)]
    if acc.positions > 0 {
        acc.top1_agreement = acc.top1_agree as f64 / acc.positions as f64;
        acc.kl_mean = kl_sum / acc.positions as f64;
    }
    #[allow(clippy::cast_precision_loss)]
    if acc.routes > 0 {
        acc.route_agreement = routes_same as f64 / acc.routes as f64;
    }
    Ok(acc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kl_is_zero_for_equal_and_positive_otherwise() {
        let p = [1.0f32, 2.0, -3.0, 0.5];
        assert!(kl_divergence(&p, &p).abs() < 1e-15);
        // A constant shift of every logit is the same distribution.
        let shifted: Vec<f32> = p.iter().map(|x| x + 7.0).collect();
        assert!(kl_divergence(&p, &shifted).abs() < 1e-12);
        let q = [2.0f32, 1.0, -3.0, 0.5];
        let kl = kl_divergence(&p, &q);
        // By hand: p = softmax([1, 2, -3, .5]); KL = Σ p·(log p − log q) = (p1 − p0)·1.
        let z: f64 = [1.0f64, 2.0, -3.0, 0.5].iter().map(|x| x.exp()).sum();
        let want = (2.0f64.exp() - 1.0f64.exp()) / z;
        assert!((kl - want).abs() < 1e-12, "{kl} vs {want}");
    }

    #[test]
    fn seeded_prompts_are_deterministic_and_in_range() {
        let o = AccuracyOptions { prompts: 3, prompt_len: 5, max_new: 1, seed: 9 };
        let a = seeded_prompts(&o, 17);
        assert_eq!(a, seeded_prompts(&o, 17));
        assert_eq!(a.len(), 3);
        assert!(a.iter().all(|p| p.len() == 5 && p.iter().all(|&t| t < 17)));
        assert_ne!(a, seeded_prompts(&AccuracyOptions { seed: 10, ..o }, 17));
    }
}

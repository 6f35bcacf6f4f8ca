//! How many draft tokens to verify per pass, from measured costs.
//!
//! **Model.** A pass over `1 + k` rows costs about `c0 + c1·k`: `c0` is a one-row pass (the
//! spine sweep plus one row's experts), `c1` what each extra row adds (its compute and the
//! experts no other row needs — the dominant term when experts stream from disk). Drafting k
//! tokens costs `cd·k` more (a draft model's passes, measured around every `propose` call; a
//! prompt-lookup drafter measures `cd ≈ 0`). With a per-draft acceptance rate α, verifying k
//! drafts emits on average `1 + α + … + α^k` tokens. The policy verifies the k in `0..=max` with
//! the most expected tokens per second ([`best_width`]); on a tie it takes fewer drafts, so it
//! drafts only when its measurements say drafting pays.
//!
//! **Measuring.** Both costs come from passes whose width identifies them:
//! 1. the first decode pass runs one row and measures `c0`;
//! 2. the second runs the full width: `c1 = (t − c0) / k`, and the first acceptance figure;
//! 3. from then on every pass runs the best width. One-row passes refresh `c0`, wider passes
//!    `c1` (exponential moving averages, weight 0.3), and after 16 passes narrower than the full
//!    width one runs at full width (exploration), so a drafter that starts matching, or rows that
//!    became cheap, are noticed even after the policy stopped drafting.
//!
//! α is accepted ÷ trials over recent passes, each pass's counts weighted 0.7^age. A draft is a
//! trial only if every draft before it was accepted (geometric model): a pass that accepted a
//! drafts counts a successes and one failure — no failure when all were accepted or when
//! generation stopped inside the accepted prefix.
//!
//! **What learning costs.** At 0% acceptance: one full-width pass to measure `c1`, then one per
//! 16 passes. At 100% acceptance with cheap rows: one one-row pass; the full-width measuring
//! pass already emits `1 + max` tokens. (An earlier version measured a full-width pass first and
//! split its time evenly between `c0` and `c1`, so an extra row looked as expensive as a whole
//! pass and a tie chose no drafts: it stayed narrow exactly where drafting paid most.)

use serde::Serialize;
use std::fmt;

/// Weight of a new measurement in the `c0`, `c1` and `cd` averages.
const EMA: f64 = 0.3;
/// Weight of a pass's acceptance counts after each further pass.
const DECAY: f64 = 0.7;
/// Passes narrower than the full width between two exploring full-width passes.
const EXPLORE_EVERY: usize = 16;

/// Expected tokens one pass emits when it verifies `k` drafts, each accepted with probability
/// `alpha` while all before it were: `1 + α + … + α^k`.
pub fn expected_tokens(alpha: f64, k: usize) -> f64 {
    let mut sum = 1.0;
    let mut term = 1.0;
    for _ in 0..k {
        term *= alpha;
        sum += term;
    }
    sum
}

/// The draft count in `0..=max` with the most expected tokens per second, and its rate over a
/// one-row pass's (1.0 when that is the one-row pass). A pass verifying k drafts costs
/// `c0 + (c1 + cd)·k` seconds; ties go to fewer drafts.
pub fn best_width(alpha: f64, c0: f64, c1: f64, cd: f64, max: usize) -> (usize, f64) {
    let rate = |k: usize| {
        #[allow(clippy::cast_precision_loss)]
        let secs = c0 + (c1 + cd) * k as f64;
        expected_tokens(alpha, k) / secs.max(1e-12)
    };
    let plain = rate(0);
    let mut best = (0, plain);
    for k in 1..=max {
        let r = rate(k);
        if r > best.1 {
            best = (k, r);
        }
    }
    (best.0, best.1 / plain)
}

/// Measured-cost width policy.
#[derive(Debug, Clone, Serialize)]
pub struct WidthPolicy {
    /// Largest width allowed.
    pub max: usize,
    /// Acceptance estimate per drafted position (0.5 until a draft was verified).
    pub alpha: f64,
    /// Seconds of a one-row pass.
    pub c0: Option<f64>,
    /// Extra seconds per additional row.
    pub c1: Option<f64>,
    /// Seconds of drafting per requested draft token.
    pub cd: Option<f64>,
    /// Always the full width (benchmarks comparing the policy with fixed widths).
    pub fixed: bool,
    /// Passes whose width was chosen to measure `c0` or `c1`.
    pub measuring_passes: usize,
    /// Full-width passes run to explore while the best width was narrower.
    pub exploring_passes: usize,
    /// The width of the last decision from the estimates.
    pub last_width: usize,
    /// That decision's expected tokens per second over a one-row pass's.
    pub expected_speedup: f64,
    /// How many passes ran with each width (index = drafts verified).
    pub histogram: Vec<usize>,
    /// Decayed accepted drafts and trials behind `alpha`.
    #[serde(skip)]
    accepted_w: f64,
    #[serde(skip)]
    trials_w: f64,
    /// Passes since the last full-width pass.
    #[serde(skip)]
    since_full: usize,
}

impl WidthPolicy {
    /// A policy allowing up to `max` drafts per pass.
    pub fn new(max: usize) -> Self {
        Self {
            max,
            alpha: 0.5,
            c0: None,
            c1: None,
            cd: None,
            fixed: false,
            measuring_passes: 0,
            exploring_passes: 0,
            last_width: 0,
            expected_speedup: 1.0,
            histogram: vec![0; max + 1],
            accepted_w: 0.0,
            trials_w: 0.0,
            since_full: 0,
        }
    }

    /// A policy that always asks for `width` drafts (it still measures, for the statistics).
    pub fn fixed(width: usize) -> Self {
        Self { fixed: true, ..Self::new(width) }
    }

    /// The number of drafts to request for the next pass.
    pub fn width(&mut self) -> usize {
        if self.max == 0 || self.fixed {
            return self.max;
        }
        let Some(c0) = self.c0 else {
            self.measuring_passes += 1;
            return 0;
        };
        let Some(c1) = self.c1 else {
            self.measuring_passes += 1;
            return self.max;
        };
        let (k, speedup) = best_width(self.alpha, c0, c1, self.cd.unwrap_or(0.0), self.max);
        self.last_width = k;
        self.expected_speedup = speedup;
        if k < self.max && self.since_full >= EXPLORE_EVERY {
            self.exploring_passes += 1;
            return self.max;
        }
        k
    }

    /// Records that drafting `requested` tokens took `secs`.
    pub fn record_draft(&mut self, requested: usize, secs: f64) {
        if requested > 0 {
            #[allow(clippy::cast_precision_loss)]
            let per = secs / requested as f64;
            self.cd = Some(self.cd.map_or(per, |o| o + EMA * (per - o)));
        }
    }

    /// Records a pass of `rows` rows (1 + drafts) that took `secs`, in which the first
    /// `accepted` drafts were accepted; `rejected` is whether the draft after them was verified
    /// and rejected (false when every draft was accepted or generation stopped before it).
    pub fn record(&mut self, rows: usize, secs: f64, accepted: usize, rejected: bool) {
        let drafted = rows.saturating_sub(1);
        if let Some(h) = self.histogram.get_mut(drafted) {
            *h += 1;
        }
        if drafted >= self.max {
            self.since_full = 0;
        } else {
            self.since_full += 1;
        }
        let ema = |old: Option<f64>, new: f64| Some(old.map_or(new, |o| o + EMA * (new - o)));
        if drafted == 0 {
            self.c0 = ema(self.c0, secs);
        } else if let Some(c0) = self.c0 {
            #[allow(clippy::cast_precision_loss)]
            let per_row = ((secs - c0) / drafted as f64).max(0.0);
            self.c1 = ema(self.c1, per_row);
        }
        let trials = accepted + usize::from(rejected);
        if trials > 0 {
            #[allow(clippy::cast_precision_loss)]
            {
                self.accepted_w = DECAY * self.accepted_w + accepted as f64;
                self.trials_w = DECAY * self.trials_w + trials as f64;
            }
            self.alpha = self.accepted_w / self.trials_w;
        }
    }
}

impl fmt::Display for WidthPolicy {
    /// One line for `--stats`: the estimates and the decision they give.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs =
            |v: Option<f64>| v.map_or_else(|| "unmeasured".to_owned(), |s| format!("{s:.4}s"));
        if self.fixed {
            write!(f, "fixed width {}", self.max)?;
        } else {
            write!(
                f,
                "policy up to {}: next width {} (expected {:.2}x a one-row pass's tokens/s)",
                self.max, self.last_width, self.expected_speedup
            )?;
        }
        write!(
            f,
            " from acceptance {:.3}, one-row pass {}, per extra row {}, drafting {} per token; \
             {} measuring and {} exploring passes",
            self.alpha,
            secs(self.c0),
            secs(self.c1),
            secs(self.cd),
            self.measuring_passes,
            self.exploring_passes
        )
    }
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;

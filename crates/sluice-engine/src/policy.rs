//! How many draft tokens to verify per pass, from measured costs.
//!
//! A pass over T rows costs about `c0 + c1·(T − 1)`: `c0` is the spine sweep plus one row's
//! experts, `c1` what each extra row adds (its compute and the experts no other row needs — the
//! dominant term when experts stream from disk). With a per-draft acceptance rate α, verifying
//! k drafts emits on average `1 + α + … + α^k` tokens. The policy picks the k in `0..=max` that
//! maximises tokens per second under the current estimates, updates α, `c0` and `c1` from every
//! pass (exponential moving averages), and explores a wider pass now and then so a drafter that
//! starts matching is noticed. Speculation therefore stops by itself when drafts are rejected
//! or extra rows are expensive, and widens when they pay.
//!
//! A model drafter is not free: drafting k tokens costs about `cd·k` more (its passes), measured
//! around every `propose` call, so the pass cost the policy weighs is `c0 + (c1 + cd)·k`. A
//! prompt-lookup drafter measures `cd ≈ 0`.

use serde::Serialize;

/// Measured-cost width policy.
#[derive(Debug, Clone, Serialize)]
pub struct WidthPolicy {
    /// Largest width allowed.
    pub max: usize,
    /// Acceptance estimate per drafted position.
    pub alpha: f64,
    /// Seconds of a one-row pass.
    pub c0: Option<f64>,
    /// Extra seconds per additional row.
    pub c1: Option<f64>,
    /// Seconds of drafting per requested draft token.
    pub cd: Option<f64>,
    /// Always the full width (benchmarks comparing the policy with fixed widths).
    pub fixed: bool,
    /// Passes since the last exploration at full width.
    #[serde(skip)]
    since_explore: usize,
    /// How many passes ran with each width (index = drafts verified).
    pub histogram: Vec<usize>,
}

const EMA: f64 = 0.3;
const EXPLORE_EVERY: usize = 16;

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
            since_explore: 0,
            histogram: vec![0; max + 1],
        }
    }

    /// A policy that always asks for `width` drafts (it still measures, for the statistics).
    pub fn fixed(width: usize) -> Self {
        Self { fixed: true, ..Self::new(width) }
    }

    /// Expected tokens emitted when verifying `k` drafts.
    fn expected_tokens(&self, k: usize) -> f64 {
        (0..=k).map(|i| self.alpha.powi(i32::try_from(i).unwrap_or(i32::MAX))).sum()
    }

    /// The number of drafts to request for the next pass.
    pub fn width(&mut self) -> usize {
        if self.max == 0 || self.fixed {
            return self.max;
        }
        let cd = self.cd.unwrap_or(0.0);
        let (Some(c0), Some(c1)) = (self.c0, self.c1) else {
            // Nothing measured yet: one pass at full width to learn c1 and α.
            return self.max;
        };
        self.since_explore += 1;
        if self.since_explore >= EXPLORE_EVERY {
            self.since_explore = 0;
            return self.max;
        }
        let mut best = (0usize, 0.0f64);
        for k in 0..=self.max {
            #[allow(clippy::cast_precision_loss)]
            let rate = self.expected_tokens(k) / (c0 + (c1 + cd) * k as f64).max(1e-12);
            if rate > best.1 {
                best = (k, rate);
            }
        }
        best.0
    }

    /// Records that drafting `requested` tokens took `secs`.
    pub fn record_draft(&mut self, requested: usize, secs: f64) {
        if requested > 0 {
            #[allow(clippy::cast_precision_loss)]
            let per = secs / requested as f64;
            self.cd = Some(self.cd.map_or(per, |o| o + EMA * (per - o)));
        }
    }

    /// Records a pass of `rows` rows (1 + drafts) that took `secs`, in which `accepted` of
    /// `drafted` drafts were accepted.
    pub fn record(&mut self, rows: usize, secs: f64, drafted: usize, accepted: usize) {
        if let Some(h) = self.histogram.get_mut(drafted) {
            *h += 1;
        }
        let ema = |old: Option<f64>, new: f64| Some(old.map_or(new, |o| o + EMA * (new - o)));
        if rows <= 1 {
            self.c0 = ema(self.c0, secs);
        } else if let Some(c0) = self.c0 {
            #[allow(clippy::cast_precision_loss)]
            let per_row = ((secs - c0) / (rows - 1) as f64).max(0.0);
            self.c1 = ema(self.c1, per_row);
        } else {
            // No one-row pass measured yet: attribute the pass evenly to start both estimates.
            #[allow(clippy::cast_precision_loss)]
            let each = secs / rows as f64;
            self.c0 = Some(each);
            self.c1 = Some(each);
        }
        if drafted > 0 {
            // Each draft is a trial only if all before it were accepted: `accepted` successes,
            // then one failure unless every draft was accepted (geometric model).
            let trials = accepted + usize::from(accepted < drafted);
            #[allow(clippy::cast_precision_loss)]
            let a = accepted as f64 / trials as f64;
            self.alpha += EMA * (a - self.alpha);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cheap_rows_and_good_drafts_widen() {
        let mut p = WidthPolicy::new(8);
        p.record(1, 1.0, 0, 0);
        for _ in 0..20 {
            p.record(9, 1.08, 8, 8);
        }
        assert_eq!(p.width(), 8);
    }

    #[test]
    fn rejected_drafts_or_expensive_rows_stop_speculation() {
        let mut p = WidthPolicy::new(8);
        p.record(1, 1.0, 0, 0);
        for _ in 0..20 {
            p.record(9, 1.1, 8, 0);
        }
        assert_eq!(p.width(), 0, "drafts never accepted");
        let mut q = WidthPolicy::new(8);
        q.record(1, 1.0, 0, 0);
        for _ in 0..20 {
            q.record(9, 9.0, 8, 4);
        }
        assert_eq!(q.width(), 0, "each extra row costs a whole pass");
    }

    #[test]
    fn an_expensive_drafter_narrows_what_cheap_rows_would_allow() {
        let mut p = WidthPolicy::new(8);
        p.record(1, 1.0, 0, 0);
        for _ in 0..20 {
            p.record(9, 1.8, 8, 4);
        }
        let free = p.clone().width();
        assert!(free > 0, "half-accepted drafts with rows at 0.1 s pay");
        for _ in 0..20 {
            p.record_draft(8, 8.0);
        }
        assert_eq!(p.width(), 0, "a second of drafting per token never pays");
        let mut f = WidthPolicy::fixed(5);
        f.record(6, 9.0, 5, 0);
        assert_eq!(f.width(), 5);
    }
}

//! Per-layer accounting of the streaming store, and the prefetch gate that keeps guessing from
//! costing bandwidth when it does not pay.
//!
//! Every demanded layer records the bytes of the distinct experts it asked for and the bytes
//! actually read for it (demand and prefetch), so a benchmark can show that a pass reads each
//! routed expert once (`bytes_read / demanded_bytes` ≈ 1 on a cold cache).
//!
//! The gate: a guess for layer L is scored when L is demanded, by its precision (the share of
//! guessed experts that L really used). The score is an exponential average (weight
//! [`GATE_WEIGHT`] on the newest pass) that starts at 0: a predictor must prove itself before
//! it may spend bandwidth. While the score is below the configured minimum precision, guesses
//! for L are not read at all; they are kept as *shadow* guesses and scored the same way, so
//! at a minimum of 0.5 the gate opens after three passes of a perfect predictor (0 → 0.25 →
//! 0.44 → 0.58), at the default 0.9 after nine, and it shuts again after three passes of a
//! useless one (1 → 0.75 → 0.56 → 0.42). Starting at the first measured precision instead was
//! tried and measured worse: a prefill's guesses (the union over hundreds of rows) score
//! near 1.0 and opened the gate for decode guesses of precision 0 (docs/PERFORMANCE.md). A wrong guess on a busy disk delays the next layer's demanded reads (a read cannot be
//! taken back once it has started), so a predictor that is mostly wrong is worse than none.

use serde::Serialize;

/// Weight of the newest pass in a layer's prefetch score.
pub const GATE_WEIGHT: f64 = 0.25;

/// Default minimum guess precision for prefetch reads to be issued. A wrong guess costs a
/// whole expert read; on a disk-bound pass that read delays the needed ones, and on a machine
/// whose cores the compute fills, the read's own CPU cost slows the compute. Measured on K3
/// slices (docs/PERFORMANCE.md, issue 3): with guesses of precision 0.35–0.75, reading them
/// made decode 5–20% slower than not reading them, on a 2-core machine (compute-bound) and on
/// a 16-core one (disk-bound) alike, so guesses are read only from a predictor that is right
/// nine times in ten.
pub const DEFAULT_MIN_PRECISION: f64 = 0.9;

/// Streaming accounting of one layer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct LayerPrefetchStats {
    /// Prefetch reads queued for the layer.
    pub issued: u64,
    /// Experts the layer demanded (over all `for_each` calls).
    pub demanded: u64,
    /// Demanded experts that were ready or in flight because of a prefetch.
    pub covered: u64,
    /// Bytes read for prefetches of the layer that were not demanded (or were evicted first).
    pub wasted_bytes: u64,
    /// `for_each` calls (passes) that demanded the layer.
    pub passes: u64,
    /// Bytes of the distinct experts demanded, summed over passes (each pass's union once).
    pub demanded_bytes: u64,
    /// Bytes read from storage for the layer's experts (demand and prefetch, with alignment).
    pub bytes_read: u64,
    /// Experts guessed for the layer, read or not (shadow guesses of a shut gate included).
    pub guessed: u64,
    /// Guessed experts that the layer then demanded (read or shadow).
    pub guess_hits: u64,
    /// Guessed experts not read because the gate was shut (low measured precision).
    pub gated: u64,
    /// Guessed experts not read because the demanded experts of the current layer left no
    /// room in the cache.
    pub skipped: u64,
}

impl LayerPrefetchStats {
    /// `covered / demanded`, or `None` before the first demand.
    pub fn recall(&self) -> Option<f64> {
        (self.demanded > 0).then(|| ratio(self.covered, self.demanded))
    }

    /// `guess_hits / guessed`: how good the predictor is, whether or not its guesses were read.
    pub fn guess_precision(&self) -> Option<f64> {
        (self.guessed > 0).then(|| ratio(self.guess_hits, self.guessed))
    }

    /// `bytes_read / demanded_bytes`, or `None` before the first demand.
    pub fn read_amplification(&self) -> Option<f64> {
        (self.demanded_bytes > 0).then(|| ratio(self.bytes_read, self.demanded_bytes))
    }

    /// The counters accumulated since `before` (a snapshot of the same layer).
    #[must_use]
    pub fn since(&self, before: &Self) -> Self {
        let d = |a: u64, b: u64| a.saturating_sub(b);
        Self {
            issued: d(self.issued, before.issued),
            demanded: d(self.demanded, before.demanded),
            covered: d(self.covered, before.covered),
            wasted_bytes: d(self.wasted_bytes, before.wasted_bytes),
            passes: d(self.passes, before.passes),
            demanded_bytes: d(self.demanded_bytes, before.demanded_bytes),
            bytes_read: d(self.bytes_read, before.bytes_read),
            guessed: d(self.guessed, before.guessed),
            guess_hits: d(self.guess_hits, before.guess_hits),
            gated: d(self.gated, before.gated),
            skipped: d(self.skipped, before.skipped),
        }
    }
}

#[allow(clippy::cast_precision_loss)]
fn ratio(a: u64, b: u64) -> f64 {
    a as f64 / b as f64
}

/// The prefetch gate of one layer.
#[derive(Debug, Clone, Default)]
pub(crate) struct Gate {
    /// Exponential average of guess precision.
    score: f64,
    /// Guessed ids not read (gate shut), sorted, awaiting the layer's demand.
    shadow: Vec<u32>,
}

impl Gate {
    /// Whether guesses may be read now.
    pub(crate) fn open(&self, min_precision: f64) -> bool {
        self.score >= min_precision
    }

    /// Keeps `ids` as a shadow guess (replacing an older one).
    pub(crate) fn shadow(&mut self, ids: &[u32]) {
        self.shadow.clear();
        self.shadow.extend_from_slice(ids);
        self.shadow.sort_unstable();
        self.shadow.dedup();
    }

    /// Scores the outstanding guess against the demanded `ids`: `read` guesses read, of which
    /// `read_hits` were demanded, plus the shadow guess. Returns (guessed, hits) of this pass.
    pub(crate) fn settle(&mut self, ids: &[u32], read: u64, read_hits: u64) -> (u64, u64) {
        let shadow = std::mem::take(&mut self.shadow);
        let shadow_hits = shadow.iter().filter(|id| ids.contains(id)).count() as u64;
        let guessed = read + shadow.len() as u64;
        let hits = read_hits + shadow_hits;
        if guessed > 0 {
            self.score = (1.0 - GATE_WEIGHT) * self.score + GATE_WEIGHT * ratio(hits, guessed);
        }
        (guessed, hits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_predictor_opens_the_gate_by_its_record_and_shuts_it_by_its_record() {
        let mut g = Gate::default();
        assert!(!g.open(0.5), "shut until measured");
        assert!(g.open(0.0), "a minimum of 0 always reads");
        for want in [false, false, true] {
            g.shadow(&[1, 2]);
            g.settle(&[1, 2, 3], 0, 0);
            assert_eq!(g.open(0.5), want, "0 → 0.25 → 0.44 → 0.58");
        }
        let mut slow = Gate::default();
        let mut passes = 0;
        while !slow.open(DEFAULT_MIN_PRECISION) {
            slow.shadow(&[1, 2]);
            slow.settle(&[1, 2], 0, 0);
            passes += 1;
        }
        assert_eq!(passes, 9, "a perfect predictor needs nine passes to reach 0.9 (1 − 0.75⁹)");
        g.score = 1.0;
        let mut passes = 0;
        while g.open(0.5) {
            assert_eq!(g.settle(&[1, 2], 4, 0), (4, 0));
            passes += 1;
        }
        assert_eq!(passes, 3, "1 → 0.75 → 0.56 → 0.42");
        g.shadow(&[2, 1, 1]);
        assert_eq!(g.settle(&[1, 2], 0, 0), (2, 2), "shadow guesses are scored");
        assert!(g.open(0.5), "0.42 → 0.57");
        assert_eq!(g.settle(&[1], 0, 0), (0, 0), "no guess, no change");
        assert!(g.open(0.5));
    }

    #[test]
    fn per_layer_ratios() {
        let s = LayerPrefetchStats {
            demanded: 4,
            covered: 1,
            demanded_bytes: 100,
            bytes_read: 103,
            guessed: 8,
            guess_hits: 2,
            ..LayerPrefetchStats::default()
        };
        assert_eq!(s.recall(), Some(0.25));
        assert_eq!(s.guess_precision(), Some(0.25));
        assert_eq!(s.read_amplification(), Some(1.03));
        assert_eq!(s.since(&s), LayerPrefetchStats::default());
        assert_eq!(LayerPrefetchStats::default().recall(), None);
    }
}

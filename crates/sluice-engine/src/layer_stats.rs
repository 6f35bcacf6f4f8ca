//! Per-layer expert-store statistics of a run, split into the prefill and the decode phase:
//! how many bytes each MoE layer read against the bytes of the distinct experts it routed to
//! (the "each expert read once per pass" check), the cache hit side of prefetch (recall), and
//! how good the next-layer guesses were (precision, wasted bytes) whether or not they were read.
//! Also the process's own storage reads (`/proc/self/io` on Linux, `proc_pid_rusage` on macOS),
//! which count every byte the kernel fetched for this process (spine pages faulted in, uncached
//! expert reads).

use serde::Serialize;
use sluice_store::LayerPrefetchStats;

/// One MoE layer's store counters over one phase of a run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LayerStats {
    /// Layer index.
    pub layer: usize,
    /// The raw counters.
    #[serde(flatten)]
    pub counters: LayerPrefetchStats,
    /// Demanded experts a prefetch had read or started (`covered / demanded`).
    pub recall: Option<f64>,
    /// Guessed experts the layer then used (`guess_hits / guessed`, read or shadow guesses).
    pub guess_precision: Option<f64>,
    /// `bytes_read / demanded_bytes`: 1.0 when every routed expert was read exactly once.
    pub read_amplification: Option<f64>,
}

/// Snapshot of every layer's counters.
#[derive(Debug, Clone, Default)]
pub struct Snapshot(pub Vec<LayerPrefetchStats>);

impl Snapshot {
    /// The layers that were demanded between `self` (earlier) and `later`, with their deltas.
    pub fn delta(&self, later: &Snapshot) -> Vec<LayerStats> {
        later
            .0
            .iter()
            .enumerate()
            .filter_map(|(layer, now)| {
                let before = self.0.get(layer).copied().unwrap_or_default();
                let c = now.since(&before);
                (c.passes > 0 || c.guessed > 0).then(|| LayerStats {
                    layer,
                    counters: c,
                    recall: c.recall(),
                    guess_precision: c.guess_precision(),
                    read_amplification: c.read_amplification(),
                })
            })
            .collect()
    }
}

/// Totals of one phase over its layers: (bytes read, bytes of distinct demanded experts).
pub fn phase_bytes(layers: &[LayerStats]) -> (u64, u64) {
    layers
        .iter()
        .fold((0, 0), |(r, d), l| (r + l.counters.bytes_read, d + l.counters.demanded_bytes))
}

/// Bytes this process has caused to be fetched from storage, or `None` where the kernel does
/// not report it ([`sluice_store::platform::counters::read_bytes`]).
pub fn process_read_bytes() -> Option<u64> {
    sluice_store::platform::counters::read_bytes()
}

/// One line per layer for `--stats`.
pub fn describe(phase: &str, layers: &[LayerStats]) -> String {
    let pct = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{:.1}%", v * 100.0));
    let mut s = String::new();
    for l in layers {
        let c = &l.counters;
        s.push_str(&format!(
            "  {phase} layer {}: {} passes, read {} B for {} B of distinct routed experts (×{}), \
             recall {}, guesses {} (precision {}, {} read, {} gated, {} skipped), wasted {} B\n",
            l.layer,
            c.passes,
            c.bytes_read,
            c.demanded_bytes,
            l.read_amplification.map_or_else(|| "-".into(), |v| format!("{v:.3}")),
            pct(l.recall),
            c.guessed,
            pct(l.guess_precision),
            c.issued,
            c.gated,
            c.skipped,
            c.wasted_bytes,
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deltas_keep_only_demanded_layers() {
        let a = Snapshot(vec![LayerPrefetchStats::default(); 3]);
        let mut now = a.0.clone();
        now[1].passes = 2;
        now[1].bytes_read = 105;
        now[1].demanded_bytes = 100;
        let d = a.delta(&Snapshot(now));
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].layer, 1);
        assert_eq!(d[0].read_amplification, Some(1.05));
        assert_eq!(phase_bytes(&d), (105, 100));
        assert!(describe("prefill", &d).contains("layer 1: 2 passes"));
        assert!(process_read_bytes().is_some(), "Linux and macOS report bytes read");
    }
}

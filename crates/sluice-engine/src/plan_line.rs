//! The plan's line: how [`Plan`] and [`SpinePlan`] print (`sluice run` and `serve` show it before
//! the model loads, `--json` carries the numbers), and how the serve rule chose the chunk.

use super::{Plan, SpinePlan};
use sluice_models::MAX_CAPTURES;
use std::fmt;

impl Plan {
    /// How the serve rule ([`Self::compute`]) chose the chunk, for the plan line (empty for a
    /// run, an explicit `--prefill-chunk`, or a server without checkpoints: planned as a run).
    fn serve_rule(&self) -> String {
        if !self.needs.serving || self.needs.prefill_chunk > 0 || self.needs.checkpoint_every == 0 {
            return String::new();
        }
        let every = self.needs.checkpoint_every;
        let cut = if self.chunk >= every {
            let rows = every.saturating_mul(MAX_CAPTURES as u64 + 1);
            format!(
                "passes up to {rows} rows ({MAX_CAPTURES} states captured each, \
                 one every --checkpoint-every {every})"
            )
        } else {
            format!("below --checkpoint-every {every}: the budget is short")
        };
        let rest = if self.sessions > self.needs.sessions {
            format!(
                "the rest conversation states (+{} over --session-memory)",
                gib(self.sessions - self.needs.sessions)
            )
        } else {
            "the rest cache".to_owned()
        };
        format!("; serve rule: {cut}; of the {} spare, {rest}", gib(self.spare))
    }
}

fn gib(b: u64) -> String {
    #[allow(clippy::cast_precision_loss)]
    let v = b as f64 / f64::from(1u32 << 30);
    format!("{v:.2} GiB")
}

fn mib(b: u64) -> String {
    #[allow(clippy::cast_precision_loss)]
    let v = b as f64 / f64::from(1u32 << 20);
    format!("{v:.0} MiB")
}

impl fmt::Display for SpinePlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.mode == "mapped" {
            return write!(f, "spine mapped from the shards ({})", gib(self.resident_bytes));
        }
        write!(
            f,
            "spine: {} of {} layers resident ({})",
            self.resident_layers,
            self.layers,
            gib(self.resident_bytes)
        )?;
        let streamed = self.layers - self.resident_layers;
        if streamed > 0 || !self.head_resident {
            write!(
                f,
                ", {streamed} streamed{} via {}×{} buffers ({} per pass)",
                if self.head_resident { "" } else { " and the lm_head" },
                self.buffers,
                mib(self.buffer_bytes),
                gib(self.streamed_bytes)
            )?;
        }
        if !self.embed_resident {
            write!(f, ", embedding rows read per pass")?;
        }
        Ok(())
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "memory plan: budget {}; {}; state {}; prefill chunk {} tokens ({} per pass{}); {}headroom {}{}; expert cache {} slots × {} = {} ({} of {} experts{})",
            gib(self.budget),
            self.spine,
            gib(self.needs.state),
            self.chunk,
            gib(self.work),
            self.serve_rule(),
            [
                (self.sessions, "conversation states"),
                (self.needs.state_cache, "prompt-state cache snapshots")
            ]
            .into_iter()
            .filter(|&(b, _)| b > 0)
            .map(|(b, what)| format!("{what} {}; ", gib(b)))
            .collect::<String>(),
            gib(self.needs.headroom),
            if self.needs.draft > 0 {
                format!("; draft model {}", gib(self.needs.draft))
            } else {
                String::new()
            },
            self.slots,
            gib(self.needs.slot),
            gib(self.slots * self.needs.slot),
            self.slots.min(self.needs.experts),
            self.needs.experts,
            if self.all_experts_resident { ", all resident" } else { ", the rest stream from disk" }
        )
    }
}

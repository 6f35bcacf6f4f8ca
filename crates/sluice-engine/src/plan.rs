//! The memory plan: from one budget (`--memory`), decide what is resident and how many routed
//! experts the cache holds, print it, and refuse clearly when the minimum does not fit.
//!
//! Charged: the spine (every non-expert tensor, resident), the sequence state for the context
//! the user asked for, I/O headroom, and the expert cache (whole slots). What is left after the
//! fixed charges becomes cache slots; fewer than `min_slots` is a refusal that says how much
//! more memory the run needs.

use serde::Serialize;
use std::fmt;

/// Parses a size such as `24G`, `512MiB`, `1.5GB`, `4096` (bytes). Suffixes are binary
/// (K = 1024) whether or not they carry an `i`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num.parse().map_err(|_| format!("{s:?} is not a size (try 24G, 512M, 1.5G)"))?;
    let mult: f64 =
        match unit.trim().to_ascii_lowercase().trim_end_matches('b').trim_end_matches('i') {
            "" => 1.0,
            "k" => 1024.0,
            "m" => 1024.0 * 1024.0,
            "g" => 1024.0 * 1024.0 * 1024.0,
            "t" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
            _ => return Err(format!("{s:?}: unknown size unit {unit:?}")),
        };
    let bytes = v * mult;
    #[allow(clippy::cast_precision_loss)]
    if !bytes.is_finite() || bytes < 1.0 || bytes > u64::MAX as f64 {
        return Err(format!("{s:?} is not a usable size"));
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(bytes as u64)
}

/// Memory this process may use: the smallest of physical memory and a cgroup limit (v1 or v2).
pub fn available_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        m.lines().find(|l| l.starts_with("MemTotal:")).and_then(|l| {
            l.split_whitespace().nth(1).and_then(|kb| kb.parse::<u64>().ok()).map(|kb| kb * 1024)
        })
    });
    let cgroup = cgroup_limit();
    match (meminfo, cgroup) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The memory limit of this process's own cgroup (v2 `memory.max` or v1
/// `memory.limit_in_bytes`, found through `/proc/self/cgroup`), if one is set.
fn cgroup_limit() -> Option<u64> {
    let groups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mut limits = Vec::new();
    for line in groups.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let path = path.trim_start_matches('/');
        let file = if controllers.is_empty() {
            format!("/sys/fs/cgroup/{path}/memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            format!("/sys/fs/cgroup/memory/{path}/memory.limit_in_bytes")
        } else {
            continue;
        };
        if let Some(v) =
            std::fs::read_to_string(file).ok().and_then(|s| s.trim().parse::<u64>().ok())
        {
            limits.push(v);
        }
    }
    limits.into_iter().min()
}

/// The default budget: 85% of [`available_memory`] minus 512 MiB of headroom for the OS.
pub fn default_budget() -> u64 {
    available_memory().map_or(8 << 30, |m| (m / 100 * 85).saturating_sub(512 << 20).max(256 << 20))
}

/// What a model needs, for planning.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Needs {
    /// Spine bytes (resident).
    pub spine: u64,
    /// Sequence-state bytes for the planned context.
    pub state: u64,
    /// Bytes of one expert-cache slot.
    pub slot: u64,
    /// Routed experts in the model.
    pub experts: u64,
    /// Fewest slots a pass can run with.
    pub min_slots: u64,
    /// Scratch and I/O buffers.
    pub headroom: u64,
    /// A draft model's weights, state and scratch (0 without one).
    #[serde(default)]
    pub draft: u64,
}

/// The residency plan.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    /// The budget.
    pub budget: u64,
    /// Inputs.
    pub needs: Needs,
    /// Expert-cache slots.
    pub slots: u64,
    /// Whether every expert fits in the cache.
    pub all_experts_resident: bool,
}

/// The budget cannot hold the minimum.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "memory budget of {budget} bytes is too small: the spine needs {spine}, sequence state {state}, \
     headroom {headroom}, the draft model {draft}, and at least {min_slots} expert slots of {slot} bytes; \
     the minimum is {minimum} bytes ({short} more). Raise --memory or use a smaller context."
)]
pub struct PlanError {
    /// The budget.
    pub budget: u64,
    /// Spine bytes.
    pub spine: u64,
    /// State bytes.
    pub state: u64,
    /// Headroom bytes.
    pub headroom: u64,
    /// Draft-model bytes.
    pub draft: u64,
    /// Minimum slots.
    pub min_slots: u64,
    /// Slot bytes.
    pub slot: u64,
    /// Minimum total.
    pub minimum: u64,
    /// Shortfall.
    pub short: u64,
}

impl Plan {
    /// Plans `needs` within `budget`.
    pub fn compute(budget: u64, needs: Needs) -> Result<Self, PlanError> {
        let fixed = needs.spine + needs.state + needs.headroom + needs.draft;
        let minimum = fixed + needs.min_slots * needs.slot;
        if budget < minimum {
            return Err(PlanError {
                budget,
                spine: needs.spine,
                state: needs.state,
                headroom: needs.headroom,
                draft: needs.draft,
                min_slots: needs.min_slots,
                slot: needs.slot,
                minimum,
                short: minimum - budget,
            });
        }
        let slots = ((budget - fixed) / needs.slot.max(1)).min(needs.experts.max(needs.min_slots));
        Ok(Self { budget, needs, slots, all_experts_resident: slots >= needs.experts })
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let g = |b: u64| {
            #[allow(clippy::cast_precision_loss)]
            let v = b as f64 / f64::from(1u32 << 30);
            format!("{v:.2} GiB")
        };
        write!(
            f,
            "memory plan: budget {}; spine {} resident; state {}; headroom {}; draft model {}; expert cache {} slots × {} = {} ({} of {} experts{})",
            g(self.budget),
            g(self.needs.spine),
            g(self.needs.state),
            g(self.needs.headroom),
            g(self.needs.draft),
            self.slots,
            g(self.needs.slot),
            g(self.slots * self.needs.slot),
            self.slots.min(self.needs.experts),
            self.needs.experts,
            if self.all_experts_resident { ", all resident" } else { ", the rest stream from disk" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("2K"), Ok(2048));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("6GB"), Ok(6 << 30));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("5X").is_err());
        assert!(parse_size("0").is_err());
    }

    #[test]
    fn plans_slots_and_refuses_with_the_shortfall() {
        let needs = Needs {
            spine: 1000,
            state: 100,
            slot: 50,
            experts: 64,
            min_slots: 4,
            headroom: 0,
            draft: 0,
        };
        let p = Plan::compute(2000, needs).expect("fits");
        assert_eq!(p.slots, 18);
        assert!(!p.all_experts_resident);
        let all = Plan::compute(1_000_000, needs).expect("fits");
        assert_eq!(all.slots, 64);
        let e = Plan::compute(1200, needs).expect_err("too small");
        assert_eq!(e.short, 100);
        assert!(e.to_string().contains("100 more"));
        let with_draft = Plan::compute(2000, Needs { draft: 500, ..needs }).expect("fits");
        assert_eq!(with_draft.slots, 8, "the draft's bytes come out of the expert cache");
        let e = Plan::compute(1300, Needs { draft: 100, ..needs }).expect_err("too small");
        assert!(e.to_string().contains("the draft model 100"), "{e}");
    }
}

//! The memory budget: one number the user states (`--memory`), charged for every large
//! allocation (resident spine, expert arena, stream buffers, sequence state). A charge that
//! does not fit is refused with the amounts, so the caller can say what would not fit.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A charge was refused because it would exceed the budget.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "memory budget exceeded: {what} needs {requested} bytes but only {available} of {limit} remain"
)]
pub struct BudgetError {
    /// What the memory was for.
    pub what: String,
    /// Bytes asked for.
    pub requested: u64,
    /// Bytes still free in the budget.
    pub available: u64,
    /// The whole budget.
    pub limit: u64,
}

/// A shared, thread-safe byte budget.
#[derive(Debug, Clone)]
pub struct MemoryBudget {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    limit: u64,
    used: AtomicU64,
    peak: AtomicU64,
}

/// Bytes charged to a [`MemoryBudget`]; they are returned when this is dropped.
#[derive(Debug)]
pub struct Charge {
    budget: MemoryBudget,
    bytes: u64,
}

impl Charge {
    /// Bytes held by this charge.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.inner.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

impl MemoryBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: u64) -> Self {
        Self { inner: Arc::new(Inner { limit, used: AtomicU64::new(0), peak: AtomicU64::new(0) }) }
    }

    /// A budget that never refuses (used when no limit was asked for).
    pub fn unlimited() -> Self {
        Self::new(u64::MAX)
    }

    /// The whole budget in bytes.
    pub fn limit(&self) -> u64 {
        self.inner.limit
    }

    /// Bytes currently charged.
    pub fn used(&self) -> u64 {
        self.inner.used.load(Ordering::Acquire)
    }

    /// The most bytes ever charged at once.
    pub fn peak(&self) -> u64 {
        self.inner.peak.load(Ordering::Acquire)
    }

    /// Charges `bytes` for `what`, or refuses without charging anything.
    pub fn charge(&self, what: &str, bytes: u64) -> Result<Charge, BudgetError> {
        let mut cur = self.inner.used.load(Ordering::Acquire);
        loop {
            let next = cur.checked_add(bytes).filter(|n| *n <= self.inner.limit);
            let Some(next) = next else {
                return Err(BudgetError {
                    what: what.to_string(),
                    requested: bytes,
                    available: self.inner.limit.saturating_sub(cur),
                    limit: self.inner.limit,
                });
            };
            match self.inner.used.compare_exchange_weak(
                cur,
                next,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    self.inner.peak.fetch_max(next, Ordering::AcqRel);
                    return Ok(Charge { budget: self.clone(), bytes });
                }
                Err(actual) => cur = actual,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_are_refused_past_the_limit_and_returned_on_drop() {
        let b = MemoryBudget::new(100);
        let a = b.charge("a", 60).expect("fits");
        let err = b.charge("b", 50).expect_err("must not fit");
        assert_eq!(err.available, 40);
        assert!(err.to_string().contains("b needs 50 bytes"));
        drop(a);
        assert_eq!(b.used(), 0);
        assert_eq!(b.peak(), 60);
        let _c = b.charge("c", 100).expect("fits after release");
    }
}

//! The slab arena behind the expert cache: one allocation of `slots × slot_bytes`, aligned to
//! [`ALIGN`] so every slot (and every region inside a slot, see [`crate::index`]) is a valid
//! O_DIRECT buffer. It is allocated once at open, zeroed lazily by the operating system (pages
//! become resident only when a read fills them), and never grows.
//!
//! The arena hands out raw slot memory; who may touch which slot when is the cache's state
//! machine ([`crate::cache`]): a slot is written only by the one read job that owns it while it
//! is *reading*, and read only while it is *ready* and pinned.

use crate::index::ALIGN;
use crate::StoreError;
use std::alloc::Layout;
use std::ptr::NonNull;

/// `slots` fixed-size, aligned byte buffers in one allocation.
#[derive(Debug)]
pub struct Arena {
    ptr: NonNull<u8>,
    layout: Layout,
    slot_bytes: usize,
    slots: usize,
}

// SAFETY: the arena owns its allocation; it is plain bytes with no thread affinity. Concurrent
// access to the bytes goes through the `unsafe` accessors, whose callers uphold exclusivity.
unsafe impl Send for Arena {}
// SAFETY: shared references only expose raw pointers and the `unsafe` accessors below; the
// callers' contract (one writer xor many readers per slot) makes concurrent use sound.
unsafe impl Sync for Arena {}

impl Arena {
    /// Allocates `slots` slots of `slot_bytes` bytes (a positive multiple of [`ALIGN`]).
    pub fn new(slots: usize, slot_bytes: u64) -> Result<Self, StoreError> {
        let bad =
            |what: &str| StoreError::Config(format!("arena of {slots} × {slot_bytes}: {what}"));
        if slots == 0 || slot_bytes == 0 || !slot_bytes.is_multiple_of(ALIGN) {
            return Err(bad("needs at least one slot of a positive multiple of 4096 bytes"));
        }
        let slot = usize::try_from(slot_bytes).map_err(|_| bad("slot too large"))?;
        let total = slot.checked_mul(slots).ok_or_else(|| bad("size overflows"))?;
        let align = usize::try_from(ALIGN).map_err(|_| bad("alignment"))?;
        let layout = Layout::from_size_align(total, align).map_err(|_| bad("bad layout"))?;
        // SAFETY: `layout` has a non-zero size (slots ≥ 1, slot ≥ 4096) and a power-of-two
        // alignment, as `alloc_zeroed` requires.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or(StoreError::Alloc { bytes: total as u64 })?;
        Ok(Self { ptr, layout, slot_bytes: slot, slots })
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Bytes per slot.
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Bytes of the whole arena.
    pub fn bytes(&self) -> usize {
        self.layout.size()
    }

    /// Start of slot `i`.
    ///
    /// # Panics
    ///
    /// If `i` is not a slot index.
    fn slot_ptr(&self, i: usize) -> *mut u8 {
        assert!(i < self.slots, "slot {i} out of {} slots", self.slots);
        // SAFETY: `i < slots`, so `i * slot_bytes` is inside the allocation of
        // `slots * slot_bytes` bytes (which did not overflow at construction).
        unsafe { self.ptr.as_ptr().add(i * self.slot_bytes) }
    }

    /// Slot `i` for reading.
    ///
    /// # Safety
    ///
    /// No one may write slot `i` while the returned slice lives (the cache guarantees this for
    /// a ready slot that the caller has pinned).
    ///
    /// # Panics
    ///
    /// If `i` is not a slot index.
    pub unsafe fn slot(&self, i: usize) -> &[u8] {
        let p = self.slot_ptr(i);
        // SAFETY: `p` points at `slot_bytes` initialised (zeroed or written) bytes inside the
        // allocation, which lives as long as `self`; the caller rules out concurrent writers.
        unsafe { std::slice::from_raw_parts(p, self.slot_bytes) }
    }

    /// Slot `i` for writing.
    ///
    /// # Safety
    ///
    /// The caller must be the only one accessing slot `i` (reading or writing) while the
    /// returned slice lives (the cache guarantees this to the read job of a reading slot).
    ///
    /// # Panics
    ///
    /// If `i` is not a slot index.
    #[allow(clippy::mut_from_ref)] // Exclusivity per slot is the caller's contract, documented above.
    pub unsafe fn slot_mut(&self, i: usize) -> &mut [u8] {
        let p = self.slot_ptr(i);
        // SAFETY: as in `slot`, and the caller guarantees exclusive access to this slot, so no
        // other reference to these bytes exists while the slice lives.
        unsafe { std::slice::from_raw_parts_mut(p, self.slot_bytes) }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `alloc_zeroed(self.layout)` and is freed exactly once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_aligned_and_disjoint() {
        let a = Arena::new(3, 8192).expect("allocates");
        for i in 0..3 {
            // SAFETY: this test is the only user of the arena.
            let s = unsafe { a.slot_mut(i) };
            assert_eq!(s.as_ptr() as usize % 4096, 0);
            s.fill(u8::try_from(i).expect("small"));
        }
        for i in 0..3 {
            // SAFETY: no writer is alive.
            let s = unsafe { a.slot(i) };
            assert!(s.iter().all(|&b| usize::from(b) == i));
        }
        assert_eq!(a.bytes(), 3 * 8192);
    }

    #[test]
    fn unaligned_or_empty_arenas_are_refused() {
        assert!(Arena::new(0, 4096).is_err());
        assert!(Arena::new(1, 100).is_err());
    }
}

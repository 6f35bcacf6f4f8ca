//! The shape of a model's state snapshots without a state: `Model::state_shape` equals the
//! shape of a fresh state for every family, and for Kimi K3 it is derived from the
//! configuration. The on-disk state cache used to build a whole fresh state at start-up only
//! to learn its shape (a Kimi K3 state: 0.9 GB of KDA states and their working copies).
//!
//! Allocations are counted per thread by this test binary's allocator, so tests running in
//! parallel do not count each other's.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use sluice_checkpoint::Checkpoint;
use sluice_models::Model;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;

/// The system allocator, counting the bytes each thread allocates.
struct Counting;

thread_local! {
    static ALLOCATED: Cell<usize> = const { Cell::new(0) };
}

fn count(bytes: usize) {
    // `try_with`: the counter may already be gone while a thread is being torn down.
    let _ = ALLOCATED.try_with(|a| a.set(a.get() + bytes));
}

// SAFETY: every call is forwarded unchanged to the system allocator; the counter only reads
// the requested size.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: the caller's contract for `alloc` is passed on as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with `layout` (every path above forwards).
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        // SAFETY: as for `dealloc`; `new_size` is the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Bytes this thread allocated while running `f`, and its result.
fn allocated<T>(f: impl FnOnce() -> T) -> (usize, T) {
    let before = ALLOCATED.with(Cell::get);
    let out = f();
    (ALLOCATED.with(Cell::get) - before, out)
}

fn load(family: &str, name: &str) -> Model {
    let ckpt = Arc::new(Checkpoint::open(&common::fixture_of(family, name)).unwrap());
    sluice_models::load(ckpt).unwrap()
}

#[test]
fn the_state_shape_is_a_fresh_states_shape_for_every_family() {
    for family in ["kimi_k3", "qwen3", "qwen3_moe", "gpt_oss", "deepseek_v3"] {
        for name in ["tiny-a", "tiny-b"] {
            let m = load(family, name);
            let fresh = m.new_state();
            let shape = m.state_shape();
            assert_eq!(shape, fresh.shape(), "{family}/{name}");
            assert_eq!(shape.fixed_bytes(), fresh.snapshot_bytes(), "{family}/{name}");
        }
    }
}

#[test]
fn state_cache_open_built_a_whole_state_to_learn_its_shape() {
    for name in ["tiny-a", "tiny-b"] {
        let m = load("kimi_k3", name);
        let (fresh_bytes, fresh) = allocated(|| m.new_state());
        let fixed = fresh.shape().fixed_bytes();
        assert!(
            fixed > 0 && fresh_bytes >= 2 * fixed,
            "{name}: a fresh state holds its KDA states twice"
        );
        let (bytes, shape) = allocated(|| m.state_shape());
        assert_eq!(shape, fresh.shape(), "{name}");
        // A list of layer shapes, not the states: well under one layer's recurrent matrix.
        assert!(
            bytes < fixed / 8,
            "{name}: learning the shape allocated {bytes} bytes (state: {fixed})"
        );
    }
}

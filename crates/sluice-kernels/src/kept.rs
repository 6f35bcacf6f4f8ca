//! Buffers a thread keeps for its life: the kernels' scratch (the wide nest's tiles, the blocked
//! weighted sums' widened weights, a model's widened weight rows) made once per thread instead
//! of once per call, whose first-touch page faults and zero fill would otherwise cost more than
//! some of the calls.
//!
//! A call that runs while its thread's buffer is already lent (a callback that calls back into
//! the kernels) or while the thread is being torn down gets a fresh buffer instead: never a
//! panic, never a shared one.

use std::cell::RefCell;
use std::thread::LocalKey;

/// Runs `f` on this thread's value of `key`, or on `fresh()` if that value is already lent to
/// an outer call or the thread is being torn down.
pub fn with_kept<T: 'static, R>(
    key: &'static LocalKey<RefCell<T>>,
    fresh: impl FnOnce() -> T,
    f: impl FnOnce(&mut T) -> R,
) -> R {
    let mut f = Some(f);
    let kept = key.try_with(|cell| {
        let mut value = cell.try_borrow_mut().ok()?;
        f.take().map(|f| f(&mut value))
    });
    match (kept, f) {
        (Ok(Some(r)), _) => r,
        (_, Some(f)) => f(&mut fresh()),
        (_, None) => unreachable!("invariant: f ran or is still here"),
    }
}

/// Runs `f` on the first `len` values of this thread's vector `key`, grown (never shrunk, never
/// cleared) to hold them: what they hold is left from an earlier call, so `f` writes every
/// value before it reads it.
pub fn with_kept_slice<T: Copy + Default + 'static, R>(
    key: &'static LocalKey<RefCell<Vec<T>>>,
    len: usize,
    f: impl FnOnce(&mut [T]) -> R,
) -> R {
    with_kept(key, Vec::new, |buf| {
        if buf.len() < len {
            buf.resize(len, T::default());
        }
        f(&mut buf[..len])
    })
}

/// Takes this thread's value of `key` out of it (leaving the default; the default as well if
/// the value is lent or the thread is being torn down), for a body that must not run inside a
/// closure (the kernels' tier bodies: a closure is compiled without the tier's features); hand
/// it back with [`give_back`].
pub fn take<T: Default + 'static>(key: &'static LocalKey<RefCell<T>>) -> T {
    key.try_with(|cell| cell.try_borrow_mut().map(|mut v| std::mem::take(&mut *v)).ok())
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// Puts `value` back as this thread's value of `key` (dropped if the thread is being torn down
/// or the value is lent).
pub fn give_back<T: 'static>(key: &'static LocalKey<RefCell<T>>, value: T) {
    let _ = key.try_with(|cell| {
        if let Ok(mut v) = cell.try_borrow_mut() {
            *v = value;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        static KEPT: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
    }

    #[test]
    fn a_kept_slice_is_the_same_buffer_call_after_call_and_only_grows() {
        let first = with_kept_slice(&KEPT, 64, |s| {
            s.fill(7);
            s.as_ptr() as usize
        });
        // A shorter call reuses the buffer and sees what the longer one left.
        let (again, left) = with_kept_slice(&KEPT, 16, |s| (s.as_ptr() as usize, s[15]));
        assert_eq!((again, left), (first, 7));
        assert_eq!(KEPT.with(|k| k.borrow().len()), 64);
    }

    #[test]
    fn a_taken_buffer_comes_back_with_its_storage() {
        give_back(&KEPT, vec![3u32; 40]);
        let v = take(&KEPT);
        assert_eq!((v.len(), KEPT.with(|k| k.borrow().len())), (40, 0), "taken out");
        let at = v.as_ptr() as usize;
        give_back(&KEPT, v);
        let again = take(&KEPT);
        assert_eq!(again.as_ptr() as usize, at, "the same storage");
    }

    #[test]
    fn a_call_inside_a_call_gets_a_fresh_buffer_not_a_panic() {
        let (outer, inner) = with_kept_slice(&KEPT, 8, |o| {
            o.fill(1);
            let inner = with_kept_slice(&KEPT, 8, |i| i.iter().sum::<u32>());
            (o.iter().sum::<u32>(), inner)
        });
        assert_eq!((outer, inner), (8, 0));
    }
}

//! The tiers' defaults for folding a format's stored rows: decode a span into a stack buffer
//! ([`Kernel::decode`]), then fold the widened copy ([`Kernel::fold`]), [`CHUNK`] columns at
//! a time. Exact on every tier (the fold is the one every path takes); a tier's fused code
//! replaces them where it keeps the widened weights in registers.

use crate::formats::Format;
use crate::tiled::{Kernel, Lanes, CHUNK};

/// [`Kernel::fold_one`] by `decode` into a buffer and `fold`, [`CHUNK`] columns at a time:
/// the default, and the fallback of tiers whose fused code covers only common cases.
///
/// # Safety
/// The running CPU supports the tier `K`; `c0` and `x.len()` suit [`Kernel::fold_one`].
pub(crate) unsafe fn fold_one_buffered<K: Kernel + ?Sized, F: Format, const R: usize>(
    rows: [F::Row<'_>; R],
    c0: usize,
    x: &[f32],
    mut acc: [&mut Lanes; R],
) {
    let mut buf = [[0.0f32; CHUNK]; R];
    for (k, xs) in x.chunks(CHUNK).enumerate() {
        for (b, &row) in buf.iter_mut().zip(&rows) {
            // SAFETY: the caller guarantees the tier and the span.
            unsafe { K::decode::<F>(row, c0 + k * CHUNK, &mut b[..xs.len()]) };
        }
        let ws: [&[f32]; R] = std::array::from_fn(|r| &buf[r][..xs.len()]);
        let mut it = acc.iter_mut();
        let a: [&mut [Lanes; 1]; R] = std::array::from_fn(|_| {
            std::array::from_mut(&mut **it.next().expect("invariant: R accumulators"))
        });
        // SAFETY: the caller guarantees the tier.
        unsafe { K::fold(ws, [xs], a) };
    }
}

/// [`Kernel::fold_stored`] by `decode` into a buffer and `fold`, [`CHUNK`] columns at a time:
/// the default, exact on every tier.
///
/// # Safety
/// The running CPU supports the tier `K`; `c0` and the span suit [`Kernel::fold_stored`].
pub(crate) unsafe fn fold_stored_buffered<
    K: Kernel + ?Sized,
    F: Format,
    const R: usize,
    const N: usize,
>(
    rows: [F::Row<'_>; R],
    c0: usize,
    x: [&[f32]; N],
    mut acc: [&mut [Lanes; N]; R],
) {
    let len = x.first().map_or(0, |s| s.len());
    let mut buf = [[0.0f32; CHUNK]; R];
    for k in (0..len).step_by(CHUNK) {
        let n = CHUNK.min(len - k);
        for (b, &row) in buf.iter_mut().zip(&rows) {
            // SAFETY: the caller guarantees the tier and the span.
            unsafe { K::decode::<F>(row, c0 + k, &mut b[..n]) };
        }
        let ws: [&[f32]; R] = std::array::from_fn(|r| &buf[r][..n]);
        let xs: [&[f32]; N] = std::array::from_fn(|j| &x[j][k..k + n]);
        let mut it = acc.iter_mut();
        let a: [&mut [Lanes; N]; R] =
            std::array::from_fn(|_| &mut **it.next().expect("invariant: R rows of accumulators"));
        // SAFETY: the caller guarantees the tier.
        unsafe { K::fold(ws, xs, a) };
    }
}

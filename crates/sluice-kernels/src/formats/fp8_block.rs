//! FP8 weights with 128 × 128 block scales, as DeepSeek-V3/R1, Kimi K2 Instruct and the
//! official Qwen3 `-FP8` checkpoints publish them: `weight` `float8_e4m3fn` `[rows, cols]` and
//! `weight_scale_inv` F32 `[ceil(rows/128), ceil(cols/128)]`; element `(r, c)` is
//! `f32(e4m3) · s[r/128][c/128]`, one f32 multiplication rounded once (what DeepSeek's
//! `weight_dequant` and `w.float() * s` compute, so a reference that dequantizes to f32 sees the
//! same values). Partial blocks work along both axes: neither `rows` nor `cols` need be a
//! multiple of 128.
//!
//! **e4m3fn**: sign, 4 exponent bits (bias 7), 3 mantissa bits, no infinities; exponent 0 is
//! subnormal (`m · 2^-9`). The two NaN codes (`0x7F`, `0xFF`) decode to the canonical quiet NaN
//! `0x7FC0_0000` (sign dropped) on every tier, so a NaN weight makes its output NaN, as the
//! dequantized reference would; no finite code is ever decoded as NaN. Code `0x80` is −0.0.
//!
//! **SIMD decode, x86** (AVX2 with F16C, AVX-512): each code becomes the IEEE half with the
//! same sign, exponent and mantissa bits (sign-extend to 16 bits, shift left by 7, clear bit 14),
//! which is `e4m3 · 2^-8` exactly, subnormal codes included (e4m3's and f16's subnormals line up);
//! the hardware half → single conversion widens it to an f32 that is always normal, and NaN
//! codes (the only ones that widen to ±1.875) are blended to the canonical NaN — in the
//! register kernels only in a span that holds one, since published checkpoints hold none
//! (`fp8_block_x86.rs` says how each tier knows). The earlier
//! decode put the bits straight into an f32 (`e4m3 · 2^-120`), which made every subnormal code
//! an f32 subnormal: Intel cores take a microcode assist on each multiplication with one (the
//! FP8 kernels ran 7× slower per thread on a Xeon than on Zen 4). One multiplication by the
//! block's scale times `2^8` then rounds as the reference does: the same real product, so the
//! same rounding, as long as `s · 2^8` is finite (|s| < 2^120 — a span with a larger finite
//! scale takes the buffered two-multiplication decode). **NEON** keeps the bit-placement
//! decode (`e4m3 · 2^-120`, one multiplication by `2^120`): Arm cores handle subnormals at full
//! speed. Spans start at a
//! multiple of 16 columns, so every 8 or 16 columns share one block scale.

use super::{check_len, check_scales, Format, WeightFormat};
use crate::matmul::Matrix;
#[cfg(target_arch = "x86_64")]
use crate::tiled::Lanes;
use crate::KernelError;

/// Rows and columns of one scale block.
pub(crate) const BLOCK_EDGE: usize = 128;

/// The FP8 block-scaled format.
pub(crate) struct Fp8Block;

/// One FP8 row: its codes and the f32 scales of its row of blocks.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fp8Row<'a> {
    /// One e4m3 code per column.
    codes: &'a [u8],
    /// `ceil(cols/128)` little-endian f32 scales.
    scales: &'a [u8],
}

impl Fp8Row<'_> {
    /// The scale of 128-column block `b`.
    #[inline]
    fn scale(&self, b: usize) -> f32 {
        let s = &self.scales[4 * b..4 * b + 4];
        f32::from_le_bytes([s[0], s[1], s[2], s[3]])
    }
}

/// The f32 pattern of an e4m3fn code (see the module docs).
const fn e4m3_bits(code: u8) -> u32 {
    let sign = ((code >> 7) as u32) << 31;
    let e = ((code >> 3) & 15) as u32;
    let m = (code & 7) as u32;
    if e == 15 && m == 7 {
        return 0x7FC0_0000;
    }
    if e == 0 {
        if m == 0 {
            return sign;
        }
        // m · 2^-9 with m in 1..=7: normalise on m's leading bit p.
        let p = 31 - m.leading_zeros();
        return sign | ((118 + p) << 23) | ((m - (1 << p)) << (23 - p));
    }
    sign | ((e + 120) << 23) | (m << 20)
}

/// e4m3fn code → value (see the module docs for NaN and −0.0).
pub const E4M3: [f32; 256] = {
    let mut t = [0.0f32; 256];
    let mut code: u8 = 0;
    loop {
        t[code as usize] = f32::from_bits(e4m3_bits(code));
        if code == u8::MAX {
            break;
        }
        code += 1;
    }
    t
};

/// e4m3fn code → f32 value ([`E4M3`]).
#[inline]
pub fn e4m3_to_f32(code: u8) -> f32 {
    E4M3[usize::from(code)]
}

impl<'a> Matrix<'a> {
    /// An FP8 matrix with 128 × 128 block scales: `data` is `[rows, cols]` e4m3fn codes,
    /// `scales` is `weight_scale_inv`, `[ceil(rows/128), ceil(cols/128)]` little-endian f32. A
    /// scale buffer of any other size is refused with [`KernelError::ScaleShape`].
    pub fn fp8_block(
        rows: usize,
        cols: usize,
        data: &'a [u8],
        scales: &'a [u8],
    ) -> Result<Self, KernelError> {
        let f = WeightFormat::Fp8Block;
        check_len("e4m3 values", rows, cols, f, rows * cols, data.len())?;
        check_scales(f, rows, cols, 4, scales.len())?;
        Ok(Self { rows, cols, format: f, data, scales })
    }
}

impl Format for Fp8Block {
    const TIER_WIDENS: bool = true;

    type Row<'a> = Fp8Row<'a>;

    #[inline(always)]
    fn row<'a>(m: &Matrix<'a>, r: usize) -> Fp8Row<'a> {
        let per = 4 * m.cols.div_ceil(BLOCK_EDGE);
        let b = r / BLOCK_EDGE;
        Fp8Row {
            codes: &m.data[r * m.cols..(r + 1) * m.cols],
            scales: &m.scales[b * per..(b + 1) * per],
        }
    }

    fn widen(row: Fp8Row<'_>, c0: usize, out: &mut [f32]) {
        // Block by block, the block's scale read once (per value, its index and bounds checks
        // took more time than the product when a pass widened kv_b_proj).
        let codes = &row.codes[c0..c0 + out.len()];
        let mut done = 0;
        while done < out.len() {
            let c = c0 + done;
            let n = (BLOCK_EDGE - c % BLOCK_EDGE).min(out.len() - done);
            let s = row.scale(c / BLOCK_EDGE);
            for (o, &code) in out[done..done + n].iter_mut().zip(&codes[done..done + n]) {
                *o = E4M3[usize::from(code)] * s;
            }
            done += n;
        }
    }

    fn row_bytes(row: Fp8Row<'_>) -> usize {
        row.codes.len()
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn avx2_decode(row: Fp8Row<'_>, c0: usize, out: &mut [f32]) {
        assert!(c0.is_multiple_of(16), "fp8 span");
        let n = out.len();
        let full = n - n % 8;
        let consts = x86::Consts::new();
        for i in (0..full).step_by(8) {
            let c = c0 + i;
            let s = row.scale(c / BLOCK_EDGE);
            let v = x86::decode8(&consts, &row.codes[c..c + 8], s);
            // SAFETY: `i + 8 <= n = out.len()`.
            unsafe { core::arch::x86_64::_mm256_storeu_ps(out.as_mut_ptr().add(i), v) };
        }
        Self::widen(row, c0 + full, &mut out[full..]);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn avx512_decode(row: Fp8Row<'_>, c0: usize, out: &mut [f32]) {
        assert!(c0.is_multiple_of(16), "fp8 span");
        let n = out.len();
        let full = n - n % 16;
        let consts = x86::Consts512::new();
        for i in (0..full).step_by(16) {
            let c = c0 + i;
            let v = x86::decode16(&consts, &row.codes[c..c + 16], row.scale(c / BLOCK_EDGE));
            // SAFETY: `i + 16 <= n = out.len()`.
            unsafe { core::arch::x86_64::_mm512_storeu_ps(out.as_mut_ptr().add(i), v) };
        }
        Self::widen(row, c0 + full, &mut out[full..]);
    }

    #[cfg(target_arch = "aarch64")]
    #[target_feature(enable = "neon")]
    unsafe fn neon_decode(row: Fp8Row<'_>, c0: usize, out: &mut [f32]) {
        assert!(c0.is_multiple_of(16), "fp8 span");
        let n = out.len();
        let full = n - n % 8;
        for i in (0..full).step_by(8) {
            let c = c0 + i;
            let v = neon::decode8(&row.codes[c..c + 8], row.scale(c / BLOCK_EDGE));
            // SAFETY: `i + 8 <= n = out.len()`.
            unsafe {
                use core::arch::aarch64::vst1q_f32;
                vst1q_f32(out.as_mut_ptr().add(i), v[0]);
                vst1q_f32(out.as_mut_ptr().add(i + 4), v[1]);
            }
        }
        Self::widen(row, c0 + full, &mut out[full..]);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn avx2_fold_one<const R: usize>(
        rows: [Fp8Row<'_>; R],
        c0: usize,
        x: &[f32],
        acc: [&mut Lanes; R],
    ) {
        x86::fold_one_avx2(rows, c0, x, acc);
    }

    /// Calls of up to this many activation rows fold FP8 rows from their stored codes on AVX2
    /// ([`crate::stored`]); more take the buffered nest or the panel. A layer of 32 experts of
    /// 2,048 × 7,168 from memory, 2 threads (`SLUICE_ISA=avx2 layer_batch 2 32 T 2048 7168 3
    /// fp8`, Zen 5, 2 rounds, session 39) against the buffered nest: 2 / 3 / 4 rows
    /// 1.93–1.99 / 1.64–1.76 / 1.13–1.16×. Session 40 (the tile unmasked and widening 16
    /// codes at once), against a cap of 4: 5 / 6 rows 1.28–1.31 / 1.22–1.24×, 8 rows
    /// 1.05–1.10×, 10 / 12 rows 0.85 / 0.80× (tiles of 2 or 3 tokens widen the codes again
    /// for each); on a matrix the L3 holds (`batch_cpu`) 5 / 6 rows 1.00 / 1.07×, 8 rows 0.92×.
    #[cfg(target_arch = "x86_64")]
    const AVX2_TILE_ROWS: usize = 6;

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn avx2_tile<const R: usize, const N: usize>(
        rows: [Fp8Row<'_>; R],
        c0: usize,
        x: [&[f32]; N],
        acc: [&mut [Lanes; N]; R],
        ahead: usize,
    ) {
        x86::tile_avx2(rows, c0, x, acc, ahead);
    }

    /// Calls of up to this many activation rows fold FP8 rows from their stored codes on
    /// AVX-512 ([`crate::stored`]); more take the panel. A layer of 32 experts of 2,048 ×
    /// 7,168 from memory, 2 threads (`layer_batch 2 32 T 2048 7168 5 fp8`, Zen 5, 2 rounds,
    /// session 39) against the buffered nest and the panel: 3 to 6 rows 2.0–2.3×, 7 / 8 rows
    /// 1.36–1.39 / 1.24–1.40×, 10 rows 1.09–1.16×, 12 rows 1.03–1.09×, 14 / 16 rows
    /// 0.97–1.00 / 0.96×. (On a matrix the L3 holds, 7 and 8 rows are 0.88–0.96×: two token
    /// groups each widen the codes again where the buffered nest widens them once.)
    #[cfg(target_arch = "x86_64")]
    const AVX512_TILE_ROWS: usize = 12;

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn avx512_tile<const R: usize, const N: usize>(
        rows: [Fp8Row<'_>; R],
        c0: usize,
        x: [&[f32]; N],
        acc: [&mut [Lanes; N]; R],
        ahead: usize,
    ) {
        x86::tile_avx512(rows, c0, x, acc, ahead);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn avx512_fold_one<const R: usize>(
        rows: [Fp8Row<'_>; R],
        c0: usize,
        x: &[f32],
        acc: [&mut Lanes; R],
    ) {
        x86::fold_one_avx512(rows, c0, x, acc);
    }
}

#[cfg(target_arch = "x86_64")]
#[path = "fp8_block_x86.rs"]
mod x86;

#[cfg(target_arch = "aarch64")]
mod neon {
    use core::arch::aarch64::*;

    /// Eight codes → their values times `scale`, in two registers (see the module docs).
    #[target_feature(enable = "neon")]
    #[inline]
    pub(super) fn decode8(codes: &[u8], scale: f32) -> [float32x4_t; 2] {
        assert!(codes.len() == 8);
        // SAFETY: `codes` is 8 bytes (asserted).
        let raw = unsafe { vld1_s8(codes.as_ptr().cast()) };
        let w = vmovl_s8(raw);
        let fields = vdupq_n_u32(0x87F0_0000);
        let nan_code = vdupq_n_u32(0x07F0_0000);
        let two_120 = vdupq_n_f32(f32::from_bits((127 + 120) << 23));
        let nan = vdupq_n_f32(f32::from_bits(0x7FC0_0000));
        let s = vdupq_n_f32(scale);
        [vmovl_s16(vget_low_s16(w)), vmovl_high_s16(w)].map(|q| {
            let bits = vandq_u32(vshlq_n_u32::<20>(vreinterpretq_u32_s32(q)), fields);
            let v = vmulq_f32(vreinterpretq_f32_u32(bits), two_120);
            let is_nan = vceqq_u32(vandq_u32(bits, nan_code), nan_code);
            vmulq_f32(vbslq_f32(is_nan, nan, v), s)
        })
    }
}

//! Compute kernels for sluice. Activations are f32; weights stay in their stored format
//! (f32, bf16, MXFP4, row-int8, FP8 with 128 × 128 block scales, INT4 in groups of 32; one file
//! each under [`formats`]) and are widened inside the kernel.
//!
//! **Batch invariance.** Every dot product is reduced in one canonical order (see
//! [`matmul`](mod@matmul)): the result for one (output row, input row) pair never depends on how many
//! rows are in the call, how many threads run, or which ISA tier is selected. A T-row
//! verification pass therefore gives bit-for-bit the logits of T single-row passes.

mod arch;
mod buffered;
mod cuts;
pub mod finish;
pub mod formats;
pub mod isa;
pub mod kept;
pub mod latent;
pub mod lines;
pub mod many;
pub mod matmul;
pub mod ops;
#[cfg(target_arch = "x86_64")]
mod outer;
#[cfg(target_arch = "x86_64")]
mod outer_avx2;
#[cfg(target_arch = "x86_64")]
mod outer_avx512;
// Only the AVX-512 and AVX2 tiers pack (x86-64): elsewhere the calls carry no pack and most of
// it is unused.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
mod packed;
pub mod pool;
pub mod probe;
mod reduce;
pub mod selftest;
mod stored;
mod sweep;
mod tiled;
mod wide;

pub use finish::{add_weighted, matmul_add_rows, matmul_pair, matmul_then, Target};
pub use isa::{isa, Isa, IsaError};
pub use lines::LineVec;
pub use many::{
    add_rows_many, matmul_many, matmul_pair_many, matmul_then_many, AddRows, Job, ManyFinish,
    PairJob, ThenJob,
};
pub use matmul::{matmul, matmul_with, Matrix, WeightFormat};
pub use packed::{pack_buffers, pool_scratch_bytes, PACK_BYTES};
pub use pool::{Pool, PoolBusy};
pub use wide::WIDE_SCRATCH_BYTES;

/// Makes every thread of `pool` hold what its first call of more than eight activation rows
/// keeps for the thread's life (the wide nest's scratch, [`WIDE_SCRATCH_BYTES`]), by running
/// one such call, a tiny one, on each thread ([`Pool::on_every_thread`]), and makes the
/// pool's own pack buffers where the tier packs a prefill's activations
/// ([`pool_scratch_bytes`]). After it, the first prefill-sized pass allocates no more than
/// later ones do, whichever threads its row chunks reach. What is made already is not made
/// again.
///
/// # Errors
/// [`PoolBusy`] if `pool` is running another call (nothing has been reserved then).
pub fn reserve_scratch(pool: &Pool) -> Result<(), PoolBusy> {
    pool.on_every_thread(&|_| {
        // One weight row of 16 columns against TOKEN_BLOCK + 1 activation rows: too little
        // work to be split over the pool, so it runs on this thread, in the wide nest.
        const COLS: usize = 16;
        const T: usize = tiled::TOKEN_BLOCK + 1;
        let w = [0u8; COLS * 4];
        let m = Matrix::f32(1, COLS, &w).expect("invariant: 16 f32 are a 1 × 16 matrix");
        let x = [0.0f32; T * COLS];
        let mut out = [0.0f32; T];
        matmul(&m, &x, T, &mut out);
    })?;
    pool.pack_buf().reserve(isa());
    Ok(())
}

/// Errors from constructing kernel operands.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KernelError {
    /// The byte length of a weight buffer does not match its declared shape and format.
    #[error("{what}: expected {expected} bytes for a {rows}x{cols} {format} matrix, got {got}")]
    Length {
        /// Which buffer (weights, packed nibbles, scales).
        what: &'static str,
        /// Declared output rows.
        rows: usize,
        /// Declared input columns.
        cols: usize,
        /// Weight format.
        format: &'static str,
        /// Expected byte length.
        expected: usize,
        /// Actual byte length.
        got: usize,
    },
    /// MXFP4 needs the input width to be a multiple of the 32-element block.
    #[error("MXFP4 matrix width {cols} is not a multiple of 32")]
    BlockWidth {
        /// Declared input columns.
        cols: usize,
    },
    /// A format whose groups run along the input needs the width to be a whole number of them.
    #[error("{format} matrix width {cols} is not a multiple of its {group}-column group")]
    GroupWidth {
        /// Weight format.
        format: &'static str,
        /// Declared input columns.
        cols: usize,
        /// Columns per group.
        group: usize,
    },
    /// A scale tensor whose shape contradicts its weight's shape.
    #[error("{format} scales of a {rows}x{cols} weight must have shape {expected:?}, got {got}")]
    ScaleShape {
        /// Weight format.
        format: &'static str,
        /// Declared output rows of the weight.
        rows: usize,
        /// Declared input columns of the weight.
        cols: usize,
        /// The scale shape the weight shape implies.
        expected: [usize; 2],
        /// What was given: a declared shape, or a byte length.
        got: String,
    },
}

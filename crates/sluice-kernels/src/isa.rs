//! Runtime selection of the SIMD tier the kernels run on.
//!
//! The tier is detected once per process from the running CPU (never from compile-time
//! `target-cpu` flags, so one binary runs on every machine of its architecture). The
//! environment variable `SLUICE_ISA=scalar|avx2|avx512|neon` forces a tier, so CI can run
//! the whole suite on each one; a forced tier the CPU lacks is refused and detection decides
//! instead. Tests that want every tier in one process call [`crate::matmul::matmul_with`]
//! with each entry of [`Isa::available`].
//!
//! Every tier computes the same canonical reduction order, so the tier changes speed only,
//! never a result bit.

use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

/// The environment variable that forces a tier.
pub const ISA_ENV: &str = "SLUICE_ISA";

/// A SIMD instruction-set tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable Rust, element by element (the reference).
    Scalar,
    /// x86-64 AVX2 with FMA: two 8-lane registers per 16-lane accumulator.
    Avx2,
    /// x86-64 AVX-512F: one 16-lane register per accumulator.
    Avx512,
    /// AArch64 Advanced SIMD: four 4-lane registers per 16-lane accumulator.
    Neon,
}

/// Why a forced tier was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IsaError {
    /// The value names no tier.
    #[error("{ISA_ENV}={value:?} is not one of scalar, avx2, avx512, neon")]
    Unknown {
        /// The value as given.
        value: String,
    },
    /// The tier exists but this CPU (or this build's architecture) cannot run it.
    #[error("{ISA_ENV}={isa} is not supported by this CPU")]
    Unsupported {
        /// The tier that was asked for.
        isa: Isa,
    },
}

impl Isa {
    /// Every tier, fastest first within each architecture.
    pub const ALL: [Isa; 4] = [Isa::Avx512, Isa::Avx2, Isa::Neon, Isa::Scalar];

    /// Lowercase name as accepted by `SLUICE_ISA`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Scalar => "scalar",
            Self::Avx2 => "avx2",
            Self::Avx512 => "avx512",
            Self::Neon => "neon",
        }
    }

    /// Whether the running CPU can execute this tier.
    pub fn is_available(self) -> bool {
        match self {
            Self::Scalar => true,
            Self::Avx2 => avx2_available(),
            Self::Avx512 => avx512_available(),
            Self::Neon => neon_available(),
        }
    }

    /// The tiers the running CPU can execute, fastest first; always ends with `Scalar`.
    pub fn available() -> Vec<Isa> {
        Self::ALL.into_iter().filter(|i| i.is_available()).collect()
    }

    /// The fastest tier the running CPU can execute.
    pub fn detect() -> Isa {
        Self::ALL.into_iter().find(|i| i.is_available()).unwrap_or(Isa::Scalar)
    }

    /// The tier forced by `SLUICE_ISA`: `Ok(None)` when the variable is unset or empty, an
    /// error when it names no tier or one this CPU cannot run.
    pub fn from_env() -> Result<Option<Isa>, IsaError> {
        match std::env::var(ISA_ENV) {
            Ok(v) if !v.trim().is_empty() => {
                let isa: Isa = v.parse()?;
                if isa.is_available() {
                    Ok(Some(isa))
                } else {
                    Err(IsaError::Unsupported { isa })
                }
            }
            _ => Ok(None),
        }
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Isa {
    type Err = IsaError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "scalar" => Ok(Self::Scalar),
            "avx2" => Ok(Self::Avx2),
            "avx512" => Ok(Self::Avx512),
            "neon" => Ok(Self::Neon),
            _ => Err(IsaError::Unknown { value: s.to_owned() }),
        }
    }
}

/// The tier every dispatched kernel uses in this process: `SLUICE_ISA` when it names a tier
/// this CPU supports, otherwise [`Isa::detect`]. Decided on first call and fixed afterwards.
pub fn isa() -> Isa {
    static CHOSEN: OnceLock<Isa> = OnceLock::new();
    *CHOSEN.get_or_init(|| match Isa::from_env() {
        Ok(Some(isa)) => isa,
        // An invalid or unsupported forced tier falls back to detection: a kernel library
        // has no channel to report it, and the forced tier is only a test and CI aid.
        Ok(None) | Err(_) => Isa::detect(),
    })
}

/// `$what`'s body run on the tier `isa`, each x86-64 SIMD tier on a copy of its own compiled
/// under `#[target_feature(enable = …)]` with the features it names, so that the compiler
/// widens the same plain Rust to that tier's vectors; any other tier runs the last body as
/// built. The bodies are expressions over the listed arguments (usually a call of one
/// `#[inline(always)]` function); each tier's copy is an `unsafe fn` inside the expansion,
/// entered only after `isa` has been checked to be available.
///
/// ```ignore
/// on_tier!(isa, "dot", (a: &[f32], b: &[f32]) {
///     avx512("avx512f,fma") => dot_body::<true>(a, b),
///     avx2("avx2,fma") => dot_body::<true>(a, b),
///     _ => dot_body::<false>(a, b),
/// })
/// ```
///
/// # Panics
/// If the running CPU does not support `isa`.
macro_rules! on_tier {
    (
        $isa:expr, $what:literal, ($($arg:ident: $ty:ty),* $(,)?) {
            avx512($f512:literal) => $avx512:expr,
            avx2($f2:literal) => $avx2:expr,
            _ => $other:expr $(,)?
        }
    ) => {{
        let isa: $crate::isa::Isa = $isa;
        assert!(isa.is_available(), "{}: the {isa} tier is not supported by this CPU", $what);
        match isa {
            #[cfg(target_arch = "x86_64")]
            $crate::isa::Isa::Avx512 => {
                /// The body compiled for AVX-512.
                ///
                /// # Safety
                /// The CPU supports the features enabled.
                #[target_feature(enable = $f512)]
                unsafe fn avx512($($arg: $ty),*) {
                    $avx512
                }
                // SAFETY: the CPU supports the AVX-512 tier (asserted above), whose features
                // include those the copy is compiled for.
                unsafe { avx512($($arg),*) }
            }
            #[cfg(target_arch = "x86_64")]
            $crate::isa::Isa::Avx2 => {
                /// The body compiled for AVX2.
                ///
                /// # Safety
                /// The CPU supports the features enabled.
                #[target_feature(enable = $f2)]
                unsafe fn avx2($($arg: $ty),*) {
                    $avx2
                }
                // SAFETY: the CPU supports the AVX2 tier (asserted above), whose features
                // include those the copy is compiled for.
                unsafe { avx2($($arg),*) }
            }
            _ => $other,
        }
    }};
}
pub(crate) use on_tier;

// F16C (every AVX2 core has it) widens FP8 codes through halves without subnormal f32s.
#[cfg(target_arch = "x86_64")]
fn avx2_available() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

#[cfg(not(target_arch = "x86_64"))]
fn avx2_available() -> bool {
    false
}

// The AVX-512 bodies use only AVX-512F instructions (tails are handled with 16-bit masks on
// f32 lanes and stack buffers, never byte-granular masked loads), so F alone is required.
#[cfg(target_arch = "x86_64")]
fn avx512_available() -> bool {
    is_x86_feature_detected!("avx512f")
}

#[cfg(not(target_arch = "x86_64"))]
fn avx512_available() -> bool {
    false
}

#[cfg(target_arch = "aarch64")]
fn neon_available() -> bool {
    std::arch::is_aarch64_feature_detected!("neon")
}

#[cfg(not(target_arch = "aarch64"))]
fn neon_available() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for isa in Isa::ALL {
            assert_eq!(isa.name().parse::<Isa>(), Ok(isa));
            assert_eq!(isa.to_string(), isa.name());
        }
        assert_eq!(" AVX512 ".parse::<Isa>(), Ok(Isa::Avx512));
        assert!(matches!("sse9".parse::<Isa>(), Err(IsaError::Unknown { .. })));
    }

    #[test]
    fn scalar_is_always_available_and_last() {
        let avail = Isa::available();
        assert_eq!(avail.last(), Some(&Isa::Scalar));
        assert_eq!(avail.first().copied(), Some(Isa::detect()));
        assert!(isa().is_available());
    }

    #[test]
    #[cfg(target_arch = "aarch64")]
    fn neon_is_baseline_on_aarch64() {
        assert!(Isa::Neon.is_available());
        assert_eq!(Isa::detect(), Isa::Neon);
    }

    #[test]
    fn one_architecture_only() {
        let x86 = Isa::Avx2.is_available() || Isa::Avx512.is_available();
        assert!(!(x86 && Isa::Neon.is_available()));
    }
}

//! Element types stored in checkpoints (safetensors names) and their byte sizes.

use std::fmt;

/// An element type as named in a safetensors header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16 (the top half of a binary32).
    BF16,
    /// FP8 E4M3 (OCP, "F8_E4M3" in safetensors).
    F8E4M3,
    /// Unsigned byte; MXFP4 packed nibbles and E8M0 scales are stored as U8.
    U8,
    /// Signed byte.
    I8,
    /// Signed 16-bit integer.
    I16,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// IEEE binary64.
    F64,
    /// Boolean (one byte).
    Bool,
}

impl DType {
    /// Parses the safetensors spelling (`"BF16"`, `"F32"`, `"U8"`, ...).
    pub fn from_safetensors(name: &str) -> Option<Self> {
        Some(match name {
            "F32" => Self::F32,
            "F16" => Self::F16,
            "BF16" => Self::BF16,
            "F8_E4M3" => Self::F8E4M3,
            "U8" => Self::U8,
            "I8" => Self::I8,
            "I16" => Self::I16,
            "I32" => Self::I32,
            "I64" => Self::I64,
            "F64" => Self::F64,
            "BOOL" => Self::Bool,
            _ => return None,
        })
    }

    /// The safetensors spelling of this type.
    pub fn safetensors_name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::BF16 => "BF16",
            Self::F8E4M3 => "F8_E4M3",
            Self::U8 => "U8",
            Self::I8 => "I8",
            Self::I16 => "I16",
            Self::I32 => "I32",
            Self::I64 => "I64",
            Self::F64 => "F64",
            Self::Bool => "BOOL",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> u64 {
        match self {
            Self::F8E4M3 | Self::U8 | Self::I8 | Self::Bool => 1,
            Self::F16 | Self::BF16 | Self::I16 => 2,
            Self::F32 | Self::I32 => 4,
            Self::F64 | Self::I64 => 8,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.safetensors_name())
    }
}

/// Widens a bf16 bit pattern to f32 (exact).
#[inline(always)]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// Widens an IEEE half bit pattern to f32 (exact).
#[inline]
pub fn f16_to_f32(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

/// Rounds an f32 to the nearest bf16 (ties to even), as PyTorch and MLX do. NaN stays NaN.
#[inline]
pub fn f32_to_bf16_rne(x: f32) -> u16 {
    half::bf16::from_f32(x).to_bits()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safetensors_names_round_trip() {
        for d in [
            DType::F32,
            DType::F16,
            DType::BF16,
            DType::F8E4M3,
            DType::U8,
            DType::I8,
            DType::I16,
            DType::I32,
            DType::I64,
            DType::F64,
            DType::Bool,
        ] {
            assert_eq!(DType::from_safetensors(d.safetensors_name()), Some(d));
        }
        assert_eq!(DType::from_safetensors("Q4_K"), None);
    }

    #[test]
    fn bf16_round_trip_is_exact_for_representable_values() {
        for x in [0.0f32, -0.0, 1.0, -2.5, 3.140625, 1e-30, 6.0e30] {
            let b = f32_to_bf16_rne(x);
            assert_eq!(bf16_to_f32(b), half::bf16::from_f32(x).to_f32());
        }
        assert_eq!(bf16_to_f32(0x3f80), 1.0);
    }
}

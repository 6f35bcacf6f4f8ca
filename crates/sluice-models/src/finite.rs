//! Non-finite values (NaN, ±Inf) in weights and activations. A corrupt or badly converted
//! checkpoint with one NaN in a projection otherwise runs "successfully" and emits token 0
//! forever, so the models check cheaply where it costs nothing measurable: the small vectors read
//! at load (norms, biases, gates), each layer's output rows and the logits of every pass (a few
//! thousand floats against the millions of multiply-adds that made them). Only when a check
//! fails are the weights scanned, to name the tensor that holds the bad value.

use crate::ModelError;
use sluice_checkpoint::{Checkpoint, TensorEntry};
use sluice_core::{bf16_to_f32, f16_to_f32, DType};

/// `v`, the widened values of tensor `e` read at load, if every one is finite; else the error
/// naming the tensor, its file and the first bad element.
pub(crate) fn checked(
    ckpt: &Checkpoint,
    e: &TensorEntry,
    v: Vec<f32>,
) -> Result<Vec<f32>, ModelError> {
    if all_finite(&v) {
        return Ok(v);
    }
    let (index, x) = first_non_finite(&v).unwrap_or((0, f32::NAN));
    Err(ModelError::NonFiniteWeight {
        file: ckpt.shard_file(e).to_path_buf(),
        tensor: e.name.clone(),
        index,
        value: name(x),
    })
}

/// True when every value of `v` is finite. Written so that it vectorizes: `x * 0` is 0 for a
/// finite `x` and NaN otherwise, and NaN survives any sum, so there is no branch per element.
pub(crate) fn all_finite(v: &[f32]) -> bool {
    let mut acc = [0.0f32; 16];
    let mut chunks = v.chunks_exact(16);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a += x * 0.0;
        }
    }
    for &x in chunks.remainder() {
        acc[0] += x * 0.0;
    }
    acc.iter().all(|a| !a.is_nan())
}

/// The first non-finite value of `v`: its index and the value.
pub(crate) fn first_non_finite(v: &[f32]) -> Option<(usize, f32)> {
    v.iter().position(|x| !x.is_finite()).map(|i| (i, v[i]))
}

/// The first non-finite element of a tensor's raw little-endian bytes: its index and the value
/// widened to f32. Integer and packed (MXFP4) types cannot hold a non-finite value.
pub(crate) fn scan_bytes(dtype: DType, bytes: &[u8]) -> Option<(usize, f32)> {
    match dtype {
        DType::BF16 => bytes
            .chunks_exact(2)
            .position(|c| c[1] & 0x7f == 0x7f && c[0] & 0x80 != 0)
            .map(|i| (i, bf16_to_f32(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])))),
        DType::F16 => bytes
            .chunks_exact(2)
            .position(|c| c[1] & 0x7c == 0x7c)
            .map(|i| (i, f16_to_f32(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])))),
        DType::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .enumerate()
            .find(|(_, x)| !x.is_finite()),
        _ => None,
    }
}

/// `NaN`, `inf` or `-inf`, as a message should say it.
pub(crate) fn name(x: f32) -> &'static str {
    if x.is_nan() {
        "NaN"
    } else if x > 0.0 {
        "+Inf"
    } else {
        "-Inf"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_nan_and_inf_at_awkward_lengths() {
        for n in [1usize, 3, 15, 16, 17, 33, 255] {
            let mut v = vec![1.5f32; n];
            assert!(all_finite(&v), "{n}");
            for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                v[n - 1] = bad;
                assert!(!all_finite(&v), "{n} {bad}");
                assert_eq!(first_non_finite(&v).map(|(i, _)| i), Some(n - 1));
                v[n - 1] = f32::MAX;
                assert!(all_finite(&v), "{n}: f32::MAX is finite");
            }
        }
    }

    #[test]
    fn scans_bf16_f16_and_f32_bytes() {
        let bf16 = |x: f32| (x.to_bits() >> 16) as u16;
        let b: Vec<u8> = [1.0f32, -2.0, f32::INFINITY, 3.0]
            .iter()
            .flat_map(|&x| bf16(x).to_le_bytes())
            .collect();
        assert_eq!(scan_bytes(DType::BF16, &b).map(|(i, _)| i), Some(2));
        let max_bf16: Vec<u8> = bf16(f32::MAX).to_le_bytes().to_vec();
        assert_eq!(scan_bytes(DType::BF16, &max_bf16), None);
        // f16 1.0 is 0x3c00, NaN 0x7e00.
        let h: Vec<u8> = [0x3c00u16, 0x7e00].iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(scan_bytes(DType::F16, &h).map(|(i, _)| i), Some(1));
        let f: Vec<u8> = [0.5f32, f32::NAN].iter().flat_map(|x| x.to_le_bytes()).collect();
        assert!(scan_bytes(DType::F32, &f).is_some_and(|(i, x)| i == 1 && x.is_nan()));
        assert_eq!(scan_bytes(DType::I8, &[0xff; 4]), None);
    }
}

//! Synthetic checkpoints for the families whose checkpoint is a plain list of named tensors
//! (Qwen3-MoE, GPT-OSS, DeepSeek-V3): a family lists its tensors shard by shard ([`SynthTensor`]) and its
//! `config.json`, and [`write`] writes them in the published layout (safetensors shards, an
//! index, atomic writes), with random values that are deterministic from a seed and keep a
//! forward pass finite. `sluice synth --preset qwen3-moe-slice|gpt-oss-slice` writes slices at
//! each model's real per-layer dimensions with a few layers, for streaming benchmarks on a model
//! larger than the memory limit. (Kimi K3's writer, with its own value recipes, is
//! `kimi_k3::synth`.)

use crate::kimi_k3::synth::SplitMix;
use crate::ModelError;
use serde_json::Value;
use sluice_checkpoint::{write_index, write_json_atomic, ShardWriter, TensorSpec};
use sluice_core::DType;
use std::collections::BTreeMap;
use std::path::Path;

/// How a tensor's values are drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// Random sign and mantissa with magnitudes in `[a/2, a)` (bf16 or f32).
    Uniform(f32),
    /// All ones (norm weights).
    Ones,
    /// Random bytes (packed MXFP4 nibbles).
    Bytes,
    /// E8M0 scales uniformly in `lo..=hi`.
    Scales(u8, u8),
    /// FP8 e4m3 codes of random sign and mantissa with magnitudes in `[1/8, 2)` (never NaN).
    Fp8,
    /// The two dimensions of a shape (an INT4 weight's `weight_shape`), as I32.
    Dims(u64, u64),
}

/// One tensor of a synthetic checkpoint.
#[derive(Debug, Clone)]
pub struct SynthTensor {
    /// Its name.
    pub name: String,
    /// Its dtype (BF16, F32 or U8).
    pub dtype: DType,
    /// Its shape.
    pub shape: Vec<u64>,
    /// How its values are drawn.
    pub init: Init,
}

impl SynthTensor {
    /// A tensor `name` of `dtype` and `shape` drawn by `init`.
    pub fn new(name: String, dtype: DType, shape: &[u64], init: Init) -> Self {
        Self { name, dtype, shape: shape.to_vec(), init }
    }

    /// Bytes of the tensor.
    pub fn bytes(&self) -> u64 {
        self.shape.iter().product::<u64>() * self.dtype.size()
    }
}

/// Bytes of tensor data `shards` hold.
pub fn total_bytes(shards: &[Vec<SynthTensor>]) -> u64 {
    shards.iter().flatten().map(SynthTensor::bytes).sum()
}

/// Writes `shards` (one safetensors file each, `model-{i:05}-of-{n:05}.safetensors`), the
/// index and `config` into `dir` (created if needed). `progress(done, total)` is called with
/// bytes written. Returns the bytes of tensor data written.
pub fn write(
    dir: &Path,
    config: &Value,
    shards: &[Vec<SynthTensor>],
    seed: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<u64, ModelError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| ModelError::Config(format!("cannot create {}: {e}", dir.display())))?;
    let total = total_bytes(shards);
    let n = shards.len();
    let mut weight_map = BTreeMap::new();
    let mut done = 0u64;
    let mut buf = Vec::new();
    for (si, shard) in shards.iter().enumerate() {
        let file = format!("model-{:05}-of-{:05}.safetensors", si + 1, n);
        let specs: Vec<TensorSpec> = shard
            .iter()
            .map(|t| TensorSpec::new(t.name.clone(), t.dtype, t.shape.clone()))
            .collect();
        let mut w = ShardWriter::create(&dir.join(&file), specs, None)?;
        for t in shard {
            // One stream per tensor name keeps every tensor's values independent of the others.
            let mut rng = SplitMix::new(seed ^ fnv1a(&t.name));
            let len = usize::try_from(t.bytes()).map_err(|_| {
                ModelError::Config(format!("{} is too large for this platform", t.name))
            })?;
            fill(&mut rng, t, len, &mut buf)?;
            w.write_tensor(&t.name, &buf)?;
            done += t.bytes();
            progress(done, total);
            weight_map.insert(t.name.clone(), file.clone());
        }
        w.finish()?;
    }
    write_index(dir, &weight_map, total)?;
    write_json_atomic(&dir.join("config.json"), config)?;
    Ok(total)
}

/// Fills `buf` with the `len` bytes of `t`.
fn fill(
    rng: &mut SplitMix,
    t: &SynthTensor,
    len: usize,
    buf: &mut Vec<u8>,
) -> Result<(), ModelError> {
    buf.clear();
    buf.resize(len, 0);
    match (t.init, t.dtype) {
        (Init::Bytes, _) => {
            for c in buf.chunks_mut(8) {
                let r = rng.next_u64().to_le_bytes();
                c.copy_from_slice(&r[..c.len()]);
            }
        }
        (Init::Scales(lo, hi), DType::U8) => {
            let span = u64::from(hi.saturating_sub(lo)) + 1;
            for b in buf.iter_mut() {
                *b = lo + u8::try_from(rng.next_u64() % span).unwrap_or(0);
            }
        }
        (Init::Fp8, DType::F8E4M3) => {
            for c in buf.chunks_mut(8) {
                let r = rng.next_u64().to_le_bytes();
                for (b, &x) in c.iter_mut().zip(&r) {
                    // sign | exponent 4..=7 (2^-3 .. 2^0) | mantissa
                    *b = (x & 0x80) | ((4 + ((x >> 3) & 3)) << 3) | (x & 7);
                }
            }
        }
        (Init::Dims(a, b), DType::I32) => {
            for (c, v) in buf.chunks_exact_mut(4).zip([a, b]) {
                c.copy_from_slice(&i32::try_from(v).unwrap_or(i32::MAX).to_le_bytes());
            }
        }
        (Init::Ones, DType::BF16) => {
            for c in buf.chunks_exact_mut(2) {
                c.copy_from_slice(&0x3F80u16.to_le_bytes());
            }
        }
        (Init::Ones, DType::F32) => {
            for c in buf.chunks_exact_mut(4) {
                c.copy_from_slice(&1.0f32.to_le_bytes());
            }
        }
        (Init::Uniform(a), DType::BF16) => {
            // bf16 bits: sign, the exponent of a/2, a random 7-bit mantissa: four values from
            // one draw, so gigabytes of weights are written at disk speed.
            let exp = u16::try_from((a.to_bits() >> 23) & 0xFF).unwrap_or(127).saturating_sub(1);
            for c in buf.chunks_mut(8) {
                let r = rng.next_u64();
                for (j, v) in c.chunks_exact_mut(2).enumerate() {
                    let bits = u16::try_from((r >> (16 * j)) & 0xFFFF).unwrap_or(0);
                    let word = (bits & 0x8000) | (exp << 7) | (bits & 0x7F);
                    v.copy_from_slice(&word.to_le_bytes());
                }
            }
        }
        (Init::Uniform(a), DType::F32) => {
            for c in buf.chunks_exact_mut(4) {
                c.copy_from_slice(&(a * rng.uniform()).to_le_bytes());
            }
        }
        (init, dtype) => {
            return Err(ModelError::Config(format!(
                "synthetic tensor {}: {init:?} values cannot be drawn as {dtype}",
                t.name
            )))
        }
    }
    Ok(())
}

/// FNV-1a hash of a name (seeds per-tensor streams).
fn fnv1a(s: &str) -> u64 {
    s.bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// `1/√n` as an [`Init::Uniform`] bound: keeps `x · Wᵀ` of unit-scale rows near unit scale.
pub fn fan_in(n: u64) -> Init {
    #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
    let a = (1.0 / (n.max(1) as f64).sqrt()) as f32;
    Init::Uniform(a)
}

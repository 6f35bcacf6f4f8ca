//! The routed experts of the DeepSeek-V3 family as the expert store sees them: every expert is
//! its own tensors (`model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.*`, not stacked), in
//! the one storage every routed expert of a checkpoint shares ([`ExpertFormat`]):
//!
//! | format | parts, per projection in the order gate, up, down |
//! |---|---|
//! | FP8 (DeepSeek V3/R1, Kimi K2 Instruct) | `weight` F8_E4M3 `[out, in]`, `weight_scale_inv` F32 `[⌈out/128⌉, ⌈in/128⌉]` |
//! | INT4 (Kimi K2 Thinking) | `weight_packed` I32 `[out, in/8]`, `weight_scale` BF16 `[out, in/32]` |
//! | bf16 / f32 | `weight` `[out, in]` |
//!
//! An INT4 projection's `weight_shape` (two integers) is checked at load and never streamed.
//! In the published shards an expert's tensors sit next to each other (names sort by expert),
//! so its parts usually coalesce into one read. The parts are kernel operands as read: the
//! store's bytes are the published bytes, so a streamed expert computes bit for bit what the
//! mapped one does.

use crate::ModelError;
use sluice_core::DType;
use sluice_kernels::Matrix;
use sluice_store::{ExpertLayout, ExpertPart, ExpertView, StoreError};

/// How every routed expert of a checkpoint is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertFormat {
    /// bf16 `weight`.
    Bf16,
    /// f32 `weight`.
    F32,
    /// FP8 e4m3 `weight` with F32 128×128 `weight_scale_inv`.
    Fp8,
    /// Pack-quantized INT4 `weight_packed` with bf16 group-32 `weight_scale`.
    Int4,
}

impl ExpertFormat {
    /// The name messages and `inspect` use.
    pub fn name(self) -> &'static str {
        match self {
            Self::Bf16 => "bf16",
            Self::F32 => "f32",
            Self::Fp8 => "fp8",
            Self::Int4 => "int4",
        }
    }

    /// Stored parts per projection.
    fn parts_per_projection(self) -> usize {
        match self {
            Self::Bf16 | Self::F32 => 1,
            Self::Fp8 | Self::Int4 => 2,
        }
    }
}

/// The layout of one DeepSeek-V3 routed expert for the expert store.
#[derive(Debug, Clone, Copy)]
pub struct DeepseekV3ExpertLayout {
    /// How the experts are stored.
    pub format: ExpertFormat,
    /// `moe_intermediate_size`.
    pub inter: u64,
    /// `hidden_size`.
    pub hidden: u64,
}

/// `(projection, out, in)` in the order the parts are listed.
fn projections(inter: u64, hidden: u64) -> [(&'static str, u64, u64); 3] {
    [("gate_proj", inter, hidden), ("up_proj", inter, hidden), ("down_proj", hidden, inter)]
}

/// The `(suffix, dtype, shape)` of each stored tensor of a projection `[out, in]`.
fn tensors(f: ExpertFormat, out: u64, inp: u64) -> Vec<(&'static str, DType, [u64; 2])> {
    let b = crate::deepseek_v3::quant::FP8_BLOCK as u64;
    let g = crate::deepseek_v3::quant::INT4_GROUP as u64;
    match f {
        ExpertFormat::Bf16 => vec![("weight", DType::BF16, [out, inp])],
        ExpertFormat::F32 => vec![("weight", DType::F32, [out, inp])],
        ExpertFormat::Fp8 => vec![
            ("weight", DType::F8E4M3, [out, inp]),
            ("weight_scale_inv", DType::F32, [out.div_ceil(b), inp.div_ceil(b)]),
        ],
        ExpertFormat::Int4 => vec![
            ("weight_packed", DType::I32, [out, inp / 8]),
            ("weight_scale", DType::BF16, [out, inp / g]),
        ],
    }
}

impl DeepseekV3ExpertLayout {
    /// Bytes of one expert (every part of its three projections).
    pub fn expert_bytes(&self) -> u64 {
        projections(self.inter, self.hidden)
            .iter()
            .flat_map(|&(_, o, i)| tensors(self.format, o, i))
            .map(|(_, dt, s)| s[0] * s[1] * dt.size())
            .sum()
    }

    /// The three projections of an expert served by the store, as kernel operands over its
    /// parts: `[gate, up, down]`.
    pub(crate) fn matrices<'a>(
        &self,
        layer: usize,
        id: u32,
        v: &ExpertView<'a>,
    ) -> Result<[Matrix<'a>; 3], StoreError> {
        let per = self.format.parts_per_projection();
        let one = |k: usize, out: u64, inp: u64| {
            let (o, i) = (usize::try_from(out).ok()?, usize::try_from(inp).ok()?);
            let (a, b) = (v.part(k * per), v.part(k * per + 1));
            match self.format {
                ExpertFormat::Bf16 => Matrix::bf16(o, i, a),
                ExpertFormat::F32 => Matrix::f32(o, i, a),
                ExpertFormat::Fp8 => Matrix::fp8_block(o, i, a, b),
                ExpertFormat::Int4 => Matrix::int4_group(o, i, a, b),
            }
            .ok()
        };
        let [(_, go, gi), (_, uo, ui), (_, dout, di)] = projections(self.inter, self.hidden);
        match (one(0, go, gi), one(1, uo, ui), one(2, dout, di)) {
            (Some(g), Some(u), Some(d)) => Ok([g, u, d]),
            _ => Err(StoreError::Consumer(format!(
                "expert {id} of layer {layer} has byte lengths that do not match its {} shape",
                self.format.name()
            ))),
        }
    }
}

impl ExpertLayout for DeepseekV3ExpertLayout {
    fn parts(&self, layer: usize, expert: usize) -> Vec<ExpertPart> {
        let p = format!("model.layers.{layer}.mlp.experts.{expert}");
        let mut parts = Vec::with_capacity(6);
        for (proj, o, i) in projections(self.inter, self.hidden) {
            for (suffix, dt, shape) in tensors(self.format, o, i) {
                parts.push(ExpertPart::whole(format!("{p}.{proj}.{suffix}"), dt, &shape));
            }
        }
        parts
    }
}

/// Refuses a routed expert stored otherwise than the experts before it (the store reads every
/// expert of a checkpoint with one layout).
pub(crate) fn same_format(
    seen: &mut Option<ExpertFormat>,
    got: ExpertFormat,
    tensor: &str,
) -> Result<(), ModelError> {
    match *seen {
        None => {
            *seen = Some(got);
            Ok(())
        }
        Some(f) if f == got => Ok(()),
        Some(f) => Err(ModelError::Config(format!(
            "{tensor} is stored as {} but the routed experts before it are {}: every routed \
             expert of a checkpoint must be stored the same way",
            got.name(),
            f.name()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_follow_the_published_names_and_sizes() {
        // DeepSeek V3: 2048-wide experts of a 7168-wide model, FP8.
        let l = DeepseekV3ExpertLayout { format: ExpertFormat::Fp8, inter: 2048, hidden: 7168 };
        let parts = l.parts(3, 17);
        assert_eq!(parts.len(), 6);
        assert_eq!(parts[0].tensor, "model.layers.3.mlp.experts.17.gate_proj.weight");
        assert_eq!(parts[1].tensor, "model.layers.3.mlp.experts.17.gate_proj.weight_scale_inv");
        assert_eq!(parts[1].shape, [16, 56]);
        assert_eq!(parts[5].shape, [56, 16]);
        let bytes: u64 = parts.iter().map(|p| p.range.end - p.range.start).sum();
        assert_eq!(bytes, l.expert_bytes());
        assert_eq!(l.expert_bytes(), 3 * 2048 * 7168 + 3 * 16 * 56 * 4);
        // Kimi K2 Thinking: INT4, group 32.
        let l = DeepseekV3ExpertLayout { format: ExpertFormat::Int4, inter: 2048, hidden: 7168 };
        let parts = l.parts(1, 0);
        assert_eq!(parts[2].tensor, "model.layers.1.mlp.experts.0.up_proj.weight_packed");
        assert_eq!(parts[4].shape, [7168, 256]);
        assert_eq!(l.expert_bytes(), 3 * 2048 * 7168 / 2 + 3 * 2048 * 7168 / 32 * 2);
    }
}

//! The byte form of a [`StateSnapshot`]: what the engine's on-disk prompt-state cache stores.
//!
//! One function pair per state kind (KDA recurrent state, MLA latent rows, KV rows), reached
//! through the state kinds of [`crate::State`]. All numbers are little-endian; f32 values keep their
//! exact bits, so a decoded snapshot restores a state bit-identical to the one encoded.
//!
//! ```text
//! u8 family (1 Kimi K3, 2 Qwen3-style KV) · u64 positions · u32 layers · per layer:
//!   u8 1 (KDA) · u32 heads · u32 dim · u64 n · f32[n] recurrent · u64 c · f32[c] conv window
//!   u8 2 (MLA) · u32 lat_dim · u32 pe_dim · f32[positions·lat_dim] · f32[positions·pe_dim]
//!   u8 3 (KV)  · u32 width · f32[positions·width] keys · f32[positions·width] values
//! ```
//!
//! Decoding checks every dimension against the [`StateShape`] of the model it is for, and every
//! length against the bytes the caller says are left, before allocating: a file from another
//! model, or a damaged one, is an error, never a state that would mislead (or crash) a pass.
//! The byte layout's version is [`SNAPSHOT_FORMAT_VERSION`]; a change to it, or to what a state
//! holds, must bump it so that caches written before are refused.

use super::{Family, Rows, SnapLayer, StateSnapshot};
use crate::kimi_k3::state::{K3State, LayerState};
use crate::qwen3::Qwen3State;
use std::io::{Read, Write};
use std::sync::Arc;

/// Version of the byte layout [`StateSnapshot::encode`] writes.
pub const SNAPSHOT_FORMAT_VERSION: u32 = 1;

/// Values converted per buffered chunk when reading or writing f32 arrays.
const CHUNK: usize = 1 << 14;

/// The shape of one layer's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LayerShape {
    Kda { heads: usize, dim: usize, s_len: usize, conv_len: usize },
    Mla { lat_dim: usize, pe_dim: usize },
    Kv { width: usize },
}

/// What a snapshot must look like to restore into a model's state: its family and every
/// layer's kind and dimensions ([`crate::State::shape`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateShape {
    family: Family,
    /// The family (table name) of the model; not part of the byte form.
    owner: &'static str,
    layers: Vec<LayerShape>,
}

/// Why a snapshot's bytes were refused.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotCodecError {
    /// Reading or writing failed (a short file reads as `UnexpectedEof`).
    #[error("snapshot I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The bytes do not describe a state of this model.
    #[error("snapshot does not fit this model: {0}")]
    Mismatch(String),
}

/// The shape of Kimi K3 states (KDA and MLA layers) of a model of `owner`.
pub(super) fn k3_shape(s: &K3State, owner: &'static str) -> StateShape {
    StateShape {
        family: Family::KimiK3,
        owner,
        layers: s
            .layers
            .iter()
            .map(|l| match l {
                LayerState::Kda(k) => LayerShape::Kda {
                    heads: k.heads,
                    dim: k.dim,
                    s_len: k.committed.s.len(),
                    conv_len: k.committed.conv.len(),
                },
                LayerState::Mla(m) => LayerShape::Mla { lat_dim: m.lat_dim, pe_dim: m.pe_dim },
            })
            .collect(),
    }
}

/// The shape of Qwen3-style states (keys and values) of a model of `owner`.
pub(super) fn kv_shape(s: &Qwen3State, owner: &'static str) -> StateShape {
    StateShape {
        family: Family::Qwen3,
        owner,
        layers: s.layers.iter().map(|l| LayerShape::Kv { width: l.width }).collect(),
    }
}

fn put_u8(w: &mut dyn Write, v: u8) -> std::io::Result<()> {
    w.write_all(&[v])
}

fn put_u32(w: &mut dyn Write, v: usize) -> std::io::Result<()> {
    let v = u32::try_from(v).map_err(|_| std::io::Error::other("dimension over u32"))?;
    w.write_all(&v.to_le_bytes())
}

fn put_u64(w: &mut dyn Write, v: usize) -> std::io::Result<()> {
    w.write_all(&(v as u64).to_le_bytes())
}

/// Writes `v`'s exact bits, little-endian, through a bounded buffer.
fn put_f32s(w: &mut dyn Write, v: &[f32]) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(4 * CHUNK.min(v.len()));
    for c in v.chunks(CHUNK) {
        buf.clear();
        for x in c {
            buf.extend_from_slice(&x.to_bits().to_le_bytes());
        }
        w.write_all(&buf)?;
    }
    Ok(())
}

/// Reads with a count of the bytes still allowed: no allocation may exceed what is left.
struct Input<'a> {
    r: &'a mut dyn Read,
    left: u64,
}

impl Input<'_> {
    fn take(&mut self, n: usize) -> Result<(), SnapshotCodecError> {
        match self.left.checked_sub(n as u64) {
            Some(l) => {
                self.left = l;
                Ok(())
            }
            None => Err(SnapshotCodecError::Io(std::io::ErrorKind::UnexpectedEof.into())),
        }
    }

    fn bytes<const N: usize>(&mut self) -> Result<[u8; N], SnapshotCodecError> {
        self.take(N)?;
        let mut b = [0u8; N];
        self.r.read_exact(&mut b)?;
        Ok(b)
    }

    fn u8(&mut self) -> Result<u8, SnapshotCodecError> {
        Ok(self.bytes::<1>()?[0])
    }

    fn u32(&mut self) -> Result<usize, SnapshotCodecError> {
        Ok(u32::from_le_bytes(self.bytes()?) as usize)
    }

    fn u64(&mut self) -> Result<u64, SnapshotCodecError> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }

    /// `n` f32 values, refused before allocating when fewer than `4n` bytes are left.
    fn f32s(&mut self, n: usize) -> Result<Vec<f32>, SnapshotCodecError> {
        let bytes = n.checked_mul(4).ok_or_else(|| mismatch("an array too large"))?;
        self.take(bytes)?;
        let mut out = Vec::with_capacity(n);
        let mut buf = vec![0u8; 4 * CHUNK.min(n)];
        while out.len() < n {
            let k = CHUNK.min(n - out.len());
            self.r.read_exact(&mut buf[..4 * k])?;
            out.extend(
                buf[..4 * k]
                    .chunks_exact(4)
                    .map(|b| f32::from_bits(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
            );
        }
        Ok(out)
    }
}

fn mismatch(what: impl Into<String>) -> SnapshotCodecError {
    SnapshotCodecError::Mismatch(what.into())
}

/// Checks a dimension read from the bytes against the model's.
fn expect(what: &str, got: usize, want: usize) -> Result<(), SnapshotCodecError> {
    if got == want {
        Ok(())
    } else {
        Err(mismatch(format!("{what} is {got}, this model has {want}")))
    }
}

fn rows(v: Vec<f32>) -> Rows {
    let len = v.len();
    Rows { segs: if len == 0 { Vec::new() } else { vec![Arc::from(v)] }, len }
}

/// Writes every segment of `r` (segments are contiguous pieces of one array).
fn put_rows(w: &mut dyn Write, r: &Rows) -> std::io::Result<()> {
    r.segs.iter().try_for_each(|s| put_f32s(w, s))
}

/// KDA: the committed recurrent matrix and conv window.
fn write_kda(
    w: &mut dyn Write,
    s: &[f32],
    conv: &[f32],
    heads: usize,
    dim: usize,
) -> std::io::Result<()> {
    put_u8(w, 1)?;
    put_u32(w, heads)?;
    put_u32(w, dim)?;
    put_u64(w, s.len())?;
    put_f32s(w, s)?;
    put_u64(w, conv.len())?;
    put_f32s(w, conv)
}

fn read_kda(r: &mut Input<'_>, shape: LayerShape) -> Result<SnapLayer, SnapshotCodecError> {
    let LayerShape::Kda { heads, dim, s_len, conv_len } = shape else {
        return Err(mismatch(format!("a KDA layer where this model has {shape:?}")));
    };
    expect("a KDA layer's head count", r.u32()?, heads)?;
    expect("a KDA layer's head dimension", r.u32()?, dim)?;
    let n = usize::try_from(r.u64()?).unwrap_or(usize::MAX);
    expect("a KDA recurrent state's length", n, s_len)?;
    let s = r.f32s(n)?;
    let c = usize::try_from(r.u64()?).unwrap_or(usize::MAX);
    expect("a KDA conv window's length", c, conv_len)?;
    let conv = r.f32s(c)?;
    Ok(SnapLayer::Kda { s: Arc::from(s), conv: Arc::from(conv), heads, dim })
}

/// MLA: the latent and rope-key rows of every position.
fn write_mla(
    w: &mut dyn Write,
    lat: &Rows,
    pe: &Rows,
    lat_dim: usize,
    pe_dim: usize,
) -> std::io::Result<()> {
    put_u8(w, 2)?;
    put_u32(w, lat_dim)?;
    put_u32(w, pe_dim)?;
    put_rows(w, lat)?;
    put_rows(w, pe)
}

fn read_mla(
    r: &mut Input<'_>,
    shape: LayerShape,
    len: usize,
) -> Result<SnapLayer, SnapshotCodecError> {
    let LayerShape::Mla { lat_dim, pe_dim } = shape else {
        return Err(mismatch(format!("an MLA layer where this model has {shape:?}")));
    };
    expect("an MLA layer's latent width", r.u32()?, lat_dim)?;
    expect("an MLA layer's rope width", r.u32()?, pe_dim)?;
    let too_long = || mismatch("more positions than an array can hold");
    let lat = r.f32s(len.checked_mul(lat_dim).ok_or_else(too_long)?)?;
    let pe = r.f32s(len.checked_mul(pe_dim).ok_or_else(too_long)?)?;
    Ok(SnapLayer::Mla { lat: rows(lat), pe: rows(pe), lat_dim, pe_dim })
}

/// KV: the keys and values of every position.
fn write_kv(w: &mut dyn Write, k: &Rows, v: &Rows, width: usize) -> std::io::Result<()> {
    put_u8(w, 3)?;
    put_u32(w, width)?;
    put_rows(w, k)?;
    put_rows(w, v)
}

fn read_kv(
    r: &mut Input<'_>,
    shape: LayerShape,
    len: usize,
) -> Result<SnapLayer, SnapshotCodecError> {
    let LayerShape::Kv { width } = shape else {
        return Err(mismatch(format!("a KV layer where this model has {shape:?}")));
    };
    expect("a KV layer's width", r.u32()?, width)?;
    let n =
        len.checked_mul(width).ok_or_else(|| mismatch("more positions than an array can hold"))?;
    let k = r.f32s(n)?;
    let v = r.f32s(n)?;
    Ok(SnapLayer::Kv { k: rows(k), v: rows(v), width })
}

impl StateSnapshot {
    /// Writes the snapshot's byte form (see the module docs).
    pub fn encode(&self, w: &mut dyn Write) -> std::io::Result<()> {
        put_u8(w, self.family.code())?;
        put_u64(w, self.len)?;
        put_u32(w, self.layers.len())?;
        for l in &self.layers {
            match l {
                SnapLayer::Kda { s, conv, heads, dim } => write_kda(w, s, conv, *heads, *dim)?,
                SnapLayer::Mla { lat, pe, lat_dim, pe_dim } => {
                    write_mla(w, lat, pe, *lat_dim, *pe_dim)?;
                }
                SnapLayer::Kv { k, v, width } => write_kv(w, k, v, *width)?,
            }
        }
        Ok(())
    }

    /// Bytes [`StateSnapshot::encode`] writes.
    pub fn encoded_len(&self) -> usize {
        let mut n = 1 + 8 + 4;
        for l in &self.layers {
            n += match l {
                SnapLayer::Kda { s, conv, .. } => 1 + 4 + 4 + 8 + 4 * s.len() + 8 + 4 * conv.len(),
                SnapLayer::Mla { lat, pe, .. } => 1 + 4 + 4 + 4 * (lat.len + pe.len),
                SnapLayer::Kv { k, v, .. } => 1 + 4 + 4 * (k.len + v.len),
            };
        }
        n
    }

    /// Reads a snapshot written by [`StateSnapshot::encode`], for a model whose states have
    /// `shape`, reading at most `limit` bytes (the caller's file size: no array larger than
    /// what is left is allocated). Anything that does not fit `shape` is refused.
    pub fn decode(
        r: &mut dyn Read,
        shape: &StateShape,
        limit: u64,
    ) -> Result<StateSnapshot, SnapshotCodecError> {
        let mut r = Input { r, left: limit };
        let family =
            Family::from_code(r.u8()?).ok_or_else(|| mismatch("an unknown state family"))?;
        if family != shape.family {
            return Err(mismatch(format!(
                "a {family:?} state, this model's is {:?}",
                shape.family
            )));
        }
        let len = usize::try_from(r.u64()?).map_err(|_| mismatch("too many positions"))?;
        expect("the layer count", r.u32()?, shape.layers.len())?;
        let mut layers = Vec::with_capacity(shape.layers.len());
        for &ls in &shape.layers {
            layers.push(match r.u8()? {
                1 => read_kda(&mut r, ls)?,
                2 => read_mla(&mut r, ls, len)?,
                3 => read_kv(&mut r, ls, len)?,
                k => return Err(mismatch(format!("unknown layer kind {k}"))),
            });
        }
        Ok(StateSnapshot { family, owner: shape.owner, layers, len })
    }
}

impl Family {
    fn code(self) -> u8 {
        match self {
            Self::KimiK3 => 1,
            Self::Qwen3 => 2,
        }
    }

    fn from_code(c: u8) -> Option<Self> {
        match c {
            1 => Some(Self::KimiK3),
            2 => Some(Self::Qwen3),
            _ => None,
        }
    }
}

//! The byte form of a [`StateSnapshot`]: what the engine's on-disk prompt-state cache stores.
//!
//! A snapshot is a small **layout** section followed by its **arrays**. The layout names the
//! family, the positions and every layer's kind and dimensions; the arrays are the f32 values
//! themselves, one after another in layer order, with nothing between them. Keeping the two
//! apart is what lets the engine move a snapshot at disk speed: it reads the layout, allocates
//! every array at its final size ([`SnapshotLayout::alloc`]), and then reads the file's bytes
//! straight into them while other threads checksum what has arrived; writing, it hands the
//! arrays to the disk as they are ([`StateSnapshot::array_pieces`]), with no encode step.
//!
//! ```text
//! layout:  u8 family (1 Kimi K3, 2 Qwen3-style KV) · u64 positions · u32 layers · per layer:
//!            u8 1 (KDA) · u32 heads · u32 dim · u64 n (recurrent values) · u64 c (conv values)
//!            u8 2 (MLA) · u32 lat_dim · u32 pe_dim
//!            u8 3 (KV)  · u32 width
//! arrays:  per layer, in order: KDA f32[n] recurrent · f32[c] conv window;
//!          MLA f32[positions·lat_dim] latents · f32[positions·pe_dim] rope keys;
//!          KV f32[positions·width] keys · f32[positions·width] values
//! ```
//!
//! All numbers are little-endian; f32 values keep their exact bits, so a decoded snapshot
//! restores a state bit-identical to the one encoded. On a little-endian machine (every target
//! sluice builds for) the arrays' bytes are their memory as is ([`le_bytes`]).
//!
//! Decoding checks every dimension against the [`StateShape`] of the model it is for, and the
//! arrays' total against the bytes the caller says are left, before allocating: a file from
//! another model, or a damaged one, is an error, never a state that would mislead (or crash) a
//! pass. The byte layout's version is [`SNAPSHOT_FORMAT_VERSION`]; a change to it, or to what a
//! state holds, must bump it so that caches written before are refused.

use super::{Family, Rows, SnapLayer, StateSnapshot};
use crate::kimi_k3::state::{K3State, LayerState};
use crate::qwen3::Qwen3State;
use std::borrow::Cow;
use std::io::{Read, Write};
use std::sync::Arc;

/// Version of the byte layout [`StateSnapshot::encode`] writes. Version 1 interleaved each
/// layer's header with its arrays; version 2 puts the whole layout first.
pub const SNAPSHOT_FORMAT_VERSION: u32 = 2;

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

/// The shape of the states of a Kimi K3-state model of `owner` whose layers have `shapes`,
/// without a state ([`crate::Model::state_shape`]); equal to [`k3_shape`] of its fresh state.
pub(crate) fn k3_shape_of(
    shapes: &[crate::kimi_k3::state::LayerShape],
    owner: &'static str,
) -> StateShape {
    use crate::kimi_k3::state::LayerShape as L;
    let layers = shapes
        .iter()
        .map(|l| match *l {
            L::Kda { heads, dim, conv_len } => {
                LayerShape::Kda { heads, dim, s_len: heads * dim * dim, conv_len }
            }
            L::Mla { lat_dim, pe_dim } => LayerShape::Mla { lat_dim, pe_dim },
        })
        .collect();
    StateShape { family: Family::KimiK3, owner, layers }
}

impl StateShape {
    /// Bytes of the part of a snapshot of this shape that does not grow with positions (Kimi
    /// K3's committed KDA recurrent and conv states; 0 for states of append-only caches).
    pub fn fixed_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerShape::Kda { s_len, conv_len, .. } => 4 * (s_len + conv_len),
                LayerShape::Mla { .. } | LayerShape::Kv { .. } => 0,
            })
            .sum()
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

/// `v`'s exact bits as little-endian bytes: `v`'s own memory on a little-endian machine.
pub fn le_bytes(v: &[f32]) -> Cow<'_, [u8]> {
    if cfg!(target_endian = "little") {
        Cow::Borrowed(bytemuck::cast_slice(v))
    } else {
        Cow::Owned(v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect())
    }
}

/// Turns values whose bytes were read little-endian into native values, in place (nothing to
/// do on a little-endian machine).
pub fn from_le_in_place(v: &mut [f32]) {
    if cfg!(target_endian = "big") {
        for x in v {
            *x = f32::from_bits(u32::from_le(x.to_bits()));
        }
    }
}

fn put_u32(w: &mut Vec<u8>, v: usize) -> std::io::Result<()> {
    let v = u32::try_from(v).map_err(|_| std::io::Error::other("dimension over u32"))?;
    w.extend_from_slice(&v.to_le_bytes());
    Ok(())
}

fn put_u64(w: &mut Vec<u8>, v: usize) {
    w.extend_from_slice(&(v as u64).to_le_bytes());
}

/// Reads with a count of the bytes still allowed.
struct Input<'a> {
    r: &'a mut dyn Read,
    left: u64,
}

impl Input<'_> {
    fn take(&mut self, n: u64) -> Result<(), SnapshotCodecError> {
        self.left = self
            .left
            .checked_sub(n)
            .ok_or_else(|| SnapshotCodecError::Io(std::io::ErrorKind::UnexpectedEof.into()))?;
        Ok(())
    }

    fn bytes<const N: usize>(&mut self) -> Result<[u8; N], SnapshotCodecError> {
        self.take(N as u64)?;
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

    fn u64(&mut self) -> Result<usize, SnapshotCodecError> {
        Ok(usize::try_from(u64::from_le_bytes(self.bytes()?)).unwrap_or(usize::MAX))
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

/// A snapshot's layout, read and checked against the model ([`StateSnapshot::read_layout`]):
/// how many f32 values each array that follows holds.
#[derive(Debug, Clone)]
pub struct SnapshotLayout {
    shape: StateShape,
    len: usize,
    arrays: Vec<usize>,
}

impl SnapshotLayout {
    /// Committed positions of the snapshot.
    pub fn positions(&self) -> usize {
        self.len
    }

    /// Values in each array, in file order.
    pub fn array_lens(&self) -> &[usize] {
        &self.arrays
    }

    /// Bytes of all the arrays.
    pub fn array_bytes(&self) -> u64 {
        self.arrays.iter().map(|&n| (n as u64).saturating_mul(4)).fold(0, u64::saturating_add)
    }

    /// Every array, zeroed, at its final size, allocated in parallel on the current kernel
    /// pool (touching 1.4 GB of fresh pages is itself a tenth of a second on one core).
    pub fn alloc(&self) -> Vec<Arc<[f32]>> {
        sluice_kernels::pool::map(self.arrays.len(), |i| {
            std::iter::repeat_n(0.0f32, self.arrays[i]).collect()
        })
    }

    /// The snapshot made of `arrays` (filled from the file's bytes, little-endian, in the
    /// order and at the sizes of [`SnapshotLayout::array_lens`]).
    pub fn assemble(
        &self,
        mut arrays: Vec<Arc<[f32]>>,
    ) -> Result<StateSnapshot, SnapshotCodecError> {
        let lens: Vec<usize> = arrays.iter().map(|a| a.len()).collect();
        if lens != self.arrays {
            return Err(mismatch("arrays of other sizes than the layout's"));
        }
        for a in &mut arrays {
            if let Some(v) = Arc::get_mut(a) {
                from_le_in_place(v);
            }
        }
        let rows = |v: Arc<[f32]>| {
            let len = v.len();
            Rows { segs: if len == 0 { Vec::new() } else { vec![v] }, len }
        };
        let mut it = arrays.into_iter();
        let mut next = || it.next().ok_or_else(|| mismatch("fewer arrays than layers need"));
        let mut layers = Vec::with_capacity(self.shape.layers.len());
        for &l in &self.shape.layers {
            layers.push(match l {
                LayerShape::Kda { heads, dim, .. } => {
                    SnapLayer::Kda { s: next()?, conv: next()?, heads, dim }
                }
                LayerShape::Mla { lat_dim, pe_dim } => {
                    SnapLayer::Mla { lat: rows(next()?), pe: rows(next()?), lat_dim, pe_dim }
                }
                LayerShape::Kv { width } => {
                    SnapLayer::Kv { k: rows(next()?), v: rows(next()?), width }
                }
            });
        }
        Ok(StateSnapshot {
            family: self.shape.family,
            owner: self.shape.owner,
            layers,
            len: self.len,
        })
    }
}

impl StateSnapshot {
    /// The layout section of the byte form (see the module docs).
    pub fn layout_bytes(&self) -> std::io::Result<Vec<u8>> {
        let mut w = Vec::with_capacity(16 + 25 * self.layers.len());
        w.push(self.family.code());
        put_u64(&mut w, self.len);
        put_u32(&mut w, self.layers.len())?;
        for l in &self.layers {
            match l {
                SnapLayer::Kda { s, conv, heads, dim } => {
                    w.push(1);
                    put_u32(&mut w, *heads)?;
                    put_u32(&mut w, *dim)?;
                    put_u64(&mut w, s.len());
                    put_u64(&mut w, conv.len());
                }
                SnapLayer::Mla { lat_dim, pe_dim, .. } => {
                    w.push(2);
                    put_u32(&mut w, *lat_dim)?;
                    put_u32(&mut w, *pe_dim)?;
                }
                SnapLayer::Kv { width, .. } => {
                    w.push(3);
                    put_u32(&mut w, *width)?;
                }
            }
        }
        Ok(w)
    }

    /// The arrays that follow the layout, in file order, as the pieces this snapshot holds
    /// them in (a cache array shared along a chain is several segments, written back to back).
    pub fn array_pieces(&self) -> Vec<&[f32]> {
        let mut out = Vec::new();
        for l in &self.layers {
            match l {
                SnapLayer::Kda { s, conv, .. } => out.extend([&s[..], &conv[..]]),
                SnapLayer::Mla { lat: a, pe: b, .. } | SnapLayer::Kv { k: a, v: b, .. } => {
                    out.extend(a.segs.iter().map(|s| &s[..]));
                    out.extend(b.segs.iter().map(|s| &s[..]));
                }
            }
        }
        out
    }

    /// Writes the snapshot's byte form (see the module docs) to `w`, in order, on this thread.
    pub fn encode(&self, w: &mut dyn Write) -> std::io::Result<()> {
        w.write_all(&self.layout_bytes()?)?;
        self.array_pieces().into_iter().try_for_each(|p| w.write_all(&le_bytes(p)))
    }

    /// Bytes [`StateSnapshot::encode`] writes.
    pub fn encoded_len(&self) -> usize {
        let mut n = 1 + 8 + 4;
        for l in &self.layers {
            n += match l {
                SnapLayer::Kda { s, conv, .. } => 1 + 4 + 4 + 8 + 8 + 4 * (s.len() + conv.len()),
                SnapLayer::Mla { lat, pe, .. } => 1 + 4 + 4 + 4 * (lat.len + pe.len),
                SnapLayer::Kv { k, v, .. } => 1 + 4 + 4 * (k.len + v.len),
            };
        }
        n
    }

    /// Reads the layout section from `r` for a model whose states have `shape`, when at most
    /// `limit` bytes (layout and arrays) are left to read: anything that does not fit `shape`,
    /// or arrays larger than what is left, is refused before anything is allocated.
    pub fn read_layout(
        r: &mut dyn Read,
        shape: &StateShape,
        limit: u64,
    ) -> Result<SnapshotLayout, SnapshotCodecError> {
        let mut r = Input { r, left: limit };
        let family =
            Family::from_code(r.u8()?).ok_or_else(|| mismatch("an unknown state family"))?;
        if family != shape.family {
            return Err(mismatch(format!(
                "a {family:?} state, this model's is {:?}",
                shape.family
            )));
        }
        let len = r.u64()?;
        expect("the layer count", r.u32()?, shape.layers.len())?;
        let too_long = || mismatch("more positions than an array can hold");
        let mut arrays = Vec::with_capacity(2 * shape.layers.len());
        for &ls in &shape.layers {
            match (r.u8()?, ls) {
                (1, LayerShape::Kda { heads, dim, s_len, conv_len }) => {
                    expect("a KDA layer's head count", r.u32()?, heads)?;
                    expect("a KDA layer's head dimension", r.u32()?, dim)?;
                    expect("a KDA recurrent state's length", r.u64()?, s_len)?;
                    expect("a KDA conv window's length", r.u64()?, conv_len)?;
                    arrays.extend([s_len, conv_len]);
                }
                (2, LayerShape::Mla { lat_dim, pe_dim }) => {
                    expect("an MLA layer's latent width", r.u32()?, lat_dim)?;
                    expect("an MLA layer's rope width", r.u32()?, pe_dim)?;
                    let lat = len.checked_mul(lat_dim).ok_or_else(too_long)?;
                    arrays.extend([lat, len.checked_mul(pe_dim).ok_or_else(too_long)?]);
                }
                (3, LayerShape::Kv { width }) => {
                    expect("a KV layer's width", r.u32()?, width)?;
                    let n = len.checked_mul(width).ok_or_else(too_long)?;
                    arrays.extend([n, n]);
                }
                (k @ 1..=3, _) => {
                    let kind = ["KDA", "MLA", "KV"][usize::from(k - 1)];
                    return Err(mismatch(format!("a {kind} layer where this model has {ls:?}")));
                }
                (k, _) => return Err(mismatch(format!("unknown layer kind {k}"))),
            }
        }
        let layout = SnapshotLayout { shape: shape.clone(), len, arrays };
        r.take(layout.array_bytes())?;
        Ok(layout)
    }

    /// Reads a snapshot written by [`StateSnapshot::encode`], for a model whose states have
    /// `shape`, reading at most `limit` bytes (the caller's file size: no array larger than
    /// what is left is allocated). Anything that does not fit `shape` is refused.
    pub fn decode(
        r: &mut dyn Read,
        shape: &StateShape,
        limit: u64,
    ) -> Result<StateSnapshot, SnapshotCodecError> {
        let layout = Self::read_layout(r, shape, limit)?;
        let mut arrays = layout.alloc();
        for a in &mut arrays {
            let v = Arc::get_mut(a).expect("invariant: just allocated, not shared");
            r.read_exact(bytemuck::cast_slice_mut(v))?;
        }
        layout.assemble(arrays)
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

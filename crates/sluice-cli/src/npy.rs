//! Writing `.npy` files (NumPy format 1.0) of little-endian f32, atomically.

use anyhow::{Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The temporary file [`write_f32_2d`] writes before renaming it to `path`.
pub fn temp_path(path: &Path) -> PathBuf {
    path.with_extension("npy.tmp")
}

/// Writes `rows` (each `cols` long) as a `[rows, cols]` f32 array at `path` (temp + fsync + rename).
pub fn write_f32_2d(path: &Path, rows: &[Vec<f32>], cols: usize) -> Result<()> {
    let mut header = format!(
        "{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {}), }}",
        rows.len(),
        cols
    );
    // magic(6) + version(2) + header length(2) + header, padded with spaces to 64 and ending '\n'.
    let unpadded = 10 + header.len() + 1;
    header.push_str(&" ".repeat((64 - unpadded % 64) % 64));
    header.push('\n');
    let hlen = u16::try_from(header.len()).context("npy header too long")?;
    let tmp = temp_path(path);
    let mut f =
        std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let mut buf = Vec::with_capacity(10 + header.len() + rows.len() * cols * 4);
    buf.extend_from_slice(b"\x93NUMPY\x01\x00");
    buf.extend_from_slice(&hlen.to_le_bytes());
    buf.extend_from_slice(header.as_bytes());
    for r in rows {
        anyhow::ensure!(r.len() == cols, "logits row has {} values, expected {cols}", r.len());
        for v in r {
            buf.extend_from_slice(&v.to_le_bytes());
        }
    }
    f.write_all(&buf).with_context(|| format!("writing {}", tmp.display()))?;
    f.sync_all().with_context(|| format!("syncing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming into {}", path.display()))?;
    Ok(())
}

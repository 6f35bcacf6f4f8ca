//! `--spine bf16|int8`: which precision of the spine a run uses, and the directory that holds it.
//!
//! The published checkpoint is the `bf16` spine (whatever dtypes it was published in); `int8`
//! is the lossy row-int8 conversion `sluice convert --spine int8 DIR` writes (docs/INT8.md).
//! Lossy is never silent, so each choice is checked against the directory:
//!
//! - `bf16` (the default) refuses a converted directory (one holding
//!   `sluice-int8-manifest.json`), an unfinished conversion (its progress journal) and any
//!   checkpoint holding I8 tensors.
//! - `int8` runs a converted directory given directly, or else the default conversion output of
//!   the directory given (its sibling `DIR-int8`), and refuses, naming both, when neither holds a
//!   finished conversion; a stream install without such a sibling is refused with its
//!   own reason (it holds no routed experts to convert; see [`crate::install`]).

use crate::EngineError;
use sluice_checkpoint::convert::{default_output, is_converted, MANIFEST_FILE};
use sluice_checkpoint::Checkpoint;
use sluice_core::DType;
use std::fmt;
use std::path::{Path, PathBuf};

/// The hidden progress journal of an unfinished conversion (see `sluice_checkpoint::convert`).
const JOURNAL_FILE: &str = ".sluice-int8-progress.json";

/// Which spine a run uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Spine {
    /// The checkpoint as published (exact).
    #[default]
    Bf16,
    /// The row-int8 conversion (lossy).
    Int8,
}

impl Spine {
    /// Parses a `--spine` value.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "bf16" => Some(Self::Bf16),
            "int8" => Some(Self::Int8),
            _ => None,
        }
    }

    /// `bf16` or `int8`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Bf16 => "bf16",
            Self::Int8 => "int8",
        }
    }

    /// How a run labels itself: the name, and for int8 that it is lossy.
    pub fn label(self) -> &'static str {
        match self {
            Self::Bf16 => "bf16 (as published)",
            Self::Int8 => "int8 (row-int8 spine, LOSSY: not the published model's exact output)",
        }
    }
}

impl fmt::Display for Spine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

fn refuse(dir: &Path, reason: String) -> EngineError {
    EngineError::Spine { dir: dir.to_path_buf(), reason }
}

/// The directory a run with `spine` reads, given the `--model` directory `dir`.
pub fn resolve(dir: &Path, spine: Spine) -> Result<PathBuf, EngineError> {
    match spine {
        Spine::Bf16 if is_converted(dir) => Err(refuse(
            dir,
            format!(
                "holds a row-int8 spine ({MANIFEST_FILE}), which is lossy; run it with \
                 --spine int8, or give the original checkpoint"
            ),
        )),
        Spine::Bf16 if dir.join(JOURNAL_FILE).exists() => Err(refuse(
            dir,
            "is an unfinished int8 conversion; finish it with `sluice convert --spine int8 \
             SRC --out DIR` or give the original checkpoint"
                .into(),
        )),
        Spine::Bf16 => Ok(dir.to_path_buf()),
        Spine::Int8 if is_converted(dir) => Ok(dir.to_path_buf()),
        Spine::Int8 => {
            let sibling = default_output(dir);
            if is_converted(&sibling) {
                Ok(sibling)
            } else if crate::install::is_stream_install(dir) {
                Err(crate::install::int8_refusal(dir))
            } else {
                Err(refuse(
                    dir,
                    format!(
                        "--spine int8: neither this directory nor {} holds a finished int8 \
                         conversion ({MANIFEST_FILE}); run `sluice convert --spine int8 {}` first",
                        sibling.display(),
                        dir.display()
                    ),
                ))
            }
        }
    }
}

/// Refuses an opened checkpoint whose tensors contradict `spine`: I8 tensors under `bf16`.
pub fn check(ckpt: &Checkpoint, spine: Spine) -> Result<(), EngineError> {
    if spine == Spine::Bf16 {
        if let Some(e) = ckpt.tensors().find(|e| e.dtype == DType::I8) {
            return Err(refuse(
                ckpt.dir(),
                format!(
                    "tensor {:?} is I8 (a row-int8 spine, lossy); run it with --spine int8",
                    e.name
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for s in [Spine::Bf16, Spine::Int8] {
            assert_eq!(Spine::parse(s.name()), Some(s));
        }
        assert_eq!(Spine::parse("fp8"), None);
        assert_eq!(Spine::default(), Spine::Bf16);
    }
}

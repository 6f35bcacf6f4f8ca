//! The built-in default model: mini-K3, a 31.6M-parameter model with Kimi K3's architecture
//! trained on 64 MB of documentation and source code (issue 17; `tools/mini/`). `sluice run` and
//! `sluice serve` use it when no `--model` is given, so the first command works offline on a
//! fresh clone and prints readable (if small-model) text.
//!
//! Its files are compiled into the binary with `include_bytes!` from
//! `tests/fixtures/kimi_k3/mini-k3/`, so a binary built from the repository (`cargo build`,
//! `cargo install --path crates/sluice-cli`) carries them and needs no download or source tree
//! at run time. On first use they are written into the cache directory under a temporary name,
//! fsynced, read back and checked against the committed SHA-256 sums (`SHA256SUMS` beside them),
//! and only then renamed into place. Every later start checks each cached file's size and
//! SHA-256 again (about 31 MB of hashing), so a corrupt, truncated or partial copy is replaced
//! before anything runs it, never opened.
//!
//! Beside it ships its default draft, mini-draft (`tests/fixtures/qwen3/mini-draft/`): a 2.5M-
//! parameter Qwen3 with its own 4096-entry tokenizer, trained on the same corpus, which drafts
//! for mini-K3 through the cross-tokenizer path. It is placed and checked the same way, in its
//! own cache directory ([`ensure_builtin_draft`]).
//!
//! Both are behind the default cargo feature `builtin-model`. A build without it
//! (`cargo build --release -p sluice-cli --no-default-features`) is about 38 MB smaller, for
//! machines that only ever run `--model DIR`; there the commands that need the built-in model
//! say so ([`BuiltinError::NotBuilt`]).

use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// Directory name of the built-in model inside the cache.
pub const BUILTIN_NAME: &str = "mini-k3";

/// What every command that uses the built-in model says about it.
pub const BUILTIN_DESCRIPTION: &str = "mini-K3, a 31.6M-parameter Kimi K3-architecture model \
trained on 64 MB of docs and code; its text is readable but it is small";

/// Directory name of the built-in draft inside the cache.
pub const BUILTIN_DRAFT_NAME: &str = "mini-draft";

/// The committed sums, in `sha256sum` format (`HEX  NAME` per line).
const SUMS: &str = include_str!("../../../tests/fixtures/kimi_k3/mini-k3/SHA256SUMS");
/// The draft's committed sums.
const DRAFT_SUMS: &str = include_str!("../../../tests/fixtures/qwen3/mini-draft/SHA256SUMS");

#[cfg(feature = "builtin-model")]
macro_rules! mini {
    ($name:literal) => {
        ($name, include_bytes!(concat!("../../../tests/fixtures/kimi_k3/mini-k3/", $name)))
    };
}
#[cfg(not(feature = "builtin-model"))]
macro_rules! mini {
    ($name:literal) => {
        ($name, &[])
    };
}

/// The embedded files: name and bytes.
const FILES: [(&str, &[u8]); 8] = [
    mini!("config.json"),
    mini!("generation_config.json"),
    mini!("model-00001-of-000003.safetensors"),
    mini!("model-00002-of-000003.safetensors"),
    mini!("model-00003-of-000003.safetensors"),
    mini!("model.safetensors.index.json"),
    mini!("tiktoken.model"),
    mini!("tokenizer_config.json"),
];

#[cfg(feature = "builtin-model")]
macro_rules! draft {
    ($name:literal) => {
        ($name, include_bytes!(concat!("../../../tests/fixtures/qwen3/mini-draft/", $name)))
    };
}
#[cfg(not(feature = "builtin-model"))]
macro_rules! draft {
    ($name:literal) => {
        ($name, &[])
    };
}

/// The embedded draft's files: name and bytes.
const DRAFT_FILES: [(&str, &[u8]); 5] = [
    draft!("config.json"),
    draft!("generation_config.json"),
    draft!("model.safetensors"),
    draft!("tokenizer.json"),
    draft!("tokenizer_config.json"),
];

/// One embedded checkpoint: its cache directory name, committed sums and files.
struct Embedded {
    name: &'static str,
    sums: &'static str,
    files: &'static [(&'static str, &'static [u8])],
}

const MODEL: Embedded = Embedded { name: BUILTIN_NAME, sums: SUMS, files: &FILES };
const DRAFT: Embedded =
    Embedded { name: BUILTIN_DRAFT_NAME, sums: DRAFT_SUMS, files: &DRAFT_FILES };

/// Why the built-in model could not be placed in the cache.
#[derive(Debug, thiserror::Error)]
pub enum BuiltinError {
    /// A file system operation failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The path it failed on.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A file read back after writing does not match its committed sum (a failing disk, or a
    /// binary built from a checkout whose files and `SHA256SUMS` disagree).
    #[error("{}: SHA-256 {got} after writing, expected {want} (committed SHA256SUMS)", path.display())]
    Mismatch {
        /// The file.
        path: PathBuf,
        /// Its SHA-256.
        got: String,
        /// The committed sum.
        want: String,
    },
    /// `SHA256SUMS` lacks a line for an embedded file.
    #[error("SHA256SUMS has no sum for {0}")]
    NoSum(&'static str),
    /// This binary was built without the default feature `builtin-model`.
    #[error(
        "this sluice was built without its built-in model (cargo feature `builtin-model`); \
         pass --model DIR"
    )]
    NotBuilt,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BuiltinError + '_ {
    move |source| BuiltinError::Io { path: path.to_path_buf(), source }
}

/// The committed SHA-256 (lowercase hex) of the built-in model's embedded file `name`.
pub fn committed_sum(name: &str) -> Option<&'static str> {
    sum_in(SUMS, name)
}

fn sum_in(sums: &'static str, name: &str) -> Option<&'static str> {
    sums.lines().find_map(|l| {
        let (sum, file) = l.split_once("  ")?;
        (file.trim() == name).then_some(sum.trim())
    })
}

/// The embedded files' names, in the order they are written.
pub fn file_names() -> impl Iterator<Item = &'static str> {
    FILES.iter().map(|(n, _)| *n)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-256 of the file at `path`, or `None` when it cannot be read.
fn file_sum(path: &Path) -> Option<String> {
    let mut f = std::fs::File::open(path).ok()?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match f.read(&mut buf) {
            Ok(0) => return Some(hex(&h.finalize())),
            Ok(n) => h.update(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
}

/// The first file of `dir` that is missing, of the wrong size or whose SHA-256 differs from the
/// committed sum of the built-in model; `None` when the whole copy is intact.
pub fn first_bad_file(dir: &Path) -> Option<&'static str> {
    MODEL.first_bad_file(dir)
}

/// [`first_bad_file`] for the built-in draft.
pub fn first_bad_draft_file(dir: &Path) -> Option<&'static str> {
    DRAFT.first_bad_file(dir)
}

/// Returns the built-in model's directory under `cache`, first (re)writing it when it is
/// absent or any file fails the size and SHA-256 check; `replaced` is told which file was bad.
/// A damaged copy is moved aside and deleted, never opened.
pub fn ensure_builtin_model(
    cache: &Path,
    replaced: &mut dyn FnMut(&str),
) -> Result<PathBuf, BuiltinError> {
    MODEL.ensure(cache, replaced)
}

/// [`ensure_builtin_model`] for the built-in draft, mini-draft (its own directory beside it).
pub fn ensure_builtin_draft(
    cache: &Path,
    replaced: &mut dyn FnMut(&str),
) -> Result<PathBuf, BuiltinError> {
    DRAFT.ensure(cache, replaced)
}

impl Embedded {
    fn first_bad_file(&self, dir: &Path) -> Option<&'static str> {
        self.files.iter().find_map(|(name, bytes)| {
            let path = dir.join(name);
            let size_ok = std::fs::metadata(&path).is_ok_and(|m| m.len() == bytes.len() as u64);
            let sum_ok = size_ok && file_sum(&path).as_deref() == sum_in(self.sums, name);
            (!sum_ok).then_some(*name)
        })
    }

    fn ensure(
        &self,
        cache: &Path,
        replaced: &mut dyn FnMut(&str),
    ) -> Result<PathBuf, BuiltinError> {
        if !cfg!(feature = "builtin-model") {
            return Err(BuiltinError::NotBuilt);
        }
        let name = self.name;
        // Copies that an interrupted process was writing or had set aside.
        if cache.is_dir() {
            crate::demo::remove_abandoned(cache, name, &[".tmp-", ".bad-"]).map_err(io(cache))?;
        }
        let dir = cache.join(name);
        match self.first_bad_file(&dir) {
            None => return Ok(dir),
            Some(bad) if dir.exists() => replaced(bad),
            Some(_) => {}
        }
        std::fs::create_dir_all(cache).map_err(io(cache))?;
        let pid = std::process::id();
        let tmp = cache.join(format!("{name}.tmp-{pid}"));
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
        }
        std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
        for &(file, bytes) in self.files {
            let want = sum_in(self.sums, file).ok_or(BuiltinError::NoSum(file))?;
            let path = tmp.join(file);
            let mut f = std::fs::File::create(&path).map_err(io(&path))?;
            f.write_all(bytes).map_err(io(&path))?;
            f.sync_all().map_err(io(&path))?;
            // Read back what the disk holds: the sum is checked on the bytes that will be run.
            let got = file_sum(&path).unwrap_or_default();
            if got != want {
                let _ = std::fs::remove_dir_all(&tmp);
                return Err(BuiltinError::Mismatch { path, got, want: want.into() });
            }
        }
        sync_dir(&tmp)?;
        // A damaged copy is renamed aside first (a process that has it open keeps its files), then
        // the checked copy takes its name.
        let aside = cache.join(format!("{name}.bad-{pid}"));
        if dir.exists() {
            std::fs::rename(&dir, &aside).map_err(io(&dir))?;
        }
        let placed = std::fs::rename(&tmp, &dir);
        let _ = std::fs::remove_dir_all(&aside);
        match placed {
            Ok(()) => {}
            // Another process placed its checked copy first: use that one.
            Err(_) if self.first_bad_file(&dir).is_none() => {
                let _ = std::fs::remove_dir_all(&tmp);
            }
            Err(e) => return Err(io(&dir)(e)),
        }
        sync_dir(cache)?;
        Ok(dir)
    }
}

/// fsyncs a directory so the names in it survive a crash.
fn sync_dir(dir: &Path) -> Result<(), BuiltinError> {
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn embedded_files_match_the_committed_sums() {
        for emb in [&MODEL, &DRAFT] {
            for &(name, bytes) in emb.files {
                let sum = hex(&Sha256::digest(bytes));
                assert_eq!(Some(sum.as_str()), sum_in(emb.sums, name), "{}/{name}", emb.name);
            }
        }
    }

    #[test]
    fn flipped_byte_in_the_cached_draft_was_run() {
        let cache = tempfile::tempdir().unwrap();
        let model = ensure_builtin_model(cache.path(), &mut |_| panic!("fresh copy")).unwrap();
        let dir = ensure_builtin_draft(cache.path(), &mut |_| panic!("fresh copy")).unwrap();
        assert_eq!(dir, cache.path().join(BUILTIN_DRAFT_NAME));
        let weights = dir.join("model.safetensors");
        let mut b = std::fs::read(&weights).unwrap();
        let mid = b.len() / 2;
        b[mid] ^= 0x01;
        std::fs::write(&weights, &b).unwrap();
        assert_eq!(first_bad_draft_file(&dir), Some("model.safetensors"));
        let mut seen = Vec::new();
        ensure_builtin_draft(cache.path(), &mut |f| seen.push(f.to_owned())).unwrap();
        assert_eq!(seen, ["model.safetensors"]);
        assert_eq!(first_bad_draft_file(&dir), None, "the draft was replaced");
        assert_eq!(first_bad_file(&model), None, "the model beside it is untouched");
        let left: Vec<_> = std::fs::read_dir(cache.path()).unwrap().collect();
        assert_eq!(left.len(), 2, "no temporary or set-aside directory is left");
    }

    #[test]
    fn flipped_byte_in_a_cached_shard_was_run() {
        let cache = tempfile::tempdir().unwrap();
        let dir = ensure_builtin_model(cache.path(), &mut |_| panic!("fresh copy")).unwrap();
        let shard = dir.join("model-00002-of-000003.safetensors");
        let mut b = std::fs::read(&shard).unwrap();
        let mid = b.len() / 2;
        b[mid] ^= 0x10;
        std::fs::write(&shard, &b).unwrap();
        assert_eq!(first_bad_file(&dir), Some("model-00002-of-000003.safetensors"));
        let mut seen = Vec::new();
        let again = ensure_builtin_model(cache.path(), &mut |f| seen.push(f.to_owned())).unwrap();
        assert_eq!(again, dir);
        assert_eq!(seen, ["model-00002-of-000003.safetensors"]);
        assert_eq!(first_bad_file(&dir), None, "the shard was replaced");
        let leftovers: Vec<_> = std::fs::read_dir(cache.path()).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "no temporary or set-aside directory is left");
    }

    #[test]
    fn partial_cached_directory_was_run() {
        let cache = tempfile::tempdir().unwrap();
        let dir = cache.path().join(BUILTIN_NAME);
        // What an interrupted copy by hand (or an older sluice) leaves: some files, one cut short.
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.json"), FILES[0].1).unwrap();
        std::fs::write(dir.join("model-00001-of-000003.safetensors"), &FILES[2].1[..4096]).unwrap();
        assert_eq!(first_bad_file(&dir), Some("generation_config.json"));
        let mut seen = Vec::new();
        ensure_builtin_model(cache.path(), &mut |f| seen.push(f.to_owned())).unwrap();
        assert_eq!(seen, ["generation_config.json"]);
        assert_eq!(first_bad_file(&dir), None, "the directory was completed");
        let shard = std::fs::read(dir.join("model-00001-of-000003.safetensors")).unwrap();
        assert_eq!(shard, FILES[2].1);
    }

    #[test]
    fn intact_copy_is_kept() {
        let cache = tempfile::tempdir().unwrap();
        let dir = ensure_builtin_model(cache.path(), &mut |_| panic!("fresh copy")).unwrap();
        let before = std::fs::metadata(dir.join("tiktoken.model")).unwrap().modified().unwrap();
        ensure_builtin_model(cache.path(), &mut |f| panic!("{f} reported bad")).unwrap();
        let after = std::fs::metadata(dir.join("tiktoken.model")).unwrap().modified().unwrap();
        assert_eq!(before, after, "an intact copy is not rewritten");
    }
}

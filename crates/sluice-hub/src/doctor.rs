//! `sluice doctor`: a read-only, network-free health check of an install.
//!
//! [`check_install`] reads `sluice-install.json` and checks every file it lists: present, of
//! the recorded size (stream shards: the header file `8 + N` bytes, the sparse file the whole
//! shard's length), and with `deep` their SHA-256 against the manifest (whole files; for
//! stream shards each recorded spine range, and each cached expert against the expert-cache
//! log). Every problem comes with what to do about it. Nothing is written and no request is
//! made.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde::Serialize;
use sha2::{Digest, Sha256};
use sluice_store::remote::log::{self, LOG_FILE};

use crate::download::hex;
use crate::error::Result;
use crate::manifest::FileState;
use crate::plan::Mode;
use crate::remote::Install;

/// One thing wrong with an install, and the fix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// The file concerned, relative to the model directory.
    pub file: String,
    /// What is wrong.
    pub what: String,
    /// What to do about it.
    pub fix: String,
}

/// The expert cache of a stream install.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CacheHealth {
    /// Experts recorded present.
    pub experts: usize,
    /// Their bytes.
    pub bytes: u64,
    /// Experts whose bytes were hashed (`deep`) and matched.
    pub verified: usize,
    /// Log lines that did not parse (a torn last line is harmless).
    pub bad_lines: usize,
}

/// What [`check_install`] found.
#[derive(Debug, Clone, Serialize)]
pub struct InstallHealth {
    /// The model directory.
    pub dir: PathBuf,
    /// `full` or `stream`.
    pub mode: Mode,
    /// `ORG/NAME`.
    pub repo: String,
    /// The revision asked for at pull time.
    pub revision: String,
    /// The pinned commit.
    pub commit: String,
    /// The hub it came from.
    pub endpoint: String,
    /// Whether the pull finished.
    pub complete: bool,
    /// Files listed in the manifest.
    pub files: usize,
    /// Bytes of those files as published.
    pub bytes: u64,
    /// Files whose content was hashed (`deep`).
    pub hashed: usize,
    /// The expert cache (stream installs).
    pub cache: Option<CacheHealth>,
    /// Everything wrong.
    pub problems: Vec<Problem>,
}

/// Checks the install in `dir`; `Ok(None)` when `dir` has no `sluice-install.json`.
pub fn check_install(dir: &Path, deep: bool) -> Result<Option<InstallHealth>> {
    let Some(install) = Install::detect(dir)? else { return Ok(None) };
    let m = &install.manifest;
    let repair =
        format!("re-run `sluice pull {} --revision {} --dir {}`", m.repo, m.commit, dir.display());
    let mut h = InstallHealth {
        dir: dir.to_path_buf(),
        mode: m.mode,
        repo: m.repo.clone(),
        revision: m.revision.clone(),
        commit: m.commit.clone(),
        endpoint: m.endpoint.clone(),
        complete: m.complete,
        files: m.files.len(),
        bytes: m.files.iter().map(|f| f.size).sum(),
        hashed: 0,
        cache: None,
        problems: Vec::new(),
    };
    if !m.complete {
        h.problems.push(Problem {
            file: crate::layout::MANIFEST_FILE.into(),
            what: "the pull did not finish".into(),
            fix: format!("{repair} to finish it"),
        });
    }
    for f in &m.files {
        let mut problem = |file: &str, what: String, deep_fix: bool| {
            let fix = if deep_fix {
                format!("{repair} --deep to replace it")
            } else {
                format!("{repair} to repair it")
            };
            h.problems.push(Problem { file: file.to_owned(), what, fix });
        };
        match f.state {
            FileState::Pending => problem(&f.path, "not installed yet".into(), false),
            FileState::Full => {
                let p = dir.join(&f.path);
                match std::fs::metadata(&p) {
                    Err(e) => problem(&f.path, format!("missing ({e})"), false),
                    Ok(md) if md.len() != f.size => {
                        problem(&f.path, format!("{} bytes, expected {}", md.len(), f.size), false)
                    }
                    Ok(_) if deep => match (&f.sha256, sha256_file(&p)) {
                        (_, Err(e)) => problem(&f.path, format!("unreadable: {e}"), false),
                        (Some(want), Ok(got)) if *want != got => problem(
                            &f.path,
                            format!("SHA-256 {got} does not match the manifest's {want}"),
                            true,
                        ),
                        _ => h.hashed += 1,
                    },
                    Ok(_) => {}
                }
            }
            FileState::Stream => {
                let Some(s) = &f.stream else {
                    problem(&f.path, "stream shard without its stream record".into(), false);
                    continue;
                };
                let header_len = 8 + s.header_len;
                for (name, want) in [(&s.header, header_len), (&s.sparse, f.size)] {
                    match std::fs::metadata(dir.join(name)) {
                        Err(e) => problem(name, format!("missing ({e})"), false),
                        Ok(md) if md.len() != want => {
                            problem(name, format!("{} bytes, expected {want}", md.len()), false);
                        }
                        Ok(_) => {}
                    }
                }
                if deep {
                    match File::open(dir.join(&s.sparse)) {
                        Err(_) => {}
                        Ok(file) => {
                            let mut bad = 0usize;
                            for r in &s.ranges {
                                if sha256_range(&file, r.start, r.end - r.start).ok().as_ref()
                                    != Some(&r.sha256)
                                {
                                    bad += 1;
                                }
                            }
                            if bad > 0 {
                                problem(
                                    &s.sparse,
                                    format!("{bad} spine range(s) do not match their SHA-256"),
                                    true,
                                );
                            } else {
                                h.hashed += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    if m.mode == Mode::Stream {
        h.cache = Some(check_cache(dir, &m.commit, deep, &mut h.problems)?);
    }
    Ok(Some(h))
}

fn check_cache(
    dir: &Path,
    commit: &str,
    deep: bool,
    problems: &mut Vec<Problem>,
) -> Result<CacheHealth> {
    let path = dir.join(LOG_FILE);
    let st = match log::read(&path) {
        Ok(Some(st)) => st,
        Ok(None) => return Ok(CacheHealth::default()),
        Err(e) => return Err(crate::error::HubError::io(&path, e)),
    };
    let mut c = CacheHealth { bad_lines: st.bad_lines, ..CacheHealth::default() };
    if st.commit.as_deref() != Some(commit) {
        problems.push(Problem {
            file: LOG_FILE.into(),
            what: format!(
                "the expert cache is for commit {:?}, the install is {commit}",
                st.commit
            ),
            fix: "nothing: the next run starts the cache afresh".into(),
        });
        return Ok(c);
    }
    c.experts = st.present.len();
    c.bytes = st.present_bytes();
    if deep {
        let mut bad = Vec::new();
        for p in &st.present {
            let mut hasher = Sha256::new();
            let mut ok = true;
            for s in &p.spans {
                let read =
                    File::open(dir.join(&s.shard)).and_then(|f| read_range(&f, s.offset, s.len));
                match read {
                    Ok(b) => hasher.update(&b),
                    Err(_) => ok = false,
                }
            }
            if ok && hex(&hasher.finalize()) == p.sha256 {
                c.verified += 1;
            } else {
                bad.push(format!("{}/{}", p.layer, p.expert));
            }
        }
        if !bad.is_empty() {
            problems.push(Problem {
                file: LOG_FILE.into(),
                what: format!(
                    "cached expert(s) {} (layer/expert) do not match their SHA-256",
                    bad.join(", ")
                ),
                fix: format!("delete {} (cached experts are fetched again on use)", path.display()),
            });
        }
    }
    Ok(c)
}

fn read_range(f: &File, offset: u64, len: u64) -> io::Result<Vec<u8>> {
    let n = usize::try_from(len).map_err(io::Error::other)?;
    let mut buf = vec![0u8; n];
    f.read_exact_at(&mut buf, offset)?;
    Ok(buf)
}

fn sha256_range(f: &File, offset: u64, len: u64) -> io::Result<String> {
    Ok(hex(&Sha256::digest(read_range(f, offset, len)?)))
}

fn sha256_file(path: &Path) -> io::Result<String> {
    let mut f = File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(hex(&h.finalize()));
        }
        h.update(&buf[..n]);
    }
}

impl InstallHealth {
    /// True when nothing is wrong.
    pub fn healthy(&self) -> bool {
        self.problems.is_empty()
    }
}

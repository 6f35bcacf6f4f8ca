//! Parsing of the two tokenizer files a Kimi checkpoint ships: `tiktoken.model` and
//! `tokenizer_config.json`.
//!
//! `tiktoken.model` has one `base64(token bytes) rank` pair per line (tiktoken's
//! `load_tiktoken_bpe` format). Blank lines are skipped as tiktoken does; everything else is
//! strict: standard base64 with padding, a decimal `u32` rank, no repeated rank or token, ranks
//! exactly `0..N` in any order. Errors carry the file and the 1-based line.
//!
//! `tokenizer_config.json` contributes its `added_tokens_decoder` (id → `{content, special, …}`);
//! Kimi K3 puts its 256 reserved special tokens there at ids N..N+255. Other keys are ignored.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use base64::Engine as _;
use serde::Deserialize;

use crate::error::{Error, Result};

/// One entry of `added_tokens_decoder`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct AddedToken {
    /// The token's spelling, e.g. `<|open|>`.
    pub content: String,
    /// Whether the tokenizer treats it as a special (control) token.
    #[serde(default)]
    pub special: bool,
}

#[derive(Deserialize)]
struct TokenizerConfig {
    #[serde(default)]
    added_tokens_decoder: BTreeMap<String, AddedToken>,
}

/// Cuts `s` to at most 80 characters for an error message.
fn clip(s: &str) -> String {
    s.chars().take(80).collect()
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| Error::Io { path: path.to_path_buf(), source })
}

/// Reads a `tiktoken.model` file; returns the token bytes in rank order.
pub fn read_rank_file(path: &Path) -> Result<Vec<Vec<u8>>> {
    let data = read(path)?;
    let text = std::str::from_utf8(&data).map_err(|e| {
        let line = data[..e.valid_up_to()].iter().filter(|&&b| b == b'\n').count() + 1;
        Error::MalformedLine { path: path.to_path_buf(), line, found: "<not UTF-8>".into() }
    })?;
    parse_rank_file(text, path)
}

/// Parses the text of a `tiktoken.model` file; `path` is used in errors only.
pub fn parse_rank_file(text: &str, path: &Path) -> Result<Vec<Vec<u8>>> {
    let at = |line| (path.to_path_buf(), line);
    // (rank, bytes, line) in file order, then placed by rank.
    let mut entries: Vec<(u32, Vec<u8>, usize)> = Vec::new();
    let mut token_line: HashMap<Vec<u8>, usize> = HashMap::new();
    for (idx, raw) in text.lines().enumerate() {
        let line = idx + 1;
        if raw.trim().is_empty() {
            continue;
        }
        let mut fields = raw.split_whitespace();
        let (Some(b64), Some(rank_text), None) = (fields.next(), fields.next(), fields.next())
        else {
            let (path, line) = at(line);
            return Err(Error::MalformedLine { path, line, found: clip(raw) });
        };
        let bytes = base64::engine::general_purpose::STANDARD.decode(b64).map_err(|e| {
            let (path, line) = at(line);
            Error::BadBase64 { path, line, token: clip(b64), reason: e.to_string() }
        })?;
        if bytes.is_empty() {
            let (path, line) = at(line);
            return Err(Error::BadBase64 {
                path,
                line,
                token: clip(b64),
                reason: "a token must have at least one byte".into(),
            });
        }
        let rank: u32 = rank_text.parse().map_err(|_| {
            let (path, line) = at(line);
            Error::BadRank { path, line, rank: clip(rank_text) }
        })?;
        if let Some(&first_line) = token_line.get(&bytes) {
            let (path, line) = at(line);
            return Err(Error::DuplicateToken { path, line, first_line });
        }
        token_line.insert(bytes.clone(), line);
        entries.push((rank, bytes, line));
    }
    let count = entries.len();
    let mut slots: Vec<Option<(Vec<u8>, usize)>> = vec![None; count];
    for (rank, bytes, line) in entries {
        let slot = usize::try_from(rank).ok().and_then(|r| slots.get_mut(r));
        match slot {
            Some(Some((_, first_line))) => {
                let first_line = *first_line;
                let (path, line) = at(line);
                return Err(Error::DuplicateRank { path, line, rank, first_line });
            }
            Some(slot @ None) => *slot = Some((bytes, line)),
            // A rank >= count means some smaller rank is missing; report the smallest below.
            None => {}
        }
    }
    let mut ranks = Vec::with_capacity(count);
    for (rank, slot) in (0u32..).zip(slots) {
        match slot {
            Some((bytes, _)) => ranks.push(bytes),
            None => {
                return Err(Error::RanksNotContiguous {
                    path: path.to_path_buf(),
                    count,
                    missing: rank,
                })
            }
        }
    }
    Ok(ranks)
}

/// Reads `added_tokens_decoder` from a `tokenizer_config.json`, as `(id, token)` sorted by id.
///
/// Ids must be at least `num_ranks` (added tokens live above the BPE ranks) and spellings unique.
pub fn read_added_tokens(path: &Path, num_ranks: usize) -> Result<Vec<(u32, AddedToken)>> {
    let data = read(path)?;
    parse_added_tokens(&data, path, num_ranks)
}

/// Parses the bytes of a `tokenizer_config.json`; `path` is used in errors only.
pub fn parse_added_tokens(
    data: &[u8],
    path: &Path,
    num_ranks: usize,
) -> Result<Vec<(u32, AddedToken)>> {
    let config: TokenizerConfig = serde_json::from_slice(data)
        .map_err(|source| Error::Json { path: path.to_path_buf(), source })?;
    let mut out = Vec::with_capacity(config.added_tokens_decoder.len());
    for (key, token) in config.added_tokens_decoder {
        let id: u32 = key
            .parse()
            .map_err(|_| Error::BadAddedId { path: path.to_path_buf(), id: clip(&key) })?;
        if usize::try_from(id).is_ok_and(|i| i < num_ranks) {
            return Err(Error::AddedIdInRankRange {
                path: path.to_path_buf(),
                id,
                content: token.content,
                num_ranks,
            });
        }
        out.push((id, token));
    }
    out.sort_by_key(|(id, _)| *id);
    let mut seen: HashMap<&str, u32> = HashMap::new();
    for (id, token) in &out {
        if let Some(&first) = seen.get(token.content.as_str()) {
            return Err(Error::DuplicateAddedToken {
                path: path.to_path_buf(),
                content: token.content.clone(),
                first,
                second: *id,
            });
        }
        seen.insert(&token.content, *id);
    }
    Ok(out)
}

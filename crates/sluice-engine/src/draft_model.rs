//! A small dense draft model (Qwen3) with its own tokenizer as a [`Drafter`].
//!
//! The draft and the target do not share a vocabulary, so they meet in *text*: the drafter keeps
//! the target context's bytes (each target token's bytes; special tokens by their spelling),
//! feeds the draft model the text it has not seen yet (encoded with the draft's tokenizer),
//! drafts greedily, and hands the draft text to [`covered_tokens`], which proposes the target
//! tokens the text fully covers.
//!
//! **Incremental.** The draft's KV cache ([`Qwen3State`]) persists between passes. Each call keeps
//! the draft tokens whose bytes are still a prefix of the target's text (the drafts the target
//! accepted), truncates the rest — a KV row depends only on its token and position, so
//! truncation is an exact rollback — and feeds only the new text. The last drafted token is not
//! fed (its logits are never needed unless the target accepts it, and then it is fed with the
//! next text).
//!
//! **Memory.** [`DraftModel::memory_needs`] is the weight bytes, the KV cache for the planned
//! context and the scratch of a feed chunk; the caller charges it to the budget before the
//! target is planned (`LoadOptions::draft_bytes`). Drafting stops (proposes nothing) rather than
//! grow the KV cache past the planned context.

use crate::draft::Drafter;
use crate::generate::argmax;
use crate::retok::{covered_tokens, TokenText};
use sluice_checkpoint::Checkpoint;
use sluice_models::qwen3::{Qwen3, Qwen3State};
use sluice_models::{LogitRows, ModelError};
use sluice_tokenizer::{HfError, HfTokenizer};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Committed target tokens re-encoded in front of the draft text.
const TAIL_TOKENS: usize = 8;
/// Most draft positions fed in one pass (bounds the pass's scratch memory).
const FEED_CHUNK: usize = 256;

/// Errors from opening a draft model.
#[derive(Debug, thiserror::Error)]
pub enum DraftError {
    /// The checkpoint or model failed to load.
    #[error("draft model {dir}: {source}")]
    Model {
        /// The draft directory.
        dir: PathBuf,
        /// The underlying error.
        #[source]
        source: Box<ModelError>,
    },
    /// The draft is not a dense Qwen3 checkpoint.
    #[error("draft model {dir}: architecture {arch:?} cannot draft; --draft takes a Qwen3ForCausalLM checkpoint directory (or none, ngram)")]
    Architecture {
        /// The draft directory.
        dir: PathBuf,
        /// What `config.json` names.
        arch: String,
    },
    /// Its `tokenizer.json` failed to load.
    #[error("draft model {dir}: {source}")]
    Tokenizer {
        /// The draft directory.
        dir: PathBuf,
        /// The underlying error.
        #[source]
        source: Box<HfError>,
    },
}

/// An opened draft model: weights, tokenizer and end-of-sequence ids.
#[derive(Debug)]
pub struct DraftModel {
    model: Qwen3,
    tok: HfTokenizer,
    eos: Vec<u32>,
    dir: PathBuf,
}

impl DraftModel {
    /// Opens the Qwen3 checkpoint in `dir` (maps the weights; computes nothing).
    pub fn open(dir: &Path) -> Result<Self, DraftError> {
        let err = |source: ModelError| DraftError::Model {
            dir: dir.to_path_buf(),
            source: source.into(),
        };
        let ckpt = Checkpoint::open(dir).map_err(|e| err(e.into()))?;
        let arch = ckpt.config().architecture().to_string();
        if arch != "Qwen3ForCausalLM" {
            return Err(DraftError::Architecture { dir: dir.to_path_buf(), arch });
        }
        let eos = eos_ids(ckpt.config().raw());
        let model = Qwen3::load(Arc::new(ckpt)).map_err(err)?;
        let tok = HfTokenizer::from_dir(dir)
            .map_err(|e| DraftError::Tokenizer { dir: dir.to_path_buf(), source: e.into() })?;
        Ok(Self { model, tok, eos, dir: dir.to_path_buf() })
    }

    /// Bytes the draft needs for `context` positions: weights (read every pass), the KV cache
    /// and one feed chunk's activations, attention scores and logits.
    pub fn memory_needs(&self, context: usize) -> u64 {
        let c = self.model.config();
        let kv = 2 * 4 * c.num_hidden_layers * c.kv_cache_row() * context;
        let chunk = FEED_CHUNK.min(context.max(1));
        let q = c.num_attention_heads * c.head_dim;
        let acts = 4 * chunk * (6 * c.hidden_size + 3 * c.intermediate_size + 2 * q);
        let scores = 4 * c.num_attention_heads * chunk * context;
        let logits = 4 * 2 * c.vocab_size;
        self.model.weight_bytes() + u64::try_from(kv + acts + scores + logits).unwrap_or(u64::MAX)
    }

    /// The draft's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Length of the incomplete UTF-8 sequence at the end of `b` (0 when it ends on a complete
/// character or on bytes that can never complete one).
fn incomplete_tail(b: &[u8]) -> usize {
    for back in 1..=b.len().min(3) {
        let lead = b[b.len() - back];
        if lead & 0xc0 == 0x80 {
            continue;
        }
        let width = match lead {
            0xc2..=0xdf => 2,
            0xe0..=0xef => 3,
            0xf0..=0xf4 => 4,
            _ => return 0,
        };
        let open = std::str::from_utf8(&b[b.len() - back..])
            .err()
            .is_some_and(|e| e.error_len().is_none());
        return if back < width && open { back } else { 0 };
    }
    0
}

/// `eos_token_id` from `config.json`: one id or a list.
fn eos_ids(cfg: &serde_json::Value) -> Vec<u32> {
    let v = &cfg["eos_token_id"];
    let one = |x: &serde_json::Value| x.as_u64().and_then(|n| u32::try_from(n).ok());
    match v.as_array() {
        Some(a) => a.iter().filter_map(one).collect(),
        None => one(v).into_iter().collect(),
    }
}

/// Counters of a [`ModelDrafter`].
#[derive(Debug, Clone, Copy, Default)]
pub struct DraftCounters {
    /// Draft-model passes.
    pub passes: usize,
    /// Positions fed to the draft model (context text and drafted tokens).
    pub positions: usize,
    /// Draft tokens generated.
    pub generated: usize,
    /// Weight bytes the draft's passes read.
    pub weight_bytes: u64,
}

/// Drafts with a [`DraftModel`], proposing target tokens; see the module documentation.
pub struct ModelDrafter {
    draft: DraftModel,
    target: Arc<dyn TokenText>,
    state: Qwen3State,
    max_positions: usize,
    /// Target ids seen, and each one's end offset in `text`.
    ids: Vec<u32>,
    ends: Vec<usize>,
    /// The target context's bytes.
    text: Vec<u8>,
    /// What the draft reads: `text` without an incomplete character at its end, with invalid
    /// bytes replaced by U+FFFD.
    view: String,
    /// Draft tokens in `state`, and the end of the bytes they spell (a prefix of `view`, or it
    /// was).
    fed: Vec<u32>,
    fed_ends: Vec<usize>,
    /// The first error the draft model returned; drafting stops after one.
    error: Option<ModelError>,
    /// Work done.
    pub counters: DraftCounters,
}

impl std::fmt::Debug for ModelDrafter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelDrafter")
            .field("draft", &self.draft.dir)
            .field("positions", &self.state.len())
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

impl ModelDrafter {
    /// A drafter over `draft` for a target whose tokens `target` spells, keeping at most
    /// `max_positions` draft positions (the context its memory was charged for).
    pub fn new(draft: DraftModel, target: Arc<dyn TokenText>, max_positions: usize) -> Self {
        let state = draft.model.new_state();
        Self {
            draft,
            target,
            state,
            max_positions,
            ids: Vec::new(),
            ends: Vec::new(),
            text: Vec::new(),
            view: String::new(),
            fed: Vec::new(),
            fed_ends: Vec::new(),
            error: None,
            counters: DraftCounters::default(),
        }
    }

    /// The error that stopped drafting, if any.
    pub fn error(&self) -> Option<&ModelError> {
        self.error.as_ref()
    }

    /// Brings `text` up to the target `context`, reusing the common prefix.
    fn sync_target(&mut self, context: &[u32]) {
        let keep = self.ids.iter().zip(context).take_while(|(a, b)| a == b).count();
        self.ids.truncate(keep);
        self.ends.truncate(keep);
        self.text.truncate(self.ends.last().copied().unwrap_or(0));
        for &id in &context[keep..] {
            // An id the target tokenizer cannot spell contributes no text.
            self.text.extend(self.target.token_bytes(id).unwrap_or_default());
            self.ids.push(id);
            self.ends.push(self.text.len());
        }
        let complete = self.text.len() - incomplete_tail(&self.text);
        self.view = String::from_utf8_lossy(&self.text[..complete]).into_owned();
    }

    /// Drops the draft positions whose bytes are no longer a prefix of `view`, and any that
    /// end inside a character (the rest of the text is re-encoded from a character boundary).
    fn sync_draft(&mut self) {
        let view = self.view.as_bytes();
        let mut spelled = Vec::new();
        let mut keep = 0;
        for (&id, &end) in self.fed.iter().zip(&self.fed_ends) {
            spelled.extend(self.draft.tok.token_bytes(id).unwrap_or_default());
            if end > view.len() || spelled[..] != view[..end] {
                break;
            }
            keep += 1;
        }
        while keep > 0 && !self.view.is_char_boundary(self.fed_ends[keep - 1]) {
            keep -= 1;
        }
        self.fed.truncate(keep);
        self.fed_ends.truncate(keep);
        self.state.truncate(keep);
    }

    /// One draft pass over `tokens` (committed), returning the last row's logits.
    fn pass(&mut self, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        let mut logits = Vec::new();
        for chunk in tokens.chunks(FEED_CHUNK) {
            logits = self.draft.model.forward(&mut self.state, chunk, LogitRows::Prefill, None)?;
            self.state.commit(chunk.len());
            self.counters.passes += 1;
            self.counters.positions += chunk.len();
            self.counters.weight_bytes += self.draft.model.weight_bytes();
        }
        for &id in tokens {
            let len = self.draft.tok.token_bytes(id).map_or(0, |b| b.len());
            self.fed_ends.push(self.fed_ends.last().copied().unwrap_or(0) + len);
            self.fed.push(id);
        }
        Ok(logits)
    }

    /// Drafts up to `n` tokens after the target `context`: the draft text that follows the
    /// context's bytes, and whether the draft ended on end-of-sequence.
    fn draft_text(&mut self, context: &[u32], n: usize) -> Result<(Vec<u8>, bool), ModelError> {
        self.sync_target(context);
        self.sync_draft();
        let seen = self.fed_ends.last().copied().unwrap_or(0);
        // Feed the unseen text; a character the target has only begun is left for the draft
        // to complete.
        let new_text = self.view.get(seen..).unwrap_or_default();
        let mut feed = if new_text.is_empty() {
            Vec::new()
        } else {
            self.draft.tok.encode(new_text, false).map_err(|e| ModelError::Config(e.to_string()))?
        };
        if feed.is_empty() {
            // Nothing new to read: re-feed the last position to get its logits.
            let Some(last) = self.fed.pop() else { return Ok((Vec::new(), false)) };
            self.fed_ends.pop();
            self.state.truncate(self.fed.len());
            feed.push(last);
        }
        if self.state.len() + feed.len() + n > self.max_positions {
            return Ok((Vec::new(), false));
        }
        let held_back = incomplete_tail(&self.text);
        let mut logits = self.pass(&feed)?;
        let mut generated = Vec::new();
        let mut eos = false;
        let vocab = self.draft.tok.vocab_size();
        for i in 0..n {
            let g = argmax(&logits);
            if self.draft.eos.contains(&g) {
                eos = true;
                break;
            }
            if g as usize >= vocab || self.draft.tok.is_special(g) {
                break;
            }
            self.counters.generated += 1;
            generated.extend(self.draft.tok.token_bytes(g).unwrap_or_default());
            if i + 1 < n {
                logits = self.pass(&[g])?;
            }
        }
        // The draft must first reproduce the bytes it was not fed.
        let tail = &self.text[self.text.len() - held_back..];
        match generated.strip_prefix(tail) {
            Some(text) => Ok((text.to_vec(), eos)),
            None => Ok((Vec::new(), false)),
        }
    }

    /// The committed target text re-encoded in front of the draft: up to [`TAIL_TOKENS`] of
    /// the last target tokens, stopping at a special token.
    fn tail(&self) -> &[u8] {
        let n = self.ids.len();
        let mut start = n;
        while start > 0 && n - start < TAIL_TOKENS && !self.target.is_special(self.ids[start - 1]) {
            start -= 1;
        }
        let from = if start == 0 { 0 } else { self.ends[start - 1] };
        &self.text[from..]
    }
}

impl Drafter for ModelDrafter {
    fn name(&self) -> String {
        format!("model:{}", self.draft.dir.display())
    }

    fn propose(&mut self, context: &[u32], max: usize) -> Vec<u32> {
        if max == 0 || self.error.is_some() {
            return Vec::new();
        }
        // One more draft token than proposals: the last target token is held back when it ends
        // exactly where the draft text ends.
        match self.draft_text(context, max + 1) {
            Ok((text, eos)) => covered_tokens(self.target.as_ref(), self.tail(), &text, eos, max),
            Err(e) => {
                self.error = Some(e);
                Vec::new()
            }
        }
    }

    fn failure(&self) -> Option<String> {
        self.error
            .as_ref()
            .map(|e| format!("the draft model {} failed: {e}", self.draft.dir.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::incomplete_tail;

    #[test]
    fn incomplete_tails() {
        let e = "é".as_bytes();
        let smile = "😀".as_bytes();
        assert_eq!(incomplete_tail(b"abc"), 0);
        assert_eq!(incomplete_tail(&[b'a', e[0]]), 1);
        assert_eq!(incomplete_tail(e), 0);
        assert_eq!(incomplete_tail(&smile[..3]), 3);
        assert_eq!(incomplete_tail(&[0x80, 0x80]), 0, "stray continuation bytes never complete");
        assert_eq!(incomplete_tail(&[0xff]), 0);
        assert_eq!(incomplete_tail(&[0xe0, 0x41]), 0, "a broken sequence is not incomplete");
        assert_eq!(incomplete_tail(&[0xe0, 0x80]), 0, "an overlong start never completes");
    }
}

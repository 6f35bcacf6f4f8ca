//! Constrained output: a grammar (a JSON schema, or a Lark grammar that can name the chat
//! format's special tokens) compiled by `llguidance` against this tokenizer's vocabulary, applied
//! by masking the logits to the tokens the grammar allows before each token is chosen.
//!
//! **Exactness.** The mask is applied in one place, [`choose`], which every path that picks a
//! token goes through: the first token after the prefill, plain decoding, and the speculative
//! verifier (which chooses row by row, so row i is masked with the grammar state after exactly the
//! tokens emitted before it). The grammar advances only with emitted tokens ([`Constraint::commit`]),
//! never with drafts, so a rejected draft needs no rollback and constrained output is identical
//! with and without drafts.
//!
//! **Vocabulary.** [`GrammarEnv`] builds llguidance's token trie from any family's tokenizer
//! once per process ([`AnyTokenizer::vocab_entries`]: K3's tiktoken ranks, or a `tokenizer.json`
//! decoded from its byte-level BPE spelling); added tokens (special or not) are entered with
//! llguidance's `0xFF` marker, so a Lark grammar names them as `<|open|>` or by id as `<[483]>`
//! and free text never holds one. Text the grammar forces (a `const`, the markup's fixed text) is
//! handed to the model in the tokenizer's ordinary encoding, matching no added token, and
//! spelled byte for byte even where it starts or ends inside a UTF-8 character
//! (`exact_tokens`). The reply's end token (the chat format's end of turn) is the grammar's end:
//! once the grammar is complete only it is allowed, and generation stops on it. Ids past the
//! tokenizer (a model that pads its embedding) are never allowed.

use crate::sample::Sampling;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use sluice_tokenizer::AnyTokenizer;
use std::sync::{Arc, Mutex, PoisonError};

/// Why a grammar could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum ConstraintError {
    /// The grammar engine refused the vocabulary.
    #[error("the grammar engine could not index the vocabulary: {0}")]
    Vocabulary(String),
    /// The grammar (or JSON schema) uses a construct the engine cannot compile; the message names
    /// it.
    #[error("{0}")]
    Compile(String),
}

/// What the output must match.
#[derive(Debug, Clone)]
pub enum Grammar {
    /// Any JSON value valid against this JSON schema.
    JsonSchema(serde_json::Value),
    /// A grammar in llguidance's Lark dialect (`%json {…}` embeds a schema; `<|name|>` names a
    /// special token).
    Lark(String),
}

/// The tokenizer as llguidance sees it.
struct Env {
    trie: TokTrie,
    tok: Arc<AnyTokenizer>,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        exact_tokens(&self.trie, s, |text| self.tok.encode_plain(text).ok())
    }
}

/// Tokens whose bytes are exactly `s`, never an added token. llguidance tokenizes the bytes a
/// grammar forces with this and makes the next token the first of them, so the tokens must
/// spell `s` byte for byte: `s` often starts or ends inside a UTF-8 character (it begins with
/// the bytes of the last token emitted, which may be the first half of a `｜`), and it may spell
/// a marker as text. Each valid UTF-8 run is `encode` (ordinary text, as the model writes it)
/// when those tokens spell it exactly; anything else (a partial character, a text the
/// tokenizer normalizes into other bytes) is the longest vocabulary tokens that spell it,
/// from the trie.
fn exact_tokens(trie: &TokTrie, s: &[u8], encode: impl Fn(&str) -> Option<Vec<u32>>) -> Vec<u32> {
    let mut out = Vec::new();
    let mut rest = s;
    while !rest.is_empty() {
        let (text, bad) = match std::str::from_utf8(rest) {
            Ok(t) => (t, 0),
            Err(e) => {
                let (ok, tail) = rest.split_at(e.valid_up_to());
                let text = std::str::from_utf8(ok).unwrap_or_default();
                (text, e.error_len().unwrap_or(tail.len()))
            }
        };
        let ids = encode(text).filter(|ids| {
            let known = |t: u32| usize::try_from(t).is_ok_and(|t| t < trie.vocab_size());
            ids.iter().all(|&t| known(t) && !trie.is_special_token(t))
                && trie.decode_raw(ids) == text.as_bytes()
        });
        out.extend(ids.unwrap_or_else(|| trie.greedy_tokenize(text.as_bytes())));
        let (broken, tail) = rest[text.len()..].split_at(bad);
        out.extend(trie.greedy_tokenize(broken));
        rest = tail;
    }
    out
}

/// The compiled vocabulary, shared by every request of a process.
pub struct GrammarEnv {
    factory: ParserFactory,
    eos: u32,
    vocab: usize,
}

impl std::fmt::Debug for GrammarEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarEnv").field("eos", &self.eos).finish_non_exhaustive()
    }
}

impl GrammarEnv {
    /// Indexes `tok`'s vocabulary (once per process: a trie over every token's bytes); `eos`
    /// ends every grammar (the chat format's end of turn, a stop id).
    pub fn new(tok: Arc<AnyTokenizer>, eos: u32) -> Result<Self, ConstraintError> {
        let words: Vec<Vec<u8>> = tok
            .vocab_entries()
            .into_iter()
            .map(|(bytes, added)| {
                if added {
                    let mut b = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    b.extend_from_slice(&bytes);
                    b
                } else {
                    // Ids in the gaps between added tokens have no bytes: never allowed.
                    bytes
                }
            })
            .collect();
        let n = words.len();
        if usize::try_from(eos).map_or(true, |e| e >= n) {
            return Err(ConstraintError::Vocabulary(format!(
                "the end token {eos} is outside the tokenizer's {n} ids"
            )));
        }
        let vocab = u32::try_from(n).map_err(|e| ConstraintError::Vocabulary(e.to_string()))?;
        let trie = TokTrie::from(&TokRxInfo::new(vocab, eos), &words);
        let env: TokEnv = Arc::new(Env { trie, tok });
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| ConstraintError::Vocabulary(e.to_string()))?;
        // Warnings go into the error a request gets, not onto the server's stderr.
        factory.set_stderr_log_level(0);
        // A failure's message is its cause, without a dump of the parser state and grammar.
        factory.limits_mut().verbose_errors = false;
        Ok(Self { factory, eos, vocab: n })
    }

    /// The token that ends a complete grammar (and generation).
    pub fn eos(&self) -> u32 {
        self.eos
    }

    /// Compiles `grammar` into a fresh per-request constraint; an unsupported construct is
    /// [`ConstraintError::Compile`] with llguidance's message naming it.
    pub fn compile(&self, grammar: &Grammar) -> Result<Constraint, ConstraintError> {
        let top = match grammar {
            Grammar::JsonSchema(s) => TopLevelGrammar::from_json_schema(s.clone()),
            Grammar::Lark(l) => TopLevelGrammar::from_lark(l.clone()),
        };
        let parser =
            self.factory.create_parser(top).map_err(|e| ConstraintError::Compile(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(ConstraintError::Compile(e));
        }
        Ok(Constraint { matcher, eos: self.eos, vocab: self.vocab, error: None })
    }
}

/// One request's grammar state.
pub struct Constraint {
    matcher: Matcher,
    eos: u32,
    /// Ids below this are the tokenizer's; the rest of the logits row is never allowed.
    vocab: usize,
    error: Option<String>,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint").field("error", &self.error).finish_non_exhaustive()
    }
}

impl Constraint {
    /// Sets every logit the grammar forbids next to −∞. A grammar that is complete allows only
    /// the end-of-message token; a grammar engine failure (recorded, see [`Constraint::error`])
    /// does the same, so generation ends rather than leaving the grammar.
    pub fn mask(&mut self, logits: &mut [f32]) {
        let allowed = match self.matcher.compute_mask_or_eos() {
            Ok(m) => Some(m),
            Err(e) => {
                self.error.get_or_insert_with(|| cause(&e));
                None
            }
        };
        for (id, l) in logits.iter_mut().enumerate() {
            let ok = match (&allowed, u32::try_from(id)) {
                _ if id >= self.vocab => false,
                (Some(m), Ok(i)) => m.is_allowed(i),
                (None, Ok(i)) => i == self.eos,
                (_, Err(_)) => false,
            };
            if !ok {
                *l = f32::NEG_INFINITY;
            }
        }
    }

    /// Advances the grammar by the emitted token `tok`.
    pub fn commit(&mut self, tok: u32) {
        if self.matcher.is_stopped() {
            return;
        }
        if let Err(e) = self.matcher.consume_token(tok) {
            self.error.get_or_insert_with(|| cause(&e));
        }
    }

    /// Whether the output so far is a complete match.
    pub fn accepting(&mut self) -> bool {
        self.matcher.is_stopped() || self.matcher.is_accepting().unwrap_or(false)
    }

    /// The grammar engine's failure, if one happened: its cause (e.g. `parser error: Too many
    /// items (limit 50000; ff_tokens)` for a schema that forces nesting without end). Every
    /// token after it was the end token, so the reply ended early; a server must say so rather
    /// than answer as if the reply were complete.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }
}

/// The first line of a grammar engine error: its cause (what follows is llguidance's marker
/// that the parser state was left out).
fn cause(e: &impl std::fmt::Display) -> String {
    e.to_string().lines().next().unwrap_or_default().to_owned()
}

/// A constraint shared between the request that owns it and the decoding loop (options structs
/// are `Clone`; the grammar state is one).
#[derive(Clone)]
pub struct SharedConstraint(Arc<Mutex<Constraint>>);

impl std::fmt::Debug for SharedConstraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedConstraint")
    }
}

impl SharedConstraint {
    /// Shares `c`.
    pub fn new(c: Constraint) -> Self {
        Self(Arc::new(Mutex::new(c)))
    }

    /// Runs `f` on the grammar state.
    pub fn with<T>(&self, f: impl FnOnce(&mut Constraint) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Advances the grammar by the emitted token `tok`.
    pub fn commit(&self, tok: u32) {
        self.with(|c| c.commit(tok));
    }
}

/// The token for generated position `pos` from `logits`, restricted to what `constraint` allows
/// (the one place the mask is applied; see the module docs).
pub fn choose(
    sampling: &Sampling,
    logits: &[f32],
    pos: usize,
    constraint: Option<&SharedConstraint>,
) -> u32 {
    match constraint {
        None => sampling.choose(logits, pos),
        Some(c) => {
            let mut masked = logits.to_vec();
            c.with(|c| c.mask(&mut masked));
            sampling.choose(&masked, pos)
        }
    }
}

//! Re-encoding a draft model's text into the target's tokens.
//!
//! A draft model with its own tokenizer proposes *text*. The target verifies *its* tokens, so the
//! text is re-encoded with the target's tokenizer, and only tokens the text fully decides are
//! proposed: encode `tail + draft` (the last few committed target tokens' text, then the draft
//! text), find the token boundary at the end of the tail, and propose the tokens after it whose
//! bytes lie entirely inside the draft text — but not a token that ends exactly where the draft
//! text ends, since more text could still extend it into a longer target token (`" wor"` may
//! become `" world"`), unless the draft ended on its end-of-sequence token. Special tokens are
//! never proposed as text: the target encoding treats their spellings as ordinary text, and a
//! special id stops the proposal.
//!
//! The tail gives the target's pre-tokenizer the context it needs at the boundary (whitespace
//! runs split differently before a word). When the re-encoding has no boundary where the
//! committed text ends (the draft text merges with the last committed token, as `" hel"` +
//! `"lo"` → `" hello"`), the target has already committed the shorter token, so the draft text
//! is encoded on its own instead.
//!
//! None of this affects output: the verifier accepts a proposal only where it equals the
//! target's own choice. The rule only decides how often proposals can be accepted.

use sluice_tokenizer::{HfTokenizer, Tokenizer};

/// What re-encoding needs of a tokenizer.
pub trait TokenText: Send + Sync {
    /// The bytes of token `id` (an added token's spelling), or `None` for an unknown id.
    fn token_bytes(&self, id: u32) -> Option<Vec<u8>>;

    /// Whether `id` is a special (control) token.
    fn is_special(&self, id: u32) -> bool;

    /// Encodes `text` as ordinary text.
    fn encode_text(&self, text: &str) -> Vec<u32>;
}

impl TokenText for Tokenizer {
    fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        Tokenizer::token_bytes(self, id).ok().map(<[u8]>::to_vec)
    }

    fn is_special(&self, id: u32) -> bool {
        Tokenizer::is_special(self, id)
    }

    fn encode_text(&self, text: &str) -> Vec<u32> {
        // Spellings of special tokens stay ordinary text.
        self.encode_ordinary(text)
    }
}

impl TokenText for HfTokenizer {
    fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        HfTokenizer::token_bytes(self, id).ok()
    }

    fn is_special(&self, id: u32) -> bool {
        HfTokenizer::is_special(self, id)
    }

    fn encode_text(&self, text: &str) -> Vec<u32> {
        // An encoding failure (a pathological input) only means no proposal; added tokens
        // spelled in the text come back as their ids and are filtered by `is_special`.
        self.encode(text, false).unwrap_or_default()
    }
}

/// The target tokens that `draft` (text following the committed `tail` text) fully covers, at
/// most `max`; see the module documentation. `ended_on_eos` says the draft text is complete
/// (its model emitted end-of-sequence right after it).
pub fn covered_tokens(
    target: &dyn TokenText,
    tail: &[u8],
    draft: &[u8],
    ended_on_eos: bool,
    max: usize,
) -> Vec<u32> {
    if draft.is_empty() || max == 0 {
        return Vec::new();
    }
    covered_after(target, tail, draft, ended_on_eos, max)
        .or_else(|| covered_after(target, &[], draft, ended_on_eos, max))
        .unwrap_or_default()
}

/// [`covered_tokens`] with the given tail, or `None` when the encoding has no token boundary at
/// the end of the tail (or the tail is not text).
fn covered_after(
    target: &dyn TokenText,
    tail: &[u8],
    draft: &[u8],
    ended_on_eos: bool,
    max: usize,
) -> Option<Vec<u32>> {
    let mut joined = Vec::with_capacity(tail.len() + draft.len());
    joined.extend_from_slice(tail);
    joined.extend_from_slice(draft);
    // A draft token may end inside a multi-byte character: keep the complete characters. The
    // text is then cut short, so its last token could grow even after an end-of-sequence.
    let (text, complete) = match std::str::from_utf8(&joined) {
        Ok(t) => (t, ended_on_eos),
        Err(e) => {
            let valid = e.valid_up_to();
            if valid < tail.len() {
                // The tail itself is not text (it starts or breaks inside a character).
                return None;
            }
            (std::str::from_utf8(&joined[..valid]).ok()?, false)
        }
    };
    let end = text.len();
    let mut out = Vec::new();
    let mut at = 0usize;
    for id in target.encode_text(text) {
        let len = target.token_bytes(id)?.len();
        let (start, stop) = (at, at + len);
        at = stop;
        if stop <= tail.len() {
            continue;
        }
        if start < tail.len() {
            // The token straddles the committed boundary.
            return None;
        }
        if target.is_special(id) || out.len() == max || stop > end || (stop == end && !complete) {
            break;
        }
        out.push(id);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A toy target: greedy longest match over a fixed vocabulary (no pre-tokenizer), with one
    /// special token whose spelling is encoded as ordinary text.
    struct Toy {
        vocab: Vec<&'static str>,
    }

    impl Toy {
        fn new() -> Self {
            let mut vocab = vec!["<s>", " hello", " hel", "lo", " world", " wor", " ", "  ", "é"];
            vocab.extend(["a", "b", "c", "d", "e", "h", "l", "o", "r", "w", "<", ">", "s"]);
            Self { vocab }
        }
        fn id(&self, s: &str) -> u32 {
            u32::try_from(self.vocab.iter().position(|v| *v == s).expect("in vocab"))
                .expect("small")
        }
    }

    impl TokenText for Toy {
        fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
            self.vocab.get(id as usize).map(|s| s.as_bytes().to_vec())
        }
        fn is_special(&self, id: u32) -> bool {
            id == 0
        }
        fn encode_text(&self, text: &str) -> Vec<u32> {
            let index: HashMap<&str, u32> = self
                .vocab
                .iter()
                .enumerate()
                .skip(1)
                .map(|(i, s)| (*s, u32::try_from(i).expect("small")))
                .collect();
            let mut out = Vec::new();
            let mut rest = text;
            while !rest.is_empty() {
                let n = (1..=rest.len())
                    .rev()
                    .find(|&n| rest.is_char_boundary(n) && index.contains_key(&rest[..n]))
                    .expect("toy vocabulary covers the test text");
                out.push(index[&rest[..n]]);
                rest = &rest[n..];
            }
            out
        }
    }

    #[test]
    fn a_token_ending_at_the_end_of_the_draft_is_held_back() {
        let t = Toy::new();
        // " wor" could still become " world".
        assert_eq!(covered_tokens(&t, b"", b" hello wor", false, 8), vec![t.id(" hello")]);
        // Ending on end-of-sequence, the text is complete.
        assert_eq!(
            covered_tokens(&t, b"", b" hello wor", true, 8),
            vec![t.id(" hello"), t.id(" wor")]
        );
        assert_eq!(covered_tokens(&t, b"", b" hello world", false, 1), vec![t.id(" hello")]);
    }

    #[test]
    fn the_boundary_inside_a_token_falls_back_to_the_draft_alone() {
        let t = Toy::new();
        // Committed " hel"; the draft says "lo world": re-encoding would give " hello".
        assert_eq!(covered_tokens(&t, b" hel", b"lo world", true, 8), [t.id("lo"), t.id(" world")]);
    }

    #[test]
    fn empty_and_zero_width() {
        let t = Toy::new();
        assert!(covered_tokens(&t, b" hello", b"", true, 8).is_empty());
        assert!(covered_tokens(&t, b"", b" hello world", true, 0).is_empty());
    }
}

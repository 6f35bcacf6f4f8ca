//! Incremental detokenization for streaming output.
//!
//! Byte-level BPE tokens need not end on a character boundary: a Han character (3 bytes) or an
//! emoji (4 bytes) is often split across two or three tokens. [`StreamDecoder`] buffers the
//! incomplete tail of a UTF-8 sequence and releases text only up to the last complete character.
//! Bytes that can never become valid UTF-8 are released as U+FFFD at once, exactly as
//! `String::from_utf8_lossy` would replace them, so the concatenation of everything a stream
//! yields (including [`StreamDecoder::finish`]) equals [`Tokenizer::decode_lossy`] of all its ids.

use crate::error::Result;
use crate::tokenizer::Tokenizer;
use std::ops::Deref;
use std::sync::Arc;

/// The tokenizer a decoder or reply parser reads: borrowed for a scope, or shared, so that a
/// parser can outlive the scope that made it (a server's reply parser is shared with the
/// engine's follow-up check, which needs a `'static` value).
#[derive(Debug)]
pub enum TokRef<'t, T> {
    /// Borrowed.
    Borrowed(&'t T),
    /// Shared ownership.
    Shared(Arc<T>),
}

impl<T> Deref for TokRef<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        match self {
            Self::Borrowed(t) => t,
            Self::Shared(t) => t,
        }
    }
}

impl<T> Clone for TokRef<'_, T> {
    fn clone(&self) -> Self {
        match self {
            Self::Borrowed(t) => Self::Borrowed(t),
            Self::Shared(t) => Self::Shared(Arc::clone(t)),
        }
    }
}

/// Turns a stream of token ids into text at valid UTF-8 boundaries.
#[derive(Debug)]
pub struct StreamDecoder<'a> {
    tokenizer: TokRef<'a, Tokenizer>,
    /// Bytes received but not yet released: at most the 3-byte prefix of one UTF-8 sequence.
    pending: Vec<u8>,
}

impl<'a> StreamDecoder<'a> {
    /// A decoder with nothing buffered.
    pub fn new(tokenizer: &'a Tokenizer) -> Self {
        Self::with(TokRef::Borrowed(tokenizer))
    }

    /// A decoder over a borrowed or shared tokenizer.
    pub fn with(tokenizer: TokRef<'a, Tokenizer>) -> Self {
        Self { tokenizer, pending: Vec::with_capacity(8) }
    }

    /// Adds one token and returns the text that became complete (possibly empty). Added tokens
    /// are rendered as their spelling. An unknown id is an error and leaves the buffer as it was.
    pub fn push(&mut self, id: u32) -> Result<String> {
        let bytes = self.tokenizer.token_bytes(id)?;
        self.pending.extend_from_slice(bytes);
        Ok(self.drain_complete())
    }

    /// Adds several tokens; returns the text that became complete.
    pub fn push_all(&mut self, ids: &[u32]) -> Result<String> {
        let mut out = String::new();
        for &id in ids {
            out.push_str(&self.push(id)?);
        }
        Ok(out)
    }

    /// Number of buffered bytes (the start of an incomplete character).
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// Ends the stream: releases any buffered incomplete sequence as U+FFFD.
    pub fn finish(mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }

    /// Releases the longest prefix of `pending` that is complete text.
    fn drain_complete(&mut self) -> String {
        drain_utf8(&mut self.pending)
    }
}

/// Releases the longest prefix of `pending` that is complete text, replacing invalid
/// sequences; keeps a trailing incomplete (but possibly valid) sequence. Shared with the
/// decoder of any tokenizer ([`crate::AnyTokenizer::stream_decoder`]).
pub(crate) fn drain_utf8(pending: &mut Vec<u8>) -> String {
    let mut out = String::new();
    let mut pos = 0;
    while pos < pending.len() {
        match std::str::from_utf8(&pending[pos..]) {
            Ok(text) => {
                out.push_str(text);
                pos = pending.len();
            }
            Err(err) => {
                let valid = pos + err.valid_up_to();
                // The prefix up to `valid` was just checked by from_utf8, so this never
                // replaces anything; it only avoids an unchecked conversion.
                out.push_str(&String::from_utf8_lossy(&pending[pos..valid]));
                match err.error_len() {
                    Some(bad) => {
                        out.push(char::REPLACEMENT_CHARACTER);
                        pos = valid + bad;
                    }
                    None => {
                        pos = valid;
                        break;
                    }
                }
            }
        }
    }
    pending.drain(..pos);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bpe::CoreBpe;
    use crate::load::AddedToken;
    use crate::pretokenize::K3_PATTERN;

    /// Bytes only, plus the two-byte prefix of 中 (E4 B8 AD) and one special token.
    fn tokenizer() -> Tokenizer {
        let mut ranks: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        ranks.push(vec![0xE4, 0xB8]);
        let bpe = CoreBpe::new(ranks, K3_PATTERN, std::path::Path::new("t")).expect("vocab");
        let sep = AddedToken { content: "<|sep|>".into(), special: true };
        Tokenizer::from_parts(bpe, vec![(257, sep)]).expect("tokenizer")
    }

    #[test]
    fn split_character_is_released_when_complete() {
        let tok = tokenizer();
        let mut dec = tok.stream_decoder();
        assert_eq!(dec.push(u32::from(b'a')).expect("id"), "a");
        assert_eq!(dec.push(256).expect("id"), "");
        assert_eq!(dec.pending_len(), 2);
        assert_eq!(dec.push(0xAD).expect("id"), "中");
        assert_eq!(dec.pending_len(), 0);
        assert_eq!(dec.finish(), "");
    }

    #[test]
    fn broken_sequences_match_lossy_decoding() {
        let tok = tokenizer();
        let cases: [&[u32]; 5] = [
            &[256, u32::from(b'x')],
            &[256, 257, 0xAD],
            &[0xFF, 0x80, u32::from(b'y'), 256],
            &[0xF0, 0x9F, 0x98],
            &[0xF0, 0x9F, 0x98, 0x80, 0xC3],
        ];
        for ids in cases {
            let mut dec = tok.stream_decoder();
            let mut text = String::new();
            for &id in ids {
                text.push_str(&dec.push(id).expect("id"));
            }
            text.push_str(&dec.finish());
            assert_eq!(text, tok.decode_lossy(ids).expect("ids"), "{ids:?}");
        }
    }

    #[test]
    fn unknown_id_is_an_error_and_keeps_state() {
        let tok = tokenizer();
        let mut dec = tok.stream_decoder();
        assert_eq!(dec.push(256).expect("id"), "");
        assert!(dec.push(258).is_err());
        assert!(dec.push(u32::MAX).is_err());
        assert_eq!(dec.push(0xAD).expect("id"), "中");
    }
}

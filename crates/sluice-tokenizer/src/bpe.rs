//! Rank BPE, ported from tiktoken's `CoreBPE` (`src/lib.rs`).
//!
//! A rank file lists token byte strings; a token's rank is also its id and its merge priority.
//! Encoding splits text with the pre-tokenizer regex and encodes each piece on its own: a piece
//! that is itself a token becomes that token; otherwise it starts as single bytes and the adjacent
//! pair whose concatenation has the lowest rank is merged, leftmost first on ties, until no
//! adjacent pair is a token.
//!
//! tiktoken finds the lowest pair by a linear scan per merge, which is quadratic in the piece
//! length. Short pieces (almost all of them) use that scan here too; pieces of
//! [`HEAP_MERGE_MIN`] bytes or more use a binary heap keyed by `(rank, start offset)`, which
//! selects exactly the same pair at every step (lowest rank, then leftmost), in `O(n log n)`.
//! The unit tests run both on the same pieces and require equal output.
//!
//! Splitting with K3's pattern runs a rewritten pattern without its one lookahead, which lets
//! fancy-regex use the regex crate's automata, plus a small fix-up ([`CoreBpe::pieces`]; the
//! argument is at `Splitter::WsLookahead`). Tests compare it piece by piece with the pattern as
//! written ([`CoreBpe::new_unoptimized`]).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use fancy_regex::Regex;

use crate::error::{Error, Result};
use crate::pretokenize::K3_PATTERN;

/// Pieces at least this long are merged with the heap instead of tiktoken's linear scan.
pub const HEAP_MERGE_MIN: usize = 128;

/// Rank of a pair that is not a token; such a pair never merges.
const NO_RANK: u32 = u32::MAX;

/// Bytes that cannot occur in UTF-8 text, so a rank file may leave them out.
fn byte_can_occur_in_utf8(b: u8) -> bool {
    !matches!(b, 0xC0 | 0xC1 | 0xF5..=0xFF)
}

/// The tail of K3's pattern (also of cl100k's and o200k's); see [`Splitter::WsLookahead`].
const WS_LOOKAHEAD_SUFFIX: &str = r"|\s+(?!\S)|\s+";

/// How text is cut into pieces.
#[derive(Debug)]
enum Splitter {
    /// The pattern as given; lookaround runs in fancy-regex's backtracking VM.
    Fancy(Regex),
    /// [`K3_PATTERN`], which ends in `|\s+(?!\S)|\s+`, with that tail replaced by `|\s+`. Without the
    /// lookahead fancy-regex hands the whole pattern to the regex crate's automata (about ten
    /// times faster on K3's pattern), and [`CoreBpe::next_piece`] restores the lookahead's effect:
    /// `\s+(?!\S)` is reached only where the earlier alternatives fail, and there it takes the
    /// whitespace run minus its last character when a non-space follows (that character then
    /// starts the next piece), the whole run at the end of the text, and fails for a single
    /// character, which `\s+` then takes. Earlier alternatives give all-whitespace matches only
    /// through `\s*[\r\n]+`, which ends in a line break, while a run reaching the `\s+` branch
    /// holds no line break (else that alternative would have matched), so an all-whitespace match
    /// without `\r`/`\n` identifies the branch. Tests compare both splitters piece by piece.
    WsLookahead(Regex),
}

/// Outcome of one search for the next piece.
enum Next {
    /// The piece's byte range.
    Piece(usize, usize),
    /// No further match.
    Done,
    /// fancy-regex hit its backtrack limit.
    GaveUp,
}

/// A rank-BPE vocabulary with its pre-tokenizer: tiktoken's `CoreBPE` without special tokens.
#[derive(Debug)]
pub struct CoreBpe {
    encoder: HashMap<Vec<u8>, u32>,
    decoder: Vec<Vec<u8>>,
    splitter: Splitter,
}

impl CoreBpe {
    /// Builds the vocabulary from token byte strings in rank order (`ranks[i]` has rank `i`) and
    /// the pre-tokenizer `pattern` (fancy-regex syntax, as tiktoken compiles it).
    ///
    /// The caller guarantees that the byte strings are distinct and non-empty (the rank-file
    /// loader checks this and reports the line); every byte that UTF-8 can contain must have a
    /// rank, else [`Error::MissingByte`] (reported against `source`).
    pub fn new(ranks: Vec<Vec<u8>>, pattern: &str, source: &std::path::Path) -> Result<Self> {
        // The rewrite is proven for K3's pattern only (its argument depends on the earlier
        // alternatives); any other pattern runs as written.
        let splitter = match pattern.strip_suffix(WS_LOOKAHEAD_SUFFIX) {
            Some(head) if pattern == K3_PATTERN => {
                Splitter::WsLookahead(Regex::new(&format!("{head}|\\s+")).map_err(Box::new)?)
            }
            _ => Splitter::Fancy(Regex::new(pattern).map_err(Box::new)?),
        };
        Self::build(ranks, splitter, source)
    }

    /// Like [`CoreBpe::new`], but always runs `pattern` as written in fancy-regex, without the
    /// lookahead rewrite of [`CoreBpe::new`]: the reference that rewrite is tested against.
    pub fn new_unoptimized(
        ranks: Vec<Vec<u8>>,
        pattern: &str,
        source: &std::path::Path,
    ) -> Result<Self> {
        Self::build(ranks, Splitter::Fancy(Regex::new(pattern).map_err(Box::new)?), source)
    }

    fn build(ranks: Vec<Vec<u8>>, splitter: Splitter, source: &std::path::Path) -> Result<Self> {
        if u32::try_from(ranks.len()).is_err() {
            return Err(Error::VocabTooLarge(ranks.len()));
        }
        let mut encoder = HashMap::with_capacity(ranks.len());
        for (rank, bytes) in (0u32..).zip(&ranks) {
            encoder.insert(bytes.clone(), rank);
        }
        if let Some(byte) =
            (0..=u8::MAX).find(|&b| byte_can_occur_in_utf8(b) && !encoder.contains_key(&[b][..]))
        {
            return Err(Error::MissingByte { path: source.to_path_buf(), byte });
        }
        Ok(Self { encoder, decoder: ranks, splitter })
    }

    /// Number of ranks (BPE tokens); ids `0..num_ranks()` are BPE tokens.
    pub fn num_ranks(&self) -> usize {
        self.decoder.len()
    }

    /// The bytes of BPE token `rank`, or `None` if `rank` is not a BPE rank.
    pub fn token_bytes(&self, rank: u32) -> Option<&[u8]> {
        self.decoder.get(usize::try_from(rank).ok()?).map(Vec::as_slice)
    }

    /// The rank of the token spelled exactly `bytes`, if there is one.
    pub fn rank(&self, bytes: &[u8]) -> Option<u32> {
        self.encoder.get(bytes).copied()
    }

    /// Encodes `text` as tiktoken's `encode_ordinary` does: regex pieces over the whole text,
    /// no special tokens, no length-based splitting. [`crate::Tokenizer::encode_ordinary`] adds
    /// Kimi's 400,000/25,000-character splitting on top of this.
    pub fn encode_ordinary(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        self.encode_into(text, &mut out);
        out
    }

    /// Appends the encoding of `text` to `out` (see [`CoreBpe::encode_ordinary`]).
    pub fn encode_into(&self, text: &str, out: &mut Vec<u32>) {
        for piece in self.pieces(text) {
            self.encode_piece(piece.as_bytes(), out);
        }
    }

    /// The pre-tokenizer's pieces of `text`, in order (tiktoken's `regex.find_iter`).
    ///
    /// A character no alternative matches would be skipped, as tiktoken skips it (K3's pattern
    /// matches every character). If fancy-regex gives up (its backtrack limit; tiktoken panics
    /// there), the rest of the text becomes one piece, which still encodes and decodes exactly.
    pub fn pieces<'t>(&self, text: &'t str) -> Vec<&'t str> {
        let mut out = Vec::new();
        let mut pos = 0;
        while pos < text.len() {
            match self.next_piece(text, pos) {
                Next::Piece(start, end) if end > start => {
                    out.push(&text[start..end]);
                    pos = end;
                }
                // An empty match: find_iter moves on by one character.
                Next::Piece(start, _) => {
                    pos = start + text[start..].chars().next().map_or(1, char::len_utf8);
                }
                Next::Done => break,
                Next::GaveUp => {
                    out.push(&text[pos..]);
                    break;
                }
            }
        }
        out
    }

    /// The byte range of the next piece at or after `pos`.
    fn next_piece(&self, text: &str, pos: usize) -> Next {
        let (Splitter::Fancy(re) | Splitter::WsLookahead(re)) = &self.splitter;
        let m = match re.find_from_pos(text, pos) {
            Ok(Some(m)) => m,
            Ok(None) => return Next::Done,
            Err(_) => return Next::GaveUp,
        };
        if let Splitter::WsLookahead(_) = self.splitter {
            let piece = m.as_str();
            let from_ws_branch = piece.chars().all(|c| c.is_whitespace() && c != '\r' && c != '\n');
            // `\s+(?!\S)` gives the last whitespace character back when at least one remains.
            let last = piece.char_indices().next_back().map_or(0, |(i, _)| i);
            if from_ws_branch && m.end() < text.len() && last > 0 {
                return Next::Piece(m.start(), m.start() + last);
            }
        }
        Next::Piece(m.start(), m.end())
    }

    /// tiktoken `_encode_ordinary_native` for one piece: a whole-piece token wins, else merge.
    fn encode_piece(&self, piece: &[u8], out: &mut Vec<u32>) {
        if let Some(&rank) = self.encoder.get(piece) {
            out.push(rank);
        } else if piece.len() < HEAP_MERGE_MIN {
            self.merge_scan(piece, out);
        } else {
            self.merge_heap(piece, out);
        }
    }

    /// Rank of the bytes `piece[start..end]`, or [`NO_RANK`].
    fn span_rank(&self, piece: &[u8], start: usize, end: usize) -> u32 {
        self.encoder.get(&piece[start..end]).copied().unwrap_or(NO_RANK)
    }

    /// Pushes the rank of each part `piece[bounds[i]..bounds[i + 1]]`.
    fn push_parts(
        &self,
        piece: &[u8],
        bounds: impl Iterator<Item = (usize, usize)>,
        out: &mut Vec<u32>,
    ) {
        for (start, end) in bounds {
            // Parts are single bytes (each has a rank: `new` checked every byte UTF-8 can hold,
            // and a piece is a substring of a &str) or results of merges (ranked by definition).
            let rank = self.span_rank(piece, start, end);
            debug_assert_ne!(rank, NO_RANK, "invariant: every part of a merged piece is a token");
            out.push(rank);
        }
    }

    /// tiktoken `_byte_pair_merge`: `parts[i] = (start, rank of the pair starting at part i)`.
    pub(crate) fn merge_scan(&self, piece: &[u8], out: &mut Vec<u32>) {
        let n = piece.len();
        if n <= 1 {
            self.push_parts(piece, std::iter::once((0, n)).take(n), out);
            return;
        }
        let mut parts: Vec<(usize, u32)> =
            (0..n - 1).map(|i| (i, self.span_rank(piece, i, i + 2))).collect();
        parts.push((n - 1, NO_RANK));
        parts.push((n, NO_RANK));
        // The rank of the pair that starts at part i once part i+1 is gone.
        let rank_after_merge = |parts: &[(usize, u32)], i: usize| -> u32 {
            if i + 3 < parts.len() {
                self.span_rank(piece, parts[i].0, parts[i + 3].0)
            } else {
                NO_RANK
            }
        };
        loop {
            let mut min = (NO_RANK, usize::MAX);
            for (i, &(_, rank)) in parts[..parts.len() - 1].iter().enumerate() {
                if rank < min.0 {
                    min = (rank, i);
                }
            }
            if min.0 == NO_RANK {
                break;
            }
            let i = min.1;
            if i > 0 {
                parts[i - 1].1 = rank_after_merge(&parts, i - 1);
            }
            parts[i].1 = rank_after_merge(&parts, i);
            parts.remove(i + 1);
        }
        self.push_parts(piece, parts.windows(2).map(|w| (w[0].0, w[1].0)), out);
    }

    /// The same merges as [`CoreBpe::merge_scan`], found with a heap over a linked list of parts.
    pub(crate) fn merge_heap(&self, piece: &[u8], out: &mut Vec<u32>) {
        let n = piece.len();
        // Part i starts at byte i until merged away; `next[i]` is the start of the following
        // part (n at the end), `prev[i]` the start of the previous one (unused for part 0).
        // `alive[i]` marks the bytes that still start a part.
        let mut next: Vec<usize> = (1..=n).collect();
        let mut prev: Vec<usize> = (0..n).map(|i| i.saturating_sub(1)).collect();
        let mut alive = vec![true; n];
        // Entries are (rank, start, end of the pair); an entry is current iff `start` is alive and
        // its pair still ends at `end` (the span fixes the rank, so a current entry is exact).
        let mut heap = BinaryHeap::with_capacity(n);
        let pair_end = |next: &[usize], start: usize| next.get(next[start]).copied();
        for start in 0..n - 1 {
            let rank = self.span_rank(piece, start, start + 2);
            if rank != NO_RANK {
                heap.push(Reverse((rank, start, start + 2)));
            }
        }
        while let Some(Reverse((_, start, end))) = heap.pop() {
            if !alive[start] || pair_end(&next, start) != Some(end) {
                continue;
            }
            let gone = next[start];
            alive[gone] = false;
            next[start] = end;
            if end < n {
                prev[end] = start;
            }
            if let Some(after) = pair_end(&next, start) {
                let rank = self.span_rank(piece, start, after);
                if rank != NO_RANK {
                    heap.push(Reverse((rank, start, after)));
                }
            }
            if start > 0 {
                let before = prev[start];
                let rank = self.span_rank(piece, before, end);
                if rank != NO_RANK {
                    heap.push(Reverse((rank, before, end)));
                }
            }
        }
        let starts = (0..n).filter(|&i| alive[i]);
        self.push_parts(piece, starts.map(|s| (s, next[s])), out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes plus a few merges chosen so that ties and overlapping candidates occur.
    fn toy() -> CoreBpe {
        let mut ranks: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        for t in ["ab", "bc", "abc", "cd", "aa", "aaa", "aaaa", "bcd", "ca", "abca", "dd", "ddd"] {
            ranks.push(t.as_bytes().to_vec());
        }
        CoreBpe::new(ranks, K3_PATTERN, std::path::Path::new("toy")).expect("toy vocabulary")
    }

    fn lcg(state: &mut u64) -> u64 {
        *state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        *state >> 33
    }

    #[test]
    fn heap_and_scan_merge_agree_on_random_pieces() {
        let bpe = toy();
        let mut state = 7u64;
        for len in [1usize, 2, 3, 5, 17, 33, 127, 128, 255, 1023] {
            for _ in 0..40 {
                let piece: Vec<u8> = (0..len)
                    .map(|_| b"abcd"[usize::try_from(lcg(&mut state) % 4).expect("< 4")])
                    .collect();
                let (mut a, mut b) = (Vec::new(), Vec::new());
                bpe.merge_scan(&piece, &mut a);
                bpe.merge_heap(&piece, &mut b);
                assert_eq!(a, b, "piece {:?}", String::from_utf8_lossy(&piece));
                let bytes: Vec<u8> =
                    a.iter().flat_map(|&r| bpe.token_bytes(r).expect("rank").to_vec()).collect();
                assert_eq!(bytes, piece);
            }
        }
    }

    /// The lookahead rewrite splits exactly like the pattern as written, on strings built from
    /// the characters that decide between the whitespace alternatives.
    #[test]
    fn lookahead_rewrite_splits_like_fancy_regex() {
        let ranks: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        let path = std::path::Path::new("x");
        let fast = CoreBpe::new(ranks.clone(), K3_PATTERN, path).expect("vocab");
        let slow = CoreBpe::new_unoptimized(ranks, K3_PATTERN, path).expect("vocab");
        assert!(matches!(fast.splitter, Splitter::WsLookahead(_)));
        assert!(matches!(slow.splitter, Splitter::Fancy(_)));
        let alphabet: Vec<char> =
            " \t\n\r\u{b}\u{c}\u{85}\u{a0}\u{3000}\u{2028}\u{1c}aBǅ中1!'s\u{301}😀-"
                .chars()
                .collect();
        let mut state = 11u64;
        for _ in 0..20_000 {
            let len = usize::try_from(lcg(&mut state) % 24).expect("small");
            let text: String = (0..len)
                .map(|_| {
                    let k = usize::try_from(lcg(&mut state)).expect("fits") % alphabet.len();
                    alphabet[k]
                })
                .collect();
            assert_eq!(fast.pieces(&text), slow.pieces(&text), "{text:?}");
        }
    }

    #[test]
    fn lowest_rank_then_leftmost_wins() {
        let bpe = toy();
        let id = |s: &str| bpe.rank(s.as_bytes()).unwrap_or(NO_RANK);
        // "aaaaa": aa (260) merges leftmost at 0, then at 2, giving [aa, aa, a]; then aa+a
        // ("aaa", 261) beats aa+aa ("aaaa", 262), giving [aa, aaa], although "aaaa"+"a" exists.
        assert_eq!(bpe.encode_ordinary("aaaaa"), vec![id("aa"), id("aaa")]);
        // "abcd": ab (256) beats bc (257) and cd (259); then ab+c spells "abc" (258), which beats
        // c+d; "abcd" is not a token.
        assert_eq!(bpe.encode_ordinary("abcd"), vec![id("abc"), id("d")]);
    }

    #[test]
    fn missing_utf8_byte_is_rejected_but_impossible_bytes_may_be_absent() {
        let ranks: Vec<Vec<u8>> = (0..=255u8).filter(|&b| b < 0xF5).map(|b| vec![b]).collect();
        assert!(CoreBpe::new(ranks, K3_PATTERN, std::path::Path::new("x")).is_ok());
        let ranks: Vec<Vec<u8>> = (0..=255u8).filter(|&b| b != 0x80).map(|b| vec![b]).collect();
        let err = CoreBpe::new(ranks, K3_PATTERN, std::path::Path::new("x"));
        assert!(matches!(err, Err(Error::MissingByte { byte: 0x80, .. })));
    }
}

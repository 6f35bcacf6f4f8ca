//! Kimi K3's pre-tokenizer: the regex and the length-based splitting of `tokenization_kimi.py`.
//!
//! Before BPE, `tokenization_kimi.py` `encode` cuts the text twice and encodes every resulting
//! piece separately (so regex matches never cross a cut):
//!
//! 1. into slices of at most 400,000 characters (`TIKTOKEN_MAX_ENCODE_CHARS`; tiktoken panicked on
//!    longer inputs), and
//! 2. each slice with `_split_whitespaces_or_nonwhitespaces(slice, 25_000)`
//!    (`MAX_NO_WHITESPACES_CHARS`, the workaround for tiktoken issue #195): walking the
//!    characters, a counter restarts at 1 whenever the character class (`str.isspace()` or not)
//!    changes and otherwise grows; when it would exceed 25,000 the piece is cut before the
//!    current character and the counter restarts at 1. A piece therefore never holds a
//!    homogeneous run longer than 25,000 characters, but may hold many shorter runs.
//!
//! "Character" means a Unicode scalar value (a Python `str` element), and the class is Python's
//! `str.isspace()`, which is Unicode White_Space plus U+001C..U+001F (bidi classes B and S).
//! For texts without such runs and under 400,000 characters the split is a no-op and the result
//! equals plain tiktoken; the goldens in `tests/fixtures/tokenizer` record both where they differ.

/// Kimi K3's pre-tokenizer pattern (K3.md §4.1, `tokenization_kimi.py` `pat_str`): eight
/// alternatives joined by `|`. fancy-regex (like the regex crate it delegates to) supports the
/// class intersections `[...&&[^\p{Han}]]` and the `(?!\S)` lookahead as written; the tests check
/// the intersections against separately computed sets.
pub const K3_PATTERN: &str = concat!(
    r"[\p{Han}]+",
    "|",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    "|",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    "|",
    r"\p{N}{1,3}",
    "|",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    "|",
    r"\s*[\r\n]+",
    "|",
    r"\s+(?!\S)",
    "|",
    r"\s+",
);

/// Longest slice, in characters, that `tokenization_kimi.py` hands to tiktoken at once.
pub const MAX_SLICE_CHARS: usize = 400_000;

/// Longest run of whitespace or of non-whitespace characters in one encoded piece.
pub const MAX_RUN_CHARS: usize = 25_000;

/// Python's `str.isspace()` for one character: Unicode White_Space, plus the information
/// separators U+001C..U+001F, which Python counts because their bidi class is B or S.
pub fn python_isspace(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Splits `text` into the pieces that `tokenization_kimi.py` encodes separately (see the module
/// docs). The pieces concatenate to `text`; the empty text gives no pieces.
pub fn kimi_chunks(text: &str) -> Vec<&str> {
    kimi_chunks_with(text, MAX_SLICE_CHARS, MAX_RUN_CHARS)
}

/// [`kimi_chunks`] with the two limits as parameters (both at least 1), for testing.
pub fn kimi_chunks_with(text: &str, max_slice: usize, max_run: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let cut = rest.char_indices().nth(max_slice.max(1)).map_or(rest.len(), |(i, _)| i);
        let (slice, tail) = rest.split_at(cut);
        split_runs(slice, max_run.max(1), &mut out);
        rest = tail;
    }
    out
}

/// tokenization_kimi.py `_split_whitespaces_or_nonwhitespaces(s, max_run)`; like the Python
/// generator it always yields at least one piece (the whole `s` when nothing is cut).
fn split_runs<'a>(s: &'a str, max_run: usize, out: &mut Vec<&'a str>) {
    let mut run_len = 0usize;
    let mut run_is_space = s.chars().next().is_some_and(python_isspace);
    let mut start = 0usize;
    for (i, c) in s.char_indices() {
        let is_space = python_isspace(c);
        if run_is_space != is_space {
            run_len = 1;
            run_is_space = is_space;
        } else {
            run_len += 1;
            if run_len > max_run {
                out.push(&s[start..i]);
                start = i;
                run_len = 1;
            }
        }
    }
    out.push(&s[start..]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use fancy_regex::Regex;

    fn lens(pieces: &[&str]) -> Vec<usize> {
        pieces.iter().map(|p| p.chars().count()).collect()
    }

    #[test]
    fn runs_are_cut_at_the_limit_only_when_homogeneous() {
        assert_eq!(lens(&kimi_chunks_with("aaaaaaa", 100, 3)), [3, 3, 1]);
        assert_eq!(lens(&kimi_chunks_with("aaa  aaa", 100, 3)), [8]);
        assert_eq!(lens(&kimi_chunks_with("aaaa    b", 100, 3)), [3, 4, 2]);
        assert_eq!(lens(&kimi_chunks_with("ab ab ab", 100, 1)), [1, 3, 3, 1]);
        assert!(kimi_chunks("").is_empty());
        assert_eq!(kimi_chunks("x"), ["x"]);
    }

    #[test]
    fn slices_count_characters_not_bytes() {
        let text = "жжжжж";
        assert_eq!(kimi_chunks_with(text, 2, 100), ["жж", "жж", "ж"]);
        // Each slice is split on its own: the run counter restarts at a slice boundary.
        assert_eq!(lens(&kimi_chunks_with("aaaaaa", 4, 3)), [3, 1, 2]);
    }

    #[test]
    fn python_isspace_adds_information_separators() {
        for c in ['\u{1c}', '\u{1d}', '\u{1e}', '\u{1f}', ' ', '\u{85}', '\u{3000}'] {
            assert!(python_isspace(c), "{c:?}");
        }
        for c in ['\u{200b}', '\u{180e}', '\u{feff}', 'a', '\u{0}'] {
            assert!(!python_isspace(c), "{c:?}");
        }
    }

    /// The `&&` intersections in [`K3_PATTERN`] select exactly (class ∩ not-Han), checked on every
    /// scalar value against classes compiled without set operations.
    #[test]
    fn class_intersections_equal_difference_with_han() {
        let upperish = Regex::new(r"^[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]$").expect("re");
        let lowerish = Regex::new(r"^[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]$").expect("re");
        let upper_union = Regex::new(r"^[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]$").expect("re");
        let lower_union = Regex::new(r"^[\p{Ll}\p{Lm}\p{Lo}\p{M}]$").expect("re");
        let han = Regex::new(r"^\p{Han}$").expect("re");
        let mut buf = [0u8; 4];
        let (mut in_upper, mut han_letters) = (0usize, 0usize);
        for c in (0..=0x10FFFFu32).filter_map(char::from_u32) {
            let s = c.encode_utf8(&mut buf);
            let is = |r: &Regex| r.is_match(s).expect("no backtracking here");
            let not_han = !is(&han);
            assert_eq!(is(&upperish), is(&upper_union) && not_han, "{c:?}");
            assert_eq!(is(&lowerish), is(&lower_union) && not_han, "{c:?}");
            in_upper += usize::from(is(&upperish));
            han_letters += usize::from(is(&upper_union) && !not_han);
        }
        // Both sides of the intersection are non-trivial: Han letters exist and are excluded.
        assert!(in_upper > 20_000 && han_letters > 90_000, "{in_upper} {han_letters}");
    }
}

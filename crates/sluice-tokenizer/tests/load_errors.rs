//! Loading rejects broken tokenizer files with errors that name the file and line.

use std::path::{Path, PathBuf};

use sluice_tokenizer::{Error, Tokenizer, CONFIG_FILE, RANK_FILE};

/// A rank file line for `bytes` with `rank`.
fn line(bytes: &[u8], rank: u32) -> String {
    use base64::Engine as _;
    format!("{} {rank}\n", base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// The 256 single bytes, ranks 0..255.
fn byte_lines() -> String {
    (0..=255u8).map(|b| line(&[b], u32::from(b))).collect()
}

fn config(entries: &[(&str, &str)]) -> String {
    let body: Vec<String> = entries
        .iter()
        .map(|(id, content)| format!("\"{id}\": {{\"content\": \"{content}\", \"special\": true}}"))
        .collect();
    format!("{{\"added_tokens_decoder\": {{{}}}, \"bos_token\": \"[BOS]\"}}", body.join(", "))
}

/// Writes both files into a fresh directory and loads it.
fn load(ranks: &str, cfg: &str) -> (tempfile::TempDir, Result<Tokenizer, Error>) {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join(RANK_FILE), ranks).expect("write ranks");
    std::fs::write(dir.path().join(CONFIG_FILE), cfg).expect("write config");
    let tok = Tokenizer::from_dir(dir.path());
    (dir, tok)
}

fn is_rank_file(path: &Path) -> bool {
    path.file_name().is_some_and(|n| n == RANK_FILE)
}

#[test]
fn a_valid_minimal_tokenizer_loads() {
    let ranks = byte_lines() + &line(b"ab", 256) + "\n";
    let (_dir, tok) = load(&ranks, &config(&[("257", "<|open|>"), ("259", "[PAD]")]));
    let tok = tok.expect("loads");
    assert_eq!(tok.num_ranks(), 257);
    assert_eq!(tok.vocab_size(), 260);
    assert_eq!(tok.encode_ordinary("ab"), vec![256]);
    assert_eq!(tok.special_id("[PAD]"), Some(259));
    // 258 is a gap between added tokens: in range but not a token.
    assert!(matches!(tok.decode(&[258]), Err(Error::UnknownId { id: 258, vocab_size: 260 })));
}

#[test]
fn ranks_may_come_in_any_order() {
    let mut lines: Vec<String> = (0..=255u8).map(|b| line(&[b], u32::from(b))).collect();
    lines.reverse();
    let (_dir, tok) = load(&lines.concat(), &config(&[]));
    assert_eq!(tok.expect("loads").num_ranks(), 256);
}

#[test]
fn bad_base64_names_file_and_line() {
    let ranks = byte_lines() + "!!notbase64 256\n";
    let (_dir, tok) = load(&ranks, &config(&[]));
    match tok {
        Err(Error::BadBase64 { path, line: 257, .. }) => assert!(is_rank_file(&path)),
        other => panic!("{other:?}"),
    }
    let (_dir, tok) = load(&(byte_lines() + " 256\n"), &config(&[]));
    assert!(matches!(tok, Err(Error::MalformedLine { line: 257, .. })), "{tok:?}");
}

#[test]
fn malformed_lines_and_ranks_are_rejected() {
    for (extra, want_line) in [("YWI=\n", 257), ("YWI= 256 extra\n", 257)] {
        let (_dir, tok) = load(&(byte_lines() + extra), &config(&[]));
        assert!(
            matches!(tok, Err(Error::MalformedLine { line, .. }) if line == want_line),
            "{tok:?}"
        );
    }
    for bad in ["-1", "x", "4294967296", "1.5"] {
        let (_dir, tok) = load(&(byte_lines() + "YWI= " + bad + "\n"), &config(&[]));
        let err = tok.expect_err("bad rank");
        assert!(matches!(err, Error::BadRank { line: 257, .. }), "{err:?}");
        assert!(err.to_string().contains("tiktoken.model:257"), "{err}");
    }
    let (_dir, tok) = load(&(byte_lines() + "= 256\n"), &config(&[]));
    assert!(matches!(tok, Err(Error::BadBase64 { line: 257, .. })), "{tok:?}");
}

#[test]
fn duplicates_and_gaps_are_rejected() {
    let (_dir, tok) = load(&(byte_lines() + &line(b"ab", 7)), &config(&[]));
    assert!(
        matches!(tok, Err(Error::DuplicateRank { line: 257, rank: 7, first_line: 8, .. })),
        "{tok:?}"
    );
    let (_dir, tok) = load(&(byte_lines() + &line(b"a", 256)), &config(&[]));
    assert!(matches!(tok, Err(Error::DuplicateToken { line: 257, first_line: 98, .. })), "{tok:?}");
    let (_dir, tok) = load(&(byte_lines() + &line(b"ab", 300)), &config(&[]));
    assert!(
        matches!(tok, Err(Error::RanksNotContiguous { count: 257, missing: 256, .. })),
        "{tok:?}"
    );
}

#[test]
fn a_missing_utf8_byte_is_rejected() {
    let ranks: String = (0..=255u8)
        .filter(|&b| b != b'q')
        .enumerate()
        .map(|(r, b)| line(&[b], u32::try_from(r).expect("fits")))
        .collect();
    let (_dir, tok) = load(&ranks, &config(&[]));
    assert!(matches!(tok, Err(Error::MissingByte { byte: b'q', .. })), "{tok:?}");
}

#[test]
fn bad_configs_are_rejected() {
    let ranks = byte_lines();
    let (_dir, tok) = load(&ranks, "{not json");
    match tok {
        Err(Error::Json { path, .. }) => assert!(path.ends_with(CONFIG_FILE)),
        other => panic!("{other:?}"),
    }
    let (_dir, tok) = load(&ranks, &config(&[("abc", "<|x|>")]));
    assert!(matches!(tok, Err(Error::BadAddedId { .. })), "{tok:?}");
    let (_dir, tok) = load(&ranks, &config(&[("255", "<|x|>")]));
    assert!(matches!(tok, Err(Error::AddedIdInRankRange { id: 255, .. })), "{tok:?}");
    let (_dir, tok) = load(&ranks, &config(&[("256", "<|x|>"), ("300", "<|x|>")]));
    assert!(
        matches!(tok, Err(Error::DuplicateAddedToken { first: 256, second: 300, .. })),
        "{tok:?}"
    );
    // A config without added tokens is valid; it just has no specials.
    let (_dir, tok) = load(&ranks, "{}");
    assert_eq!(tok.expect("loads").vocab_size(), 256);
}

#[test]
fn missing_files_name_the_path() {
    let dir = tempfile::tempdir().expect("temp dir");
    let err = Tokenizer::from_dir(dir.path()).expect_err("nothing there");
    match err {
        Error::Io { path, .. } => assert_eq!(path, PathBuf::from(dir.path()).join(RANK_FILE)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_huge_added_id_does_not_allocate_a_table() {
    let (_dir, tok) = load(&byte_lines(), &config(&[("4294967294", "<|far|>")]));
    let tok = tok.expect("loads");
    assert_eq!(tok.vocab_size(), 4_294_967_295);
    assert_eq!(tok.decode(&[4_294_967_294]).expect("decodes"), b"<|far|>");
    assert!(tok.decode(&[300]).is_err());
}

//! Typed values of command-line flags, parsed by clap (`value_parser = …`), so that a bad value
//! is refused with the flag's name and a reason before any work starts: sizes (`24G`), counts
//! (never negative), positive counts and fractions. Numeric flags also set
//! `allow_negative_numbers` (sizes, which are not plain numbers, `allow_hyphen_values`), so
//! that `--max-new -1` reaches these parsers and is answered "cannot be negative" instead of
//! clap's "unexpected argument '-1'".

use sluice_engine::plan::parse_size;

/// A size such as `24G`, `512M`, `1.5GiB` or a byte count.
pub fn size(s: &str) -> Result<u64, String> {
    if s.trim_start().starts_with('-') {
        return Err("a size cannot be negative (try 24G, 512M, 1.5G)".into());
    }
    parse_size(s)
}

/// A size, or `0` for none.
pub fn size_or_zero(s: &str) -> Result<u64, String> {
    if s.trim() == "0" {
        return Ok(0);
    }
    size(s)
}

/// A whole number, 0 or more.
pub fn count(s: &str) -> Result<usize, String> {
    let t = s.trim();
    if t.starts_with('-') {
        return Err("cannot be negative".into());
    }
    t.parse().map_err(|_| format!("{s:?} is not a whole number"))
}

/// A whole number, 1 or more.
pub fn positive(s: &str) -> Result<usize, String> {
    match count(s)? {
        0 => Err("must be at least 1".into()),
        n => Ok(n),
    }
}

/// Seconds as a whole number, 1 or more.
pub fn seconds(s: &str) -> Result<u64, String> {
    positive(s).and_then(|n| u64::try_from(n).map_err(|e| e.to_string()))
}

/// A fraction from 0 to 1.
pub fn fraction(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|_| format!("{s:?} is not a number"))?;
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{v} is not between 0 and 1"))
    }
}

/// A port number (0 picks a free one).
pub fn port(s: &str) -> Result<u16, String> {
    let n = count(s)?;
    u16::try_from(n).map_err(|_| format!("{n} is above the largest port, 65535"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negative_numbers_are_named_as_such() {
        let err = |r: Result<_, String>| r.err().unwrap_or_default();
        assert_eq!(err(count("-1").map(|_| ())), "cannot be negative");
        assert!(err(size("-1G").map(|_| ())).contains("negative"));
        assert_eq!(err(positive("0").map(|_| ())), "must be at least 1");
        assert!(err(fraction("-0.5").map(|_| ())).contains("between 0 and 1"));
        assert!(err(port("70000").map(|_| ())).contains("65535"));
        assert_eq!(count(" 7 "), Ok(7));
        assert_eq!(size_or_zero("0"), Ok(0));
        assert_eq!(size("1K"), Ok(1024));
    }
}

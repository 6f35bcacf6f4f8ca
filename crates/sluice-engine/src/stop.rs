//! Stop strings over streamed text.
//!
//! A stop string can span tokens (and a token can hold the end of one stop string and the start of
//! the next text), so text cannot be released as soon as it is decoded: [`StopText`] holds back the
//! longest tail that is still the beginning of some stop string and releases everything before it.
//! When a stop string completes, the text before it is released, the stop string and everything
//! after it are dropped, and the caller ends generation. The concatenation of what a stream
//! releases (including [`StopText::finish`]) is therefore the input cut at the first occurrence of
//! any stop string — exactly what matching on the whole text at the end would give.

/// Incremental stop-string matching with hold-back.
#[derive(Debug, Clone, Default)]
pub struct StopText {
    stops: Vec<String>,
    held: String,
    matched: bool,
    /// The stop string that matched (the Anthropic API's `stop_sequence`).
    hit: Option<String>,
}

/// What one [`StopText::push`] released.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Released {
    /// Text that can be shown now.
    pub text: String,
    /// A stop string completed: generation must end and later text is discarded.
    pub stopped: bool,
}

impl StopText {
    /// A matcher for `stops` (empty strings are ignored).
    pub fn new(stops: &[String]) -> Self {
        Self {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
            matched: false,
            hit: None,
        }
    }

    /// Whether a stop string has matched (everything pushed afterwards is discarded).
    pub fn stopped(&self) -> bool {
        self.matched
    }

    /// The stop string that matched, once one has.
    pub fn matched(&self) -> Option<&str> {
        self.hit.as_deref()
    }

    /// Adds decoded text; returns what can be released.
    pub fn push(&mut self, text: &str) -> Released {
        if self.matched {
            return Released { text: String::new(), stopped: true };
        }
        if self.stops.is_empty() {
            return Released { text: text.to_owned(), stopped: false };
        }
        self.held.push_str(text);
        // The earliest match wins; among matches at one position, any (they cut at the same place).
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|at| (at, s)))
            .min_by_key(|&(at, _)| at);
        if let Some((at, stop)) = first {
            self.matched = true;
            self.hit = Some(stop.clone());
            let out = self.held[..at].to_owned();
            self.held.clear();
            return Released { text: out, stopped: true };
        }
        let keep = self.partial_tail();
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_owned();
        self.held.drain(..cut);
        Released { text: out, stopped: false }
    }

    /// Releases the held tail at the end of generation (it never completed a stop string).
    pub fn finish(&mut self) -> String {
        if self.matched {
            return String::new();
        }
        std::mem::take(&mut self.held)
    }

    /// Length in bytes of the longest suffix of `held` that is a proper prefix of a stop string.
    /// Suffixes start at character boundaries, so the cut before them is always valid UTF-8.
    fn partial_tail(&self) -> usize {
        let held = self.held.as_str();
        held.char_indices()
            .map(|(i, _)| &held[i..])
            .find(|tail| self.stops.iter().any(|s| s.len() > tail.len() && s.starts_with(tail)))
            .map_or(0, str::len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let stops: Vec<String> = stops.iter().map(|s| (*s).to_owned()).collect();
        let mut st = StopText::new(&stops);
        let mut out = String::new();
        let mut stopped = false;
        for p in pieces {
            let r = st.push(p);
            out.push_str(&r.text);
            stopped |= r.stopped;
        }
        out.push_str(&st.finish());
        (out, stopped)
    }

    #[test]
    fn a_stop_string_spanning_pieces_is_cut_and_not_shown() {
        assert_eq!(run(&["END"], &["hello E", "N", "D and more"]), ("hello ".into(), true));
        assert_eq!(run(&["\n\n"], &["a\n", "\nb"]), ("a".into(), true));
    }

    #[test]
    fn near_misses_are_released_in_full() {
        assert_eq!(run(&["END"], &["hello EN", "d"]), ("hello ENd".into(), false));
        assert_eq!(run(&["END"], &["EN"]), ("EN".into(), false));
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
    }

    #[test]
    fn earliest_of_several_stops_wins_and_text_after_is_dropped() {
        assert_eq!(run(&["xyz", "b"], &["a", "bxyz", "c"]), ("a".into(), true));
        assert_eq!(run(&["é!", "漢"], &["caf", "é", "!x"]), ("caf".into(), true));
    }

    #[test]
    fn hold_back_is_only_a_possible_prefix() {
        let mut st = StopText::new(&["abc".to_owned()]);
        assert_eq!(st.push("xxab").text, "xx");
        assert_eq!(st.push("x").text, "abx");
        assert!(!st.stopped());
    }

    #[test]
    fn streaming_equals_cutting_the_whole_text() {
        let text = "the quick brown fox jumps over the lazy dog";
        for stop in ["fox", "dog", "o", "cat", "the l", " "] {
            let whole = text.find(stop).map_or(text, |i| &text[..i]).to_owned();
            for step in 1..6 {
                let pieces: Vec<String> = text
                    .as_bytes()
                    .chunks(step)
                    .map(|c| String::from_utf8(c.to_vec()).expect("ascii"))
                    .collect();
                let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
                assert_eq!(run(&[stop], &refs).0, whole, "stop {stop:?} step {step}");
            }
        }
    }
}

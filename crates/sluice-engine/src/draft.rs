//! Drafters propose, the target decides. A [`Drafter`] guesses the next tokens from the context;
//! the verifier (in [`crate::generate`]) runs them through the target in one pass and keeps only
//! the prefix the target itself would have produced, so a drafter can change speed, never output.

/// Something that proposes likely next tokens.
pub trait Drafter: Send {
    /// Short name for statistics (`ngram`, a model path, ...).
    fn name(&self) -> String;

    /// Proposes up to `max` tokens to follow `context` (prompt and output so far, including the
    /// not-yet-verified last token).
    fn propose(&mut self, context: &[u32], max: usize) -> Vec<u32>;

    /// Why the drafter stopped proposing for good, if it did (a draft model that failed).
    fn failure(&self) -> Option<String> {
        None
    }
}

/// Prompt-lookup drafting: find the most recent earlier occurrence of the context's last `n`
/// tokens (longest `n` first, from `max_n` down to `min_n`) and propose what followed it.
#[derive(Debug, Clone)]
pub struct NgramDrafter {
    /// Longest suffix tried.
    pub max_n: usize,
    /// Shortest suffix accepted.
    pub min_n: usize,
}

impl Default for NgramDrafter {
    fn default() -> Self {
        Self { max_n: 4, min_n: 1 }
    }
}

impl Drafter for NgramDrafter {
    fn name(&self) -> String {
        "ngram".into()
    }

    fn propose(&mut self, context: &[u32], max: usize) -> Vec<u32> {
        let len = context.len();
        if max == 0 || len < 2 {
            return Vec::new();
        }
        for n in (self.min_n.max(1)..=self.max_n.min(len - 1)).rev() {
            let suffix = &context[len - n..];
            // Latest earlier match whose continuation exists.
            for start in (0..len - n).rev() {
                if &context[start..start + n] == suffix {
                    let from = start + n;
                    let to = (from + max).min(len);
                    if from < to {
                        return context[from..to].to_vec();
                    }
                }
            }
        }
        Vec::new()
    }
}

/// Proposes a fixed script: for a context of length `len`, the tokens `script[len - base..]`.
/// Used by tests to drive the verifier with drafts that are right, wrong or partly right
/// (e.g. replaying the target's own future tokens exercises the full-acceptance path).
#[derive(Debug, Clone)]
pub struct ScriptDrafter {
    /// Context length at which `script[0]` is the proposal for the next position.
    pub base: usize,
    /// Tokens to propose, by position.
    pub script: Vec<u32>,
}

impl Drafter for ScriptDrafter {
    fn name(&self) -> String {
        "script".into()
    }

    fn propose(&mut self, context: &[u32], max: usize) -> Vec<u32> {
        let at = context.len().saturating_sub(self.base);
        self.script.iter().skip(at).take(max).copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ngram_proposes_the_continuation_of_the_latest_match() {
        let mut d = NgramDrafter::default();
        // "1 2 3 4 ... 1 2" → propose "3 4 ..."
        let ctx = [1, 2, 3, 4, 5, 9, 1, 2];
        assert_eq!(d.propose(&ctx, 3), vec![3, 4, 5]);
        // The latest occurrence wins.
        let ctx = [7, 1, 8, 7, 1, 9, 7, 1];
        assert_eq!(d.propose(&ctx, 1), vec![9]);
        assert!(d.propose(&[1, 2, 3], 4).is_empty());
        assert!(d.propose(&ctx, 0).is_empty());
    }

    #[test]
    fn script_drafter_replays_by_position() {
        let mut d = ScriptDrafter { base: 3, script: vec![10, 11, 12, 13] };
        assert_eq!(d.propose(&[0, 0, 0], 2), vec![10, 11]);
        assert_eq!(d.propose(&[0, 0, 0, 10, 11], 5), vec![12, 13]);
    }
}

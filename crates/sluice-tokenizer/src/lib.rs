//! sluice-tokenizer (in progress).

//! The committed fixtures that hold every tokenizer kind sluice reads, for the tests that must
//! cover each: this crate's `token_table.rs` and the engine's grammar test
//! (`crates/sluice-engine/tests/constraint.rs`, which includes this file by path).

/// Byte-level BPE `tokenizer.json` (Qwen3-MoE, GPT-OSS, DeepSeek R1) and tiktoken ranks (Kimi
/// K2's in `deepseek_v3/tiny-b`, K3's), as directories under `tests/fixtures`.
pub const TOKENIZER_FIXTURES: [&str; 5] = [
    "qwen3_moe/tiny-a",
    "gpt_oss/tiny-a",
    "deepseek_v3/tiny-a",
    "deepseek_v3/tiny-b",
    "kimi_k3/tiny-a",
];

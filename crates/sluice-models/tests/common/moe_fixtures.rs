//! The committed fixtures of every family with routed experts, for the tests that must cover
//! each: this crate's family contract, spine and capture tests (through `common`), the
//! engine's `families.rs` and the CLI's `family_streaming.rs`, which include this file by path
//! (as the engine includes the tokenizer's `tokenizer_kinds.rs`): one list, so a new family's
//! fixture is added once and every one of them runs it.

/// Every MoE family's fixtures (family folder, fixture) under `tests/fixtures`.
pub const MOE_FIXTURES: [(&str, &str); 7] = [
    ("kimi_k3", "tiny-a"),
    ("qwen3_moe", "tiny-a"),
    ("qwen3_moe", "tiny-b"),
    ("gpt_oss", "tiny-a"),
    ("gpt_oss", "tiny-b"),
    ("deepseek_v3", "tiny-a"),
    ("deepseek_v3", "tiny-b"),
];

//! Helpers the `sluice` binary's tests share: running the binary with its cache in a test's
//! own directory, and the committed Kimi K3 fixtures' paths.
// Not every test file uses every helper.
#![allow(dead_code, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Runs `sluice` with `args`, its cache (`SLUICE_CACHE`) in `cache`, to completion.
pub fn sluice(args: &[&str], cache: &Path) -> Output {
    sluice_with_env(args, cache, &[])
}

/// [`sluice`] with the environment variables `env` set as well (`SLUICE_ISA`, ...).
pub fn sluice_with_env(args: &[&str], cache: &Path, env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .env("SLUICE_CACHE", cache)
        .envs(env.iter().copied())
        .output()
        .expect("spawn sluice")
}

/// The directory of the committed Kimi K3 fixture `name` (`tiny-a`, `tiny-b`), as an argument.
pub fn k3_fixture(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/kimi_k3")
        .join(name)
        .display()
        .to_string()
}

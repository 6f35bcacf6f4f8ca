//! Installing from a [`TestHub`] the way `sluice pull` does, for the tests of the crates that
//! run installs (the engine's stream-install tests, the CLI's `doctor` tests): the committed tiny
//! Kimi K3 fixture served as a repository, a client with quick retries, and one call that
//! resolves, plans and pulls a repository into a directory.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{HubRepo, TestHub};
use crate::{
    HubClient, HubConfig, InstallReport, ModeRequest, NoProgress, PlanOptions, PullOptions, Result,
    RetryPolicy, RoutedTensors, StatvfsFreeSpace,
};

/// The repository id the tiny Kimi K3 fixture is served under.
pub const K3_TINY_REPO: &str = "moonshotai/Kimi-K3-tiny";

/// The committed tiny Kimi K3 checkpoint (`tests/fixtures/kimi_k3/tiny-a` of this workspace).
pub fn k3_tiny_fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/kimi_k3/tiny-a")
}

/// A hub serving [`k3_tiny_fixture`] as [`K3_TINY_REPO`].
pub fn k3_tiny_hub() -> std::io::Result<TestHub> {
    TestHub::start(vec![HubRepo::from_dir(K3_TINY_REPO, &k3_tiny_fixture())?])
}

/// Retries quick enough for fault tests: 5 attempts, 20 to 200 ms apart, `Retry-After` up to 5 s.
pub fn quick_retries() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 5,
        base_delay: Duration::from_millis(20),
        max_delay: Duration::from_millis(200),
        max_retry_after: Duration::from_secs(5),
    }
}

/// Pulls `repo` at `main` from `hub` into the plain directory `dir` in `mode`, with
/// [`quick_retries`], two workers, the volume's real free space, and a 4 KiB coalescing gap
/// (test experts are tiny; real ones are 17.5 MB, far above the 1 MiB default). `routed` lists
/// the repository's routed experts, as the model family gives them (`sluice-models`).
pub fn install(
    hub: &TestHub,
    repo: &str,
    dir: &Path,
    mode: ModeRequest,
    routed: &RoutedTensors,
) -> Result<InstallReport> {
    let mut cfg = HubConfig::new(hub.endpoint());
    cfg.retry = quick_retries();
    let client = HubClient::new(cfg)?;
    let info = client.resolve(repo, "main")?;
    let opts = PlanOptions {
        mode,
        dir: Some(dir.to_path_buf()),
        reuse_cache: None,
        workers: 2,
        coalesce_gap: 4096,
        routed: routed.clone(),
    };
    let plan = client.plan(&info, &opts, &StatvfsFreeSpace)?;
    client.pull(&plan, &PullOptions::default(), &NoProgress)
}

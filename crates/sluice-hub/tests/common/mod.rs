//! Shared helpers for the integration tests: repositories to serve, clients, fake disks.

#![allow(dead_code)]

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sluice_hub::testhub::{
    k3_tiny_fixture, quick_retries, safetensors_bytes, HubFile, HubRepo, TestHub, K3_TINY_REPO,
};
use sluice_hub::{
    FreeSpace, HubClient, HubConfig, InstallPlan, ModeRequest, PlanOptions, RoutedTensors, Sink,
    SinkFactory,
};

/// The committed tiny Kimi K3 checkpoint.
pub fn fixture_dir() -> PathBuf {
    k3_tiny_fixture()
}

/// The fixture as a repository, plus a nested non-LFS file to exercise paths with `/`.
pub fn fixture_repo() -> HubRepo {
    let mut repo = HubRepo::from_dir(K3_TINY_REPO, &fixture_dir()).expect("fixture");
    repo.files.push(HubFile::new("docs/notes.txt", b"tiny fixture\n".to_vec(), false));
    HubRepo::new(&repo.id, repo.files)
}

/// Expert tensor name as in Kimi K3.
pub fn expert(layer: u32, e: u32, w: &str) -> String {
    format!("language_model.model.layers.{layer}.block_sparse_moe.experts.{e}.{w}.weight_packed")
}

/// A synthetic repository: two expert shards of `expert_len`-byte experts, one shard with
/// no experts, and small JSON files.
pub fn synthetic_repo(id: &str, expert_len: usize, seed: u64) -> HubRepo {
    let mut files = Vec::new();
    for shard in 1..=2u32 {
        let layer = shard;
        let mut names: Vec<(String, usize)> = vec![
            (format!("language_model.model.layers.{layer}.input_layernorm.weight"), 256),
            (format!("language_model.model.layers.{layer}.self_attn.q_proj.weight"), 4096),
        ];
        for e in 0..4 {
            for w in ["w1", "w2", "w3"] {
                names.push((expert(layer, e, w), expert_len));
            }
        }
        names.push((
            format!("language_model.model.layers.{layer}.block_sparse_moe.shared_experts.up_proj.weight"),
            2048,
        ));
        for e in 4..6 {
            names.push((expert(layer, e, "w1"), expert_len));
        }
        names.push((
            format!("language_model.model.layers.{layer}.post_attention_layernorm.weight"),
            256,
        ));
        let refs: Vec<(&str, usize)> = names.iter().map(|(n, l)| (n.as_str(), *l)).collect();
        let data = safetensors_bytes(&refs, seed + u64::from(shard));
        files.push(HubFile::new(&format!("model-0000{shard}-of-00003.safetensors"), data, true));
    }
    let dense = safetensors_bytes(
        &[
            ("language_model.model.embed_tokens.weight", 8192),
            ("language_model.lm_head.weight", 8192),
        ],
        seed + 9,
    );
    files.push(HubFile::new("model-00003-of-00003.safetensors", dense, true));
    files.push(HubFile::new(
        "config.json",
        br#"{"architectures":["KimiK3ForCausalLM"]}"#.to_vec(),
        false,
    ));
    files.push(HubFile::new("tokenizer_config.json", b"{}".to_vec(), false));
    HubRepo::new(id, files)
}

/// A client for `hub` with quick retries, so fault tests run fast.
pub fn client(hub: &TestHub, token: Option<&str>) -> HubClient {
    client_with_timeout(hub, token, Duration::from_secs(10))
}

/// Like [`client`] with a given read (stall) timeout.
pub fn client_with_timeout(
    hub: &TestHub,
    token: Option<&str>,
    read_timeout: Duration,
) -> HubClient {
    let mut cfg = HubConfig::new(hub.endpoint());
    cfg.token = token.map(str::to_owned);
    cfg.read_timeout = read_timeout;
    cfg.retry = quick_retries();
    HubClient::new(cfg).expect("client")
}

/// A volume that claims to have exactly this many free bytes.
pub struct FakeSpace(pub u64);

impl FreeSpace for FakeSpace {
    fn free_bytes(&self, _path: &Path) -> io::Result<u64> {
        Ok(self.0)
    }
}

/// Plan options for a plain directory, no cache reuse. The coalescing gap is 4 KiB because
/// test experts are tiny (real ones are 17.5 MB, far above the 1 MiB default).
pub fn opts(dir: &Path, mode: ModeRequest) -> PlanOptions {
    PlanOptions {
        mode,
        dir: Some(dir.to_path_buf()),
        reuse_cache: None,
        workers: 4,
        coalesce_gap: 4096,
        routed: RoutedTensors::none(),
    }
}

/// Plan options as [`opts`], with the routed experts of `repo` (see [`routed_in`]).
pub fn opts_for(repo: &HubRepo, dir: &Path, mode: ModeRequest) -> PlanOptions {
    PlanOptions { routed: routed_in(repo), ..opts(dir, mode) }
}

/// The routed-expert tensors of a test repository. In sluice the list comes from the model
/// family's layout (`sluice-models`); the hub's tests serve synthetic repositories of no family,
/// whose routed experts are by construction the tensors named `...experts.N...`.
pub fn routed_in(repo: &HubRepo) -> RoutedTensors {
    let mut names = std::collections::BTreeSet::new();
    for f in repo.files.iter().filter(|f| f.path.ends_with(".safetensors")) {
        let n = u64::from_le_bytes(f.data[..8].try_into().expect("prefix"));
        let json: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(&f.data[8..8 + usize::try_from(n).expect("len")])
                .expect("header");
        for k in json.keys() {
            let parts: Vec<&str> = k.split('.').collect();
            if parts.windows(2).any(|w| {
                w[0] == "experts" && !w[1].is_empty() && w[1].bytes().all(|b| b.is_ascii_digit())
            }) {
                names.insert(k.clone());
            }
        }
    }
    RoutedTensors::new(names)
}

/// Resolves and plans `repo` into `dir` with plenty of (fake) space.
pub fn plan(client: &HubClient, repo: &HubRepo, dir: &Path, mode: ModeRequest) -> InstallPlan {
    let info = client.resolve(&repo.id, "main").expect("resolve");
    client.plan(&info, &opts_for(repo, dir, mode), &FakeSpace(1 << 50)).expect("plan")
}

/// Asserts that every file of `repo` is in `dir` with identical bytes.
pub fn assert_installed(repo: &HubRepo, dir: &Path) {
    for f in &repo.files {
        let got = std::fs::read(dir.join(&f.path)).unwrap_or_else(|e| panic!("{}: {e}", f.path));
        assert!(got == *f.data, "{} differs", f.path);
        assert!(!dir.join(format!("{}.part", f.path)).exists(), "{}.part left behind", f.path);
    }
}

/// Sinks that fail with ENOSPC once `budget` bytes have been written in total.
pub struct FullDisk {
    pub budget: Arc<AtomicU64>,
}

impl SinkFactory for FullDisk {
    fn open(&self, path: &Path) -> io::Result<Box<dyn Sink>> {
        let inner = sluice_hub::FsSinks.open(path)?;
        Ok(Box::new(FullDiskSink { inner, budget: Arc::clone(&self.budget) }))
    }
}

struct FullDiskSink {
    inner: Box<dyn Sink>,
    budget: Arc<AtomicU64>,
}

impl Sink for FullDiskSink {
    fn write_all_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        let n = buf.len() as u64;
        let left = self.budget.load(Ordering::SeqCst);
        if n > left {
            // Write what fits, as a real file system does, then fail.
            let fits = usize::try_from(left).expect("small");
            self.inner.write_all_at(offset, &buf[..fits])?;
            self.budget.store(0, Ordering::SeqCst);
            return Err(io::Error::from_raw_os_error(28));
        }
        self.budget.fetch_sub(n, Ordering::SeqCst);
        self.inner.write_all_at(offset, buf)
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }

    fn sync(&mut self) -> io::Result<()> {
        self.inner.sync()
    }
}

/// A file offset as a slice index.
pub fn ix(n: u64) -> usize {
    usize::try_from(n).expect("test offsets fit in usize")
}

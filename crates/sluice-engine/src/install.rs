//! Opening an install made by `sluice pull`, and saying which kind it is.
//!
//! A **full** install (or a plain checkpoint directory) opens as usual. A **stream** install
//! keeps each expert shard as `{shard}.sparse` (spine at its original offsets, holes where the
//! routed experts are): it opens with those files standing in for the shards, and its routed
//! experts are served by the streaming store with a persistent disk cache whose misses are
//! fetched from the hub the install pins (`sluice_hub::HubRemote`), so output is bit-identical
//! to a full install. Prefetch never fetches remotely. The memory plan, its charges and the
//! spine placement (`--spine-placement`) are those of a full install (`place.rs`), with the
//! remote fetch buffers charged as extra headroom; a streamed spine is read from the sparse
//! shards. The disk cache's budget is `LoadOptions::disk_cache`, by default what is already
//! cached plus the free space of the install's volume less headroom (2% + 1 GiB).

use crate::load::{ExpertMode, LoadOptions, Loaded};
use crate::place;
use crate::spine::Spine;
use crate::EngineError;
use sluice_checkpoint::Checkpoint;
use sluice_hub::shard::is_routed_expert;
use sluice_hub::{FreeSpace, Install, StatvfsFreeSpace};
use sluice_models::kimi_k3::config::K3Config;
use sluice_models::kimi_k3::inventory::inventory;
use sluice_models::kimi_k3::KimiK3;
use sluice_models::{Model, ModelError};
use sluice_store::remote::log::{self, LOG_FILE};
use sluice_store::{DiskCacheConfig, ExpertDiskCache, ShardFiles, StreamingExperts};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

fn install_err(dir: &Path, reason: impl std::fmt::Display) -> EngineError {
    EngineError::Install { dir: dir.to_path_buf(), reason: reason.to_string() }
}

/// Opens the checkpoint of a stream install whose expert shards are the `sparse` files
/// (shard name → file): the spine is mapped from them, their routed-expert ranges never are
/// (the disk cache writes and punches those while a model runs).
pub fn open_sparse(
    dir: &Path,
    sparse: &BTreeMap<String, String>,
) -> Result<Checkpoint, sluice_checkpoint::CheckpointError> {
    Checkpoint::open_with_shards(
        dir,
        &|name| dir.join(sparse.get(name).map_or(name, String::as_str)),
        &|name, tensor| sparse.contains_key(name) && is_routed_expert(tensor),
    )
}

/// Opens `dir` if it is a stream install (`Ok(None)` otherwise: a full install or a plain
/// checkpoint, for the ordinary path).
pub fn open_stream_install(dir: &Path, opts: &LoadOptions) -> Result<Option<Loaded>, EngineError> {
    let Some(install) = Install::detect(dir).map_err(|e| install_err(dir, e))? else {
        return Ok(None);
    };
    let sparse = install.sparse_shards();
    if !install.is_stream() || sparse.is_empty() {
        return Ok(None);
    }
    install.check_runnable().map_err(|e| install_err(dir, e))?;
    if opts.spine == Spine::Int8 {
        return Err(int8_refusal(dir));
    }
    if opts.experts == ExpertMode::Mapped {
        return Err(install_err(
            dir,
            "a stream install has no local routed experts to map; drop --experts mapped, \
             or make a full install with `sluice pull REPO --full`",
        ));
    }
    // The routed experts of a sparse shard are the holes the disk cache fills and punches
    // while the model runs: they are never mapped (see `Checkpoint::open_with_shards`), only
    // read by the streaming store.
    let ckpt = Arc::new(open_sparse(dir, &sparse).map_err(ModelError::from)?);
    let cfg = K3Config::from_json(ckpt.config().text_config())
        .map_err(|e| install_err(dir, format!("stream installs run Kimi K3 models only: {e}")))?;
    // Shard i: its name in the log (the file in the model directory) and on the hub.
    let mut names = Vec::new();
    let mut repo_files = Vec::new();
    for p in ckpt.shard_paths() {
        let local = p.strip_prefix(dir).unwrap_or(p).to_string_lossy().into_owned();
        let repo = sparse
            .iter()
            .find(|(_, s)| **s == local)
            .map_or_else(|| local.clone(), |(r, _)| r.clone());
        names.push(local);
        repo_files.push(repo);
    }
    let index = KimiK3::expert_index(&ckpt, &cfg)?;

    // Memory: planned, charged and the spine placed as for a full install; the remote fetch
    // buffers are extra headroom.
    let disk_cfg = DiskCacheConfig::new(disk_budget(dir, opts, &install.manifest.commit)?);
    let expert_bytes = inventory(&ckpt, &cfg).expert_bytes;
    let fetch_buffers = disk_cfg.buffer_bytes(expert_bytes);
    crate::spine::check(&ckpt, opts.spine)?;
    let model = Model::new(KimiK3::with_store(ckpt.clone(), Arc::new(place::Unattached))?)?;
    let mut placed = place::place(&ckpt, model, opts, (fetch_buffers, "remote fetch buffers"))?;
    let hub = install.hub_config();
    let remote = install.remote(hub, repo_files).map_err(|e| install_err(dir, e))?;
    let disk = ExpertDiskCache::open(
        index.clone(),
        names,
        &dir.join(LOG_FILE),
        &install.manifest.commit,
        Arc::new(remote),
        disk_cfg,
    )
    .map_err(ModelError::from)?;
    let config = place::streaming_config(&mut placed.plan, opts, placed.io);
    let files = ShardFiles::open(index.paths(), placed.io).map_err(ModelError::from)?;
    let store =
        StreamingExperts::with_disk_cache(index, Arc::new(files), &config, &placed.budget, disk)
            .map_err(ModelError::from)?;
    Ok(Some(placed.streaming(Arc::new(store), opts.prefetch)))
}

/// True when `dir` holds a stream install (a `sluice-install.json` in stream mode with sparse
/// shards); false for a full install, a plain checkpoint, or an unreadable manifest (which
/// opening the install reports).
pub fn is_stream_install(dir: &Path) -> bool {
    matches!(Install::detect(dir), Ok(Some(i)) if i.is_stream() && !i.sparse_shards().is_empty())
}

/// `--spine int8` on a stream install: the int8 conversion copies the routed experts, which a
/// stream install does not hold (and `sluice convert` refuses it as a source).
pub(crate) fn int8_refusal(dir: &Path) -> EngineError {
    EngineError::Spine {
        dir: dir.to_path_buf(),
        reason: "is a stream install: --spine int8 needs a converted copy of the whole \
                 checkpoint, routed experts included, which a stream install does not hold; \
                 make a full install (`sluice pull REPO --full`), convert it with \
                 `sluice convert --spine int8 DIR`, or run this install with --spine bf16"
            .into(),
    }
}

/// The disk cache budget: `opts.disk_cache`, or what is cached already plus the volume's free
/// space less headroom (2% + 1 GiB, as `sluice pull` plans).
fn disk_budget(dir: &Path, opts: &LoadOptions, commit: &str) -> Result<u64, EngineError> {
    if let Some(b) = opts.disk_cache {
        return Ok(b);
    }
    let path = dir.join(LOG_FILE);
    let cached = log::read(&path)
        .map_err(|source| EngineError::Io { path: path.clone(), source })?
        .filter(|s| s.commit.as_deref() == Some(commit))
        .map_or(0, |s| s.present_bytes());
    let free = StatvfsFreeSpace
        .free_bytes(dir)
        .map_err(|source| EngineError::Io { path: dir.to_path_buf(), source })?;
    let headroom = free / 50 + (1 << 30);
    Ok(cached + free.saturating_sub(headroom))
}

/// One line saying which install `dir` is, for `sluice run`: `install: stream (x of y experts
/// local, z GiB)`, `install: full`, or `install: plain checkpoint directory`.
pub fn describe(dir: &Path, loaded: &Loaded) -> String {
    let disk = loaded.streaming.as_ref().and_then(|s| s.disk_cache());
    if let Some(d) = disk {
        let (n, bytes) = d.present();
        #[allow(clippy::cast_precision_loss)]
        let gib = bytes as f64 / f64::from(1u32 << 30);
        return format!(
            "install: stream ({n} of {} experts local, {gib:.2} GiB; disk cache budget {:.2} GiB; \
             missing experts from {})",
            d.total_experts(),
            {
                #[allow(clippy::cast_precision_loss)]
                let b = d.budget() as f64 / f64::from(1u32 << 30);
                b
            },
            d.remote().describe()
        );
    }
    match Install::detect(dir) {
        Ok(Some(i)) if !i.is_stream() || i.sparse_shards().is_empty() => {
            format!("install: full ({}@{})", i.manifest.repo, i.manifest.commit)
        }
        _ => "install: full (plain checkpoint directory, no sluice-install.json)".to_owned(),
    }
}

//! Opening an install made by `sluice pull`, and saying which kind it is; and which tensors of a
//! repository are routed experts ([`routed_tensors`]), which `sluice pull --stream` leaves out.
//!
//! A **full** install (or a plain checkpoint directory) opens as usual. A **stream** install
//! keeps each expert shard as `{shard}.sparse` (spine at its original offsets, holes where the
//! routed experts are): it opens with those files standing in for the shards, and its routed
//! experts are served by the streaming store with a persistent disk cache whose misses are
//! fetched from the hub the install pins (`sluice_hub::HubRemote`), so output is bit-identical
//! to a full install. Prefetch never fetches remotely. The memory plan, its charges and the
//! spine placement (`--spine-placement`) are those of a full install (`place.rs`), with the
//! remote fetch buffers charged as extra headroom; a streamed spine is read from the sparse
//! shards. Every family with an expert layout streams this way, loaded through its family
//! table line (`with_experts`) and placed like a full install; which tensors are routed
//! experts comes from the family's layout (its line's `routed`, `sluice_models::family`),
//! never from a name pattern or a family's name. The disk cache's budget is `LoadOptions::disk_cache`, by default what is already
//! cached plus the free space of the install's volume less headroom (2% + 1 GiB).

use crate::load::{ExpertMode, LoadOptions, Loaded};
use crate::place;
use crate::spine::Spine;
use crate::EngineError;
use sluice_checkpoint::{Checkpoint, CheckpointConfig};
use sluice_hub::{FreeSpace, Install, RoutedTensors, StatvfsFreeSpace};
use sluice_models::ModelError;
use sluice_store::remote::log::{self, LOG_FILE};
use sluice_store::{DiskCacheConfig, ExpertDiskCache, ExpertIndex, ShardFiles, StreamingExperts};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

fn install_err(dir: &Path, reason: impl std::fmt::Display) -> EngineError {
    EngineError::Install { dir: dir.to_path_buf(), reason: reason.to_string() }
}

/// The tensors of a checkpoint with config `config` that hold its routed experts, from its
/// family's expert layout: whole per-expert tensors (Kimi K3, Qwen3-MoE) and stacked `[E, ...]`
/// tensors (GPT-OSS) alike. None for a family without routed experts or without a layout yet
/// (a stream install of it is a full one). For `sluice pull`, which has only `config.json`.
pub fn routed_tensors(config: &CheckpointConfig) -> Result<RoutedTensors, EngineError> {
    let routed = sluice_models::family::routed_for_config(config)?;
    Ok(match routed {
        Some(r) => RoutedTensors::new(r.routed_tensors()?),
        None => RoutedTensors::none(),
    })
}

/// [`routed_tensors`] of the checkpoint in `dir` (its `config.json`).
pub fn routed_tensors_in(dir: &Path) -> Result<RoutedTensors, EngineError> {
    let config = CheckpointConfig::load(dir).map_err(ModelError::from)?;
    routed_tensors(&config)
}

/// [`routed_tensors`] of the repository `info` describes, from its `config.json` fetched over
/// `client` (one small range request): what `sluice pull` plans with. None when the repository
/// has no `config.json` (it is no model: nothing to stream).
pub fn routed_tensors_remote(
    client: &sluice_hub::HubClient,
    info: &sluice_hub::RepoInfo,
) -> Result<RoutedTensors, EngineError> {
    /// A `config.json` larger than this is refused (real ones are a few KiB).
    const MAX_CONFIG: u64 = 16 << 20;
    let Some(file) = info.files.iter().find(|f| f.path == sluice_checkpoint::CONFIG_FILE) else {
        return Ok(RoutedTensors::none());
    };
    let bad = |reason: String| EngineError::Install {
        dir: Path::new(&info.repo).join(&file.path),
        reason,
    };
    if file.size > MAX_CONFIG {
        return Err(bad(format!("is {} bytes; at most {MAX_CONFIG} are read", file.size)));
    }
    let fetch = || -> Result<Vec<u8>, sluice_hub::HubError> {
        let fetcher = sluice_hub::RangeFetcher::new(client.clone(), &info.repo, &info.commit)?;
        fetcher.fetch_range(&file.path, 0, file.size)
    };
    let bytes = fetch().map_err(|e| bad(e.to_string()))?;
    let raw = serde_json::from_slice(&bytes).map_err(|e| bad(format!("is not JSON: {e}")))?;
    let config = CheckpointConfig::from_value(&file.path, raw).map_err(ModelError::from)?;
    routed_tensors(&config)
}

/// Opens the checkpoint of a stream install whose expert shards are the `sparse` files
/// (shard name → file): the spine is mapped from them, their routed-expert ranges (the tensors
/// `routed` lists) never are (the disk cache writes and punches those while a model runs).
pub fn open_sparse(
    dir: &Path,
    sparse: &BTreeMap<String, String>,
    routed: &RoutedTensors,
) -> Result<Checkpoint, sluice_checkpoint::CheckpointError> {
    Checkpoint::open_with_shards(
        dir,
        &|name| dir.join(sparse.get(name).map_or(name, String::as_str)),
        &|name, tensor| sparse.contains_key(name) && routed.contains(tensor),
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
    let routed = routed_tensors_in(dir)?;
    if routed.is_empty() {
        return Err(install_err(
            dir,
            "is a stream install of a model whose family has no routed-expert layout; \
             make a full install with `sluice pull REPO --full`",
        ));
    }
    let ckpt = Arc::new(open_sparse(dir, &sparse, &routed).map_err(ModelError::from)?);
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
    let disk_cfg = DiskCacheConfig::new(disk_budget(dir, opts, &install.manifest.commit)?);
    let hub = install.hub_config();
    let remote = install.remote(hub, repo_files).map_err(|e| install_err(dir, e))?;
    let log_path = dir.join(LOG_FILE);
    let commit = install.manifest.commit.clone();
    let buffers = |expert_bytes| disk_cfg.buffer_bytes(expert_bytes);
    let open_disk = {
        let disk_cfg = disk_cfg.clone();
        move |index: &ExpertIndex| {
            ExpertDiskCache::open(
                index.clone(),
                names,
                &log_path,
                &commit,
                Arc::new(remote),
                disk_cfg,
            )
            .map_err(|e| EngineError::Model(ModelError::from(e)))
        }
    };
    // A family whose spine is mapped whole plans only its routed experts (as a full install
    // of it does); the fetch buffers are extra headroom.
    if !sluice_models::family::of(&ckpt)?.places_spine {
        let Some(experts) = sluice_models::family::routed_for_config(ckpt.config())? else {
            return Err(install_err(dir, "invariant: a routed-expert list without a layout"));
        };
        let remote =
            place::Remote { headroom: buffers(experts.expert_bytes), open: Box::new(open_disk) };
        return place::open_mapped_spine(&ckpt, opts, Some(remote)).map(Some);
    }
    // Loaded through the family table without mapping its routed experts (they are the holes
    // of the sparse shards), its store attached once the plan stands.
    let model =
        sluice_models::family::load_with_experts(ckpt.clone(), Arc::new(place::Unattached))?;
    let Some(routed) = model.routed_experts() else {
        return Err(install_err(dir, "invariant: a routed-expert list without a layout"));
    };
    let index = routed.index(&ckpt).map_err(ModelError::from)?;

    // Memory: planned, charged and the spine placed as for a full install; the remote fetch
    // buffers are extra headroom.
    let fetch_buffers = buffers(routed.expert_bytes);
    let mut placed = place::place(&ckpt, model, opts, (fetch_buffers, "remote fetch buffers"))?;
    let disk = open_disk(&index)?;
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

//! Opening an install made by `sluice pull`, and saying which kind it is.
//!
//! A **full** install (or a plain checkpoint directory) opens as usual. A **stream** install
//! keeps each expert shard as `{shard}.sparse` (spine at its original offsets, holes where the
//! routed experts are): it opens with those files standing in for the shards, and its routed
//! experts are served by the streaming store with a persistent disk cache whose misses are
//! fetched from the hub the install pins (`sluice_hub::HubRemote`), so output is bit-identical
//! to a full install. Prefetch never fetches remotely. The disk cache's budget is
//! `LoadOptions::disk_cache`, by default what is already cached plus the free space of the
//! install's volume less headroom (2% + 1 GiB).

use crate::load::{ExpertMode, LoadOptions, Loaded};
use crate::plan::{default_budget, Needs, Plan, SpineMode, SpinePieces};
use crate::EngineError;
use sluice_checkpoint::Checkpoint;
use sluice_core::MemoryBudget;
use sluice_hub::{FreeSpace, Install, StatvfsFreeSpace};
use sluice_models::kimi_k3::config::K3Config;
use sluice_models::kimi_k3::inventory::inventory;
use sluice_models::kimi_k3::KimiK3;
use sluice_models::{Model, ModelError};
use sluice_store::remote::log::{self, LOG_FILE};
use sluice_store::{
    CacheSize, DiskCacheConfig, ExpertDiskCache, ExpertIndex, IoMode, ShardFiles, StreamingConfig,
    StreamingExperts,
};
use std::path::Path;
use std::sync::Arc;

fn install_err(dir: &Path, reason: impl std::fmt::Display) -> EngineError {
    EngineError::Install { dir: dir.to_path_buf(), reason: reason.to_string() }
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
    if opts.experts == ExpertMode::Mapped {
        return Err(install_err(
            dir,
            "a stream install has no local routed experts to map; drop --experts mapped, \
             or make a full install with `sluice pull REPO --full`",
        ));
    }
    let ckpt = Arc::new(
        Checkpoint::open_with_shards(dir, &|name| {
            dir.join(sparse.get(name).map_or(name, String::as_str))
        })
        .map_err(ModelError::from)?,
    );
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
    let index = ExpertIndex::build(
        &ckpt,
        cfg.num_hidden_layers,
        &KimiK3::moe_layers(&cfg),
        cfg.num_experts,
        &KimiK3::expert_names(&cfg),
    )
    .map_err(ModelError::from)?;

    // Memory: as for a streamed full install, plus the fetch buffers.
    let inv = inventory(&ckpt, &cfg);
    let disk_cfg = DiskCacheConfig::new(disk_budget(dir, opts, &install.manifest.commit)?);
    let fetch_buffers = disk_cfg.buffer_bytes(inv.expert_bytes);
    let budget_bytes = opts.memory.unwrap_or_else(default_budget);
    let budget = MemoryBudget::new(budget_bytes);
    // The spine of a stream install stays mapped from the sparse shards (no placement yet).
    let needs = Needs {
        spine: inv.spine_bytes,
        pieces: SpinePieces { embed: 0, layers: Vec::new(), head: 0, small: 0, rows: 0 },
        state: inv.kda_state_bytes + inv.mla_bytes_per_token * opts.context as u64,
        slot: inv.expert_bytes.div_ceil(4096) * 4096 + 8192,
        experts: inv.experts,
        min_slots: 2,
        headroom: (64 << 20) + fetch_buffers,
        sessions: opts.session_memory,
        draft: opts.draft_bytes,
    };
    let mut plan = Plan::compute(budget_bytes, needs.clone(), SpineMode::Mapped)?;
    let charges = vec![
        budget.charge("spine", needs.spine).map_err(EngineError::Budget)?,
        budget
            .charge(
                "sequence state, headroom and remote fetch buffers",
                needs.state + needs.headroom,
            )
            .map_err(EngineError::Budget)?,
        budget.charge("stored conversation states", needs.sessions).map_err(EngineError::Budget)?,
        budget.charge("draft model", needs.draft).map_err(EngineError::Budget)?,
    ];
    if let Some(n) = opts.slots {
        plan.slots = n as u64;
        plan.all_experts_resident = plan.slots >= plan.needs.experts;
    }
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
    let config = StreamingConfig {
        cache: CacheSize::Slots(usize::try_from(plan.slots).unwrap_or(usize::MAX)),
        readers: opts.readers,
        backend: opts.io_backend,
        io: if opts.direct_io { IoMode::Direct } else { IoMode::BufferedDropCache },
        max_prefetch_slots: if opts.prefetch { None } else { Some(0) },
        prefetch_min_precision: opts.prefetch_min_precision,
        ..StreamingConfig::default()
    };
    let files = ShardFiles::open(index.paths(), config.io).map_err(ModelError::from)?;
    let store = Arc::new(
        StreamingExperts::with_disk_cache(index, Arc::new(files), &config, &budget, disk)
            .map_err(ModelError::from)?,
    );
    let mut m = KimiK3::with_store(ckpt, store.clone())?;
    m.set_prefetch(opts.prefetch);
    Ok(Some(Loaded {
        model: Model::KimiK3(m),
        plan: Some(plan),
        streaming: Some(store),
        spine: None,
        mode: "stream",
        budget,
        charges,
    }))
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

//! `--state-cache DIR`, `--state-cache-size SIZE` and `--state-cache-every N` (on `run` and
//! `serve`): the on-disk prompt-state cache ([`sluice_engine::state_cache`]), opened for the
//! loaded model with its fingerprint.

use crate::open::Target;
use crate::values;
use anyhow::{Context, Result};
use clap::Args;
use sluice_engine::state_cache::{StateCache, StateCacheConfig, StateCacheStats};
use sluice_engine::state_file::model_fingerprint;
use sluice_engine::Spine;
use sluice_models::Model;
use std::path::PathBuf;
use std::sync::Arc;

/// Flags of the on-disk prompt-state cache.
#[derive(Debug, Args)]
pub struct StateCacheArgs {
    /// Keep prompt states in this directory: a later request (in this process or the next)
    /// whose prompt starts with a cached prefix restores it and prefills only the rest.
    #[arg(long)]
    state_cache: Option<PathBuf>,
    /// Most bytes of state files kept in --state-cache (least recently used deleted first).
    #[arg(long, value_parser = values::size, allow_hyphen_values = true, default_value = "16G",
          requires = "state_cache")]
    state_cache_size: u64,
    /// Write the state to --state-cache every N prompt tokens, besides message boundaries and
    /// the end of each prompt and generation (0: only there). Default: 0 for a model whose
    /// state has a fixed-size part (Kimi K3's KDA layers: every file carries it), 512 otherwise.
    #[arg(long, value_parser = values::count, allow_negative_numbers = true,
          requires = "state_cache")]
    state_cache_every: Option<usize>,
}

/// The snapshot interval when `--state-cache-every` is not given, from what one file of the
/// model's state holds (docs/PERFORMANCE.md, "The state-cache interval"). A state with a
/// fixed-size part (`fixed_bytes`: Kimi K3's KDA recurrent and conv states, 465 MB) writes
/// that part again in every file, so each interval file costs about as much as the prompt-end
/// file that is written anyway: on the agent replay an interval of 512 made the files of a new
/// 3k-token K3 prompt 5.9 GB instead of 2.5 GB (the whole six-turn replay 19.4 GB instead of
/// 13.2 GB) and restored no token that the message boundaries and prompt ends did not. A state
/// of append-only caches (keys and values, MLA latents) costs only its positions per file; it
/// keeps 512 (not measured on a replay yet).
pub fn default_every(fixed_bytes: usize) -> usize {
    if fixed_bytes > 0 {
        0
    } else {
        512
    }
}

impl StateCacheArgs {
    /// Whether `--state-cache` was given (the memory plan then charges its snapshots).
    pub fn enabled(&self) -> bool {
        self.state_cache.is_some()
    }

    /// Opens the cache for `model` (loaded from `target` with `spine`), or `None` without
    /// `--state-cache`.
    pub fn open(
        &self,
        target: &Target,
        model: &Model,
        spine: Spine,
    ) -> Result<Option<Arc<StateCache>>> {
        let Some(dir) = &self.state_cache else {
            return Ok(None);
        };
        let mut numerics = format!("spine={spine:?}");
        if target.read_dir != target.dir {
            // The spine comes from a conversion: its files are part of the numerics too.
            let spine_fp = model_fingerprint(&target.read_dir, &numerics)
                .with_context(|| format!("fingerprinting {}", target.read_dir.display()))?;
            numerics.push_str(";spine-files=");
            numerics.extend(spine_fp.iter().map(|b| format!("{b:02x}")));
        }
        let fingerprint = model_fingerprint(&target.dir, &numerics)
            .with_context(|| format!("fingerprinting {}", target.dir.display()))?;
        // The shape comes from the configuration: building a state to ask it would allocate a
        // Kimi K3 state's 0.9 GB at start-up for nothing.
        let shape = model.state_shape();
        let cfg = StateCacheConfig {
            dir: dir.clone(),
            max_bytes: self.state_cache_size,
            every: self.state_cache_every.unwrap_or_else(|| default_every(shape.fixed_bytes())),
        };
        let cache = StateCache::open(cfg, fingerprint, shape, model.vocab_size())
            .with_context(|| format!("--state-cache {}", dir.display()))?;
        Ok(Some(Arc::new(cache)))
    }
}

/// The `state cache …` part of a statistics line.
pub fn stats_line(s: &StateCacheStats) -> String {
    format!(
        "state cache {} tokens restored ({} bytes read in {:.3}s), {} bytes written in {} files \
         ({:.3}s, off the token path), {} refused, {} evicted, {} files / {} bytes held",
        s.tokens_restored,
        s.bytes_restored,
        secs(s.restore_ns),
        s.bytes_written,
        s.files_written,
        secs(s.write_ns),
        s.refused,
        s.evicted,
        s.files,
        s.bytes_held
    )
}

/// Nanoseconds as seconds.
fn secs(ns: u64) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let s = ns as f64 * 1e-9;
    s
}

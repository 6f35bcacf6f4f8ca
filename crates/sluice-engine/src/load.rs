//! Opening a model for a run: plan residency from the memory budget, then serve routed experts
//! either mapped in place (everything fits) or streamed from the shards through a slot cache
//! sized by the plan; the spine resident, or streamed layer by layer, as the plan places it
//! (plan, charges and spine placement are `place.rs`, shared with stream installs).
//! The plan is printed by the caller; a budget that cannot hold the minimum is refused with the
//! shortfall.

use crate::place;
use crate::plan::{Plan, SpineMode};
use crate::spine::Spine;
use crate::EngineError;
use sluice_checkpoint::Checkpoint;
use sluice_core::budget::Charge;
use sluice_core::MemoryBudget;
use sluice_models::{Model, ModelError};
use sluice_store::{IoBackend, SpineStore, StreamingExperts};
use std::path::Path;
use std::sync::Arc;

/// Where routed experts come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertMode {
    /// Mapped when everything fits the budget, streamed otherwise.
    Auto,
    /// Mapped in place from the shards (the page cache holds what is used).
    Mapped,
    /// Read from the shards into a slot cache sized by the budget.
    Stream,
}

/// How to open a model.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Memory budget in bytes (`None`: [`crate::plan::default_budget`]).
    pub memory: Option<u64>,
    /// Expert source.
    pub experts: ExpertMode,
    /// Prefetch the next layer's experts while a layer computes (streaming only).
    pub prefetch: bool,
    /// Minimum measured precision of next-layer guesses for them to be read (see
    /// [`sluice_store::streaming::DEFAULT_MIN_PRECISION`]).
    pub prefetch_min_precision: f64,
    /// Context length the sequence state is planned for.
    pub context: usize,
    /// Reader threads (reads in flight).
    pub readers: usize,
    /// Bypass the page cache for expert reads (O_DIRECT).
    pub direct_io: bool,
    /// Expert read backend: io_uring where the kernel allows it, or the pread pool.
    pub io_backend: IoBackend,
    /// Exactly this many cache slots (overrides the plan; tests use tiny caches).
    pub slots: Option<usize>,
    /// Which spine to run (see [`crate::spine`]); `dir` is resolved and checked against it.
    pub spine: Spine,
    /// Disk budget of a stream install's expert cache in bytes (`None`: free space less
    /// headroom; see [`crate::install`]).
    pub disk_cache: Option<u64>,
    /// Bytes reserved for stored conversation states (`sluice serve --session-memory`).
    pub session_memory: u64,
    /// Whether an on-disk prompt-state cache (`--state-cache`) is open: the plan then charges
    /// the snapshots it restores and queues ([`crate::state_cache::held_bytes`]).
    pub state_cache: bool,
    /// How the spine is placed: resident, streamed, or planned from the budget.
    pub spine_placement: SpineMode,
    /// Bytes of a draft model (weights, state, scratch), charged before the target is planned.
    pub draft_bytes: u64,
    /// Prompt rows per pass (`--prefill-chunk`): charged as asked, or 0 to let the plan choose
    /// the largest chunk that fits (see [`crate::plan`]); [`Plan::chunk`] is what to run with.
    pub prefill_chunk: usize,
    /// Most rows any pass of this load will take, where the caller knows it (`sluice run`: its
    /// prompt's length, or the pending token and its drafts if more), or 0 for the context (a
    /// server's prompts are not known in advance). The automatic prefill chunk is planned for no
    /// more rows than this: working memory charged for rows no pass takes would be bytes the
    /// expert cache never gets.
    pub largest_pass: usize,
    /// Whether this is `sluice serve`: the automatic chunk follows the serve rule (see
    /// [`Plan::compute`]).
    pub serving: bool,
    /// `sluice serve --checkpoint-every` (0: none), where every prefill pass is cut: the serve
    /// rule plans the chunk for this many rows.
    pub checkpoint_every: usize,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            memory: None,
            experts: ExpertMode::Auto,
            prefetch: true,
            prefetch_min_precision: sluice_store::streaming::DEFAULT_MIN_PRECISION,
            context: 4096,
            readers: 16,
            direct_io: true,
            io_backend: IoBackend::Auto,
            slots: None,
            spine: Spine::Bf16,
            disk_cache: None,
            session_memory: 0,
            state_cache: false,
            spine_placement: SpineMode::Auto,
            draft_bytes: 0,
            prefill_chunk: 0,
            largest_pass: 0,
            serving: false,
            checkpoint_every: 0,
        }
    }
}

impl LoadOptions {
    /// Rows the memory plan sizes the automatic prefill chunk for: [`Self::largest_pass`]
    /// when given, never above the context.
    pub fn planned_rows(&self) -> u64 {
        let rows = match self.largest_pass {
            0 => self.context,
            n => n.min(self.context),
        };
        rows as u64
    }
}

/// An opened model and how it was placed.
#[derive(Debug)]
pub struct Loaded {
    /// The model.
    pub model: Model,
    /// The residency plan (Kimi K3).
    pub plan: Option<Plan>,
    /// The streaming store when experts stream.
    pub streaming: Option<Arc<StreamingExperts>>,
    /// The spine store unless the spine is mapped.
    pub spine: Option<Arc<SpineStore>>,
    /// `mapped` or `stream`.
    pub mode: &'static str,
    /// The budget everything was charged to.
    pub budget: MemoryBudget,
    /// Charges for the spine and the sequence state, returned when this is dropped.
    pub charges: Vec<Charge>,
}

impl Loaded {
    /// How streamed experts are read, for the plan line, `--stats` and `--json`: `io_uring`,
    /// `pread`, or `pread (io_uring unavailable: REASON)` when `auto` fell back; `None` when
    /// experts are not streamed.
    pub fn io_backend(&self) -> Option<String> {
        let s = self.streaming.as_ref()?;
        Some(match s.io_fallback_reason() {
            Some(why) => format!("{} (io_uring unavailable: {why})", s.io_backend()),
            None => s.io_backend().to_owned(),
        })
    }
}

/// Opens the checkpoint in `dir` under `opts`.
pub fn open(dir: &Path, opts: &LoadOptions) -> Result<Loaded, EngineError> {
    if let Some(loaded) = crate::install::open_stream_install(dir, opts)? {
        return Ok(loaded);
    }
    let dir = &crate::spine::resolve(dir, opts.spine)?;
    let ckpt = Arc::new(Checkpoint::open(dir).map_err(sluice_models::ModelError::from)?);
    // A family that places its spine piece by piece plans it here, through the family
    // boundary; every other family maps its spine whole and plans only its routed experts.
    if !sluice_models::family::of(&ckpt)?.places_spine {
        return place::open_mapped_spine(&ckpt, opts, None);
    }
    let model = sluice_models::load(ckpt.clone())?;
    let mut placed = place::place(&ckpt, model, opts, (0, ""))?;
    let stream = !place::experts_mapped(opts, placed.plan.all_experts_resident);
    if !stream {
        let loaded = placed.mapped();
        // Every expert resident: their pages enter the page tables now, not one fault at a
        // time inside the first pass (which a 256-token prefill spends touching nearly all).
        if let Some(store) = loaded.model.experts() {
            store.populate().map_err(ModelError::from)?;
        }
        return Ok(loaded);
    }
    let config = place::streaming_config(&mut placed.plan, opts, placed.io);
    let routed = placed.model.routed_experts().ok_or_else(|| {
        sluice_models::ModelError::Config(format!(
            "invariant: {} was planned with routed experts but lists none",
            placed.model.family()
        ))
    })?;
    let store = routed.streaming(&ckpt, &config, &placed.budget).map_err(ModelError::from)?;
    Ok(placed.streaming(Arc::new(store), opts.prefetch))
}

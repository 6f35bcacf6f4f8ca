//! Opening a model for a run: plan residency from the memory budget, then serve routed experts
//! either mapped in place (everything fits) or streamed from the shards through a slot cache
//! sized by the plan; the spine resident, or streamed layer by layer, as the plan places it.
//! The plan is printed by the caller; a budget that cannot hold the minimum is refused with the
//! shortfall.

use crate::plan::{default_budget, Needs, Plan, SpineMode, SpinePieces};
use crate::spine::Spine;
use crate::EngineError;
use sluice_checkpoint::Checkpoint;
use sluice_core::budget::Charge;
use sluice_core::MemoryBudget;
use sluice_models::kimi_k3::config::K3Config;
use sluice_models::kimi_k3::inventory::inventory;
use sluice_models::kimi_k3::KimiK3;
use sluice_models::Model;
use sluice_store::spine::SpineFootprint;
use sluice_store::{
    CacheSize, IoBackend, IoMode, Placement, ReadAt, ShardFiles, SpineStore, StreamingConfig,
    StreamingExperts,
};
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
    /// Memory budget in bytes (`None`: [`default_budget`]).
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
    /// How the spine is placed: resident, streamed, or planned from the budget.
    pub spine_placement: SpineMode,
    /// Bytes of a draft model (weights, state, scratch), charged before the target is planned.
    pub draft_bytes: u64,
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
            spine_placement: SpineMode::Auto,
            draft_bytes: 0,
        }
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
    crate::spine::check(&ckpt, opts.spine)?;
    let budget_bytes = opts.memory.unwrap_or_else(default_budget);
    let budget = MemoryBudget::new(budget_bytes);
    // The draft model is charged first: whatever it takes, the target plans around.
    let mut charges = Vec::new();
    if opts.draft_bytes > 0 {
        charges.push(budget.charge("draft model", opts.draft_bytes).map_err(EngineError::Budget)?);
    }
    let is_k3 = K3Config::from_json(ckpt.config().text_config()).is_ok()
        && matches!(
            ckpt.config().architecture(),
            "KimiK3ForConditionalGeneration" | "KimiLinearForCausalLM"
        );
    if !is_k3 {
        charges.push(
            budget
                .charge("stored conversation states", opts.session_memory)
                .map_err(EngineError::Budget)?,
        );
        let model = sluice_models::load(ckpt)?;
        return Ok(Loaded {
            model,
            plan: None,
            streaming: None,
            spine: None,
            mode: "mapped",
            budget,
            charges,
        });
    }
    let cfg = K3Config::from_json(ckpt.config().text_config()).map_err(EngineError::Model)?;
    let inv = inventory(&ckpt, &cfg);
    // Spine and experts mapped in place first (cheap); the plan then decides what to replace.
    let mut m = KimiK3::load(ckpt.clone())?;
    let index = m.spine_index()?;
    let piece = |i: usize| index.piece(i).map_or(0, sluice_store::spine::PieceLayout::buffer_len);
    let n = cfg.num_hidden_layers;
    let rows_only = SpineFootprint::of(&index, &[Placement::Rows]).rows;
    // Slot = the expert rounded up to 4 KiB plus one page of alignment slack on each side.
    let slot = inv.expert_bytes.div_ceil(4096) * 4096 + 8192;
    let needs = Needs {
        spine: inv.spine_bytes,
        pieces: SpinePieces {
            embed: piece(0),
            layers: (1..=n).map(piece).collect(),
            head: piece(n + 1),
            small: m.spine_small_bytes(),
            rows: rows_only,
        },
        state: inv.kda_state_bytes + inv.mla_bytes_per_token * opts.context as u64,
        sessions: opts.session_memory,
        slot,
        experts: inv.experts,
        min_slots: 2,
        headroom: 64 << 20,
        draft: opts.draft_bytes,
    };
    let mut plan = Plan::compute(budget_bytes, needs, opts.spine_placement)?;
    let stream = match opts.experts {
        ExpertMode::Mapped => false,
        ExpertMode::Stream => true,
        ExpertMode::Auto => !plan.all_experts_resident,
    };
    let io = if opts.direct_io { IoMode::Direct } else { IoMode::BufferedDropCache };
    // The fixed charges are held by `Loaded` for as long as the model lives; the spine store
    // charges its own buffers.
    charges.extend([
        budget
            .charge("sequence state and headroom", plan.needs.state + plan.needs.headroom)
            .map_err(EngineError::Budget)?,
        budget
            .charge("stored conversation states", plan.needs.sessions)
            .map_err(EngineError::Budget)?,
    ]);
    let spine = if plan.spine.mode == "mapped" {
        charges.push(budget.charge("spine", plan.spine.charged).map_err(EngineError::Budget)?);
        None
    } else {
        charges.push(
            budget
                .charge("spine small tensors", plan.needs.pieces.small)
                .map_err(EngineError::Budget)?,
        );
        let files: Arc<dyn ReadAt> =
            Arc::new(ShardFiles::open(index.paths(), io).map_err(sluice_models::ModelError::from)?);
        let store = SpineStore::open(index, files, plan.spine.placements(), 4, &budget)
            .map_err(sluice_models::ModelError::from)?;
        let store = Arc::new(store);
        m.set_spine(store.clone())?;
        Some(store)
    };
    if !stream {
        return Ok(Loaded {
            model: Model::KimiK3(m),
            plan: Some(plan),
            streaming: None,
            spine,
            mode: "mapped",
            budget,
            charges,
        });
    }
    if let Some(n) = opts.slots {
        plan.slots = n as u64;
        plan.all_experts_resident = plan.slots >= plan.needs.experts;
    }
    let slots = usize::try_from(plan.slots).unwrap_or(usize::MAX);
    let config = StreamingConfig {
        cache: CacheSize::Slots(slots),
        readers: opts.readers,
        backend: opts.io_backend,
        io,
        max_prefetch_slots: if opts.prefetch { None } else { Some(0) },
        prefetch_min_precision: opts.prefetch_min_precision,
        ..StreamingConfig::default()
    };
    let store = Arc::new(
        StreamingExperts::open(
            &ckpt,
            cfg.num_hidden_layers,
            &KimiK3::moe_layers(&cfg),
            cfg.num_experts,
            &KimiK3::expert_names(&cfg),
            &config,
            &budget,
        )
        .map_err(sluice_models::ModelError::from)?,
    );
    m.set_experts(store.clone());
    m.set_prefetch(opts.prefetch);
    Ok(Loaded {
        model: Model::KimiK3(m),
        plan: Some(plan),
        streaming: Some(store),
        spine,
        mode: "stream",
        budget,
        charges,
    })
}

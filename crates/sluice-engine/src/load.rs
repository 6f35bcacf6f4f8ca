//! Opening a model for a run: plan residency from the memory budget, then serve routed experts
//! either mapped in place (everything fits) or streamed from the shards through a slot cache
//! sized by the plan. The plan is printed by the caller; a budget that cannot hold the minimum
//! is refused with the shortfall.

use crate::plan::{default_budget, Needs, Plan};
use crate::EngineError;
use sluice_checkpoint::Checkpoint;
use sluice_core::budget::Charge;
use sluice_core::MemoryBudget;
use sluice_models::kimi_k3::config::K3Config;
use sluice_models::kimi_k3::inventory::inventory;
use sluice_models::kimi_k3::KimiK3;
use sluice_models::Model;
use sluice_store::{CacheSize, IoMode, StreamingConfig, StreamingExperts};
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
    /// Context length the sequence state is planned for.
    pub context: usize,
    /// Reader threads (reads in flight).
    pub readers: usize,
    /// Bypass the page cache for expert reads (O_DIRECT).
    pub direct_io: bool,
    /// Exactly this many cache slots (overrides the plan; tests use tiny caches).
    pub slots: Option<usize>,
    /// Bytes of a draft model (weights, state, scratch), charged before the target is planned.
    pub draft_bytes: u64,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            memory: None,
            experts: ExpertMode::Auto,
            prefetch: true,
            context: 4096,
            readers: 16,
            direct_io: true,
            slots: None,
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
    /// `mapped` or `stream`.
    pub mode: &'static str,
    /// The budget everything was charged to.
    pub budget: MemoryBudget,
    /// Charges for the spine and the sequence state, returned when this is dropped.
    pub charges: Vec<Charge>,
}

/// Opens the checkpoint in `dir` under `opts`.
pub fn open(dir: &Path, opts: &LoadOptions) -> Result<Loaded, EngineError> {
    let ckpt = Arc::new(Checkpoint::open(dir).map_err(sluice_models::ModelError::from)?);
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
        let model = sluice_models::load(ckpt)?;
        return Ok(Loaded { model, plan: None, streaming: None, mode: "mapped", budget, charges });
    }
    let cfg = K3Config::from_json(ckpt.config().text_config()).map_err(EngineError::Model)?;
    let inv = inventory(&ckpt, &cfg);
    // Slot = the expert rounded up to 4 KiB plus one page of alignment slack on each side.
    let slot = inv.expert_bytes.div_ceil(4096) * 4096 + 8192;
    let needs = Needs {
        spine: inv.spine_bytes,
        state: inv.kda_state_bytes + inv.mla_bytes_per_token * opts.context as u64,
        slot,
        experts: inv.experts,
        min_slots: 2,
        headroom: 64 << 20,
        draft: opts.draft_bytes,
    };
    let plan = Plan::compute(budget_bytes, needs)?;
    let stream = match opts.experts {
        ExpertMode::Mapped => false,
        ExpertMode::Stream => true,
        ExpertMode::Auto => !plan.all_experts_resident,
    };
    // The fixed charges are held by `Loaded` for as long as the model lives.
    charges.push(budget.charge("spine", needs.spine).map_err(EngineError::Budget)?);
    charges.push(
        budget
            .charge("sequence state and headroom", needs.state + needs.headroom)
            .map_err(EngineError::Budget)?,
    );
    if !stream {
        let m = KimiK3::load(ckpt)?;
        return Ok(Loaded {
            model: Model::KimiK3(m),
            plan: Some(plan),
            streaming: None,
            mode: "mapped",
            budget,
            charges,
        });
    }
    let mut plan = plan;
    if let Some(n) = opts.slots {
        plan.slots = n as u64;
        plan.all_experts_resident = plan.slots >= plan.needs.experts;
    }
    let slots = usize::try_from(plan.slots).unwrap_or(usize::MAX);
    let config = StreamingConfig {
        cache: CacheSize::Slots(slots),
        readers: opts.readers,
        io: if opts.direct_io { IoMode::Direct } else { IoMode::BufferedDropCache },
        max_prefetch_slots: if opts.prefetch { None } else { Some(0) },
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
    let mut m = KimiK3::with_store(ckpt, store.clone())?;
    m.set_prefetch(opts.prefetch);
    Ok(Loaded {
        model: Model::KimiK3(m),
        plan: Some(plan),
        streaming: Some(store),
        mode: "stream",
        budget,
        charges,
    })
}

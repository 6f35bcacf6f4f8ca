//! The one plan-and-charge step of opening a model whose family places its spine piece by
//! piece (`places_spine` in the family table: every family with routed experts), shared by full
//! installs (and plain checkpoint directories, [`crate::load`]) and stream installs
//! ([`crate::install`]).
//!
//! From the budget (`--memory`) it computes the residency [`Plan`], charges what the model holds
//! for as long as it lives (a draft model first, then sequence state and headroom, stored
//! conversation states, the working memory of a pass of the planned prefill chunk, the spine), and places the spine as `--spine-placement` asks: mapped in
//! place, or resident pieces and streamed pieces in a [`SpineStore`] that charges its own
//! buffers. The routed-expert store is the caller's: mapped in place, streamed from the shards,
//! or streamed through a stream install's disk cache (whose fetch buffers the caller passes in as
//! extra headroom, so the plan leaves room for them). The expert cache is charged by the
//! streaming store when the caller opens it with [`streaming_config`].

use crate::load::{LoadOptions, Loaded};
use crate::plan::{default_budget, Needs, Plan, SpinePieces};
use crate::state_cache::held_bytes;
use crate::EngineError;
use sluice_checkpoint::Checkpoint;
use sluice_core::budget::Charge;
use sluice_core::MemoryBudget;
use sluice_models::{MemoryNeeds, Model, ModelError};
use sluice_store::spine::{PieceLayout, SpineFootprint};
use sluice_store::{
    CacheSize, ExpertDiskCache, ExpertIndex, ExpertStore, ExpertView, IoMode, Placement, ReadAt,
    ShardFiles, SpineStore, StoreError, StoreStats, StreamingConfig, StreamingExperts,
};
use std::sync::Arc;

/// I/O headroom every plan keeps for scratch (on top of a caller's extra buffers and the
/// kernel threads' scratch, [`plan_headroom`]).
const HEADROOM: u64 = 64 << 20;

/// What every plan keeps beyond its named parts: [`HEADROOM`], one prefill-nest scratch
/// per kernel thread ([`sluice_kernels::WIDE_SCRATCH_BYTES`], made on the thread's first
/// prefill-sized call and kept for its life), the kernel pool's own buffers
/// ([`sluice_kernels::pool_scratch_bytes`]: a prefill's packed activations, [`pack_buffers`]),
/// and the buffers of a batch of a layer's routed experts
/// ([`sluice_models::LAYER_BATCH_BYTES`], held while a layer's experts run batched,
/// whatever the pass's rows) when `batch`: only mapped experts run batched, so a plan whose
/// experts stream does not charge it (a tight streamed budget lost its cache slots to it). The
/// scratch used to live inside the fixed headroom, which at 804 KiB a thread more than ~80
/// threads would have outgrown.
fn plan_headroom(batch: bool) -> u64 {
    let threads = sluice_kernels::pool::global().threads();
    HEADROOM
        + threads as u64 * sluice_kernels::WIDE_SCRATCH_BYTES as u64
        + sluice_kernels::pool_scratch_bytes(pack_buffers(sluice_kernels::pool::global(), batch))
            as u64
        + if batch { sluice_models::LAYER_BATCH_BYTES as u64 } else { 0 }
}

/// Pack buffers the kernel pool keeps for a model whose routed experts are mapped (`mapped`:
/// the model is in memory, and a prefill's packs rotate through one buffer for every two kernel
/// threads, [`sluice_kernels::pack_buffers`]) or stream (one: the bytes are worth more to the
/// expert cache, and a streamed pass waits on its reads more than on its packs). The plan
/// charges them ([`plan_headroom`]) and [`keep_pack_buffers`] tells the pool.
fn pack_buffers(pool: &sluice_kernels::Pool, mapped: bool) -> usize {
    if mapped {
        sluice_kernels::pack_buffers(pool.threads())
    } else {
        1
    }
}

/// Makes the process's kernel pool keep no more pack buffers than a plan charged for a model
/// whose experts are `mapped` or stream ([`pack_buffers`]). It only ever lowers the count: a
/// pool that a streamed model (or a second model of the process) left with fewer keeps them,
/// so no model's passes use more than its plan charged.
fn keep_pack_buffers(pool: &sluice_kernels::Pool, mapped: bool) {
    let want = pack_buffers(pool, mapped);
    if want < pool.pack_buffers() {
        pool.set_pack_buffers(want);
    }
}

/// Whether `opts` and a plan's verdict (`all_resident`) leave the routed experts mapped (so
/// they run batched) rather than streamed.
pub(crate) fn experts_mapped(opts: &LoadOptions, all_resident: bool) -> bool {
    match opts.experts {
        crate::load::ExpertMode::Mapped => true,
        crate::load::ExpertMode::Stream => false,
        crate::load::ExpertMode::Auto => all_resident,
    }
}

/// The plan of `plan_with(batch)` that charges the layer batch's buffers only where the experts
/// end up mapped (`mappable`: they may be at all). Planned without the batch, the experts
/// stream: the verdict is the batch plan's, since mapped experts would run batched, uncharged.
/// Experts mapped whatever the plan says (`--experts mapped`) need their batch to fit too.
fn plan_experts(
    opts: &LoadOptions,
    mappable: bool,
    plan_with: impl Fn(bool) -> Result<Plan, Box<crate::plan::PlanError>>,
) -> Result<Plan, Box<crate::plan::PlanError>> {
    match plan_with(true) {
        Ok(p) if mappable && experts_mapped(opts, p.all_experts_resident) => Ok(p),
        Err(e) if mappable && matches!(opts.experts, crate::load::ExpertMode::Mapped) => Err(e),
        _ => Ok(Plan { all_experts_resident: false, ..plan_with(false)? }),
    }
}

/// A model planned, charged and with its spine placed; its routed experts still mapped
/// in place until the caller gives it another store.
pub(crate) struct Placed {
    /// The model (spine placed, experts mapped).
    pub model: Model,
    /// The residency plan.
    pub plan: Plan,
    /// The spine store unless the spine is mapped.
    pub spine: Option<Arc<SpineStore>>,
    /// The budget everything was (and the expert cache will be) charged to.
    pub budget: MemoryBudget,
    /// Charges held for as long as the model lives.
    pub charges: Vec<Charge>,
    /// How spine and expert reads go to disk.
    pub io: IoMode,
}

impl Placed {
    /// The model with its routed experts mapped in place.
    pub fn mapped(self) -> Loaded {
        self.loaded(None, "mapped")
    }

    /// The model with its routed experts served by `store` (prefetching the next layer's when
    /// `prefetch`).
    pub fn streaming(mut self, store: Arc<StreamingExperts>, prefetch: bool) -> Loaded {
        self.model.set_experts(store.clone());
        self.model.set_prefetch(prefetch);
        self.loaded(Some(store), "stream")
    }

    fn loaded(self, streaming: Option<Arc<StreamingExperts>>, mode: &'static str) -> Loaded {
        Loaded {
            model: self.model,
            plan: Some(self.plan),
            streaming,
            spine: self.spine,
            mode,
            budget: self.budget,
            charges: self.charges,
        }
    }
}

/// The budget of `opts` with the draft model charged first: whatever the draft takes, the
/// target plans around.
pub(crate) fn budget(opts: &LoadOptions) -> Result<(MemoryBudget, Vec<Charge>), EngineError> {
    let budget = MemoryBudget::new(opts.memory.unwrap_or_else(default_budget));
    let mut charges = Vec::new();
    if opts.draft_bytes > 0 {
        charges.push(budget.charge("draft model", opts.draft_bytes).map_err(EngineError::Budget)?);
    }
    Ok((budget, charges))
}

/// Plans `model` (loaded from `ckpt`, of a family that places its spine piece by piece) under
/// `opts`, charges the fixed parts and places the spine. Everything is read through the family
/// boundary: the model's memory needs, its routed experts and its spine pieces. `extra` is
/// headroom for I/O buffers the caller will hold besides the usual scratch (a stream install's
/// remote fetch buffers; 0 otherwise), named `extra_what` in the charge. Refuses a budget that
/// cannot hold the minimum with the shortfall, and a spine that contradicts `--spine` (see
/// [`crate::spine::check`]). A model loaded without its routed experts mapped (a stream
/// install, see [`Unattached`]) has no expert store until the caller gives it one.
pub(crate) fn place(
    ckpt: &Arc<Checkpoint>,
    mut model: Model,
    opts: &LoadOptions,
    (extra, extra_what): (u64, &str),
) -> Result<Placed, EngineError> {
    crate::spine::check(ckpt, opts.spine)?;
    let (budget, mut charges) = budget(opts)?;
    let family = model.family();
    let refuse = |what: &str| {
        EngineError::Model(ModelError::Config(format!(
            "invariant: {family} places its spine piece by piece but gives no {what}"
        )))
    };
    let mem = model.memory_needs().ok_or_else(|| refuse("memory needs"))?;
    let routed = model.routed_experts().ok_or_else(|| refuse("routed experts"))?;
    let slot = routed.index(ckpt).map_err(ModelError::from)?.slot_bytes();
    let index = model.spine_index()?.ok_or_else(|| refuse("spine pieces"))?;
    let piece = |i: usize| index.piece(i).map_or(0, PieceLayout::buffer_len);
    // Pieces in pass order: the embedding, one per decoder layer, the head.
    let n = index.pieces().len().saturating_sub(2);
    let pieces = SpinePieces {
        embed: piece(0),
        layers: (1..=n).map(piece).collect(),
        head: piece(n + 1),
        small: model.spine_small_bytes(),
        rows: SpineFootprint::of(&index, &[Placement::Rows]).rows,
    };
    // Slot = the expert rounded up to 4 KiB plus one page of alignment slack on each side, or
    // the index's exact slot where an expert is several aligned parts (GPT-OSS's four stacked
    // slices, DeepSeek-V3's weights and scales).
    let slot = (routed.expert_bytes.div_ceil(4096) * 4096 + 8192).max(slot);
    let plan_with = |batch: bool| {
        let headroom = plan_headroom(batch) + extra;
        let needs = needs(&model, &mem, routed.total(), opts, (pieces.clone(), slot, headroom));
        Plan::compute(budget.limit(), needs, opts.spine_placement)
    };
    let mut plan = plan_experts(opts, true, plan_with)?;
    let mapped = experts_mapped(opts, plan.all_experts_resident);
    keep_pack_buffers(sluice_kernels::pool::global(), mapped);
    if opts.slots.is_some() {
        // `--cache-slots` sizes the cache exactly: the stored states keep what was asked.
        plan.sessions = plan.needs.sessions;
    }
    let io = if opts.direct_io { IoMode::Direct } else { IoMode::BufferedDropCache };
    let what = if extra > 0 {
        format!("sequence state, headroom and {extra_what}")
    } else {
        "sequence state and headroom".to_owned()
    };
    charges.extend([
        budget
            .charge(&what, plan.needs.state + plan.needs.headroom)
            .map_err(EngineError::Budget)?,
        budget.charge("stored conversation states", plan.sessions).map_err(EngineError::Budget)?,
        budget
            .charge("prompt-state cache snapshots", plan.needs.state_cache)
            .map_err(EngineError::Budget)?,
        budget
            .charge("working memory of a prefill chunk", plan.work)
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
            Arc::new(ShardFiles::open(index.paths(), io).map_err(ModelError::from)?);
        let store =
            SpineStore::open(index, files, plan.spine.placements(), spine_readers(), &budget)
                .map_err(ModelError::from)?;
        let store = Arc::new(store);
        model.set_spine(store.clone())?;
        Some(store)
    };
    Ok(Placed { model, plan, spine, budget, charges, io })
}

/// Reader threads of the spine store: one per core, from 4 (reads in flight on a small
/// machine) to 16. At open they copy the resident pieces, from the page cache where the model
/// is cached, which goes at memory speed only with several threads.
fn spine_readers() -> usize {
    std::thread::available_parallelism().map_or(4, |n| n.get().clamp(4, 16))
}

/// What the plan needs for `model` (its memory needs `mem`, `experts` routed experts in all)
/// under `opts`, given the spine's pieces, the cache slot and the headroom: the parts that
/// [`place`] and [`open_mapped_spine`] each size their own way.
fn needs(
    model: &Model,
    mem: &MemoryNeeds,
    experts: u64,
    opts: &LoadOptions,
    (pieces, slot, headroom): (SpinePieces, u64, u64),
) -> Needs {
    Needs {
        spine: mem.spine,
        pieces,
        state: mem.state(opts.context),
        sessions: opts.session_memory,
        state_cache: if opts.state_cache {
            // A snapshot holds the committed state only: not the live state's working
            // copies (`state_fixed` counts Kimi K3's KDA states twice) nor per-thread scratch.
            let fixed = model.state_shape().fixed_bytes() as u64;
            held_bytes(fixed, mem.state_per_position, opts.context, model.vocab_size())
        } else {
            0
        },
        slot,
        experts,
        min_slots: 2,
        headroom,
        draft: opts.draft_bytes,
        pass_row: mem.pass_per_row,
        prefill_row: mem.prefill_per_row,
        prefill_chunk: opts.prefill_chunk as u64,
        max_rows: opts.planned_rows(),
        serving: opts.serving,
        checkpoint_every: opts.checkpoint_every as u64,
    }
}

/// The streaming store's configuration for `plan` under `opts`: as many cache slots as the plan
/// leaves (or exactly `--cache-slots`, which `plan` then reports).
pub(crate) fn streaming_config(plan: &mut Plan, opts: &LoadOptions, io: IoMode) -> StreamingConfig {
    if let Some(n) = opts.slots {
        plan.slots = n as u64;
        plan.all_experts_resident = plan.slots >= plan.needs.experts;
    }
    StreamingConfig {
        cache: CacheSize::Slots(usize::try_from(plan.slots).unwrap_or(usize::MAX)),
        readers: opts.readers,
        backend: opts.io_backend,
        io,
        max_prefetch_slots: if opts.prefetch { None } else { Some(0) },
        prefetch_min_precision: opts.prefetch_min_precision,
        ..StreamingConfig::default()
    }
}

/// The expert store of a model whose real store is attached after planning (a stream install):
/// a pass before then is an error, never a read of unmapped bytes.
pub(crate) struct Unattached;

impl ExpertStore for Unattached {
    fn for_each(
        &self,
        layer: usize,
        _ids: &[u32],
        _f: &mut dyn FnMut(u32, ExpertView<'_>) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        Err(StoreError::Config(format!(
            "invariant: the expert store is attached before a pass (layer {layer} asked first)"
        )))
    }

    fn stats(&self) -> StoreStats {
        StoreStats::default()
    }
}

/// Opens a stream install's disk cache for the index of its routed experts.
pub(crate) type OpenDisk<'a> =
    Box<dyn FnOnce(&ExpertIndex) -> Result<Arc<ExpertDiskCache>, EngineError> + 'a>;

/// Where a stream install's routed experts come from: the disk cache over the install's sparse
/// shards (opened from the expert index once the plan stands), and the bytes its fetch buffers
/// take, planned as extra headroom.
pub(crate) struct Remote<'a> {
    /// Bytes of the remote fetch buffers.
    pub headroom: u64,
    /// Opens the disk cache for the index of the routed experts.
    pub open: OpenDisk<'a>,
}

/// Opens a model whose family plans no spine pieces (`places_spine: false` in the family
/// table; a placed spine is [`place`]): its spine mapped in place and charged whole, its
/// routed experts —
/// described by the family's [`sluice_models::RoutedExperts`] — mapped when the plan holds them
/// all, or streamed from the published shards through a slot cache of the planned size.
/// The family is never named here: the plan reads the model's [`sluice_models::MemoryNeeds`].
/// With `remote` (a stream install, whose routed experts the checkpoint never maps) the experts
/// always stream, through the disk cache `remote` opens.
pub(crate) fn open_mapped_spine(
    ckpt: &Arc<Checkpoint>,
    opts: &LoadOptions,
    remote: Option<Remote<'_>>,
) -> Result<Loaded, EngineError> {
    crate::spine::check(ckpt, opts.spine)?;
    if let crate::plan::SpineMode::Layers(_) = opts.spine_placement {
        return Err(EngineError::Spine {
            dir: ckpt.dir().to_path_buf(),
            reason: format!(
                "--spine-placement with resident layers needs a family whose spine is placed \
                 piece by piece; {} maps its spine whole (use auto or mapped)",
                sluice_models::family::of(ckpt)?.display
            ),
        });
    }
    let (budget, mut charges) = budget(opts)?;
    let mut model = match remote {
        Some(_) => sluice_models::family::load_with_experts(ckpt.clone(), Arc::new(Unattached))?,
        None => sluice_models::load(ckpt.clone())?,
    };
    let (Some(routed), Some(mem)) = (model.routed_experts(), model.memory_needs()) else {
        // A dense model: everything mapped, nothing to plan.
        charges.push(
            budget
                .charge("stored conversation states", opts.session_memory)
                .map_err(EngineError::Budget)?,
        );
        return Ok(Loaded {
            model,
            plan: None,
            streaming: None,
            spine: None,
            mode: "mapped",
            budget,
            charges,
        });
    };
    // The index is where every expert's spans are; its slot size is exact (aligned regions).
    let index = routed.index(ckpt).map_err(ModelError::from)?;
    let pieces = SpinePieces { layers: vec![0; routed.num_layers], ..SpinePieces::default() };
    let plan_with = |batch: bool| {
        let headroom = plan_headroom(batch) + remote.as_ref().map_or(0, |r| r.headroom);
        let needs = needs(
            &model,
            &mem,
            routed.total(),
            opts,
            (pieces.clone(), index.slot_bytes(), headroom),
        );
        Plan::compute(budget.limit(), needs, crate::plan::SpineMode::Mapped)
    };
    let mut plan = plan_experts(opts, remote.is_none(), plan_with)?;
    if opts.slots.is_some() {
        // `--cache-slots` sizes the cache exactly: the stored states keep what was asked.
        plan.sessions = plan.needs.sessions;
    }
    let what = if remote.is_some() {
        "sequence state, headroom and remote fetch buffers"
    } else {
        "sequence state and headroom"
    };
    charges.extend([
        budget.charge(what, plan.needs.state + plan.needs.headroom).map_err(EngineError::Budget)?,
        budget.charge("stored conversation states", plan.sessions).map_err(EngineError::Budget)?,
        budget
            .charge("prompt-state cache snapshots", plan.needs.state_cache)
            .map_err(EngineError::Budget)?,
        budget
            .charge("working memory of a prefill chunk", plan.work)
            .map_err(EngineError::Budget)?,
        budget.charge("spine", plan.spine.charged).map_err(EngineError::Budget)?,
    ]);
    let stream = remote.is_some() || !experts_mapped(opts, plan.all_experts_resident);
    keep_pack_buffers(sluice_kernels::pool::global(), !stream);
    if !stream {
        return Ok(Loaded {
            model,
            plan: Some(plan),
            streaming: None,
            spine: None,
            mode: "mapped",
            budget,
            charges,
        });
    }
    let io = if opts.direct_io { IoMode::Direct } else { IoMode::BufferedDropCache };
    let config = streaming_config(&mut plan, opts, io);
    let files = ShardFiles::open(index.paths(), io).map_err(ModelError::from)?;
    let store = match remote {
        Some(r) => {
            let disk = (r.open)(&index)?;
            StreamingExperts::with_disk_cache(index, Arc::new(files), &config, &budget, disk)
        }
        None => StreamingExperts::new(index, Arc::new(files), &config, &budget),
    }
    .map_err(ModelError::from)?;
    let store = Arc::new(store);
    model.set_experts(store.clone());
    sluice_models::family::set_prefetch(&mut model, opts.prefetch);
    Ok(Loaded {
        model,
        plan: Some(plan),
        streaming: Some(store),
        spine: None,
        mode: "stream",
        budget,
        charges,
    })
}

#[cfg(test)]
mod tests {
    use super::{keep_pack_buffers, pack_buffers};
    use sluice_kernels::Pool;

    /// A model in memory keeps a 16-thread pool's 8 pack buffers; a streamed one was charged
    /// one and leaves the pool one, and a model planned after it (charged 8) does not raise it
    /// again: no model's passes hold more than its plan charged.
    #[test]
    fn a_streamed_plan_charged_one_pack_buffer_and_the_pool_keeps_no_more() {
        let pool = Pool::new(16).expect("kernel pool");
        assert_eq!((pack_buffers(&pool, true), pack_buffers(&pool, false)), (8, 1));
        keep_pack_buffers(&pool, true);
        assert_eq!(pool.pack_buffers(), 8);
        keep_pack_buffers(&pool, false);
        assert_eq!(pool.pack_buffers(), 1);
        keep_pack_buffers(&pool, true);
        assert_eq!(pool.pack_buffers(), 1);
        let small = Pool::new(2).expect("kernel pool");
        assert_eq!(pack_buffers(&small, true), 1);
    }
}

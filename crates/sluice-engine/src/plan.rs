//! The memory plan: from one budget (`--memory`), decide what is resident and how many routed
//! experts the cache holds, print it, and refuse clearly when the minimum does not fit.
//!
//! Charged: the spine (resident pieces, two stream buffers, the embedding row buffer, small
//! vectors), the sequence state for the context the user asked for, the stored conversation states of
//! `sluice serve` (`--session-memory`), I/O headroom, the working memory of a pass (activations
//! per prompt row times the rows one pass may take: the prefill chunk), and the
//! expert cache (whole slots). The spine comes first: after the state and the minimum expert
//! cache, the largest resident prefix that fits is kept and the rest streams layer by layer
//! (a resident spine byte saves a byte of reading on every pass, a cache byte only on a hit).
//! What is left becomes the prefill chunk and cache slots: an explicit chunk
//! (`--prefill-chunk N`) is charged as asked, or refused with the numbers; the automatic one
//! takes what a cache holding every expert would not need, or half of what is left when the
//! cache cannot hold them all — or all of it when that half would hold fewer slots than one
//! layer has experts (see [`Plan::compute`]) — at least [`AUTO_CHUNK_FLOOR`] rows when they fit
//! (reserved before the spine is placed), at most [`Needs::max_rows`] (the planned context, or
//! the largest pass of a run that knows its prompt); `sluice serve` bounds it by the serve rule
//! (at least one `--checkpoint-every` interval, at most the rows a pass takes before its
//! captures run out, the rest to the caches; see [`Plan::compute`]). When even an
//! all-streamed spine, one row and `min_slots` slots do not fit, the refusal says how much
//! more memory the run needs.
//!
//! A pass of `c` rows is charged `c × prefill_row + min(c, ROW_BLOCK) × pass_row` ([`work`]):
//! a prompt chunk holds `prefill_row` per row, plus for one block of rows the buffers a layer
//! fills a block at a time, the replay rows and the logits a verification pass holds per row;
//! a decode pass verifies at most `ROW_BLOCK` rows (`sluice_models::ROW_BLOCK`).

use serde::Serialize;
use sluice_models::MAX_CAPTURES;
use sluice_store::Placement;

/// Parses a size such as `24G`, `512MiB`, `1.5GB`, `4096` (bytes). Suffixes are binary
/// (K = 1024) whether or not they carry an `i`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num.parse().map_err(|_| format!("{s:?} is not a size (try 24G, 512M, 1.5G)"))?;
    let mult: f64 =
        match unit.trim().to_ascii_lowercase().trim_end_matches('b').trim_end_matches('i') {
            "" => 1.0,
            "k" => 1024.0,
            "m" => 1024.0 * 1024.0,
            "g" => 1024.0 * 1024.0 * 1024.0,
            "t" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
            _ => return Err(format!("{s:?}: unknown size unit {unit:?}")),
        };
    let bytes = v * mult;
    #[allow(clippy::cast_precision_loss)]
    if !bytes.is_finite() || bytes < 1.0 || bytes > u64::MAX as f64 {
        return Err(format!("{s:?} is not a usable size"));
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(bytes as u64)
}

/// Memory this process may use: the smallest of physical memory and any limit on the process
/// (a cgroup on Linux), from [`sluice_store::platform::memory`].
pub fn available_memory() -> Option<u64> {
    sluice_store::platform::memory::available()
}

/// The default budget ([`sluice_store::platform::memory::default_budget`]): on Linux 85% of
/// [`available_memory`] less 512 MiB for the OS; on macOS, whose memory the OS and the GPU
/// share, 75% of it less 2 GiB (less under memory pressure).
pub fn default_budget() -> u64 {
    sluice_store::platform::memory::default_budget()
}

/// What a model needs, for planning.
#[derive(Debug, Clone, Serialize)]
pub struct Needs {
    /// Spine bytes (every tensor but the routed experts).
    pub spine: u64,
    /// The spine piece by piece, for placing it.
    pub pieces: SpinePieces,
    /// Sequence-state bytes for the planned context.
    pub state: u64,
    /// Bytes reserved for stored conversation states (`sluice serve --session-memory`; 0 for
    /// `sluice run`).
    pub sessions: u64,
    /// Bytes the on-disk prompt-state cache holds in memory at most: a restored snapshot and
    /// the snapshots queued for its writer ([`crate::state_cache::held_bytes`]; 0 without
    /// `--state-cache`).
    #[serde(default)]
    pub state_cache: u64,
    /// Bytes of one expert-cache slot.
    pub slot: u64,
    /// Routed experts in the model.
    pub experts: u64,
    /// Fewest slots a pass can run with.
    pub min_slots: u64,
    /// Scratch and I/O buffers.
    pub headroom: u64,
    /// A draft model's weights, state and scratch (0 without one).
    #[serde(default)]
    pub draft: u64,
    /// Working memory of a pass per row (activations, a logits row; see
    /// `sluice_models::kimi_k3::working`), charged for a pass's first `ROW_BLOCK` rows.
    #[serde(default)]
    pub pass_row: u64,
    /// Working memory per row of a prompt chunk (`LogitRows::Prefill`), charged for every row.
    #[serde(default)]
    pub prefill_row: u64,
    /// Rows one pass may take as asked (`--prefill-chunk`; 0: chosen by the plan).
    #[serde(default)]
    pub prefill_chunk: u64,
    /// Most rows the automatic chunk takes: the planned context, or fewer where the caller knows
    /// its largest pass (`LoadOptions::largest_pass`: `sluice run`'s prompt).
    #[serde(default)]
    pub max_rows: u64,
    /// Whether the plan is for `sluice serve`, whose automatic chunk follows the serve rule
    /// ([`Plan::compute`]): at least `checkpoint_every` rows, at most the rows a pass can take
    /// before its captures run out.
    #[serde(default)]
    pub serving: bool,
    /// `sluice serve --checkpoint-every`: the prompt rows between state snapshots, captured
    /// inside a pass; a pass is cut at the point past [`sluice_models::MAX_CAPTURES`] of them
    /// (0: passes are cut only by the chunk and the prompt's end).
    #[serde(default)]
    pub checkpoint_every: u64,
}

/// Rows the automatic prefill chunk reserves before the spine is placed, when they fit: a
/// resident spine byte saves a read on every pass, but a chunk of one row makes a prompt as many
/// passes as tokens, each reading every routed expert it needs again.
pub const AUTO_CHUNK_FLOOR: u64 = 64;

/// Working memory charged for a pass of `rows` rows: `rows × prefill_row` and, for its first
/// `ROW_BLOCK` rows, `pass_row` more (see the module docs). Saturating.
pub fn work(needs: &Needs, rows: u64) -> u64 {
    let block = rows.min(sluice_models::ROW_BLOCK as u64);
    rows.saturating_mul(needs.prefill_row).saturating_add(block.saturating_mul(needs.pass_row))
}

/// The most rows whose [`work`] fits in `room` bytes (`u64::MAX` when rows cost nothing).
fn rows_in(needs: &Needs, room: u64) -> u64 {
    let block = sluice_models::ROW_BLOCK as u64;
    let both = needs.prefill_row.saturating_add(needs.pass_row);
    if both == 0 {
        return u64::MAX;
    }
    let first = block.saturating_mul(both);
    if room < first {
        return room / both;
    }
    match needs.prefill_row {
        0 => u64::MAX,
        p => block.saturating_add((room - first) / p),
    }
}

/// The spine's pieces as buffer bytes (aligned spans), in pass order.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SpinePieces {
    /// The embedding table.
    pub embed: u64,
    /// Each decoder layer.
    pub layers: Vec<u64>,
    /// The output head (lm_head).
    pub head: u64,
    /// Small f32 vectors (norms, biases) the model always keeps.
    pub small: u64,
    /// The scratch buffer for reading embedding rows.
    pub rows: u64,
}

/// How the spine is to be placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SpineMode {
    /// The largest resident prefix that fits, the rest streamed.
    #[default]
    Auto,
    /// Mapped in place from the shards (the page cache decides; charged as if resident).
    Mapped,
    /// Exactly this many layers resident (a prefix), the rest streamed; the head is resident
    /// when at least one layer is, the embedding when all are (for tests and benchmarks).
    Layers(usize),
}

/// Where the spine goes.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SpinePlan {
    /// `mapped` or `placed`.
    pub mode: &'static str,
    /// Decoder layers.
    pub layers: usize,
    /// Resident layers (the first ones).
    pub resident_layers: usize,
    /// Whether the head (lm_head) is resident (else streamed).
    pub head_resident: bool,
    /// Whether the embedding is resident (else its rows are read per pass).
    pub embed_resident: bool,
    /// Bytes of the resident pieces.
    pub resident_bytes: u64,
    /// Bytes of each stream buffer (the largest streamed piece).
    pub buffer_bytes: u64,
    /// Stream buffers (0, 1 or 2).
    pub buffers: u64,
    /// Bytes of the streamed pieces: what every pass reads.
    pub streamed_bytes: u64,
    /// Bytes charged for the spine in all (resident, buffers, row scratch, small vectors).
    pub charged: u64,
}

impl SpinePlan {
    /// The placement of each piece (embedding, layers, head) for a spine store.
    pub fn placements(&self) -> Vec<Placement> {
        let mut p = Vec::with_capacity(self.layers + 2);
        p.push(if self.embed_resident { Placement::Resident } else { Placement::Rows });
        p.extend((0..self.layers).map(|i| {
            if i < self.resident_layers {
                Placement::Resident
            } else {
                Placement::Streamed
            }
        }));
        p.push(if self.head_resident { Placement::Resident } else { Placement::Streamed });
        p
    }

    /// The placement with `k` resident layers (see [`SpineMode::Layers`]).
    fn split(sp: &SpinePieces, k: usize) -> Self {
        let n = sp.layers.len();
        let k = k.min(n);
        Self::of(sp, k, k > 0 || n == 0, k == n)
    }

    fn of(sp: &SpinePieces, k: usize, head_resident: bool, embed_resident: bool) -> Self {
        let n = sp.layers.len();
        let mut resident = sp.layers[..k].iter().sum::<u64>();
        let mut streamed: Vec<u64> = sp.layers[k..].to_vec();
        if head_resident {
            resident += sp.head;
        } else {
            streamed.push(sp.head);
        }
        let rows = if embed_resident {
            resident += sp.embed;
            0
        } else {
            sp.rows
        };
        let buffer_bytes = streamed.iter().copied().max().unwrap_or(0);
        let buffers = (streamed.len() as u64).min(2);
        Self {
            mode: "placed",
            layers: n,
            resident_layers: k,
            head_resident,
            embed_resident,
            resident_bytes: resident,
            buffer_bytes,
            buffers,
            streamed_bytes: streamed.iter().sum(),
            charged: resident + buffer_bytes * buffers + rows + sp.small,
        }
    }

    /// The largest resident prefix of (head, layer 0, layer 1, …) whose placement fits in
    /// `avail` bytes, everything resident if it all fits; `None` if not even all-streamed fits.
    fn fit(sp: &SpinePieces, avail: u64) -> Option<Self> {
        let n = sp.layers.len();
        let all = Self::of(sp, n, true, true);
        if all.charged <= avail {
            return Some(all);
        }
        Self::prefixes(sp).find(|p| p.charged <= avail)
    }

    /// Resident prefixes of (head, layer 0, layer 1, …), longest first, embedding by rows. The
    /// head comes first: in the cycle of passes it directly precedes layer 0, so the resident
    /// pieces stay one run and the streamed ones another.
    fn prefixes(sp: &SpinePieces) -> impl Iterator<Item = Self> + '_ {
        (0..=sp.layers.len() + 1).rev().map(|j| Self::of(sp, j.saturating_sub(1), j > 0, false))
    }
}

/// The residency plan.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    /// The budget.
    pub budget: u64,
    /// Inputs.
    pub needs: Needs,
    /// Where the spine goes.
    pub spine: SpinePlan,
    /// Expert-cache slots.
    pub slots: u64,
    /// Whether every expert fits in the cache.
    pub all_experts_resident: bool,
    /// Rows one pass may take: prompt tokens per prefill pass, and the most rows (the pending
    /// token and its drafts) a decode pass verifies.
    pub chunk: u64,
    /// Working memory charged for a pass of `chunk` rows ([`work`]).
    pub work: u64,
    /// The spare memory the automatic chunk was taken from: the budget less the spine, state,
    /// stored states, headroom, draft model and the minimum expert cache.
    #[serde(default)]
    pub spare: u64,
    /// Bytes planned for stored conversation states: `needs.sessions`, plus for a server whose
    /// expert cache could not hold a layer's experts what the chunk left of the spare (the
    /// serve rule, [`Plan::compute`]).
    #[serde(default)]
    pub sessions: u64,
}

/// The budget cannot hold the minimum.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "memory budget of {budget} bytes is too small: the spine needs at least {spine} (layers \
     streamed through two buffers; its largest piece is {largest_piece} bytes), sequence state \
     {state}, stored conversation state {sessions}, prompt-state cache snapshots {state_cache}, headroom {headroom}, the draft model {draft}, \
     the working memory of a pass of {chunk} prompt rows {work} ({prefill_row} per row, {pass_row} more for each of the first 64), and at least {min_slots} expert slots of {slot} bytes; \
     the minimum is {minimum} bytes ({short} more). Raise --memory or use a smaller context \
     (or a smaller --session-memory or --prefill-chunk, or no --state-cache)."
)]
pub struct PlanError {
    /// The budget.
    pub budget: u64,
    /// Spine bytes at the least.
    pub spine: u64,
    /// The largest spine piece.
    pub largest_piece: u64,
    /// State bytes.
    pub state: u64,
    /// Stored conversation-state bytes.
    pub sessions: u64,
    /// Prompt-state cache snapshot bytes.
    pub state_cache: u64,
    /// Headroom bytes.
    pub headroom: u64,
    /// Draft-model bytes.
    pub draft: u64,
    /// Prompt rows of the pass charged.
    pub chunk: u64,
    /// Working memory of that pass.
    pub work: u64,
    /// Working memory per row of a pass's first rows.
    pub pass_row: u64,
    /// Working memory per row of a prompt chunk.
    pub prefill_row: u64,
    /// Minimum slots.
    pub min_slots: u64,
    /// Slot bytes.
    pub slot: u64,
    /// Minimum total.
    pub minimum: u64,
    /// Shortfall.
    pub short: u64,
}

impl Plan {
    /// Plans `needs` within `budget`: the spine first (the largest resident prefix that fits
    /// after the state, the minimum expert cache and the working memory of the least chunk,
    /// the rest streamed), then the prefill chunk, then every byte left becomes expert-cache
    /// slots (see the module docs).
    ///
    /// **The serve rule** (`needs.serving`, `sluice serve`): a server snapshots prompts every
    /// `--checkpoint-every` rows, capturing the states inside a pass; a pass is cut at the
    /// point past [`MAX_CAPTURES`] captures, so the automatic chunk is planned for at most
    /// `(MAX_CAPTURES + 1) × checkpoint_every` rows (rows past it no pass would take), and
    /// one interval of rows is reserved before the spine is placed when it fits, so that a
    /// tight budget streams spine layers rather than cutting passes below an interval (else
    /// the usual floor of [`AUTO_CHUNK_FLOOR`] rows, then one row). Between the two the chunk
    /// takes the spare as a run's does. What it leaves goes to the expert cache or, where
    /// that would hold fewer slots past its minimum than a layer has experts, to the stored
    /// conversation states ([`Plan::sessions`], more than `--session-memory`; the expert
    /// cache keeps its minimum), unless the server keeps none. Planned like a run, a server
    /// on a K3 slice at a tight budget got 64-row passes where 512 fit with the spine
    /// streamed.
    pub fn compute(budget: u64, needs: Needs, mode: SpineMode) -> Result<Self, Box<PlanError>> {
        if needs.prefill_chunk > 0 {
            return Self::with_floor(budget, needs.clone(), mode, needs.prefill_chunk);
        }
        let mut needs = needs;
        let serve_every = if needs.serving { needs.checkpoint_every } else { 0 };
        if serve_every > 0 {
            let captured = serve_every.saturating_mul(MAX_CAPTURES as u64 + 1);
            needs.max_rows = needs.max_rows.min(captured);
        }
        let rows = needs.max_rows.max(1);
        let serve_floor = serve_every.min(rows);
        let mut floors = vec![serve_floor, AUTO_CHUNK_FLOOR.min(rows), 1];
        floors.retain(|&f| f > 0);
        floors.dedup();
        let mut planned = Self::with_floor(budget, needs.clone(), mode, floors[0]);
        for &floor in &floors[1..] {
            if planned.is_ok() {
                break;
            }
            planned = Self::with_floor(budget, needs.clone(), mode, floor);
        }
        planned
    }

    /// [`Self::compute`] with the working memory of `floor` rows reserved before the spine.
    fn with_floor(
        budget: u64,
        needs: Needs,
        mode: SpineMode,
        floor: u64,
    ) -> Result<Self, Box<PlanError>> {
        let sp = &needs.pieces;
        let min_cache = needs.min_slots * needs.slot;
        let least_work = work(&needs, floor);
        // Saturating: an absurd --prefill-chunk is refused with its numbers, never an overflow.
        let others = [
            needs.state,
            needs.sessions,
            needs.state_cache,
            needs.draft,
            needs.headroom,
            min_cache,
        ]
        .into_iter()
        .fold(least_work, u64::saturating_add);
        let spine = match mode {
            SpineMode::Mapped => Some(SpinePlan {
                mode: "mapped",
                layers: sp.layers.len(),
                resident_layers: sp.layers.len(),
                head_resident: true,
                embed_resident: true,
                resident_bytes: needs.spine,
                charged: needs.spine,
                ..SpinePlan::default()
            }),
            SpineMode::Layers(k) => Some(SpinePlan::split(sp, k)),
            SpineMode::Auto => SpinePlan::fit(sp, budget.saturating_sub(others)),
        };
        let least = SpinePlan::prefixes(sp)
            .min_by_key(|p| p.charged)
            .unwrap_or_else(|| SpinePlan::split(sp, 0));
        let spine_min = spine.as_ref().map_or(least.charged, |s| s.charged);
        let minimum = spine_min.saturating_add(others);
        let Some(spine) = spine.filter(|_| budget >= minimum) else {
            return Err(Box::new(PlanError {
                budget,
                spine: spine_min,
                largest_piece: sp.layers.iter().copied().chain([sp.head]).max().unwrap_or(0),
                state: needs.state,
                sessions: needs.sessions,
                state_cache: needs.state_cache,
                headroom: needs.headroom,
                draft: needs.draft,
                chunk: floor,
                work: least_work,
                pass_row: needs.pass_row,
                prefill_row: needs.prefill_row,
                min_slots: needs.min_slots,
                slot: needs.slot,
                minimum,
                short: minimum.saturating_sub(budget),
            }));
        };
        let fixed = spine.charged
            + needs.state
            + needs.sessions
            + needs.state_cache
            + needs.draft
            + needs.headroom;
        let spare = budget - fixed - min_cache;
        let chunk = if needs.prefill_chunk > 0 {
            floor
        } else {
            // What is left past the minimum cache: the surplus over a cache of every expert,
            // or half of it when the cache cannot hold them all (the other half is cache) —
            // unless that half holds fewer slots than one layer has experts: each prompt chunk
            // routes to nearly every expert of every layer, so such a cache gets no prefill
            // hits (the chunks sweep the whole model through it) and in decode hits at most
            // its share of the experts, while every row it would give the chunk shortens the
            // sweeps. Then the chunk takes it all (up to the planned context; the rest is
            // cache; for a server, see the serve rule in [`Self::compute`]).
            let full_cache = needs.experts.saturating_sub(needs.min_slots) * needs.slot;
            let layer_experts = needs.experts / (needs.pieces.layers.len().max(1) as u64);
            let small_cache = (spare - spare / 2) / needs.slot.max(1) < layer_experts;
            let room =
                if small_cache { spare } else { spare.saturating_sub(full_cache).max(spare / 2) };
            rows_in(&needs, room).min(needs.max_rows).max(floor)
        };
        let work = work(&needs, chunk);
        let free = budget - fixed - work;
        let mut slots = (free / needs.slot.max(1)).min(needs.experts.max(needs.min_slots));
        // The serve rule's other half: where the cache past its minimum would hold fewer slots
        // than a layer has experts (no prefill hits, few decode hits), the stored conversation
        // states get it instead, when the server keeps any (`--session-memory` > 0): a state
        // resumed saves whole prefill passes.
        let layer_experts = needs.experts / (needs.pieces.layers.len().max(1) as u64);
        let mut sessions = needs.sessions;
        let past_min = slots.saturating_sub(needs.min_slots);
        if needs.serving && needs.sessions > 0 && slots < needs.experts && past_min < layer_experts
        {
            sessions += free.saturating_sub(needs.min_slots * needs.slot);
            slots = needs.min_slots;
        }
        let all_experts_resident = slots >= needs.experts;
        Ok(Self { budget, needs, spine, slots, all_experts_resident, chunk, work, spare, sessions })
    }
}

#[path = "plan_line.rs"]
mod line;

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;

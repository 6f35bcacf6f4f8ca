//! `sluice inspect DIR`: what a checkpoint holds and what running it takes in memory. The
//! checkpoint first passes the checks `sluice run` makes at load (architecture, every tensor's
//! presence, dtype and shape against the config), so the summary describes a model that runs:
//! a config that contradicts its tensors, or an architecture sluice does not run, is refused
//! with the cause instead of being described as something it is not.

use anyhow::{Context, Result};
use serde_json::json;
use sluice_checkpoint::convert::{is_converted, MANIFEST_FILE};
use sluice_checkpoint::Checkpoint;
use sluice_core::DType;
use sluice_models::kimi_k3::config::{AttnKind, K3Config};
use sluice_models::kimi_k3::inventory::inventory;
use sluice_models::Family;
use sluice_store::spine::PieceLayout;
use std::path::Path;
use std::sync::Arc;

/// Human-readable bytes (GiB/MiB/KiB).
pub fn human(b: u64) -> String {
    #[allow(clippy::cast_precision_loss)]
    let f = b as f64;
    if f >= 1024.0 * 1024.0 * 1024.0 {
        format!("{:.2} GiB", f / (1024.0 * 1024.0 * 1024.0))
    } else if f >= 1024.0 * 1024.0 {
        format!("{:.2} MiB", f / (1024.0 * 1024.0))
    } else if f >= 1024.0 {
        format!("{:.1} KiB", f / 1024.0)
    } else {
        format!("{b} B")
    }
}

/// Opens the checkpoint in `dir` as `sluice run` does: a stream install's sparse shard files
/// stand in for the shards they hold the spine of.
pub fn open_checkpoint(dir: &Path) -> Result<Checkpoint> {
    let install = sluice_hub::Install::detect(dir)
        .with_context(|| format!("reading the install manifest of {}", dir.display()))?;
    let sparse = install.filter(sluice_hub::Install::is_stream).map(|i| i.sparse_shards());
    let ckpt = match sparse {
        Some(sparse) => {
            let routed = sluice_engine::install::routed_tensors_in(dir)
                .with_context(|| format!("reading the routed experts of {}", dir.display()))?;
            sluice_engine::install::open_sparse(dir, &sparse, &routed)
        }
        None => Checkpoint::open(dir),
    };
    ckpt.with_context(|| format!("opening checkpoint {}", dir.display()))
}

/// Runs the command.
pub fn run(dir: &Path, as_json: bool) -> Result<()> {
    let ckpt = open_checkpoint(dir)?;
    let checked = sluice_models::check(&ckpt)
        .with_context(|| format!("{} would not load for `sluice run`", dir.display()))?;
    match checked.k3 {
        Some(cfg) => kimi_k3(dir, &ckpt, &cfg, as_json),
        None => family(dir, ckpt, checked.family, as_json),
    }
}

/// A checkpoint of any family but Kimi K3: its shape, its routed experts (as its family's
/// expert layout describes them), its memory needs and how its spine is placed (piece by piece
/// when its table line says so, the largest layer piece being what a streamed spine buffers),
/// all read through the family boundary.
fn family(dir: &Path, ckpt: Checkpoint, family: &Family, as_json: bool) -> Result<()> {
    let arch = ckpt.config().architecture().to_string();
    let (tensors, shards) = (ckpt.len(), ckpt.shard_paths().len());
    let bytes: u64 = ckpt.tensors().map(|e| e.len).sum();
    let model = sluice_models::load(Arc::new(ckpt))?;
    let s = model.shape();
    let routed = model.routed_experts();
    let mem = model.memory_needs();
    let (moe_layers, per_layer, expert_bytes) =
        routed.as_ref().map_or((0, 0, 0), |r| (r.moe_layers.len(), r.per_layer, r.expert_bytes));
    // Pieces in pass order: the embedding, one per decoder layer, the head.
    let pieces = if family.places_spine { model.spine_index()? } else { None };
    let largest_layer = pieces.as_ref().map_or(0, |ix| {
        let n = ix.pieces().len().saturating_sub(1);
        ix.pieces()[1..n].iter().map(PieceLayout::buffer_len).max().unwrap_or(0)
    });
    let placement = if pieces.is_some() { "pieces" } else { "mapped" };
    if as_json {
        let v = json!({
            "dir": dir.display().to_string(), "architecture": arch, "family": family.name,
            "layers": s.layers, "hidden_size": s.hidden, "vocab_size": s.vocab,
            "experts_per_layer": per_layer, "moe_layers": moe_layers,
            "experts_per_token": s.experts_per_token, "expert_bytes": expert_bytes,
            "spine_bytes": mem.map_or(bytes, |m| m.spine), "spine_format": model.spine_format(),
            "spine_placement": placement, "spine_largest_layer_bytes": largest_layer,
            "state_bytes_per_position": mem.map_or(0, |m| m.state_per_position),
            "tensors": tensors, "shards": shards, "weight_bytes": bytes,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("{}", dir.display());
    println!(
        "  architecture   {arch} ({} family, {tensors} tensors in {shards} shards)",
        family.display
    );
    let kind =
        if moe_layers > 0 { format!("{moe_layers} with routed experts") } else { "dense".into() };
    println!(
        "  layers         {} ({kind}; attention {} heads, {} KV heads), hidden {}, vocab {}",
        s.layers, s.heads, s.kv_heads, s.hidden, s.vocab
    );
    match &routed {
        Some(r) => println!(
            "  experts        {} per layer, top-{}, {} each; {} in all",
            r.per_layer,
            s.experts_per_token,
            human(r.expert_bytes),
            human(r.expert_bytes * r.total())
        ),
        None => {
            println!("  experts        none (a dense model: every weight is read by every pass)")
        }
    }
    let spine_where = if pieces.is_some() {
        format!(
            "placed piece by piece: resident prefix, the rest streamed through two buffers of \
             its largest layer, {}",
            human(largest_layer)
        )
    } else {
        "mapped in place".to_owned()
    };
    match (&routed, mem) {
        (Some(_), Some(m)) => println!(
            "  memory         spine {} ({}, {spine_where}); sequence state {} per position",
            human(m.spine),
            model.spine_format(),
            human(m.state_per_position)
        ),
        _ => {
            println!("  weights        {} (mapped in place; runs as a --draft model)", human(bytes))
        }
    }
    Ok(())
}

/// A Kimi K3 checkpoint: config, tensors by kind, expert size, memory needs.
fn kimi_k3(dir: &Path, ckpt: &Checkpoint, cfg: &K3Config, as_json: bool) -> Result<()> {
    let arch = ckpt.config().architecture().to_string();
    let inv = inventory(ckpt, cfg);
    // The spine format: row-int8 tensors (the lossy `sluice convert` output) or as published.
    let int8_tensors = ckpt.tensors().filter(|e| e.dtype == DType::I8).count();
    let spine_format = if int8_tensors > 0 { "int8" } else { "bf16" };
    let spine_note = match (int8_tensors, is_converted(dir)) {
        (0, _) => "as published".to_owned(),
        (n, true) => {
            format!("{n} row-int8 matrices with f16 row scales, LOSSY; run with --spine int8")
        }
        (n, false) => {
            format!("{n} row-int8 matrices but no {MANIFEST_FILE}: an unfinished conversion")
        }
    };
    let kda = (0..cfg.num_hidden_layers).filter(|&i| cfg.attn_kind(i) == AttnKind::Kda).count();
    let moe = (0..cfg.num_hidden_layers).filter(|&i| cfg.is_moe(i)).count();
    // Smallest useful run: the spine resident, sequence state for 4096 tokens, and one pass's
    // worth of experts in flight (top-k of one layer).
    let ctx_tokens = 4096u64;
    let state = inv.kda_state_bytes + inv.mla_bytes_per_token * ctx_tokens;
    let one_layer_experts = cfg.num_experts_per_token as u64 * inv.expert_bytes;
    let minimum = inv.spine_bytes + state + one_layer_experts;
    let everything = inv.spine_bytes + inv.routed_bytes + state;
    if as_json {
        let kinds: serde_json::Map<String, serde_json::Value> = inv
            .kinds
            .iter()
            .map(|(k, (n, b))| ((*k).to_string(), json!({"tensors": n, "bytes": b})))
            .collect();
        let v = json!({
            "dir": dir.display().to_string(),
            "architecture": arch, "family": "kimi_k3",
            "layers": cfg.num_hidden_layers, "kda_layers": kda, "mla_layers": cfg.num_hidden_layers - kda,
            "moe_layers": moe, "hidden_size": cfg.hidden_size, "vocab_size": cfg.vocab_size,
            "experts_per_layer": cfg.num_experts, "experts_per_token": cfg.num_experts_per_token,
            "tensors": ckpt.len(), "shards": ckpt.shard_paths().len(), "kinds": kinds,
            "spine_format": spine_format, "int8_tensors": int8_tensors,
            "expert_bytes": inv.expert_bytes, "routed_bytes": inv.routed_bytes, "spine_bytes": inv.spine_bytes,
            "expert_bytes_per_token": inv.expert_bytes_per_token, "kda_state_bytes": inv.kda_state_bytes,
            "mla_bytes_per_token": inv.mla_bytes_per_token,
            "memory": {"minimum": minimum, "everything_resident": everything, "context_tokens": ctx_tokens},
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("{}", dir.display());
    println!(
        "  architecture   {arch} ({} tensors in {} shards)",
        ckpt.len(),
        ckpt.shard_paths().len()
    );
    println!(
        "  layers         {} ({kda} KDA, {} MLA; {moe} MoE), hidden {}, vocab {}",
        cfg.num_hidden_layers,
        cfg.num_hidden_layers - kda,
        cfg.hidden_size,
        cfg.vocab_size
    );
    println!(
        "  experts        {} per layer, top-{}, width {} (latent {}), {} each",
        cfg.num_experts,
        cfg.num_experts_per_token,
        cfg.moe_intermediate_size,
        cfg.expert_width(),
        human(inv.expert_bytes)
    );
    println!("  by kind");
    for (k, (n, b)) in &inv.kinds {
        println!("    {k:<20} {n:>8} tensors  {:>12}", human(*b));
    }
    println!("  spine          {} (swept by every pass)", human(inv.spine_bytes));
    println!("  spine format   {spine_format} ({spine_note})");
    println!("  routed experts {} ({} experts)", human(inv.routed_bytes), inv.experts);
    println!(
        "  per token      {} of experts with nothing cached",
        human(inv.expert_bytes_per_token)
    );
    println!(
        "  state          {} KDA + {} per token MLA ({} at {ctx_tokens} tokens)",
        human(inv.kda_state_bytes),
        human(inv.mla_bytes_per_token),
        human(state)
    );
    println!(
        "  memory         minimum {} (spine resident + state + one layer of experts)",
        human(minimum)
    );
    println!("                 everything resident {}", human(everything));
    Ok(())
}

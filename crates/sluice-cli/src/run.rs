//! `sluice run`: load a checkpoint (or the built-in demo), tokenize or take ids, decode
//! greedily, and print text, stats or one JSON object.

use crate::load_args::LoadArgs;
use crate::npy;
use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::json;
use sluice_engine::demo::{cache_dir, ensure_demo_model};
use sluice_engine::load;
use sluice_engine::{
    generate, layer_stats, DraftModel, Drafter, GenerateOptions, ModelDrafter, NgramDrafter,
    Sampling,
};
use sluice_tokenizer::{AnyTokenizer, PromptFormat};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Flags of `sluice run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Checkpoint directory; omit to use the built-in random-weight demo model.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Prompt text.
    #[arg(long, conflicts_with = "prompt_ids")]
    prompt: Option<String>,
    /// Prompt as comma-separated token ids (e.g. 1,2,3).
    #[arg(long, value_delimiter = ',')]
    prompt_ids: Option<Vec<u32>>,
    /// Render the prompt as one user turn in the model's chat format.
    #[arg(long)]
    chat: bool,
    /// With --chat: no thinking channel (opens the response directly).
    #[arg(long, requires = "chat")]
    no_think: bool,
    /// Most new tokens to generate.
    #[arg(long, default_value_t = 32)]
    max_new: usize,
    /// Print run statistics to stderr.
    #[arg(long)]
    stats: bool,
    /// Print one JSON object (prompt_ids, generated_ids, text, stats) instead of text.
    #[arg(long)]
    json: bool,
    /// Write the f32 logits of every generated step as an .npy array [steps, vocab].
    #[arg(long)]
    dump_logits: Option<PathBuf>,
    /// Speculative drafts: `none`, `ngram` (prompt lookup), or the directory of a Qwen3 draft
    /// model (charged to --memory). Output is identical either way.
    #[arg(long, default_value = "none")]
    draft: String,
    /// Most draft tokens verified per pass.
    #[arg(long, default_value_t = 8)]
    draft_max: usize,
    /// Prompt tokens per prefill pass (0: the whole prompt in one pass).
    #[arg(long, default_value_t = 0)]
    prefill_chunk: usize,
    #[command(flatten)]
    load: LoadArgs,
}

/// Runs the command.
pub fn run(a: &RunArgs) -> Result<()> {
    let (dir, demo) = match &a.model {
        Some(d) => (d.clone(), false),
        None => (ensure_demo_model(&cache_dir()).context("writing the built-in demo model")?, true),
    };
    if demo {
        eprintln!(
            "sluice: no --model given; using the built-in demo model at {} \
             (a tiny Kimi K3 layout with RANDOM weights: its text is meaningless by design)",
            dir.display()
        );
    }
    let t_load = Instant::now();
    let draft_model = match a.draft.as_str() {
        "none" | "ngram" => None,
        path => Some(DraftModel::open(Path::new(path))?),
    };
    let mut load_opts = a.load.options()?;
    load_opts.draft_bytes = draft_model.as_ref().map_or(0, |d| d.memory_needs(load_opts.context));
    // The directory the spine choice reads (the int8 conversion for --spine int8).
    let dir = sluice_engine::spine::resolve(&dir, load_opts.spine)?;
    let loaded =
        load::open(&dir, &load_opts).with_context(|| format!("loading {}", dir.display()))?;
    let spine = load_opts.spine;
    let reads = loaded.io_backend().map(|b| format!(", read with {b}")).unwrap_or_default();
    match &loaded.plan {
        Some(p) => {
            eprintln!("sluice: spine {}; {p}; experts {}{reads}", spine.label(), loaded.mode);
        }
        None => eprintln!("sluice: spine {}; experts {}{reads}", spine.label(), loaded.mode),
    }
    if !demo {
        eprintln!("sluice: {}", sluice_engine::install::describe(&dir, &loaded));
    }
    let remote_stats = || loaded.streaming.as_ref().and_then(|s| s.disk_cache()).map(|d| d.stats());
    let model = &loaded.model;
    let load_s = t_load.elapsed().as_secs_f64();
    // A checkpoint without tokenizer files still runs from --prompt-ids; broken files are an error.
    let fmt = PromptFormat::from_dir(&dir)
        .with_context(|| format!("loading the tokenizer of {}", dir.display()))?;
    let prompt_ids: Vec<u32> = match (&a.prompt, &a.prompt_ids) {
        (_, Some(ids)) => {
            if a.chat {
                bail!("--chat takes --prompt text, not --prompt-ids");
            }
            ids.clone()
        }
        (Some(text), None) => {
            let f = fmt.as_ref().with_context(|| {
                format!(
                    "{}: no tokenizer files ({}); pass --prompt-ids",
                    dir.display(),
                    AnyTokenizer::FILES
                )
            })?;
            if a.chat {
                f.encode_user_turn(text, !a.no_think).context("rendering the chat prompt")?
            } else {
                f.encode_text(text)?
            }
        }
        (None, None) => bail!("give --prompt TEXT or --prompt-ids 1,2,3"),
    };
    if prompt_ids.is_empty() {
        bail!("empty prompt: the prompt encodes to no tokens");
    }
    let stop_ids: Vec<u32> = fmt.as_ref().map(|f| f.stop_ids().to_vec()).unwrap_or_default();
    let opts = GenerateOptions {
        max_new: a.max_new,
        stop_ids,
        keep_logits: a.dump_logits.is_some(),
        draft_max: a.draft_max,
        sampling: Sampling::greedy(),
        prefill_chunk: a.prefill_chunk,
        fixed_width: false,
    };
    let mut ngram = NgramDrafter::default();
    let mut model_drafter = match draft_model {
        Some(d) => {
            let t = fmt.as_ref().and_then(|f| f.tokenizer().tiktoken()).cloned().with_context(|| {
                format!(
                    "--draft {}: the target {} has no tiktoken.model tokenizer to re-encode draft text with",
                    d.dir().display(),
                    dir.display()
                )
            })?;
            Some(ModelDrafter::new(d, t, load_opts.context))
        }
        None => None,
    };
    let drafter: Option<&mut dyn Drafter> = match (a.draft.as_str(), model_drafter.as_mut()) {
        ("none", _) => None,
        ("ngram", _) => Some(&mut ngram),
        (_, d) => d.map(|d| d as &mut dyn Drafter),
    };
    let mut state = model.new_state();
    let out = generate(model, &mut state, &prompt_ids, &opts, drafter, None)?;
    if let Some(e) = model_drafter.as_ref().and_then(ModelDrafter::error) {
        eprintln!("sluice: warning: the draft model failed and drafting stopped: {e}");
    }
    let text = fmt.as_ref().map(|f| f.decode_lossy(&out.tokens)).transpose()?;
    // --chat on a family with its own template: reasoning, answer and tool calls split out.
    let message = match (&fmt, a.chat, &text) {
        (Some(f), true, Some(t)) if f.tokenizer().tiktoken().is_none() => {
            Some(f.output_format().parse(t))
        }
        _ => None,
    };
    if let Some(p) = &a.dump_logits {
        npy::write_f32_2d(p, &out.logits, model.vocab_size())?;
    }
    if a.json {
        let v = json!({
            "model": dir.display().to_string(),
            "demo_model": demo,
            "experts": loaded.mode,
            "io_backend": loaded.io_backend(),
            "spine": spine,
            "plan": loaded.plan.as_ref().map(serde_json::to_value).transpose()?,
            "prompt_ids": prompt_ids,
            "generated_ids": out.tokens,
            "text": text,
            "message": message,
            "stats": serde_json::to_value(&out.stats)?,
            "load_s": load_s,
            "remote": remote_stats().map(serde_json::to_value).transpose()?,
        });
        println!("{v}");
    } else {
        match &text {
            Some(t) => println!("{t}"),
            None => {
                println!("{}", out.tokens.iter().map(u32::to_string).collect::<Vec<_>>().join(","))
            }
        }
    }
    if a.stats {
        let s = &out.stats;
        eprintln!(
            "stats: load {load_s:.3}s, prompt {} tokens, prefill {:.3}s, generated {} tokens, {:.4} s/token, \
             {} passes, {:.2} tokens/pass, draft {} ({} drafted, {} accepted, acceptance {:.3}, widths {:?}, \
             {:.3}s drafting), experts {} requests / {} bytes served / {} bytes read ({:.0} served, \
             {:.0} read per token), spine {:.0} bytes per token, hit rate {:.3}, \
             prefetch {} issued / {} used (recall {:.3}), io wait {:.3}s, read {:.3}s, \
             spine {} bytes read ({:.0} per pass, wait {:.3}s), state {} bytes, \
             peak rss {} bytes, finish {}",
            s.prompt_tokens,
            s.prefill_s,
            s.generated_tokens,
            s.s_per_token,
            s.passes,
            s.tokens_per_pass,
            s.drafter,
            s.drafted,
            s.accepted,
            s.acceptance,
            s.width_histogram,
            s.draft_s,
            s.expert_requests,
            s.expert_bytes,
            s.expert_bytes_read,
            s.expert_bytes_per_token,
            s.expert_bytes_read_per_token,
            s.spine_bytes_per_token,
            s.hit_rate,
            s.prefetch_issued,
            s.prefetch_used,
            s.prefetch_recall,
            s.io_wait_s,
            s.read_s,
            s.spine_bytes_read,
            s.spine_bytes_per_pass,
            s.spine_io_wait_s,
            s.state_bytes,
            s.peak_rss_bytes,
            s.finish_reason
        );
        if let Some(b) = loaded.io_backend() {
            eprintln!("stats: expert reads through {b}");
        }
        if s.expert_read_errors > 0 {
            eprintln!(
                "stats: {} expert reads failed with no pass waiting on them (dropped; a pass \
                 that needed one of those experts read it again)",
                s.expert_read_errors
            );
        }
        if let Some(p) = &s.policy {
            eprintln!("draft width: {p}");
        }
        eprint!("{}", layer_stats::describe("prefill", &s.prefill_layers));
        eprint!("{}", layer_stats::describe("decode", &s.decode_layers));
        if let Some(r) = remote_stats() {
            #[allow(clippy::cast_precision_loss)]
            let secs = r.fetch_ns as f64 / 1e9;
            eprintln!(
                "remote: {} requests, {} bytes fetched, {} experts fetched, {} local hits, \
                 {secs:.3}s fetching, {} evictions ({} bytes), {} prefetch guesses not local",
                r.requests,
                r.bytes_fetched,
                r.experts_fetched,
                r.local_hits,
                r.evictions,
                r.evicted_bytes,
                r.prefetch_skipped
            );
        }
    }
    Ok(())
}

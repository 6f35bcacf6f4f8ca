//! `sluice run`: check every argument, find the checkpoint (or the built-in model) and tokenize
//! the prompt, check the prompt against the vocabulary and the context, and only then load the
//! model and decode greedily — so a mistake never costs a load or a generation.
//!
//! Text streams to stdout as tokens are committed (UTF-8 safe across token boundaries);
//! `--json` prints one object at the end instead. Prefill progress goes to stderr only (a bar
//! on a terminal, plain lines otherwise: [`crate::prefill_progress`]). Ctrl-C or SIGTERM stops generation after the
//! current pass: the output so far, the logits (`--dump-logits`) and the statistics are still
//! written, `finish_reason` is `interrupted`, and the exit status is the conventional 130
//! (SIGINT) or 143 (SIGTERM). A second signal ends the process at once.

use crate::interrupt;
use crate::load_args::LoadArgs;
use crate::npy;
use crate::open::{self, DraftArg, Target};
use crate::prefill_progress;
use crate::run_output::{self, Sink};
use crate::state_cache_args::{self, StateCacheArgs};
use crate::values;
use crate::warm_start;
use anyhow::{bail, Context, Result};
use clap::{ArgGroup, Args};
use sluice_engine::route_trace::{RouteTap, RouteTraceWriter};
use sluice_engine::turn::FollowUp;
use sluice_engine::{
    generate, Drafter, GenerateOptions, ModelDrafter, NgramDrafter, OnToken, Sampling,
};
use sluice_store::telemetry::{model_files, Sample, Telemetry};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The least context `run` plans for when `--context` is not given.
const DEFAULT_CONTEXT: usize = 4096;

/// Flags of `sluice run`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("input").required(true).args(["prompt", "prompt_ids"])))]
pub struct RunArgs {
    /// Checkpoint directory; omit to use the built-in model (mini-K3).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Prompt text (not empty).
    #[arg(long, value_parser = prompt_text)]
    prompt: Option<String>,
    /// Prompt as comma-separated token ids (e.g. 1,2,3).
    #[arg(long, value_delimiter = ',', value_parser = token_id, allow_negative_numbers = true)]
    prompt_ids: Option<Vec<u32>>,
    /// Render the --prompt text as one user turn in the model's chat format.
    #[arg(long, conflicts_with = "prompt_ids")]
    chat: bool,
    /// With --chat: no thinking channel (opens the response directly).
    #[arg(long, requires = "chat")]
    no_think: bool,
    /// Most new tokens to generate; the prompt plus this must fit in --context (without
    /// --context, the context is planned for them, up to the checkpoint's limit).
    #[arg(long, value_parser = values::count, allow_negative_numbers = true, default_value_t = 32)]
    max_new: usize,
    /// Print run statistics to stderr.
    #[arg(long)]
    stats: bool,
    /// Print one JSON object (prompt_ids, generated_ids, text, finish_reason, stats) at the end
    /// instead of streaming text.
    #[arg(long)]
    json: bool,
    /// Write the f32 logits of every generated step as an .npy array [steps, vocab].
    #[arg(long)]
    dump_logits: Option<PathBuf>,
    /// Speculative drafts: `auto` (the measured default: none today), `none`, `ngram` (prompt
    /// lookup), `builtin` (the built-in mini-draft), or the directory of a Qwen3 draft model
    /// (charged to --memory). Output is identical either way.
    #[arg(long, value_parser = open::draft_arg, default_value = "auto")]
    draft: DraftArg,
    /// Most draft tokens verified per pass.
    #[arg(long, value_parser = values::count, allow_negative_numbers = true, default_value_t = 8)]
    draft_max: usize,
    /// Verify exactly --draft-max drafts every pass instead of letting the width policy choose
    /// (for comparing the policy with fixed widths).
    #[arg(long)]
    draft_fixed: bool,
    /// Prompt tokens per prefill pass. 0 (auto): the largest chunk whose working memory fits
    /// the --memory budget after the rest of the plan; a chunk that does not fit is refused.
    #[arg(long, value_parser = values::count, allow_negative_numbers = true, default_value_t = 0)]
    prefill_chunk: usize,
    /// Write every pass's routing (per MoE layer, per row: expert ids and weights) to FILE as
    /// JSON lines (docs/FORMATS.md), for the cache-policy replay in docs/PERFORMANCE.md.
    #[arg(long, value_name = "FILE")]
    trace_routes: Option<PathBuf>,
    #[command(flatten)]
    load: LoadArgs,
    #[command(flatten)]
    state_cache: StateCacheArgs,
}

/// Parses `--prompt`: any text but the empty string.
fn prompt_text(s: &str) -> Result<String, String> {
    if s.is_empty() {
        return Err("empty prompt: give some text".into());
    }
    Ok(s.to_owned())
}

/// Parses one id of `--prompt-ids`.
fn token_id(s: &str) -> Result<u32, String> {
    if s.trim_start().starts_with('-') {
        return Err("token ids cannot be negative".into());
    }
    s.trim().parse().map_err(|_| format!("{s:?} is not a token id (give ids like 1,2,3)"))
}

/// Runs the command.
pub fn run(a: &RunArgs) -> Result<()> {
    interrupt::install().context("installing the Ctrl-C handler")?;
    if let Some(p) = &a.dump_logits {
        check_writable(p)?;
    }
    let target = Target::find(a.model.as_deref(), a.load.spine(), "using")?;
    // Loading counts: it reads the spine and maps the shards.
    let machine0 = Sample::now(Some(&target.read_dir));
    let (prompt_ids, reasoning_open) = prompt_ids(a, &target)?;
    let needed = prompt_ids.len() + a.max_new;
    // Without --context the state is planned for what this run can use (at least
    // DEFAULT_CONTEXT), up to what the checkpoint allows.
    let context = a.load.context.unwrap_or_else(|| {
        needed.max(DEFAULT_CONTEXT).min(target.max_context.unwrap_or(usize::MAX))
    });
    target.check_context(context)?;
    if needed > context {
        let fix = match (a.load.context, target.max_context) {
            (Some(_), Some(m)) if needed <= m => format!(
                "pass --context {needed} or more (this checkpoint allows up to {m}), or a \
                 smaller --max-new"
            ),
            (Some(_), None) => format!("pass --context {needed} or more, or a smaller --max-new"),
            (_, m) => format!(
                "the checkpoint allows at most {} (max_position_embeddings): give a smaller \
                 --max-new",
                m.unwrap_or(context)
            ),
        };
        bail!(
            "the prompt ({}) plus --max-new {} is {needed} tokens, more than the context of \
             {context} tokens; {fix}",
            tokens(prompt_ids.len()),
            a.max_new
        );
    }
    let mut load_opts = a.load.options(context);
    load_opts.prefill_chunk = a.prefill_chunk;
    load_opts.state_cache = a.state_cache.enabled();
    let draft = target.resolve_draft(&a.draft)?;
    // The largest pass this run takes: its prompt in one chunk, or the pending token and its
    // drafts. The plan charges the automatic chunk's working memory for no more rows than this
    // (it would charge up to the context), and the rest becomes expert-cache slots.
    let verify = if matches!(draft, DraftArg::None | DraftArg::Auto) {
        1
    } else {
        a.draft_max.saturating_add(1)
    };
    load_opts.largest_pass = prompt_ids.len().max(verify);
    if matches!(draft, DraftArg::Model(_)) {
        target.tokenizer("--draft DIR needs them to re-encode draft text")?;
    }

    // Created before the load, so a path that cannot be written costs nothing.
    let tap = a
        .trace_routes
        .as_deref()
        .map(|p| {
            let model = target.read_dir.display().to_string();
            RouteTraceWriter::create(p, &model, prompt_ids.len(), experts_per_layer(&target))
                .map(|w| RouteTap(Arc::new(Mutex::new(w))))
        })
        .transpose()?;
    let mut opened = target.load(load_opts, &draft)?;
    let warm = warm_start::begin(
        &target.read_dir,
        opened.loaded.streaming.as_ref(),
        !a.load.no_warm_start,
    );
    let draft_model = opened.draft_model.take();
    let model = &opened.loaded.model;
    let state_cache = a.state_cache.open(&target, model, opened.spine)?;
    let stop_ids: Vec<u32> = target.fmt.as_ref().map(|f| f.stop_ids().to_vec()).unwrap_or_default();
    let mut ngram = NgramDrafter::default();
    let mut model_drafter =
        draft_model.zip(target.tok.clone()).map(|(d, t)| ModelDrafter::new(d, t, context));
    let drafter: Option<&mut dyn Drafter> = match &draft {
        DraftArg::Auto | DraftArg::Builtin | DraftArg::None => None,
        DraftArg::Ngram => Some(&mut ngram),
        DraftArg::Model(_) => model_drafter.as_mut().map(|d| d as &mut dyn Drafter),
    };
    let opts = GenerateOptions {
        max_new: a.max_new,
        stop_ids,
        keep_logits: a.dump_logits.is_some(),
        draft_max: a.draft_max,
        sampling: Sampling::greedy(),
        // The chunk the plan charged (a model without a plan runs as asked).
        prefill_chunk: opened
            .loaded
            .plan
            .as_ref()
            .map_or(a.prefill_chunk, |p| usize::try_from(p.chunk).unwrap_or(usize::MAX)),
        fixed_width: a.draft_fixed,
        interrupt: Some(interrupt::arm()),
        on_prefill: Some(prefill_progress::hook()),
        route_tap: tap.clone(),
        state_cache: state_cache.clone(),
        // A `--chat` prompt is a conversation of one user turn: no later prompt of `run`
        // continues its reply, so the state after generation is not written (for Kimi K3,
        // 0.6 GB). A raw prompt's follow-up may continue it as generated.
        follow_up: a.chat.then(FollowUp::none),
        constraint: None,
    };
    eprintln!("sluice: generating (Ctrl-C stops after the current pass and keeps the output)");
    let mut sink = (!a.json).then(|| Sink::stdout(target.fmt.as_ref()));
    let mut on_token = |id: u32| sink.as_mut().is_none_or(|s| s.push(id));
    let mut state = model.new_state();
    let on_token: OnToken<'_> = &mut on_token;
    let out = generate(model, &mut state, &prompt_ids, &opts, drafter, Some(on_token));
    // Whatever was streamed is ended with its line, even when the generation failed.
    let write_error = sink.map(Sink::finish).and_then(Result::err);
    let out = out?;
    drop(opts);
    if let Some(tap) = tap {
        finish_trace(tap, a.trace_routes.as_deref())?;
    }
    // The states were written off the token path; the process waits for them before it ends.
    if let Some(c) = &state_cache {
        c.flush();
    }
    if let Some(e) = model_drafter.as_ref().and_then(ModelDrafter::error) {
        eprintln!("sluice: warning: the draft model failed and drafting stopped: {e}");
    }
    if let Some(sig) = interrupt::received() {
        eprintln!(
            "sluice: stopped by {} after the current pass ({} tokens generated)",
            interrupt::name(sig),
            out.tokens.len()
        );
    }
    if let Some(p) = &a.dump_logits {
        npy::write_f32_2d(p, &out.logits, model.vocab_size())?;
    }
    if let Some(w) = &warm {
        w.save();
    }
    let mut machine = Telemetry::since(&machine0).with_page_cache(&model_files(&target.read_dir));
    machine.budget_bytes = opened.loaded.plan.as_ref().map(|p| p.budget);
    if a.json {
        let chat = a.chat.then_some(reasoning_open);
        let v = run_output::json(&target, &opened, &prompt_ids, &out, chat, &machine)?;
        // Not println!, which panics on a closed stdout.
        writeln!(std::io::stdout(), "{v}").context("writing the JSON to stdout")?;
    }
    if a.stats {
        run_output::print_stats(&opened, &out, &machine);
        if let Some(c) = &state_cache {
            eprintln!("stats: {}", state_cache_args::stats_line(&c.stats()));
        }
    }
    // A reader that stopped reading (`| head`) ended the run quietly, as it ends `cat`; any
    // other failure to write is an error.
    if let Some(e) = write_error.filter(|e| e.kind() != std::io::ErrorKind::BrokenPipe) {
        return Err(e).context("writing the output to stdout (generation stopped)");
    }
    if let Some(sig) = interrupt::received() {
        std::process::exit(interrupt::exit_code(sig));
    }
    Ok(())
}

/// Routed experts per MoE layer as config.json names them (K3/Qwen3-MoE `num_experts`,
/// GPT-OSS `num_local_experts`), 0 when it does not say.
fn experts_per_layer(target: &Target) -> usize {
    let Ok(cfg) = sluice_checkpoint::CheckpointConfig::load(&target.read_dir) else { return 0 };
    let tc = cfg.text_config();
    ["num_experts", "n_routed_experts", "num_local_experts"]
        .iter()
        .find_map(|k| tc.get(*k).and_then(serde_json::Value::as_u64))
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or(0)
}

/// Renames the finished route trace into place (also after Ctrl-C: the passes run so far).
fn finish_trace(tap: RouteTap, path: Option<&Path>) -> Result<()> {
    let shown = path.map(|p| p.display().to_string()).unwrap_or_default();
    let writer = Arc::try_unwrap(tap.0)
        .map_err(|_| anyhow::anyhow!("the route trace {shown} is still in use"))?
        .into_inner()
        .map_err(|_| anyhow::anyhow!("the route trace {shown} was poisoned by a panic"))?;
    let passes = writer.finish()?;
    eprintln!("sluice: route trace: {passes} passes written to {shown}");
    Ok(())
}

/// `n tokens`, or `1 token`.
fn tokens(n: usize) -> String {
    if n == 1 {
        "1 token".into()
    } else {
        format!("{n} tokens")
    }
}

/// The prompt's ids: `--prompt-ids` as given, or `--prompt` through the tokenizer (as a chat
/// turn with `--chat`); refused when empty or out of the model's vocabulary. With them, whether
/// the chat prompt opened the think block the reply starts in.
fn prompt_ids(a: &RunArgs, target: &Target) -> Result<(Vec<u32>, bool)> {
    let (ids, reasoning_open) = match (&a.prompt, &a.prompt_ids) {
        (_, Some(ids)) => (ids.clone(), false),
        (Some(text), None) => {
            let f = target.format("pass --prompt-ids")?;
            if a.chat {
                let r =
                    f.render_user_turn(text, !a.no_think).context("rendering the chat prompt")?;
                (r.ids, r.reasoning_open)
            } else {
                (f.encode_text(text)?, false)
            }
        }
        // clap requires one of the two.
        (None, None) => bail!("give --prompt TEXT or --prompt-ids 1,2,3"),
    };
    if ids.is_empty() {
        bail!("empty prompt: the prompt encodes to no tokens");
    }
    if let Some(vocab) = target.vocab {
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
            bail!("prompt token id {id} is out of vocabulary (the model has {vocab} tokens)");
        }
    }
    Ok((ids, reasoning_open))
}

/// Refuses a `--dump-logits` path that cannot be written, before anything is loaded: the file
/// is written at the end (through a temporary file next to it), when the run's output is too
/// late to save.
fn check_writable(path: &Path) -> Result<()> {
    if path.is_dir() {
        bail!("--dump-logits {}: is a directory; give a file path", path.display());
    }
    let tmp = npy::temp_path(path);
    std::fs::File::create(&tmp)
        .and_then(|_| std::fs::remove_file(&tmp))
        .with_context(|| format!("--dump-logits {}: cannot write there", path.display()))
}

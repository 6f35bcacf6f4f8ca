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
use crate::values;
use anyhow::{bail, Context, Result};
use clap::{ArgGroup, Args};
use sluice_engine::{
    generate, Drafter, GenerateOptions, ModelDrafter, NgramDrafter, OnToken, Sampling,
};
use std::io::Write;
use std::path::{Path, PathBuf};

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
    /// Speculative drafts: `none`, `ngram` (prompt lookup), or the directory of a Qwen3 draft
    /// model (charged to --memory). Output is identical either way.
    #[arg(long, value_parser = open::draft_arg, default_value = "none")]
    draft: DraftArg,
    /// Most draft tokens verified per pass.
    #[arg(long, value_parser = values::count, allow_negative_numbers = true, default_value_t = 8)]
    draft_max: usize,
    /// Prompt tokens per prefill pass. 0 (auto): the largest chunk whose working memory fits
    /// the --memory budget after the rest of the plan; a chunk that does not fit is refused.
    #[arg(long, value_parser = values::count, allow_negative_numbers = true, default_value_t = 0)]
    prefill_chunk: usize,
    #[command(flatten)]
    load: LoadArgs,
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
    let prompt_ids = prompt_ids(a, &target)?;
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
    if matches!(a.draft, DraftArg::Model(_)) {
        target.tokenizer("--draft DIR needs them to re-encode draft text")?;
    }

    let mut opened = target.load(load_opts, &a.draft)?;
    let draft_model = opened.draft_model.take();
    let model = &opened.loaded.model;
    let stop_ids: Vec<u32> = target.fmt.as_ref().map(|f| f.stop_ids().to_vec()).unwrap_or_default();
    let mut ngram = NgramDrafter::default();
    let mut model_drafter =
        draft_model.zip(target.tok.clone()).map(|(d, t)| ModelDrafter::new(d, t, context));
    let drafter: Option<&mut dyn Drafter> = match &a.draft {
        DraftArg::None => None,
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
        fixed_width: false,
        interrupt: Some(interrupt::arm()),
        on_prefill: Some(prefill_progress::hook()),
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
    if a.json {
        let v = run_output::json(&target, &opened, &prompt_ids, &out, a.chat)?;
        // Not println!, which panics on a closed stdout.
        writeln!(std::io::stdout(), "{v}").context("writing the JSON to stdout")?;
    }
    if a.stats {
        run_output::print_stats(&opened, &out);
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

/// `n tokens`, or `1 token`.
fn tokens(n: usize) -> String {
    if n == 1 {
        "1 token".into()
    } else {
        format!("{n} tokens")
    }
}

/// The prompt's ids: `--prompt-ids` as given, or `--prompt` through the tokenizer (as a chat
/// turn with `--chat`); refused when empty or out of the model's vocabulary.
fn prompt_ids(a: &RunArgs, target: &Target) -> Result<Vec<u32>> {
    let ids = match (&a.prompt, &a.prompt_ids) {
        (_, Some(ids)) => ids.clone(),
        (Some(text), None) => {
            let f = target.format("pass --prompt-ids")?;
            if a.chat {
                f.encode_user_turn(text, !a.no_think).context("rendering the chat prompt")?
            } else {
                f.encode_text(text)?
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
    Ok(ids)
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

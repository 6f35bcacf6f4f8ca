//! Opening a model: the one path `sluice run` and `sluice serve` share.
//!
//! [`Target::find`] does the cheap part: it finds the checkpoint (writing the built-in
//! model mini-K3 when none is given), resolves the directory the spine choice reads, and reads
//! `config.json` and the tokenizer. Each command then checks its arguments against them — the
//! vocabulary, the context, the prompt — so that a mistake is reported before the expensive
//! part. [`Target::load`] then opens the draft model, plans the memory budget, places the spine
//! and starts the expert store, and prints the plan.

use anyhow::{bail, Context, Result};
use sluice_checkpoint::CheckpointConfig;
use sluice_engine::builtin::{ensure_builtin_draft, ensure_builtin_model, BUILTIN_DESCRIPTION};
use sluice_engine::demo::cache_dir;
use sluice_engine::load::{self, LoadOptions, Loaded};
use sluice_engine::{DraftModel, Spine};
use sluice_tokenizer::{AnyTokenizer, PromptFormat, Tokenizer, RANK_FILE};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// `--draft`: where speculative drafts come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DraftArg {
    /// The default: whatever drafter measurements show pays on this model; today that is none
    /// for every model ([`Target::resolve_draft`]).
    Auto,
    /// The built-in draft model (mini-draft), compiled into the binary.
    Builtin,
    /// No speculation.
    None,
    /// Prompt lookup (no model).
    Ngram,
    /// A Qwen3 draft model's directory.
    Model(PathBuf),
}

/// Parses `--draft`: `auto`, `none`, `ngram` or an existing directory.
pub fn draft_arg(s: &str) -> Result<DraftArg, String> {
    match s {
        "auto" => Ok(DraftArg::Auto),
        "builtin" => Ok(DraftArg::Builtin),
        "none" => Ok(DraftArg::None),
        "ngram" => Ok(DraftArg::Ngram),
        dir if Path::new(dir).is_dir() => Ok(DraftArg::Model(dir.into())),
        other => {
            Err(format!("{other:?} is not auto, none, ngram, builtin or a draft model directory"))
        }
    }
}

/// A checkpoint found and its cheap parts read; nothing large is loaded yet.
#[derive(Debug)]
pub struct Target {
    /// The directory given (or the built-in model's); `serve` names the model after it.
    pub dir: PathBuf,
    /// The directory the spine choice reads (the int8 conversion for `--spine int8`).
    pub read_dir: PathBuf,
    /// Whether this is the built-in model (mini-K3).
    pub demo: bool,
    /// The checkpoint's tokenizer, chat format and stop ids, when it has tokenizer files
    /// (`tiktoken.model` for Kimi K3, `tokenizer.json` for the other families).
    pub fmt: Option<PromptFormat>,
    /// The Kimi K3 (tiktoken) tokenizer, when that is the checkpoint's: the server and the
    /// draft-model re-encoding still need it.
    pub tok: Option<Arc<Tokenizer>>,
    /// Rows of the logits (`vocab_size` in config.json), when the config says.
    pub vocab: Option<usize>,
    /// The checkpoint's `max_position_embeddings`, when the config says.
    pub max_context: Option<usize>,
}

/// A loaded model and what came with it.
#[derive(Debug)]
pub struct Opened {
    /// The model, its plan, budget charges and stores.
    pub loaded: Loaded,
    /// The draft model (`--draft DIR`).
    pub draft_model: Option<DraftModel>,
    /// The spine precision it was opened with.
    pub spine: Spine,
    /// Seconds the load took (draft model included).
    pub load_s: f64,
}

impl Target {
    /// Finds the checkpoint in `model` (the built-in model when `None`; `verb` says what the command
    /// does with it) and reads its config and tokenizer.
    pub fn find(model: Option<&Path>, spine: Spine, verb: &str) -> Result<Self> {
        let (dir, demo) = match model {
            Some(d) => (d.to_path_buf(), false),
            None => {
                let dir = ensure_builtin_model(&cache_dir(), &mut |bad| {
                    eprintln!(
                        "sluice: the cached built-in model is damaged ({bad} fails its SHA-256 \
                         check); writing a fresh copy"
                    );
                })
                .context("placing the built-in model in the cache")?;
                (dir, true)
            }
        };
        if demo {
            eprintln!(
                "sluice: no --model given; {verb} the built-in model at {} ({BUILTIN_DESCRIPTION})",
                dir.display()
            );
        }
        let read_dir = sluice_engine::spine::resolve(&dir, spine)?;
        let config = CheckpointConfig::load(&read_dir)
            .with_context(|| format!("opening {}", read_dir.display()))?;
        let number = |key: &str| {
            config
                .text_config()
                .get(key)
                .and_then(serde_json::Value::as_u64)
                .and_then(|n| usize::try_from(n).ok())
        };
        // A checkpoint without tokenizer files still runs from token ids; broken files are an
        // error.
        let fmt = PromptFormat::from_dir(&read_dir)
            .with_context(|| format!("loading the tokenizer of {}", read_dir.display()))?;
        let tok = fmt.as_ref().and_then(|f| f.tokenizer().tiktoken().cloned());
        Ok(Self {
            vocab: number("vocab_size"),
            max_context: number("max_position_embeddings"),
            dir,
            read_dir,
            demo,
            fmt,
            tok,
        })
    }

    /// The tokenizer, or an error saying the checkpoint has none (`why` names what needs it).
    pub fn tokenizer(&self, why: &str) -> Result<Arc<Tokenizer>> {
        self.tok.clone().with_context(|| {
            format!(
                "{}: no tokenizer files ({RANK_FILE}, tokenizer_config.json); {why}",
                self.read_dir.display()
            )
        })
    }

    /// The prompt format, or an error saying the checkpoint has no tokenizer files (`why` names
    /// what needs them).
    pub fn format(&self, why: &str) -> Result<&PromptFormat> {
        self.fmt.as_ref().with_context(|| {
            format!(
                "{}: no tokenizer files ({}); {why}",
                self.read_dir.display(),
                AnyTokenizer::FILES
            )
        })
    }

    /// What `--draft` means for this model: `builtin` is the built-in draft, mini-draft (placed
    /// in the cache and SHA-checked like the built-in model). `auto` drafts nothing: mini-draft
    /// on the built-in model measured 1.1–1.6× the s/token of no drafts on the 2-core machine
    /// (docs/PERFORMANCE.md), so it is not the default until it pays. The other values stand.
    pub fn resolve_draft(&self, arg: &DraftArg) -> Result<DraftArg> {
        match arg {
            DraftArg::Builtin => {
                let dir = ensure_builtin_draft(&cache_dir(), &mut |bad| {
                    eprintln!(
                        "sluice: the cached built-in draft is damaged ({bad} fails its SHA-256 \
                         check); writing a fresh copy"
                    );
                })
                .context("placing the built-in draft model in the cache")?;
                eprintln!(
                    "sluice: drafting with the built-in draft model at {} (output is identical \
                     without it)",
                    dir.display()
                );
                Ok(DraftArg::Model(dir))
            }
            DraftArg::Auto => Ok(DraftArg::None),
            other => Ok(other.clone()),
        }
    }

    /// Refuses a context of `context` tokens above the checkpoint's `max_position_embeddings`.
    pub fn check_context(&self, context: usize) -> Result<()> {
        if let Some(c) = self.max_context.filter(|&c| context > c) {
            bail!("--context {context} is above the checkpoint's max_position_embeddings {c}");
        }
        Ok(())
    }

    /// Opens the draft model, then the model under `opts` (the draft model's memory charged to
    /// the same budget first), and prints the plan.
    pub fn load(&self, mut opts: LoadOptions, draft: &DraftArg) -> Result<Opened> {
        let t0 = Instant::now();
        let draft_model = match draft {
            DraftArg::Model(d) => Some(DraftModel::open(d)?),
            DraftArg::Auto | DraftArg::Builtin | DraftArg::None | DraftArg::Ngram => None,
        };
        // The draft model's weights, KV cache for the whole context and scratch come out of the
        // same budget, before the target is planned.
        opts.draft_bytes = draft_model.as_ref().map_or(0, |d| d.memory_needs(opts.context));
        let loaded = load::open(&self.read_dir, &opts)
            .with_context(|| format!("loading {}", self.read_dir.display()))?;
        let spine = opts.spine;
        let reads = loaded.io_backend().map(|b| format!(", read with {b}")).unwrap_or_default();
        // The published spine is named by its real storage (DeepSeek V3's is FP8).
        let label = match spine {
            sluice_engine::spine::Spine::Bf16 => {
                format!("{} (as published)", loaded.model.spine_format())
            }
            other => other.label().to_owned(),
        };
        match &loaded.plan {
            Some(p) => eprintln!("sluice: spine {label}; {p}; experts {}{reads}", loaded.mode),
            None => eprintln!("sluice: spine {label}; experts {}{reads}", loaded.mode),
        }
        if !self.demo {
            eprintln!("sluice: {}", sluice_engine::install::describe(&self.read_dir, &loaded));
        }
        Ok(Opened { loaded, draft_model, spine, load_s: t0.elapsed().as_secs_f64() })
    }
}

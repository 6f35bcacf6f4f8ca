//! sluice-tokenizer: tiktoken-style rank-BPE tokenizers and the Kimi K3 chat format.
//!
//! - [`Tokenizer`] loads a Kimi checkpoint's `tiktoken.model` and `tokenizer_config.json`,
//!   encodes text byte-exactly as Python tiktoken with K3's pre-tokenizer and
//!   `tokenization_kimi.py`'s length splitting ([`pretokenize`]), and decodes ids, also
//!   incrementally at UTF-8 boundaries ([`StreamDecoder`]).
//! - [`HfTokenizer`] loads a Hugging Face `tokenizer.json` (Qwen3 and other byte-level BPE
//!   checkpoints) through the `tokenizers` crate.
//! - [`AnyTokenizer`] is whichever of the two a checkpoint ships, chosen from its files.
//! - [`ChatTemplate`] renders a checkpoint's own Jinja chat template (Qwen3-MoE, GPT-OSS) with
//!   `minijinja`, byte-identical to transformers' `apply_chat_template`.
//! - [`chat`] renders conversations in K3's XTML format, inserting the structural markers by id
//!   so that text can never forge them; [`k3_output`] parses K3 replies on ids.
//! - [`PromptFormat`] is the one chat seam front ends use: it renders a request in the
//!   checkpoint's format ([`PromptFormat::render_chat`]) and hands out the incremental parser of
//!   its replies ([`PromptFormat::output_parser`]: K3's, or [`chat_stream`]'s for the text
//!   formats of [`OutputFormat`]), and the grammar of a constrained reply in that format
//!   ([`PromptFormat::reply_grammar`], written per format in [`reply_grammar`]).
//!
//! Goldens in `tests/fixtures/tokenizer` come from Python tiktoken
//! (`tools/gen_tokenizer_goldens.py`) and from the llama.cpp `Kimi-K3.jinja` template rendered by
//! jinja2 (`tools/gen_chat_goldens.py`).

mod any;
pub mod bpe;
pub mod chat;
pub mod chat_parser;
pub mod chat_stream;
mod error;
pub mod hf;
pub mod k3_output;
pub mod load;
pub mod output;
pub mod pretokenize;
mod prompt;
pub mod pyjson;
pub mod reply_grammar;
mod stream;
pub mod template;
mod tokenizer;
mod xtml;

pub use any::{AnyError, AnyStreamDecoder, AnyTokenizer};
pub use bpe::CoreBpe;
pub use chat::{
    k3_stop_id, render_k3, render_k3_segments, render_k3_text, ChatMessage, ChatOptions, Marker,
    Role, Segment, ToolCall,
};
pub use chat_parser::{ChatOutputParser, TextOutputParser};
pub use chat_stream::{ChatToolCall, OutputEvent, TextMachine};
pub use error::{Error, Result};
pub use hf::{HfError, HfTokenizer};
pub use load::AddedToken;
pub use output::{OutputFormat, ParsedOutput, ParsedToolCall};
pub use prompt::{PromptError, PromptFormat, RenderedChat};
pub use reply_grammar::{GrammarError, Reasoning, ReplyConstraint};
pub use stream::{StreamDecoder, TokRef};
pub use template::{ChatTemplate, TemplateError, TemplateInputs};
pub use tokenizer::{Tokenizer, CONFIG_FILE, RANK_FILE};

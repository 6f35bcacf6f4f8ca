//! Constrained output for both APIs and every chat format: what a request asks for (a JSON
//! reply, with or without a schema; a tool call to any or to one named tool) becomes the
//! grammar of a whole reply in the served checkpoint's chat format — its reasoning part, then
//! the content holding the JSON or the format's tool-call markup with each call's arguments
//! valid against the tool's schema ([`sluice_tokenizer::reply_grammar`], one function per
//! format) — compiled by `llguidance` ([`sluice_engine::constraint`]) against the served
//! tokenizer.
//!
//! The grammar spells the chat format's structural markers as its reply parser reads them, so
//! the reply parses exactly as an unconstrained one does: the JSON arrives as the content, tool
//! calls as tool calls. A schema the engine cannot compile is a 400 naming the construct
//! (llguidance's own message); a format without tool-call markup (plain text) refuses tool
//! constraints by name.

use crate::error::ApiError;
use serde_json::Value;
use sluice_engine::constraint::{ConstraintError, Grammar, GrammarEnv, SharedConstraint};
use sluice_tokenizer::{PromptFormat, Reasoning, ReplyConstraint};
use std::sync::{Arc, OnceLock};

/// What a request constrains its reply to.
#[derive(Debug, Clone, PartialEq)]
pub enum OutputConstraint {
    /// The content is one JSON value matching this schema (`{"type": "object"}` for
    /// `json_object`).
    Json {
        /// The schema.
        schema: Value,
        /// The request field it came from (named in a compile error).
        param: &'static str,
    },
    /// The reply is tool calls only: to one of `tools` (name, parameters schema).
    Tools {
        /// Callable tools.
        tools: Vec<(String, Value)>,
        /// More than one call allowed.
        parallel: bool,
        /// The request field it came from.
        param: &'static str,
    },
}

/// The vocabulary index, built on the first constrained request (a trie over every token).
#[derive(Debug, Default)]
pub struct Grammars {
    env: OnceLock<Result<Arc<GrammarEnv>, String>>,
}

impl Grammars {
    /// Compiles `c` for a reply in `fmt`'s chat format after a prompt whose reasoning is
    /// `reasoning` ([`sluice_tokenizer::RenderedChat::reasoning`]). Runs on the blocking pool:
    /// the first call indexes the vocabulary.
    pub fn compile(
        &self,
        fmt: &PromptFormat,
        c: &OutputConstraint,
        reasoning: Reasoning,
    ) -> Result<SharedConstraint, ApiError> {
        let (reply, param) = match c {
            OutputConstraint::Json { schema, param } => (ReplyConstraint::Json(schema), *param),
            OutputConstraint::Tools { tools, parallel, param } => {
                (ReplyConstraint::Tools { tools, parallel: *parallel }, *param)
            }
        };
        let unsupported = |why: String| {
            ApiError::unsupported(
                param,
                format!(
                    "constrained output is not supported for this model's chat format ({}): \
                     {why}; drop {param}",
                    fmt.output_format().name()
                ),
            )
        };
        let lark = fmt.reply_grammar(reply, reasoning).map_err(|e| unsupported(e.to_string()))?;
        let Some(eos) = fmt.reply_end() else {
            return Err(unsupported("the checkpoint names no stop token to end a reply".into()));
        };
        let env = self
            .env
            .get_or_init(|| {
                GrammarEnv::new(fmt.shared_tokenizer(), eos)
                    .map(Arc::new)
                    .map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|e| ApiError::Internal(e.clone()))?;
        match env.compile(&Grammar::Lark(lark)) {
            Ok(k) => Ok(SharedConstraint::new(k)),
            Err(ConstraintError::Compile(why)) => Err(ApiError::unsupported(
                param,
                format!(
                    "the schema cannot be enforced by sluice's grammar engine: {}",
                    cause(&why)
                ),
            )),
            Err(e) => Err(ApiError::Internal(e.to_string())),
        }
    }
}

/// The engine's message without the grammar listing it appends (`   3 | start: …`) and the
/// position in that listing: the client sent a schema, not this grammar.
fn cause(why: &str) -> String {
    let listing = |l: &str| {
        let t = l.trim_start();
        t.split_once(" | ")
            .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    let text: Vec<&str> =
        why.lines().take_while(|l| !listing(l)).map(str::trim).filter(|l| !l.is_empty()).collect();
    let text = text.join(" ");
    match text.strip_prefix("at ").and_then(|r| r.split_once("): ")) {
        Some((_, rest)) => rest.to_owned(),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compile_errors_drop_the_grammar_listing() {
        let why =
            "at 2(7): failed to compile JSON schema: Pointer '/x' does not exist\n   1 | start: …";
        assert_eq!(cause(why), "failed to compile JSON schema: Pointer '/x' does not exist");
        let why =
            "at 4(7): failed to compile JSON schema: regex parse error:\n    (?=a)b\n    ^^^\n\
                   error: look-around is not supported\n   2 | THINK_TEXT: /x/\n   3 | start: x";
        assert_eq!(
            cause(why),
            "failed to compile JSON schema: regex parse error: (?=a)b ^^^ error: look-around is not supported"
        );
        assert_eq!(cause("plain"), "plain");
    }
}

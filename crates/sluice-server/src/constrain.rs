//! Constrained output for both APIs, for the XTML chat format (other formats are refused with
//! a 400 naming the field): what a request asks for (a JSON reply, with or without a
//! schema; a tool call to any or to one named tool) becomes a grammar over the whole K3 reply —
//! the think channel when thinking is on, then the response channel holding the JSON, or an empty
//! response followed by the tools channel with each call's arguments as a raw JSON element — and
//! is compiled by `llguidance` ([`sluice_engine::constraint`]) against the served tokenizer.
//!
//! The grammar covers the chat format's structural markers as special tokens, so the reply parses
//! exactly as an unconstrained one does ([`sluice_tokenizer::k3_output`]): the JSON arrives as the
//! content, tool calls as tool calls. A schema the engine cannot compile is a 400 naming the
//! construct (llguidance's own message).

use crate::error::ApiError;
use serde_json::{json, Value};
use sluice_engine::constraint::{ConstraintError, Grammar, GrammarEnv, SharedConstraint};
use sluice_tokenizer::PromptFormat;
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
    /// Compiles `c` for a reply generated after a thinking (or non-thinking) prompt. Runs on the
    /// blocking pool: the first call indexes the vocabulary.
    pub fn compile(
        &self,
        fmt: &PromptFormat,
        c: &OutputConstraint,
        thinking: bool,
    ) -> Result<SharedConstraint, ApiError> {
        let (lark, param) = lark(c, thinking);
        // The grammar spells the XTML markers; a template format's answer part has no grammar
        // here yet, and a constraint that cannot be enforced is refused rather than ignored.
        let Some(tok) = fmt.xtml_tokenizer() else {
            return Err(ApiError::unsupported(
                param,
                format!(
                    "constrained output is not supported for this model's chat format ({}): \
                     only the XTML format is enforced by grammar; drop {param}",
                    fmt.output_format().name()
                ),
            ));
        };
        let env = self
            .env
            .get_or_init(|| {
                GrammarEnv::new(Arc::clone(tok)).map(Arc::new).map_err(|e| e.to_string())
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

/// `s` as a Lark string literal (JSON's escaping is a subset Lark reads).
fn lit(s: &str) -> String {
    Value::String(s.to_owned()).to_string()
}

/// An XTML attribute value, escaped as the renderer escapes it (`&` first, then `"`).
fn attr(s: &str) -> String {
    s.replace('&', "&amp;").replace('"', "&quot;")
}

/// `schema` with compact JSON (no free whitespace between tokens): a constrained reply is as
/// short as the schema allows, and a small model cannot wander into endless whitespace.
fn compact(schema: &Value) -> String {
    let mut s = schema.clone();
    if let Value::Object(m) = &mut s {
        m.insert("x-guidance".into(), json!({"whitespace_flexible": false}));
    }
    s.to_string()
}

/// The Lark grammar of a whole constrained reply, and the field a compile error names.
pub fn lark(c: &OutputConstraint, thinking: bool) -> (String, &'static str) {
    // The think channel is free text up to its closing tag (text can never contain a marker).
    let mut g = String::new();
    let head = if thinking {
        g.push_str("think: THINK_TEXT <|close|> \"think\" <|sep|> <|open|> \"response\" <|sep|>\n");
        g.push_str("THINK_TEXT: /(?s:.*)/\n");
        "think "
    } else {
        ""
    };
    let tail = "<|close|> \"message\" <|sep|>";
    let param = match c {
        OutputConstraint::Json { schema, param } => {
            g.push_str(&format!(
                "start: {head}body <|close|> \"response\" <|sep|> {tail}\nbody: %json {}\n",
                compact(schema)
            ));
            param
        }
        OutputConstraint::Tools { tools, parallel, param } => {
            let calls = if *parallel { "call+" } else { "call" };
            g.push_str(&format!(
                "start: {head}<|close|> \"response\" <|sep|> <|open|> \"tools\" <|sep|> {calls} \
                 <|close|> \"tools\" <|sep|> {tail}\n"
            ));
            let alts: Vec<String> = (0..tools.len()).map(|i| format!("call_{i}")).collect();
            g.push_str(&format!("call: {}\n", alts.join(" | ")));
            g.push_str("INDEX: /[0-9]{1,3}/\n");
            for (i, (name, params)) in tools.iter().enumerate() {
                let open = format!("call tool=\"{}\" index=\"", attr(name));
                g.push_str(&format!(
                    "call_{i}: <|open|> {} INDEX \"\\\"\" <|sep|> <|open|> \"json type=\\\"object\\\"\" \
                     <|sep|> args_{i} <|close|> \"json\" <|sep|> <|close|> \"call\" <|sep|>\n\
                     args_{i}: %json {}\n",
                    lit(&open),
                    compact(params)
                ));
            }
            param
        }
    };
    (g, param)
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

    #[test]
    fn grammars_name_the_markers_and_embed_the_schema() {
        let c =
            OutputConstraint::Json { schema: json!({"type": "object"}), param: "response_format" };
        let (g, p) = lark(&c, false);
        assert_eq!(p, "response_format");
        assert!(g.starts_with("start: body <|close|> \"response\" <|sep|>"), "{g}");
        assert!(g.contains("%json {\"type\":\"object\",\"x-guidance\""), "{g}");
        let t = OutputConstraint::Tools {
            tools: vec![("say \"hi\"".into(), json!({"type": "object"}))],
            parallel: false,
            param: "tool_choice",
        };
        let (g, _) = lark(&t, true);
        assert!(g.starts_with("think: THINK_TEXT <|close|>"), "{g}");
        assert!(g.contains(r#""call tool=\"say &quot;hi&quot;\" index=\"""#), "{g}");
        assert!(g.contains("<|tools|>") || g.contains("\"tools\" <|sep|> call <|close|>"), "{g}");
    }
}

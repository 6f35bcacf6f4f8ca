//! The workload suite of `sluice bench --workload NAME`: committed prompts that stand for the
//! work people do (issue 19), instead of a few pseudo-random token ids. The files live in
//! `tools/workloads/` (built by `make_workloads.py` from texts written for the repository and
//! from its own sources and docs) and are compiled into the binary, so the suite runs on any
//! machine and any model: plain-text workloads are encoded with the model's tokenizer, chat
//! workloads rendered with the model's chat format (thinking off). A path to a JSON file of the
//! same shape runs a workload of one's own.

use anyhow::{bail, Context, Result};
use serde_json::Value;
use sluice_tokenizer::chat::ChatMessage;
use sluice_tokenizer::PromptFormat;
use std::path::Path;

/// The built-in workloads, by name.
const BUILTIN: &[(&str, &str)] = &[
    ("prose", include_str!("../../../tools/workloads/prose.json")),
    ("code", include_str!("../../../tools/workloads/code.json")),
    ("long", include_str!("../../../tools/workloads/long.json")),
    ("chat", include_str!("../../../tools/workloads/chat.json")),
    ("tools", include_str!("../../../tools/workloads/tools.json")),
];

/// One workload: a prompt (plain text, or a conversation) and how many tokens to generate.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Short name (`prose`, `code`, `long`, `chat`, `tools`).
    pub name: String,
    /// What it stands for.
    pub about: String,
    /// Where its text comes from.
    pub source: String,
    /// New tokens per run unless `--max-new` says otherwise.
    pub max_new: usize,
    /// Plain text to continue.
    pub text: Option<String>,
    /// A conversation to answer (rendered with the model's chat format).
    pub messages: Option<Vec<ChatMessage>>,
    /// Tool declarations (the OpenAI `tools` array) for a conversation.
    pub tools: Option<serde_json::Value>,
}

/// The names of the built-in workloads.
pub fn names() -> Vec<&'static str> {
    BUILTIN.iter().map(|(n, _)| *n).collect()
}

/// The workload `arg` names: a built-in name, or a path to a JSON file.
pub fn load(arg: &str) -> Result<Workload> {
    let (text, from) = match BUILTIN.iter().find(|(n, _)| *n == arg) {
        Some((_, t)) => ((*t).to_owned(), format!("built-in workload {arg}")),
        None if Path::new(arg).is_file() => (
            std::fs::read_to_string(arg).with_context(|| format!("reading --workload {arg}"))?,
            arg.to_owned(),
        ),
        None => bail!(
            "--workload {arg:?}: not a built-in workload ({}) nor a JSON file",
            names().join(", ")
        ),
    };
    let w = parse(&text).with_context(|| format!("parsing {from}"))?;
    if w.text.is_some() == w.messages.is_some() {
        bail!("{from}: give exactly one of \"text\" and \"messages\"");
    }
    if w.max_new == 0 {
        bail!("{from}: max_new must be at least 1");
    }
    Ok(w)
}

/// Reads a workload object; unknown keys are refused (a misspelt key must not be ignored).
fn parse(text: &str) -> Result<Workload> {
    const KEYS: [&str; 7] = ["name", "about", "source", "max_new", "text", "messages", "tools"];
    let v: Value = serde_json::from_str(text)?;
    let obj = v.as_object().context("a workload is a JSON object")?;
    if let Some(k) = obj.keys().find(|k| !KEYS.contains(&k.as_str())) {
        bail!("unknown key {k:?} (known: {})", KEYS.join(", "));
    }
    let string = |k: &str| -> Result<String> {
        obj.get(k)
            .and_then(Value::as_str)
            .map(String::from)
            .with_context(|| format!("{k:?} must be a string"))
    };
    let max_new = obj
        .get("max_new")
        .and_then(Value::as_u64)
        .and_then(|n| usize::try_from(n).ok())
        .context("\"max_new\" must be a count")?;
    let messages = match obj.get("messages") {
        Some(m) => Some(
            serde_json::from_value::<Vec<ChatMessage>>(m.clone())
                .context("\"messages\" must be a list of chat messages")?,
        ),
        None => None,
    };
    Ok(Workload {
        name: string("name")?,
        about: string("about")?,
        source: string("source")?,
        max_new,
        text: obj.contains_key("text").then(|| string("text")).transpose()?,
        messages,
        tools: obj.get("tools").cloned(),
    })
}

impl Workload {
    /// The prompt ids for a model with prompt format `fmt`.
    pub fn prompt_ids(&self, fmt: &PromptFormat) -> Result<Vec<u32>> {
        let ids = match (&self.text, &self.messages) {
            (Some(t), _) => fmt.encode_text(t)?,
            (None, Some(m)) => fmt
                .encode_conversation(m, self.tools.as_ref(), false)
                .with_context(|| format!("rendering workload {} as a chat", self.name))?,
            (None, None) => bail!("workload {} has no prompt", self.name),
        };
        if ids.is_empty() {
            bail!("workload {}: the prompt encodes to no tokens", self.name);
        }
        Ok(ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_workload_parses_and_has_one_prompt() {
        for n in names() {
            let w = load(n).expect(n);
            assert_eq!(w.name, n);
            assert!(w.text.is_some() != w.messages.is_some(), "{n}");
        }
        assert!(load("no-such-workload").is_err());
        let bad = r#"{"name":"x","about":"a","source":"s","max_new":4,"text":"t","txet":"u"}"#;
        assert!(parse(bad).is_err(), "a misspelt key is refused");
    }
}

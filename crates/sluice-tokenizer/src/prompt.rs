//! Everything a front end needs to turn user text into prompt ids and ids back into text, for
//! any family: the checkpoint's tokenizer ([`AnyTokenizer`]), its chat format (Kimi K3's XTML
//! renderer, or the checkpoint's own Jinja template), its stop ids and its output format.
//! `sluice run` calls this one place; nothing here names a family except through the files a
//! checkpoint ships.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::any::{AnyError, AnyTokenizer};
use crate::chat::{render_k3, ChatMessage, ChatOptions, Role};
use crate::chat_parser::{ChatOutputParser, TextOutputParser};
use crate::k3_output::K3OutputParser;
use crate::output::{OutputFormat, ParsedOutput};
use crate::pyjson::PyValue;
use crate::reply_grammar::{self, GrammarError, Reasoning, ReplyConstraint};
use crate::stream::TokRef;
use crate::template::{ChatTemplate, TemplateError, TemplateInputs};
use crate::tokenizer::Tokenizer;

/// Errors from [`PromptFormat`].
#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    /// The tokenizer failed to load or run.
    #[error(transparent)]
    Tokenizer(#[from] AnyError),
    /// The chat template failed to load or render.
    #[error(transparent)]
    Template(#[from] TemplateError),
    /// K3's chat renderer failed.
    #[error(transparent)]
    K3Chat(#[from] crate::Error),
    /// A chat prompt was asked of a checkpoint without a chat template.
    #[error(
        "{dir}: no chat template (chat_template.jinja, or chat_template in \
         tokenizer_config.json); run without --chat"
    )]
    NoTemplate {
        /// The checkpoint.
        dir: PathBuf,
    },
}

/// A checkpoint's tokenizer and chat conventions.
#[derive(Debug)]
pub struct PromptFormat {
    tokenizer: Arc<AnyTokenizer>,
    template: Option<ChatTemplate>,
    stop_ids: Vec<u32>,
    output: OutputFormat,
    dir: PathBuf,
}

impl PromptFormat {
    /// Loads what `dir` ships; `Ok(None)` when it has no tokenizer files.
    pub fn from_dir(dir: &Path) -> Result<Option<Self>, PromptError> {
        let Some(tokenizer) = AnyTokenizer::from_dir(dir)? else { return Ok(None) };
        // K3 renders chat in code (crate::chat); its tokenizer_config.json template is not used.
        // Kimi K2 ships a tiktoken model too, with a Jinja template of its own (tool calls in its
        // section markers) that is rendered like any other; a template that does not compile
        // or is not K2's leaves the tiktoken model to K3's code.
        let template = match tokenizer {
            AnyTokenizer::Tiktoken(_) => ChatTemplate::from_dir(dir)
                .ok()
                .flatten()
                .filter(|t| OutputFormat::detect(t.source()) == OutputFormat::KimiK2),
            AnyTokenizer::Hf(_) => ChatTemplate::from_dir(dir)?,
        };
        let output =
            template.as_ref().map_or(OutputFormat::Plain, |t| OutputFormat::detect(t.source()));
        let stop_ids = tokenizer.stop_ids(dir)?;
        let tokenizer = Arc::new(tokenizer);
        Ok(Some(Self { tokenizer, template, stop_ids, output, dir: dir.to_path_buf() }))
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &AnyTokenizer {
        &self.tokenizer
    }

    /// The tokenizer, shared (a grammar engine keeps it to encode its literals).
    pub fn shared_tokenizer(&self) -> Arc<AnyTokenizer> {
        Arc::clone(&self.tokenizer)
    }

    /// The ids generation stops at.
    pub fn stop_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    /// How to split completions into reasoning, answer and tool calls ([`OutputFormat::Plain`]
    /// for K3, whose output is parsed by the engine's K3 module).
    pub fn output_format(&self) -> OutputFormat {
        self.output
    }

    /// Prompt ids for plain text.
    pub fn encode_text(&self, text: &str) -> Result<Vec<u32>, PromptError> {
        Ok(self.tokenizer.encode(text)?)
    }

    /// Prompt ids for `text` as one user turn in the checkpoint's chat format, with the
    /// assistant turn opened. `thinking` is K3's thinking mode and the template variable
    /// `enable_thinking` (Qwen3); templates that do not read it ignore it.
    pub fn encode_user_turn(&self, text: &str, thinking: bool) -> Result<Vec<u32>, PromptError> {
        Ok(self.render_user_turn(text, thinking)?.ids)
    }

    /// [`Self::encode_user_turn`] with whether the prompt opened the think block the reply
    /// starts in (what [`Self::output_parser`] needs).
    pub fn render_user_turn(
        &self,
        text: &str,
        thinking: bool,
    ) -> Result<RenderedChat, PromptError> {
        if let Some(k3) = self.tokenizer.tiktoken().filter(|_| self.template.is_none()) {
            let msgs = [ChatMessage::new(Role::User, text)];
            let opts = ChatOptions { thinking, ..ChatOptions::default() };
            let reasoning = if thinking { Reasoning::Open } else { Reasoning::Off };
            let ids = render_k3(k3, &msgs, &opts)?;
            return Ok(RenderedChat { ids, reasoning_open: thinking, reasoning });
        }
        let template = self
            .template
            .as_ref()
            .ok_or_else(|| PromptError::NoTemplate { dir: self.dir.clone() })?;
        let message = PyValue::Dict(vec![
            ("role".into(), PyValue::Str("user".into())),
            ("content".into(), PyValue::Str(text.into())),
        ]);
        let inputs = TemplateInputs {
            add_generation_prompt: true,
            extra: vec![("enable_thinking".into(), PyValue::Bool(thinking))],
            ..TemplateInputs::default()
        };
        let rendered = template.render(&PyValue::List(vec![message]), &inputs)?;
        let (reasoning_open, reasoning) = opened_reasoning(&rendered, true, Some(thinking));
        let ids = self.tokenizer.encode_rendered(&rendered)?;
        Ok(RenderedChat { ids, reasoning_open, reasoning })
    }

    /// Prompt ids for a whole conversation (history turns, tool calls and tool results) with
    /// the assistant turn opened, and `tools` declared (the OpenAI `tools` array): what a
    /// multi-turn or tool-calling workload sends.
    pub fn encode_conversation(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        thinking: bool,
    ) -> Result<Vec<u32>, PromptError> {
        let opts = ChatOptions {
            thinking,
            thinking_explicit: true,
            tools: tools.cloned(),
            ..ChatOptions::default()
        };
        Ok(self.render_chat(messages, &opts)?.ids)
    }

    /// The K3 tokenizer when the chat format is K3's XTML (rendered in code, parsed on ids,
    /// constrainable by a grammar over its markers); `None` for a Jinja-template format.
    pub fn xtml_tokenizer(&self) -> Option<&Arc<Tokenizer>> {
        self.tokenizer.tiktoken().filter(|_| self.template.is_none())
    }

    /// Renders a chat request: K3's XTML renderer with every option, or the checkpoint's
    /// template given the messages in the OpenAI shape, `tools`, `add_generation_prompt`,
    /// `enable_thinking` and `thinking` (Qwen3, DeepSeek, Kimi K2 read them) and
    /// `reasoning_effort` (gpt-oss) when set. `tool_choice` and `response_format` have no
    /// place in those templates (the server enforces them by grammar where it can).
    pub fn render_chat(
        &self,
        messages: &[ChatMessage],
        options: &ChatOptions,
    ) -> Result<RenderedChat, PromptError> {
        if let Some(k3) = self.xtml_tokenizer() {
            let ids = render_k3(k3, messages, options)?;
            let reasoning_open = options.thinking && options.add_generation_prompt;
            let reasoning = if reasoning_open { Reasoning::Open } else { Reasoning::Off };
            return Ok(RenderedChat { ids, reasoning_open, reasoning });
        }
        let template = self
            .template
            .as_ref()
            .ok_or_else(|| PromptError::NoTemplate { dir: self.dir.clone() })?;
        // DeepSeek's template concatenates the arguments as text; the others write an object
        // with `tojson` (a string there would be encoded twice).
        let text_args = self.output == OutputFormat::DeepSeek;
        let openai: Vec<serde_json::Value> =
            messages.iter().map(|m| openai_message(m, text_args)).collect();
        let py = |v: &serde_json::Value| PyValue::parse(&v.to_string());
        // Only a thinking switch the request set reaches the template: without it the template
        // follows its own default (Qwen3 thinks, DeepSeek V3.1 does not), as in transformers.
        let mut extra = Vec::new();
        if options.thinking_explicit {
            extra.push(("enable_thinking".into(), PyValue::Bool(options.thinking)));
            extra.push(("thinking".into(), PyValue::Bool(options.thinking)));
        }
        if let Some(e) = &options.effort {
            extra.push(("reasoning_effort".into(), PyValue::Str(e.clone())));
        }
        let inputs = TemplateInputs {
            add_generation_prompt: options.add_generation_prompt,
            tools: options.tools.as_ref().filter(|t| !is_empty_list(t)).and_then(py),
            extra,
            ..TemplateInputs::default()
        };
        let msgs = py(&serde_json::Value::Array(openai)).unwrap_or(PyValue::List(Vec::new()));
        let rendered = template.render(&msgs, &inputs)?;
        let asked = options.thinking_explicit.then_some(options.thinking);
        let (reasoning_open, reasoning) =
            opened_reasoning(&rendered, options.add_generation_prompt, asked);
        let ids = self.tokenizer.encode_rendered(&rendered)?;
        Ok(RenderedChat { ids, reasoning_open, reasoning })
    }

    /// The incremental parser of a reply to a prompt [`Self::render_chat`] rendered
    /// (`reasoning_open` from it); `tools`: whether the request declared tools (and did not
    /// say `tool_choice: none`): only then is tool-call markup parsed as calls; otherwise it
    /// stays content, in every format. The parser holds a share of the tokenizer, so it may
    /// outlive this borrow (a server shares a reply's parser with the engine thread's
    /// follow-up check).
    pub fn output_parser(
        &self,
        reasoning_open: bool,
        tools: bool,
    ) -> Result<ChatOutputParser<'static>, PromptError> {
        if let Some(k3) = self.xtml_tokenizer() {
            let p = K3OutputParser::with(TokRef::Shared(Arc::clone(k3)), reasoning_open, tools)?;
            return Ok(ChatOutputParser::Xtml(Box::new(p)));
        }
        let decoder = self.tokenizer.shared_stream_decoder();
        let (format, stops) = (self.output, &self.stop_ids);
        let p = TextOutputParser::with(&self.tokenizer, decoder, format, stops, reasoning_open)
            .with_tools(tools);
        Ok(ChatOutputParser::Text(Box::new(p)))
    }

    /// A whole reply's ids split into reasoning, answer and tool calls exactly as
    /// [`Self::output_parser`] streams them (what `sluice run --chat --json` reports).
    pub fn parse_reply(
        &self,
        ids: &[u32],
        reasoning_open: bool,
        tools: bool,
    ) -> Result<ParsedOutput, PromptError> {
        let mut p = self.output_parser(reasoning_open, tools)?;
        Ok(ParsedOutput::from_events(p.parse_all(ids)))
    }

    /// The token a constrained reply ends with: the format's end of turn when generation stops
    /// at it, else the first stop id; `None` without stop ids (nothing would end the reply).
    pub fn reply_end(&self) -> Option<u32> {
        let end = match self.xtml_tokenizer() {
            Some(k3) => crate::chat::k3_stop_id(k3).ok(),
            None => reply_grammar::end_marker(self.output).and_then(|m| self.tokenizer.added_id(m)),
        };
        end.filter(|id| self.stop_ids.contains(id)).or_else(|| self.stop_ids.first().copied())
    }

    /// The grammar (llguidance's Lark dialect) of a whole reply in this checkpoint's chat
    /// format constrained to `c`, after a prompt whose reasoning is `reasoning`
    /// ([`RenderedChat::reasoning`]); the grammar engine ends it with [`Self::reply_end`].
    pub fn reply_grammar(
        &self,
        c: ReplyConstraint<'_>,
        reasoning: Reasoning,
    ) -> Result<String, GrammarError> {
        if self.xtml_tokenizer().is_some() {
            return Ok(reply_grammar::xtml_reply(c, reasoning));
        }
        reply_grammar::text_reply(self.output, &self.tokenizer, c, reasoning)
    }

    /// Decodes ids with special tokens spelled out (U+FFFD for invalid UTF-8).
    pub fn decode_lossy(&self, ids: &[u32]) -> Result<String, PromptError> {
        Ok(self.tokenizer.decode_lossy(ids)?)
    }
}

/// A rendered chat prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedChat {
    /// The prompt ids.
    pub ids: Vec<u32>,
    /// The prompt ends inside an opened think block: the reply starts with reasoning.
    pub reasoning_open: bool,
    /// Whether the reply reasons first: the prompt opened it, the prompt (or the request)
    /// closed it, or the model decides.
    pub reasoning: Reasoning,
}

/// Whether a rendered prompt opened the think block the reply continues (R1, Qwen3 thinking
/// models), and how the reply reasons; `asked`: the thinking switch the request set.
fn opened_reasoning(
    rendered: &str,
    generation_prompt: bool,
    asked: Option<bool>,
) -> (bool, Reasoning) {
    let end = rendered.trim_end();
    let open = generation_prompt && end.ends_with("<think>");
    let reasoning = if open {
        Reasoning::Open
    } else if !generation_prompt || end.ends_with("</think>") || asked == Some(false) {
        // The template closed the think block (Qwen3 with thinking off, V3.1's
        // non-thinking mode), or the request turned thinking off.
        Reasoning::Off
    } else {
        Reasoning::Optional
    };
    (open, reasoning)
}

fn is_empty_list(v: &serde_json::Value) -> bool {
    v.as_array().is_some_and(Vec::is_empty)
}

/// A message in the OpenAI chat shape that Jinja chat templates read (`tool_calls` as
/// `{id, type, function: {name, arguments}}`, arguments as an object when they parse as one,
/// unless `text_args`).
fn openai_message(m: &ChatMessage, text_args: bool) -> serde_json::Value {
    let mut v = serde_json::json!({ "role": m.role, "content": m.content });
    if !m.tool_calls.is_empty() {
        v["tool_calls"] = m
            .tool_calls
            .iter()
            .map(|c| {
                let args = serde_json::from_str::<serde_json::Value>(&c.arguments)
                    .ok()
                    .filter(|_| !text_args)
                    .unwrap_or_else(|| serde_json::Value::String(c.arguments.clone()));
                serde_json::json!({
                    "id": c.id, "type": "function",
                    "function": { "name": c.name, "arguments": args },
                })
            })
            .collect();
    }
    if let Some(r) = &m.reasoning_content {
        // Qwen3, DeepSeek and Kimi K2 templates read `reasoning_content`; gpt-oss `thinking`.
        v["reasoning_content"] = r.clone().into();
        v["thinking"] = r.clone().into();
    }
    if let Some(id) = &m.tool_call_id {
        v["tool_call_id"] = id.clone().into();
    }
    if let Some(n) = &m.name {
        v["name"] = n.clone().into();
    }
    v
}

//! What the next request of a chat conversation starts with, so that the engine keeps the
//! state after a reply only when that request can resume from it
//! ([`sluice_engine::turn::FollowUp`]).
//!
//! A chat client sends the reply back as the response gave it: reasoning, content and tool
//! calls (with the ids and arguments the response carried), which the chat format renders
//! again. The follow-up is that rendering: this request's messages with the reply appended,
//! without the generation prompt and without the messages a format writes after the last
//! message (a `tool_choice` or `response_format` message moves past the next request's new
//! messages). The reply is the one the response parsed, token by token as it was generated,
//! through the same parser and stop strings ([`SharedReply`]): it is not parsed a second time.
//!
//! When the generated ids are not a prefix of that rendering (the reply re-tokenizes
//! otherwise, a stop string cut the visible text, arguments were re-serialized, a trailing
//! message sat between the prompt and the reply) the state after generation is of no use to
//! any follow-up and is not written: for Kimi K3 that is 0.6 GB of state-cache writes per turn.

use crate::output::{Delta, Reply, SharedReply};
use sluice_engine::turn::FollowUp;
use sluice_tokenizer::{ChatMessage, ChatOptions, ChatToolCall, PromptFormat, Role, ToolCall};
use std::sync::Arc;

/// How the response names and passes the reply's tool calls (each API has its own ids).
#[derive(Debug, Clone)]
pub(crate) enum ToolIds {
    /// `/v1/chat/completions`: `call_…` ids ([`crate::response::tool_call_id`]), arguments as
    /// generated.
    OpenAi {
        /// The response id.
        response: String,
    },
    /// `/v1/messages`: `toolu_…` ids, arguments as the `input` object the client sends back.
    Anthropic {
        /// The message id.
        message: String,
    },
}

impl ToolIds {
    /// The call as the client sends it back.
    fn call(&self, c: &ChatToolCall) -> ToolCall {
        let (id, arguments) = match self {
            Self::OpenAi { response } => {
                (crate::response::tool_call_id(response, c.index), c.arguments.clone())
            }
            Self::Anthropic { message } => (
                crate::anthropic_response::tool_id(message, c),
                crate::anthropic_response::input_of(c).to_string(),
            ),
        };
        ToolCall { id: Some(id), name: c.name.clone(), arguments }
    }
}

/// A chat request's conversation, kept for rendering its follow-up.
#[derive(Debug, Clone)]
pub(crate) struct ChatEcho {
    /// The request's messages.
    pub(crate) messages: Vec<ChatMessage>,
    /// The request's rendering options.
    pub(crate) options: ChatOptions,
    /// How the response passes tool calls back.
    pub(crate) ids: ToolIds,
}

impl ChatEcho {
    /// The engine's follow-up for a job whose generated ids are parsed into `reply` (by the
    /// engine's token callback, as the response streams them), rendered through `fmt`.
    pub(crate) fn follow_up(self, fmt: Arc<PromptFormat>, reply: SharedReply) -> FollowUp {
        FollowUp::new(move |generated| {
            let whole = Reply::with(&reply, |r| r.whole(generated))?;
            self.render(&fmt, whole)
        })
    }

    /// The ids a follow-up request starts with after `reply`.
    fn render(&self, fmt: &PromptFormat, reply: Delta) -> Option<Vec<u32>> {
        let mut messages = self.messages.clone();
        messages.push(self.reply_message(reply));
        let options = ChatOptions {
            add_generation_prompt: false,
            tool_choice: None,
            response_format: None,
            ..self.options.clone()
        };
        fmt.render_chat(&messages, &options).ok().map(|r| r.ids)
    }

    /// The reply as the client sends it back.
    fn reply_message(&self, d: Delta) -> ChatMessage {
        let mut m = ChatMessage::new(Role::Assistant, d.content);
        if !d.reasoning.is_empty() {
            m.reasoning_content = Some(d.reasoning);
        }
        m.tool_calls = d.tool_calls.iter().map(|c| self.ids.call(c)).collect();
        m
    }
}

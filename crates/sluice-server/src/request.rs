//! Request bodies parsed into validated types ("parse, don't validate"): `POST /v1/completions`
//! here and the fields both endpoints share; chat messages and tools in [`crate::chat_request`].
//!
//! Every field is read through [`Obj`], so an unknown field, a wrong type, an out-of-range value
//! or a feature sluice does not implement is refused with a 400 naming the field. The list of
//! accepted fields, their ranges and defaults, and every refusal is in docs/SERVER.md.

use crate::error::ApiError;
use crate::fields::{type_name, Obj};
use serde_json::Value;
use sluice_engine::Sampling;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Server limits that validation checks against.
#[derive(Debug, Clone)]
pub struct Limits {
    /// The model id clients must name.
    pub model_id: String,
    /// Most `max_tokens` a request may ask for (and the default).
    pub max_tokens: usize,
    /// Most prompt + generated tokens.
    pub context_len: usize,
}

/// Most stop strings per request.
pub const MAX_STOPS: usize = 16;
/// Longest stop string, in bytes.
pub const MAX_STOP_BYTES: usize = 1024;
/// Most `top_logprobs` / completion `logprobs`.
pub const MAX_TOP_LOGPROBS: i64 = 20;

/// Generation controls shared by both endpoints.
#[derive(Debug, Clone)]
pub struct Common {
    /// Requested `max_tokens` / `max_completion_tokens` (checked against the context later).
    pub max_tokens: Option<usize>,
    /// Temperature, top-k, top-p, seed.
    pub sampling: Sampling,
    /// Stop strings (never shown).
    pub stop: Vec<String>,
    /// Stream with SSE.
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
}

/// A validated `POST /v1/completions`.
#[derive(Debug, Clone)]
pub struct ValidCompletion {
    /// Shared controls.
    pub common: Common,
    /// The prompt.
    pub prompt: PromptInput,
    /// `logprobs`: how many alternatives per token (`Some(0)`: only the chosen token's).
    pub logprobs: Option<usize>,
}

/// A completion prompt: text to tokenize, or token ids.
#[derive(Debug, Clone)]
pub enum PromptInput {
    /// Text, encoded as ordinary text.
    Text(String),
    /// Token ids, used as given.
    Ids(Vec<u32>),
}

/// A fresh seed for requests that give none (temperature > 0 is then not reproducible, as in the
/// OpenAI API).
fn fresh_seed() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    #[allow(clippy::cast_possible_truncation)]
    let t = nanos as u64;
    t ^ COUNTER.fetch_add(1, Ordering::Relaxed).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Checks `model` and reads the fields both endpoints share; `chat` selects the chat names.
pub fn parse_common(o: &mut Obj<'_>, limits: &Limits, chat: bool) -> Result<Common, ApiError> {
    match o.str("model")? {
        None => return Err(ApiError::invalid("model", "model is required")),
        Some(m) if m != limits.model_id => return Err(ApiError::ModelNotFound(m.to_owned())),
        Some(_) => {}
    }
    // The range a message states is this server's (`--max-tokens`), not i64's.
    let cap = i64::try_from(limits.max_tokens).unwrap_or(i64::MAX).max(1);
    let mut max_tokens = o.int("max_tokens", 1, cap)?;
    if chat {
        if let Some(m) = o.int("max_completion_tokens", 1, cap)? {
            max_tokens = Some(m);
        }
    }
    let temperature = o.num("temperature", 0.0, 2.0)?.unwrap_or(1.0);
    let top_p = o.num("top_p", 0.0, 1.0)?.unwrap_or(1.0);
    if top_p <= 0.0 {
        return Err(ApiError::invalid("top_p", "top_p must be above 0"));
    }
    let top_k = o.int("top_k", -1, i64::from(u32::MAX))?.unwrap_or(0).max(0);
    let seed = match o.value("seed") {
        None => fresh_seed(),
        Some(Value::Number(n)) if n.as_i64().is_some() || n.as_u64().is_some() => {
            // Negative seeds are valid in the OpenAI API; their two's-complement bits are the seed.
            #[allow(clippy::cast_sign_loss)]
            let s = n.as_u64().unwrap_or_else(|| n.as_i64().unwrap_or(0) as u64);
            s
        }
        Some(v) => {
            return Err(ApiError::invalid(
                "seed",
                format!("seed must be an integer, not {}", describe(v)),
            ))
        }
    };
    #[allow(clippy::cast_possible_truncation)]
    let sampling = Sampling {
        temperature: temperature as f32,
        top_k: usize::try_from(top_k).unwrap_or(usize::MAX),
        top_p: top_p as f32,
        seed,
    };
    let stop = parse_stop(o.value("stop"))?;
    let stream = o.bool("stream")?.unwrap_or(false);
    let mut include_usage = false;
    if let Some(mut so) = o.obj("stream_options")? {
        if !stream {
            return Err(ApiError::invalid(
                "stream_options",
                "stream_options is only allowed when stream is true",
            ));
        }
        include_usage = so.bool("include_usage")?.unwrap_or(false);
        so.finish()?;
    }
    if o.int("n", i64::MIN, i64::MAX)?.is_some_and(|n| n != 1) {
        return Err(ApiError::unsupported("n", "n must be 1: sluice returns one choice"));
    }
    for key in ["presence_penalty", "frequency_penalty"] {
        if o.num(key, -2.0, 2.0)?.is_some_and(|p| p != 0.0) {
            return Err(ApiError::unsupported(key, format!("{key} is not supported (only 0)")));
        }
    }
    match o.value("logit_bias") {
        None => {}
        Some(Value::Object(m)) if m.is_empty() => {}
        Some(_) => {
            return Err(ApiError::unsupported("logit_bias", "logit_bias is not supported"));
        }
    }
    // Accepted and without effect (docs/SERVER.md lists them).
    o.ignore(&["user", "metadata", "store", "service_tier"]);
    Ok(Common {
        max_tokens: max_tokens.and_then(|m| usize::try_from(m).ok()),
        sampling,
        stop,
        stream,
        include_usage,
    })
}

fn describe(v: &Value) -> String {
    match v {
        Value::Number(n) => n.to_string(),
        other => type_name(other).to_owned(),
    }
}

/// `stop`: a string or an array of strings.
fn parse_stop(v: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let items: Vec<&Value> = match v {
        None => return Ok(Vec::new()),
        Some(Value::Array(a)) => a.iter().collect(),
        Some(one) => vec![one],
    };
    if items.len() > MAX_STOPS {
        return Err(ApiError::invalid("stop", format!("at most {MAX_STOPS} stop strings")));
    }
    items
        .into_iter()
        .map(|s| match s {
            Value::String(s) if s.is_empty() => {
                Err(ApiError::invalid("stop", "stop strings must not be empty"))
            }
            Value::String(s) if s.len() > MAX_STOP_BYTES => Err(ApiError::invalid(
                "stop",
                format!("stop strings are at most {MAX_STOP_BYTES} bytes"),
            )),
            Value::String(s) => Ok(s.clone()),
            other => Err(ApiError::invalid(
                "stop",
                format!("stop must be a string or an array of strings, not {}", type_name(other)),
            )),
        })
        .collect()
}

/// Parses a `POST /v1/completions` body.
pub fn parse_completion(body: &Value, limits: &Limits) -> Result<ValidCompletion, ApiError> {
    let mut o = Obj::new(body, "")?;
    let common = parse_common(&mut o, limits, false)?;
    let prompt = parse_prompt(o.value("prompt"))?;
    let logprobs =
        o.int("logprobs", 0, MAX_TOP_LOGPROBS)?.map(|n| usize::try_from(n).unwrap_or_default());
    if o.bool("echo")? == Some(true) {
        return Err(ApiError::unsupported("echo", "echo is not supported"));
    }
    if o.str("suffix")?.is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::unsupported("suffix", "suffix (insertion) is not supported"));
    }
    if o.int("best_of", i64::MIN, i64::MAX)?.is_some_and(|b| b != 1) {
        return Err(ApiError::unsupported("best_of", "best_of must be 1"));
    }
    o.finish()?;
    Ok(ValidCompletion { common, prompt, logprobs })
}

/// `prompt`: a string, an array of one string, token ids, or an array of one id array.
fn parse_prompt(v: Option<&Value>) -> Result<PromptInput, ApiError> {
    let bad = |m: &str| ApiError::invalid("prompt", m);
    match v {
        None => Err(bad("prompt is required")),
        Some(Value::String(s)) => Ok(PromptInput::Text(s.clone())),
        Some(Value::Array(a)) if a.is_empty() => Err(bad("prompt must not be empty")),
        Some(Value::Array(a)) => match &a[0] {
            Value::String(_) | Value::Array(_) if a.len() > 1 => Err(ApiError::unsupported(
                "prompt",
                "batched prompts are not supported: send one prompt per request",
            )),
            Value::String(s) => Ok(PromptInput::Text(s.clone())),
            Value::Array(ids) => ids_of(ids).map(PromptInput::Ids),
            _ => ids_of(a).map(PromptInput::Ids),
        },
        Some(other) => Err(bad(&format!(
            "prompt must be a string or an array of token ids, not {}",
            type_name(other)
        ))),
    }
}

fn ids_of(a: &[Value]) -> Result<Vec<u32>, ApiError> {
    a.iter()
        .map(|v| {
            v.as_u64().and_then(|x| u32::try_from(x).ok()).ok_or_else(|| {
                ApiError::invalid("prompt", format!("token ids must be integers >= 0, got {v}"))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn limits() -> Limits {
        Limits { model_id: "m".into(), max_tokens: 100, context_len: 1000 }
    }

    fn err(v: Value) -> Value {
        match parse_completion(&v, &limits()) {
            Ok(r) => panic!("accepted: {r:?}"),
            Err(e) => e.body()["error"].clone(),
        }
    }

    #[test]
    fn a_plain_request_gets_the_defaults() {
        let r = parse_completion(&json!({"model": "m", "prompt": "hi", "seed": 5}), &limits())
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.common.sampling, Sampling { temperature: 1.0, top_k: 0, top_p: 1.0, seed: 5 });
        assert!(matches!(r.prompt, PromptInput::Text(ref s) if s == "hi"));
        assert_eq!((r.common.max_tokens, r.logprobs, r.common.stream), (None, None, false));
    }

    #[test]
    fn refusals_name_the_field() {
        for (body, param) in [
            (json!({"model": "m", "prompt": "x", "n": 2}), "n"),
            (json!({"model": "m", "prompt": "x", "best_of": 3}), "best_of"),
            (json!({"model": "m", "prompt": "x", "echo": true}), "echo"),
            (json!({"model": "m", "prompt": "x", "suffix": "s"}), "suffix"),
            (json!({"model": "m", "prompt": "x", "presence_penalty": 0.5}), "presence_penalty"),
            (json!({"model": "m", "prompt": "x", "logit_bias": {"1": 2}}), "logit_bias"),
            (json!({"model": "m", "prompt": "x", "temperature": 3}), "temperature"),
            (json!({"model": "m", "prompt": "x", "max_tokens": 101}), "max_tokens"),
            (json!({"model": "m", "prompt": "x", "max_tokens": "9"}), "max_tokens"),
            (json!({"model": "m", "prompt": "x", "stop": [1]}), "stop"),
            (json!({"model": "m", "prompt": "x", "stream_options": {}}), "stream_options"),
            (json!({"model": "m", "prompt": ["a", "b"]}), "prompt"),
            (json!({"model": "m", "prompt": [-1]}), "prompt"),
            (json!({"model": "m", "prompt": "x", "wat": 1}), "wat"),
            (json!({"model": "m"}), "prompt"),
        ] {
            assert_eq!(err(body.clone())["param"], json!(param), "{body}");
        }
        assert_eq!(err(json!({"model": "x", "prompt": "p"}))["code"], json!("model_not_found"));
    }

    #[test]
    fn max_tokens_said_its_upper_bound_was_i64_max() {
        for n in [0, 101] {
            let e = err(json!({"model": "m", "prompt": "x", "max_tokens": n}));
            assert_eq!(
                e["message"],
                json!(format!("max_tokens must be between 1 and 100, got {n}"))
            );
        }
    }
}

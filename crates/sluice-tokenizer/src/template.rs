//! Chat templates from a checkpoint's own Jinja (`chat_template.jinja`, or `chat_template` in
//! `tokenizer_config.json`), rendered with `minijinja` as transformers' `apply_chat_template`
//! renders them with Python `jinja2`.
//!
//! transformers compiles templates in an `ImmutableSandboxedEnvironment` with `trim_blocks`,
//! `lstrip_blocks` and the loop-controls extension, replaces `tojson` with
//! `json.dumps(x, ensure_ascii=False)` and adds the globals `raise_exception` and `strftime_now`
//! (`utils/chat_template_utils.py`, `_compile_jinja_template`). [`ChatTemplate`] sets up the same:
//! the same whitespace rules, a `tojson` that writes Python's JSON text ([`crate::pyjson`]),
//! the two globals, and `minijinja-contrib`'s pycompat so that Python string and dict methods
//! (`.startswith`, `.split`, `.lstrip('\n')`, `.items()`) work. Messages and tools are passed as
//! [`PyValue`]s, so objects keep their key order, as `json.loads` and Python dicts do.
//!
//! Goldens: `tests/fixtures/{qwen3_moe,gpt_oss}/*/chat_golden.json`, written by
//! `tools/gen_family_chat_goldens.py` with transformers; `tests/family_chat.rs` compares byte for
//! byte.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::value::Rest;
use minijinja::{Environment, ErrorKind, Value};

use crate::pyjson::{self, PyValue};

/// File name of a stand-alone chat template in a checkpoint directory (transformers ≥ 4.43 and
/// gpt-oss write it; it takes precedence over `tokenizer_config.json`'s key, as in transformers).
pub const TEMPLATE_FILE: &str = "chat_template.jinja";

/// Errors from loading or rendering a chat template.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// A file could not be read or parsed.
    #[error("cannot read the chat template from {path}: {reason}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The template does not compile.
    #[error("{path}: the chat template does not compile: {source}")]
    Compile {
        /// Where the template came from.
        path: PathBuf,
        /// minijinja's error (with the line).
        source: minijinja::Error,
    },
    /// Rendering failed, for example on the template's own `raise_exception`.
    #[error("rendering the chat template of {path}: {source}")]
    Render {
        /// Where the template came from.
        path: PathBuf,
        /// minijinja's error.
        source: minijinja::Error,
    },
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    path: PathBuf,
    /// `bos_token`, `eos_token`, ... of `tokenizer_config.json`: transformers passes the
    /// tokenizer's special tokens to every rendering (DeepSeek's template opens with
    /// `{{ bos_token }}`).
    specials: Vec<(String, String)>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("path", &self.path).finish_non_exhaustive()
    }
}

/// What one rendering gets besides the messages.
#[derive(Debug, Clone, Default)]
pub struct TemplateInputs {
    /// The OpenAI `tools` array (`None`: the template sees `tools` as none, as transformers
    /// passes it).
    pub tools: Option<PyValue>,
    /// Whether to open the assistant turn (`add_generation_prompt`).
    pub add_generation_prompt: bool,
    /// Further template variables, such as `enable_thinking` (Qwen3) or `reasoning_effort`
    /// (gpt-oss): transformers passes `apply_chat_template`'s extra keyword arguments through.
    pub extra: Vec<(String, PyValue)>,
    /// The time `strftime_now` formats, in seconds since the Unix epoch (UTC); `None`: now.
    /// transformers uses the local time; sluice uses UTC so that a server's prompts do not
    /// depend on its time zone.
    pub now_unix: Option<i64>,
}

impl ChatTemplate {
    /// The template a checkpoint ships: `dir/chat_template.jinja`, else `chat_template` in
    /// `dir/tokenizer_config.json` (a string, or a list of `{name, template}` whose `default`
    /// entry is used). `Ok(None)` when there is none.
    pub fn from_dir(dir: &Path) -> Result<Option<Self>, TemplateError> {
        let file = dir.join(TEMPLATE_FILE);
        let config = dir.join(crate::CONFIG_FILE);
        let read_err = |reason: String| TemplateError::Read { path: config.clone(), reason };
        let value: serde_json::Value = if config.exists() {
            let text = std::fs::read_to_string(&config).map_err(|e| read_err(e.to_string()))?;
            serde_json::from_str(&text).map_err(|e| read_err(e.to_string()))?
        } else {
            serde_json::Value::Null
        };
        let specials = special_tokens(&value);
        if file.exists() {
            let source = std::fs::read_to_string(&file)
                .map_err(|e| TemplateError::Read { path: file.clone(), reason: e.to_string() })?;
            return Self::new(source, file).map(|t| Some(Self { specials, ..t }));
        }
        if value.is_null() {
            return Ok(None);
        }
        let source = match value.get("chat_template") {
            None | Some(serde_json::Value::Null) => return Ok(None),
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .and_then(|t| t.get("template")?.as_str())
                .ok_or_else(|| read_err("chat_template list has no \"default\" entry".into()))?
                .to_owned(),
            Some(_) => return Err(read_err("chat_template is neither a string nor a list".into())),
        };
        Self::new(source, config).map(|t| Some(Self { specials, ..t }))
    }

    /// Compiles template text; `path` names its source in errors.
    pub fn new(source: String, path: PathBuf) -> Result<Self, TemplateError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", |message: String| -> Result<Value, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
        });
        env.add_template_owned("chat", source.clone())
            .map_err(|source| TemplateError::Compile { path: path.clone(), source })?;
        Ok(Self { env, source, path, specials: Vec::new() })
    }

    /// Where the template came from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The template text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages` (a list of message objects as in the OpenAI API) to prompt text.
    pub fn render(
        &self,
        messages: &PyValue,
        inputs: &TemplateInputs,
    ) -> Result<String, TemplateError> {
        let render_err = |source| TemplateError::Render { path: self.path.clone(), source };
        let template = self.env.get_template("chat").map_err(render_err)?;
        let now = inputs.now_unix.unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        });
        let strftime_now = Value::from_function(move |format: String| strftime(&format, now));
        let mut ctx: Vec<(String, Value)> = vec![
            ("messages".into(), to_value(messages)),
            ("tools".into(), inputs.tools.as_ref().map_or(Value::from(()), to_value)),
            ("add_generation_prompt".into(), Value::from(inputs.add_generation_prompt)),
            ("strftime_now".into(), strftime_now),
        ];
        ctx.extend(self.specials.iter().map(|(k, v)| (k.clone(), Value::from(v.as_str()))));
        ctx.extend(inputs.extra.iter().map(|(k, v)| (k.clone(), to_value(v))));
        template.render(Value::from_iter(ctx)).map_err(render_err)
    }
}

/// The special tokens `tokenizer_config.json` names (`bos_token`, `eos_token`, `unk_token`,
/// `pad_token`), each a string or an `AddedToken` object with a `content`.
fn special_tokens(config: &serde_json::Value) -> Vec<(String, String)> {
    ["bos_token", "eos_token", "unk_token", "pad_token"]
        .iter()
        .filter_map(|&k| {
            let v = config.get(k)?;
            let s = v.as_str().or_else(|| v.get("content")?.as_str())?;
            Some((k.to_owned(), s.to_owned()))
        })
        .collect()
}

/// A [`PyValue`] as a template value; objects keep their key order (minijinja's
/// `preserve_order`).
pub fn to_value(value: &PyValue) -> Value {
    match value {
        PyValue::Null => Value::from(()),
        PyValue::Bool(b) => Value::from(*b),
        PyValue::Int(i) => Value::from(*i),
        PyValue::Float(f) => Value::from(*f),
        PyValue::Str(s) => Value::from(s.as_str()),
        PyValue::List(items) => Value::from_iter(items.iter().map(to_value)),
        PyValue::Dict(entries) => {
            Value::from_iter(entries.iter().map(|(k, v)| (k.clone(), to_value(v))))
        }
    }
}

/// A template value back as a [`PyValue`] (for `tojson`).
fn from_value(value: &Value) -> Result<PyValue, minijinja::Error> {
    use minijinja::value::ValueKind;
    Ok(match value.kind() {
        ValueKind::Undefined | ValueKind::None => PyValue::Null,
        ValueKind::Bool => PyValue::Bool(value.is_true()),
        ValueKind::Number if value.is_integer() => {
            PyValue::Int(i128::try_from(value.clone()).map_err(|_| bad_json(value))?)
        }
        ValueKind::Number => PyValue::Float(f64::try_from(value.clone())?),
        ValueKind::String => PyValue::Str(value.as_str().unwrap_or_default().to_owned()),
        ValueKind::Seq | ValueKind::Iterable => {
            PyValue::List(value.try_iter()?.map(|v| from_value(&v)).collect::<Result<_, _>>()?)
        }
        ValueKind::Map => {
            let mut entries = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                let key = key.as_str().map_or_else(|| key.to_string(), str::to_owned);
                entries.push((key, from_value(&item)?));
            }
            PyValue::Dict(entries)
        }
        _ => return Err(bad_json(value)),
    })
}

fn bad_json(value: &Value) -> minijinja::Error {
    minijinja::Error::new(ErrorKind::InvalidOperation, format!("tojson cannot write {value}"))
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False)`. Its options (`indent`,
/// `separators`, `sort_keys`) are refused rather than ignored: no published template of the
/// supported families passes them, and ignoring one would silently change the prompt.
fn tojson(value: Value, rest: Rest<Value>) -> Result<Value, minijinja::Error> {
    if !rest.is_empty() {
        return Err(minijinja::Error::new(
            ErrorKind::InvalidOperation,
            "tojson options (indent, separators, sort_keys) are not supported",
        ));
    }
    // The text is data inside the prompt, never HTML: mark it safe so no escaping applies.
    Ok(Value::from_safe_string(pyjson::dumps(&from_value(&value)?)))
}

/// Python's `strftime` for the directives chat templates use (`%Y %m %d %b %B %H %M %S %%`),
/// at `unix` seconds UTC.
fn strftime(format: &str, unix: i64) -> Result<String, minijinja::Error> {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let month = MONTHS[usize::try_from(m - 1).unwrap_or(0)];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('b') => out.push_str(&month[..3]),
            Some('B') => out.push_str(month),
            Some('H') => out.push_str(&format!("{:02}", secs / 3600)),
            Some('M') => out.push_str(&format!("{:02}", secs / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", secs % 60)),
            Some('%') => out.push('%'),
            other => {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    format!("strftime_now: unsupported directive %{}", other.unwrap_or(' ')),
                ))
            }
        }
    }
    Ok(out)
}

/// Year, month (1–12), day of the proleptic Gregorian date `days` after 1970-01-01 (Howard
/// Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::{civil_from_days, strftime};

    #[test]
    fn strftime_matches_python_on_known_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        // 2026-01-15 09:30:00 UTC.
        let t = 1_768_469_400;
        assert_eq!(strftime("%Y-%m-%d", t).ok().as_deref(), Some("2026-01-15"));
        assert_eq!(
            strftime("%d %b %Y %H:%M:%S %%", t).ok().as_deref(),
            Some("15 Jan 2026 09:30:00 %")
        );
        assert!(strftime("%j", t).is_err(), "an unknown directive is an error, not a guess");
    }
}

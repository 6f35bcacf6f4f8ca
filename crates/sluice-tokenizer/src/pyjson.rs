//! JSON text exactly as the Kimi K3 chat template's Python side writes it.
//!
//! The template (`Kimi-K3.jinja`, rendered by transformers/vLLM with Python `jinja2`) prints
//! values through `tojson`, which chat-template hosts define as
//! `json.dumps(x, ensure_ascii=False)`: separators `", "` and `": "`, keys in insertion order,
//! non-ASCII kept, floats in Python `repr` form (`1e-05`, `1e+16`, `100.0`). Tool argument
//! objects come from `json.loads` of the request, so their key order is the document order;
//! [`PyValue`] keeps it (serde_json's `Value` would sort keys unless the workspace-wide
//! `preserve_order` feature were enabled). Tool declarations use the template's `json_sorted`
//! instead: compact separators with keys sorted at every level ([`write_sorted_compact`]).
//!
//! Known gap: integers beyond the `i64`/`u64` range arrive from serde_json as floats, where
//! Python would keep them exact.

use std::fmt::Write as _;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// A JSON value with Python's shape: objects keep their key order.
#[derive(Debug, Clone, PartialEq)]
pub enum PyValue {
    /// `null` / `None`.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// An integer (Python `int`).
    Int(i128),
    /// A number with a fraction or exponent (Python `float`).
    Float(f64),
    /// A string.
    Str(String),
    /// An array (Python `list`).
    List(Vec<PyValue>),
    /// An object (Python `dict`), in insertion order.
    Dict(Vec<(String, PyValue)>),
}

impl PyValue {
    /// Parses JSON text like Python's `json.loads`: key order kept, and a repeated key keeps its
    /// first position with the last value.
    pub fn parse(text: &str) -> Option<Self> {
        serde_json::from_str(text).ok()
    }

    /// Python truthiness (`None`, `False`, `0`, `0.0`, `""`, `[]` and `{}` are false).
    pub fn truthy(&self) -> bool {
        match self {
            Self::Null => false,
            Self::Bool(b) => *b,
            Self::Int(i) => *i != 0,
            Self::Float(f) => *f != 0.0,
            Self::Str(s) => !s.is_empty(),
            Self::List(v) => !v.is_empty(),
            Self::Dict(v) => !v.is_empty(),
        }
    }
}

impl From<&serde_json::Value> for PyValue {
    fn from(value: &serde_json::Value) -> Self {
        use serde_json::Value;
        match value {
            Value::Null => Self::Null,
            Value::Bool(b) => Self::Bool(*b),
            Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
                (Some(i), _, _) => Self::Int(i128::from(i)),
                (None, Some(u), _) => Self::Int(i128::from(u)),
                (None, None, f) => Self::Float(f.unwrap_or(f64::NAN)),
            },
            Value::String(s) => Self::Str(s.clone()),
            Value::Array(v) => Self::List(v.iter().map(Self::from).collect()),
            Value::Object(m) => {
                Self::Dict(m.iter().map(|(k, v)| (k.clone(), Self::from(v))).collect())
            }
        }
    }
}

struct PyValueVisitor;

impl<'de> Visitor<'de> for PyValueVisitor {
    type Value = PyValue;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_unit<E>(self) -> Result<PyValue, E> {
        Ok(PyValue::Null)
    }
    fn visit_none<E>(self) -> Result<PyValue, E> {
        Ok(PyValue::Null)
    }
    fn visit_bool<E>(self, v: bool) -> Result<PyValue, E> {
        Ok(PyValue::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<PyValue, E> {
        Ok(PyValue::Int(i128::from(v)))
    }
    fn visit_u64<E>(self, v: u64) -> Result<PyValue, E> {
        Ok(PyValue::Int(i128::from(v)))
    }
    fn visit_f64<E>(self, v: f64) -> Result<PyValue, E> {
        Ok(PyValue::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<PyValue, E> {
        Ok(PyValue::Str(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<PyValue, E> {
        Ok(PyValue::Str(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<PyValue, A::Error> {
        let mut out = Vec::new();
        while let Some(item) = seq.next_element()? {
            out.push(item);
        }
        Ok(PyValue::List(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<PyValue, A::Error> {
        let mut out: Vec<(String, PyValue)> = Vec::new();
        while let Some((key, value)) = map.next_entry::<String, PyValue>()? {
            match out.iter_mut().find(|(k, _)| *k == key) {
                Some(slot) => slot.1 = value,
                None => out.push((key, value)),
            }
        }
        Ok(PyValue::Dict(out))
    }
}

impl<'de> Deserialize<'de> for PyValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(PyValueVisitor)
    }
}

/// Python `json.dumps(value, ensure_ascii=False)`.
pub fn dumps(value: &PyValue) -> String {
    let mut out = String::new();
    write_value(value, ", ", ": ", false, &mut out);
    out
}

/// The template's `json_sorted` macro: objects with keys sorted at every level, compact
/// separators, scalars through `tojson`, arrays in order.
///
/// Keys sort by code point, as Python's `json.dumps(sort_keys=True)` (the reference encoder the
/// template says it matches) and llama.cpp's Jinja engine do. Python `jinja2`'s `dictsort` is
/// case-insensitive by default, so stock jinja2 orders keys differing only by case differently.
pub fn write_sorted_compact(value: &PyValue, out: &mut String) {
    write_value(value, ",", ":", true, out);
}

fn write_value(value: &PyValue, item_sep: &str, key_sep: &str, sort: bool, out: &mut String) {
    match value {
        PyValue::Null => out.push_str("null"),
        PyValue::Bool(true) => out.push_str("true"),
        PyValue::Bool(false) => out.push_str("false"),
        PyValue::Int(i) => {
            let _ = write!(out, "{i}");
        }
        PyValue::Float(f) => out.push_str(&float_repr(*f)),
        PyValue::Str(s) => write_str(s, out),
        PyValue::List(items) => {
            out.push('[');
            for (k, item) in items.iter().enumerate() {
                if k > 0 {
                    out.push_str(item_sep);
                }
                write_value(item, item_sep, key_sep, sort, out);
            }
            out.push(']');
        }
        PyValue::Dict(entries) => {
            let mut refs: Vec<&(String, PyValue)> = entries.iter().collect();
            if sort {
                refs.sort_by(|a, b| a.0.cmp(&b.0));
            }
            out.push('{');
            for (k, (key, item)) in refs.into_iter().enumerate() {
                if k > 0 {
                    out.push_str(item_sep);
                }
                write_str(key, out);
                out.push_str(key_sep);
                write_value(item, item_sep, key_sep, sort, out);
            }
            out.push('}');
        }
    }
}

/// A JSON string literal as Python's `json` writes it with `ensure_ascii=False`.
fn write_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python `float.__repr__` (shortest round-trip digits; exponent form below 1e-4 and from 1e16),
/// with `json`'s spellings of the non-finite values.
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    // Rust's `{:e}` gives the shortest round-trip digits, like Python's repr: "d.ddde[-]x".
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let sign = if f.is_sign_negative() { "-" } else { "" };
    if !(-4..16).contains(&exp) {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() { String::new() } else { format!(".{rest}") };
        let esign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{first}{frac}e{esign}{:02}", exp.abs());
    }
    // Fixed notation: the decimal point sits after `exp + 1` digits.
    let point = exp + 1;
    let n = i32::try_from(digits.len()).unwrap_or(i32::MAX);
    let body = if point <= 0 {
        let zeros = "0".repeat(usize::try_from(-point).unwrap_or(0));
        format!("0.{zeros}{digits}")
    } else if point >= n {
        let zeros = "0".repeat(usize::try_from(point - n).unwrap_or(0));
        format!("{digits}{zeros}.0")
    } else {
        let (int, frac) = digits.split_at(usize::try_from(point).unwrap_or(0));
        format!("{int}.{frac}")
    };
    format!("{sign}{body}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_like_python_repr() {
        let cases = [
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1.0, "1.0"),
            (100.0, "100.0"),
            (0.1, "0.1"),
            (1e-4, "0.0001"),
            (1e-5, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (123.456, "123.456"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.2345e16, "1.2345e+16"),
            (1.5e300, "1.5e+300"),
            (-2.5e-10, "-2.5e-10"),
            (0.30000000000000004, "0.30000000000000004"),
            (5e-324, "5e-324"),
            (f64::MAX, "1.7976931348623157e+308"),
        ];
        for (f, want) in cases {
            assert_eq!(float_repr(f), want);
        }
    }

    #[test]
    fn dumps_keeps_order_and_python_spacing() {
        let v =
            PyValue::parse(r#"{"b": [1, 2.0, "x\n\u0001é"], "a": {"z": null, "y": true}, "b": 3}"#)
                .expect("json");
        assert_eq!(dumps(&v), r#"{"b": 3, "a": {"z": null, "y": true}}"#);
        let mut sorted = String::new();
        write_sorted_compact(&v, &mut sorted);
        assert_eq!(sorted, r#"{"a":{"y":true,"z":null},"b":3}"#);
        let s = PyValue::Str("q\"\\\t\u{7f}\u{1f}".into());
        assert_eq!(dumps(&s), "\"q\\\"\\\\\\t\u{7f}\\u001f\"");
    }
}

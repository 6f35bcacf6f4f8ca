//! Typed access to the fields of a JSON object, with errors that name the field by its path
//! (`messages[1].tool_calls[0].function.name`), and a final check that refuses every field the
//! caller did not read — so nothing a client sends is silently ignored.
//!
//! JSON `null` reads as absent, as the OpenAI API treats it.

use crate::error::ApiError;
use serde_json::{Map, Value};

/// A JSON object being read.
#[derive(Debug)]
pub struct Obj<'a> {
    map: &'a Map<String, Value>,
    path: String,
    read: Vec<&'a str>,
}

/// The JSON type of `v`, for messages.
pub fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

impl<'a> Obj<'a> {
    /// `v` as an object at `path` (empty for the request body).
    pub fn new(v: &'a Value, path: &str) -> Result<Self, ApiError> {
        match v {
            Value::Object(map) => Ok(Self { map, path: path.to_owned(), read: Vec::new() }),
            other => Err(ApiError::invalid(
                if path.is_empty() { "body" } else { path },
                format!(
                    "{} must be a JSON object, not {}",
                    if path.is_empty() { "the request body" } else { path },
                    type_name(other)
                ),
            )),
        }
    }

    /// The path of field `key`.
    pub fn param(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    /// The raw value of `key` (`None` when absent or null); marks it read.
    pub fn value(&mut self, key: &str) -> Option<&'a Value> {
        let (k, v) = self.map.get_key_value(key)?;
        self.read.push(k.as_str());
        (!v.is_null()).then_some(v)
    }

    fn wrong(&self, key: &str, want: &str, got: &Value) -> ApiError {
        ApiError::invalid(
            self.param(key),
            format!("{} must be {want}, not {}", self.param(key), type_name(got)),
        )
    }

    /// A string field.
    pub fn str(&mut self, key: &str) -> Result<Option<&'a str>, ApiError> {
        match self.value(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.wrong(key, "a string", v)),
        }
    }

    /// A boolean field.
    pub fn bool(&mut self, key: &str) -> Result<Option<bool>, ApiError> {
        match self.value(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.wrong(key, "a boolean", v)),
        }
    }

    /// A number field within `[lo, hi]`.
    pub fn num(&mut self, key: &str, lo: f64, hi: f64) -> Result<Option<f64>, ApiError> {
        match self.value(key) {
            None => Ok(None),
            Some(Value::Number(n)) => match n.as_f64() {
                Some(x) if (lo..=hi).contains(&x) => Ok(Some(x)),
                _ => Err(ApiError::invalid(
                    self.param(key),
                    format!("{} must be between {lo} and {hi}, got {n}", self.param(key)),
                )),
            },
            Some(v) => Err(self.wrong(key, "a number", v)),
        }
    }

    /// An integer field within `[lo, hi]`.
    pub fn int(&mut self, key: &str, lo: i64, hi: i64) -> Result<Option<i64>, ApiError> {
        match self.value(key) {
            None => Ok(None),
            Some(Value::Number(n)) => match n.as_i64() {
                Some(x) if (lo..=hi).contains(&x) => Ok(Some(x)),
                _ if n.is_f64() => Err(ApiError::invalid(
                    self.param(key),
                    format!("{} must be an integer, got {n}", self.param(key)),
                )),
                _ => Err(ApiError::invalid(
                    self.param(key),
                    format!("{} must be between {lo} and {hi}, got {n}", self.param(key)),
                )),
            },
            Some(v) => Err(self.wrong(key, "an integer", v)),
        }
    }

    /// An array field.
    pub fn array(&mut self, key: &str) -> Result<Option<&'a Vec<Value>>, ApiError> {
        match self.value(key) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a)),
            Some(v) => Err(self.wrong(key, "an array", v)),
        }
    }

    /// An object field.
    pub fn obj(&mut self, key: &str) -> Result<Option<Obj<'a>>, ApiError> {
        match self.value(key) {
            None => Ok(None),
            Some(v) => Obj::new(v, &self.param(key)).map(Some),
        }
    }

    /// Reads fields that are accepted and have no effect (documented in docs/SERVER.md).
    pub fn ignore(&mut self, keys: &[&str]) {
        for k in keys {
            let _ = self.value(k);
        }
    }

    /// Refuses the first field that was not read.
    pub fn finish(self) -> Result<(), ApiError> {
        match self.map.keys().find(|k| !self.read.contains(&k.as_str())) {
            None => Ok(()),
            Some(k) => Err(ApiError::unsupported(
                self.param(k),
                format!("Unrecognized or unsupported field: {}", self.param(k)),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn typed_reads_name_the_path_and_unread_fields_are_refused() {
        let v = json!({"a": 1, "b": "x", "c": null, "d": {"e": 2.5}, "z": true});
        let mut o = Obj::new(&v, "").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(o.int("a", 0, 5).ok().flatten(), Some(1));
        assert!(o.int("b", 0, 5).is_err());
        assert_eq!(o.str("c").ok().flatten(), None);
        let mut d = o.obj("d").ok().flatten().unwrap_or_else(|| panic!("object"));
        let e = d.int("e", 0, 5).expect_err("2.5 is not an integer");
        assert!(e.to_string().contains("d.e must be an integer"), "{e}");
        let err = o.finish().expect_err("z was not read");
        assert_eq!(err.body()["error"]["param"], json!("z"));
        let top = Obj::new(&json!([1]), "").expect_err("array body");
        assert_eq!(top.body()["error"]["param"], json!("body"));
    }

    #[test]
    fn out_of_range_and_huge_numbers_are_refused() {
        let v = json!({"t": 1e308, "n": 18446744073709551615u64, "m": -1});
        let mut o = Obj::new(&v, "").unwrap_or_else(|e| panic!("{e}"));
        assert!(o.num("t", 0.0, 2.0).is_err());
        assert!(o.int("n", 1, 100).is_err());
        assert!(o.int("m", 1, 100).is_err());
    }
}

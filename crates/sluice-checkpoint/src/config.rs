//! Reading `config.json` generically.
//!
//! Checkpoints ship their configuration in one of two forms:
//!
//! - the multimodal form, as the Kimi K3 release does: top-level `architectures:
//!   ["KimiK3ForConditionalGeneration"]`, `model_type: "kimi_k3"`, and the language model's
//!   settings inside a `text_config` object (next to a `vision_config`);
//! - the bare text form: the language model's settings at top level.
//!
//! [`CheckpointConfig`] hides the difference: [`CheckpointConfig::text_config`] is the
//! language model's settings in either form. It stays untyped on purpose — each model port
//! deserializes its own typed config from that value — and only checks what every consumer
//! needs: the file parses, the top level is an object, and an `architectures` list exists to
//! pick the model implementation from.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::{CheckpointError, Result};

/// File name of the model configuration inside a checkpoint directory.
pub const CONFIG_FILE: &str = "config.json";

/// Key of the nested language-model configuration in the multimodal form.
const TEXT_CONFIG_KEY: &str = "text_config";

/// A parsed `config.json`: the raw document plus the few fields every consumer needs.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointConfig {
    path: PathBuf,
    raw: Value,
    has_text_config: bool,
    architectures: Vec<String>,
}

impl CheckpointConfig {
    /// Reads `config.json` from the checkpoint directory `dir`.
    ///
    /// Fails with [`CheckpointError::MissingConfig`] when the file does not exist.
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join(CONFIG_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => Self::from_slice(path, &bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(CheckpointError::MissingConfig { dir: dir.to_path_buf() })
            }
            Err(e) => Err(CheckpointError::io(path, e)),
        }
    }

    /// Parses config JSON from bytes; `path` names the source in errors.
    pub fn from_slice(path: impl Into<PathBuf>, bytes: &[u8]) -> Result<Self> {
        let path = path.into();
        match serde_json::from_slice(bytes) {
            Ok(raw) => Self::from_value(path, raw),
            Err(source) => Err(CheckpointError::BadJson { path, source }),
        }
    }

    /// Validates an already parsed config document; `path` names the source in errors.
    pub fn from_value(path: impl Into<PathBuf>, raw: Value) -> Result<Self> {
        let path = path.into();
        let bad = |reason: &str| CheckpointError::BadStructure {
            path: path.clone(),
            reason: reason.to_owned(),
        };
        let top = raw.as_object().ok_or_else(|| bad("config.json is not a JSON object"))?;
        let text = match top.get(TEXT_CONFIG_KEY) {
            None | Some(Value::Null) => None,
            Some(Value::Object(map)) => Some(map),
            Some(_) => return Err(bad("\"text_config\" is not a JSON object")),
        };
        let list = match (top.get("architectures"), text.and_then(|t| t.get("architectures"))) {
            (Some(list), _) if !list.is_null() => list,
            (_, Some(list)) if !list.is_null() => list,
            _ => return Err(CheckpointError::MissingArchitectures { path }),
        };
        let Some(items) = list.as_array() else {
            return Err(bad("\"architectures\" is not a list"));
        };
        let architectures = items
            .iter()
            .map(|a| a.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad("\"architectures\" holds a non-string entry"))?;
        if architectures.is_empty() {
            return Err(CheckpointError::MissingArchitectures { path });
        }
        Ok(Self { has_text_config: text.is_some(), path, raw, architectures })
    }

    /// The file this config was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The whole document as written.
    pub fn raw(&self) -> &Value {
        &self.raw
    }

    /// The language model's configuration: `text_config` in the multimodal form, the top
    /// level in the bare form. Model ports deserialize their typed config from this.
    pub fn text_config(&self) -> &Value {
        if self.has_text_config {
            if let Some(text) = self.raw.get(TEXT_CONFIG_KEY) {
                return text;
            }
        }
        &self.raw
    }

    /// True for the multimodal form (a `text_config` object is present).
    pub fn is_multimodal(&self) -> bool {
        self.has_text_config
    }

    /// The `architectures` list: the top level's, or `text_config`'s when the top level has
    /// none. Never empty.
    pub fn architectures(&self) -> &[String] {
        &self.architectures
    }

    /// The first architecture, which selects the model implementation.
    pub fn architecture(&self) -> &str {
        self.architectures.first().map_or("", String::as_str)
    }

    /// `model_type` at top level (`"kimi_k3"` for the K3 release), falling back to
    /// `text_config`'s when the top level has none.
    pub fn model_type(&self) -> Option<&str> {
        self.raw.get("model_type").and_then(Value::as_str).or_else(|| self.text_model_type())
    }

    /// `model_type` of the language-model config (`"kimi_linear"` inside K3's `text_config`).
    pub fn text_model_type(&self) -> Option<&str> {
        self.text_config().get("model_type").and_then(Value::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn multimodal_form_exposes_text_config() {
        let raw = json!({
            "architectures": ["KimiK3ForConditionalGeneration"],
            "model_type": "kimi_k3",
            "text_config": {
                "architectures": ["KimiLinearForCausalLM"],
                "model_type": "kimi_linear",
                "hidden_size": 7168
            }
        });
        let cfg = CheckpointConfig::from_value("config.json", raw).expect("valid config");
        assert!(cfg.is_multimodal());
        assert_eq!(cfg.architecture(), "KimiK3ForConditionalGeneration");
        assert_eq!(cfg.model_type(), Some("kimi_k3"));
        assert_eq!(cfg.text_model_type(), Some("kimi_linear"));
        assert_eq!(cfg.text_config()["hidden_size"], 7168);
    }

    #[test]
    fn bare_form_is_its_own_text_config() {
        let raw = json!({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64});
        let cfg = CheckpointConfig::from_value("config.json", raw).expect("valid config");
        assert!(!cfg.is_multimodal());
        assert_eq!(cfg.text_config()["hidden_size"], 64);
        assert_eq!(cfg.model_type(), Some("qwen3"));
    }

    #[test]
    fn architectures_fall_back_to_text_config() {
        let raw = json!({"text_config": {"architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear"}});
        let cfg = CheckpointConfig::from_value("config.json", raw).expect("valid config");
        assert_eq!(cfg.architectures(), ["KimiLinearForCausalLM".to_owned()]);
        assert_eq!(cfg.model_type(), Some("kimi_linear"));
    }

    #[test]
    fn structural_errors_name_the_file() {
        for raw in [
            json!([1, 2]),
            json!({"architectures": "X"}),
            json!({"architectures": [1]}),
            json!({"architectures": ["X"], "text_config": 3}),
        ] {
            let err = CheckpointConfig::from_value("/m/config.json", raw).expect_err("must fail");
            assert!(matches!(err, CheckpointError::BadStructure { .. }), "{err:?}");
            assert!(err.to_string().contains("/m/config.json"), "{err}");
        }
        for raw in [json!({}), json!({"architectures": []}), json!({"text_config": {}})] {
            let err = CheckpointConfig::from_value("/m/config.json", raw).expect_err("must fail");
            assert!(matches!(err, CheckpointError::MissingArchitectures { .. }), "{err:?}");
        }
    }
}

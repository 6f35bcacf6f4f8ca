//! Qwen3 (dense) behind the family boundary: [`crate::family::FamilyModel`] through
//! [`crate::family::family_model`], which forwards to the inherent methods and keeps the
//! trait's defaults for routed experts and a placed spine (it has neither); what is Qwen3's own
//! is its shape and the bytes a pass reads.

use super::Qwen3;
use crate::family::{family_model, Shape};
use crate::qwen3::Qwen3State;

family_model!(dense Qwen3, "qwen3", Qwen3State;
    fn shape(&self) -> Shape {
        let c = self.config();
        Shape {
            layers: c.num_hidden_layers,
            hidden: c.hidden_size,
            vocab: c.vocab_size,
            heads: c.num_attention_heads,
            kv_heads: c.num_key_value_heads,
            experts_per_token: 0,
        }
    }
    fn spine_bytes_per_pass(&self) -> u64 {
        self.weight_bytes()
    }
);

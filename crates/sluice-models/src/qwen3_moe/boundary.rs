//! Qwen3-MoE behind the family boundary: [`crate::family::FamilyModel`] through
//! [`crate::family::family_model`], which forwards to the inherent methods; what is Qwen3-MoE's
//! own is its shape and the bytes a pass reads.

use super::Qwen3Moe;
use crate::family::{family_model, Shape};
use crate::qwen3::Qwen3State;

family_model!(served Qwen3Moe, "qwen3_moe", Qwen3State;
    fn shape(&self) -> Shape {
        let c = self.config();
        Shape {
            layers: c.base.num_hidden_layers,
            hidden: c.base.hidden_size,
            vocab: c.base.vocab_size,
            heads: c.base.num_attention_heads,
            kv_heads: c.base.num_key_value_heads,
            experts_per_token: c.num_experts_per_tok,
        }
    }
    fn spine_bytes_per_pass(&self) -> u64 {
        self.dense_weight_bytes()
    }
);

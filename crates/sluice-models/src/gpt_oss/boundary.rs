//! GPT-OSS behind the family boundary: [`crate::family::FamilyModel`] through
//! [`crate::family::family_model`], which forwards to the inherent methods; what is GPT-OSS's
//! own is its shape and the bytes a pass reads.

use super::GptOss;
use crate::family::{family_model, Shape};
use crate::qwen3::Qwen3State;

family_model!(served GptOss, "gpt_oss", Qwen3State;
    fn shape(&self) -> Shape {
        let c = self.config();
        Shape {
            layers: c.num_hidden_layers,
            hidden: c.hidden_size,
            vocab: c.vocab_size,
            heads: c.num_attention_heads,
            kv_heads: c.num_key_value_heads,
            experts_per_token: c.num_experts_per_tok,
        }
    }
    fn spine_bytes_per_pass(&self) -> u64 {
        self.dense_weight_bytes()
    }
);

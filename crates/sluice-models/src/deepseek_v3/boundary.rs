//! DeepSeek-V3 behind the family boundary: [`crate::family::FamilyModel`] through
//! [`crate::family::family_model`], which forwards to the inherent methods. Its state is Kimi
//! K3's state of MLA layers; what is its own is its shape, the bytes a pass reads and the
//! format its spine is published in.

use super::DeepseekV3;
use crate::family::{family_model, Shape};
use crate::kimi_k3::state::K3State;

family_model!(served DeepseekV3, "deepseek_v3", K3State;
    fn shape(&self) -> Shape {
        let c = self.config();
        Shape {
            layers: c.num_hidden_layers,
            hidden: c.hidden_size,
            vocab: c.vocab_size,
            heads: c.num_attention_heads,
            kv_heads: c.num_attention_heads,
            experts_per_token: c.num_experts_per_tok,
        }
    }
    fn spine_format(&self) -> &'static str {
        DeepseekV3::spine_format(self)
    }
    fn spine_bytes_per_pass(&self) -> u64 {
        self.dense_weight_bytes()
    }
);

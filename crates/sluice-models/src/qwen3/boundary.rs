//! Qwen3 (dense) behind the family boundary: [`FamilyModel`] by delegation to the inherent methods.

use super::Qwen3;
use crate::family::{FamilyModel, MemoryNeeds, Shape, Trace};
use crate::qwen3::Qwen3State;
use crate::{LogitRows, ModelError, State};
use std::any::Any;

/// The family table's name of Qwen3 (dense).
const NAME: &str = "qwen3";

impl FamilyModel for Qwen3 {
    fn family(&self) -> &'static str {
        NAME
    }
    fn new_state(&self) -> State {
        State::new(NAME, Qwen3::new_state(self))
    }
    fn forward(
        &self,
        state: &mut State,
        tokens: &[u32],
        rows: LogitRows,
        trace: Option<&mut Trace>,
    ) -> Result<Vec<f32>, ModelError> {
        Qwen3::forward(self, state.family_mut::<Qwen3State>(NAME)?, tokens, rows, trace)
    }
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
    fn memory_needs(&self) -> Option<MemoryNeeds> {
        Some(Qwen3::memory_needs(self))
    }
    fn spine_bytes_per_pass(&self) -> u64 {
        self.weight_bytes()
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

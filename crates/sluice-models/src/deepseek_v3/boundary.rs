//! DeepSeek-V3 behind the family boundary: [`FamilyModel`] by delegation to the inherent
//! methods. Its state is Kimi K3's state of MLA layers.

use super::DeepseekV3;
use crate::family::{FamilyModel, MemoryNeeds, RoutedExperts, Shape, Trace};
use crate::kimi_k3::state::K3State;
use crate::{LogitRows, ModelError, State};
use sluice_store::{ExpertStore, SpineIndex, SpineStats, SpineStore};
use std::any::Any;
use std::sync::Arc;

/// The family table's name of DeepSeek-V3.
const NAME: &str = "deepseek_v3";

impl FamilyModel for DeepseekV3 {
    fn family(&self) -> &'static str {
        NAME
    }
    fn new_state(&self) -> State {
        State::new(NAME, DeepseekV3::new_state(self))
    }
    fn forward(
        &self,
        state: &mut State,
        tokens: &[u32],
        rows: LogitRows,
        trace: Option<&mut Trace>,
    ) -> Result<Vec<f32>, ModelError> {
        DeepseekV3::forward(self, state.family_mut::<K3State>(NAME)?, tokens, rows, trace)
    }
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
    fn routed_experts(&self) -> Option<RoutedExperts> {
        Some(DeepseekV3::routed_experts(self))
    }
    fn set_experts(&mut self, store: Arc<dyn ExpertStore>) {
        DeepseekV3::set_experts(self, store);
    }
    fn set_prefetch(&mut self, on: bool) {
        DeepseekV3::set_prefetch(self, on);
    }
    fn experts(&self) -> Option<&Arc<dyn ExpertStore>> {
        Some(DeepseekV3::experts(self))
    }
    fn memory_needs(&self) -> Option<MemoryNeeds> {
        Some(DeepseekV3::memory_needs(self))
    }
    fn spine_format(&self) -> &'static str {
        DeepseekV3::spine_format(self)
    }
    fn spine_index(&self) -> Result<Option<SpineIndex>, ModelError> {
        DeepseekV3::spine_index(self).map(Some)
    }
    fn spine_small_bytes(&self) -> u64 {
        DeepseekV3::spine_small_bytes(self)
    }
    fn set_spine(&mut self, store: Arc<SpineStore>) -> Result<(), ModelError> {
        DeepseekV3::set_spine(self, store)
    }
    fn spine_stats(&self) -> SpineStats {
        DeepseekV3::spine_stats(self)
    }
    fn spine_bytes_per_pass(&self) -> u64 {
        self.dense_weight_bytes()
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

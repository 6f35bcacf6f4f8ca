//! Kimi K3 behind the family boundary: [`FamilyModel`] by delegation to the inherent methods,
//! and the table line's check, which stops short of mapping the routed experts (a stream
//! install has none).

use super::config::K3Config;
use super::inventory::inventory;
use super::state::{K3State, LayerShape};
use super::working::{pass_bytes_per_row, prefill_bytes_per_row};
use super::{weights::K3Weights, KimiK3, Trace};
use crate::family::{self, Checked, FamilyModel, MemoryNeeds, RoutedExperts, Shape};
use crate::{LogitRows, ModelError, State, StateShape};
use sluice_checkpoint::Checkpoint;
use sluice_store::{ExpertStore, SpineIndex, SpineStats, SpineStore};
use std::any::Any;
use std::sync::Arc;

/// The family table's name of Kimi K3.
const NAME: &str = "kimi_k3";

/// Kimi K3's line of [`crate::check`]: config, the routed experts' index and the spine, in the
/// order loading for `run` meets them (so both name the same first problem), never mapping the
/// routed experts.
pub fn check(ckpt: &Checkpoint) -> Result<Checked, ModelError> {
    let family = family::of(ckpt)?;
    let cfg = K3Config::from_json(ckpt.config().text_config())?;
    KimiK3::expert_index(ckpt, &cfg)?;
    K3Weights::load(ckpt, &cfg)?;
    Ok(Checked { family, k3: Some(Box::new(cfg)) })
}

impl FamilyModel for KimiK3 {
    fn family(&self) -> &'static str {
        NAME
    }
    fn new_state(&self) -> State {
        State::new(NAME, KimiK3::new_state(self))
    }
    fn state_shape(&self) -> StateShape {
        crate::snapshot::k3_shape_of(&LayerShape::of_config(self.config()), NAME)
    }
    fn forward(
        &self,
        state: &mut State,
        tokens: &[u32],
        rows: LogitRows,
        trace: Option<&mut Trace>,
    ) -> Result<Vec<f32>, ModelError> {
        KimiK3::forward(self, state.family_mut::<K3State>(NAME)?, tokens, rows, trace)
    }
    fn shape(&self) -> Shape {
        let c = self.config();
        Shape {
            layers: c.num_hidden_layers,
            hidden: c.hidden_size,
            vocab: c.vocab_size,
            heads: c.num_attention_heads,
            kv_heads: c.num_attention_heads,
            experts_per_token: c.num_experts_per_token,
        }
    }
    fn routed_experts(&self) -> Option<RoutedExperts> {
        Some(KimiK3::routed_experts(self))
    }
    fn set_experts(&mut self, store: Arc<dyn ExpertStore>) {
        KimiK3::set_experts(self, store);
    }
    fn set_prefetch(&mut self, on: bool) {
        KimiK3::set_prefetch(self, on);
    }
    fn experts(&self) -> Option<&Arc<dyn ExpertStore>> {
        Some(KimiK3::experts(self))
    }
    /// From the inventory: the spine, the KDA states (fixed) and the MLA latents (per
    /// position), and the working memory of a pass row.
    fn memory_needs(&self) -> Option<MemoryNeeds> {
        let inv = inventory(&self.ckpt, self.config());
        Some(MemoryNeeds {
            spine: inv.spine_bytes,
            state_fixed: inv.kda_state_bytes,
            state_per_position: inv.mla_bytes_per_token,
            pass_per_row: pass_bytes_per_row(self.config()),
            prefill_per_row: prefill_bytes_per_row(self.config()),
        })
    }
    fn spine_index(&self) -> Result<Option<SpineIndex>, ModelError> {
        KimiK3::spine_index(self).map(Some)
    }
    fn spine_small_bytes(&self) -> u64 {
        KimiK3::spine_small_bytes(self)
    }
    fn set_spine(&mut self, store: Arc<SpineStore>) -> Result<(), ModelError> {
        KimiK3::set_spine(self, store)
    }
    fn spine_stats(&self) -> SpineStats {
        KimiK3::spine_stats(self)
    }
    fn spine_bytes_per_pass(&self) -> u64 {
        KimiK3::spine_bytes_per_pass(self)
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

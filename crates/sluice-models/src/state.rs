//! The sequence state behind the family boundary: [`FamilyState`], what every family's state
//! does (transactions, size, compact snapshots), and [`State`], the boxed state the rest of
//! sluice holds without knowing its family.
//!
//! A state remembers the family of the model that made it, so that a model handed another
//! family's state refuses it with [`ModelError::StateMismatch`], naming both, instead of
//! misreading it: two families may share a state type (DeepSeek-V3 keeps its MLA latents in
//! Kimi K3's state, Qwen3-MoE and GPT-OSS their keys and values in Qwen3's) while their layers
//! differ. The family's forward pass takes its concrete state with [`State::family_mut`], once
//! per pass.

use crate::snapshot::{StateShape, StateSnapshot};
use crate::ModelError;
use std::any::Any;

/// What a family's sequence state does; [`State`] holds one, boxed.
///
/// Implemented by the state types the families share (`kimi_k3::state::K3State`,
/// `qwen3::Qwen3State`, in [`crate::snapshot`], which knows their layers); a family with a new
/// kind of state implements it in its folder, snapshot included.
pub trait FamilyState: Any + Send + Sync + std::fmt::Debug {
    /// Publishes the first `n` rows of the staged pass.
    fn commit(&mut self, n: usize);
    /// Discards the staged pass.
    fn rollback(&mut self);
    /// Committed positions.
    fn len(&self) -> usize;
    /// True before any position is committed.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Bytes held.
    fn byte_len(&self) -> usize;
    /// A copy, boxed (for `Clone` of [`State`]).
    fn clone_box(&self) -> Box<dyn FamilyState>;
    /// A compact snapshot of the committed positions (see [`crate::snapshot`]), sharing `base`'s
    /// cache rows where `base` is an earlier point of this state's history.
    fn snapshot(&self, base: Option<&StateSnapshot>, family: &'static str) -> StateSnapshot;
    /// Bytes a snapshot would hold with nothing shared.
    fn snapshot_bytes(&self) -> usize;
    /// The shape snapshots of this state have (for [`StateSnapshot::decode`]).
    fn shape(&self, family: &'static str) -> StateShape;
    /// Becomes a state of `positions` committed positions of values drawn from `seed`, with
    /// the same shapes (see [`State::fill_synthetic`]).
    fn fill_synthetic(&mut self, positions: usize, seed: u64);
    /// Whether this state can capture itself at rows inside a pass
    /// ([`FamilyState::request_captures`]); a state that cannot (the default) makes the engine
    /// cut its prefill passes at the points it snapshots instead.
    fn can_capture(&self) -> bool {
        false
    }
    /// Asks the next pass to capture the state after each of `offsets` (its rows, ascending,
    /// each inside the pass: 1 ≤ offset < T), to be taken with [`FamilyState::take_captures`]
    /// before the pass is committed. Returns false, requesting nothing, when this state cannot
    /// capture (the default).
    fn request_captures(&mut self, _offsets: &[usize]) -> bool {
        false
    }
    /// The captures the last pass made, as snapshots of `len() + offset` positions in offset
    /// order, the first sharing `base`'s cache rows and each later one the previous one's;
    /// called after the pass and before its commit. Clears the request either way (empty when
    /// nothing was requested or the pass failed).
    fn take_captures(
        &mut self,
        _base: Option<&StateSnapshot>,
        _family: &'static str,
    ) -> Vec<StateSnapshot> {
        Vec::new()
    }
    /// The state as `Any`, for [`State::family_ref`].
    fn as_any(&self) -> &dyn Any;
    /// The state as `Any`, for [`State::family_mut`].
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// Sequence state of any supported family: the family's state, boxed, and the family of the
/// model that made it.
#[derive(Debug)]
pub struct State {
    inner: Box<dyn FamilyState>,
    family: &'static str,
}

impl Clone for State {
    fn clone(&self) -> Self {
        Self { inner: self.inner.clone_box(), family: self.family }
    }
}

impl State {
    /// Wraps `state`, made by a model of `family` (its name in the family table).
    pub fn new(family: &'static str, state: impl FamilyState) -> Self {
        Self { inner: Box::new(state), family }
    }

    /// The family of the model that made this state.
    pub fn family(&self) -> &'static str {
        self.family
    }

    /// Publishes the first `n` rows of the staged pass.
    pub fn commit(&mut self, n: usize) {
        self.inner.commit(n);
    }

    /// Discards the staged pass.
    pub fn rollback(&mut self) {
        self.inner.rollback();
    }

    /// Committed positions.
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    /// True before any position is committed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held.
    pub fn byte_len(&self) -> usize {
        self.inner.byte_len()
    }

    /// A snapshot of the committed positions (a staged pass is left out). When `base` is a
    /// snapshot of an earlier point of this same state's history, its cache rows are shared
    /// rather than copied.
    pub fn snapshot(&self, base: Option<&StateSnapshot>) -> StateSnapshot {
        self.inner.snapshot(base, self.family)
    }

    /// Bytes a snapshot of this state would hold with nothing shared.
    pub fn snapshot_bytes(&self) -> usize {
        self.inner.snapshot_bytes()
    }

    /// The shape snapshots of this state have (for [`StateSnapshot::decode`]).
    pub fn shape(&self) -> StateShape {
        self.inner.shape(self.family)
    }

    /// Whether this state can capture itself inside a pass (see [`crate::Model::forward_capturing`]).
    pub fn can_capture(&self) -> bool {
        self.inner.can_capture()
    }

    /// Asks the next pass to capture the state after each of `offsets` (see
    /// [`FamilyState::request_captures`]); false when this state cannot.
    pub(crate) fn request_captures(&mut self, offsets: &[usize]) -> bool {
        self.inner.request_captures(offsets)
    }

    /// The captures of the last pass, as snapshots sharing `base`'s rows (see
    /// [`FamilyState::take_captures`]).
    pub(crate) fn take_captures(&mut self, base: Option<&StateSnapshot>) -> Vec<StateSnapshot> {
        self.inner.take_captures(base, self.family)
    }

    /// Becomes a state of `positions` committed positions whose values are drawn from `seed`
    /// instead of computed, with the shapes of the model that made it: what a state of that
    /// length costs to store and restore, for benchmarks (`sluice bench --snapshot-io
    /// --model`); never for generation.
    pub fn fill_synthetic(&mut self, positions: usize, seed: u64) {
        self.inner.fill_synthetic(positions, seed);
    }

    /// The concrete state of a model of `family`, or [`ModelError::StateMismatch`] naming
    /// both families when this state was made by another family's model (or is not a `T`).
    pub fn family_ref<T: FamilyState>(&self, family: &'static str) -> Result<&T, ModelError> {
        let found = self.family;
        match self.inner.as_any().downcast_ref::<T>() {
            Some(s) if found == family => Ok(s),
            _ => Err(ModelError::StateMismatch { model: family, state: found }),
        }
    }

    /// [`State::family_ref`], mutably: what a family's forward pass calls, once per pass.
    pub fn family_mut<T: FamilyState>(
        &mut self,
        family: &'static str,
    ) -> Result<&mut T, ModelError> {
        let found = self.family;
        match self.inner.as_any_mut().downcast_mut::<T>() {
            Some(s) if found == family => Ok(s),
            _ => Err(ModelError::StateMismatch { model: family, state: found }),
        }
    }
}

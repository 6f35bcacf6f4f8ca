//! sluice-models (in progress).

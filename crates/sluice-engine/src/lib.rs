//! sluice-engine (in progress).

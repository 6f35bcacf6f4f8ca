//! sluice-checkpoint (in progress).

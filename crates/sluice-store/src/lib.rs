//! sluice-store (in progress).

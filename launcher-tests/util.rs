//! Shared test utilities (to be written).

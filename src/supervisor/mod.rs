//! supervisor (to be written).

//! Command-line definition of every torchrun 2.15 flag (both spellings, PET_* fallback).
//! Parse only: no I/O and no resolution against the machine (that is `config.rs`).

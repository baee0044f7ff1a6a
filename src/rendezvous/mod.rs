//! rendezvous (to be written).

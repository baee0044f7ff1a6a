//! Cluster detection: reading what a scheduler put in the environment. So far only the
//! Slurm hostlist grammar ([`hostlist`]); the readers and the topology follow.

pub mod hostlist;

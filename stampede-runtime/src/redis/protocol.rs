//! The protocol: what a key's calls do in Redis (the scripts and the operations that run them,
//! the lock and its watchdog, the flow of a group of keys, tags, a cache's clear, the tier the
//! core calls, and the companion's calls), on the transport.

pub(in crate::redis) mod calls;
pub(in crate::redis) mod clear;
pub(in crate::redis) mod flow;
pub(in crate::redis) mod lock;
pub(in crate::redis) mod ops;
pub(in crate::redis) mod preflight;
pub(in crate::redis) mod scripts;
pub(in crate::redis) mod shapes;
pub(in crate::redis) mod tags;
pub(in crate::redis) mod tier;

//! What tests the core without a Redis: the fake shared tier (`fake_tier`, Redis's semantics in
//! memory, several caches over one store standing for several processes), the core's unit
//! tests over it (`core_tests`), and the driver of the deterministic simulation (`sim`, which
//! `tests/simulation.rs` reaches through the `simulation` feature).

#[cfg(test)]
mod core_tests;
pub(crate) mod fake_tier;
#[cfg(feature = "simulation")]
pub mod sim;

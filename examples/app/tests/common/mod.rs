//! Helpers shared by this package's tests: bounded waits, and a `redis-server` of their own.
#![allow(dead_code)] // each test file uses its own subset

/// The workspace's bounded waits and test `redis-server` (package `stampede-test-support`,
/// shared with the facade's tests).
#[allow(unused_imports)] // each test file uses its own subset
pub use stampede_test_support::{WAIT, redis_server, within};

pub mod processes;

//! Helpers shared by this package's tests: bounded waits, and a `redis-server` of their own.
#![allow(dead_code)] // each test file uses its own subset

/// The workspace's test `redis-server` (package `stampede-test-support`, shared with the
/// facade's tests).
#[allow(unused_imports)] // each test file uses its own subset
pub use stampede_test_support::redis_server;

pub mod processes;

use std::future::Future;
use std::time::Duration;

/// The bound on any single wait in a test: a hang fails the test instead of stalling the suite.
pub const WAIT: Duration = Duration::from_secs(30);

/// Awaits `future`, failing the test if it takes longer than [`WAIT`].
pub async fn within<F: Future>(future: F) -> F::Output {
    match tokio::time::timeout(WAIT, future).await {
        Ok(output) => output,
        Err(_) => panic!("a wait in this test did not finish within {WAIT:?}"),
    }
}

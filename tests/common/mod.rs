//! Helpers shared by the integration tests.
#![allow(dead_code)] // each test file uses its own subset

#[allow(unused_imports)] // each test file uses its own subset
pub use stampede_test_support::{fault_proxy, redis_server};

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

/// Waits until `condition` holds, checking every millisecond, failing the test after [`WAIT`].
/// Under a paused clock the millisecond sleeps let tokio advance time while the test waits.
pub async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let waited = tokio::time::timeout(WAIT, async {
        while !condition() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "timed out waiting for: {what}");
}

/// The error type of the test functions: a database failure, or the cache's own error.
///
/// It is `Clone`, so `From<stampede::Error>` can hand every caller the original error of a
/// failed load, as the README recommends.
#[derive(Clone, Debug)]
pub enum AppError {
    Db(String),
    Cache(stampede::Error),
}

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AppError::Db(message) => write!(f, "database: {message}"),
            AppError::Cache(message) => write!(f, "cache: {message}"),
        }
    }
}

impl From<stampede::Error> for AppError {
    fn from(error: stampede::Error) -> Self {
        match error.upstream::<AppError>() {
            Some(original) => original.clone(),
            None => AppError::Cache(error),
        }
    }
}

//! Helpers shared by the integration tests.
#![allow(dead_code)] // each test file uses its own subset

#[allow(unused_imports)] // each test file uses its own subset
pub use stampede_test_support::{
    WAIT, eventually, fault_proxy, monitor, redis_server, until, within,
};

pub mod telemetry;

/// The misses of the cache `name` so far (calls that found no servable value in memory and
/// waited for a load or a read), 0 before its first call.
pub fn misses(name: &str) -> u64 {
    stampede::stats(name).map_or(0, |stats| stats.misses)
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

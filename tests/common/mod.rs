//! Helpers shared by the integration tests.
#![allow(dead_code)] // each test file uses its own subset

#[allow(unused_imports)] // each test file uses its own subset
pub use stampede_test_support::{WAIT, eventually, fault_proxy, redis_server, within};

pub mod telemetry;

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

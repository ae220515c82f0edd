//! The error of the example repositories, shared by `user_repository.rs` and
//! `product_repository.rs`.

use std::fmt;
use std::sync::Arc;

/// The repository's error. It is `Clone` so that every caller that shared a failed load gets
/// the original error back (see `From<stampede::Error>`).
#[derive(Clone, Debug)]
pub enum RepoError {
    /// The database failed; `sqlx::Error` is not `Clone`, so its message is kept.
    Db(Arc<str>),
    /// The cache failed: the load timed out or panicked.
    Cache(stampede::Error),
}

impl fmt::Display for RepoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RepoError::Db(message) => write!(f, "database: {message}"),
            RepoError::Cache(error) => write!(f, "cache: {error}"),
        }
    }
}

impl std::error::Error for RepoError {}

impl From<sqlx::Error> for RepoError {
    fn from(error: sqlx::Error) -> Self {
        RepoError::Db(error.to_string().into())
    }
}

impl From<stampede::Error> for RepoError {
    fn from(error: stampede::Error) -> Self {
        match error.upstream::<RepoError>() {
            Some(original) => original.clone(),
            None => RepoError::Cache(error),
        }
    }
}

//! The SQLite plumbing both example repositories share ([`user_repository`](crate::user_repository),
//! [`product_repository`](crate::product_repository)): their error, and the in-memory database
//! they open.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};

/// An in-memory database on one connection that lives as long as the pool (an in-memory SQLite
/// database belongs to its connection).
pub async fn in_memory_pool() -> Result<SqlitePool, RepoError> {
    let options = SqliteConnectOptions::from_str("sqlite::memory:")?;
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .min_connections(1)
        .idle_timeout(None)
        .max_lifetime(None)
        .connect_with(options)
        .await?;
    Ok(pool)
}

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

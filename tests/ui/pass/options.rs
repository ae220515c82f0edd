// Options that name functions, written as bare paths; a batch function with them.

use std::collections::HashMap;
use std::time::Duration;

#[derive(Debug, Clone)]
struct AppError(String);

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<stampede::Error> for AppError {
    fn from(error: stampede::Error) -> Self {
        AppError(error.to_string())
    }
}

fn transient(error: &AppError) -> bool {
    error.0.contains("timeout")
}

#[derive(Clone)]
struct Row {
    version: u64,
    max_age: Duration,
}

fn row_version(row: &Row) -> u64 {
    row.version
}

fn max_age(row: &Row) -> Duration {
    row.max_age
}

#[stampede::cached(ttl = "60s", retries = 2, retry_if = transient, source_version = row_version, ttl_from = max_age)]
async fn row(id: u64) -> Result<Row, AppError> {
    Ok(Row { version: id, max_age: Duration::from_secs(5) })
}

#[stampede::cached(ttl = "60s", batch = ids, retry_if = transient, source_version = row_version, ttl_from = max_age, missing_ttl = "5s")]
async fn rows(ids: Vec<u64>) -> Result<HashMap<u64, Row>, AppError> {
    Ok(ids.into_iter().map(|id| (id, Row { version: id, max_age: Duration::from_secs(5) })).collect())
}

// The single-key functions of the batch's cache: a declaration, an empty body, `unreachable!()`.
#[stampede::cached(batch_loader = rows)]
async fn declared_row(id: u64) -> Result<Option<Row>, AppError>;

#[stampede::cached(batch_loader = rows)]
async fn empty_row(id: u64) -> Result<Option<Row>, AppError> {}

#[stampede::cached(batch_loader = rows, batch_window = "2ms")]
async fn unreachable_row(id: u64) -> Result<Option<Row>, AppError> {
    unreachable!()
}

// The cache of a function returning `Option` stores the `Option`: its version is read from it.
fn maybe_row_version(row: &Option<Row>) -> u64 {
    row.as_ref().map_or(0, |row| row.version)
}

#[stampede::cached(ttl = "60s", source_version = maybe_row_version)]
async fn maybe_row(id: u64) -> Result<Option<Row>, AppError> {
    Ok(Some(Row { version: id, max_age: Duration::from_secs(5) }))
}

#[stampede::cached(ttl = "1s", stale = "1h", long_windows = true)]
async fn meant(id: u64) -> u64 {
    id
}

fn main() {}

use std::collections::HashMap;

#[derive(Debug)]
struct AppError;

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("app error")
    }
}

impl From<stampede::Error> for AppError {
    fn from(_: stampede::Error) -> Self {
        AppError
    }
}

#[derive(Clone)]
struct Row {
    version: u64,
}

fn row_version(row: &Row) -> u64 {
    row.version
}

fn narrow_version(row: &Row) -> u32 {
    row.version as u32
}

// The cache stores what the function returns, `Option` and all: the version is read from an
// `&Option<Row>`, not from a `&Row`.
#[stampede::cached(ttl = "60s", source_version = row_version)]
async fn maybe_row(id: u64) -> Result<Option<Row>, AppError> {
    Ok(Some(Row { version: id }))
}

#[stampede::cached(ttl = "60s", source_version = "narrow_version")]
async fn row(id: u64) -> Row {
    Row { version: id }
}

#[stampede::cached(ttl = "60s", source_version = row_version)]
async fn name(id: u64) -> String {
    id.to_string()
}

// A batch function's version is read from each value of its map.
#[stampede::cached(ttl = "60s", batch = ids, source_version = row_version)]
async fn names(ids: Vec<u64>) -> HashMap<u64, String> {
    ids.into_iter().map(|id| (id, id.to_string())).collect()
}

fn main() {}

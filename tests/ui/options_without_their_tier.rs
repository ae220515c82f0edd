//! Options that the cache's lock or backend gives nothing to act on.

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

#[stampede::cached(ttl = "60s", lock = "none", fail_safe = "1h", soft_timeout = "100ms")]
async fn soft_without_a_lock(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

#[stampede::cached(ttl = "60s", backend = "redis", fail_safe = "1h", fail_safe_throttle = "5s")]
async fn throttle_without_memory(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

#[stampede::cached(ttl = "60s", backend = "redis", capacity = 100)]
async fn capacity_without_memory(id: u64) -> u64 {
    id
}

fn main() {}

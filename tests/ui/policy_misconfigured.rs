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

#[stampede::cached(ttl = "60s", refresh_after = "90s")]
async fn past_ttl(id: u64) -> u64 {
    id
}

#[stampede::cached(ttl = "60s", soft_timeout = "100ms")]
async fn soft_without_fail_safe(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

#[stampede::cached(ttl = "60s", breaker_cooldown = "10s")]
async fn cooldown_without_breaker(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

fn transient(_: &AppError) -> bool {
    true
}

#[stampede::cached(ttl = "60s", retry_if = "transient")]
async fn nothing_to_retry(id: u64) -> u64 {
    id
}

fn wrong_signature(_: u64) -> bool {
    true
}

#[stampede::cached(ttl = "60s", retry_if = "wrong_signature")]
async fn retry_if_of_another_type(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

fn main() {}

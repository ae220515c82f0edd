#[derive(Clone)]
struct Report {
    rows: Vec<u64>,
}

#[derive(Clone, serde::Serialize)]
struct Summary {
    total: u64,
}

#[derive(Clone, Debug)]
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

#[stampede::cached(ttl = "60s", lock = "redis")]
async fn report(id: u64) -> Report {
    Report { rows: vec![id] }
}

#[stampede::cached(ttl = "60s", backend = "tiered")]
async fn summary(id: u64) -> Result<Summary, AppError> {
    Ok(Summary { total: id })
}

fn main() {}

//! Shapes that compile with the Redis tier: the lock, both Redis backends, a named connection,
//! the busy policies, serde values and keys (a `&str` among them), a method on `&self`.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Product {
    pub id: u64,
    pub name: String,
}

#[derive(Clone, Debug)]
pub struct AppError(pub String);

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

#[stampede::cached(ttl = "60s", stale = "30s", lock = "redis")]
pub async fn product(id: u64) -> Result<Product, AppError> {
    Ok(Product { id, name: format!("product {id}") })
}

#[stampede::cached(ttl = "60s", lock = "redis", backend = "redis", redis = "sessions", busy = "error")]
pub async fn session(token: &str) -> Result<Option<u64>, AppError> {
    Ok(token.parse().ok())
}

#[stampede::cached(ttl = "5s", backend = "tiered", lock = "local")]
pub async fn ranking(category: String, page: u32) -> Vec<u64> {
    vec![u64::from(page); category.len()]
}

#[derive(Clone)]
pub struct Catalog;

impl Catalog {
    #[stampede::cached(ttl = "60s", lock = "redis", busy = "compute", key = "{id}")]
    pub async fn title(&self, id: u64, trace: &str) -> String {
        format!("title {id} ({trace})")
    }
}

fn main() -> Result<(), stampede::Error> {
    stampede::RedisConfig::new("redis://127.0.0.1:6379/")?.install_as("sessions");
    let _ = (product(1), session("7"), ranking("books".into(), 1), Catalog.title(1, "t"));
    Ok(())
}

//! Shapes that compile: free functions, `&self` methods, borrowed arguments, `Option` and
//! `Result` returns (also through an alias, and with a boxed error), key templates, a native
//! async fn in a trait.

use std::sync::Arc;

#[derive(Clone, Debug)]
pub enum AppError {
    Cache(stampede::Error),
}

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

impl From<stampede::Error> for AppError {
    fn from(error: stampede::Error) -> Self {
        AppError::Cache(error)
    }
}

type AppResult<T> = Result<T, AppError>;

#[stampede::cached(ttl = "60s", jitter = 0, stale = "5s", timeout = "1s", retries = 2, backoff = "10ms")]
pub async fn product(id: u64) -> Result<Arc<str>, AppError> {
    Ok(Arc::from(format!("product {id}")))
}

#[stampede::cached(ttl = "60s")]
pub async fn through_alias(id: u64) -> AppResult<u64> {
    Ok(id)
}

#[stampede::cached(ttl = "60s")]
pub async fn boxed_error(id: u64) -> Result<u64, Box<dyn std::error::Error + Send + Sync>> {
    Ok(id)
}

#[stampede::cached(ttl = "60s", key = "search:{query}", capacity = 100, name = "search")]
pub async fn search(request_id: &str, query: &str, limit: usize) -> Option<Vec<String>> {
    let _ = (request_id, limit);
    Some(vec![query.to_owned()])
}

#[derive(Clone)]
pub struct Repo {
    pool: Arc<String>,
}

impl Repo {
    #[stampede::cached(ttl = "60s", lock = "none")]
    pub async fn user(&self, id: u64) -> String {
        format!("{}/{id}", self.pool)
    }

    /// The names the expansion binds are hygienic: an argument may take one of them.
    #[stampede::cached(ttl = "60s", key = "{__stampede_key}")]
    pub async fn hygienic(&self, __stampede_key: u64, __stampede_receiver: &str) -> String {
        format!("{}/{__stampede_key}/{__stampede_receiver}", self.pool)
    }
}

trait Catalog {
    async fn title(&self, id: u32) -> String;
}

impl Catalog for Repo {
    #[stampede::cached(ttl = "60s")]
    async fn title(&self, id: u32) -> String {
        format!("{}/{id}", self.pool)
    }
}

fn main() {}

//! Methods of an `#[async_trait]` impl, next to `#[tracing::instrument]` in either order; the
//! trait stays object safe.

use std::collections::HashMap;
use std::sync::Arc;

#[async_trait::async_trait]
pub trait Users: Send + Sync {
    async fn name(&self, id: u64) -> Option<String>;
    async fn traced(&self, id: u64) -> u64;
    async fn traced_inside(&self, id: u64) -> u64;
}

#[async_trait::async_trait]
pub trait Prices: Send + Sync {
    async fn prices(&self, ids: Vec<u64>) -> HashMap<u64, u64>;
    async fn price(&self, id: u64) -> Option<u64>;
}

#[derive(Clone)]
pub struct Db;

// A single-key function of a batch method's cache: `#[async_trait]` needs a body, left empty.
#[stampede::companions]
#[async_trait::async_trait]
impl Prices for Db {
    #[stampede::cached(ttl = "60s", batch = ids, companion = true)]
    async fn prices(&self, ids: Vec<u64>) -> HashMap<u64, u64> {
        ids.into_iter().map(|id| (id, id * 100)).collect()
    }

    #[stampede::cached(batch_loader = Self::prices)]
    async fn price(&self, id: u64) -> Option<u64> {}
}

#[async_trait::async_trait]
impl Users for Db {
    #[stampede::cached(ttl = "60s")]
    async fn name(&self, id: u64) -> Option<String> {
        Some(format!("user {id}"))
    }

    #[tracing::instrument(skip(self))]
    #[stampede::cached(ttl = "60s")]
    async fn traced(&self, id: u64) -> u64 {
        id
    }

    #[stampede::cached(ttl = "60s")]
    #[tracing::instrument(skip(self))]
    async fn traced_inside(&self, id: u64) -> u64 {
        id
    }
}

fn main() {
    let _users: Arc<dyn Users> = Arc::new(Db);
}

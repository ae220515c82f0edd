//! Methods of an `#[async_trait]` impl, next to `#[tracing::instrument]` in either order; the
//! trait stays object safe.

use std::sync::Arc;

#[async_trait::async_trait]
pub trait Users: Send + Sync {
    async fn name(&self, id: u64) -> Option<String>;
    async fn traced(&self, id: u64) -> u64;
    async fn traced_inside(&self, id: u64) -> u64;
}

#[derive(Clone)]
pub struct Db;

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

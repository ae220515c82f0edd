use std::collections::HashMap;

#[stampede::cached(ttl = "60s", batch = ids)]
async fn products(ids: Vec<u64>) -> HashMap<u64, String> {
    ids.into_iter().map(|id| (id, format!("product {id}"))).collect()
}

// The calls of `product` are calls of `products`'s cache: this body would never run.
#[stampede::cached(batch_loader = products)]
async fn product(id: u64) -> Option<String> {
    let mut found = products(vec![id]).await;
    found.remove(&id)
}

#[async_trait::async_trait]
pub trait Prices: Send + Sync {
    async fn prices(&self, ids: Vec<u64>) -> HashMap<u64, u64>;
    async fn price(&self, id: u64) -> Option<u64>;
}

#[derive(Clone)]
pub struct Db;

#[stampede::companions]
#[async_trait::async_trait]
impl Prices for Db {
    #[stampede::cached(ttl = "60s", batch = ids, companion = true)]
    async fn prices(&self, ids: Vec<u64>) -> HashMap<u64, u64> {
        ids.into_iter().map(|id| (id, id * 100)).collect()
    }

    #[stampede::cached(batch_loader = Self::prices)]
    async fn price(&self, id: u64) -> Option<u64> {
        Some(id * 100)
    }
}

fn main() {}

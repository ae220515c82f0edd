//! Warming a cache before traffic arrives: load 10,000 keys through the function's companion,
//! at most 64 at a time (what the database can take), then serve them all from memory.
//!
//! ```sh
//! cargo run -p stampede-quickstart --example warm_up
//! ```
//!
//! `product::refresh(id)` loads one key now and stores it, sharing the load with any caller
//! already waiting for that key; `product::prime(id, value)` stores a value you already have
//! (a bulk query's rows, a snapshot), without loading.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

static QUERIES: AtomicUsize = AtomicUsize::new(0);

#[stampede::cached(name = "warm_up::product", ttl = "10m", capacity = 20_000)]
async fn product(id: u64) -> String {
    QUERIES.fetch_add(1, SeqCst);
    tokio::time::sleep(Duration::from_millis(2)).await; // the query
    format!("product #{id}")
}

/// Loads every key of `ids`, at most `concurrency` at once.
async fn warm_up(ids: impl IntoIterator<Item = u64>, concurrency: usize) {
    let permits = Arc::new(Semaphore::new(concurrency));
    let mut loads = JoinSet::new();
    for id in ids {
        let permit = permits.clone().acquire_owned().await.expect("never closed");
        loads.spawn(async move {
            product::refresh(id).await;
            drop(permit);
        });
    }
    while loads.join_next().await.is_some() {}
}

#[tokio::main]
async fn main() {
    let started = Instant::now();
    warm_up(0..10_000, 64).await;
    println!(
        "warmed 10,000 keys in {:.2?} ({} queries, 64 at a time)",
        started.elapsed(),
        QUERIES.load(SeqCst)
    );

    let started = Instant::now();
    for id in 0..10_000 {
        product(id).await;
    }
    let stats = stampede::stats("warm_up::product").expect("the cache exists");
    println!(
        "then 10,000 calls in {:.2?}: {} hits, {} queries in all",
        started.elapsed(),
        stats.hits,
        QUERIES.load(SeqCst)
    );
}

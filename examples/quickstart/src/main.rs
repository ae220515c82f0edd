//! The stampede, and what `#[cached]` does about it, on the in-memory default: no services
//! needed. Run it with `cargo run -p stampede-quickstart`.
//!
//! The README's quickstart, grown to show a stale value served while it refreshes. It needs
//! `stampede` and `tokio` with the `macros`, `rt-multi-thread` and `time` features, nothing else.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use tokio::time::Instant;

/// How many times the "database" was queried.
static QUERIES: AtomicUsize = AtomicUsize::new(0);

/// A product lookup whose query takes 200ms. Fresh for 2s (no jitter, to keep the timeline
/// below exact), then served stale for up to 10s more while one refresh runs in the background.
#[stampede::cached(name = "product", ttl = "2s", jitter = 0, stale = "10s")]
async fn product(id: u64) -> String {
    let version = QUERIES.fetch_add(1, SeqCst) + 1;
    tokio::time::sleep(Duration::from_millis(200)).await; // the slow query
    format!("product #{id}, price list v{version}")
}

#[tokio::main]
async fn main() {
    println!("1. A cold key: 1,000 requests arrive at once.");
    let started = Instant::now();
    let requests: Vec<_> = (0..1_000).map(|_| tokio::spawn(product(42))).collect();
    let mut answers = Vec::with_capacity(requests.len());
    for request in requests {
        answers.push(request.await.expect("a request task failed"));
    }
    let all_same = answers.iter().all(|answer| *answer == answers[0]);
    println!(
        "   {} requests answered in {}ms",
        answers.len(),
        started.elapsed().as_millis()
    );
    println!("   every request got \"{}\": {all_same}", answers[0]);
    println!(
        "   database queries: {} (without the cache: 1000)",
        QUERIES.load(SeqCst)
    );

    println!();
    println!("2. The value goes stale after 2s; waiting 2s 100ms...");
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    let asked = Instant::now();
    let stale = product(42).await;
    println!(
        "   next request answered in {}us with the stale value: \"{stale}\"",
        asked.elapsed().as_micros()
    );
    for _ in 0..99 {
        product(42).await;
    }
    println!("   99 more requests during the refresh, all served at once");
    tokio::time::sleep(Duration::from_millis(300)).await;
    println!(
        "   meanwhile one refresh ran: database queries now {}",
        QUERIES.load(SeqCst)
    );
    println!("   a request now gets: \"{}\"", product(42).await);

    // The cache is named by `name = "product"`; without it, `module_path!()::product`.
    let stats = stampede::stats("product").expect("called above");
    println!();
    println!(
        "stats: {} hits, {} misses, {} stale served, {} loads, {} callers shared a load",
        stats.hits, stats.misses, stats.stale_served, stats.loads, stats.shared
    );
}

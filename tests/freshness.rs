//! When a value is fresh, stale or gone, on a paused clock: stale-while-revalidate and jitter.

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use common::{eventually, within};
use stampede::cached;
use tokio::time::Instant;

#[tokio::test(start_paused = true)]
async fn a_stale_value_is_served_at_once_while_one_refresh_runs() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "10s", jitter = 0, stale = "60s", name = "fresh::swr")]
    async fn price(sku: u64) -> String {
        let version = LOADS.fetch_add(1, SeqCst) + 1;
        tokio::time::sleep(Duration::from_secs(1)).await;
        format!("sku {sku} v{version}")
    }

    assert_eq!(within(price(1)).await, "sku 1 v1");
    tokio::time::advance(Duration::from_secs(10)).await; // exactly at the end of the fresh time

    let start = Instant::now();
    for _ in 0..100 {
        assert_eq!(within(price(1)).await, "sku 1 v1");
    }
    assert_eq!(start.elapsed(), Duration::ZERO, "stale calls never wait");
    assert_eq!(stampede::stats("fresh::swr").unwrap().stale_served, 100);

    eventually("the refresh to finish", || {
        LOADS.load(SeqCst) == 2 && stampede::stats("fresh::swr").unwrap().in_flight == 0
    })
    .await;
    let stats = stampede::stats("fresh::swr").unwrap();
    assert_eq!(
        (stats.refreshes, stats.loads),
        (1, 2),
        "one refresh for 100 stale calls"
    );
    assert_eq!(within(price(1)).await, "sku 1 v2");

    // Past the fresh time and the stale window, a call waits for a new load.
    tokio::time::advance(Duration::from_secs(70)).await;
    let start = Instant::now();
    assert_eq!(within(price(1)).await, "sku 1 v3");
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(1),
        "the call waited for the load"
    );
}

/// Fills `keys` at the same instant, then steps the clock and records the step at which each
/// key first needed a new load: its expiry, to the step.
async fn expiries<F, Fut>(
    keys: u64,
    step: Duration,
    steps: u32,
    call: F,
    loads: &AtomicUsize,
) -> Vec<Duration>
where
    F: Fn(u64) -> Fut,
    Fut: std::future::Future<Output = u64>,
{
    for key in 0..keys {
        within(call(key)).await;
    }
    assert_eq!(loads.load(SeqCst), keys as usize);
    let start = Instant::now();
    let mut live: BTreeSet<u64> = (0..keys).collect();
    let mut expired = Vec::new();
    for _ in 0..steps {
        tokio::time::advance(step).await;
        for key in live.clone() {
            let before = loads.load(SeqCst);
            within(call(key)).await;
            if loads.load(SeqCst) > before {
                expired.push(start.elapsed());
                live.remove(&key);
            }
        }
    }
    assert!(live.is_empty(), "{} keys never expired", live.len());
    expired
}

#[tokio::test(start_paused = true)]
async fn jitter_spreads_expirations_across_the_band_below_the_ttl() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "100s", jitter = 50, name = "fresh::jitter50")]
    async fn row(id: u64) -> u64 {
        LOADS.fetch_add(1, SeqCst);
        id
    }

    let expired = expiries(300, Duration::from_secs(1), 101, row, &LOADS).await;
    let earliest = expired.iter().min().unwrap();
    let latest = expired.iter().max().unwrap();
    assert!(
        *earliest >= Duration::from_secs(50),
        "a key expired before ttl/2: {earliest:?}"
    );
    assert!(
        *latest <= Duration::from_secs(100),
        "a key outlived the ttl: {latest:?}"
    );
    let distinct: BTreeSet<_> = expired.iter().collect();
    assert!(
        distinct.len() >= 30,
        "300 expirations fell on only {} of the 50 seconds",
        distinct.len()
    );
    let first_half = expired
        .iter()
        .filter(|d| **d <= Duration::from_secs(75))
        .count();
    assert!(
        (90..=210).contains(&first_half),
        "{first_half} of 300 expired in the first half of the band"
    );
}

#[tokio::test(start_paused = true)]
async fn without_jitter_every_key_expires_at_the_ttl() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "100s", jitter = 0, name = "fresh::jitter0")]
    async fn row(id: u64) -> u64 {
        LOADS.fetch_add(1, SeqCst);
        id
    }

    let expired = expiries(300, Duration::from_secs(1), 101, row, &LOADS).await;
    assert!(
        expired.iter().all(|d| *d == Duration::from_secs(100)),
        "{expired:?}"
    );
}

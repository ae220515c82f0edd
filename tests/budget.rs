//! The process's refresh budget (a binary of its own: the budget is process-wide): background
//! refreshes of stale values run a few at a time, stale calls are served at once meanwhile, and
//! a miss never waits behind them.

mod common;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use common::within;
use stampede::cached;
use tokio::time::Instant;

/// Loads of the 500 stale keys running now, and the most that ever ran at once.
static RUNNING: AtomicUsize = AtomicUsize::new(0);
static MOST: AtomicUsize = AtomicUsize::new(0);
static VERSION: AtomicU64 = AtomicU64::new(1);

#[cached(ttl = "10s", jitter = 0, stale = "1000s", name = "budget::value")]
async fn value(key: u64) -> String {
    let refresh = key < 500 && VERSION.load(SeqCst) == 2;
    if refresh {
        let now = RUNNING.fetch_add(1, SeqCst) + 1;
        MOST.fetch_max(now, SeqCst);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    if refresh {
        RUNNING.fetch_sub(1, SeqCst);
    }
    format!("{key} v{}", VERSION.load(SeqCst))
}

#[tokio::test(start_paused = true)]
async fn a_refresh_budget_bounds_background_refreshes_but_never_a_miss() {
    stampede::set_max_refreshes(4);
    let fills: Vec<_> = (0..500).map(|key| tokio::spawn(value(key))).collect();
    for fill in fills {
        within(fill).await.unwrap();
    }
    tokio::time::advance(Duration::from_secs(11)).await; // every key stale
    VERSION.store(2, SeqCst);

    let started = Instant::now();
    for key in 0..500 {
        assert_eq!(within(value(key)).await, format!("{key} v1"));
    }
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "every stale call is served at once"
    );
    // A miss while 496 refreshes wait their turn: it runs at once.
    let miss = Instant::now();
    assert_eq!(within(value(10_000)).await, "10000 v2");
    assert_eq!(miss.elapsed(), Duration::from_secs(1));

    // 125 s of refreshes, 4 at a time (`within` bounds each wait at 30 s of paused time).
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_secs(20)).await;
    }
    assert_eq!(MOST.load(SeqCst), 4, "never more than the budget at once");
    for key in 0..500 {
        assert_eq!(
            within(value(key)).await,
            format!("{key} v2"),
            "every key refreshed"
        );
    }
}

//! The freshness and failure policies as a user writes them: `refresh_after`, `fail_safe`,
//! `soft_timeout`, `retry_if`, `breaker`.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use common::{AppError, within};
use stampede::cached;
use tokio::time::Instant;

#[tokio::test(start_paused = true)]
async fn refresh_ahead_means_a_key_read_every_second_never_waits() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(
        ttl = "60s",
        jitter = 0,
        refresh_after = "45s",
        name = "policies::ahead"
    )]
    async fn rate(id: u64) -> u64 {
        LOADS.fetch_add(1, SeqCst);
        id
    }

    within(rate(1)).await;
    for _ in 0..600 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let started = Instant::now();
        within(rate(1)).await;
        assert_eq!(
            started.elapsed(),
            Duration::ZERO,
            "a call waited for a load"
        );
    }
    // The first load, then one per 45 s period (the read after it starts the refresh).
    assert_eq!(LOADS.load(SeqCst), 1 + 600 / 46);
}

#[tokio::test(start_paused = true)]
async fn fail_safe_and_soft_timeout_keep_serving_the_last_good_value() {
    static DOWN: AtomicBool = AtomicBool::new(false);
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(
        ttl = "10s",
        stale = "5s",
        fail_safe = "1h",
        fail_safe_throttle = "5s",
        soft_timeout = "100ms",
        name = "policies::fail_safe"
    )]
    async fn price(id: u64) -> Result<String, AppError> {
        let n = LOADS.fetch_add(1, SeqCst) + 1;
        if DOWN.load(SeqCst) {
            tokio::time::sleep(Duration::from_secs(1)).await; // a slow failure
            return Err(AppError::Db(format!("load {n}: down")));
        }
        Ok(format!("price {id} v{n}"))
    }

    assert_eq!(within(price(1)).await.unwrap(), "price 1 v1");
    DOWN.store(true, SeqCst);
    tokio::time::advance(Duration::from_secs(16)).await; // past ttl + stale
    let started = Instant::now();
    assert_eq!(within(price(1)).await.unwrap(), "price 1 v1");
    assert_eq!(
        started.elapsed(),
        Duration::from_millis(100),
        "the soft timeout"
    );
    tokio::time::sleep(Duration::from_secs(1)).await; // the failed load ends: fail-safe
    assert_eq!(within(price(1)).await.unwrap(), "price 1 v1");
    assert_eq!(
        LOADS.load(SeqCst),
        2,
        "throttled: the source was asked once"
    );
    let stats = stampede::stats("policies::fail_safe").unwrap();
    assert!(stats.fail_safe_served >= 1, "{stats:?}");
}

fn transient(error: &AppError) -> bool {
    matches!(error, AppError::Db(message) if message.starts_with("transient"))
}

#[tokio::test(start_paused = true)]
async fn retry_if_keeps_permanent_errors_from_being_retried() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(
        ttl = "60s",
        retries = 2,
        retry_if = "transient",
        name = "policies::retry_if"
    )]
    async fn row(id: u64) -> Result<String, AppError> {
        LOADS.fetch_add(1, SeqCst);
        match id {
            1 => Err(AppError::Db("permanent: no such row".into())),
            _ => Err(AppError::Db("transient: connection reset".into())),
        }
    }

    assert!(within(row(1)).await.is_err());
    assert_eq!(LOADS.load(SeqCst), 1, "a permanent error is tried once");
    assert!(within(row(2)).await.is_err());
    assert_eq!(
        LOADS.load(SeqCst),
        1 + 3,
        "a transient one retries + 1 times"
    );
}

#[tokio::test(start_paused = true)]
async fn an_open_breaker_fails_fast_then_probes_once() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(
        ttl = "60s",
        breaker = 3,
        breaker_cooldown = "30s",
        name = "policies::breaker"
    )]
    async fn account(id: u64) -> Result<String, AppError> {
        LOADS.fetch_add(1, SeqCst);
        Err(AppError::Db(format!("account {id}: down")))
    }

    for id in 0..3 {
        assert!(matches!(within(account(id)).await, Err(AppError::Db(_))));
    }
    for id in 10..20 {
        assert!(matches!(
            within(account(id)).await,
            Err(AppError::Cache(stampede::Error::CircuitOpen { .. }))
        ));
    }
    assert_eq!(LOADS.load(SeqCst), 3, "the source is not called while open");
    assert!(stampede::stats("policies::breaker").unwrap().breaker_open);
    tokio::time::advance(Duration::from_secs(31)).await;
    let _ = within(account(30)).await;
    assert_eq!(
        LOADS.load(SeqCst),
        4,
        "exactly one probe after the cool-down"
    );
}

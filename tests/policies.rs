//! The freshness and failure policies as a user writes them: `refresh_after`, `fail_safe`,
//! `soft_timeout`, `retry_if`, `breaker`, `max_loads`.

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

/// How many loads run now, and the most that ever ran at once: a load's guard.
struct Running {
    now: &'static AtomicUsize,
    most: &'static AtomicUsize,
}

impl Running {
    fn enter(now: &'static AtomicUsize, most: &'static AtomicUsize) -> Self {
        let running = now.fetch_add(1, SeqCst) + 1;
        most.fetch_max(running, SeqCst);
        Running { now, most }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.most;
        self.now.fetch_sub(1, SeqCst);
    }
}

#[tokio::test(start_paused = true)]
async fn max_loads_bounds_a_cold_start_of_distinct_keys_and_every_caller_gets_its_value() {
    static NOW: AtomicUsize = AtomicUsize::new(0);
    static MOST: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", max_loads = 2, name = "policies::max_loads")]
    async fn product(id: u64) -> Result<String, AppError> {
        let _running = Running::enter(&NOW, &MOST);
        tokio::time::sleep(Duration::from_millis(100)).await;
        Ok(format!("product {id}"))
    }

    let started = Instant::now();
    let calls: Vec<_> = (0..6).map(|id| tokio::spawn(product(id))).collect();
    for (id, call) in calls.into_iter().enumerate() {
        assert_eq!(
            within(call).await.unwrap().unwrap(),
            format!("product {id}")
        );
    }
    assert_eq!(MOST.load(SeqCst), 2, "at most two loads at once");
    assert_eq!(
        started.elapsed(),
        Duration::from_millis(300),
        "three waves of two"
    );
    let stats = stampede::stats("policies::max_loads").unwrap();
    assert_eq!(
        (stats.loads, stats.loads_queued, stats.loads_refused),
        (6, 4, 0)
    );
    // Hits take no load.
    within(product(3)).await.unwrap();
    assert_eq!(stampede::stats("policies::max_loads").unwrap().loads, 6);
}

#[tokio::test(start_paused = true)]
async fn a_load_that_finds_none_free_within_its_timeout_fails_without_calling_the_source() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(
        ttl = "60s",
        timeout = "100ms",
        max_loads = 1,
        name = "policies::max_loads_timeout"
    )]
    async fn product(id: u64) -> Result<String, AppError> {
        LOADS.fetch_add(1, SeqCst);
        tokio::time::sleep(Duration::from_millis(80)).await;
        Ok(format!("product {id}"))
    }

    // The first runs 0..80 ms, the second waits and runs 80..160 ms; the third waits 100 ms.
    let (first, second, third) = within(async {
        tokio::join!(product(1), product(2), async {
            tokio::time::sleep(Duration::from_millis(1)).await;
            product(3).await
        })
    })
    .await;
    assert_eq!(first.unwrap(), "product 1");
    assert_eq!(second.unwrap(), "product 2");
    match third {
        Err(AppError::Cache(stampede::Error::LoadsFull {
            most: 1, waited, ..
        })) => {
            assert_eq!(waited, Some(Duration::from_millis(100)));
        }
        other => panic!("expected LoadsFull after the timeout, got {other:?}"),
    }
    assert_eq!(
        LOADS.load(SeqCst),
        2,
        "the refused load never called the source"
    );
    let stats = stampede::stats("policies::max_loads_timeout").unwrap();
    assert_eq!((stats.loads_queued, stats.loads_refused), (2, 1));
    // Nothing was cached for the refused key: the next call loads it.
    assert_eq!(within(product(3)).await.unwrap(), "product 3");
}

#[tokio::test(start_paused = true)]
async fn max_loads_full_error_sheds_a_load_at_once_and_a_stale_value_still_covers_it() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(
        ttl = "10s",
        jitter = 0,
        stale = "60s",
        max_loads = 1,
        max_loads_full = "error",
        name = "policies::max_loads_error"
    )]
    async fn product(id: u64) -> Result<String, AppError> {
        let n = LOADS.fetch_add(1, SeqCst) + 1;
        tokio::time::sleep(Duration::from_secs(1)).await;
        Ok(format!("product {id} v{n}"))
    }

    assert_eq!(within(product(2)).await.unwrap(), "product 2 v1");
    tokio::time::advance(Duration::from_secs(11)).await; // key 2 is stale now
    let slow = tokio::spawn(product(1)); // holds the one load for 1 s
    tokio::time::sleep(Duration::from_millis(10)).await;
    let started = Instant::now();
    match within(product(3)).await {
        Err(AppError::Cache(stampede::Error::LoadsFull {
            most: 1,
            waited: None,
            ..
        })) => {}
        other => panic!("expected LoadsFull at once, got {other:?}"),
    }
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "shed at once, not waited for"
    );
    // A stale key is still served; its refresh, refused, leaves it as it was.
    assert_eq!(within(product(2)).await.unwrap(), "product 2 v1");
    assert_eq!(within(slow).await.unwrap().unwrap(), "product 1 v2");
    assert_eq!(
        LOADS.load(SeqCst),
        2,
        "only the loads that ran called the source"
    );
    assert!(
        stampede::stats("policies::max_loads_error")
            .unwrap()
            .loads_refused
            >= 1
    );
}

#[tokio::test(start_paused = true)]
async fn a_batch_load_counts_once_against_max_loads() {
    static NOW: AtomicUsize = AtomicUsize::new(0);
    static MOST: AtomicUsize = AtomicUsize::new(0);

    #[cached(
        ttl = "60s",
        batch = ids,
        batch_max = 2,
        max_loads = 1,
        name = "policies::max_loads_batch"
    )]
    async fn products(ids: Vec<u64>) -> Result<std::collections::HashMap<u64, String>, AppError> {
        let _running = Running::enter(&NOW, &MOST);
        tokio::time::sleep(Duration::from_millis(100)).await;
        Ok(ids
            .into_iter()
            .map(|id| (id, format!("product {id}")))
            .collect())
    }

    let started = Instant::now();
    let got = within(products(vec![1, 2, 3, 4])).await.unwrap();
    assert_eq!(got.len(), 4);
    assert_eq!(got[&3], "product 3");
    assert_eq!(MOST.load(SeqCst), 1, "the split calls ran one at a time");
    assert_eq!(
        started.elapsed(),
        Duration::from_millis(200),
        "two calls of two keys"
    );
}

#[tokio::test(start_paused = true)]
async fn xfetch_refreshes_a_hot_key_with_a_slow_load_before_it_expires() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    // The paper's setting: a key read 10 times a second whose load takes 3 s.
    #[cached(ttl = "60s", jitter = 0, xfetch = 2.0, name = "policies::xfetch")]
    async fn report(id: u64) -> u64 {
        LOADS.fetch_add(1, SeqCst);
        tokio::time::sleep(Duration::from_secs(3)).await;
        id
    }

    within(report(1)).await;
    for _ in 0..6_000 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let started = Instant::now();
        within(report(1)).await;
        assert_eq!(
            started.elapsed(),
            Duration::ZERO,
            "a call waited for a load"
        );
    }
    // Ten minutes: at least one load per `ttl` (each before its expiry), far fewer than reads.
    let loads = LOADS.load(SeqCst);
    assert!((11..=60).contains(&loads), "{loads} loads in 10 minutes");
}

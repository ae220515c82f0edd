//! The failure policies with a shared tier, against a real `redis-server` per test: the breaker
//! counts failed loads only (a stale value served meanwhile hides none, a busy lock is none),
//! and `fail_safe` and `soft_timeout` work with `backend = "redis"`, from the last good value
//! Redis keeps. Two functions with one `name` are two processes over the same Redis keys.
//! Time is real (see `redis_tier.rs`).

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use common::redis_server::RedisServer;
use common::{AppError, eventually, within};
use stampede::{RedisConfig, cached};
use tokio::sync::Semaphore;

fn install(server: &RedisServer, name: &str) {
    RedisConfig::new(&server.url())
        .unwrap()
        .prefix("policies")
        .install_as(name);
}

#[tokio::test]
async fn the_breaker_opens_after_failed_loads_while_every_caller_is_served_a_stale_value() {
    static FAILING: AtomicBool = AtomicBool::new(false);
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    async fn load(id: u64) -> Result<String, AppError> {
        let n = LOADS.fetch_add(1, SeqCst) + 1;
        match FAILING.load(SeqCst) {
            true => Err(AppError::Db(format!("load {n}: down"))),
            false => Ok(format!("rate {id} v{n}")),
        }
    }
    #[cached(
        ttl = "200ms",
        jitter = 0,
        stale = "1h",
        long_windows = true,
        lock = "redis",
        redis = "breaker_stale",
        breaker = 2,
        breaker_cooldown = "1h",
        name = "policies::breaker_stale"
    )]
    async fn in_a(id: u64) -> Result<String, AppError> {
        load(id).await
    }
    #[cached(
        ttl = "200ms",
        jitter = 0,
        stale = "1h",
        long_windows = true,
        lock = "redis",
        redis = "breaker_stale",
        breaker = 2,
        breaker_cooldown = "1h",
        name = "policies::breaker_stale"
    )]
    async fn in_b(id: u64) -> Result<String, AppError> {
        load(id).await
    }

    let server = RedisServer::start();
    install(&server, "breaker_stale");
    assert_eq!(within(in_a(1)).await.unwrap(), "rate 1 v1");
    FAILING.store(true, SeqCst);
    tokio::time::sleep(Duration::from_millis(300)).await; // Redis's copy turns stale
    // Every call of b gets the stale value, while its loads (in the call's flight, then in the
    // background refresh) fail: two failed loads open b's breaker.
    for _ in 0..6 {
        assert_eq!(within(in_b(1)).await.unwrap(), "rate 1 v1");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eventually("b's breaker opens", || {
        stampede::stats("policies::breaker_stale")
            .unwrap()
            .breaker_open
    })
    .await;
    let loads = LOADS.load(SeqCst);
    assert_eq!(loads, 1 + 2, "a's fill, then b's two failed loads");
    // Open: the stale value is still served, and the source is not asked.
    for _ in 0..3 {
        assert_eq!(within(in_b(1)).await.unwrap(), "rate 1 v1");
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(LOADS.load(SeqCst), loads);
}

#[tokio::test]
async fn lock_contention_alone_never_opens_the_breaker() {
    static GATE: Semaphore = Semaphore::const_new(0);
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "breaker_busy",
        name = "policies::busy"
    )]
    async fn holder(id: u64) -> Result<String, AppError> {
        LOADS.fetch_add(1, SeqCst);
        GATE.acquire().await.unwrap().forget(); // the load goes on until the test lets it end
        Ok(format!("stock {id}"))
    }
    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "breaker_busy",
        busy = "error",
        breaker = 1,
        name = "policies::busy"
    )]
    async fn impatient(id: u64) -> Result<String, AppError> {
        LOADS.fetch_add(1, SeqCst);
        Ok(format!("stock {id} loaded by the impatient"))
    }

    let server = RedisServer::start();
    install(&server, "breaker_busy");
    let holding = tokio::spawn(holder(7));
    eventually("the holder's load runs", || LOADS.load(SeqCst) == 1).await;
    for _ in 0..3 {
        assert!(matches!(
            within(impatient(7)).await,
            Err(AppError::Cache(stampede::Error::LockBusy { .. }))
        ));
    }
    let stats = stampede::stats("policies::busy").unwrap();
    assert!(
        !stats.breaker_open,
        "a busy lock is no failed load: {stats:?}"
    );
    GATE.add_permits(1);
    assert_eq!(within(holding).await.unwrap().unwrap(), "stock 7");
    assert_eq!(within(impatient(7)).await.unwrap(), "stock 7");
    assert_eq!(LOADS.load(SeqCst), 1, "the impatient process never loaded");
}

#[tokio::test]
async fn fail_safe_without_memory_serves_the_last_good_value_redis_keeps() {
    static FAILING: AtomicBool = AtomicBool::new(false);
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(
        ttl = "200ms",
        jitter = 0,
        backend = "redis",
        redis = "fail_safe_redis",
        fail_safe = "1h",
        long_windows = true,
        name = "policies::fail_safe_redis"
    )]
    async fn quote(id: u64) -> Result<String, AppError> {
        let n = LOADS.fetch_add(1, SeqCst) + 1;
        match FAILING.load(SeqCst) {
            true => Err(AppError::Db(format!("load {n}: down"))),
            false => Ok(format!("quote {id} v{n}")),
        }
    }

    let server = RedisServer::start();
    install(&server, "fail_safe_redis");
    assert_eq!(within(quote(3)).await.unwrap(), "quote 3 v1");
    FAILING.store(true, SeqCst);
    tokio::time::sleep(Duration::from_millis(300)).await; // past ttl: only fail-safe keeps it
    assert_eq!(within(quote(3)).await.unwrap(), "quote 3 v1");
    assert_eq!(LOADS.load(SeqCst), 2, "the source was asked, and failed");
    let stats = stampede::stats("policies::fail_safe_redis").unwrap();
    assert_eq!(stats.fail_safe_served, 1, "{stats:?}");
    assert_eq!(stats.entries, 0, "nothing is kept in memory");
    // Back up: a load's value replaces it.
    FAILING.store(false, SeqCst);
    assert_eq!(within(quote(3)).await.unwrap(), "quote 3 v3");
}

#[tokio::test]
async fn soft_timeout_without_memory_serves_the_last_good_value_while_the_load_runs() {
    static GATED: AtomicBool = AtomicBool::new(false);
    static GATE: Semaphore = Semaphore::const_new(0);
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(
        ttl = "200ms",
        jitter = 0,
        backend = "redis",
        redis = "soft_redis",
        fail_safe = "1h",
        long_windows = true,
        soft_timeout = "200ms",
        name = "policies::soft_redis"
    )]
    async fn price(id: u64) -> Result<String, AppError> {
        let n = LOADS.fetch_add(1, SeqCst) + 1;
        if GATED.load(SeqCst) {
            GATE.acquire().await.unwrap().forget(); // a slow source
        }
        Ok(format!("price {id} v{n}"))
    }

    let server = RedisServer::start();
    install(&server, "soft_redis");
    assert_eq!(within(price(5)).await.unwrap(), "price 5 v1");
    GATED.store(true, SeqCst);
    tokio::time::sleep(Duration::from_millis(300)).await; // past ttl
    // The load is held at the gate: the call gets the last good value after its soft timeout.
    assert_eq!(within(price(5)).await.unwrap(), "price 5 v1");
    assert_eq!(LOADS.load(SeqCst), 2, "the load started");
    assert_eq!(GATE.available_permits(), 0, "and it is still running");
    GATE.add_permits(1);
    // The load goes on in the background and stores its value.
    let mut latest = String::new();
    for _ in 0..200 {
        latest = within(price(5)).await.unwrap();
        if latest == "price 5 v2" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(latest, "price 5 v2");
    let stats = stampede::stats("policies::soft_redis").unwrap();
    assert!(stats.fail_safe_served >= 1, "{stats:?}");
}

#[tokio::test]
async fn max_loads_holds_with_redis_and_a_shed_load_leaves_redis_untouched() {
    static RUNNING: AtomicUsize = AtomicUsize::new(0);
    static LOADS: AtomicUsize = AtomicUsize::new(0);
    static GATE: Semaphore = Semaphore::const_new(0);

    #[cached(
        ttl = "60s",
        backend = "redis",
        lock = "redis",
        redis = "max_loads_redis",
        max_loads = 1,
        max_loads_full = "error",
        name = "policies::max_loads_redis"
    )]
    async fn quote(id: u64) -> Result<String, AppError> {
        LOADS.fetch_add(1, SeqCst);
        RUNNING.fetch_add(1, SeqCst);
        let _ = GATE.acquire().await;
        RUNNING.fetch_sub(1, SeqCst);
        Ok(format!("quote {id}"))
    }

    let server = RedisServer::start();
    install(&server, "max_loads_redis");
    let first = tokio::spawn(quote(1));
    eventually("the first load runs", || RUNNING.load(SeqCst) == 1).await;
    match within(quote(2)).await {
        Err(AppError::Cache(stampede::Error::LoadsFull { most: 1, .. })) => {}
        other => panic!("expected LoadsFull, got {other:?}"),
    }
    GATE.add_permits(1);
    assert_eq!(within(first).await.unwrap().unwrap(), "quote 1");
    // The shed key left no lock behind in Redis: its next call loads at once.
    GATE.add_permits(1);
    assert_eq!(within(quote(2)).await.unwrap(), "quote 2");
    assert_eq!(
        LOADS.load(SeqCst),
        2,
        "the shed load never called the source"
    );
    let stats = stampede::stats("policies::max_loads_redis").unwrap();
    assert_eq!(stats.loads_refused, 1, "{stats:?}");
}

//! The Redis tier inside one test process, against a real `redis-server` per test.
//!
//! Two functions with the same `name` are two caches with their own memory and flights over the
//! same Redis keys: what two processes of one service are. (Real processes: `multi_process.rs`.)
//! Every test installs its own named connection, so tests running in parallel never share keys.
//! Time is real here: a paused tokio clock would fire Redis timeouts while the runtime waits
//! for the network.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::time::{Duration, Instant};

use common::monitor::Monitor;
use common::redis_server::RedisServer;
use common::{AppError, eventually, within};
use stampede::{RedisConfig, cached};

fn install(server: &RedisServer, name: &str) -> RedisConfig {
    let config = RedisConfig::new(&server.url()).unwrap().prefix("test");
    config.clone().install_as(name);
    config
}

#[tokio::test]
async fn a_value_loaded_in_one_process_is_read_from_redis_by_another() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "shared_value",
        name = "red::shared"
    )]
    async fn in_a(id: u64) -> String {
        LOADS.fetch_add(1, SeqCst);
        format!("user {id}")
    }
    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "shared_value",
        name = "red::shared"
    )]
    async fn in_b(id: u64) -> String {
        LOADS.fetch_add(1, SeqCst);
        format!("user {id} loaded by b")
    }

    let server = RedisServer::start();
    install(&server, "shared_value");
    assert_eq!(within(in_a(42)).await, "user 42");
    assert_eq!(
        within(in_b(42)).await,
        "user 42",
        "b read a's value from Redis"
    );
    assert_eq!(LOADS.load(SeqCst), 1);

    // The key is readable and its envelope says what it holds.
    let key = server
        .key("test:{red::shared~*|42}:v")
        .expect("the value is in Redis");
    let stored: Vec<u8> = server.command(&["GET", &key]);
    let header =
        String::from_utf8_lossy(&stored[..stored.iter().position(|b| *b == b'\n').unwrap()])
            .into_owned();
    let fields: Vec<&str> = header.split(' ').skip(1).collect();
    let [
        fresh_until,
        stale_until,
        written_at,
        read_at,
        fence,
        _load_ms,
        version,
    ] = fields[..]
    else {
        panic!("unexpected header {header}")
    };
    assert_eq!(version, "-", "no source version configured: {header}");
    let [fresh_until, stale_until, written_at, read_at, fence] =
        [fresh_until, stale_until, written_at, read_at, fence].map(|f| f.parse::<u64>().unwrap());
    assert!(header.starts_with("S3 "), "{header}");
    assert!(
        read_at <= written_at && written_at - read_at < 5_000,
        "the source was read shortly before the value was written: {header}"
    );
    let fresh_for = fresh_until - written_at;
    assert!(
        (54_000..=60_000).contains(&fresh_for),
        "fresh for {fresh_for} ms with ttl 60s, jitter 10%"
    );
    assert_eq!(stale_until, fresh_until);
    // The envelope carries the fence its holder took with the lock; the write moved the key's
    // fence on, to at least its stamp (its source read, in µs).
    let fence_key = format!("{}:f", key.strip_suffix(":v").unwrap());
    let moved: u64 = server.command(&["GET", &fence_key]);
    assert!(
        moved > fence && moved >= read_at * 1_000,
        "the fence {moved}, moved on past {fence} to the read at {read_at} ms"
    );
    let ttl: i64 = server.command(&["PTTL", &key]);
    assert!(
        ttl > 50_000 && ttl as u64 <= fresh_for,
        "Redis drops the value at its stale deadline: {ttl}"
    );
}

#[tokio::test]
async fn concurrent_callers_in_two_processes_share_one_load() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "two_flights",
        name = "red::two_flights"
    )]
    async fn in_a(id: u64) -> String {
        LOADS.fetch_add(1, SeqCst);
        tokio::time::sleep(Duration::from_millis(300)).await;
        format!("report {id}")
    }
    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "two_flights",
        name = "red::two_flights"
    )]
    async fn in_b(id: u64) -> String {
        LOADS.fetch_add(1, SeqCst);
        tokio::time::sleep(Duration::from_millis(300)).await;
        format!("report {id}")
    }

    let server = RedisServer::start();
    install(&server, "two_flights");
    let mut calls = Vec::new();
    for _ in 0..50 {
        calls.push(tokio::spawn(in_a(1)));
        calls.push(tokio::spawn(in_b(1)));
    }
    for call in calls {
        assert_eq!(within(call).await.unwrap(), "report 1");
    }
    assert_eq!(LOADS.load(SeqCst), 1);
    let stats = stampede::stats("red::two_flights").unwrap();
    assert_eq!(stats.lock_acquired, 1, "{stats:?}");
    assert_eq!(
        stats.lock_busy, 1,
        "one lock attempt per process, not per caller: {stats:?}"
    );
}

#[tokio::test]
async fn a_corrupt_payload_is_a_miss_and_is_overwritten() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", lock = "redis", redis = "corrupt", name = "red::corrupt")]
    async fn price(sku: u64) -> Result<String, AppError> {
        LOADS.fetch_add(1, SeqCst);
        Ok(format!("{} EUR", sku * 10))
    }

    let server = RedisServer::start();
    install(&server, "corrupt");
    // A first key, to learn the cache's identity in Redis (its name and a digest of its shapes).
    assert_eq!(within(price(1)).await.unwrap(), "10 EUR");
    let first = server.key("test:{red::corrupt~*|1}:v").unwrap();
    let key_of = |sku: &str| first.replace("|1}", &format!("|{sku}}}"));
    let key = key_of("7");
    let _: () = server.command(&["SET", &key, "written by another program"]);

    assert_eq!(within(price(7)).await.unwrap(), "70 EUR");
    assert_eq!(LOADS.load(SeqCst), 2);
    let stored: Vec<u8> = server.command(&["GET", &key]);
    assert!(
        stored.starts_with(b"S3 "),
        "the value was rewritten: {:?}",
        String::from_utf8_lossy(&stored)
    );
    assert_eq!(stampede::stats("red::corrupt").unwrap().decode_errors, 1);

    // A payload an earlier version wrote (MessagePack: the number 42, `*`), and one of this
    // version's form holding the number 42 where this cache stores a string.
    for (sku, payload) in [("8", &b"*"[..]), ("9", b"\xc1\x02\x05\x2a")] {
        let mut envelope = b"S3 99999999999999 99999999999999 0 0 0 1 -\n".to_vec();
        envelope.extend_from_slice(payload);
        let _: () = redis::cmd("SET")
            .arg(key_of(sku))
            .arg(envelope)
            .query(&mut server.connection())
            .unwrap();
    }
    assert_eq!(within(price(8)).await.unwrap(), "80 EUR");
    assert_eq!(within(price(9)).await.unwrap(), "90 EUR");
    assert_eq!(LOADS.load(SeqCst), 4);
    assert_eq!(stampede::stats("red::corrupt").unwrap().decode_errors, 3);
}

#[tokio::test]
async fn the_watchdog_keeps_the_lock_of_a_load_longer_than_the_lease() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "watchdog",
        name = "red::watchdog"
    )]
    async fn in_a(id: u64) -> String {
        LOADS.fetch_add(1, SeqCst);
        tokio::time::sleep(Duration::from_millis(1_200)).await;
        format!("slow {id}")
    }
    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "watchdog",
        name = "red::watchdog"
    )]
    async fn in_b(id: u64) -> String {
        LOADS.fetch_add(1, SeqCst);
        format!("fast {id}")
    }

    let server = RedisServer::start();
    RedisConfig::new(&server.url())
        .unwrap()
        .prefix("test")
        .lease(Duration::from_millis(300))
        .install_as("watchdog");
    let a = tokio::spawn(in_a(1));
    tokio::time::sleep(Duration::from_millis(800)).await; // well past the 300 ms lease
    let lock = server
        .key("test:{red::watchdog~*|1}:l")
        .expect("a holds the lock");
    let pttl: i64 = server.command(&["PTTL", &lock]);
    assert!(pttl > 0, "the lock is still held after 800 ms: pttl {pttl}");
    assert_eq!(
        within(in_b(1)).await,
        "slow 1",
        "b waited for a's value instead of loading"
    );
    assert_eq!(within(a).await.unwrap(), "slow 1");
    assert_eq!(LOADS.load(SeqCst), 1);
    let exists: i64 = server.command(&["EXISTS", &lock]);
    assert_eq!(exists, 0, "the holder released its lock");
}

/// With `lock = "local"` no process holds a Redis lock, but a load's fill is still fenced: the
/// key's fence must outlive a load longer than the lease, or the fill is refused and the value
/// never reaches Redis.
#[tokio::test]
async fn an_unlocked_load_longer_than_the_lease_still_fills_redis() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(
        ttl = "60s",
        lock = "local",
        backend = "tiered",
        redis = "unlocked_slow",
        name = "red::unlocked_slow"
    )]
    async fn in_a(id: u64) -> String {
        LOADS.fetch_add(1, SeqCst);
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        format!("slow {id}")
    }
    #[cached(
        ttl = "60s",
        lock = "local",
        backend = "tiered",
        redis = "unlocked_slow",
        name = "red::unlocked_slow"
    )]
    async fn in_b(id: u64) -> String {
        LOADS.fetch_add(1, SeqCst);
        format!("fast {id}")
    }

    let server = RedisServer::start();
    RedisConfig::new(&server.url())
        .unwrap()
        .prefix("test")
        .lease(Duration::from_millis(300))
        .install_as("unlocked_slow");
    assert_eq!(within(in_a(1)).await, "slow 1");
    assert_eq!(
        within(in_b(1)).await,
        "slow 1",
        "b read a's value from Redis instead of loading"
    );
    assert_eq!(LOADS.load(SeqCst), 1);
    assert_eq!(
        stampede::stats("red::unlocked_slow").unwrap().remote_hits,
        1
    );
}

#[tokio::test]
async fn a_holder_that_lost_its_lease_cannot_release_the_new_holders_lock() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "lost_lease",
        name = "red::lost_lease"
    )]
    async fn in_a(id: u64) -> String {
        LOADS.fetch_add(1, SeqCst);
        tokio::time::sleep(Duration::from_millis(600)).await;
        format!("from a {id}")
    }
    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "lost_lease",
        name = "red::lost_lease"
    )]
    async fn in_b(id: u64) -> String {
        LOADS.fetch_add(1, SeqCst);
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        format!("from b {id}")
    }

    let server = RedisServer::start();
    install(&server, "lost_lease");
    let a = tokio::spawn(in_a(1));
    eventually("a to take the lock", || {
        server.key("test:{red::lost_lease~*|1}:l").is_some()
    })
    .await;
    let lock = &server.key("test:{red::lost_lease~*|1}:l").unwrap();
    let token_a: String = server.command(&["GET", lock]);
    let _: i64 = server.command(&["DEL", lock]); // a's lease is lost (as if it expired)
    let b = tokio::spawn(in_b(1));
    eventually("b to take the lock", || {
        server.command::<Option<String>>(&["GET", lock]).is_some()
    })
    .await;
    let token_b: String = server.command(&["GET", lock]);
    assert_ne!(token_a, token_b);

    assert_eq!(within(a).await.unwrap(), "from a 1");
    let after_a: Option<String> = server.command(&["GET", lock]);
    assert_eq!(
        after_a.as_ref(),
        Some(&token_b),
        "a's release left b's lock alone"
    );
    assert_eq!(within(b).await.unwrap(), "from b 1");
    assert_eq!(LOADS.load(SeqCst), 2);
}

#[tokio::test]
async fn calls_survive_redis_being_killed_and_use_it_again_when_it_returns() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "200ms", lock = "redis", redis = "killed", name = "red::killed")]
    async fn quote(id: u64) -> Result<String, AppError> {
        LOADS.fetch_add(1, SeqCst);
        tokio::time::sleep(Duration::from_millis(5)).await;
        Ok(format!("quote {id}"))
    }

    let mut server = RedisServer::start();
    RedisConfig::new(&server.url())
        .unwrap()
        .prefix("test")
        .cooldown(Duration::from_millis(200), 2)
        .install_as("killed");

    let calls = tokio::spawn(async {
        let started = Instant::now();
        let mut served = 0;
        while started.elapsed() < Duration::from_secs(3) {
            for id in 0..10 {
                assert_eq!(
                    quote(id).await.unwrap(),
                    format!("quote {id}"),
                    "a call failed"
                );
                served += 1;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        served
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.kill();
    eventually("calls to run without Redis", || {
        stampede::stats("red::killed").unwrap().degraded > 0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    server.restart();
    eventually("a value written to the restarted Redis", || {
        server.key("test:{red::killed~*|0}:v").is_some()
    })
    .await;
    let served = within(calls).await.unwrap();
    assert!(served > 100, "only {served} calls in 3 s");
    let stats = stampede::stats("red::killed").unwrap();
    assert!(stats.degraded > 0 && stats.lock_acquired > 10, "{stats:?}");
}

#[tokio::test]
async fn a_paused_redis_costs_a_call_about_the_operation_timeout() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", lock = "redis", redis = "paused", name = "red::paused")]
    async fn stock(sku: u64) -> u64 {
        LOADS.fetch_add(1, SeqCst);
        sku + 1
    }

    let server = RedisServer::start();
    RedisConfig::new(&server.url())
        .unwrap()
        .prefix("test")
        .op_timeout(Duration::from_millis(200))
        .install_as("paused");
    assert_eq!(within(stock(1)).await, 2); // connected before the pause
    let _: () = server.command(&["CLIENT", "PAUSE", "5000", "ALL"]);

    let started = Instant::now();
    assert_eq!(within(stock(2)).await, 3);
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(1_000),
        "the call took {took:?} during a 5 s pause"
    );
    assert!(
        took >= Duration::from_millis(200),
        "the call did wait for Redis first: {took:?}"
    );
    assert_eq!(stampede::stats("red::paused").unwrap().degraded, 1);
}

#[tokio::test]
async fn busy_policies_decide_what_a_process_does_while_another_holds_the_lock() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", lock = "redis", redis = "busy", name = "red::busy")]
    async fn holder(id: u64) -> Result<String, AppError> {
        LOADS.fetch_add(1, SeqCst);
        tokio::time::sleep(Duration::from_millis(800)).await;
        Ok(format!("held {id}"))
    }
    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "busy",
        busy = "error",
        name = "red::busy"
    )]
    async fn impatient(id: u64) -> Result<String, AppError> {
        LOADS.fetch_add(1, SeqCst);
        Ok(format!("impatient {id}"))
    }
    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "busy",
        busy = "compute",
        name = "red::busy"
    )]
    async fn eager(id: u64) -> Result<String, AppError> {
        LOADS.fetch_add(1, SeqCst);
        Ok(format!("eager {id}"))
    }

    let server = RedisServer::start();
    install(&server, "busy");
    let held = tokio::spawn(holder(1));
    eventually("the holder to take the lock", || {
        server.key("test:{red::busy~*|1}:l").is_some()
    })
    .await;
    match within(impatient(1)).await {
        Err(AppError::Cache(stampede::Error::LockBusy { .. })) => {}
        other => panic!("expected LockBusy, got {other:?}"),
    }
    assert_eq!(
        within(eager(1)).await.unwrap(),
        "eager 1",
        "computed without waiting"
    );
    // The eager fill moved the key's fence: the holder's fill is refused, and its callers get
    // what Redis holds, as every process does from now on.
    assert_eq!(within(held).await.unwrap().unwrap(), "eager 1");
    assert_eq!(within(holder(1)).await.unwrap(), "eager 1");
    assert_eq!(LOADS.load(SeqCst), 2);
}

#[tokio::test]
async fn without_a_configured_redis_the_cache_runs_on_local_singleflight() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "never_installed",
        name = "red::unconfigured"
    )]
    async fn total(day: u32) -> u64 {
        LOADS.fetch_add(1, SeqCst);
        tokio::time::sleep(Duration::from_millis(50)).await;
        u64::from(day) * 2
    }

    let calls: Vec<_> = (0..20).map(|_| tokio::spawn(total(3))).collect();
    for call in calls {
        assert_eq!(within(call).await.unwrap(), 6);
    }
    assert_eq!(
        LOADS.load(SeqCst),
        1,
        "still one load per key in this process"
    );
    assert_eq!(stampede::stats("red::unconfigured").unwrap().degraded, 1);
}

#[tokio::test]
async fn invalidation_drops_the_key_from_redis_and_from_every_process() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "invalidate",
        name = "red::invalidate"
    )]
    async fn in_a(id: u64) -> String {
        let n = LOADS.fetch_add(1, SeqCst) + 1;
        format!("profile {id} v{n}")
    }
    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "invalidate",
        name = "red::invalidate"
    )]
    async fn in_b(id: u64) -> String {
        let n = LOADS.fetch_add(1, SeqCst) + 1;
        format!("profile {id} v{n}")
    }

    let server = RedisServer::start();
    install(&server, "invalidate");
    assert_eq!(within(in_a(5)).await, "profile 5 v1");
    assert_eq!(within(in_b(5)).await, "profile 5 v1"); // now in both memories

    within(stampede::invalidate("red::invalidate", (5u64,)))
        .await
        .unwrap();
    assert_eq!(server.key("test:{red::invalidate~*|5}:v"), None);
    eventually("both memories to drop the key", || {
        stampede::stats("red::invalidate").unwrap().entries == 0
    })
    .await;
    assert_eq!(within(in_b(5)).await, "profile 5 v2");
    assert_eq!(
        within(in_a(5)).await,
        "profile 5 v2",
        "a read b's new value from Redis"
    );

    let wrong_type = stampede::invalidate("red::invalidate", ("5",)).await;
    assert!(
        matches!(wrong_type, Err(stampede::Error::InvalidConfig { .. })),
        "{wrong_type:?}"
    );
}

/// `expire` (issue 37): the value stays in Redis and in every process's memory, no longer
/// fresh: each process serves it stale at once while one refresh (across them, under the Redis
/// lock) replaces it, and a process that reads Redis only does the same.
#[tokio::test]
async fn an_expiry_keeps_the_value_everywhere_stale_while_one_refresh_replaces_it() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    async fn load(id: u64) -> String {
        let n = LOADS.fetch_add(1, SeqCst) + 1;
        tokio::time::sleep(Duration::from_secs(2)).await;
        format!("profile {id} v{n}")
    }
    #[cached(
        ttl = "60s",
        stale = "1m",
        lock = "redis",
        redis = "expire",
        name = "red::expire"
    )]
    async fn in_a(id: u64) -> String {
        load(id).await
    }
    #[cached(
        ttl = "60s",
        stale = "1m",
        lock = "redis",
        redis = "expire",
        name = "red::expire"
    )]
    async fn in_b(id: u64) -> String {
        load(id).await
    }
    #[cached(
        ttl = "60s",
        stale = "1m",
        lock = "redis",
        backend = "redis",
        redis = "expire",
        name = "red::expire"
    )]
    async fn in_c(id: u64) -> String {
        load(id).await
    }

    let server = RedisServer::start();
    install(&server, "expire");
    assert_eq!(within(in_a(5)).await, "profile 5 v1");
    assert_eq!(within(in_b(5)).await, "profile 5 v1"); // now in both memories
    in_a::expire(5).await.unwrap();
    let key = server
        .key("test:{red::expire~*|5}:v")
        .expect("the value stays in Redis");
    let envelope: Vec<u8> = server.command(&["GET", &key]);
    let header = String::from_utf8_lossy(&envelope);
    let fresh_until: u64 = header.split(' ').nth(1).unwrap().parse().unwrap();
    let (seconds, micros): (u64, u64) = server.command(&["TIME"]);
    assert!(
        fresh_until <= seconds * 1_000 + micros / 1_000,
        "no longer fresh in Redis: {header:.60}"
    );
    let ttl: i64 = server.command(&["PTTL", &key]);
    assert!(
        ttl > 100_000,
        "its time to live stays (ttl + stale): {ttl} ms"
    );
    // Every process serves it stale while one refresh (2 s) replaces it: a call that waited
    // for the load would get v2.
    for _ in 0..5 {
        assert_eq!(within(in_b(5)).await, "profile 5 v1");
        assert_eq!(within(in_c(5)).await, "profile 5 v1");
    }
    eventually("the refresh to land", || LOADS.load(SeqCst) == 2).await;
    within(async {
        let v2 = || "profile 5 v2".to_owned();
        while (in_a(5).await, in_b(5).await, in_c(5).await) != (v2(), v2(), v2()) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(LOADS.load(SeqCst), 2, "one refresh across the processes");
}

/// `clear` (issue 37): every key of the cache's name leaves Redis and every process's memory;
/// a cache whose name only begins like it keeps its own.
#[tokio::test]
async fn a_clear_drops_every_key_of_the_name_from_redis_and_from_every_process() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    async fn load(id: u64) -> String {
        format!("row {id} #{}", LOADS.fetch_add(1, SeqCst) + 1)
    }
    #[cached(ttl = "60s", lock = "redis", redis = "clear", name = "red::clear")]
    async fn in_a(id: u64) -> String {
        load(id).await
    }
    #[cached(ttl = "60s", lock = "redis", redis = "clear", name = "red::clear")]
    async fn in_b(id: u64) -> String {
        load(id).await
    }
    #[cached(
        ttl = "60s",
        lock = "redis",
        backend = "redis",
        redis = "clear",
        name = "red::clear"
    )]
    async fn in_redis(id: u64) -> String {
        load(id).await
    }
    #[cached(ttl = "60s", lock = "redis", redis = "clear", name = "red::clear~more")]
    async fn neighbour(id: u64) -> String {
        load(id).await
    }

    let server = RedisServer::start();
    install(&server, "clear");
    for id in 0..30 {
        within(in_a(id)).await;
    }
    assert_eq!(within(in_b(7)).await, "row 7 #8", "read from Redis");
    assert_eq!(within(neighbour(7)).await, "row 7 #31");
    in_a::clear().await.unwrap();
    // The values go; the fences stay, moved on, as an invalidation leaves them.
    let left: Vec<String> = server.command(&["KEYS", "test:{red::clear~*:v"]);
    assert_eq!(
        left,
        vec![server.key("test:{red::clear~more~*|7}:v").unwrap()],
        "only the neighbour's value stays"
    );
    eventually("b to drop its memory", || {
        stampede::stats("red::clear").unwrap().entries == 0
    })
    .await;
    assert_eq!(within(in_b(7)).await, "row 7 #32", "loaded again");
    assert_eq!(within(in_a(7)).await, "row 7 #32", "from Redis");
    assert_eq!(
        within(in_redis(8)).await,
        "row 8 #33",
        "nothing left in Redis: a load"
    );
    assert_eq!(within(neighbour(7)).await, "row 7 #31", "untouched");
}

/// Options set at run time (`stampede::configure`) reach what a fill writes to Redis: the
/// envelope's windows are the new ones.
#[tokio::test]
async fn a_ttl_set_at_run_time_is_the_one_a_fill_writes_to_redis() {
    #[cached(
        ttl = "1h",
        jitter = 0,
        stale = "1h",
        lock = "redis",
        redis = "tuned",
        name = "red::tuned"
    )]
    async fn tuned(id: u64) -> u64 {
        id
    }

    let server = RedisServer::start();
    install(&server, "tuned");
    stampede::configure("red::tuned")
        .ttl(Duration::from_secs(20))
        .stale(Duration::from_secs(10))
        .apply()
        .unwrap();
    assert_eq!(within(tuned(3)).await, 3);
    let key = server.key("test:{red::tuned~*|3}:v").expect("filled");
    let envelope: Vec<u8> = server.command(&["GET", &key]);
    let header = String::from_utf8_lossy(&envelope);
    let numbers: Vec<u64> = header
        .split(' ')
        .skip(1)
        .take(3)
        .map(|word| word.parse().unwrap())
        .collect();
    let (fresh_until, stale_until, written_at) = (numbers[0], numbers[1], numbers[2]);
    assert_eq!(fresh_until - written_at, 20_000, "{header:.60}");
    assert_eq!(stale_until - fresh_until, 10_000, "{header:.60}");
    let ttl: i64 = server.command(&["PTTL", &key]);
    assert!(
        ttl <= 30_000,
        "kept for the new windows, not an hour's: {ttl} ms"
    );
}

/// An admin process that never called the function tells whether its invalidation reached a
/// value in Redis, under its shape or another of the name.
#[tokio::test]
async fn invalidate_found_tells_whether_redis_held_the_key() {
    #[cached(ttl = "60s", lock = "redis", redis = "found", name = "red::found")]
    async fn node(id: u64) -> String {
        format!("profile {id}")
    }
    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "found_admin",
        name = "red::found"
    )]
    async fn admin(id: u64) -> String {
        format!("profile {id}")
    }
    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "found_admin",
        name = "red::found"
    )]
    async fn reshaped(id: u64) -> u64 {
        id
    }

    let server = RedisServer::start();
    install(&server, "found");
    install(&server, "found_admin");
    assert_eq!(within(node(5)).await, "profile 5");
    assert!(within(admin::invalidate_found(5)).await.unwrap());
    assert_eq!(server.key("test:{red::found~*|5}:v"), None);
    assert!(
        !within(admin::invalidate_found(5)).await.unwrap(),
        "gone already"
    );
    assert!(
        !within(admin::invalidate_found(6)).await.unwrap(),
        "never filled"
    );
    // Another value shape is another cache in Redis, whose invalidation reaches this one's
    // value too (node registered its shape under the name), and says so.
    assert_eq!(within(node(7)).await, "profile 7");
    assert!(
        within(reshaped::invalidate_found(7)).await.unwrap(),
        "node's value, dropped by another shape's invalidation"
    );
    assert_eq!(server.key("test:{red::found~*|7}:v"), None);
}

#[tokio::test]
async fn a_load_running_during_an_invalidation_does_not_write_its_value_back() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "invalidate_race",
        name = "red::invalidate_race"
    )]
    async fn balance(account: u64) -> String {
        let n = LOADS.fetch_add(1, SeqCst) + 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
        format!("account {account} balance v{n}")
    }

    let server = RedisServer::start();
    install(&server, "invalidate_race");
    let running = tokio::spawn(balance(1));
    eventually("the load to start", || LOADS.load(SeqCst) == 1).await;
    within(stampede::invalidate("red::invalidate_race", (1u64,)))
        .await
        .unwrap();

    assert_eq!(
        within(running).await.unwrap(),
        "account 1 balance v1",
        "its caller still gets it"
    );
    assert_eq!(
        server.key("test:{red::invalidate_race~*|1}:v"),
        None,
        "not written back"
    );
    assert_eq!(
        within(balance(1)).await,
        "account 1 balance v2",
        "nor kept in memory"
    );
}

#[tokio::test]
async fn a_redis_only_cache_keeps_nothing_in_memory_and_reads_redis_on_every_call() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(
        ttl = "60s",
        lock = "redis",
        backend = "redis",
        redis = "redis_only",
        name = "red::redis_only"
    )]
    async fn permission(user: u64) -> Vec<String> {
        LOADS.fetch_add(1, SeqCst);
        tokio::time::sleep(Duration::from_millis(100)).await;
        vec![format!("user {user} may read")]
    }

    let server = RedisServer::start();
    install(&server, "redis_only");
    let calls: Vec<_> = (0..20).map(|_| tokio::spawn(permission(9))).collect();
    for call in calls {
        assert_eq!(within(call).await.unwrap(), ["user 9 may read"]);
    }
    for _ in 0..5 {
        assert_eq!(within(permission(9)).await, ["user 9 may read"]);
    }
    assert_eq!(LOADS.load(SeqCst), 1);
    let stats = stampede::stats("red::redis_only").unwrap();
    assert_eq!(
        (stats.hits, stats.entries),
        (0, 0),
        "nothing is kept in memory: {stats:?}"
    );
    assert_eq!(
        stats.remote_hits, 5,
        "each later call read Redis: {stats:?}"
    );

    // A change made in Redis is seen at once: there is no copy in memory to go stale.
    within(stampede::invalidate("red::redis_only", (9u64,)))
        .await
        .unwrap();
    assert_eq!(within(permission(9)).await, ["user 9 may read"]);
    assert_eq!(LOADS.load(SeqCst), 2);
}

#[tokio::test]
async fn a_waiter_is_woken_when_an_invalidation_discards_the_fill_it_waits_for() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "discarded",
        name = "red::discarded"
    )]
    async fn in_a(id: u64) -> u64 {
        LOADS.fetch_add(1, SeqCst);
        tokio::time::sleep(Duration::from_millis(400)).await;
        id
    }
    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "discarded",
        name = "red::discarded"
    )]
    async fn in_b(id: u64) -> u64 {
        LOADS.fetch_add(1, SeqCst);
        tokio::time::sleep(Duration::from_millis(100)).await;
        id
    }

    let server = RedisServer::start();
    install(&server, "discarded"); // lease 5 s
    let a = tokio::spawn(in_a(1));
    eventually("a to load", || LOADS.load(SeqCst) == 1).await;
    let started = Instant::now();
    let b = tokio::spawn(in_b(1));
    eventually("b to wait for a", || {
        stampede::stats("red::discarded").unwrap().lock_busy == 1
    })
    .await;
    within(stampede::invalidate("red::discarded", (1u64,)))
        .await
        .unwrap();

    assert_eq!(within(a).await.unwrap(), 1);
    assert_eq!(within(b).await.unwrap(), 1);
    let waited = started.elapsed();
    // a's fill is discarded; its empty publication sends b to read again and load, instead of
    // waiting out the 5 s lease.
    assert!(waited < Duration::from_millis(2_500), "b waited {waited:?}");
    assert_eq!(LOADS.load(SeqCst), 2);
}

#[tokio::test]
async fn a_flow_that_holds_the_lock_over_undecodable_bytes_loads_at_once() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    // `busy = "error"`: if the flow took its own lock for someone else's, it would fail.
    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "own_lock",
        busy = "error",
        name = "red::own_lock"
    )]
    async fn rate(id: u64) -> Result<String, AppError> {
        LOADS.fetch_add(1, SeqCst);
        Ok(format!("rate {id}"))
    }

    let server = RedisServer::start();
    RedisConfig::new(&server.url())
        .unwrap()
        .prefix("test")
        .lease(Duration::from_secs(60))
        .install_as("own_lock");
    assert_eq!(within(rate(1)).await.unwrap(), "rate 1");
    let first = server.key("test:{red::own_lock~*|1}:v").unwrap();
    let key = first.replace("|1}", "|2}");
    // Bytes another program wrote, with no header: not fresh, so the read takes the lock.
    let _: () = server.command(&["SET", &key, "not an envelope"]);
    assert_eq!(within(rate(2)).await.unwrap(), "rate 2");
    assert_eq!(LOADS.load(SeqCst), 2);
    let stored: Vec<u8> = server.command(&["GET", &key]);
    assert!(stored.starts_with(b"S3 "), "overwritten by the holder");
}

#[tokio::test]
async fn a_load_that_panics_gives_its_redis_lock_back() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", lock = "redis", redis = "panics", name = "red::panics")]
    async fn report(id: u64) -> Result<String, AppError> {
        if LOADS.fetch_add(1, SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            panic!("report {id} crashed the load");
        }
        Ok(format!("report {id}"))
    }

    let server = RedisServer::start();
    // A lease far longer than the test's waits: a lock that goes away was released.
    RedisConfig::new(&server.url())
        .unwrap()
        .prefix("test")
        .lease(Duration::from_secs(120))
        .install_as("panics");
    let crashed = tokio::spawn(report(1));
    eventually("the load to take the lock", || {
        server.key("test:{red::panics~*|1}:l").is_some()
    })
    .await;
    assert!(matches!(
        within(crashed).await.unwrap(),
        Err(AppError::Cache(stampede::Error::LoadPanicked { .. }))
    ));
    eventually("the panicked load's lock to be released", || {
        server.key("test:{red::panics~*|1}:l").is_none()
    })
    .await;
    assert_eq!(within(report(1)).await.unwrap(), "report 1");
}

#[tokio::test]
async fn invalidations_leave_no_state_in_redis_for_keys_nobody_fills() {
    #[cached(ttl = "60s", lock = "redis", redis = "bounded", name = "red::bounded")]
    async fn profile(id: u64) -> Result<String, AppError> {
        Ok(format!("profile {id}"))
    }

    let server = RedisServer::start();
    install(&server, "bounded");
    assert_eq!(within(profile(1)).await.unwrap(), "profile 1");
    let before: i64 = server.command(&["DBSIZE"]);
    for id in 1_000..2_000u64 {
        within(stampede::invalidate("red::bounded", (id,)))
            .await
            .unwrap();
    }
    let after: i64 = server.command(&["DBSIZE"]);
    assert_eq!(
        after, before,
        "a thousand invalidations of uncached keys wrote nothing"
    );
    // An invalidation of a cached key removes its value and leaves its fence to expire with it.
    within(stampede::invalidate("red::bounded", (1u64,)))
        .await
        .unwrap();
    assert_eq!(server.key("test:{red::bounded~*|1}:v"), None);
    let fence = server.key("test:{red::bounded~*|1}:f").unwrap();
    let ttl: i64 = server.command(&["PTTL", &fence]);
    assert!(ttl > 0, "the fence expires: {ttl}");
}

#[tokio::test]
async fn a_fill_keeps_the_keys_fence_as_long_as_its_value() {
    #[cached(
        ttl = "60s",
        stale = "30s",
        lock = "redis",
        redis = "kept",
        name = "red::kept"
    )]
    async fn profile(id: u64) -> Result<String, AppError> {
        Ok(format!("profile {id}"))
    }

    let server = RedisServer::start();
    install(&server, "kept");
    assert_eq!(within(profile(1)).await.unwrap(), "profile 1");
    let value = server.key("test:{red::kept~*|1}:v").unwrap();
    let fence = server.key("test:{red::kept~*|1}:f").unwrap();
    let value_ttl: i64 = server.command(&["PTTL", &value]);
    let fence_ttl: i64 = server.command(&["PTTL", &fence]);
    // The read that took the lock gave the fence the lease; the fill, the value's time to live.
    assert!(
        value_ttl > 80_000,
        "the value lives ttl + stale: {value_ttl}"
    );
    assert!(
        fence_ttl + 1_000 >= value_ttl,
        "the fence ({fence_ttl} ms) outlives the value ({value_ttl} ms)"
    );
}

#[tokio::test]
async fn require_redis_says_why_a_connection_cannot_be_used() {
    match within(stampede::require_redis(Some("never_installed"))).await {
        Err(stampede::Error::InvalidConfig { message }) => {
            assert!(message.contains("not configured"), "{message}")
        }
        other => panic!("expected InvalidConfig, got {other:?}"),
    }

    let server = RedisServer::start();
    install(&server, "required");
    within(stampede::require_redis(Some("required")))
        .await
        .expect("a running redis-server answers");

    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .unwrap()
        .port();
    RedisConfig::new(&format!("redis://127.0.0.1:{closed}/"))
        .unwrap()
        .install_as("required_down");
    assert!(matches!(
        within(stampede::require_redis(Some("required_down"))).await,
        Err(stampede::Error::RedisUnavailable { .. })
    ));
}

#[tokio::test]
async fn a_last_good_value_outlives_its_stale_deadline_in_redis_for_fail_safe() {
    static DOWN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    async fn load(id: u64) -> Result<String, AppError> {
        let n = LOADS.fetch_add(1, SeqCst) + 1;
        if DOWN.load(SeqCst) {
            return Err(AppError::Db(format!("load {n}: down")));
        }
        Ok(format!("quote {id} v{n}"))
    }
    #[cached(
        ttl = "200ms",
        jitter = 0,
        fail_safe = "1h",
        long_windows = true,
        lock = "redis",
        redis = "fail_safe",
        name = "red::fail_safe"
    )]
    async fn in_a(id: u64) -> Result<String, AppError> {
        load(id).await
    }
    #[cached(
        ttl = "200ms",
        jitter = 0,
        fail_safe = "1h",
        long_windows = true,
        lock = "redis",
        redis = "fail_safe",
        name = "red::fail_safe"
    )]
    async fn in_b(id: u64) -> Result<String, AppError> {
        load(id).await
    }

    let server = RedisServer::start();
    install(&server, "fail_safe");
    assert_eq!(within(in_a(1)).await.unwrap(), "quote 1 v1");
    let key = server.key("test:{red::fail_safe~*|1}:v").unwrap();
    let pttl: i64 = server.command(&["PTTL", &key]);
    assert!(
        pttl > 60_000,
        "Redis keeps the value for fail_safe: {pttl} ms"
    );
    DOWN.store(true, SeqCst);
    tokio::time::sleep(Duration::from_millis(300)).await; // past ttl (stale 0s)
    // The other process has no copy: it reads the expired value from Redis, its load fails,
    // and it answers with that last good value.
    assert_eq!(within(in_b(1)).await.unwrap(), "quote 1 v1");
    assert_eq!(LOADS.load(SeqCst), 2);
}

#[tokio::test]
async fn an_early_refresh_runs_once_across_processes() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    async fn load(id: u64) -> Result<String, AppError> {
        let n = LOADS.fetch_add(1, SeqCst) + 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
        Ok(format!("rate {id} v{n}"))
    }
    #[cached(
        ttl = "3s",
        jitter = 0,
        refresh_after = "1s",
        lock = "redis",
        redis = "ahead",
        name = "red::ahead"
    )]
    async fn in_a(id: u64) -> Result<String, AppError> {
        load(id).await
    }
    #[cached(
        ttl = "3s",
        jitter = 0,
        refresh_after = "1s",
        lock = "redis",
        redis = "ahead",
        name = "red::ahead"
    )]
    async fn in_b(id: u64) -> Result<String, AppError> {
        load(id).await
    }

    let server = RedisServer::start();
    // Generous bounds: on a loaded machine a subscription slower than the default 250ms would
    // make the second process load on its own, which this test is not about.
    RedisConfig::new(&server.url())
        .unwrap()
        .prefix("test")
        .op_timeout(Duration::from_secs(2))
        .install_as("ahead");
    assert_eq!(within(in_a(1)).await.unwrap(), "rate 1 v1");
    assert_eq!(within(in_b(1)).await.unwrap(), "rate 1 v1"); // from Redis
    tokio::time::sleep(Duration::from_millis(1_200)).await; // both copies past refresh_after
    // Both processes serve the value at once and start an early refresh: one loads.
    let (a, b) = tokio::join!(in_a(1), in_b(1));
    assert_eq!(
        (a.unwrap(), b.unwrap()),
        ("rate 1 v1".into(), "rate 1 v1".into())
    );
    // Real calls (memory of both may be dropped meanwhile: another test's Redis going away
    // makes this process distrust every Redis-backed memory; a call then reads Redis).
    within(async {
        loop {
            let (a, b) = (in_a(1).await.unwrap(), in_b(1).await.unwrap());
            if a == "rate 1 v2" && b == "rate 1 v2" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(
        LOADS.load(SeqCst),
        2,
        "the fill and one refresh, across both processes"
    );
}

/// Script calls the server has run so far (`EVALSHA`, and `EVAL` when a script was not loaded).
fn script_calls(server: &RedisServer) -> u64 {
    let info: String = server.command(&["INFO", "commandstats"]);
    info.lines()
        .filter(|line| line.starts_with("cmdstat_evalsha:") || line.starts_with("cmdstat_eval:"))
        .filter_map(|line| {
            line.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_of_a_key_another_process_filled_make_at_most_two_reads() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", lock = "redis", redis = "herd_read", name = "red::herd")]
    async fn in_a(id: u64) -> u64 {
        LOADS.fetch_add(1, SeqCst);
        id * 2
    }
    #[cached(ttl = "60s", lock = "redis", redis = "herd_read", name = "red::herd")]
    async fn in_b(id: u64) -> u64 {
        LOADS.fetch_add(1, SeqCst);
        id * 3
    }

    let server = RedisServer::start();
    install(&server, "herd_read");
    assert_eq!(within(in_a(7)).await, 14);
    let before = script_calls(&server);
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(100));
    let calls: Vec<_> = (0..100)
        .map(|_| {
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                in_b(7).await
            })
        })
        .collect();
    for call in calls {
        assert_eq!(
            within(call).await.unwrap(),
            14,
            "a's value, read from Redis"
        );
    }
    let reads = script_calls(&server) - before;
    println!("100 concurrent callers of a key in Redis: {reads} script calls");
    // One read on the first caller's task; at most one flight's read for those that came while
    // it ran; never one per caller.
    assert!(reads <= 2, "{reads} reads");
    assert_eq!(LOADS.load(SeqCst), 1);
}

/// A refresh whose fill another process's lock fenced off (it took the lock over while the
/// refresh's holder was paused past its lease, and has not filled) replaces the value Redis
/// holds, read before the refresh began, and moves the fence on: no process is served the older
/// value after this one handed out the newer one. Simulation seed 190888, in Redis's terms.
#[tokio::test]
async fn a_refresh_fenced_off_by_a_later_holder_replaces_the_older_value_in_redis() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);
    // The refresh's load ends only once the other process holds the lock: with a timed load, a
    // slow test (CI beside other work) moved the lock after the refresh had filled.
    static MOVED: tokio::sync::Notify = tokio::sync::Notify::const_new();

    #[cached(ttl = "60s", lock = "redis", redis = "retire", name = "red::retire")]
    async fn price(id: u64) -> String {
        let n = LOADS.fetch_add(1, SeqCst) + 1;
        if n == 2 {
            MOVED.notified().await;
        }
        format!("{id} v{n}")
    }
    #[cached(ttl = "60s", lock = "redis", redis = "retire", name = "red::retire")]
    async fn elsewhere(id: u64) -> String {
        format!("{id} loaded elsewhere")
    }

    let server = RedisServer::start();
    install(&server, "retire");
    assert_eq!(within(price(1)).await, "1 v1");
    let value = server.key("test:{red::retire~*|1}:v").unwrap();
    let (lock, fence) = (value.replace(":v", ":l"), value.replace(":v", ":f"));
    // Redis's clock counts milliseconds: a value written in the millisecond of the refresh's
    // read counts as written since it (not retired).
    tokio::time::sleep(Duration::from_millis(5)).await;
    let refresh = tokio::spawn(price::refresh(1));
    eventually("the refresh to begin its load", || LOADS.load(SeqCst) == 2).await;
    // Another process takes the lock, as `READ_OR_LOCK` does, and is still loading.
    let _: () = server.command(&["SET", &lock, "another", "PX", "30000"]);
    let _: u64 = server.command(&["INCR", &fence]);
    MOVED.notify_one();
    let moved: u64 = server.command(&["GET", &fence]);
    assert_eq!(within(refresh).await.unwrap(), "1 v2");
    let held: Vec<u8> = server.command(&["GET", &value]);
    let held = String::from_utf8_lossy(&held);
    assert!(
        held.ends_with("1 v2"),
        "Redis holds v2, not v1, which is older: {held}"
    );
    let fence_now: u64 = server.command(&["GET", &fence]);
    assert!(
        fence_now > moved,
        "the fence moved on past the other holder's"
    );
    assert_eq!(
        within(price(1)).await,
        "1 v2",
        "memory keeps the newer value"
    );
    let _: () = server.command(&["DEL", &lock]);
    assert_eq!(within(elsewhere(1)).await, "1 v2", "read from Redis");
}

/// A load's first attempt stalls to its timeout while another process primes the key, which
/// moves the fence on; its retry reads the source after the prime, so its value is newer, and
/// its fill replaces the primed value (read before the retry read the source) rather than
/// leaving it in Redis, where it was served after the newer value. Simulation seed 1367838, in
/// Redis's terms.
#[tokio::test]
async fn a_fill_fenced_off_by_a_prime_before_its_retry_replaces_the_primed_value() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);
    static PRIMED: AtomicBool = AtomicBool::new(false);

    #[cached(
        ttl = "60s",
        lock = "redis",
        backend = "redis",
        timeout = "1s",
        retries = 1,
        backoff = "1ms",
        redis = "retry_after_prime",
        name = "red::retry_after_prime"
    )]
    async fn price(id: u64) -> String {
        let n = LOADS.fetch_add(1, SeqCst) + 1;
        if n == 1 {
            std::future::pending::<()>().await; // stalls to the timeout
        }
        let after = if PRIMED.load(SeqCst) {
            "after"
        } else {
            "before"
        };
        format!("{id} v{n}, read {after} the prime")
    }
    #[cached(
        ttl = "60s",
        lock = "redis",
        backend = "redis",
        redis = "retry_after_prime",
        name = "red::retry_after_prime"
    )]
    async fn elsewhere(id: u64) -> String {
        format!("{id} loaded elsewhere")
    }

    let server = RedisServer::start();
    install(&server, "retry_after_prime");
    let first = tokio::spawn(price(7));
    eventually("the first attempt to begin", || LOADS.load(SeqCst) == 1).await;
    within(elsewhere::prime(7, "7 primed".to_owned()))
        .await
        .unwrap();
    PRIMED.store(true, SeqCst);
    let value = server.key("test:{red::retry_after_prime~*|7}:v").unwrap();
    assert_eq!(
        within(first).await.unwrap(),
        "7 v2, read after the prime",
        "the retry's value, newer than the prime's"
    );
    let held: Vec<u8> = server.command(&["GET", &value]);
    let held = String::from_utf8_lossy(&held);
    assert!(
        held.ends_with("7 v2, read after the prime"),
        "Redis holds the retry's value, not the primed one, which is older: {held}"
    );
    assert_eq!(within(price(7)).await, "7 v2, read after the prime");
    assert_eq!(
        within(elsewhere(7)).await,
        "7 v2, read after the prime",
        "read from Redis"
    );
}

/// With `lock = "redis"` a refresh loads under the key's Redis lock: another process's refresh
/// of the key meanwhile waits for its fill and returns it, rather than loading beside it (two
/// overlapping loads that nothing orders: simulation seed 44039).
#[tokio::test]
async fn refreshes_of_one_key_in_two_processes_share_one_load_under_the_redis_lock() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    async fn load(id: u64) -> String {
        let n = LOADS.fetch_add(1, SeqCst) + 1;
        tokio::time::sleep(Duration::from_millis(300)).await;
        format!("{id} v{n}")
    }
    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "refresh_lock",
        name = "red::refresh_lock"
    )]
    async fn in_a(id: u64) -> String {
        load(id).await
    }
    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "refresh_lock",
        name = "red::refresh_lock"
    )]
    async fn in_b(id: u64) -> String {
        load(id).await
    }

    let server = RedisServer::start();
    install(&server, "refresh_lock");
    assert_eq!(within(in_a(1)).await, "1 v1");
    assert_eq!(within(in_b(1)).await, "1 v1"); // from Redis
    let lock = server
        .key("test:{red::refresh_lock~*|1}:v")
        .unwrap()
        .replace(":v", ":l");
    let refresh = tokio::spawn(in_a::refresh(1));
    eventually("the refresh to begin its load", || LOADS.load(SeqCst) == 2).await;
    assert!(
        server.key(&lock).is_some(),
        "the refresh holds the key's lock"
    );
    assert_eq!(
        within(in_b::refresh(1)).await,
        "1 v2",
        "the other process's refresh returns the fill of the load that holds the lock"
    );
    assert_eq!(within(refresh).await.unwrap(), "1 v2");
    assert_eq!(LOADS.load(SeqCst), 2, "one load for both refreshes");
    assert_eq!(within(in_b(1)).await, "1 v2");
}

/// A companion's `refresh` that joins a flight serving the stale value while it reloads gets
/// the reloaded value: it asked for what the source holds now, not the value being replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresh_joining_a_flight_that_serves_stale_returns_the_reloaded_value() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(
        ttl = "300ms",
        jitter = 0,
        stale = "60s",
        backend = "tiered",
        redis = "refresh_joins_stale",
        name = "tier::refresh_joins_stale"
    )]
    async fn quote(id: u64) -> String {
        let n = LOADS.fetch_add(1, SeqCst) + 1;
        if n > 1 {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        format!("{id} v{n}")
    }

    let server = RedisServer::start();
    install(&server, "refresh_joins_stale");
    stampede::require_redis(Some("refresh_joins_stale"))
        .await
        .unwrap();
    assert_eq!(within(quote(1)).await, "1 v1");
    tokio::time::sleep(Duration::from_millis(400)).await; // stale, in memory and in Redis
    assert_eq!(
        within(quote(1)).await,
        "1 v1",
        "stale, served while it reloads"
    );
    eventually("the reload to begin", || LOADS.load(SeqCst) == 2).await;
    assert_eq!(within(quote::refresh(1)).await, "1 v2");
    assert_eq!(LOADS.load(SeqCst), 2, "the refresh joined the reload");
}

/// An admin tool that declares a Redis-backed cache but installs no `RedisConfig` reaches no
/// other process: its `invalidate`, `invalidate_found`, `prime` and `invalidate_tag` say so,
/// naming the connection, the cache or tag, and the fix, rather than `Ok`. (The only tagged
/// cache of this file: `invalidate_tag` is an error for every test of a binary that links it.)
#[tokio::test]
async fn an_invalidation_or_prime_without_a_configured_redis_is_an_error_that_says_so() {
    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "admin_never_installed",
        name = "red::admin",
        tags = ["admin-row:{id}"]
    )]
    async fn row(id: u64) -> u64 {
        id
    }

    for (outcome, named) in [
        (within(row::invalidate(1)).await.map(drop), "red::admin"),
        (
            within(row::invalidate_found(1)).await.map(drop),
            "red::admin",
        ),
        (
            within(stampede::invalidate("red::admin", (1u64,))).await,
            "red::admin",
        ),
        (within(row::prime(1, 1)).await, "red::admin"),
        (
            within(stampede::invalidate_tag("admin-row:1")).await,
            "admin-row:1",
        ),
    ] {
        match outcome {
            Err(stampede::Error::InvalidConfig { message }) => {
                for part in ["admin_never_installed", named, "install a RedisConfig"] {
                    assert!(message.contains(part), "{part:?} in {message}");
                }
            }
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    }
}

/// `memory_ttl` on a tiered cache: memory serves a value that long, then reads Redis again, so
/// a value another process wrote (here a `prime`, which other processes otherwise meet only
/// when their copy expires) is served within `memory_ttl`, without a load; a process of the
/// same cache without it keeps its copy for the `ttl`. Its `memory_ttl` and `ttl` come from the
/// code (a constant, a function), as a service's configuration gives them.
#[tokio::test]
async fn memory_ttl_bounds_how_long_memory_serves_a_value_before_redis_is_read_again() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);
    const MEMORY_TTL: &str = "300ms";
    fn ttl() -> Duration {
        Duration::from_secs(60)
    }

    #[cached(
        ttl = ttl,
        lock = "redis",
        memory_ttl = MEMORY_TTL,
        redis = "memory_ttl_a",
        name = "red::memory_ttl"
    )]
    async fn short_lived(id: u64) -> String {
        LOADS.fetch_add(1, SeqCst);
        format!("{id} v1")
    }
    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "memory_ttl_b",
        name = "red::memory_ttl"
    )]
    async fn long_lived(id: u64) -> String {
        LOADS.fetch_add(1, SeqCst);
        format!("{id} v1")
    }
    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "memory_ttl_c",
        name = "red::memory_ttl"
    )]
    async fn writer(id: u64) -> String {
        format!("{id} never loaded")
    }

    let server = RedisServer::start();
    for name in ["memory_ttl_a", "memory_ttl_b", "memory_ttl_c"] {
        install(&server, name);
    }
    assert_eq!(within(short_lived(1)).await, "1 v1");
    assert_eq!(within(long_lived(1)).await, "1 v1", "read from Redis");
    within(writer::prime(1, "1 v2".to_owned())).await.unwrap();
    assert_eq!(
        within(short_lived(1)).await,
        "1 v1",
        "memory still serves its copy"
    );
    let started = Instant::now();
    loop {
        let value = within(short_lived(1)).await;
        if value == "1 v2" {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "memory_ttl = 300ms, yet still {value:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        within(long_lived(1)).await,
        "1 v1",
        "without memory_ttl, memory keeps its copy for the ttl"
    );
    assert_eq!(LOADS.load(SeqCst), 1, "Redis was read, not the source");
}

/// A companion's `read_through` reads Redis whatever this process's memory holds: a value
/// another process wrote (a `prime`, which other processes otherwise meet only when their copy
/// expires) is returned at once, without a load, and kept in memory for the calls after it.
#[tokio::test]
async fn read_through_returns_what_redis_holds_whatever_memory_holds() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "through_a",
        name = "red::through"
    )]
    async fn price(id: u64) -> String {
        LOADS.fetch_add(1, SeqCst);
        format!("{id} v1")
    }
    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "through_b",
        name = "red::through"
    )]
    async fn writer(id: u64) -> String {
        format!("{id} never loaded")
    }

    let server = RedisServer::start();
    install(&server, "through_a");
    install(&server, "through_b");
    assert_eq!(within(price(1)).await, "1 v1");
    within(writer::prime(1, "1 v2".to_owned())).await.unwrap();
    assert_eq!(within(price(1)).await, "1 v1", "memory serves its copy");
    assert_eq!(within(price::read_through(1)).await, "1 v2");
    assert_eq!(within(price(1)).await, "1 v2", "kept in memory");
    assert_eq!(LOADS.load(SeqCst), 1, "Redis was read, not the source");
    // With nothing fresh in Redis, it loads, once for callers that come together.
    let _: () = server.command(&["FLUSHDB"]);
    let calls: Vec<_> = (0..8)
        .map(|_| tokio::spawn(price::read_through(1)))
        .collect();
    for call in calls {
        assert_eq!(within(call).await.unwrap(), "1 v1");
    }
    assert_eq!(LOADS.load(SeqCst), 2, "one load for the eight");
}

/// The round trips of the calls below, in the order the server ran them, without the feed's
/// heartbeats (`PUBLISH` on their own every second) and the test's own commands.
fn trips(monitor: &Monitor, server: &RedisServer) -> Vec<String> {
    let mut sent = monitor.sent(server);
    sent.retain(|command| !matches!(command.as_str(), "publish" | "spublish" | "ping"));
    sent
}

/// A key of a cache with memory in front of Redis that this process lacks costs its caller the
/// round trips the design counts, whatever Redis holds: two beyond the load when Redis has no
/// value (one script reads the key and takes its lock, one fills, publishes and releases), one
/// when another process filled it (the same script finds the value). A cache without memory
/// (`backend = "redis"`), which finds most keys in Redis, reads them with a plain pipeline
/// (`GETRANGE` and `TIME`) before the flight, as a cache with memory does for a key whose value
/// lapsed there before it did in Redis (`memory_ttl`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_miss_costs_two_round_trips_and_a_value_in_redis_one() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", lock = "redis", redis = "trips", name = "red::trips")]
    async fn in_a(id: u64) -> u64 {
        LOADS.fetch_add(1, SeqCst);
        id * 2
    }
    #[cached(ttl = "60s", lock = "redis", redis = "trips", name = "red::trips")]
    async fn in_b(id: u64) -> u64 {
        LOADS.fetch_add(1, SeqCst);
        id * 3
    }
    #[cached(
        ttl = "60s",
        lock = "redis",
        backend = "redis",
        redis = "trips",
        name = "red::trips"
    )]
    async fn without_memory(id: u64) -> u64 {
        LOADS.fetch_add(1, SeqCst);
        id * 5
    }

    #[cached(
        ttl = "60s",
        lock = "redis",
        memory_ttl = "1ms",
        redis = "trips",
        name = "red::trips_lapsing"
    )]
    async fn lapsing(id: u64) -> u64 {
        LOADS.fetch_add(1, SeqCst);
        id * 7
    }

    #[cached(
        ttl = "50ms",
        lock = "redis",
        redis = "trips",
        name = "red::trips_expiring"
    )]
    async fn expiring(id: u64) -> u64 {
        LOADS.fetch_add(1, SeqCst);
        id * 11
    }

    let server = RedisServer::start();
    install(&server, "trips");
    // The connection made, the scripts loaded and the cache's shape registered before counting.
    assert_eq!(within(in_a(1)).await, 2);
    assert_eq!(within(in_b(1)).await, 2);
    assert_eq!(within(without_memory(1)).await, 2);
    assert_eq!(within(lapsing(1)).await, 7);
    assert_eq!(within(expiring(1)).await, 11);
    let monitor = Monitor::start(&server);

    assert_eq!(within(in_a(7)).await, 14);
    let cold = trips(&monitor, &server);
    assert_eq!(within(in_b(7)).await, 14, "a's value, read from Redis");
    let read = trips(&monitor, &server);
    assert_eq!(
        within(without_memory(7)).await,
        14,
        "a's value, read from Redis"
    );
    let unheld = trips(&monitor, &server);
    assert_eq!(within(lapsing(7)).await, 49);
    tokio::time::sleep(Duration::from_millis(20)).await; // past `memory_ttl`
    let _ = trips(&monitor, &server);
    assert_eq!(within(lapsing(7)).await, 49, "its value, read from Redis");
    let lapsed = trips(&monitor, &server);
    assert_eq!(within(expiring(7)).await, 77);
    tokio::time::sleep(Duration::from_millis(100)).await; // past `ttl`, here and in Redis
    let _ = trips(&monitor, &server);
    assert_eq!(within(expiring(7)).await, 77);
    let expired = trips(&monitor, &server);
    println!(
        "a cold key: {cold:?}; filled by another process: {read:?}; without memory: {unheld:?}; \
         lapsed in memory: {lapsed:?}; expired: {expired:?}"
    );
    assert_eq!(cold, ["evalsha", "evalsha"], "read-and-lock, then fill");
    assert_eq!(read, ["evalsha"], "read-and-lock finds the value");
    assert_eq!(unheld, ["getrange", "time"], "the pipelined read");
    assert_eq!(
        lapsed,
        ["getrange", "time"],
        "a key memory held, as likely in Redis: the pipelined read"
    );
    assert_eq!(
        expired,
        ["evalsha", "evalsha"],
        "a key memory held as long as Redis: read-and-lock, then fill"
    );
    // Keys 1 and 7 of each of the three names, once, and `expiring(7)` again.
    assert_eq!(LOADS.load(SeqCst), 7);
}

//! What a process serves around a Redis outage and around another process's writes, against a
//! real `redis-server` behind a fault proxy: values it loaded while Redis was down are trusted
//! no longer than the documented bound, Redis's pre-outage value never follows a newer one this
//! process served, an invalidation that failed during the outage is applied once Redis answers,
//! a fill that another process's prime fenced off is not followed by an older value, and an
//! early refresh (`refresh_after`) still loads when the round trip to Redis varies.
//!
//! An outage sends the proxy's new connections to a port nothing listens on and cuts the open
//! ones, so every reconnect fails until the proxy points at the server again. Two caches with one
//! `name` and their own connections stand for two processes; invalidations made "elsewhere" are
//! the commands another process sends. The tests take turns (`serial`): a process that loses its
//! feed drops the memory of every Redis-backed cache of the name, and the timings are real.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::time::{Duration, Instant};

use common::fault_proxy::FaultProxy;
use common::redis_server::RedisServer;
use common::{AppError, within};
use stampede::{RedisConfig, cached};
use tokio::sync::Semaphore;

/// The feed's heartbeat here, and the bound it gives with the default operation timeout
/// (250 ms): `2 × heartbeat + op_timeout`, as `RedisConfig::heartbeat` documents.
const HEARTBEAT: Duration = Duration::from_millis(300);
const STALENESS_BOUND: Duration = Duration::from_millis(2 * 300 + 250);
/// Room for a loaded machine on top of a documented bound, and for the call that observes it.
const SLACK: Duration = Duration::from_secs(2);

async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    SERIAL.lock().await
}

fn install(url: &str, connection: &str) {
    RedisConfig::new(url)
        .unwrap()
        .prefix("test")
        .heartbeat(HEARTBEAT)
        .cooldown(Duration::from_millis(200), 1)
        .install_as(connection);
}

fn recover(proxy: &FaultProxy, server: &RedisServer) {
    proxy.retarget(server.port());
}

/// The version in a value `"<id> v<version>"`.
fn version(value: &str) -> usize {
    value.rsplit_once(" v").unwrap().1.parse().unwrap()
}

/// Calls `call` every 20 ms until its value satisfies `done`, failing after `bound`; returns the
/// value and when it came.
async fn until_value<F, Fut>(
    what: &str,
    bound: Duration,
    mut call: F,
    done: impl Fn(&str) -> bool,
) -> (String, Duration)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = String>,
{
    let started = Instant::now();
    loop {
        let value = within(call()).await;
        if done(&value) {
            return (value, started.elapsed());
        }
        assert!(
            started.elapsed() < bound,
            "{what}: still {value:?} after {bound:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Another process updated the source and invalidated the key: its value is gone from Redis and
/// the key is announced on the invalidation channel.
fn invalidate_elsewhere(server: &RedisServer, name: &str, id: u64) {
    let _: () = server.command(&["FLUSHDB"]);
    let message = format!("{name}\n{id}");
    let _: i64 = server.command(&["PUBLISH", "test:invalidations", &message]);
}

/// A partitioned process loads locally; another process invalidates the key through Redis,
/// which the partitioned one cannot hear. The partitioned process must stop serving its local
/// value within the staleness bound, while the partition lasts, not when Redis comes back.
#[tokio::test]
async fn a_value_loaded_while_redis_is_down_is_trusted_no_longer_than_the_bound() {
    let _serial = serial().await;
    static VERSION: AtomicUsize = AtomicUsize::new(1);
    let name = "recovery::degraded";

    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "rec_degraded",
        name = "recovery::degraded"
    )]
    async fn item(id: u64) -> String {
        format!("{id} v{}", VERSION.load(SeqCst))
    }

    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    install(&proxy.url(), "rec_degraded");
    assert_eq!(within(item(1)).await, "1 v1");

    proxy.outage();
    // Past the bound, the process knows its feed is gone and has dropped its memory.
    tokio::time::sleep(STALENESS_BOUND + Duration::from_millis(500)).await;
    VERSION.store(2, SeqCst);
    assert_eq!(
        within(item(1)).await,
        "1 v2",
        "loaded here, Redis being down"
    );
    assert!(stampede::stats(name).unwrap().degraded >= 1);

    VERSION.store(3, SeqCst);
    invalidate_elsewhere(&server, name, 1);
    let (_, after) = until_value(
        "the partitioned process to stop serving its local value",
        STALENESS_BOUND + SLACK,
        || item(1),
        |value| value == "1 v3",
    )
    .await;
    println!("the local value was replaced {after:?} after the invalidation elsewhere");
    recover(&proxy, &server);
}

/// The double failure: with `fail_safe`, a process whose feed was lost with Redis no longer
/// serves its values (they may have been invalidated unheard), but keeps them as its last good
/// values: when the source fails too, a call gets the value served a moment before, not the
/// source's error. (Before, the process dropped its memory with the feed, and the call failed.)
#[tokio::test]
async fn with_fail_safe_a_value_kept_through_a_lost_feed_is_served_when_the_source_fails_too() {
    let _serial = serial().await;
    static FAILING: AtomicBool = AtomicBool::new(false);
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(
        ttl = "60s",
        lock = "redis",
        fail_safe = "10m",
        redis = "rec_double",
        name = "recovery::double"
    )]
    async fn item(id: u64) -> Result<String, AppError> {
        LOADS.fetch_add(1, SeqCst);
        match FAILING.load(SeqCst) {
            true => Err(AppError::Db("the database is down too".into())),
            false => Ok(format!("{id} v1")),
        }
    }

    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    install(&proxy.url(), "rec_double");
    assert_eq!(within(item(1)).await.unwrap(), "1 v1");

    proxy.outage();
    // Past the bound, the process knows its feed is gone: the value is no longer served as is.
    tokio::time::sleep(STALENESS_BOUND + Duration::from_millis(500)).await;
    FAILING.store(true, SeqCst);
    assert_eq!(
        within(item(1))
            .await
            .expect("the last good value, not the source's error"),
        "1 v1"
    );
    assert_eq!(LOADS.load(SeqCst), 2, "the source was asked, and failed");
    assert!(
        stampede::stats("recovery::double")
            .unwrap()
            .fail_safe_served
            >= 1
    );
    recover(&proxy, &server);
}

/// The process served a value it loaded while Redis was down; Redis still holds the value from
/// before the outage. Once Redis answers again, the process must not hand out that older value.
#[tokio::test]
async fn redis_s_pre_outage_value_never_follows_a_newer_one_served_during_the_outage() {
    let _serial = serial().await;
    static VERSION: AtomicUsize = AtomicUsize::new(1);
    let name = "recovery::regress";

    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "rec_regress",
        name = "recovery::regress"
    )]
    async fn item(id: u64) -> String {
        format!("{id} v{}", VERSION.load(SeqCst))
    }

    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    install(&proxy.url(), "rec_regress");
    assert_eq!(within(item(1)).await, "1 v1", "v1 is in Redis for 60 s");

    proxy.outage();
    tokio::time::sleep(STALENESS_BOUND + Duration::from_millis(500)).await;
    VERSION.store(2, SeqCst);
    assert_eq!(
        within(item(1)).await,
        "1 v2",
        "loaded here, Redis being down"
    );

    recover(&proxy, &server);
    let locks = stampede::stats(name).unwrap().lock_acquired;
    // Until the process reads Redis again (its local value's trust has lapsed by then), and a
    // while after: never v1 again.
    let started = Instant::now();
    while started.elapsed() < STALENESS_BOUND + SLACK
        || stampede::stats(name).unwrap().lock_acquired == locks
    {
        let value = within(item(1)).await;
        assert!(version(&value) >= 2, "served {value:?} after serving v2");
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the process did not load through Redis again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An invalidation made while Redis is down cannot reach Redis: it returns an error, and once
/// Redis answers again it is applied there, so another process stops reading the old value.
#[tokio::test]
async fn an_invalidation_that_failed_during_an_outage_is_applied_once_redis_answers() {
    let _serial = serial().await;
    static VERSION: AtomicUsize = AtomicUsize::new(1);
    let name = "recovery::late_invalidation";

    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "rec_late_proxied",
        name = "recovery::late_invalidation"
    )]
    async fn admin(id: u64) -> String {
        format!("{id} v{}", VERSION.load(SeqCst))
    }
    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "rec_late_direct",
        name = "recovery::late_invalidation"
    )]
    async fn node(id: u64) -> String {
        format!("{id} v{}", VERSION.load(SeqCst))
    }

    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    install(&proxy.url(), "rec_late_proxied");
    install(&server.url(), "rec_late_direct");
    assert_eq!(within(admin(5)).await, "5 v1", "v1 is in Redis for 60 s");

    proxy.outage();
    VERSION.store(2, SeqCst);
    let refused = within(admin::invalidate(5)).await;
    assert!(
        matches!(refused, Err(stampede::Error::RedisUnavailable { .. })),
        "{refused:?}"
    );
    recover(&proxy, &server);

    // Any call of the admin process that reaches Redis applies what it could not send.
    let locks = stampede::stats(name).unwrap().lock_acquired;
    let mut other = 100;
    while stampede::stats(name).unwrap().lock_acquired == locks {
        other += 1;
        within(admin(other)).await;
        assert!(other < 1_000, "the admin process did not reach Redis again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_, after) = until_value(
        "the other process to stop reading the invalidated value",
        SLACK,
        || node(5),
        |value| value == "5 v2",
    )
    .await;
    println!("applied {after:?} after the admin process reached Redis again");
}

/// A process's load reads the source, then another process writes the source and primes the
/// key with the new value, which moves the key's fence, so the load's fill is refused. The
/// primed value is the one Redis keeps (the fence orders the two): the load's callers and the
/// calls after them get it, never the load's older value.
#[tokio::test]
async fn a_fill_fenced_off_by_another_process_s_prime_gives_way_to_the_primed_value() {
    let _serial = serial().await;
    static VERSION: AtomicUsize = AtomicUsize::new(1);
    static GATE: Semaphore = Semaphore::const_new(0);

    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "rec_fence_a",
        name = "recovery::fence"
    )]
    async fn slow(id: u64) -> String {
        let read = format!("{id} v{}", VERSION.load(SeqCst));
        GATE.acquire().await.unwrap().forget();
        read
    }
    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "rec_fence_b",
        name = "recovery::fence"
    )]
    async fn other(id: u64) -> String {
        format!("{id} v{}", VERSION.load(SeqCst))
    }

    let server = RedisServer::start();
    install(&server.url(), "rec_fence_a");
    install(&server.url(), "rec_fence_b");
    let name = "recovery::fence";

    let load = tokio::spawn(slow(1));
    common::eventually("the slow load to hold the lock", || {
        stampede::stats(name).is_some_and(|stats| stats.lock_acquired == 1)
    })
    .await;
    VERSION.store(2, SeqCst);
    within(other::prime(1, "1 v2".to_owned())).await.unwrap();
    GATE.add_permits(1);
    assert_eq!(within(load).await.unwrap(), "1 v2", "the load's callers");
    assert_eq!(within(slow(1)).await, "1 v2", "not the load's older value");
    assert_eq!(within(other(1)).await, "1 v2", "the other process");
}

/// A prime is the latest write. A load without the Redis lock (`lock = "local"` on a tiered
/// cache) read the source before another process wrote it and primed the new value; the load's
/// fill lands in Redis while the prime is on its way (its link is slow). The prime must win:
/// Redis and the priming process end with the primed value (the loading process keeps what its
/// load returned until it expires, as other processes keep their copies after a prime).
#[tokio::test]
async fn a_prime_wins_over_an_unlocked_fill_that_lands_while_it_is_on_its_way() {
    let _serial = serial().await;
    static VERSION: AtomicUsize = AtomicUsize::new(1);
    static GATE: Semaphore = Semaphore::const_new(0);
    static LOADING: AtomicUsize = AtomicUsize::new(0);

    #[cached(
        ttl = "60s",
        backend = "tiered",
        lock = "local",
        redis = "rec_prime_loader",
        name = "recovery::prime"
    )]
    async fn loader(id: u64) -> String {
        let read = format!("{id} v{}", VERSION.load(SeqCst));
        LOADING.fetch_add(1, SeqCst);
        GATE.acquire().await.unwrap().forget();
        read
    }
    #[cached(
        ttl = "60s",
        backend = "tiered",
        lock = "local",
        redis = "rec_prime_writer",
        name = "recovery::prime"
    )]
    async fn writer(id: u64) -> String {
        format!("{id} v{}", VERSION.load(SeqCst))
    }

    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    install(&server.url(), "rec_prime_loader");
    RedisConfig::new(&proxy.url())
        .unwrap()
        .prefix("test")
        .heartbeat(HEARTBEAT)
        .op_timeout(Duration::from_secs(3))
        .install_as("rec_prime_writer");
    within(writer(0)).await; // connected

    let load = tokio::spawn(loader(1));
    common::eventually("the load to read the source", || LOADING.load(SeqCst) == 1).await;
    VERSION.store(2, SeqCst);
    proxy.delay(Duration::from_millis(400));
    let prime = tokio::spawn(writer::prime(1, "1 v2".to_owned()));
    // The prime's first command reaches Redis after 400 ms, its answer comes back after 800:
    // the load's fill lands in between.
    tokio::time::sleep(Duration::from_millis(600)).await;
    GATE.add_permits(1);
    let loaded = within(load).await.unwrap();
    within(prime).await.unwrap().unwrap();
    proxy.pass();

    let key = server
        .key("test:{recovery::prime~*|1}:v")
        .expect("a value in Redis");
    let stored: Vec<u8> = server.command(&["GET", &key]);
    assert!(
        String::from_utf8_lossy(&stored).ends_with("1 v2"),
        "Redis holds {:?}",
        String::from_utf8_lossy(&stored)
    );
    println!("the load's callers got {loaded:?}");
    assert_eq!(within(writer(1)).await, "1 v2", "the priming process");
}

/// With `refresh_after`, a value read from Redis is refreshed early by one process. Its fill
/// time is translated from the server's clock through a round trip; when the round trip of the
/// refresh's read is longer than the first read's, the same value must still be recognised as
/// the one to replace, and loaded, before the TTL ends.
#[tokio::test]
async fn an_early_refresh_still_loads_when_the_round_trip_to_redis_grows() {
    let _serial = serial().await;
    static VERSION: AtomicUsize = AtomicUsize::new(1);

    #[cached(
        ttl = "10s",
        refresh_after = "1s",
        lock = "redis",
        redis = "rec_refresh_proxied",
        name = "recovery::refresh"
    )]
    async fn reader(id: u64) -> String {
        format!("{id} v{}", VERSION.load(SeqCst))
    }
    #[cached(
        ttl = "10s",
        refresh_after = "1s",
        lock = "redis",
        redis = "rec_refresh_direct",
        name = "recovery::refresh"
    )]
    async fn writer(id: u64) -> String {
        format!("{id} v{}", VERSION.load(SeqCst))
    }

    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    RedisConfig::new(&proxy.url())
        .unwrap()
        .prefix("test")
        .op_timeout(Duration::from_secs(2))
        .install_as("rec_refresh_proxied");
    install(&server.url(), "rec_refresh_direct");
    // The reader's link is up and the server has the scripts before timing matters.
    within(reader(99)).await;
    assert_eq!(within(writer(1)).await, "1 v1");
    let filled = Instant::now();
    assert_eq!(within(reader(1)).await, "1 v1", "read from Redis");
    VERSION.store(2, SeqCst);

    // From now on the reader's round trip grows by 2 ms a call (every 20 ms or so), so each early
    // refresh reads the value with a later translated fill time than the read before it.
    let mut delay = Duration::ZERO;
    let (_, _) = until_value(
        "the early refresh to load the new version",
        Duration::from_secs(8),
        || {
            delay += Duration::from_millis(2);
            proxy.delay(delay);
            reader(1)
        },
        |value| value == "1 v2",
    )
    .await;
    proxy.pass();
    println!("refreshed {:?} after the fill, TTL 10 s", filled.elapsed());
}

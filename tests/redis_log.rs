//! The invalidation log (issue 36), against a real `redis-server` behind a fault proxy: a
//! process whose feed was lost reads what it missed from the log when it subscribes again,
//! drops exactly the keys invalidated meanwhile and serves the rest of its memory again; when
//! the log cannot cover the gap (trimmed past its position, or the server restarted empty), it
//! drops its memory.
//!
//! An outage sends the proxy's new connections to a port nothing listens on and cuts the open
//! ones. Invalidations made "elsewhere" are the commands another process's invalidation runs: the
//! value deleted, the message appended to the log and published. The tests take turns
//! (`serial`): a process that loses its feed takes every Redis-backed cache of it out of service.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use common::fault_proxy::FaultProxy;
use common::redis_server::RedisServer;
use common::{eventually, telemetry, within};
use stampede::{RedisConfig, cached};

const HEARTBEAT: Duration = Duration::from_millis(300);
/// `2 × heartbeat + op_timeout` (250 ms by default), as `RedisConfig::heartbeat` documents: what
/// a process held when its feed was lost is served no longer than that after the last heartbeat
/// it heard, which was before the loss.
const STALENESS_BOUND: Duration = Duration::from_millis(2 * 300 + 250);
/// Long enough for a few heartbeats to come back: the process knows its position in the log.
const SETTLED: Duration = Duration::from_millis(1_500);
const LOG: &str = "test:invalidations:log";

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

/// Another process invalidated key `id` of the cache `name`: its value deleted, the message
/// appended to the feed's log and published, as the runtime's `INVALIDATE` script does.
fn invalidate_elsewhere(server: &RedisServer, name: &str, id: u64) {
    if let Some(key) = server.key(&format!("test:{{{name}~*|{id}}}:v")) {
        let _: i64 = server.command(&["DEL", &key]);
    }
    let message = format!("{name}\n{id}");
    let _: String = server.command(&["XADD", LOG, "*", "m", &message]);
    let _: i64 = server.command(&["PUBLISH", "test:invalidations", &message]);
}

/// Waits until the connection `redis` has had its feed back `counter` times more than `before`.
async fn feed_back(counter: &str, redis: &str, before: u64) {
    let counted = || telemetry::counter(counter, &[("redis", redis)]);
    eventually(&format!("{counter} for {redis}"), || counted() > before).await;
}

/// The feed is lost while another process invalidates one of two keys this process holds; once
/// it is back, the process has dropped that key and serves the other from memory again, without
/// a load. (Before the log, it dropped both, when the feed was lost and again when it was back.)
#[tokio::test]
async fn a_feed_back_reads_what_it_missed_from_the_log_and_serves_the_rest_again() {
    let _serial = serial().await;
    static VERSION: AtomicUsize = AtomicUsize::new(1);
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "log_replay",
        name = "log::replay"
    )]
    async fn item(id: u64) -> String {
        LOADS.fetch_add(1, SeqCst);
        format!("{id} v{}", VERSION.load(SeqCst))
    }

    telemetry::install();
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    install(&proxy.url(), "log_replay");
    assert_eq!(within(item(1)).await, "1 v1");
    assert_eq!(within(item(2)).await, "2 v1");
    tokio::time::sleep(SETTLED).await;

    let replayed = telemetry::counter("cache_feed_replayed_total", &[("redis", "log_replay")]);
    proxy.outage();
    eventually("memory out of service once the feed is lost", || {
        item::peek(2).is_none()
    })
    .await;
    VERSION.store(2, SeqCst);
    invalidate_elsewhere(&server, "log::replay", 1);
    proxy.retarget(server.port());
    feed_back("cache_feed_replayed_total", "log_replay", replayed).await;

    assert_eq!(
        item::peek(2).as_deref(),
        Some("2 v1"),
        "not invalidated meanwhile: served from memory again"
    );
    assert_eq!(item::peek(1), None, "invalidated meanwhile: dropped");
    assert_eq!(within(item(2)).await, "2 v1");
    assert_eq!(within(item(1)).await, "1 v2");
    assert_eq!(
        LOADS.load(SeqCst),
        3,
        "one load after the feed is back: key 1's"
    );
}

/// When the log no longer holds the process's position (trimmed past it), or the server it
/// hears again is another run (restarted empty), the process cannot know what it missed: it
/// drops its memory.
#[tokio::test]
async fn a_log_trimmed_past_the_position_or_a_restarted_server_drops_memory() {
    let _serial = serial().await;
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", lock = "redis", redis = "log_gap", name = "log::gap")]
    async fn item(id: u64) -> String {
        LOADS.fetch_add(1, SeqCst);
        format!("{id} v1")
    }

    telemetry::install();
    let mut server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    install(&proxy.url(), "log_gap");
    let gaps = || telemetry::counter("cache_feed_gap_total", &[("redis", "log_gap")]);

    // Trimmed: more invalidations than the log keeps came and went while it was away.
    assert_eq!(within(item(1)).await, "1 v1");
    tokio::time::sleep(SETTLED).await;
    let before = gaps();
    let lost = tokio::time::Instant::now();
    proxy.outage();
    invalidate_elsewhere(&server, "log::other", 9);
    let _: i64 = server.command(&["XTRIM", LOG, "MAXLEN", "0"]);
    invalidate_elsewhere(&server, "log::other", 10);
    proxy.retarget(server.port());
    feed_back("cache_feed_gap_total", "log_gap", before).await;
    // What it held stays servable until the bound after the last heartbeat it heard, no later.
    tokio::time::sleep_until(lost + STALENESS_BOUND).await;
    assert_eq!(
        item::peek(1),
        None,
        "memory dropped: the log does not reach back"
    );

    // Restarted: the log the server holds now is another run's.
    assert_eq!(within(item(1)).await, "1 v1");
    tokio::time::sleep(SETTLED).await;
    let before = gaps();
    let lost = tokio::time::Instant::now();
    server.restart();
    invalidate_elsewhere(&server, "log::other", 11);
    feed_back("cache_feed_gap_total", "log_gap", before).await;
    tokio::time::sleep_until(lost + STALENESS_BOUND).await;
    assert_eq!(item::peek(1), None, "memory dropped: the server restarted");
}

/// A key a process loaded while Redis was down is dropped from Redis once it answers, and
/// announced to every process only if Redis held a value of it (older than the one served): a
/// server that restarted empty holds none, so no process drops what it loaded meanwhile, which
/// it keeps for its trust while deaf. (Before, the announcement dropped it everywhere, and every
/// instance of a fleet loaded its hot keys again at Redis's return.)
#[tokio::test]
async fn a_key_loaded_while_redis_was_down_is_not_announced_over_a_server_that_holds_none() {
    let _serial = serial().await;
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", lock = "redis", redis = "log_dirty", name = "log::dirty")]
    async fn item(id: u64) -> String {
        let n = LOADS.fetch_add(1, SeqCst) + 1;
        format!("{id} v{n}")
    }

    telemetry::install();
    let mut server = RedisServer::start();
    RedisConfig::new(&server.url())
        .unwrap()
        .prefix("test")
        .heartbeat(HEARTBEAT)
        .cooldown(Duration::from_millis(200), 1)
        .trust_while_deaf(Duration::from_secs(60))
        .install_as("log_dirty");
    assert_eq!(within(item(0)).await, "0 v1");
    tokio::time::sleep(SETTLED).await;

    server.kill();
    // The feed's loss is noticed (at the latest the bound after the last heartbeat heard)
    // before key 1 is loaded; key 0, held then, stays in service within the trust while deaf.
    tokio::time::sleep(STALENESS_BOUND).await;
    assert_eq!(
        item::peek(0).as_deref(),
        Some("0 v1"),
        "held when the feed was lost: trusted for the connection's 60 s"
    );
    assert_eq!(
        within(item(1)).await,
        "1 v2",
        "loaded here, Redis being down"
    );
    let before = telemetry::counter("cache_feed_gap_total", &[("redis", "log_dirty")]);
    server.restart();
    feed_back("cache_feed_gap_total", "log_dirty", before).await;
    // Redis answers: the task that drops the key there tries once per operation timeout
    // (250 ms), and an announcement would reach this process's feed at once; Redis keeps no
    // trace of a key invalidated with no value, so the test gives it a second.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        item::peek(1).as_deref(),
        Some("1 v2"),
        "kept: Redis held no older value to announce"
    );
    assert_eq!(within(item(1)).await, "1 v2");
    assert_eq!(LOADS.load(SeqCst), 2);
}

//! The Redis tier under network and server faults, through a fault proxy between the caches and
//! a real `redis-server` per test: half-open (blackholed) connections, a failover behind DNS
//! (`READONLY`), errors about one key, a lost invalidation feed, an invalidation that lands while
//! a slow read is on the wire, and durations up to `Duration::MAX`.
//!
//! Two caches with one `name` and their own Redis connections stand for two processes, except
//! for invalidations: this process's feed drops a key from every cache of its name, so another
//! process's invalidation is made with the commands it would send (`invalidate_elsewhere`). A
//! process that loses its feed drops the memory of every Redis-backed cache it has, so the tests
//! here take turns (`serial`): one test's fault never drops another's memory.
//! Time is real: the faults are on real sockets.

mod common;

use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::{Duration, Instant};

use common::fault_proxy::FaultProxy;
use common::redis_server::RedisServer;
use common::{AppError, eventually, misses, until, within};
use stampede::{RedisConfig, cached};

/// The heartbeat of the feed tests, and the staleness bound it gives with the default operation
/// timeout (250 ms): `2 × heartbeat + op_timeout`, as `RedisConfig::heartbeat` documents.
const HEARTBEAT: Duration = Duration::from_millis(300);
const STALENESS_BOUND: Duration = Duration::from_millis(2 * 300 + 250);
/// Room for a loaded machine on top of a documented bound, and for the call that observes it.
const SLACK: Duration = Duration::from_secs(2);

async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    SERIAL.lock().await
}

#[tokio::test]
async fn a_blackholed_link_is_replaced_and_calls_return_to_redis() {
    let _serial = serial().await;

    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "links_proxied",
        name = "faults::links"
    )]
    async fn reader(id: u64) -> String {
        format!("{id} loaded by the reader")
    }
    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "links_direct",
        name = "faults::links"
    )]
    async fn writer(id: u64) -> String {
        format!("{id} loaded by the writer")
    }

    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let op_timeout = Duration::from_millis(200);
    RedisConfig::new(&proxy.url())
        .unwrap()
        .prefix("test")
        .op_timeout(op_timeout)
        .cooldown(Duration::from_millis(300), 3)
        .install_as("links_proxied");
    RedisConfig::new(&server.url())
        .unwrap()
        .prefix("test")
        .install_as("links_direct");

    assert_eq!(within(reader(1)).await, "1 loaded by the reader");
    assert_eq!(stampede::stats("faults::links").unwrap().lock_acquired, 1);
    // The writer's link is made now: made in the first round, on a loaded machine it could take
    // longer than the reader needs to replace its blackholed link (two heartbeats timed out), so
    // that the reader would never be seen degraded.
    assert_eq!(within(writer(2)).await, "2 loaded by the writer");
    let connections = proxy.accepted();
    proxy.blackhole();
    let blackholed = Instant::now();

    // Each round the writer (another process, on a healthy link) puts a value in Redis; the
    // reader gets it from there once its tier is back on Redis, and loads it itself until then.
    let mut round = 0;
    let recovered = until(
        "the reader to read Redis again after its link was blackholed",
        Duration::from_secs(15),
        || {
            round += 1;
            let id = 100 + round;
            async move {
                assert_eq!(writer(id).await, format!("{id} loaded by the writer"));
                let started = Instant::now();
                let value = reader(id).await;
                let took = started.elapsed();
                assert!(
                    took < Duration::from_secs(2),
                    "a call during the blackhole took {took:?}"
                );
                if value == format!("{id} loaded by the writer") {
                    return Some(blackholed.elapsed());
                }
                assert_eq!(value, format!("{id} loaded by the reader"));
                None
            }
        },
    )
    .await;
    assert!(
        proxy.accepted() > connections,
        "the reader reached Redis through a new connection"
    );
    let stats = stampede::stats("faults::links").unwrap();
    assert!(stats.remote_hits >= 1 && stats.degraded >= 1, "{stats:?}");
    println!("back on Redis {recovered:?} after the blackhole, in {round} rounds; {stats:?}");
}

#[tokio::test]
async fn a_link_answered_readonly_is_replaced_and_reaches_the_new_primary() {
    let _serial = serial().await;

    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "failover",
        name = "faults::failover"
    )]
    async fn quote(id: u64) -> Result<String, AppError> {
        Ok(format!("quote {id}"))
    }

    let old_primary = RedisServer::start();
    let new_primary = RedisServer::start();
    let dns = FaultProxy::start(old_primary.port());
    RedisConfig::new(&dns.url())
        .unwrap()
        .prefix("test")
        .install_as("failover");
    assert_eq!(within(quote(1)).await.unwrap(), "quote 1");
    assert!(old_primary.key("test:{faults::failover~*|1}:v").is_some());

    // The failover: the old primary is demoted (its writes answer READONLY) and the name now
    // resolves to the new one; established connections stay on the old.
    let port = new_primary.port().to_string();
    let _: () = old_primary.command(&["REPLICAOF", "127.0.0.1", &port]);
    dns.retarget(new_primary.port());

    let mut id = 1;
    until(
        "a value written to the new primary",
        Duration::from_secs(15),
        || {
            id += 1;
            let id = id;
            let new_primary = &new_primary;
            async move {
                assert_eq!(quote(id).await.unwrap(), format!("quote {id}"));
                let key = format!("test:{{faults::failover~*|{id}}}:v");
                new_primary.key(&key).map(|_| ())
            }
        },
    )
    .await;
    println!("the new primary holds key {id}");
}

#[tokio::test]
async fn an_error_about_one_key_loads_it_locally_and_leaves_the_connection_up() {
    let _serial = serial().await;
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "key_errors",
        name = "faults::key_errors"
    )]
    async fn price(sku: u64) -> Result<String, AppError> {
        LOADS.fetch_add(1, SeqCst);
        Ok(format!("{} EUR", sku * 10))
    }

    let server = RedisServer::start();
    // One failure would skip Redis for a minute: any error counted against the connection shows.
    RedisConfig::new(&server.url())
        .unwrap()
        .prefix("test")
        .cooldown(Duration::from_secs(60), 1)
        .install_as("key_errors");
    let name = "faults::key_errors";
    // A first key, to learn the cache's identity in Redis (its name and a digest of its shapes).
    assert_eq!(within(price(100)).await.unwrap(), "1000 EUR");
    let first = server.key("test:{faults::key_errors~*|100}:v").unwrap();
    let hash = first.replace("|100}", "|1}");
    let _: i64 = server.command(&["HSET", &hash, "field", "x"]);

    assert_eq!(
        within(price(1)).await.unwrap(),
        "10 EUR",
        "WRONGTYPE: loaded here"
    );
    assert_eq!(stampede::stats(name).unwrap().degraded, 1);
    assert_eq!(within(price(2)).await.unwrap(), "20 EUR");
    let stats = stampede::stats(name).unwrap();
    assert_eq!(
        (stats.degraded, stats.lock_acquired),
        (1, 2),
        "another key still goes through Redis: {stats:?}"
    );
    assert!(server.key("test:{faults::key_errors~*|2}:v").is_some());

    // Out of memory: the write is refused, the call loads here, the connection stays up.
    let _: () = server.command(&["CONFIG", "SET", "maxmemory", "1"]);
    assert_eq!(within(price(3)).await.unwrap(), "30 EUR");
    let _: () = server.command(&["CONFIG", "SET", "maxmemory", "0"]);
    assert_eq!(within(price(4)).await.unwrap(), "40 EUR");
    let stats = stampede::stats(name).unwrap();
    assert_eq!(
        (stats.degraded, stats.lock_acquired),
        (2, 3),
        "after OOM, the next key went through Redis: {stats:?}"
    );
    assert_eq!(LOADS.load(SeqCst), 5);
}

/// A value far over the size bound sits in Redis (written by a process configured with a larger
/// bound, or by hand). Reading it must not move it over the wire: each read is a counted miss
/// that loads the key, no call times out, and the connection stays up for every other cache.
#[tokio::test]
async fn a_huge_value_in_redis_is_a_counted_miss_and_the_connection_stays_up() {
    let _serial = serial().await;

    #[cached(ttl = "60s", lock = "redis", redis = "huge", name = "faults::huge")]
    async fn huge(id: u64) -> String {
        format!("{id} small")
    }
    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "huge",
        name = "faults::neighbour"
    )]
    async fn neighbour(id: u64) -> String {
        format!("{id} next door")
    }

    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    RedisConfig::new(&proxy.url())
        .unwrap()
        .prefix("test")
        .install_as("huge");
    assert_eq!(within(huge(0)).await, "0 small");
    assert_eq!(within(neighbour(1)).await, "1 next door");
    let key = server
        .key("test:{faults::huge~*|0}:v")
        .unwrap()
        .replace("|0}", "|1}");
    let mut value = b"S3 99999999999999 99999999999999 0 0 0 1 -\n\xc1\x02".to_vec();
    value.resize(100 << 20, b'x');
    let connections = proxy.accepted();

    let mut redis = server.connection();
    for round in 1..=3 {
        within(huge::invalidate(1)).await.unwrap();
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(&value)
            .query(&mut redis)
            .unwrap();
        let started = Instant::now();
        assert_eq!(within(huge(1)).await, "1 small");
        println!("round {round}: {:?}", started.elapsed());
        assert_eq!(within(neighbour(1)).await, "1 next door");
    }
    let stats = stampede::stats("faults::huge").unwrap();
    assert_eq!(
        (stats.decode_errors, stats.degraded, stats.timeouts),
        (3, 0, 0),
        "{stats:?}"
    );
    assert_eq!(stampede::stats("faults::neighbour").unwrap().degraded, 0);
    assert_eq!(proxy.accepted(), connections, "no connection was replaced");
    let stored: usize = server.command(&["STRLEN", &key]);
    assert!(
        stored < 1 << 10,
        "the load overwrote the huge value: {stored} bytes"
    );
}

#[tokio::test]
async fn a_killed_invalidation_feed_drops_memory_and_resubscribes_by_itself() {
    let _serial = serial().await;
    static VERSION: AtomicUsize = AtomicUsize::new(0);

    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "feed_kill",
        name = "faults::feed_kill"
    )]
    async fn item(id: u64) -> String {
        format!("item {id} v{}", VERSION.fetch_add(1, SeqCst) + 1)
    }

    let server = RedisServer::start();
    RedisConfig::new(&server.url())
        .unwrap()
        .prefix("test")
        .heartbeat(HEARTBEAT)
        .install_as("feed_kill");
    let name = "faults::feed_kill";
    let old = within(item(1)).await;
    let before = misses(name);
    assert_eq!(within(item(1)).await, old);
    assert_eq!(misses(name), before, "served from memory");

    let killed: i64 = server.command(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    assert_eq!(killed, 1, "the subscriber was killed");
    invalidate_elsewhere(&server, name, 1);
    let invalidated = Instant::now();
    let new = until(
        "the process to stop serving the invalidated value",
        STALENESS_BOUND + SLACK,
        || async { Some(item(1).await).filter(|value| *value != old) },
    )
    .await;
    println!(
        "served {new:?} instead of {old:?} {:?} after the invalidation",
        invalidated.elapsed()
    );

    invalidations_arrive_again(&server, name, item).await;
}

#[tokio::test]
async fn a_blackholed_invalidation_feed_is_noticed_within_the_documented_bound() {
    let _serial = serial().await;
    static VERSION: AtomicUsize = AtomicUsize::new(0);

    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "feed_hole",
        name = "faults::feed_hole"
    )]
    async fn item(id: u64) -> String {
        format!("item {id} v{}", VERSION.fetch_add(1, SeqCst) + 1)
    }

    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    RedisConfig::new(&proxy.url())
        .unwrap()
        .prefix("test")
        .heartbeat(HEARTBEAT)
        .install_as("feed_hole");
    let name = "faults::feed_hole";
    let old = within(item(1)).await;
    let before = misses(name);
    assert_eq!(within(item(1)).await, old);
    assert_eq!(misses(name), before, "served from memory");

    // The process's connections go half-open: they stay open and nothing arrives, so nothing
    // tells it that the key is invalidated.
    proxy.blackhole();
    invalidate_elsewhere(&server, name, 1);
    let invalidated = Instant::now();
    let new = until(
        "the process to stop serving the invalidated value",
        STALENESS_BOUND + SLACK,
        || async { Some(item(1).await).filter(|value| *value != old) },
    )
    .await;
    let stale_for = invalidated.elapsed();
    println!(
        "served {new:?} instead of {old:?} {stale_for:?} after the invalidation \
         (documented bound {STALENESS_BOUND:?}, plus the observing call)"
    );

    invalidations_arrive_again(&server, name, item).await;
}

/// Simulation seed 536468, on a real Redis: while the feed is not live, a call does not join a
/// load begun longer ago than the staleness bound. That load may have read a value that another
/// process invalidated since (its message lost), before this call began. Redis refuses the
/// process's `SUBSCRIBE` here (an ACL), so its feed never comes up while its commands work.
#[tokio::test]
async fn without_a_live_feed_a_call_past_the_bound_does_not_join_an_older_load() {
    let _serial = serial().await;
    static VERSION: AtomicUsize = AtomicUsize::new(0);
    const LOAD: Duration = Duration::from_secs(4);

    #[cached(
        ttl = "60s",
        backend = "redis",
        lock = "local",
        redis = "feed_denied",
        name = "faults::feed_denied"
    )]
    async fn item(id: u64) -> String {
        let version = VERSION.fetch_add(1, SeqCst) + 1;
        tokio::time::sleep(LOAD).await;
        format!("item {id} v{version}")
    }

    let server = RedisServer::start();
    let _: String = server.command(&[
        "ACL",
        "SETUSER",
        "default",
        "-subscribe",
        "-ssubscribe",
        "-psubscribe",
    ]);
    RedisConfig::new(&server.url())
        .unwrap()
        .prefix("test")
        .heartbeat(HEARTBEAT)
        .install_as("feed_denied");
    let name = "faults::feed_denied";
    let began = Instant::now();
    let first = tokio::spawn(item(1));
    tokio::time::sleep(Duration::from_millis(100)).await;
    invalidate_elsewhere(&server, name, 1); // lost: nothing is subscribed
    tokio::time::sleep_until((began + STALENESS_BOUND + Duration::from_millis(300)).into()).await;
    assert!(!first.is_finished(), "the first load is still running");
    let late = within(item(1)).await;
    assert_eq!(within(first).await.unwrap(), "item 1 v1");
    assert_eq!(
        late, "item 1 v2",
        "a call past the bound after the lost invalidation loads anew"
    );
}

/// What another process's invalidation of `id` does, seen from this one: the value is gone from
/// Redis, and the key is announced on the invalidation channel.
///
/// A second cache of the same name in this process cannot play that process here: this
/// process's own invalidation feed would then drop the key from both caches' memory.
fn invalidate_elsewhere(server: &RedisServer, name: &str, id: u64) {
    let _: () = server.command(&["FLUSHDB"]);
    let message = format!("{name}\n{id}");
    let _: i64 = server.command(&["PUBLISH", "test:invalidations", &message]);
}

/// With no call needed to revive the feed, an invalidation made elsewhere drops that key from
/// memory, and only that key: the message arrived, the process did not drop everything. Tried
/// with fresh keys until a round passes, since the process may still be between a lost and a
/// restored session (each drops its memory) when the first rounds run.
async fn invalidations_arrive_again<F, Fut>(server: &RedisServer, name: &str, item: F)
where
    F: Fn(u64) -> Fut,
    Fut: Future<Output = String>,
{
    let mut round = 0;
    until(
        "an invalidation to arrive through the resubscribed feed",
        Duration::from_secs(15),
        || {
            round += 1;
            let (key, witness) = (1_000 + 2 * round, 1_001 + 2 * round);
            let item = &item;
            async move {
                let old = item(key).await;
                let kept = item(witness).await;
                invalidate_elsewhere(server, name, key);
                let started = Instant::now();
                while item(key).await == old {
                    assert!(
                        started.elapsed() < STALENESS_BOUND + SLACK,
                        "key {key} was served after its invalidation"
                    );
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                let before = misses(name);
                let from_memory = item(witness).await == kept && misses(name) == before;
                from_memory.then_some(())
            }
        },
    )
    .await;
    println!("an invalidation arrived through the feed in round {round}");
}

/// A call whose value is read from Redis on its own task (a cache without memory reads there
/// before the key's flight), while this process invalidates the key: the server answers the read
/// with the old value before it runs the invalidation's `DEL`, and the answer arrives after the
/// invalidation began here. The call must not return that value: it goes on to a load. (With
/// memory in front, the read is the flight's, whose callers began before the invalidation and
/// may get what it read, as they may get what it loaded; memory keeps neither.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_read_from_redis_while_the_key_is_invalidated_is_neither_returned_nor_kept() {
    let _serial = serial().await;
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(
        ttl = "60s",
        lock = "redis",
        backend = "redis",
        redis = "read_race_proxied",
        name = "faults::read_race"
    )]
    async fn reader(id: u64) -> String {
        format!("{id}: load {}", LOADS.fetch_add(1, SeqCst) + 1)
    }
    #[cached(
        ttl = "60s",
        lock = "redis",
        backend = "redis",
        redis = "read_race_direct",
        name = "faults::read_race"
    )]
    async fn writer(id: u64) -> String {
        format!("{id}: load {}", LOADS.fetch_add(1, SeqCst) + 1)
    }

    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    RedisConfig::new(&proxy.url())
        .unwrap()
        .prefix("test")
        .op_timeout(Duration::from_secs(5))
        .install_as("read_race_proxied");
    RedisConfig::new(&server.url())
        .unwrap()
        .prefix("test")
        .install_as("read_race_direct");
    // The reader's link is up, and the server has its scripts, before the network slows down
    // (a script the server lacks costs more round trips: the first `EVALSHA` is refused).
    assert_eq!(within(reader(99)).await, "99: load 1");
    within(reader::invalidate(99)).await.unwrap();
    assert_eq!(within(writer(1)).await, "1: load 2", "key 1 is in Redis");

    // Every chunk between the reader and Redis now takes 300 ms: its read of key 1 reaches the
    // server at about 300 ms and its answer (the old value) arrives at about 600 ms.
    let one_way = Duration::from_millis(300);
    proxy.delay(one_way);
    let call = tokio::spawn(reader(1));
    tokio::time::sleep(one_way * 3 / 2).await;
    // At about 450 ms: dropped here at once; its `DEL` reaches the server at about 750 ms.
    let invalidation = tokio::spawn(reader::invalidate(1));
    let value = within(call).await.unwrap();
    within(invalidation).await.unwrap().unwrap();
    proxy.pass();

    assert_ne!(value, "1: load 2", "the value read before the invalidation");
    assert_eq!(value, "1: load 3", "a load after it");
    assert_eq!(within(reader(1)).await, "1: load 3", "and kept");
    assert_eq!(LOADS.load(SeqCst), 3);
}

#[tokio::test]
async fn every_duration_up_to_max_still_serves_values() {
    let _serial = serial().await;

    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "max_lease",
        name = "faults::max_lease"
    )]
    async fn lease(id: u64) -> u64 {
        id + 1
    }
    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "max_wait",
        name = "faults::max_wait"
    )]
    async fn lock_wait(id: u64) -> u64 {
        id + 2
    }
    #[cached(ttl = "60s", lock = "redis", redis = "max_op", name = "faults::max_op")]
    async fn op_timeout(id: u64) -> u64 {
        id + 3
    }
    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "max_beat",
        name = "faults::max_beat"
    )]
    async fn timing(id: u64) -> u64 {
        id + 4
    }
    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "max_cooldown",
        name = "faults::max_cooldown"
    )]
    async fn cooldown(id: u64) -> u64 {
        id + 5
    }

    let server = RedisServer::start();
    let config = || RedisConfig::new(&server.url()).unwrap().prefix("test");
    config().lease(Duration::MAX).install_as("max_lease");
    config().lock_wait(Duration::MAX).install_as("max_wait");
    config().op_timeout(Duration::MAX).install_as("max_op");
    config()
        .connect_timeout(Duration::MAX)
        .heartbeat(Duration::MAX)
        .install_as("max_beat");
    // Nothing listens there: the first call fails and starts a cool-down of Duration::MAX.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .unwrap()
        .port();
    RedisConfig::new(&format!("redis://127.0.0.1:{closed}/"))
        .unwrap()
        .cooldown(Duration::MAX, 1)
        .install_as("max_cooldown");

    assert_eq!(within(lease(1)).await, 2);
    assert_eq!(within(lock_wait(1)).await, 3);
    assert_eq!(within(op_timeout(1)).await, 4);
    assert_eq!(within(timing(1)).await, 5);
    for (name, key) in [
        ("faults::max_lease", "test:{faults::max_lease~*|1}:v"),
        ("faults::max_wait", "test:{faults::max_wait~*|1}:v"),
        ("faults::max_op", "test:{faults::max_op~*|1}:v"),
        ("faults::max_beat", "test:{faults::max_beat~*|1}:v"),
    ] {
        let stats = stampede::stats(name).unwrap();
        assert_eq!(
            (stats.degraded, stats.lock_acquired),
            (0, 1),
            "{name} went through Redis: {stats:?}"
        );
        assert!(server.key(key).is_some(), "{key}");
    }
    assert_eq!(
        server.key("test:{faults::max_lease~*|1}:l"),
        None,
        "the lock was released"
    );

    assert_eq!(within(cooldown(1)).await, 6, "loaded here: nothing listens");
    assert_eq!(within(cooldown(2)).await, 7, "skipped during the cool-down");
    assert_eq!(stampede::stats("faults::max_cooldown").unwrap().degraded, 2);
}

/// A holder whose give-back of the lock fell in a pause of Redis (its load failed meanwhile, so
/// no fill releases it) tries again until Redis answers: the process waiting for it is woken
/// soon after the pause, not when the lease runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_given_back_during_a_pause_is_released_once_redis_answers() {
    let _serial = serial().await;
    static GATE: tokio::sync::Notify = tokio::sync::Notify::const_new();
    static HOLDING: AtomicUsize = AtomicUsize::new(0);

    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "pause_holder",
        name = "faults::give_back"
    )]
    async fn holder(id: u64) -> Result<String, AppError> {
        HOLDING.fetch_add(1, SeqCst);
        GATE.notified().await;
        Err(AppError::Db(format!("{id}: the query failed")))
    }
    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "pause_waiter",
        name = "faults::give_back"
    )]
    async fn waiter(id: u64) -> Result<String, AppError> {
        Ok(format!("{id} loaded by the waiter"))
    }

    let server = RedisServer::start();
    for connection in ["pause_holder", "pause_waiter"] {
        RedisConfig::new(&server.url())
            .unwrap()
            .prefix("test")
            .op_timeout(Duration::from_millis(200))
            .lease(Duration::from_secs(3))
            .lock_wait(Duration::from_secs(20))
            .cooldown(Duration::from_millis(100), 10)
            .install_as(connection);
        stampede::require_redis(Some(connection)).await.unwrap();
    }
    let held = tokio::spawn(holder(1));
    eventually("the holder to load under the lock", || {
        HOLDING.load(SeqCst) == 1
    })
    .await;
    let started = Instant::now();
    let waiting = tokio::spawn(waiter(1));
    tokio::time::sleep(Duration::from_millis(100)).await; // the waiter waits for the holder
    let _: () = server.command(&["CLIENT", "PAUSE", "1000", "ALL"]);
    GATE.notify_one(); // the holder's load fails: its give-back meets the pause
    assert!(within(held).await.unwrap().is_err());
    assert_eq!(
        within(waiting).await.unwrap().unwrap(),
        "1 loaded by the waiter"
    );
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(2_300),
        "the waiter was woken {took:?} after it began: the lock stayed until its 3 s lease ran out"
    );
}

/// A Redis, a writer's connection to it through a fault proxy (short bounds, so that a cut is
/// noticed at once) and a reader's straight to it, both checked.
async fn writer_and_reader(writer: &str, reader: &str) -> (RedisServer, FaultProxy) {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    RedisConfig::new(&proxy.url())
        .unwrap()
        .prefix("test")
        .op_timeout(Duration::from_millis(200))
        .cooldown(Duration::from_millis(300), 3)
        .install_as(writer);
    RedisConfig::new(&server.url())
        .unwrap()
        .prefix("test")
        .install_as(reader);
    stampede::require_redis(Some(writer)).await.unwrap();
    stampede::require_redis(Some(reader)).await.unwrap();
    (server, proxy)
}

/// An invalidation that failed because Redis could not be reached is delivered as soon as Redis
/// answers again, by a task of its own: a writer that only invalidates (and never reads the key
/// again) still reaches the other processes, which then stop serving the old value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_invalidation_is_delivered_once_redis_answers_without_another_call() {
    let _serial = serial().await;
    static VERSION: AtomicUsize = AtomicUsize::new(1);

    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "resend_writer",
        name = "faults::resend"
    )]
    async fn writer(id: u64) -> String {
        format!("{id} v{}", VERSION.load(SeqCst))
    }
    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "resend_reader",
        name = "faults::resend"
    )]
    async fn reader(id: u64) -> String {
        format!("{id} v{}", VERSION.load(SeqCst))
    }

    let (_server, proxy) = writer_and_reader("resend_writer", "resend_reader").await;

    assert_eq!(
        within(reader(1)).await,
        "1 v1",
        "the reader keeps v1 in memory"
    );
    assert_eq!(within(writer(1)).await, "1 v1", "read from Redis");
    proxy.cut();
    VERSION.store(2, SeqCst);
    assert!(
        matches!(
            within(writer::invalidate(1)).await,
            Err(stampede::Error::RedisUnavailable { .. })
        ),
        "the writer cannot reach Redis"
    );
    assert_eq!(
        within(reader(1)).await,
        "1 v1",
        "nothing reached the reader yet"
    );
    proxy.pass();
    // The writer makes no other call: its task delivers the invalidation.
    until(
        "the reader to hear the invalidation the writer could not send",
        Duration::from_secs(10),
        || async { (reader(1).await == "1 v2").then_some(()) },
    )
    .await;
}

/// An expiry that failed because Redis could not be reached is delivered, as soon as Redis
/// answers, as an invalidation (the stronger of the two, which leaves no value fresher than the
/// expiry would): the value leaves Redis and the other process's memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_expiry_is_delivered_as_an_invalidation_once_redis_answers() {
    let _serial = serial().await;
    static VERSION: AtomicUsize = AtomicUsize::new(1);

    #[cached(
        ttl = "60s",
        stale = "1h",
        lock = "redis",
        redis = "expire_writer",
        name = "faults::expire_resend"
    )]
    async fn writer(id: u64) -> String {
        format!("{id} v{}", VERSION.load(SeqCst))
    }
    #[cached(
        ttl = "60s",
        stale = "1h",
        lock = "redis",
        redis = "expire_reader",
        name = "faults::expire_resend"
    )]
    async fn reader(id: u64) -> String {
        format!("{id} v{}", VERSION.load(SeqCst))
    }

    let (server, proxy) = writer_and_reader("expire_writer", "expire_reader").await;

    assert_eq!(within(reader(1)).await, "1 v1");
    assert_eq!(within(writer(1)).await, "1 v1", "read from Redis");
    proxy.cut();
    VERSION.store(2, SeqCst);
    assert!(
        matches!(
            within(writer::expire(1)).await,
            Err(stampede::Error::RedisUnavailable { .. })
        ),
        "the writer cannot reach Redis"
    );
    proxy.pass();
    until(
        "the value to leave Redis, dropped rather than expired",
        Duration::from_secs(10),
        || async {
            server
                .key("test:{faults::expire_resend~*|1}:v")
                .is_none()
                .then_some(())
        },
    )
    .await;
    until(
        "the reader to drop its copy",
        Duration::from_secs(10),
        || async { (reader(1).await == "1 v2").then_some(()) },
    )
    .await;
}

/// While Redis is down, a value loaded here is kept for the staleness bound by default (a load
/// per key every bound), or for the connection's `trust_while_deaf`, which trades that bound for
/// fewer loads; and so is a value held when the feed was lost, from the last heartbeat heard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_redis_is_down_memory_is_trusted_for_the_bound_or_the_connections_choice() {
    let _serial = serial().await;
    static LOADS: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());

    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "deaf_default",
        name = "faults::deaf_default"
    )]
    async fn by_default(id: u64) -> u64 {
        LOADS.lock().unwrap().push("default");
        id
    }
    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "deaf_trusting",
        name = "faults::deaf_trusting"
    )]
    async fn trusting(id: u64) -> u64 {
        LOADS.lock().unwrap().push("trusting");
        id
    }

    let mut server = RedisServer::start();
    // The staleness bound: 2 x 100 ms + 100 ms = 300 ms.
    let config = RedisConfig::new(&server.url())
        .unwrap()
        .prefix("test")
        .op_timeout(Duration::from_millis(100))
        .heartbeat(Duration::from_millis(100));
    config.clone().install_as("deaf_default");
    config
        .trust_while_deaf(Duration::from_secs(60))
        .install_as("deaf_trusting");
    // Held when the feed is lost: loaded with Redis up, the feed heard for a while.
    assert_eq!(within(by_default(2)).await, 2);
    assert_eq!(within(trusting(2)).await, 2);
    tokio::time::sleep(Duration::from_millis(500)).await;
    LOADS.lock().unwrap().clear();
    server.kill();
    assert_eq!(within(by_default(1)).await, 1);
    assert_eq!(within(trusting(1)).await, 1);
    tokio::time::sleep(Duration::from_millis(800)).await; // past the bound
    assert_eq!(within(by_default(1)).await, 1);
    assert_eq!(within(trusting(1)).await, 1);
    assert_eq!(within(by_default(2)).await, 2);
    assert_eq!(within(trusting(2)).await, 2);
    assert_eq!(
        *LOADS.lock().unwrap(),
        ["default", "trusting", "default", "default"],
        "past the bound, the default cache loads again what it loaded and what it held; the \
         trusting one serves its memory"
    );
}

/// `trust_while_deaf` bounds what memory held when the feed was lost too: in service past the
/// staleness bound, out of service once the trust after the last heartbeat heard has passed
/// (an invalidation missed meanwhile is outlived by no more than that).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_memory_held_when_the_feed_was_lost_is_trusted_no_longer_than_the_trust() {
    let _serial = serial().await;
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "deaf_held",
        name = "faults::deaf_held"
    )]
    async fn held(id: u64) -> u64 {
        LOADS.fetch_add(1, SeqCst);
        id
    }

    let mut server = RedisServer::start();
    // The staleness bound: 2 x 100 ms + 100 ms = 300 ms; the trust 1.5 s.
    RedisConfig::new(&server.url())
        .unwrap()
        .prefix("test")
        .op_timeout(Duration::from_millis(100))
        .heartbeat(Duration::from_millis(100))
        .trust_while_deaf(Duration::from_millis(1_500))
        .install_as("deaf_held");
    assert_eq!(within(held(1)).await, 1);
    tokio::time::sleep(Duration::from_millis(500)).await; // heartbeats heard
    let lost = Instant::now();
    server.kill();
    tokio::time::sleep(Duration::from_millis(600)).await; // past the bound, within the trust
    assert_eq!(held::peek(1), Some(1), "within the trust: in service");
    eventually("out of service once the trust has passed", || {
        held::peek(1).is_none()
    })
    .await;
    assert!(
        lost.elapsed() < Duration::from_millis(1_500) + SLACK,
        "out of service within the trust after the last heartbeat heard (plus slack), not later"
    );
    assert_eq!(LOADS.load(SeqCst), 1);
}

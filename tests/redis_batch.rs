//! Batch functions across processes (`lock = "redis"`), against a real `redis-server` per test
//! and, for the last test, a real Redis Cluster: one round trip reads every key of a batch and
//! locks the missing ones, one fills them all; each key is loaded once across the processes, and
//! each process calls its function at most once per batch.
//!
//! Functions with one `name` and their own Redis connections stand for processes (as in
//! `redis_faults.rs`): their own memory, flights and connections over the same Redis keys. Time
//! is real: a paused clock would fire Redis timeouts while the runtime waits for the network.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use common::redis_server::RedisServer;
use common::{AppError, eventually, within};
use stampede::{RedisConfig, cached};
use stampede_test_support::redis_cluster::{Cluster, Options};

/// The calls each process's function received: (process, the keys it was given).
struct Calls(Mutex<Vec<(usize, Vec<u64>)>>);

impl Calls {
    const fn new() -> Self {
        Calls(Mutex::new(Vec::new()))
    }

    fn record(&self, process: usize, keys: &[u64]) {
        let mut keys = keys.to_vec();
        keys.sort_unstable();
        self.0.lock().unwrap().push((process, keys));
    }

    fn all(&self) -> Vec<(usize, Vec<u64>)> {
        self.0.lock().unwrap().clone()
    }

    fn loads_per_key(&self) -> BTreeMap<u64, usize> {
        let mut loads = BTreeMap::new();
        for (_, keys) in self.all() {
            for key in keys {
                *loads.entry(key).or_default() += 1;
            }
        }
        loads
    }

    fn calls_of(&self, process: usize) -> usize {
        self.all()
            .iter()
            .filter(|(other, _)| *other == process)
            .count()
    }
}

fn install(url: &str, connection: &str) {
    RedisConfig::new(url)
        .unwrap()
        .prefix("test")
        .op_timeout(Duration::from_secs(2))
        .install_as(connection);
}

/// The calls of each Redis command since the last `CONFIG RESETSTAT`, from `INFO commandstats`.
fn command_calls(info: &str) -> BTreeMap<String, u64> {
    info.lines()
        .filter_map(|line| {
            let (command, stats) = line.trim().strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = stats.split(',').next()?.strip_prefix("calls=")?;
            Some((command.to_owned(), calls.parse().ok()?))
        })
        .collect()
}

/// Each of 4 "processes" of one service: a batch function of the same name with its own
/// connection, recording its calls as `process`.
macro_rules! process {
    ($name:ident, $process:literal, $connection:literal, $calls:ident, $cache:literal) => {
        #[cached(ttl = "60s", lock = "redis", redis = $connection, batch = ids, name = $cache)]
        async fn $name(ids: Vec<u64>) -> Result<HashMap<u64, String>, AppError> {
            $calls.record($process, &ids);
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok(ids
                .into_iter()
                .map(|id| (id, format!("product #{id}")))
                .collect())
        }
    };
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_batch_of_100_keys_across_4_processes_loads_each_key_once() {
    static CALLS: Calls = Calls::new();
    process!(in_a, 0, "cold4_a", CALLS, "rb::cold4");
    process!(in_b, 1, "cold4_b", CALLS, "rb::cold4");
    process!(in_c, 2, "cold4_c", CALLS, "rb::cold4");
    process!(in_d, 3, "cold4_d", CALLS, "rb::cold4");

    let server = RedisServer::start();
    for connection in ["cold4_a", "cold4_b", "cold4_c", "cold4_d"] {
        install(&server.url(), connection);
        stampede::require_redis(Some(connection)).await.unwrap();
    }
    let keys: Vec<u64> = (0..100).collect();
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(4));
    let batch = |process: usize| {
        let (keys, start) = (keys.clone(), start.clone());
        tokio::spawn(async move {
            start.wait().await;
            match process {
                0 => in_a(keys).await,
                1 => in_b(keys).await,
                2 => in_c(keys).await,
                _ => in_d(keys).await,
            }
        })
    };
    let batches: Vec<_> = (0..4).map(batch).collect();
    for found in batches {
        let found = within(found).await.unwrap().unwrap();
        assert_eq!(found.len(), 100);
        assert!(
            found
                .iter()
                .all(|(id, value)| *value == format!("product #{id}"))
        );
    }
    let loads = CALLS.loads_per_key();
    assert_eq!(loads.len(), 100);
    assert!(
        loads.values().all(|&loads| loads == 1),
        "each key once: {loads:?}"
    );
    for process in 0..4 {
        assert!(CALLS.calls_of(process) <= 1, "{:?}", CALLS.all());
    }
    let stats = stampede::stats("rb::cold4").unwrap();
    assert_eq!(
        stats.lock_acquired, 100,
        "one lock per key, across the processes"
    );
    assert_eq!(stats.in_flight, 0);
    println!(
        "calls: {:?}",
        CALLS
            .all()
            .iter()
            .map(|(p, keys)| (p, keys.len()))
            .collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_takes_two_round_trips_and_one_that_another_process_filled_one() {
    static CALLS: Calls = Calls::new();
    process!(loader, 0, "trips_a", CALLS, "rb::trips");
    process!(reader, 1, "trips_b", CALLS, "rb::trips");

    let server = RedisServer::start();
    install(&server.url(), "trips_a");
    install(&server.url(), "trips_b");
    // The scripts loaded into the server (and the connections made) before counting.
    within(loader(vec![1_000])).await.unwrap();
    within(reader(vec![1_001])).await.unwrap();

    let _: () = server.command(&["CONFIG", "RESETSTAT"]);
    let keys: Vec<u64> = (0..100).collect();
    within(loader(keys.clone())).await.unwrap();
    let cold = command_calls(&server.command::<String>(&["INFO", "commandstats"]));
    let _: () = server.command(&["CONFIG", "RESETSTAT"]);
    within(reader(keys.clone())).await.unwrap();
    let read = command_calls(&server.command::<String>(&["INFO", "commandstats"]));
    let _: () = server.command(&["CONFIG", "RESETSTAT"]);
    within(loader(keys)).await.unwrap();
    let warm = command_calls(&server.command::<String>(&["INFO", "commandstats"]));
    println!("a cold batch of 100 keys: {cold:?}");
    println!("the same batch in another process: {read:?}");
    println!("again in the first: {warm:?}");
    // Heartbeats publish on their own every second; the scripts are the batch's.
    assert_eq!(
        cold.get("evalsha"),
        Some(&2),
        "read-and-lock, fill (memory in front: no read before the flight): {cold:?}"
    );
    assert_eq!(
        read.get("evalsha"),
        Some(&1),
        "one read of every key: {read:?}"
    );
    // Every key in memory: none, unless this process's invalidation feed went quiet on a
    // loaded machine meanwhile, which drops its memory of Redis-backed caches (one read then).
    assert!(
        warm.get("evalsha").copied().unwrap_or(0) <= 1,
        "every key in memory: {warm:?}"
    );
    assert_eq!(CALLS.all().len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_batches_and_single_calls_across_processes_never_load_a_key_twice() {
    static CALLS: Calls = Calls::new();
    process!(in_a, 0, "overlap_a", CALLS, "rb::overlap");
    process!(in_b, 1, "overlap_b", CALLS, "rb::overlap");

    #[cached(batch_loader = in_a)]
    async fn one_a(ids: u64) -> Result<Option<String>, AppError>;
    #[cached(batch_loader = in_b, batch_window = "5ms")]
    async fn one_b(ids: u64) -> Result<Option<String>, AppError>;

    let server = RedisServer::start();
    install(&server.url(), "overlap_a");
    install(&server.url(), "overlap_b");
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(40));
    let calls: Vec<_> = (0..40u64)
        .map(|caller| {
            let start = start.clone();
            tokio::spawn(async move {
                start.wait().await;
                let first = (caller * 13) % 60;
                let keys: Vec<u64> = (first..first + 15).collect();
                match caller % 4 {
                    0 => assert!(one_a(first).await.unwrap().is_some()),
                    1 => assert!(one_b(first + 1).await.unwrap().is_some()),
                    2 => assert_eq!(in_a(keys).await.unwrap().len(), 15),
                    _ => assert_eq!(in_b(keys).await.unwrap().len(), 15),
                }
            })
        })
        .collect();
    for call in calls {
        within(call).await.unwrap();
    }
    let loads = CALLS.loads_per_key();
    assert!(loads.values().all(|&loads| loads == 1), "{loads:?}");
    assert_eq!(stampede::stats("rb::overlap").unwrap().in_flight, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalidation_during_a_batch_keeps_its_old_value_out_of_redis() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);
    static VERSION: AtomicUsize = AtomicUsize::new(1);
    static LOADING: tokio::sync::Notify = tokio::sync::Notify::const_new();
    static GO: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(0);

    #[cached(ttl = "60s", lock = "redis", redis = "inval_a", batch = ids, name = "rb::inval")]
    async fn in_a(ids: Vec<u64>) -> Result<HashMap<u64, String>, AppError> {
        let version = VERSION.load(SeqCst);
        LOADS.fetch_add(1, SeqCst);
        if version == 1 {
            LOADING.notify_one();
            let _ = GO.acquire().await.unwrap();
        }
        Ok(ids
            .into_iter()
            .map(|id| (id, format!("{id} v{version}")))
            .collect())
    }
    #[cached(ttl = "60s", lock = "redis", redis = "inval_b", batch = ids, name = "rb::inval")]
    async fn in_b(ids: Vec<u64>) -> Result<HashMap<u64, String>, AppError> {
        let version = VERSION.load(SeqCst);
        LOADS.fetch_add(1, SeqCst);
        Ok(ids
            .into_iter()
            .map(|id| (id, format!("{id} v{version} (b)")))
            .collect())
    }

    let server = RedisServer::start();
    install(&server.url(), "inval_a");
    install(&server.url(), "inval_b");
    let batch = tokio::spawn(in_a(vec![1, 2]));
    within(LOADING.notified()).await;
    VERSION.store(2, SeqCst);
    within(in_b::invalidate(1)).await.unwrap(); // the writer: another process
    GO.add_permits(1);
    let first = within(batch).await.unwrap().unwrap();
    assert_eq!(first[&1], "1 v1", "its caller gets what its load read");

    // Key 1's fill was refused (its fence moved): the other process loads it anew; key 2's
    // value is the batch's.
    let after = within(in_b(vec![1, 2])).await.unwrap();
    assert_eq!(after[&1], "1 v2 (b)");
    assert_eq!(after[&2], "2 v1");
    let again = within(in_a(vec![1, 2])).await.unwrap();
    assert_ne!(
        again[&1], "1 v1",
        "nor does the first process serve it again"
    );
    assert_eq!(LOADS.load(SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_holder_fails_is_loaded_by_its_waiters_once() {
    static CALLS: Calls = Calls::new();
    static LOADING: tokio::sync::Notify = tokio::sync::Notify::const_new();

    #[cached(ttl = "60s", lock = "redis", redis = "fail_a", batch = ids, name = "rb::fail")]
    async fn in_a(ids: Vec<u64>) -> Result<HashMap<u64, String>, AppError> {
        CALLS.record(0, &ids);
        LOADING.notify_one();
        tokio::time::sleep(Duration::from_millis(300)).await;
        Err(AppError::Db("the replica is gone".into()))
    }
    #[cached(ttl = "60s", lock = "redis", redis = "fail_b", batch = ids, name = "rb::fail")]
    async fn in_b(ids: Vec<u64>) -> Result<HashMap<u64, String>, AppError> {
        CALLS.record(1, &ids);
        Ok(ids
            .into_iter()
            .map(|id| (id, format!("{id} from b")))
            .collect())
    }

    let server = RedisServer::start();
    install(&server.url(), "fail_a");
    install(&server.url(), "fail_b");
    let failing = tokio::spawn(in_a(vec![1, 2, 3]));
    within(LOADING.notified()).await;
    // B waits for A's locks, hears the release without values, and loads them itself.
    let waiting = tokio::spawn(in_b(vec![2, 3, 4]));
    let error = within(failing).await.unwrap().unwrap_err();
    assert!(matches!(error, AppError::Db(_)), "{error:?}");
    let found = within(waiting).await.unwrap().unwrap();
    assert_eq!(found.len(), 3);
    assert_eq!(found[&2], "2 from b");
    let calls = CALLS.all();
    let b_calls: Vec<_> = calls.iter().filter(|(p, _)| *p == 1).collect();
    // Key 4 at once, then 2 and 3 after A's release: two calls at most, each key once.
    let mut loaded_by_b: Vec<u64> = b_calls.iter().flat_map(|(_, keys)| keys.clone()).collect();
    loaded_by_b.sort_unstable();
    assert_eq!(loaded_by_b, [2, 3, 4], "{calls:?}");
    assert_eq!(stampede::stats("rb::fail").unwrap().in_flight, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_left_out_are_shared_as_absent_and_ttl_from_holds_in_the_other_process() {
    static CALLS: Calls = Calls::new();

    #[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Item {
        id: u64,
        max_age_ms: u64,
    }

    fn max_age(item: &Item) -> Duration {
        Duration::from_millis(item.max_age_ms)
    }

    macro_rules! items {
        ($name:ident, $process:literal, $connection:literal) => {
            #[cached(ttl = "60s", jitter = 0, lock = "redis", redis = $connection, batch = ids, ttl_from = max_age, name = "rb::absent")]
            async fn $name(ids: Vec<u64>) -> Result<HashMap<u64, Item>, AppError> {
                CALLS.record($process, &ids);
                // Odd ids do not exist; item 2 is fresh for 300 ms, the others for `ttl`.
                Ok(ids
                    .into_iter()
                    .filter(|id| id % 2 == 0)
                    .map(|id| {
                        let max_age_ms = if id == 2 { 300 } else { 60_000 };
                        (id, Item { id, max_age_ms })
                    })
                    .collect())
            }
        };
    }
    items!(in_a, 0, "absent_a");
    items!(in_b, 1, "absent_b");

    let server = RedisServer::start();
    install(&server.url(), "absent_a");
    install(&server.url(), "absent_b");
    let found = within(in_a(vec![1, 2, 3, 4])).await.unwrap();
    assert_eq!(
        found
            .keys()
            .copied()
            .collect::<std::collections::BTreeSet<_>>(),
        [2, 4].into()
    );
    let in_other = within(in_b(vec![1, 2, 3, 4])).await.unwrap();
    assert_eq!(in_other, found, "read from Redis, absent keys included");
    assert_eq!(CALLS.all().len(), 1);
    // Item 2's own lifetime is in Redis: past it, the other process loads it again, and only it.
    eventually("item 2 to expire", || {
        let key = server.key("test:{rb::absent~*|2}:v");
        key.is_none()
    })
    .await;
    // Memory's deadline comes from the read's reply, so it may trail Redis's expiry by up to
    // that round trip: past it too before the call.
    tokio::time::sleep(Duration::from_millis(50)).await;
    within(in_b(vec![1, 2, 3, 4])).await.unwrap();
    within(in_b(vec![2])).await.unwrap();
    let calls = CALLS.all();
    assert_eq!(calls.last().unwrap(), &(1, vec![2]), "{calls:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_with_redis_down_is_one_local_call() {
    static CALLS: Calls = Calls::new();
    process!(alone, 0, "down", CALLS, "rb::down");

    // Nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    RedisConfig::new(&format!("redis://127.0.0.1:{port}/"))
        .unwrap()
        .prefix("test")
        .op_timeout(Duration::from_millis(200))
        .connect_timeout(Duration::from_millis(200))
        .install_as("down");
    let found = within(alone((0..50).collect())).await.unwrap();
    assert_eq!(found.len(), 50);
    assert_eq!(CALLS.all().len(), 1, "one call for the batch");
    let stats = stampede::stats("rb::down").unwrap();
    assert_eq!(stats.degraded, 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_each_slot_has_its_script_and_each_key_loads_once() {
    static CALLS: Calls = Calls::new();
    process!(in_a, 0, "cluster_a", CALLS, "rb::cluster");
    process!(in_b, 1, "cluster_b", CALLS, "rb::cluster");
    process!(in_c, 2, "cluster_c", CALLS, "rb::cluster");
    process!(in_d, 3, "cluster_d", CALLS, "rb::cluster");

    let cluster = Cluster::start(Options::masters(3));
    for (node, connection) in ["cluster_a", "cluster_b", "cluster_c", "cluster_d"]
        .into_iter()
        .enumerate()
    {
        RedisConfig::new(&cluster.url(node % 3))
            .unwrap()
            .prefix("test")
            .op_timeout(Duration::from_secs(5))
            .connect_timeout(Duration::from_secs(5))
            .install_as(connection);
        stampede::require_redis(Some(connection)).await.unwrap();
    }
    // The scripts loaded on every master first.
    within(in_a((1_000..1_030).collect())).await.unwrap();

    cluster.on_every_node(&["CONFIG", "RESETSTAT"]);
    let keys: Vec<u64> = (0..100).collect();
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(4));
    let batches: Vec<_> = (0..4)
        .map(|process| {
            let (keys, start) = (keys.clone(), start.clone());
            tokio::spawn(async move {
                start.wait().await;
                match process {
                    0 => in_a(keys).await,
                    1 => in_b(keys).await,
                    2 => in_c(keys).await,
                    _ => in_d(keys).await,
                }
            })
        })
        .collect();
    for found in batches {
        assert_eq!(within(found).await.unwrap().unwrap().len(), 100);
    }
    let loads = CALLS.loads_per_key();
    assert!(
        loads
            .iter()
            .filter(|(key, _)| **key < 1_000)
            .all(|(_, &loads)| loads == 1),
        "{loads:?}"
    );
    for process in 0..4 {
        assert!(CALLS.calls_of(process) <= 2, "{:?}", CALLS.all());
    }
    let mut evalsha = 0;
    for port in cluster.masters() {
        let calls = command_calls(&cluster.command::<String>(port, &["INFO", "commandstats"]));
        println!("master {port}: {calls:?}");
        evalsha += calls.get("evalsha").copied().unwrap_or(0);
    }
    println!("4 processes x a cold batch of 100 keys on 3 masters: {evalsha} scripts");
}

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Row {
    id: u64,
    /// The row's version in the database, bumped by every update.
    version: u64,
}

fn row_version(row: &Row) -> u64 {
    row.version
}

/// The source version in the header of the envelope Redis holds at `key` (`-` for none).
fn stored_version(server: &RedisServer, key: &str) -> String {
    let stored: Vec<u8> = server.command(&["GET", key]);
    let header = stored.split(|&b| b == b'\n').next().unwrap();
    let header = String::from_utf8(header.to_vec()).unwrap();
    header.rsplit(' ').next().unwrap().to_owned()
}

/// With `lock = "local"`, two processes may load the keys of one batch at once. The one that
/// read a lagging replica fills last: Redis keeps the newer versions, and that process serves
/// them too, as a single-key call would. A key the source no longer has is written as absent
/// over a versioned value: a missing key has no version to compare.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_read_older_versions_leaves_the_newer_ones_in_redis_and_serves_them() {
    use std::sync::atomic::AtomicU64;
    static PRIMARY: AtomicU64 = AtomicU64::new(5);
    static REPLICA: AtomicU64 = AtomicU64::new(4);
    static DELETED: AtomicU64 = AtomicU64::new(u64::MAX);
    static REPLICA_GATE: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(0);
    static CALLS: Calls = Calls::new();

    fn rows(ids: Vec<u64>, version: u64) -> HashMap<u64, Row> {
        ids.into_iter()
            .filter(|&id| id != DELETED.load(SeqCst))
            .map(|id| (id, Row { id, version }))
            .collect()
    }
    #[cached(ttl = "60s", lock = "local", backend = "tiered", redis = "versions_a", batch = ids, source_version = row_version, name = "rb::versions")]
    async fn on_primary(ids: Vec<u64>) -> Result<HashMap<u64, Row>, AppError> {
        CALLS.record(0, &ids);
        Ok(rows(ids, PRIMARY.load(SeqCst)))
    }
    #[cached(ttl = "60s", lock = "local", backend = "tiered", redis = "versions_b", batch = ids, source_version = row_version, name = "rb::versions")]
    async fn on_replica(ids: Vec<u64>) -> Result<HashMap<u64, Row>, AppError> {
        CALLS.record(1, &ids);
        REPLICA_GATE.acquire().await.unwrap().forget();
        Ok(rows(ids, REPLICA.load(SeqCst)))
    }
    let versions = |found: &HashMap<u64, Row>| {
        let mut versions: Vec<(u64, u64)> =
            found.values().map(|row| (row.id, row.version)).collect();
        versions.sort_unstable();
        versions
    };

    let server = RedisServer::start();
    install(&server.url(), "versions_a");
    install(&server.url(), "versions_b");
    let name = "rb::versions";
    let lagging = tokio::spawn(on_replica(vec![1, 2, 3]));
    // Its load has begun (and waits at the gate). Not the flights in the stats, which a feed
    // event elsewhere in this process may detach while the load goes on (the wait for 3 flights
    // timed out about 1 run in 4 of this file, alone: never).
    eventually("the replica's batch to start", || {
        CALLS.all() == [(1, vec![1, 2, 3])]
    })
    .await;
    let filled = within(on_primary(vec![1, 2, 3])).await.unwrap();
    assert_eq!(versions(&filled), [(1, 5), (2, 5), (3, 5)], "filled first");
    REPLICA_GATE.add_permits(1);
    let lagging = within(lagging).await.unwrap().unwrap();
    assert_eq!(
        versions(&lagging),
        [(1, 5), (2, 5), (3, 5)],
        "the newer values Redis holds, not the replica's"
    );
    let again = within(on_replica(vec![1, 2, 3])).await.unwrap();
    assert_eq!(versions(&again), [(1, 5), (2, 5), (3, 5)], "kept in memory");
    assert_eq!(CALLS.all().len(), 2, "{:?}", CALLS.all());
    assert_eq!(stampede::stats(name).unwrap().older_versions, 3);
    let stored = server.key("test:{rb::versions~*|1}:v").unwrap();
    assert_eq!(stored_version(&server, &stored), "5");

    // Row 2 is deleted and row 1 updated: a refresh writes both, row 2 as absent.
    DELETED.store(2, SeqCst);
    PRIMARY.store(6, SeqCst);
    let refreshed = within(on_primary::refresh(vec![1, 2])).await.unwrap();
    assert_eq!(versions(&refreshed), [(1, 6)], "{:?}", CALLS.all());
    assert_eq!(on_primary::peek(2), Some(None), "absent, in memory");
    let stored = server.key("test:{rb::versions~*|2}:v").unwrap();
    assert_eq!(stored_version(&server, &stored), "-", "absent, in Redis");
    let stored = server.key("test:{rb::versions~*|1}:v").unwrap();
    assert_eq!(stored_version(&server, &stored), "6");
}

/// A value over `max_value_size` in Redis (another process's bound was larger) is, for a batch
/// as for a single-key call, left on the server: a counted miss, loaded and overwritten; the
/// other keys of the batch are read as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_leaves_an_oversized_value_on_the_server_and_loads_its_key() {
    static CALLS: Calls = Calls::new();

    #[cached(ttl = "60s", lock = "redis", redis = "oversized", batch = ids, name = "rb::oversized")]
    async fn sized(ids: Vec<u64>) -> Result<HashMap<u64, String>, AppError> {
        CALLS.record(0, &ids);
        Ok(ids
            .into_iter()
            .map(|id| (id, format!("small {id}")))
            .collect())
    }

    let server = RedisServer::start();
    RedisConfig::new(&server.url())
        .unwrap()
        .prefix("test")
        .op_timeout(Duration::from_secs(2))
        .max_value_size(64 << 10)
        .install_as("oversized");
    assert_eq!(within(sized(vec![1, 2])).await.unwrap().len(), 2);
    let key = server.key("test:{rb::oversized~*|1}:v").unwrap();
    let mut value = b"S3 99999999999999 99999999999999 0 0 0 1 -\n".to_vec();
    value.resize(100 << 10, b'x');
    within(sized::invalidate(1)).await.unwrap();
    let mut redis = server.connection();
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg(&value)
        .query(&mut redis)
        .unwrap();

    let found = within(sized(vec![1, 2])).await.unwrap();
    assert_eq!(found[&1], "small 1");
    assert_eq!(found[&2], "small 2");
    assert_eq!(
        CALLS.all().last().unwrap(),
        &(0, vec![1]),
        "{:?}",
        CALLS.all()
    );
    let stats = stampede::stats("rb::oversized").unwrap();
    assert_eq!((stats.decode_errors, stats.degraded), (1, 0), "{stats:?}");
    let stored: usize = server.command(&["STRLEN", &key]);
    assert!(
        stored < 1 << 10,
        "the load overwrote the value: {stored} bytes"
    );
}

/// A batch load that another process's `prime` overtook (the key's fence moved while it ran)
/// is refused by Redis, and its callers get the primed value Redis holds, as every process
/// will, rather than their own older one for the TTL; its other keys are written as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_load_overtaken_by_a_prime_serves_the_primed_value() {
    static GATE: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(0);
    static CALLS: Calls = Calls::new();

    macro_rules! primed {
        ($name:ident, $process:literal, $connection:literal) => {
            #[cached(ttl = "60s", lock = "local", backend = "tiered", redis = $connection, batch = ids, name = "rb::primed")]
            async fn $name(ids: Vec<u64>) -> Result<HashMap<u64, String>, AppError> {
                CALLS.record($process, &ids);
                GATE.acquire().await.unwrap().forget();
                Ok(ids.into_iter().map(|id| (id, format!("loaded {id}"))).collect())
            }
        };
    }
    primed!(in_a, 0, "primed_a");
    primed!(in_b, 1, "primed_b");

    let server = RedisServer::start();
    install(&server.url(), "primed_a");
    install(&server.url(), "primed_b");
    let loading = tokio::spawn(in_a(vec![1, 2]));
    eventually("the batch to start loading", || CALLS.all().len() == 1).await;
    within(in_b::prime(1, "primed 1".to_owned())).await.unwrap();
    GATE.add_permits(1);
    let found = within(loading).await.unwrap().unwrap();
    assert_eq!(found[&1], "primed 1", "what Redis holds since");
    assert_eq!(found[&2], "loaded 2");
    let again = within(in_a(vec![1, 2])).await.unwrap();
    assert_eq!(again[&1], "primed 1", "kept in memory");
    let other = within(in_b(vec![1, 2])).await.unwrap();
    assert_eq!(other, again, "what the other process reads from Redis");
    assert_eq!(CALLS.all().len(), 1, "{:?}", CALLS.all());
}

/// With `lock = "redis"` a batch's refresh loads its keys under their Redis locks: another
/// process's refresh of those keys meanwhile waits for its fills and returns them, rather than
/// loading beside it (simulation seed 44039, for a batch).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_refresh_holds_its_keys_locks_so_another_process_s_refresh_gets_its_fills() {
    static CALLS: Calls = Calls::new();
    static LOADING: tokio::sync::Notify = tokio::sync::Notify::const_new();

    #[cached(ttl = "60s", lock = "redis", redis = "refresh_a", batch = ids, name = "rb::refresh")]
    async fn in_a(ids: Vec<u64>) -> Result<HashMap<u64, String>, AppError> {
        CALLS.record(0, &ids);
        let n = CALLS.all().len();
        if n == 2 {
            LOADING.notify_one();
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        Ok(ids
            .into_iter()
            .map(|id| (id, format!("{id} v{n}")))
            .collect())
    }
    #[cached(ttl = "60s", lock = "redis", redis = "refresh_b", batch = ids, name = "rb::refresh")]
    async fn in_b(ids: Vec<u64>) -> Result<HashMap<u64, String>, AppError> {
        CALLS.record(1, &ids);
        Ok(ids
            .into_iter()
            .map(|id| (id, format!("{id} from b")))
            .collect())
    }

    let server = RedisServer::start();
    install(&server.url(), "refresh_a");
    install(&server.url(), "refresh_b");
    assert_eq!(within(in_a(vec![1, 2])).await.unwrap()[&1], "1 v1");
    let refresh = tokio::spawn(in_a::refresh(vec![1, 2]));
    within(LOADING.notified()).await;
    let other = within(in_b::refresh(vec![1, 2])).await.unwrap();
    assert_eq!(
        (other[&1].as_str(), other[&2].as_str()),
        ("1 v2", "2 v2"),
        "the other process's refresh returns the fills of the batch that holds the locks"
    );
    assert_eq!(within(refresh).await.unwrap().unwrap()[&2], "2 v2");
    assert_eq!(CALLS.all().len(), 2, "{:?}", CALLS.all());
}

/// A batch load whose first attempt stalls to its timeout while another process primes one of
/// its keys: the retry read the source after the prime, so its value is newer, and its fill,
/// though the prime moved the fence, replaces the primed value in Redis (as `FILL` does for one
/// key: simulation seed 1367838) rather than leave it to be served after the newer one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_fenced_off_by_a_prime_before_its_retry_replaces_the_primed_value() {
    static CALLS: Calls = Calls::new();
    static PRIMED: AtomicBool = AtomicBool::new(false);

    #[cached(
        ttl = "60s",
        lock = "redis",
        backend = "redis",
        timeout = "1s",
        retries = 1,
        backoff = "1ms",
        redis = "retry_a",
        batch = ids,
        name = "rb::retry"
    )]
    async fn in_a(ids: Vec<u64>) -> Result<HashMap<u64, String>, AppError> {
        CALLS.record(0, &ids);
        if CALLS.all().len() == 1 {
            std::future::pending::<()>().await; // stalls to the timeout
        }
        let after = if PRIMED.load(SeqCst) {
            "after"
        } else {
            "before"
        };
        Ok(ids
            .into_iter()
            .map(|id| (id, format!("{id} v2, read {after} the prime")))
            .collect())
    }
    #[cached(
        ttl = "60s",
        lock = "redis",
        backend = "redis",
        redis = "retry_b",
        batch = ids,
        name = "rb::retry"
    )]
    async fn in_b(ids: Vec<u64>) -> Result<HashMap<u64, String>, AppError> {
        CALLS.record(1, &ids);
        Ok(ids
            .into_iter()
            .map(|id| (id, format!("{id} from b")))
            .collect())
    }

    let server = RedisServer::start();
    install(&server.url(), "retry_a");
    install(&server.url(), "retry_b");
    let loading = tokio::spawn(in_a(vec![1, 2]));
    eventually("the first attempt to begin", || CALLS.all().len() == 1).await;
    within(in_b::prime(1, "primed 1".to_owned())).await.unwrap();
    PRIMED.store(true, SeqCst);
    let found = within(loading).await.unwrap().unwrap();
    assert_eq!(
        found[&1], "1 v2, read after the prime",
        "the retry's value, newer than the prime's"
    );
    assert_eq!(found[&2], "2 v2, read after the prime");
    let other = within(in_b(vec![1, 2])).await.unwrap();
    assert_eq!(
        other[&1], "1 v2, read after the prime",
        "Redis holds the retry's value, not the primed one, which is older"
    );
    assert_eq!(other[&2], "2 v2, read after the prime", "written as usual");
    assert!(
        !CALLS.all().iter().any(|(function, _)| *function == 1),
        "the other process read both from Redis: {:?}",
        CALLS.all()
    );
}

/// A batch loaded without the Redis lock (`lock = "local"`, here on `backend = "redis"`) for
/// longer than the lease keeps its fences alive as the single-key flow does, so its fill lands:
/// with nothing in memory, the next call reads Redis instead of loading again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_loaded_without_the_lock_for_longer_than_the_lease_still_fills_redis() {
    static CALLS: Calls = Calls::new();

    #[cached(ttl = "60s", backend = "redis", redis = "unlocked_long", batch = ids, name = "rb::unlocked_long")]
    async fn items(ids: Vec<u64>) -> Result<HashMap<u64, String>, AppError> {
        CALLS.record(0, &ids);
        tokio::time::sleep(Duration::from_millis(1_000)).await; // over three leases
        Ok(ids
            .into_iter()
            .map(|id| (id, format!("item {id}")))
            .collect())
    }

    let server = RedisServer::start();
    RedisConfig::new(&server.url())
        .unwrap()
        .prefix("test")
        .op_timeout(Duration::from_secs(2))
        .lease(Duration::from_millis(300))
        .install_as("unlocked_long");
    stampede::require_redis(Some("unlocked_long"))
        .await
        .unwrap();
    let loaded = within(items(vec![1, 2])).await.unwrap();
    assert_eq!(loaded[&1], "item 1");
    assert_eq!(within(items(vec![1, 2])).await.unwrap(), loaded);
    assert_eq!(
        CALLS.all(),
        [(0, vec![1, 2])],
        "the second call reads the values the first filled"
    );
    assert!(server.key("test:{rb::unlocked_long~*|1}:v").is_some());
}

/// A batch value over `max_value_size` is kept in memory for its ttl, as a single-key one is,
/// not only for the staleness bound of a value Redis could not be written for because it failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_batch_value_is_kept_in_memory_for_its_ttl() {
    static CALLS: Calls = Calls::new();

    #[cached(ttl = "60s", lock = "redis", redis = "oversized_kept", batch = ids, name = "rb::oversized_kept")]
    async fn blobs(ids: Vec<u64>) -> Result<HashMap<u64, String>, AppError> {
        CALLS.record(0, &ids);
        Ok(ids
            .into_iter()
            .map(|id| (id, "x".repeat(id as usize)))
            .collect())
    }

    let server = RedisServer::start();
    // A staleness bound of 2 x 100 ms + 500 ms = 700 ms (shorter ones let a busy machine
    // miss heartbeats: the feed is then not live, and memory rightly keeps nothing longer).
    RedisConfig::new(&server.url())
        .unwrap()
        .prefix("test")
        .op_timeout(Duration::from_millis(500))
        .heartbeat(Duration::from_millis(100))
        .max_value_size(1 << 10)
        .install_as("oversized_kept");
    stampede::require_redis(Some("oversized_kept"))
        .await
        .unwrap();
    // The feed is live only once its subscription is confirmed and a heartbeat heard: until
    // then memory rightly keeps every value for the bound only.
    assert_eq!(within(blobs(vec![1])).await.unwrap()[&1], "x");
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let big = 4 << 10;
    assert_eq!(
        within(blobs(vec![10, big])).await.unwrap()[&big].len(),
        big as usize
    );
    assert!(
        server
            .key(&format!("test:{{rb::oversized_kept~*|{big}}}:v"))
            .is_none()
    );
    tokio::time::sleep(Duration::from_millis(1_500)).await; // past the staleness bound
    assert_eq!(
        within(blobs(vec![10, big])).await.unwrap()[&big].len(),
        big as usize
    );
    assert_eq!(
        CALLS.all(),
        [(0, vec![1]), (0, vec![10, big])],
        "the small key from Redis, the large one from memory"
    );
}

/// `missing_ttl = "0s"`: a key the function leaves out is not cached, in memory or in Redis,
/// whatever `stale` says (the stale window is a value's, and an absence cached for no time has
/// none): every call asks the function for it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_ttl_zero_with_stale_caches_no_absence_in_either_tier() {
    static CALLS: Calls = Calls::new();
    static CREATED: AtomicBool = AtomicBool::new(false);

    #[cached(ttl = "60s", stale = "30s", missing_ttl = "0s", lock = "redis", redis = "missing_zero", batch = ids, name = "rb::missing_zero")]
    async fn found(ids: Vec<u64>) -> Result<HashMap<u64, String>, AppError> {
        CALLS.record(0, &ids);
        Ok(ids
            .into_iter()
            .filter(|id| *id == 1 || CREATED.load(SeqCst))
            .map(|id| (id, format!("item {id}")))
            .collect())
    }

    let server = RedisServer::start();
    install(&server.url(), "missing_zero");
    stampede::require_redis(Some("missing_zero")).await.unwrap();
    assert_eq!(within(found(vec![1, 2])).await.unwrap().len(), 1);
    CREATED.store(true, SeqCst); // key 2 is created meanwhile
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        within(found(vec![1, 2])).await.unwrap().len(),
        2,
        "key 2 is asked for again, its absence not served stale"
    );
    assert_eq!(CALLS.all(), [(0, vec![1, 2]), (0, vec![2])]);
    assert!(
        server.key("test:{rb::missing_zero~*|2}:v").is_some(),
        "key 2, found, is cached"
    );
}

/// A key of a batch is answered when its own load ends: while another key of the batch waits
/// for another process's lock, a call of a key whose load already failed (the source back)
/// loads it anew, rather than join the batch's flight and get the old failure when the batch's
/// last key is answered (simulation seeds 11882, 100700, 105908, 108926).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_whose_load_failed_is_loaded_anew_while_another_key_of_its_batch_waits() {
    static HOLDING: tokio::sync::Notify = tokio::sync::Notify::const_new();
    static LET_GO: tokio::sync::Notify = tokio::sync::Notify::const_new();
    static FAILING: AtomicBool = AtomicBool::new(true);
    static FAILED: tokio::sync::Notify = tokio::sync::Notify::const_new();

    // Another process, loading key 2 until the test lets it go.
    #[cached(ttl = "60s", lock = "redis", redis = "settle_a", batch = ids, name = "rb::settle")]
    async fn in_a(ids: Vec<u64>) -> Result<HashMap<u64, String>, AppError> {
        HOLDING.notify_one();
        LET_GO.notified().await;
        Ok(ids.into_iter().map(|id| (id, format!("{id} a"))).collect())
    }
    #[cached(ttl = "60s", lock = "redis", redis = "settle_b", batch = ids, name = "rb::settle")]
    async fn in_b(ids: Vec<u64>) -> Result<HashMap<u64, String>, AppError> {
        match FAILING.load(SeqCst) {
            true => {
                FAILED.notify_one();
                Err(AppError::Db("the replica is gone".into()))
            }
            false => Ok(ids.into_iter().map(|id| (id, format!("{id} b"))).collect()),
        }
    }

    let server = RedisServer::start();
    install(&server.url(), "settle_a");
    // B waits for A's fill of key 2 longer than the test runs.
    RedisConfig::new(&server.url())
        .unwrap()
        .prefix("test")
        .op_timeout(Duration::from_secs(2))
        .lock_wait(Duration::from_secs(120))
        .install_as("settle_b");
    let holder = tokio::spawn(in_a(vec![2]));
    within(HOLDING.notified()).await;
    // Key 1's load fails at once; key 2 waits for A's fill.
    let batch = tokio::spawn(in_b(vec![1, 2]));
    within(FAILED.notified()).await;
    FAILING.store(false, SeqCst);
    // A call that joined key 1's flight before its failure was settled gets that failure: ask
    // again. One that waits for the batch's last key does not return before A lets go.
    let again = within(async {
        loop {
            if let Ok(found) = in_b(vec![1]).await {
                break found;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert_eq!(again[&1], "1 b");
    assert!(!batch.is_finished(), "key 2 still waits for A");
    LET_GO.notify_one();
    assert_eq!(within(holder).await.unwrap().unwrap()[&2], "2 a");
    let error = within(batch).await.unwrap().unwrap_err();
    assert!(
        matches!(error, AppError::Db(_)),
        "a batch answers all its keys or an error"
    );
}

/// A batch's fill writes each value over `compress` compressed, as a single-key fill does, and a
/// process of the cache without the option reads them all (one identity), loading none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_fill_compresses_its_large_values_and_every_process_reads_them() {
    static CALLS: Calls = Calls::new();
    fn row(id: u64) -> String {
        format!("product #{id}: ").repeat(id as usize * 10)
    }
    #[cached(ttl = "60s", lock = "redis", redis = "packed_a", batch = ids, name = "rb::packed", compress = 256)]
    async fn packed(ids: Vec<u64>) -> Result<HashMap<u64, String>, AppError> {
        CALLS.record(0, &ids);
        Ok(ids.into_iter().map(|id| (id, row(id))).collect())
    }
    #[cached(ttl = "60s", lock = "redis", redis = "packed_b", batch = ids, name = "rb::packed")]
    async fn plain(ids: Vec<u64>) -> Result<HashMap<u64, String>, AppError> {
        CALLS.record(1, &ids);
        Ok(ids.into_iter().map(|id| (id, row(id))).collect())
    }

    let server = RedisServer::start();
    install(&server.url(), "packed_a");
    install(&server.url(), "packed_b");
    let keys: Vec<u64> = (1..=20).collect();
    let expected: HashMap<u64, String> = keys.iter().map(|&id| (id, row(id))).collect();
    assert_eq!(within(packed(keys.clone())).await.unwrap(), expected);
    for id in [1, 20] {
        let key = server
            .key(&format!("test:{{rb::packed~*|{id}}}:v"))
            .expect("written");
        let bytes: Vec<u8> = server.command(&["GET", &key]);
        let payload = &bytes[bytes.iter().position(|&b| b == b'\n').unwrap() + 1..];
        // Row 1 takes 120 bytes, under the threshold; row 20 takes 2,600, compressed.
        let form: &[u8] = if id == 1 { b"\xc1\x02" } else { b"\xc1\x03" };
        assert_eq!(&payload[..2], form, "key {id}");
    }
    assert_eq!(within(plain(keys.clone())).await.unwrap(), expected);
    assert_eq!(CALLS.calls_of(1), 0, "every value read from Redis");
    assert_eq!(stampede::stats("rb::packed").unwrap().decode_errors, 0);
}

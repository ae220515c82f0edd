//! `source_version = "path"`: a value read from the source at an older version than the one
//! stored never replaces it, in memory or in Redis, and is counted. The source here is a table
//! of rows with a version each, read through a "replica" that can lag behind it.
//!
//! Redis tests use a real `redis-server` per test; two caches with one `name` and their own
//! connections stand for two processes.

mod common;

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

use common::redis_server::RedisServer;
use common::within;
use serde::{Deserialize, Serialize};
use stampede::{RedisConfig, cached};
use tokio::sync::Semaphore;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Row {
    id: u64,
    /// The row's version in the database, bumped by every update.
    version: u64,
}

fn row_version(row: &Row) -> u64 {
    row.version
}

fn older_versions(name: &str) -> u64 {
    stampede::stats(name).unwrap().older_versions
}

static MEMORY_VERSION: AtomicU64 = AtomicU64::new(5);

#[cached(ttl = "60s", source_version = "row_version", name = "versions::memory")]
async fn in_memory(id: u64) -> Row {
    Row {
        id,
        version: MEMORY_VERSION.load(SeqCst),
    }
}

#[tokio::test]
async fn in_memory_an_older_refresh_or_prime_never_replaces_a_newer_value() {
    let name = "versions::memory";
    assert_eq!(within(in_memory(1)).await.version, 5);

    // The replica the load reads lags: a refresh reads version 4. Its caller gets the newer
    // value memory holds, which stays.
    MEMORY_VERSION.store(4, SeqCst);
    assert_eq!(within(in_memory::refresh(1)).await.version, 5);
    assert_eq!(in_memory::peek(1).map(|row| row.version), Some(5));
    assert_eq!(older_versions(name), 1);

    // A prime of an older version is not stored either; a newer one is.
    within(in_memory::prime(1, Row { id: 1, version: 3 }))
        .await
        .unwrap();
    assert_eq!(in_memory::peek(1).map(|row| row.version), Some(5));
    assert_eq!(older_versions(name), 2);
    within(in_memory::prime(1, Row { id: 1, version: 6 }))
        .await
        .unwrap();
    assert_eq!(in_memory::peek(1).map(|row| row.version), Some(6));
    assert_eq!(within(in_memory::refresh(1)).await.version, 6);

    // An invalidation leaves no version behind: the next load is stored, whatever its version.
    in_memory::invalidate(1).await.unwrap();
    assert_eq!(within(in_memory(1)).await.version, 4);
    assert_eq!(older_versions(name), 3);
}

/// The source version in the header of the envelope Redis holds at `key`.
fn stored_version(server: &RedisServer, key: &str) -> String {
    let stored: Vec<u8> = server.command(&["GET", key]);
    let header = stored.split(|&b| b == b'\n').next().unwrap();
    let header = String::from_utf8(header.to_vec()).unwrap();
    header.rsplit(' ').next().unwrap().to_owned()
}

fn install(server: &RedisServer, connection: &str) {
    RedisConfig::new(&server.url())
        .unwrap()
        .prefix("test")
        .install_as(connection);
}

/// The row's version in the primary, and in the replica one process reads, which lags.
static PRIMARY: AtomicU64 = AtomicU64::new(5);
static REPLICA: AtomicU64 = AtomicU64::new(4);
static REPLICA_GATE: Semaphore = Semaphore::const_new(0);

#[cached(
    ttl = "60s",
    lock = "local",
    backend = "tiered",
    redis = "versions_local_a",
    source_version = "row_version",
    name = "versions::local"
)]
async fn on_primary(id: u64) -> Row {
    Row {
        id,
        version: PRIMARY.load(SeqCst),
    }
}

#[cached(
    ttl = "60s",
    lock = "local",
    backend = "tiered",
    redis = "versions_local_b",
    source_version = "row_version",
    name = "versions::local"
)]
async fn on_replica(id: u64) -> Row {
    REPLICA_GATE.acquire().await.unwrap().forget();
    Row {
        id,
        version: REPLICA.load(SeqCst),
    }
}

/// With `lock = "local"` two processes may load one key at once. The one that read a lagging
/// replica fills last: Redis keeps the newer version, and that process serves it too.
#[tokio::test]
async fn across_processes_an_older_fill_leaves_the_newer_value_in_redis_and_serves_it() {
    let server = RedisServer::start();
    install(&server, "versions_local_a");
    install(&server, "versions_local_b");
    let name = "versions::local";

    let lagging = tokio::spawn(on_replica(1));
    common::eventually("the replica's load to start", || {
        stampede::stats(name).is_some_and(|stats| stats.in_flight == 1)
    })
    .await;
    assert_eq!(within(on_primary(1)).await.version, 5, "filled first");
    REPLICA_GATE.add_permits(1);
    assert_eq!(
        within(lagging).await.unwrap().version,
        5,
        "the newer value Redis holds, not the replica's"
    );
    assert_eq!(within(on_replica(1)).await.version, 5, "kept in memory");
    assert_eq!(older_versions(name), 1);
    let stored = server.key("test:{versions::local~*|1}:v").unwrap();
    assert_eq!(stored_version(&server, &stored), "5");
}

static ADMIN_PRIMARY: AtomicU64 = AtomicU64::new(8);
static ADMIN_READS: Mutex<u64> = Mutex::new(0);

#[cached(
    ttl = "60s",
    lock = "redis",
    redis = "versions_admin_node",
    source_version = "row_version",
    name = "versions::admin"
)]
async fn node(id: u64) -> Row {
    *ADMIN_READS.lock().unwrap() += 1;
    Row {
        id,
        version: ADMIN_PRIMARY.load(SeqCst),
    }
}

#[cached(
    ttl = "60s",
    lock = "redis",
    redis = "versions_admin_tool",
    source_version = "row_version",
    name = "versions::admin"
)]
async fn admin(id: u64) -> Row {
    Row {
        id,
        version: ADMIN_PRIMARY.load(SeqCst),
    }
}

/// An admin tool primes a value it read from a replica that lags: Redis keeps the newer one,
/// so no process reads the older; a prime of a newer version is written.
#[tokio::test]
async fn an_older_prime_from_another_process_is_not_written_to_redis() {
    let server = RedisServer::start();
    install(&server, "versions_admin_node");
    install(&server, "versions_admin_tool");
    let name = "versions::admin";
    assert_eq!(within(node(1)).await.version, 8);

    within(admin::prime(1, Row { id: 1, version: 7 }))
        .await
        .unwrap();
    assert_eq!(older_versions(name), 1);
    assert_eq!(within(admin(1)).await.version, 8, "read from Redis");
    assert_eq!(*ADMIN_READS.lock().unwrap(), 1, "nobody loaded again");

    within(admin::prime(1, Row { id: 1, version: 9 }))
        .await
        .unwrap();
    let stored = server.key("test:{versions::admin~*|1}:v").unwrap();
    assert_eq!(
        stored_version(&server, &stored),
        "9",
        "the newer prime is written"
    );
}

static ONLY_REDIS: AtomicU64 = AtomicU64::new(3);

#[cached(
    ttl = "60s",
    backend = "redis",
    lock = "redis",
    redis = "versions_only",
    source_version = "row_version",
    name = "versions::only_redis"
)]
async fn only_in_redis(id: u64) -> Row {
    Row {
        id,
        version: ONLY_REDIS.load(SeqCst),
    }
}

/// Without memory, the check is Redis's alone: a refresh that read an older version leaves the
/// newer value, and its caller gets that.
#[tokio::test]
async fn without_memory_an_older_refresh_leaves_the_newer_value_in_redis() {
    let server = RedisServer::start();
    install(&server, "versions_only");
    assert_eq!(within(only_in_redis(1)).await.version, 3);
    ONLY_REDIS.store(2, SeqCst);
    assert_eq!(within(only_in_redis::refresh(1)).await.version, 3);
    assert_eq!(within(only_in_redis(1)).await.version, 3);
    assert_eq!(older_versions("versions::only_redis"), 1);
}

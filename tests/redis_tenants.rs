//! Two tenants of one Redis server: processes on two databases (`redis://host/1`,
//! `redis://host/2`) with the same prefix and the same cache names never hand each other values
//! or invalidations. Redis pub/sub ignores the database number, so the channels must not.
//! Real `redis-server` per test.
//!
//! Functions with one `name` and their own connections stand for processes (as in
//! `redis_tier.rs`), except where one process's memory would answer for another: the tenant
//! that invalidates is then a real other process, this test binary started again (the
//! `tenant_writer` test, told its part by an environment variable), because a process drops a
//! cache's memory by its name whichever of its connections heard the invalidation.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use common::redis_server::RedisServer;
use common::{WAIT, another_process, eventually, until, within};
use stampede::{RedisConfig, cached};
use tokio::sync::Semaphore;

/// Installs the connection `name` to database `db` of `server`, prefix `test` for every tenant.
fn install(server_url: &str, db: u8, name: &str) {
    RedisConfig::new(&format!("{server_url}{db}"))
        .unwrap()
        .prefix("test")
        // The memory of a value read before the first heartbeat came back is trusted for
        // `2 × heartbeat + op_timeout`: a minute, longer than the test, so that only an
        // invalidation drops it.
        .heartbeat(Duration::from_secs(30))
        .install_as(name);
}

static FILL_HOLDER_STARTED: AtomicBool = AtomicBool::new(false);
static FILL_GATE: Semaphore = Semaphore::const_new(0);
static FILL_WAITER_LOADS: AtomicUsize = AtomicUsize::new(0);

/// Tenant 1's process.
#[cached(
    ttl = "60s",
    lock = "redis",
    redis = "fill_one",
    name = "tenants::fill"
)]
async fn fill_one(id: u64) -> String {
    format!("tenant 1's {id}")
}

/// A process of tenant 2 whose load runs until the test lets it end.
#[cached(
    ttl = "60s",
    lock = "redis",
    redis = "fill_two_a",
    name = "tenants::fill"
)]
async fn fill_two_holder(id: u64) -> String {
    FILL_HOLDER_STARTED.store(true, SeqCst);
    FILL_GATE.acquire().await.unwrap().forget();
    format!("tenant 2's {id}")
}

/// Another process of tenant 2, which waits for the holder's fill.
#[cached(
    ttl = "60s",
    lock = "redis",
    redis = "fill_two_b",
    name = "tenants::fill"
)]
async fn fill_two_waiter(id: u64) -> String {
    FILL_WAITER_LOADS.fetch_add(1, SeqCst);
    format!("tenant 2's {id}, loaded by the waiter")
}

/// A waiter of tenant 2 (database 2) is woken by its own holder's fill only: tenant 1 (database
/// 1) filling the same key of the same cache meanwhile publishes nothing it hears, so it is
/// never served (nor keeps) tenant 1's value, which the publication carries.
#[tokio::test]
async fn a_waiter_is_never_handed_a_fill_of_another_database() {
    let server = RedisServer::start();
    let url = server.url();
    install(&url, 1, "fill_one");
    install(&url, 2, "fill_two_a");
    install(&url, 2, "fill_two_b");

    let holder = tokio::spawn(fill_two_holder(7));
    eventually("tenant 2's holder to take the lock and load", || {
        FILL_HOLDER_STARTED.load(SeqCst)
    })
    .await;
    let waiter = tokio::spawn(fill_two_waiter(7));
    // The waiter found the lock held and subscribed to the key's channel.
    eventually(
        "tenant 2's waiter to subscribe to the key's channel",
        || {
            !server
                .command::<Vec<String>>(&["PUBSUB", "CHANNELS", "test:{tenants::fill~*|7}:c*"])
                .is_empty()
        },
    )
    .await;

    // Tenant 1 fills the key in its database, which publishes the value.
    assert_eq!(within(fill_one(7)).await, "tenant 1's 7");
    // Time for a wrong wake-up to happen.
    tokio::time::sleep(Duration::from_millis(300)).await;
    FILL_GATE.add_permits(1);
    assert_eq!(within(holder).await.unwrap(), "tenant 2's 7");
    assert_eq!(
        within(waiter).await.unwrap(),
        "tenant 2's 7",
        "tenant 2's waiter gets tenant 2's fill"
    );
    assert_eq!(
        within(fill_two_waiter(7)).await,
        "tenant 2's 7",
        "and keeps it"
    );
    assert_eq!(FILL_WAITER_LOADS.load(SeqCst), 0);
    assert_eq!(
        within(fill_one(7)).await,
        "tenant 1's 7",
        "tenant 1 keeps its own"
    );
}

static INV_LOADS: AtomicUsize = AtomicUsize::new(0);
static SENTINEL_LOADS: AtomicUsize = AtomicUsize::new(0);

/// Tenant 1's cache, invalidated by the writer process (never called in this one).
#[cached(ttl = "60s", lock = "redis", redis = "inv_one", name = "tenants::inv")]
async fn inv_one(id: u64) -> String {
    format!("tenant 1's {id}")
}

/// Tenant 2's cache of the same name.
#[cached(ttl = "60s", lock = "redis", redis = "inv_two", name = "tenants::inv")]
async fn inv_two(id: u64) -> String {
    INV_LOADS.fetch_add(1, SeqCst);
    format!("tenant 2's {id}")
}

/// Another cache of tenant 2, whose invalidation the writer announces after tenant 1's: once
/// this process has heard it, it has heard whatever came before it on its feed.
#[cached(
    ttl = "60s",
    lock = "redis",
    redis = "inv_two",
    name = "tenants::sentinel"
)]
async fn sentinel_two(id: u64) -> String {
    SENTINEL_LOADS.fetch_add(1, SeqCst);
    format!("sentinel {id}")
}

/// Set in the writer process: the server's URL, without a database.
const WRITER: &str = "STAMPEDE_TEST_TENANT_WRITER";

/// The writer process's part (a plain pass in the normal run): invalidates key 7 of tenant 1's
/// `tenants::inv`, then key 7 of tenant 2's `tenants::sentinel`, and says so.
#[test]
fn tenant_writer() {
    let Ok(url) = std::env::var(WRITER) else {
        return;
    };
    install(&url, 1, "inv_one");
    install(&url, 2, "inv_two");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        tokio::time::timeout(WAIT, inv_one::invalidate(7))
            .await
            .expect("tenant 1's invalidation within the bound")
            .expect("tenant 1's invalidation");
        tokio::time::timeout(WAIT, sentinel_two::invalidate(7))
            .await
            .expect("tenant 2's invalidation within the bound")
            .expect("tenant 2's invalidation");
    });
    println!("tenant writer: done");
}

/// Tenant 1 invalidating a key of a cache that tenant 2 has too does not drop tenant 2's copy
/// from its memory (nor from Redis): tenant 2 does not load it again.
#[tokio::test]
async fn an_invalidation_in_another_database_does_not_drop_this_ones_memory() {
    let server = RedisServer::start();
    let url = server.url();
    install(&url, 2, "inv_two");
    assert_eq!(within(inv_two(7)).await, "tenant 2's 7");
    assert_eq!(within(sentinel_two(7)).await, "sentinel 7");
    assert_eq!(
        (INV_LOADS.load(SeqCst), SENTINEL_LOADS.load(SeqCst)),
        (1, 1)
    );
    // Memory is now the only copy of tenant 2's value: dropping it means loading it again.
    let mut two = redis::Client::open(format!("{url}2"))
        .unwrap()
        .get_connection()
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("test:{tenants::inv~*|7}:v")
        .query(&mut two)
        .unwrap();
    assert_eq!(keys.len(), 1, "tenant 2's value in database 2: {keys:?}");
    let _: i64 = redis::cmd("DEL").arg(&keys).query(&mut two).unwrap();

    let output = another_process("tenant_writer", WRITER, &url).await;
    assert!(output.contains("tenant writer: done"), "{output}");
    // Tenant 2's own invalidation, announced after tenant 1's, reached this process.
    until(
        "tenant 2's invalidation of the sentinel to reach this process",
        WAIT,
        || async {
            within(sentinel_two(7)).await;
            (SENTINEL_LOADS.load(SeqCst) == 2).then_some(())
        },
    )
    .await;
    assert_eq!(within(inv_two(7)).await, "tenant 2's 7");
    assert_eq!(
        INV_LOADS.load(SeqCst),
        1,
        "tenant 1's invalidation dropped tenant 2's copy from memory"
    );
}

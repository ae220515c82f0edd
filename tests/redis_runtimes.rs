//! Tokio runtimes that come and go in one process (tests, CLI tools), against a real
//! `redis-server`. A cache lives in a static, so its memory outlives the runtime that filled it;
//! the invalidation feed that vouched for that memory was subscribed on that runtime, and hears
//! nothing once it is gone. The next runtime must not serve from memory a value that another
//! process invalidated meanwhile; nor when the older runtime is still there but idle (nothing
//! drives its feed).
//!
//! The process that invalidates is a real other process: this test binary started again as an
//! invalidator (the `invalidator` test, told its part by an environment variable), which
//! invalidates the key with `stampede::invalidate` on its own connection. Its invalidation travels
//! the way the library sends it, so this test says nothing of the channels and commands used.
//!
//! Each test builds its own runtimes, so each is a plain `#[test]`.

mod common;

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use common::redis_server::RedisServer;
use common::{WAIT, within};
use stampede::{RedisConfig, cached};

/// Set in the invalidator process: its connection's name, the server's URL, the cache's name
/// and the key, separated by spaces.
const INVALIDATOR: &str = "STAMPEDE_TEST_RUNTIMES_INVALIDATOR";

fn install(url: &str, connection: &str) {
    RedisConfig::new(url)
        .unwrap()
        .prefix("test")
        .heartbeat(Duration::from_millis(300))
        .install_as(connection);
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Held by each test for its whole run: a runtime that ends drops the memory of every
/// Redis-backed cache of the process, which must not meet another test's memory.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

static LOADS: AtomicUsize = AtomicUsize::new(0);
static VERSION: AtomicUsize = AtomicUsize::new(1);

#[cached(
    ttl = "60s",
    lock = "redis",
    redis = "runtimes",
    name = "runtimes::item"
)]
async fn item(id: u64) -> String {
    LOADS.fetch_add(1, SeqCst);
    format!("{id} v{}", VERSION.load(SeqCst))
}

/// Has another process invalidate `key` of the cache `name`, through its own connection of that
/// cache's name `connection` to `url`; fails the test if it does not say it did within [`WAIT`].
fn invalidate_in_another_process(connection: &str, url: &str, name: &str, key: u64) {
    let exe = std::env::current_exe().expect("this test binary's path");
    let mut child = Command::new(exe)
        .args([
            "--exact",
            "invalidator",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(INVALIDATOR, format!("{connection} {url} {name} {key}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("cannot start the invalidator process");
    let started = Instant::now();
    while child
        .try_wait()
        .expect("the invalidator's status")
        .is_none()
    {
        if started.elapsed() > WAIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the invalidator did not finish within {WAIT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().expect("the invalidator's output");
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(
        said.contains("invalidator: invalidated"),
        "the invalidator failed: {said}"
    );
}

/// The invalidator process's part (a plain pass in the normal run).
#[test]
fn invalidator() {
    let Ok(part) = std::env::var(INVALIDATOR) else {
        return;
    };
    let [connection, url, name, key] = part.split(' ').collect::<Vec<_>>()[..] else {
        panic!("a connection, a URL, a cache name and a key: {part:?}");
    };
    let key: u64 = key.parse().expect("a key");
    install(url, connection);
    let invalidated = runtime()
        .block_on(async { tokio::time::timeout(WAIT, stampede::invalidate(name, (key,))).await });
    match invalidated {
        Ok(Ok(())) => println!("invalidator: invalidated"),
        Ok(Err(error)) => println!("invalidator: failed: {error}"),
        Err(_) => println!("invalidator: failed: no answer within {WAIT:?}"),
    }
}

/// Runtime 1 loads v1 and keeps it in memory (a hit shows it), then shuts down. Another process
/// invalidates the key; the source says v2. Runtime 2's first call must not serve v1 from
/// memory: the feed that vouched for it was gone while the invalidation ran. The TTL is 60 s,
/// so only the invalidation explains v2.
#[test]
fn a_runtime_does_not_serve_a_value_invalidated_while_no_runtime_ran() {
    let _serial = serial();
    let name = "runtimes::item";
    let server = RedisServer::start();
    install(&server.url(), "runtimes");

    let first = runtime();
    assert_eq!(first.block_on(within(item(1))), "1 v1", "loaded");
    assert_eq!(first.block_on(within(item(1))), "1 v1", "kept");
    let stats = stampede::stats(name).unwrap();
    assert_eq!(
        (LOADS.load(SeqCst), stats.hits),
        (1, 1),
        "v1 is loaded once and kept in memory: {stats:?}"
    );
    drop(first);

    VERSION.store(2, SeqCst);
    invalidate_in_another_process("runtimes", &server.url(), name, 1);
    assert_eq!(
        server.key("test:{runtimes::item~*|1}:v"),
        None,
        "the other process dropped the value from Redis"
    );

    let second = runtime();
    assert_eq!(
        second.block_on(within(item(1))),
        "1 v2",
        "runtime 2 served what runtime 1 kept, which another process invalidated meanwhile"
    );
    assert_eq!(LOADS.load(SeqCst), 2);
    // Once the new runtime's feed is live, what it loaded is kept.
    assert_eq!(second.block_on(within(item(1))), "1 v2");
    assert_eq!(LOADS.load(SeqCst), 2);
}

static IDLE_LOADS: AtomicUsize = AtomicUsize::new(0);
static IDLE_VERSION: AtomicUsize = AtomicUsize::new(1);

#[cached(ttl = "60s", lock = "redis", redis = "idle", name = "runtimes::idle")]
async fn idle_item(id: u64) -> String {
    IDLE_LOADS.fetch_add(1, SeqCst);
    format!("{id} v{}", IDLE_VERSION.load(SeqCst))
}

/// Runtime 1 (a current-thread runtime) loads v1 and keeps it in memory, then stays idle: it is
/// not dropped, but nothing drives it, so its feed hears nothing. Another process invalidates the
/// key. Runtime 2's first session (opened by a call on another key) is a recovery: it drops what
/// memory holds, which no live feed vouches for, and the key's next call gets v2.
#[test]
fn the_first_session_of_a_new_runtime_is_a_recovery_while_an_older_runtime_idles() {
    let _serial = serial();
    let name = "runtimes::idle";
    let server = RedisServer::start();
    install(&server.url(), "idle");

    let first = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    assert_eq!(first.block_on(within(idle_item(1))), "1 v1", "loaded");
    assert_eq!(first.block_on(within(idle_item(1))), "1 v1", "kept");
    assert_eq!(IDLE_LOADS.load(SeqCst), 1);

    IDLE_VERSION.store(2, SeqCst);
    invalidate_in_another_process("idle", &server.url(), name, 1);
    assert_eq!(server.key("test:{runtimes::idle~*|1}:v"), None);

    let second = runtime();
    assert_eq!(second.block_on(within(idle_item(7))), "7 v2", "another key");
    assert_eq!(
        second.block_on(within(idle_item(1))),
        "1 v2",
        "runtime 2 served what idle runtime 1 kept, which another process invalidated meanwhile"
    );
    assert_eq!(IDLE_LOADS.load(SeqCst), 3);
    drop(second);
    drop(first);
}

//! The Redis tier under faults, against a real `redis-server` per test: durations up to
//! `Duration::MAX`.
//!
//! Time is real: the faults are on real sockets.

mod common;

use std::time::Duration;

use common::redis_server::RedisServer;
use common::within;
use stampede::{RedisConfig, cached};

async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    SERIAL.lock().await
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
    for (name, key) in [
        ("faults::max_lease", "test:{faults::max_lease:1}:v"),
        ("faults::max_wait", "test:{faults::max_wait:1}:v"),
        ("faults::max_op", "test:{faults::max_op:1}:v"),
    ] {
        let stats = stampede::stats(name).unwrap();
        assert_eq!(
            (stats.degraded, stats.lock_acquired),
            (0, 1),
            "{name} went through Redis: {stats:?}"
        );
        assert_eq!(server.command::<i64>(&["EXISTS", key]), 1, "{key}");
    }
    let pttl: i64 = server.command(&["PTTL", "test:{faults::max_lease:1}:l"]);
    assert_eq!(pttl, -2, "the lock was released");

    assert_eq!(within(cooldown(1)).await, 6, "loaded here: nothing listens");
    assert_eq!(within(cooldown(2)).await, 7, "skipped during the cool-down");
    assert_eq!(stampede::stats("faults::max_cooldown").unwrap().degraded, 2);
}

//! Test support shared by the workspace's test suites: [`within`], [`eventually`] and
//! [`until`], the bounded waits of every test, [`redis_server::RedisServer`], a real
//! `redis-server` per test on a free loopback port (plain, TLS, or with a password),
//! [`redis_cluster::Cluster`], a real Redis Cluster (masters, with or without replicas, plain
//! or TLS) whose nodes fault tests kill, restart and move slots between, [`tls::TestCerts`],
//! certificates made by the test, [`fault_proxy::FaultProxy`], a TCP proxy in front of a
//! server that delays, blackholes or cuts connections, and [`monitor::Monitor`], the commands
//! clients send a server (the round trips a call makes).
//!
//! The server binary is `redis-server`, or the one named by `STAMPEDE_TEST_SERVER` (e.g.
//! `valkey-server`).

pub mod fault_proxy;
pub mod monitor;
pub mod redis_cluster;
pub mod redis_server;
pub mod tls;
pub mod wait;

pub use wait::{WAIT, eventually, until, within};

use std::path::PathBuf;

/// A new, empty directory under the system's temporary one, named after `what` and this process.
pub(crate) fn temp_dir(what: &str) -> PathBuf {
    use std::hash::{BuildHasher, RandomState};
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let unique = RandomState::new().hash_one(NEXT.fetch_add(1, Ordering::Relaxed));
    let dir = std::env::temp_dir().join(format!("{what}-{}-{unique:x}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("cannot create a temporary directory");
    dir
}

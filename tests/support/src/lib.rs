//! Test support shared by the workspace's test suites: [`redis_server::RedisServer`], a real
//! `redis-server` per test on a free loopback port, and [`fault_proxy::FaultProxy`], a TCP proxy
//! in front of it that delays, blackholes or cuts connections.

pub mod fault_proxy;
pub mod redis_server;

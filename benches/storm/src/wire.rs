//! What an instance reports on `GET /stats`, read by the orchestrator at each phase boundary.

use serde::{Deserialize, Serialize};

/// An instance's counters since it started (but `pool_wait_max_us`: since the last read).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct InstanceStats {
    /// Product requests answered.
    pub requests: u64,
    /// Of them, answered with an error status.
    pub errors: u64,
    /// Product queries this instance sent to the database.
    pub queries: u64,
    /// Of them, those that failed (pool timeout, database error).
    pub query_errors: u64,
    /// Queries per hot key: index `id - 1` for ids `1..=HOT_KEYS`.
    pub hot_queries: Vec<u64>,
    /// Connections taken from the pool, and the time spent waiting for them.
    pub pool_waits: u64,
    /// Total wait for a pool connection, in microseconds.
    pub pool_wait_us: u64,
    /// The longest wait for a connection since the last `/stats` read, in microseconds.
    pub pool_wait_max_us: u64,
    /// Requests whose cache call took at least the wait threshold (half a query's time):
    /// those that waited for a load, plus any hit descheduled that long.
    pub waits: u64,
    /// The same, for requests of a hot key.
    pub hot_waits: u64,
}

/// The line an instance prints on its standard output once it listens.
pub const READY: &str = "storm-service listening on ";

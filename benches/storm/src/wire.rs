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
    /// The cache's own counters (`stampede::stats`), for a stampede contender.
    #[serde(default)]
    pub cache: CacheCounters,
}

/// What `stampede::stats` counts, of one instance's cache: the library's own account of why a
/// request waited (a miss) or did not (a hit, a stale value served).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct CacheCounters {
    /// Calls answered with a fresh value.
    pub hits: u64,
    /// Calls that found no servable value and waited for a load.
    pub misses: u64,
    /// Calls answered with a stale value while a refresh ran.
    pub stale_served: u64,
    /// Values read from Redis because the instance's memory had none.
    pub remote_hits: u64,
    /// Loads that ran without Redis (down, slow).
    pub degraded: u64,
    /// Background refreshes (stale, or early past `refresh_after`).
    pub refreshes: u64,
    /// Calls answered with the last good value for a failed load.
    pub fail_safe_served: u64,
}

impl CacheCounters {
    /// `self - earlier`, counter by counter.
    pub fn since(&self, earlier: &CacheCounters) -> CacheCounters {
        CacheCounters {
            hits: self.hits.saturating_sub(earlier.hits),
            misses: self.misses.saturating_sub(earlier.misses),
            stale_served: self.stale_served.saturating_sub(earlier.stale_served),
            remote_hits: self.remote_hits.saturating_sub(earlier.remote_hits),
            degraded: self.degraded.saturating_sub(earlier.degraded),
            refreshes: self.refreshes.saturating_sub(earlier.refreshes),
            fail_safe_served: self
                .fail_safe_served
                .saturating_sub(earlier.fail_safe_served),
        }
    }

    /// The sum of two instances' counters.
    pub fn plus(&self, other: &CacheCounters) -> CacheCounters {
        CacheCounters {
            hits: self.hits + other.hits,
            misses: self.misses + other.misses,
            stale_served: self.stale_served + other.stale_served,
            remote_hits: self.remote_hits + other.remote_hits,
            degraded: self.degraded + other.degraded,
            refreshes: self.refreshes + other.refreshes,
            fail_safe_served: self.fail_safe_served + other.fail_safe_served,
        }
    }
}

/// The line an instance prints on its standard output once it listens.
pub const READY: &str = "storm-service listening on ";

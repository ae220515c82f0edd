//! The contenders: one service build each, selected by name on the instance's command line.

use std::fmt;
use std::str::FromStr;

/// How an instance caches the product query.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Contender {
    /// Every request runs the query.
    NoCache,
    /// moka's `future::Cache::try_get_with`, one cache per instance.
    Moka,
    /// The `cached` crate's `#[concurrent_cached]` over its Redis store (`AsyncRedisCache`),
    /// shared by the 4 instances.
    CachedRedis,
    /// `#[stampede::cached(lock = "local")]`: one load per key per instance.
    StampedeLocal,
    /// `#[stampede::cached(lock = "redis", stale = ..., fail_safe = ...)]`: memory in front of
    /// Redis, one load per key across the instances, stale values served while one refresh runs.
    StampedeRedis,
    /// As `StampedeRedis`, with `max_loads = 8` (below the instance's pool of 10): a cold
    /// start's misses queue in the cache rather than on the pool.
    StampedeRedisCapped,
    /// As `StampedeRedis`, its connection set to `trust_while_deaf(ttl)`: what an instance loads
    /// while its invalidation feed is down (Redis away) is kept for the ttl, not the staleness
    /// bound.
    StampedeRedisTrusting,
    /// `#[stampede::cached(lock = "redis", refresh_after = ...)]`: a value read steadily is
    /// refreshed before it expires.
    StampedeRefresh,
}

impl Contender {
    /// Every contender, in the order of the report.
    pub const ALL: [Contender; 8] = [
        Contender::NoCache,
        Contender::Moka,
        Contender::CachedRedis,
        Contender::StampedeLocal,
        Contender::StampedeRedis,
        Contender::StampedeRedisCapped,
        Contender::StampedeRedisTrusting,
        Contender::StampedeRefresh,
    ];

    /// The name on the command line (`--contenders`, `service --contender`).
    pub fn name(self) -> &'static str {
        match self {
            Contender::NoCache => "none",
            Contender::Moka => "moka",
            Contender::CachedRedis => "cached-redis",
            Contender::StampedeLocal => "stampede-local",
            Contender::StampedeRedis => "stampede-redis",
            Contender::StampedeRedisCapped => "stampede-redis-max-loads",
            Contender::StampedeRedisTrusting => "stampede-redis-trust",
            Contender::StampedeRefresh => "stampede-refresh",
        }
    }

    /// The label in the report and the picture.
    pub fn label(self) -> &'static str {
        match self {
            Contender::NoCache => "no cache",
            Contender::Moka => "moka get_with",
            Contender::CachedRedis => "cached (Redis store)",
            Contender::StampedeLocal => "stampede lock=local",
            Contender::StampedeRedis => "stampede lock=redis + stale",
            Contender::StampedeRedisCapped => "stampede lock=redis + stale + max_loads=8",
            Contender::StampedeRedisTrusting => "stampede lock=redis + stale + trust_while_deaf",
            Contender::StampedeRefresh => "stampede refresh_after",
        }
    }

    /// The `name` of its `#[stampede::cached]` function, for a stampede contender.
    pub fn stampede_name(self) -> Option<&'static str> {
        match self {
            Contender::StampedeLocal => Some("storm::local"),
            Contender::StampedeRedis => Some("storm::redis"),
            Contender::StampedeRedisCapped => Some("storm::redis_capped"),
            Contender::StampedeRedisTrusting => Some("storm::redis_trusting"),
            Contender::StampedeRefresh => Some("storm::refresh"),
            _ => None,
        }
    }

    /// Whether its instances talk to Redis.
    pub fn uses_redis(self) -> bool {
        matches!(
            self,
            Contender::CachedRedis
                | Contender::StampedeRedis
                | Contender::StampedeRedisCapped
                | Contender::StampedeRedisTrusting
                | Contender::StampedeRefresh
        )
    }

    /// Whether it serves a value it holds past its fresh time (`stale`, `refresh_after`): the
    /// contenders of the goal "no request waits for the database after the cold start".
    pub fn serves_ahead(self) -> bool {
        matches!(
            self,
            Contender::StampedeRedis
                | Contender::StampedeRedisCapped
                | Contender::StampedeRedisTrusting
                | Contender::StampedeRefresh
        )
    }
}

impl fmt::Display for Contender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Contender {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Contender::ALL
            .into_iter()
            .find(|contender| contender.name() == text)
            .ok_or_else(|| {
                let names: Vec<&str> = Contender::ALL.iter().map(|c| c.name()).collect();
                format!("unknown contender `{text}`; one of: {}", names.join(", "))
            })
    }
}

//! The product lookup of each contender, as its users would write it. Every one caches for 10 s
//! (`plan::TTL`) with no jitter, holds up to 100,000 entries (room for every product, so no
//! eviction is measured), and loads through [`Db::product`].

use std::sync::{Arc, LazyLock, OnceLock};

use cached::AsyncRedisCache;
use cached::macros::concurrent_cached;

use crate::contender::Contender;
use crate::plan::TTL;
use crate::product::Product;
use crate::schema::PRODUCTS;
use crate::service::db::Db;

/// The instance's database, set once at start.
static DB: OnceLock<Db> = OnceLock::new();

/// Sets the database every lookup queries.
pub fn install(db: Db) -> &'static Db {
    DB.get_or_init(|| db)
}

fn db() -> Result<&'static Db, LookupError> {
    DB.get()
        .ok_or_else(|| LookupError::Db("no database installed".to_owned()))
}

/// Why a lookup failed.
#[derive(Clone, Debug)]
pub enum LookupError {
    /// The query failed (no pool connection in time, a database error).
    Db(String),
    /// The cache failed (a timeout, its store unreachable).
    Cache(String),
}

impl std::fmt::Display for LookupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LookupError::Db(error) => write!(f, "database: {error}"),
            LookupError::Cache(error) => write!(f, "cache: {error}"),
        }
    }
}

impl std::error::Error for LookupError {}

impl From<stampede::Error> for LookupError {
    fn from(error: stampede::Error) -> Self {
        LookupError::Cache(error.to_string())
    }
}

async fn query(id: i32) -> Result<Option<Product>, LookupError> {
    db()?.product(id).await.map_err(LookupError::Db)
}

/// The product `id` through `contender`'s cache.
pub async fn product(contender: Contender, id: i32) -> Result<Option<Product>, LookupError> {
    match contender {
        Contender::NoCache => query(id).await,
        Contender::Moka => moka_product(id).await,
        Contender::CachedRedis => cached_redis_product(id).await,
        Contender::StampedeLocal => stampede_local(id).await,
        Contender::StampedeRedis => stampede_redis(id).await,
        Contender::StampedeRedisCapped => stampede_redis_capped(id).await,
        Contender::StampedeRedisTrusting => stampede_redis_trusting(id).await,
        Contender::StampedeRefresh => stampede_refresh(id).await,
    }
}

/// moka's future cache, one per instance; `try_get_with` coalesces concurrent misses of a key
/// (the first caller loads, inside its own task) and caches only `Ok`.
static MOKA: LazyLock<moka::future::Cache<i32, Option<Product>>> = LazyLock::new(|| {
    moka::future::Cache::builder()
        .max_capacity(PRODUCTS as u64)
        .time_to_live(TTL)
        .build()
});

async fn moka_product(id: i32) -> Result<Option<Product>, LookupError> {
    MOKA.try_get_with(id, query(id))
        .await
        .map_err(|error: Arc<LookupError>| (*error).clone())
}

/// The `cached` crate's Redis store, shared by the instances: every call reads Redis, a miss
/// runs the body and writes the value with the TTL. No coordination: every concurrent miss
/// loads. The reconnecting connection (`connection_manager`), so the store comes back after a
/// Redis restart.
#[concurrent_cached(
    map_error = r##"|e| LookupError::Cache(format!("{e:?}"))"##,
    ty = "cached::AsyncRedisCache<i32, Option<Product>>",
    create = r##" {
        AsyncRedisCache::builder("storm-cached")
            .ttl(TTL)
            .connection_manager(true)
            .build()
            .await
            .expect("the cached crate's Redis store (CACHED_REDIS_CONNECTION_STRING)")
    } "##
)]
async fn cached_redis_product(id: i32) -> Result<Option<Product>, LookupError> {
    query(id).await
}

/// One load per key per instance; no stale window, like moka.
#[stampede::cached(
    name = "storm::local",
    ttl = "10s",
    jitter = 0,
    lock = "local",
    capacity = 100_000,
    timeout = "5s"
)]
async fn stampede_local(id: i32) -> Result<Option<Product>, LookupError> {
    query(id).await
}

/// One load per key across the instances (the Redis lock), memory in front of Redis, stale
/// values served for a minute while one refresh runs, and the last good value for 5 minutes
/// when a load fails.
#[stampede::cached(
    name = "storm::redis",
    ttl = "10s",
    jitter = 0,
    stale = "60s",
    fail_safe = "5m",
    lock = "redis",
    capacity = 100_000,
    timeout = "5s"
)]
async fn stampede_redis(id: i32) -> Result<Option<Product>, LookupError> {
    query(id).await
}

/// As `stampede_redis`, with at most 8 loads at once per instance (its pool has 10
/// connections): a cold start's misses wait for a free load in the cache, not on the pool.
#[stampede::cached(
    name = "storm::redis_capped",
    ttl = "10s",
    jitter = 0,
    stale = "60s",
    fail_safe = "5m",
    lock = "redis",
    capacity = 100_000,
    timeout = "5s",
    max_loads = 8
)]
async fn stampede_redis_capped(id: i32) -> Result<Option<Product>, LookupError> {
    query(id).await
}

/// As `stampede_redis`, through the connection `trusting` ([`install_trusting`]): what an
/// instance loads while its invalidation feed is down is kept for the ttl, not the bound.
#[stampede::cached(
    name = "storm::redis_trusting",
    ttl = "10s",
    jitter = 0,
    stale = "60s",
    fail_safe = "5m",
    lock = "redis",
    redis = "trusting",
    capacity = 100_000,
    timeout = "5s"
)]
async fn stampede_redis_trusting(id: i32) -> Result<Option<Product>, LookupError> {
    query(id).await
}

/// The connection of [`stampede_redis_trusting()`]: the Redis of `STAMPEDE_REDIS_URL`, with
/// `trust_while_deaf` of the ttl.
pub fn install_trusting() -> Result<(), String> {
    let url = std::env::var(stampede::REDIS_URL_VAR)
        .map_err(|_| format!("{} is not set", stampede::REDIS_URL_VAR))?;
    stampede::RedisConfig::new(&url)
        .map_err(|error| error.to_string())?
        .trust_while_deaf(TTL)
        .install_as("trusting");
    Ok(())
}

/// As `stampede_redis` without the stale window: refresh-ahead instead, a hit past 5 s starts
/// one background refresh, so a key read steadily never expires.
#[stampede::cached(
    name = "storm::refresh",
    ttl = "10s",
    jitter = 0,
    refresh_after = "5s",
    lock = "redis",
    capacity = 100_000,
    timeout = "5s"
)]
async fn stampede_refresh(id: i32) -> Result<Option<Product>, LookupError> {
    query(id).await
}

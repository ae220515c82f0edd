//! Cache stampede protection for async Rust: one attribute, [`#[cached]`](cached), on the async
//! function that loads your data.
//!
//! A popular key expires, or an instance starts cold, and the hundreds of requests that arrive in
//! the next milliseconds all miss the cache at once and run the same query: a *cache stampede*.
//! `#[stampede::cached]` turns the function into a call on a runtime that guarantees, per key:
//!
//! - **one load at a time** (singleflight): the first miss starts the load, every other caller
//!   waits for its result. The load runs detached on the tokio runtime, so a caller that gives up
//!   (a dropped request) neither cancels it nor strands the others.
//! - **no waiting on expiry** (stale-while-revalidate): for `stale` after the fresh time, callers
//!   get the old value at once while exactly one refresh runs in the background.
//! - **spread expirations** (TTL jitter): keys filled together do not expire together.
//! - **bounded loads**: a `timeout` per attempt and a bounded number of `retries`, inside the one
//!   load, never one retry per waiter.
//!
//! With `lock = "redis"`, "one load" holds across every process that shares a Redis (see
//! [Redis](#redis)).
//!
//! # Example
//!
//! ```
//! use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
//! use std::time::Duration;
//!
//! static QUERIES: AtomicUsize = AtomicUsize::new(0);
//!
//! // Fresh for 60s, then served stale for up to 30s more while one refresh runs.
//! #[stampede::cached(ttl = "60s", stale = "30s", name = "product")]
//! async fn product(id: u64) -> String {
//!     QUERIES.fetch_add(1, SeqCst);
//!     tokio::time::sleep(Duration::from_millis(100)).await; // the slow query
//!     format!("product #{id}")
//! }
//!
//! #[tokio::main]
//! async fn main() {
//!     // 100 concurrent calls on a cold key: one query, every caller gets its result.
//!     let calls: Vec<_> = (0..100).map(|_| tokio::spawn(product(42))).collect();
//!     for call in calls {
//!         assert_eq!(call.await.unwrap(), "product #42");
//!     }
//!     assert_eq!(QUERIES.load(SeqCst), 1);
//!
//!     let stats = stampede::stats("product").unwrap();
//!     assert_eq!((stats.loads, stats.misses), (1, 100));
//! }
//! ```
//!
//! It needs `tokio` with the `macros`, `rt-multi-thread` and `time` features. Durations are
//! written as [humantime](https://docs.rs/humantime) strings: `"500ms"`, `"60s"`, `"5m"`. The
//! options (`ttl`, `stale`, `jitter`, `timeout`, `retries`, `lock`, `key`, `name`, ...) are listed
//! on [`cached`].
//!
//! # Names
//!
//! Every cache has a name: the `name = "..."` option when given, otherwise
//! `module_path!()::function` for a free function (`my_app::catalog::product`, starting with the
//! name of the crate that defines it), `path::Type::method` for a method of an inherent impl
//! (`my_app::repo::Users::get_user`) and `<path::Type as path::Trait>::method` for a method of a
//! trait impl. The name is what [`stats`], [`invalidate`], the metrics'
//! `cache` label and the Redis keys use. Give one explicitly when code outside the function looks
//! the cache up, so that moving the function or renaming the crate does not change it.
//!
//! # Errors
//!
//! Return `Result<T, E>` to receive failures as values: only `Ok` is cached, and `E` must
//! implement `From<`[`Error`]`>`, through which callers receive what the cache itself can fail
//! with (a load that timed out or panicked, ...). The function's own error comes back as itself:
//! to the only caller of a load, whatever `E` is (moved out); to every caller of a load that
//! several callers shared, as a clone when `E: Clone`, and otherwise as
//! `E::from(Error::Upstream(..))`, from which [`Error::upstream::<E>()`](Error::upstream) hands
//! back the original. For "not found", return `Result<Option<T>, E>`: `None` is cached like any
//! value, so a client asking again and again for a missing id costs one query per `ttl`, and
//! errors stay for failures, which are never cached.
//!
//! An error type that is not `Clone` (it holds a driver's error) needs nothing more than a
//! variant for the cache:
//!
//! ```
//! #[derive(Debug)]
//! enum RepoError {
//!     NotFound(u64),
//!     Io(std::io::Error), // not `Clone`, like most drivers' errors
//!     Cache(stampede::Error),
//! }
//!
//! impl std::fmt::Display for RepoError {
//!     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
//!         match self {
//!             RepoError::NotFound(id) => write!(f, "no user {id}"),
//!             RepoError::Io(error) => write!(f, "database: {error}"),
//!             RepoError::Cache(error) => write!(f, "cache: {error}"),
//!         }
//!     }
//! }
//!
//! impl From<stampede::Error> for RepoError {
//!     fn from(error: stampede::Error) -> Self {
//!         RepoError::Cache(error)
//!     }
//! }
//!
//! #[stampede::cached(ttl = "60s", timeout = "500ms", name = "user_email")]
//! async fn user_email(id: u64) -> Result<Option<String>, RepoError> {
//!     match id {
//!         0 => Err(RepoError::Io(std::io::Error::other("connection refused"))),
//!         1..=100 => Ok(Some(format!("user{id}@example.com"))),
//!         999 => Err(RepoError::NotFound(id)),
//!         _ => Ok(None), // not found: cached too
//!     }
//! }
//!
//! /// What a handler answers: a failure shared by several callers keeps the original inside.
//! fn status(error: &RepoError) -> u16 {
//!     match error {
//!         RepoError::NotFound(_) => 404,
//!         RepoError::Cache(cache) => match cache.upstream::<RepoError>() {
//!             Some(RepoError::NotFound(_)) => 404,
//!             _ => 503,
//!         },
//!         RepoError::Io(_) => 500,
//!     }
//! }
//!
//! #[tokio::main]
//! async fn main() {
//!     assert_eq!(user_email(7).await.unwrap().as_deref(), Some("user7@example.com"));
//!     assert_eq!(user_email(404).await.unwrap(), None);
//!     assert!(matches!(user_email(0).await, Err(RepoError::Io(_))));
//!     assert_eq!(status(&user_email(999).await.unwrap_err()), 404);
//! }
//! ```
//!
//! A function that returns a plain `T` has no way to report a failure: if its load panics or
//! times out, every caller waiting for it panics with the error's message.
//!
//! # Invalidation
//!
//! Next to each cached free function, `#[cached]` puts a type of the same name, its
//! *companion*, whose functions act on the function's cache with the key's arguments as the
//! function takes them: `price::invalidate(sku, region)`, `refresh`, `prime`, `peek` and
//! `uncached`. A wrong key type is a compile error, and they work in a process that never called
//! the function. A method gets them with `companion = true`, as associated functions named
//! after it (`Repo::count_invalidate(shop)`); in a trait impl, [`macro@companions`] on the impl
//! emits them in an inherent impl of the type. A load of a key that was running when it was invalidated is detached: it answers
//! the callers already waiting for it, stores nothing, and the next call starts a new load.
//!
//! `tags = [..]` tags each entry with templates rendered from its key, and [`invalidate_tag`]
//! drops every entry with a tag, of every function. [`invalidate`]`(name, key)` is the form for
//! tools that only know names: the key is the tuple of the function's key arguments, owned (a
//! `&str` argument is a `String`) and of the exact types of the signature (`42u64`, not `42`).
//!
//! ```
//! #[stampede::cached(ttl = "60s", name = "price", tags = ["sku:{sku}"])]
//! async fn price(sku: &str, region: u16) -> String {
//!     format!("{sku} in region {region}: 100") // the query
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), stampede::Error> {
//!     price("A-1", 33).await;
//!     price::invalidate("A-1", 33).await?; // typed
//!     stampede::invalidate_tag("sku:A-1").await?; // every entry tagged so
//!     stampede::invalidate("price", ("A-1".to_owned(), 33u16)).await?; // by name
//!     assert_eq!(price::peek("A-1", 33), None);
//!     Ok(())
//! }
//! ```
//!
//! [`invalidate`] fails with [`Error::InvalidConfig`] when no cache of that name has that key
//! type: neither one this process called, nor a non-generic free function linked into it.
//!
// Only with the `redis` feature, which the Redis example needs.
#![cfg_attr(
    feature = "redis",
    doc = r#"
# Redis

With `lock = "redis"`, one load runs per key across every process that shares a Redis; values
live in memory in front of Redis, so a hit costs no round trip. Tell stampede where the Redis
is once at start-up with [`RedisConfig`], or set the `STAMPEDE_REDIS_URL` environment variable
([`REDIS_URL_VAR`]). Values and key arguments stored in Redis must be serde types. When Redis
is down or slow, the cache falls back to this process's own singleflight: no request fails
because the cache is down.

```no_run
use std::time::Duration;

#[stampede::cached(ttl = "60s", stale = "30s", lock = "redis", name = "product")]
async fn product(id: u64) -> String {
    format!("product #{id}") // the query
}

#[tokio::main]
async fn main() -> Result<(), stampede::Error> {
    stampede::RedisConfig::new("redis://127.0.0.1:6379/")?
        .prefix("shop") // namespace of every key
        .op_timeout(Duration::from_millis(100)) // bound on each Redis call
        .install();
    println!("{}", product(42).await);
    // Drops the value in Redis and in every process's memory.
    stampede::invalidate("product", (42u64,)).await?;
    Ok(())
}
```

The Redis support is the `redis` cargo feature, on by default; with
`default-features = false`, a function that asks for Redis is a compile error naming the
feature. `rediss://` (TLS, with a CA and a client certificate of your own if needed:
`RedisConfig::tls_root_ca`, `RedisConfig::tls_client_cert`) is the `tls` feature.

"#
)]
//! # Observability
//!
//! Counters, gauges and histograms go through the [`metrics`](https://docs.rs/metrics) facade
//! (install any exporter before the first cached call), spans through
//! [`tracing`](https://docs.rs/tracing), and [`stats`] and [`caches`] are snapshots for tests and
//! debug pages.
//!
//! # More
//!
//! The [README](https://github.com/stampede-rs/stampede#readme) covers what `#[cached]` can be
//! put on, its compile errors, the Redis protocol and keys, the metrics, and benchmarks against
//! moka and the `cached` crate; `examples/` in the repository has a repository over SQLite, an
//! HTTP service and several processes sharing one Redis.

#![deny(missing_docs)]
// docs.rs (`--cfg docsrs`, see Cargo.toml) marks each item with the features it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub use stampede_macros::{cached, companions};
pub use stampede_runtime::{
    Backend, CacheInfo, Config, Error, HotKey, Identity, LoadError, Lock, MAX_REFRESHES_VAR, Stats,
    UpstreamError, caches, invalidate, invalidate_tag, set_max_refreshes, stats,
};
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use stampede_runtime::{Busy, REDIS_URL_VAR, RedisConfig, require_redis};

/// What the code generated by `#[cached]` calls. Not a public API: it changes without notice.
#[doc(hidden)]
pub mod __private {
    pub use stampede_runtime::__private::*;
}

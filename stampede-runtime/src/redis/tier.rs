//! The Redis tier of one cache ([`RedisTier`]): what the core asks of it, each answered through
//! the key's [`Flow`](super::flow) or one script, and a local load when Redis cannot be used.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::config::Config;
use crate::error::Error;
use crate::kv::{Key, Value};
use crate::load::Load;
use crate::redis::Busy;
use crate::redis::config::{self, lookup};
use crate::redis::dirty::Dirty;
use crate::redis::endpoint::Endpoint;
use crate::redis::envelope::{self, Decoded};
use crate::redis::flow::Flow;
use crate::redis::keys::{self, RedisKeys};
use crate::redis::shape::{self, Shape, Untraceable};
use crate::redis::telemetry::RedisTelemetry;
use crate::redis::{invalidate, tags};
use crate::stats::{Identity, Stats};
use crate::tier::{Batch, BatchLoad, Direct, Fetched, Handle, Shared, Tier};

/// Where a key lives in Redis: the endpoint, and the key's Redis keys.
type Route = (Arc<Endpoint>, RedisKeys);

/// The Redis tier of one cache: keys written by serde as readable text, values in the
/// `payload` form.
pub struct RedisTier<K, V> {
    /// What names the cache in its Redis keys (see `keys::identity`).
    pub(super) identity: String,
    /// The same, as `caches()` and the stats show it.
    shown: Identity,
    /// Why the cache shares nothing through Redis (see [`Identity::problem`]).
    unshared: Option<Arc<str>>,
    /// The connection's name (`None`: the default connection), looked up at each fill so that
    /// a connection installed after the cache was built is used.
    pub(super) connection: Option<Arc<str>>,
    pub(super) busy: Busy,
    pub(super) telemetry: RedisTelemetry,
    _types: std::marker::PhantomData<fn(K) -> V>,
}

/// The tier of a cache whose values are shared through the Redis connection named
/// `connection` (`None`: the default one), with `busy` as its policy while another process
/// holds a key's lock.
pub fn redis<K, V>(
    connection: Option<&'static str>,
    busy: Busy,
) -> impl FnOnce(&Config) -> RedisTier<K, V>
where
    K: Key + Serialize + DeserializeOwned,
    V: Value + Serialize + DeserializeOwned,
{
    move |config| {
        let (identity, shown) = identity(config, shape::trace::<K>(), shape::trace::<V>());
        RedisTier {
            identity,
            unshared: shown.problem.clone(),
            shown,
            connection: connection.map(Arc::from),
            busy,
            telemetry: RedisTelemetry::new(config),
            _types: std::marker::PhantomData,
        }
    }
}

/// The cache's identity in Redis (the part of its keys that names it, and what `caches()`
/// shows): its name, then a digest of its version, key template and the traced shapes of its
/// key and value types. Computed once, when the cache is built.
///
/// A shape that cannot be traced is stood for by the `version`; without one, the cache shares
/// nothing (it loads locally) and says so at error level, naming the type and the fix. Two
/// caches of this process given one name with different shapes, templates or versions get
/// different identities, so they share nothing; the first such pair is reported, since it is
/// almost always a copied `name = "..."`.
fn identity(
    config: &Config,
    key: Result<Shape, Untraceable>,
    value: Result<Shape, Untraceable>,
) -> (String, Identity) {
    static SEEN: Mutex<Vec<(Arc<str>, String)>> = Mutex::new(Vec::new());
    let describe = |traced: &Result<Shape, Untraceable>| match traced {
        Ok(shape) => shape.description.clone(),
        Err(untraceable) => format!("untraceable: {}", untraceable.reason),
    };
    let (key_shape, value_shape) = (describe(&key), describe(&value));
    let problem = match (&config.version, key.as_ref().err().or(value.as_ref().err())) {
        (None, Some(untraceable)) => Some(Arc::from(untraceable.to_string())),
        _ => None,
    };
    let version = config.version.as_deref().map(|v| format!("v={v}"));
    let traced = |traced: &Result<Shape, Untraceable>, shown: &str| match traced {
        Ok(_) => shown.to_owned(),
        Err(_) => "opaque".into(), // the version stands for it
    };
    let fingerprint = keys::fingerprint(&[
        version.as_deref().unwrap_or(""),
        config.key.as_deref().unwrap_or(""),
        &traced(&key, &key_shape),
        &traced(&value, &value_shape),
    ]);
    let identity = keys::identity(&config.name, &fingerprint);
    match &problem {
        Some(problem) => tracing::error!(
            cache = %config.name,
            "stampede: {problem}; until then this cache shares nothing through Redis (it loads \
             locally, and its companion's invalidate and prime fail)"
        ),
        None => tracing::debug!(
            cache = %config.name,
            version = config.version.as_deref().unwrap_or(""),
            fingerprint = %fingerprint,
            key_shape = %key_shape,
            value_shape = %value_shape,
            "stampede: the cache's identity in Redis is {identity}"
        ),
    }
    let mut seen = SEEN.lock().unwrap_or_else(PoisonError::into_inner);
    match seen.iter().find(|(name, _)| *name == config.name) {
        Some((_, other)) if *other != identity => tracing::error!(
            cache = %config.name,
            "stampede: two cached functions share this name with different key or value \
             shapes, key templates or versions; they share no values in Redis. Give each its \
             own `name`."
        ),
        Some(_) => {}
        None => seen.push((config.name.clone(), identity.clone())),
    }
    let shown = Identity {
        name: config.name.clone(),
        version: config.version.clone(),
        fingerprint: fingerprint.into(),
        key_shape: key_shape.into(),
        value_shape: value_shape.into(),
        problem,
    };
    (identity, shown)
}

impl<K, V> Tier<K, V> for RedisTier<K, V>
where
    K: Key + Serialize,
    V: Value + Serialize + DeserializeOwned,
{
    async fn fetch<L: Load<K, V>>(&self, handle: &Handle<'_, K, V, L>) -> Fetched<V> {
        let (endpoint, keys) = match self.route(handle) {
            Ok(route) => route,
            Err(endpoint) => return self.degraded(handle, endpoint.as_ref()).await,
        };
        // Changed here while Redis was down: what Redis holds is older. Dropped there first.
        if endpoint.dirty.contains(keys.base())
            && endpoint.dirty.clean(&endpoint, keys.base()).await.is_err()
        {
            return self.degraded(handle, Some(&endpoint)).await;
        }
        Dirty::clean_all(&endpoint);
        Flow::new(self, endpoint, keys, handle).run().await
    }

    /// The key's flow, as for a miss: the core marks the value held as the one replaced and
    /// serves no stale value, so the refresh loads the key (under the lock with
    /// `lock = "redis"`), or waits for another process's load, begun since, that holds it.
    async fn refresh<L: Load<K, V>>(&self, handle: &Handle<'_, K, V, L>) -> Fetched<V> {
        self.fetch(handle).await
    }

    async fn prime<L: Load<K, V>>(
        &self,
        handle: &Handle<'_, K, V, L>,
        value: V,
    ) -> Result<(), Error> {
        self.prime_value(handle, value).await
    }

    async fn invalidate(&self, config: &Config, key: &K) -> Result<bool, Error> {
        self.shared()?;
        let Some(endpoint) = lookup(self.connection.as_deref()) else {
            // The local copy is gone, but no other process heard of it: an admin tool that
            // forgot its RedisConfig must not be told it invalidated the fleet's copies.
            let what = format!(
                ", so the invalidation of cache `{}` reached no other process",
                config.name
            );
            return Err(super::not_configured(self.connection.as_deref(), &what));
        };
        let args =
            keys::args_text(key).map_err(|error| Error::invalid_config(error.to_string()))?;
        let keys = self.keys(&endpoint, &args);
        let message = invalidate::message(&config.name, &args);
        endpoint
            .invalidate(&keys, Some(&message))
            .await
            .map_err(|failure| {
                // Done as soon as Redis answers again (a task tries until it does), and before
                // this process reads the key there.
                Dirty::mark_and_clean(&endpoint, &keys, message);
                Error::RedisUnavailable {
                    cache: config.name.clone(),
                    message: failure.to_string().into(),
                }
            })
    }

    /// The keys of a batch through Redis in a few round trips for all of them (see `batch`).
    async fn fetch_many<L: BatchLoad<K, V>>(&self, batch: &Batch<'_, K, V, L>) {
        self.fetch_batch(batch).await
    }

    /// One round trip for every key, without a lock (see `batch`).
    async fn read_many(&self, directs: &[Direct<'_, K, V>]) -> Vec<Option<Shared<V>>> {
        self.read_batch(directs).await
    }

    fn reads(&self) -> bool {
        true
    }

    /// While the feed is not known to be live, or Redis cannot be used: the staleness bound.
    fn trusted_for(&self) -> Option<Duration> {
        let endpoint = lookup(self.connection.as_deref())?;
        match endpoint.usable() {
            true => endpoint.memory_trusted_for(),
            false => endpoint.local_trusted_for(),
        }
    }

    /// One round trip, without a lock: the entry if Redis holds a fresh one that decodes;
    /// `None` for anything else (nothing there, stale, undecodable, Redis unusable or failing),
    /// which the key's flight then handles with the whole protocol.
    async fn read(&self, direct: &Direct<'_, K, V>) -> Option<Shared<V>> {
        self.shared().ok()?;
        let endpoint = lookup(self.connection.as_deref()).filter(|e| e.usable())?;
        let args = keys::args_text(direct.key()).ok()?;
        let value_key = RedisKeys::value_key(&endpoint.config.prefix, &self.identity, &args);
        if endpoint.dirty.contains(RedisKeys::base_of(&value_key)) {
            return None; // the flight drops what Redis holds first
        }
        let (value, now_ms) = endpoint.read_fresh(&value_key).await.ok()??;
        let most = endpoint.config.max_value_bytes;
        let Decoded::Servable(entry) = envelope::decoded(Some(&value), Some(now_ms), most) else {
            return None;
        };
        Some(Shared::new(entry, endpoint.memory_trusted_for()))
    }

    fn key_name(&self) -> Option<fn(&K) -> Option<String>> {
        self.shared().ok()?;
        Some(|key| keys::args_text(key).ok())
    }

    fn shared_through(&self) -> Option<&str> {
        Some(self.connection.as_deref().unwrap_or(config::DEFAULT))
    }

    fn tagged(&self) {
        tags::used_by_tags(self.connection.clone());
    }

    fn identity(&self) -> Option<Identity> {
        Some(self.shown.clone())
    }

    fn add_stats(&self, stats: &mut Stats) {
        self.telemetry.add_to(stats);
        stats.identity = self.identity();
    }
}

impl<K, V> RedisTier<K, V>
where
    K: Key + Serialize,
    V: Value + Serialize + DeserializeOwned,
{
    /// `Ok` when the cache shares through Redis; else the error that says why not.
    pub(super) fn shared(&self) -> Result<(), Error> {
        match &self.unshared {
            None => Ok(()),
            Some(problem) => Err(Error::invalid_config(problem.to_string())),
        }
    }

    /// The endpoint and Redis keys of a flight's key, or (when Redis cannot be used: not
    /// configured, cooling down, a key that cannot be written) the endpoint if there is one.
    fn route<L: Load<K, V>>(
        &self,
        handle: &Handle<'_, K, V, L>,
    ) -> Result<Route, Option<Arc<Endpoint>>> {
        let config = handle.config();
        if self.unshared.is_some() {
            return Err(None);
        }
        let Some(endpoint) = lookup(self.connection.as_deref()) else {
            self.warn_unconfigured(config);
            return Err(None);
        };
        if !endpoint.usable() {
            return Err(Some(endpoint));
        }
        match keys::args_text(handle.key()) {
            Ok(args) => {
                let keys = self.keys(&endpoint, &args);
                Ok((endpoint, keys))
            }
            Err(error) => {
                tracing::warn!(cache = %config.name, %error, "stampede: key cannot be written for Redis; loading locally");
                Err(Some(endpoint))
            }
        }
    }

    /// The Redis keys of `args` in this cache, on `endpoint`.
    pub(super) fn keys(&self, endpoint: &Endpoint, args: &str) -> RedisKeys {
        RedisKeys::new(
            &endpoint.config.prefix,
            endpoint.config.db(),
            &self.identity,
            args,
        )
    }

    /// Loads the key here, without Redis. Kept in memory no longer than memory is trusted: an
    /// invalidation another process makes meanwhile cannot reach this value through Redis.
    pub(super) async fn degraded<L: Load<K, V>>(
        &self,
        handle: &Handle<'_, K, V, L>,
        endpoint: Option<&Arc<Endpoint>>,
    ) -> Fetched<V> {
        self.telemetry.degraded.bump();
        tracing::Span::current().record("outcome", "degraded");
        let trusted_for = endpoint.and_then(|endpoint| endpoint.local_trusted_for());
        let fetched = handle.load_here(trusted_for).await;
        if let (Fetched::Loaded(_), Some(endpoint)) = (&fetched, endpoint) {
            self.changed_while_down(endpoint, handle.key(), handle.config());
        }
        fetched
    }

    /// This process serves a value of `key` that Redis does not have (loaded or primed while
    /// Redis failed): Redis drops its own once it answers again (see `dirty`).
    pub(super) fn changed_while_down(&self, endpoint: &Arc<Endpoint>, key: &K, config: &Config) {
        if let Ok(args) = keys::args_text(key) {
            let message = invalidate::message(&config.name, &args);
            Dirty::mark_and_clean(endpoint, &self.keys(endpoint, &args), message);
        }
    }

    /// A loaded value that cannot be written to Redis (over `max_value_size`, or its
    /// serializer failed): kept in this process's memory only, as long as a value read from or
    /// written to Redis now (its own deadlines while the feed is live, which still brings
    /// other processes' invalidations). Redis did not fail: nothing is to be cleaned up there,
    /// and the connection's health is untouched.
    pub(super) fn unencodable<L: Load<K, V>>(
        &self,
        endpoint: &Endpoint,
        handle: &Handle<'_, K, V, L>,
        value: V,
        error: &dyn std::fmt::Display,
    ) -> V {
        tracing::warn!(cache = %handle.config().name, %error, "stampede: value cannot be encoded for Redis; kept in memory only");
        handle.keep_loaded(value, endpoint.memory_trusted_for())
    }

    pub(super) fn warn_unconfigured(&self, config: &Config) {
        if self.telemetry.degraded.get() == 0 {
            tracing::warn!(
                cache = %config.name,
                redis = self.connection.as_deref().unwrap_or("default"),
                "stampede: this cache is backed by Redis, but no Redis is configured \
                 (RedisConfig::install, or the STAMPEDE_REDIS_URL variable); it runs on local singleflight"
            );
        }
    }

    /// Writes a value to Redis as if it had been loaded now (a companion's `prime`), and keeps
    /// it in memory. The write takes a new fence, so that a load that read the key before
    /// cannot write its value over it. When Redis cannot be reached the value is kept here only
    /// (no longer than memory is trusted), and the error returned.
    async fn prime_value<L: Load<K, V>>(
        &self,
        handle: &Handle<'_, K, V, L>,
        value: V,
    ) -> Result<(), Error> {
        let config = handle.config();
        if let Err(error) = self.shared() {
            handle.keep_loaded(value, None); // nothing shared
            return Err(error);
        }
        let Some(endpoint) = lookup(self.connection.as_deref()) else {
            handle.keep_loaded(value, None); // nothing shared
            let what = format!(
                ", so cache `{}` kept the primed value in this process only",
                config.name
            );
            return Err(super::not_configured(self.connection.as_deref(), &what));
        };
        let args = keys::args_text(handle.key())
            .map_err(|error| Error::invalid_config(error.to_string()))?;
        let payload =
            envelope::encode(&value, endpoint.config.max_value_bytes).map_err(|error| {
                Error::invalid_config(format!(
                    "cache `{}`: the value cannot be stored in Redis: {error}",
                    config.name
                ))
            })?;
        let keys = self.keys(&endpoint, &args);
        let unavailable = |message: String| Error::RedisUnavailable {
            cache: config.name.clone(),
            message: message.into(),
        };
        let flow = Flow::new(self, endpoint.clone(), keys, handle);
        let primed = flow.prime(value, &payload).await;
        if primed.is_err() {
            self.changed_while_down(&endpoint, handle.key(), config);
        }
        primed.map_err(unavailable)
    }
}

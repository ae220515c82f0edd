//! The Redis tier of one cache ([`RedisTier`]): its identity and connection, and what the
//! protocol's steps share (a key's Redis keys, a load here when Redis cannot be used, the keys
//! changed meanwhile). What the core asks of it is answered in `calls`.

use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::config::Config;
use crate::error::Error;
use crate::kv::{Key, Value};
use crate::load::{Load, Loaded};
use crate::memory::Invalidation;
use crate::redis::Busy;
use crate::redis::codec::keys::{self, RedisKeys};
use crate::redis::codec::shape::{self, Shape, Untraceable};
use crate::redis::protocol::shapes::Registration;
use crate::redis::protocol::tags::set_lifetime;
use crate::redis::transport::dirty::Change;
use crate::redis::transport::endpoint::Endpoint;
use crate::redis::transport::feed;
use crate::redis::transport::telemetry::RedisTelemetry;
use crate::stats::Identity;
use crate::tier::Handle;

/// The Redis tier of one cache: keys written by serde as readable text, values in the
/// `payload` form.
pub struct RedisTier<K, V> {
    /// What names the cache in its Redis keys (see `keys::identity`).
    pub(in crate::redis) identity: String,
    /// The same, as `caches()` and the stats show it.
    pub(in crate::redis) shown: Identity,
    /// Why the cache shares nothing through Redis (see [`Identity::problem`]).
    pub(in crate::redis) unshared: Option<Arc<str>>,
    /// The connection's name (`None`: the default connection), looked up at each fill so that
    /// a connection installed after the cache was built is used.
    pub(in crate::redis) connection: Option<Arc<str>>,
    pub(in crate::redis) busy: Busy,
    pub(in crate::redis) telemetry: RedisTelemetry,
    /// Its identity's registration under its name (see `shapes`).
    pub(in crate::redis) registration: Registration,
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
            registration: Registration::default(),
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
/// caches given one name with different shapes, templates or versions get different
/// identities, so they share nothing. (Two of one process are reported when the registry lists
/// the second: almost always a copied `name = "..."`.)
fn identity(
    config: &Config,
    key: Result<Shape, Untraceable>,
    value: Result<Shape, Untraceable>,
) -> (String, Identity) {
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

impl<K, V> RedisTier<K, V>
where
    K: Key + Serialize,
    V: Value + Serialize + DeserializeOwned,
{
    /// `Ok` when the cache shares through Redis; else the error that says why not.
    pub(in crate::redis) fn shared(&self) -> Result<(), Error> {
        match &self.unshared {
            None => Ok(()),
            Some(problem) => Err(Error::invalid_config(problem.to_string())),
        }
    }

    /// Registers the cache's identity under its name on `endpoint` before its loads write
    /// there (when the last registration is half gone), so that another shape's invalidation
    /// of a key reaches this one's value (see `shapes`), for as long as a value written with
    /// `config` (the options now) may live.
    pub(in crate::redis) async fn register(&self, endpoint: &Endpoint, config: &Config) {
        let lifetime = set_lifetime(config, endpoint.config.lease);
        endpoint
            .register_shape(&self.registration, &config.name, &self.identity, lifetime)
            .await;
    }

    /// The Redis keys of `args` in this cache, on `endpoint`.
    pub(in crate::redis) fn keys(&self, endpoint: &Endpoint, args: &str) -> RedisKeys {
        RedisKeys::new(
            &endpoint.config.prefix,
            endpoint.config.db(),
            &self.identity,
            args,
        )
    }

    /// This process serves a value of `key` that Redis does not have (loaded or primed while
    /// Redis failed): Redis drops its own once it answers again (see `dirty`).
    pub(in crate::redis) fn changed_while_down(
        &self,
        endpoint: &Arc<Endpoint>,
        key: &K,
        config: &Config,
    ) {
        if let Ok(args) = keys::args_text(key) {
            let message = feed::message(&config.name, &args, Invalidation::Drop);
            endpoint.mark_and_clean(&self.keys(endpoint, &args), message, Change::Stored);
        }
    }

    /// A loaded value that cannot be written to Redis (over `max_value_size`, or its
    /// serializer failed): kept in this process's memory only, as long as a value read from or
    /// written to Redis now (its own deadlines while the feed is live, which still brings
    /// other processes' invalidations). Redis did not fail: nothing is to be cleaned up there,
    /// and the connection's health is untouched.
    pub(in crate::redis) fn unencodable<L: Load<K, V>>(
        &self,
        endpoint: &Endpoint,
        handle: &Handle<'_, K, V, L>,
        loaded: Loaded<V>,
        error: &dyn std::fmt::Display,
    ) -> V {
        tracing::warn!(cache = %handle.config().name, %error, "stampede: value cannot be encoded for Redis; kept in memory only");
        handle.keep_loaded(loaded, endpoint.trusted_for())
    }

    pub(in crate::redis) fn warn_unconfigured(&self, config: &Config) {
        if self.telemetry.degraded.get() == 0 {
            tracing::warn!(
                cache = %config.name,
                redis = self.connection.as_deref().unwrap_or("default"),
                "stampede: this cache is backed by Redis, but no Redis is configured \
                 (RedisConfig::install, or the STAMPEDE_REDIS_URL variable); it runs on local singleflight"
            );
        }
    }
}

//! What the core asks of the Redis tier (`Tier` for [`RedisTier`]): each call answered through
//! the protocol's flow (`flow`: a batch, or a key's flight as a group of one) or one script,
//! and a local load when Redis cannot be used.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::config::Config;
use crate::error::Error;
use crate::kv::{Key, Value};
use crate::load::{Load, Loaded};
use crate::memory::Invalidation;
use crate::redis::codec::envelope::{self, Decoded};
use crate::redis::codec::keys::{self, RedisKeys};
use crate::redis::protocol::flow;
use crate::redis::protocol::tags;
use crate::redis::protocol::tier::RedisTier;
use crate::redis::transport::dirty::Change;
use crate::redis::transport::endpoint::Endpoint;
use crate::redis::transport::feed;
use crate::redis::transport::installed::{self, lookup};
use crate::stats::{Identity, Stats};
use crate::tier::{Batch, BatchLoad, Direct, Fetched, Handle, Shared, Single, Tier};

impl<K, V> Tier<K, V> for RedisTier<K, V>
where
    K: Key + Serialize,
    V: Value + Serialize + DeserializeOwned,
{
    /// The key's flight through the protocol, as a group of one (see `flow`).
    async fn fetch<L: Load<K, V>>(&self, handle: &Handle<'_, K, V, L>) -> Fetched<V> {
        let single = Single::new(handle);
        self.fetch_group(&single).await;
        single.outcome()
    }

    async fn prime<L: Load<K, V>>(
        &self,
        handle: &Handle<'_, K, V, L>,
        value: V,
    ) -> Result<(), Error> {
        self.prime_value(handle, value).await
    }

    async fn invalidate(
        &self,
        config: &Config,
        name: &str,
        key: &K,
        how: Invalidation,
    ) -> Result<bool, Error> {
        let endpoint = self.reaching(config, "the invalidation")?;
        let args =
            keys::args_text(key).map_err(|error| Error::invalid_config(error.to_string()))?;
        let keys = self.keys(&endpoint, &args);
        let message = feed::message(name, &args, how);
        let expire = how == Invalidation::Expire;
        endpoint
            .invalidate_as(&keys, Some(&message), expire)
            .await
            .map_err(|failure| {
                // Done as soon as Redis answers again (a task tries until it does), and before
                // this process reads the key there; an expiry as an invalidation, which leaves
                // no value fresher than it would.
                let message = feed::message(name, &args, Invalidation::Drop);
                endpoint.mark_and_clean(&keys, message, Change::Invalidated);
                Error::RedisUnavailable {
                    cache: config.name.clone(),
                    message: failure.to_string().into(),
                }
            })
    }

    async fn clear(&self, config: &Config, name: &str) -> Result<(), Error> {
        let endpoint = self.reaching(config, "the clear")?;
        endpoint
            .clear(name, &feed::clear_message(name))
            .await
            .map(drop)
            .map_err(|failure| Error::RedisUnavailable {
                cache: config.name.clone(),
                message: failure.to_string().into(),
            })
    }

    /// The keys of a batch through Redis in a few round trips for all of them (see `flow`).
    async fn fetch_many<L: BatchLoad<K, V>>(&self, batch: &Batch<'_, K, V, L>) {
        self.fetch_group(batch).await
    }

    /// One round trip for every key, without a lock (see `flow`).
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
            true => endpoint.trusted_for(),
            false => endpoint.trusted_for_unshared(),
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
        Some(Shared::new(entry, endpoint.trusted_for()))
    }

    fn key_name(&self) -> Option<fn(&K) -> Option<String>> {
        self.shared().ok()?;
        Some(|key| keys::args_text(key).ok())
    }

    const SHARES: bool = true;

    fn shared_through(&self) -> Option<&str> {
        Some(self.connection.as_deref().unwrap_or(installed::DEFAULT))
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
    /// The endpoint through which `operation` (an invalidation, a clear) of the cache reaches
    /// the other processes: an error when the cache shares nothing, or when its connection is
    /// not configured here (this process's copy is gone, but no other process heard of it: an
    /// admin tool that forgot its RedisConfig must not be told it reached the fleet).
    fn reaching(&self, config: &Config, operation: &str) -> Result<Arc<Endpoint>, Error> {
        self.shared()?;
        lookup(self.connection.as_deref()).ok_or_else(|| {
            let what = format!(
                ", so {operation} of cache `{}` reached no other process",
                config.name
            );
            crate::redis::not_configured(self.connection.as_deref(), &what)
        })
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
            handle.keep_loaded(Loaded::now(value), None); // nothing shared
            return Err(error);
        }
        let Some(endpoint) = lookup(self.connection.as_deref()) else {
            handle.keep_loaded(Loaded::now(value), None); // nothing shared
            let what = format!(
                ", so cache `{}` kept the primed value in this process only",
                config.name
            );
            return Err(crate::redis::not_configured(
                self.connection.as_deref(),
                &what,
            ));
        };
        let args = keys::args_text(handle.key())
            .map_err(|error| Error::invalid_config(error.to_string()))?;
        let compress = handle.options().compress;
        let payload = envelope::encode(&value, endpoint.config.max_value_bytes, compress).map_err(
            |error| {
                Error::invalid_config(format!(
                    "cache `{}`: the value cannot be stored in Redis: {error}",
                    config.name
                ))
            },
        )?;
        let keys = self.keys(&endpoint, &args);
        let unavailable = |message: String| Error::RedisUnavailable {
            cache: config.name.clone(),
            message: message.into(),
        };
        self.register(&endpoint, &handle.options()).await;
        // The name's other shapes keep no older value to serve after this one.
        let primed = match endpoint
            .invalidate_other_shapes(&keys, &config.name, false)
            .await
        {
            Ok(_) => flow::prime(&endpoint, &keys, handle, value, &payload).await,
            Err(failure) => {
                handle.keep_loaded(Loaded::now(value), endpoint.trusted_for());
                Err(failure.to_string())
            }
        };
        if primed.is_err() {
            self.changed_while_down(&endpoint, handle.key(), config);
        }
        primed.map_err(unavailable)
    }
}

//! What a flight does for a key this process lacks, when the cache is backed by Redis. See the
//! module above for the protocol; this file is its state machine.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::cache::{Cache, Key, Serve, Value};
use crate::config::{Busy, Lock};
use crate::entry::{Entry, jittered_ttl};
use crate::error::{Error, LoadError};
use crate::redis::Codec;
use crate::redis::config::lookup;
use crate::redis::envelope::Envelope;
use crate::redis::invalidate;
use crate::redis::keys::RedisKeys;
use crate::redis::lock;
use crate::redis::tier::{Fill, ReadState, Tier};

/// Gets a key's value through Redis, or locally when Redis cannot be used.
pub(crate) async fn fill<K, V, E, L, Fut>(
    cache: &Cache<K, V>,
    codec: &Codec<K, V>,
    key: &K,
    load: &L,
    serve: Serve<'_, V>,
) -> Result<V, Error>
where
    K: Key,
    V: Value,
    E: LoadError,
    L: Fn(&K) -> Fut + Sync,
    Fut: Future<Output = Result<V, E>> + Send,
{
    let tier = match lookup(cache.config.redis.as_deref()) {
        Some(tier) if tier.usable() => tier,
        Some(_) => return degraded(cache, key, load).await,
        None => {
            warn_unconfigured(cache);
            return degraded(cache, key, load).await;
        }
    };
    let args = match (codec.args)(key) {
        Ok(args) => args,
        Err(error) => {
            tracing::warn!(cache = %cache.config.name, %error, "stampede: key cannot be written for Redis; loading locally");
            return degraded(cache, key, load).await;
        }
    };
    let flow = Flow {
        keys: RedisKeys::new(&tier.config.prefix, &cache.config.name, &args),
        tier,
        cache,
        codec,
        key,
        load,
        serve,
        generation: cache.generation(),
        stale: None,
        busy_since: None,
    };
    let span = tracing::debug_span!(
        "stampede.lock",
        cache = %cache.config.name,
        key = %flow.keys.value,
        outcome = tracing::field::Empty,
        wait_ms = tracing::field::Empty,
    );
    flow.run().instrument(span).await
}

/// Drops a key from Redis and announces it, so every process drops its copy.
pub(crate) async fn invalidate<K: Key, V: Value>(
    cache: &Cache<K, V>,
    codec: &Codec<K, V>,
    key: &K,
) -> Result<(), Error> {
    let Some(tier) = lookup(cache.config.redis.as_deref()) else {
        return Ok(()); // nothing shared: the local copy is gone already
    };
    let args = (codec.args)(key).map_err(|error| Error::invalid_config(error.to_string()))?;
    let keys = RedisKeys::new(&tier.config.prefix, &cache.config.name, &args);
    tier.invalidate(&keys, &invalidate::message(&cache.config.name, &args))
        .await
        .map_err(|failure| Error::RedisUnavailable {
            cache: cache.config.name.clone(),
            message: failure.to_string().into(),
        })
}

async fn degraded<K, V, E, L, Fut>(cache: &Cache<K, V>, key: &K, load: &L) -> Result<V, Error>
where
    K: Key,
    V: Value,
    E: LoadError,
    L: Fn(&K) -> Fut,
    Fut: Future<Output = Result<V, E>>,
{
    cache.telemetry.degraded.bump();
    tracing::Span::current().record("outcome", "degraded");
    cache.load_locally(key, load).await
}

fn warn_unconfigured<K, V>(cache: &Cache<K, V>) {
    if cache.telemetry.degraded.get() == 0 {
        tracing::warn!(
            cache = %cache.config.name,
            redis = cache.config.redis.as_deref().unwrap_or("default"),
            "stampede: this cache is backed by Redis, but no Redis is configured \
             (RedisConfig::install, or the STAMPEDE_REDIS_URL variable); it runs on local singleflight"
        );
    }
}

/// One key's way through the protocol.
struct Flow<'a, K, V, L> {
    cache: &'a Cache<K, V>,
    codec: &'a Codec<K, V>,
    tier: Arc<Tier>,
    keys: RedisKeys,
    key: &'a K,
    load: &'a L,
    serve: Serve<'a, V>,
    /// The cache's invalidation count when the flow began.
    generation: u64,
    /// The stale value already handed to the waiters, if any: served again if all else fails.
    stale: Option<V>,
    /// When another process's lock was first found, if it was.
    busy_since: Option<Instant>,
}

/// What a read found, on this process's clock.
enum Found<V> {
    Nothing,
    Usable(Entry<V>),
    /// Present but not an envelope this type decodes.
    Undecodable,
}

impl<K, V, E, L, Fut> Flow<'_, K, V, L>
where
    K: Key,
    V: Value,
    E: LoadError,
    L: Fn(&K) -> Fut + Sync,
    Fut: Future<Output = Result<V, E>> + Send,
{
    async fn run(mut self) -> Result<V, Error> {
        let outcome = self.steps().await;
        if let Some(since) = self.busy_since {
            let waited = since.elapsed();
            self.cache.telemetry.lock_waited(waited);
            tracing::Span::current().record("wait_ms", waited.as_millis() as u64);
        }
        match (outcome, self.stale.take()) {
            // Stale-if-error: the waiters keep the stale value they were served.
            (Err(_), Some(stale)) => Ok(stale),
            (outcome, _) => outcome,
        }
    }

    async fn steps(&mut self) -> Result<V, Error> {
        let token = match self.cache.config.lock {
            Lock::Redis => lock::token(),
            Lock::Local | Lock::None => String::new(),
        };
        let give_up_at = Instant::now() + self.tier.config.lock_wait;
        let mut value_unusable = false;
        let mut listener = None;
        loop {
            let Ok(read) = self
                .tier
                .read_or_lock(&self.keys, &token, value_unusable)
                .await
            else {
                return degraded(self.cache, self.key, self.load).await;
            };
            let current = match self.found(read.value.as_deref(), Some(read.now_ms)) {
                Found::Undecodable if !value_unusable => {
                    // Read again, asking for the lock as if the key were missing: the holder
                    // overwrites the bad bytes.
                    self.cache.telemetry.decode_errors.bump();
                    tracing::debug!(key = %self.keys.value, "stampede: value in Redis does not decode; reloading it");
                    value_unusable = true;
                    continue;
                }
                Found::Usable(entry) => Some(entry),
                Found::Nothing | Found::Undecodable => None,
            };
            match (read.state, current) {
                (ReadState::Fresh, Some(entry)) => {
                    self.record("fresh");
                    self.cache.telemetry.remote_hits.bump();
                    return Ok(self.keep(entry).await);
                }
                // Fresh by the server's clock but not servable by ours: load it.
                (ReadState::Fresh, None) => value_unusable = true,
                (ReadState::Locked, current) => {
                    self.record("acquired");
                    self.cache.telemetry.lock_acquired.bump();
                    self.serve_stale(current).await;
                    return self.hold(&token, read.generation).await;
                }
                (ReadState::NoLock, current) => {
                    self.record("unlocked");
                    self.serve_stale(current).await;
                    return self.hold("", read.generation).await;
                }
                (ReadState::Busy(lease_left), current) => {
                    if self.busy_since.is_none() {
                        // One failed attempt per flow, however many reads.
                        self.busy_since = Some(Instant::now());
                        self.cache.telemetry.lock_busy.bump();
                    }
                    self.serve_stale(current).await;
                    match self.cache.config.busy {
                        Busy::Compute => {
                            self.record("computed");
                            return self.hold("", read.generation).await;
                        }
                        Busy::Error if self.stale.is_none() => {
                            self.record("busy");
                            return Err(Error::LockBusy {
                                cache: self.cache.config.name.clone(),
                            });
                        }
                        Busy::Error | Busy::Wait => {}
                    }
                    let Some(waiting) = listener.as_mut() else {
                        // Subscribe, then read again: a fill published before the subscription
                        // took effect is in Redis by then.
                        match self.tier.listen(&self.keys).await {
                            Ok(subscribed) => listener = Some(subscribed),
                            Err(_) => return degraded(self.cache, self.key, self.load).await,
                        }
                        continue;
                    };
                    let now = Instant::now();
                    if now >= give_up_at {
                        // Waited as long as configured: load it here, without the lock.
                        self.record("gave up waiting");
                        return self.hold("", read.generation).await;
                    }
                    // Woken by the holder's publication, or when its lease would run out.
                    let wait = lease_left.min(give_up_at - now) + Duration::from_millis(1);
                    match tokio::time::timeout(wait, waiting.next()).await {
                        Ok(Some(payload)) => {
                            if let Found::Usable(entry) = self.found(Some(&payload), None) {
                                self.record("published");
                                self.cache.telemetry.remote_hits.bump();
                                return Ok(self.keep(entry).await);
                            }
                            // A release without a value (the holder's load failed): read again.
                        }
                        Ok(None) => listener = None, // the pub/sub connection died
                        Err(_lease_over) => {}
                    }
                }
            }
        }
    }

    /// Loads the key as the lock's holder (or without a lock, when `token` is empty), writes
    /// the value to Redis and publishes it.
    async fn hold(&self, token: &str, generation: u64) -> Result<V, Error> {
        let started = Instant::now();
        let attempts = self.cache.attempts(self.key, self.load);
        let loaded = if token.is_empty() {
            attempts.await
        } else {
            lock::while_held(&self.tier, &self.keys, token, attempts).await
        };
        let value = match loaded {
            Ok(value) => value,
            Err(error) => {
                if !token.is_empty() {
                    let _ = self.tier.release(&self.keys, token).await;
                }
                return Err(error);
            }
        };
        let config = &self.cache.config;
        let fresh = jittered_ttl(config.ttl, config.jitter);
        let filled = match (self.codec.encode)(&value) {
            Ok(payload) => {
                let fill = Fill {
                    token,
                    fresh,
                    stale: config.stale,
                    load: started.elapsed(),
                    generation,
                    payload: &payload,
                };
                self.tier.fill(&self.keys, fill).await.ok()
            }
            Err(error) => {
                tracing::warn!(cache = %config.name, %error, "stampede: value cannot be encoded for Redis; kept in memory only");
                if !token.is_empty() {
                    let _ = self.tier.release(&self.keys, token).await;
                }
                None
            }
        };
        let now = Instant::now();
        let entry = match filled {
            Some(filled) if filled.written => Entry::new(
                value.clone(),
                now,
                now + since(filled.fresh_until, filled.now_ms),
                now + since(filled.stale_until, filled.now_ms),
            ),
            // Invalidated while it loaded: the callers get it, nobody keeps it.
            Some(_) => return Ok(value),
            // Redis failed after the load: the value is good, keep it here.
            None => Entry::loaded(value.clone(), now, fresh, config.stale),
        };
        Ok(self.keep(entry).await)
    }

    fn record(&self, outcome: &'static str) {
        tracing::Span::current().record("outcome", outcome);
    }

    /// Hands a stale value to the waiters at once (they need not wait for the refresh) and
    /// keeps it in memory, once per flow.
    async fn serve_stale(&mut self, current: Option<Entry<V>>) {
        if let Some(entry) = current
            && self.stale.is_none()
        {
            (self.serve)(&entry.value);
            self.stale = Some(entry.value.clone());
            self.cache.remember(self.key, entry, self.generation).await;
        }
    }

    /// Keeps an entry in memory and returns its value.
    async fn keep(&self, entry: Entry<V>) -> V {
        let value = entry.value.clone();
        self.cache.remember(self.key, entry, self.generation).await;
        value
    }

    /// Reads an envelope. Deadlines are turned into this process's instants relative to
    /// `server_now` (the server's clock at the read) or, for a publication, to its writing.
    fn found(&self, bytes: Option<&[u8]>, server_now: Option<u64>) -> Found<V> {
        let Some(bytes) = bytes else {
            return Found::Nothing;
        };
        let Some(envelope) = Envelope::parse(bytes) else {
            return Found::Undecodable;
        };
        let Ok(value) = (self.codec.decode)(envelope.payload) else {
            return Found::Undecodable;
        };
        let reference = server_now.unwrap_or(envelope.written_at);
        let now = Instant::now();
        let entry = Entry::new(
            value,
            now.checked_sub(since(reference, envelope.written_at))
                .unwrap_or(now),
            now + since(envelope.fresh_until, reference),
            now + since(envelope.stale_until, reference),
        );
        if entry.servable(now) {
            Found::Usable(entry)
        } else {
            Found::Nothing
        }
    }
}

/// How long after `reference` (ms of the server's clock) `deadline` falls.
fn since(deadline: u64, reference: u64) -> Duration {
    Duration::from_millis(deadline.saturating_sub(reference))
}

//! What a flight does for a key this process lacks, when the cache is backed by Redis. See the
//! module above for the protocol; this file is its state machine.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::time::Instant;
use tracing::Instrument;

use crate::cache::{Key, Value};
use crate::clock::after;
use crate::config::{Config, Lock};
use crate::entry::{Entry, jittered_ttl};
use crate::error::Error;
use crate::load::Load;
use crate::redis::config::lookup;
use crate::redis::endpoint::Endpoint;
use crate::redis::envelope::{self, Envelope};
use crate::redis::keys::{self, RedisKeys};
use crate::redis::ops::{ReadState, Write, Written};
use crate::redis::tags::set_lifetime;
use crate::redis::{Busy, RedisTier, invalidate, lock};
use crate::tier::{Direct, Handle};

/// Gets a key's value through Redis, or locally when Redis cannot be used.
pub(crate) async fn fill<K, V, L>(
    tier: &RedisTier<K, V>,
    handle: &Handle<'_, K, V, L>,
) -> Result<V, Error>
where
    K: Key + Serialize,
    V: Value + Serialize + DeserializeOwned,
    L: Load<K, V>,
{
    let config = handle.config();
    let connection = match lookup(tier.connection.as_deref()) {
        Some(connection) if connection.usable() => connection,
        Some(_) => return degraded(tier, handle).await,
        None => {
            warn_unconfigured(tier, config);
            return degraded(tier, handle).await;
        }
    };
    let args = match keys::args_text(handle.key()) {
        Ok(args) => args,
        Err(error) => {
            tracing::warn!(cache = %config.name, %error, "stampede: key cannot be written for Redis; loading locally");
            return degraded(tier, handle).await;
        }
    };
    let keys = keys_of(tier, &connection, &args);
    let span = tracing::debug_span!(
        "stampede.lock",
        cache = %config.name,
        key = %keys.value,
        outcome = tracing::field::Empty,
        wait_ms = tracing::field::Empty,
    );
    let flow = Flow {
        keys,
        connection,
        tier,
        handle,
        stale: None,
        busy_since: None,
    };
    flow.run().instrument(span).await
}

/// Reads a key's value on the caller's task, in one round trip and without a lock: the value
/// if Redis holds a fresh one that decodes, kept through `direct`; `None` for anything else
/// (nothing there, stale, undecodable, Redis unusable or failing), which the key's flight then
/// handles with the whole protocol.
pub(crate) async fn read<K, V>(tier: &RedisTier<K, V>, direct: &Direct<'_, K, V>) -> Option<V>
where
    K: Key + Serialize,
    V: Value + Serialize + DeserializeOwned,
{
    let connection = lookup(tier.connection.as_deref()).filter(|c| c.usable())?;
    let args = keys::args_text(direct.key()).ok()?;
    let value_key = RedisKeys::value_key(&connection.config.prefix, &tier.identity, &args);
    let (value, now_ms) = connection.read_fresh(&value_key).await.ok()??;
    let Decoded::Servable(entry) = decode(Some(&value), Some(now_ms)) else {
        return None;
    };
    let value = direct.keep(trusted(&connection, entry))?;
    tier.telemetry.remote_hits.bump();
    Some(value)
}

/// `entry`, to be kept in memory no longer than this process's memory is trusted: while its
/// invalidation feed is not known to be live, the staleness bound (an invalidation missed
/// meanwhile cannot be outlived by more).
fn trusted<V>(connection: &Endpoint, entry: Entry<V>) -> Entry<V> {
    match connection.memory_trusted_for() {
        Some(bound) => entry.capped(after(Instant::now(), bound)),
        None => entry,
    }
}

/// The Redis keys of `args` in the cache of `tier`, on `connection`.
fn keys_of<K, V>(tier: &RedisTier<K, V>, connection: &Endpoint, args: &str) -> RedisKeys {
    RedisKeys::new(&connection.config.prefix, &tier.identity, args)
}

/// Drops a key from Redis and announces it, so every process drops its copy.
pub(crate) async fn invalidate<K, V>(
    tier: &RedisTier<K, V>,
    config: &Config,
    key: &K,
) -> Result<(), Error>
where
    K: Key + Serialize,
{
    let Some(connection) = lookup(tier.connection.as_deref()) else {
        return Ok(()); // nothing shared: the local copy is gone already
    };
    let args = keys::args_text(key).map_err(|error| Error::invalid_config(error.to_string()))?;
    let keys = keys_of(tier, &connection, &args);
    connection
        .invalidate(&keys, Some(&invalidate::message(&config.name, &args)))
        .await
        .map_err(|failure| Error::RedisUnavailable {
            cache: config.name.clone(),
            message: failure.to_string().into(),
        })
}

async fn degraded<K: Key, V: Value, L: Load<K, V>>(
    tier: &RedisTier<K, V>,
    handle: &Handle<'_, K, V, L>,
) -> Result<V, Error> {
    tier.telemetry.degraded.bump();
    tracing::Span::current().record("outcome", "degraded");
    handle.load_and_keep().await
}

fn warn_unconfigured<K, V>(tier: &RedisTier<K, V>, config: &Config) {
    if tier.telemetry.degraded.get() == 0 {
        tracing::warn!(
            cache = %config.name,
            redis = tier.connection.as_deref().unwrap_or("default"),
            "stampede: this cache is backed by Redis, but no Redis is configured \
             (RedisConfig::install, or the STAMPEDE_REDIS_URL variable); it runs on local singleflight"
        );
    }
}

/// One key's way through the protocol.
struct Flow<'a, K: Key, V: Value, L> {
    tier: &'a RedisTier<K, V>,
    connection: Arc<Endpoint>,
    keys: RedisKeys,
    handle: &'a Handle<'a, K, V, L>,
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

impl<K, V, L> Flow<'_, K, V, L>
where
    K: Key,
    V: Value + Serialize + DeserializeOwned,
    L: Load<K, V>,
{
    async fn run(mut self) -> Result<V, Error> {
        let outcome = self.steps().await;
        if let Some(since) = self.busy_since {
            let waited = since.elapsed();
            self.tier.telemetry.lock_waited(waited);
            tracing::Span::current().record("wait_ms", waited.as_millis() as u64);
        }
        match (outcome, self.stale.take()) {
            // Stale-if-error: the waiters keep the stale value they were served.
            (Err(_), Some(stale)) => Ok(stale),
            (outcome, _) => outcome,
        }
    }

    async fn steps(&mut self) -> Result<V, Error> {
        let config = self.handle.config();
        let token = match config.lock {
            Lock::Redis => Some(lock::token()),
            Lock::Local | Lock::None => None,
        };
        let give_up_at = after(Instant::now(), self.connection.config.lock_wait);
        let mut value_unusable = false;
        let mut listener = None;
        loop {
            let read = match self
                .connection
                .read_or_lock(&self.keys, token.as_deref(), value_unusable)
                .await
            {
                Ok(read) => read,
                Err(_) => {
                    // The script may have taken the lock before the answer was lost: give it
                    // back rather than make every other process wait out the lease.
                    if let Some(token) = &token {
                        lock::release_later(&self.connection, &self.keys, token);
                    }
                    return degraded(self.tier, self.handle).await;
                }
            };
            let current = match self.found(read.value.as_deref(), Some(read.now_ms)) {
                Found::Undecodable => {
                    if !value_unusable {
                        self.tier.telemetry.decode_errors.bump();
                        tracing::debug!(key = %self.keys.value, "stampede: value in Redis does not decode; reloading it");
                        value_unusable = true;
                    }
                    // A fresh header over bytes that do not decode: read again, asking for the
                    // lock as if the key were missing; the holder overwrites the bad bytes. In
                    // any other state this read's outcome (a lock taken) stands.
                    if read.state == ReadState::Fresh {
                        continue;
                    }
                    None
                }
                Found::Usable(entry) => Some(entry),
                Found::Nothing => None,
            };
            match (read.state, current) {
                // An early refresh finds the value it is refreshing: take the lock (one refresh
                // across processes). A value loaded after it is newer: keep that instead.
                (ReadState::Fresh, Some(entry))
                    if !value_unusable
                        && self.handle.refreshing().is_some_and(|old| {
                            entry.filled_at() <= old + Duration::from_millis(1)
                        }) =>
                {
                    value_unusable = true;
                }
                (ReadState::Fresh, Some(entry)) => {
                    self.record("fresh");
                    self.tier.telemetry.remote_hits.bump();
                    return Ok(self.keep(entry));
                }
                // Fresh by the server's clock but not servable by ours: load it.
                (ReadState::Fresh, None) => value_unusable = true,
                (ReadState::Locked, current) => {
                    self.record("acquired");
                    self.tier.telemetry.lock_acquired.bump();
                    self.serve_stale(current);
                    return self.hold(token.as_deref(), read.fence).await;
                }
                (ReadState::NoLock, current) => {
                    self.record("unlocked");
                    self.serve_stale(current);
                    return self.hold(None, read.fence).await;
                }
                (ReadState::Busy(lease_left), current) => {
                    if self.busy_since.is_none() {
                        // One failed attempt per flow, however many reads.
                        self.busy_since = Some(Instant::now());
                        self.tier.telemetry.lock_busy.bump();
                    }
                    self.serve_stale(current);
                    match self.tier.busy {
                        Busy::Compute => {
                            self.record("computed");
                            return self.hold(None, read.fence).await;
                        }
                        Busy::Error if self.stale.is_none() => {
                            self.record("busy");
                            return Err(Error::LockBusy {
                                cache: config.name.clone(),
                            });
                        }
                        Busy::Error | Busy::Wait => {}
                    }
                    let Some(waiting) = listener.as_mut() else {
                        // Subscribe, then read again: a fill published before the subscription
                        // took effect is in Redis by then.
                        match self.connection.listen(&self.keys).await {
                            Ok(subscribed) => listener = Some(subscribed),
                            Err(_) => return degraded(self.tier, self.handle).await,
                        }
                        continue;
                    };
                    let now = Instant::now();
                    if now >= give_up_at {
                        // Waited as long as configured: load it here, without the lock.
                        self.record("gave up waiting");
                        return self.hold(None, read.fence).await;
                    }
                    // Woken by the holder's publication, or when its lease would run out.
                    let wait = lease_left.min(give_up_at - now) + Duration::from_millis(1);
                    match tokio::time::timeout(wait, waiting.next()).await {
                        Ok(Some(payload)) => {
                            if let Found::Usable(entry) = self.found(Some(&payload), None) {
                                self.record("published");
                                self.tier.telemetry.remote_hits.bump();
                                return Ok(self.keep(entry));
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

    /// Loads the key as the lock's holder (or without a lock), writes the value to Redis and
    /// publishes it. The lock is released on every path, a panicking load's included.
    async fn hold(&self, token: Option<&str>, fence: u64) -> Result<V, Error> {
        let config = self.handle.config();
        let held = token.map(|token| lock::Held::new(&self.connection, &self.keys, token));
        if !self.tag().await {
            // Its value could not be found by its tags' invalidation: keep it out of Redis.
            if let Some(held) = held {
                held.release().await;
            }
            return degraded(self.tier, self.handle).await;
        }
        let started = Instant::now();
        let loaded = match &held {
            Some(held) => held.while_held(self.handle.load()).await,
            None => self.handle.load().await,
        };
        let value = match loaded {
            Ok(value) => value,
            Err(error) => {
                if let Some(held) = held {
                    held.release().await;
                }
                return Err(error);
            }
        };
        let fresh = jittered_ttl(config.ttl, config.jitter);
        let filled = match envelope::encode(&value) {
            Ok(payload) => {
                let fill = write_of(config, token.unwrap_or(""), fence, fresh, &payload)
                    .loaded_in(started.elapsed());
                let filled = self.connection.write(&self.keys, fill).await.ok();
                // FILL released the lock if it ran; if it did not, the release is tried once.
                if let Some(held) = held {
                    match filled {
                        Some(_) => held.released(),
                        None => held.release().await,
                    }
                }
                filled
            }
            Err(error) => {
                tracing::warn!(cache = %config.name, %error, "stampede: value cannot be encoded for Redis; kept in memory only");
                if let Some(held) = held {
                    held.release().await;
                }
                None
            }
        };
        let now = Instant::now();
        let entry = match filled {
            Some(filled) if filled.written => written(value.clone(), &filled),
            // Invalidated while it loaded, or fenced off by a newer holder: the callers get it,
            // nobody keeps it.
            Some(_) => return Ok(value),
            // Redis failed after the load: the value is good, keep it here.
            None => Entry::loaded(value.clone(), now, fresh, config.stale),
        };
        Ok(self.keep(entry))
    }

    /// Keeps an entry in memory, no longer than memory is trusted ([`trusted`]), and returns
    /// its value.
    fn keep(&self, entry: Entry<V>) -> V {
        self.handle.keep(trusted(&self.connection, entry))
    }

    /// Adds the key to its tags' sets before its load reads the source (see `tags`); `true`
    /// when done or untagged.
    async fn tag(&self) -> bool {
        let tags = self.handle.tags();
        if tags.is_empty() {
            return true;
        }
        let lifetime = set_lifetime(self.handle.config(), self.connection.config.lease);
        self.connection
            .tag(&self.keys, tags, lifetime)
            .await
            .is_ok()
    }

    fn record(&self, outcome: &'static str) {
        tracing::Span::current().record("outcome", outcome);
    }

    /// Hands a stale value to the waiters at once (they need not wait for the refresh) and
    /// keeps it in memory, once per flow.
    fn serve_stale(&mut self, current: Option<Entry<V>>) {
        if let Some(entry) = current
            && self.stale.is_none()
        {
            self.handle.serve(&entry);
            self.stale = Some(self.keep(entry));
        }
    }

    /// Reads an envelope (see [`decode`]); a value past its stale deadline is kept as the last
    /// good value when `fail_safe` allows.
    fn found(&self, bytes: Option<&[u8]>, server_now: Option<u64>) -> Found<V> {
        match decode(bytes, server_now) {
            Decoded::Servable(entry) => Found::Usable(entry),
            Decoded::Nothing => Found::Nothing,
            Decoded::Undecodable => Found::Undecodable,
            Decoded::Unservable(entry) => {
                // Past its stale deadline but kept by Redis for `fail_safe`: not to be served,
                // but the last good value if this flow's load fails.
                if self.handle.config().fail_safe.is_some() {
                    self.keep(entry);
                }
                Found::Nothing
            }
        }
    }
}

/// What an envelope read from Redis holds, on this process's clock.
enum Decoded<V> {
    Nothing,
    Undecodable,
    /// Fresh or stale.
    Servable(Entry<V>),
    /// Past its stale deadline.
    Unservable(Entry<V>),
}

/// Reads an envelope. Deadlines are turned into this process's instants relative to
/// `server_now` (the server's clock at the read) or, for a publication, to its writing.
fn decode<V: DeserializeOwned>(bytes: Option<&[u8]>, server_now: Option<u64>) -> Decoded<V> {
    let Some(bytes) = bytes else {
        return Decoded::Nothing;
    };
    let Some(envelope) = Envelope::parse(bytes) else {
        return Decoded::Undecodable;
    };
    let Ok(value) = envelope::decode(envelope.payload) else {
        return Decoded::Undecodable;
    };
    let reference = server_now.unwrap_or(envelope.written_at);
    let now = Instant::now();
    let entry = Entry::new(
        value,
        now.checked_sub(since(reference, envelope.written_at))
            .unwrap_or(now),
        after(now, since(envelope.fresh_until, reference)),
        after(now, since(envelope.stale_until, reference)),
    );
    if entry.servable(now) {
        Decoded::Servable(entry)
    } else {
        Decoded::Unservable(entry)
    }
}

/// What `FILL` writes for a value loaded with the cache's options: fresh for `fresh` (already
/// jittered), then stale, then kept in Redis for `fail_safe`.
fn write_of<'a>(
    config: &Config,
    token: &'a str,
    fence: u64,
    fresh: Duration,
    payload: &'a [u8],
) -> Write<'a> {
    Write {
        token,
        fresh,
        stale: config.stale,
        keep_for: config.fail_safe.unwrap_or_default(),
        load: Duration::ZERO,
        fence,
        payload,
    }
}

/// The entry of a value `FILL` wrote, with its deadlines on this process's clock.
fn written<V>(value: V, filled: &Written) -> Entry<V> {
    let now = Instant::now();
    Entry::new(
        value,
        now,
        after(now, since(filled.fresh_until, filled.now_ms)),
        after(now, since(filled.stale_until, filled.now_ms)),
    )
}

/// How long after `reference` (ms of the server's clock) `deadline` falls.
fn since(deadline: u64, reference: u64) -> Duration {
    Duration::from_millis(deadline.saturating_sub(reference))
}

/// Loads a key now (a companion's `refresh`), whatever value Redis holds, and writes it to
/// Redis as a fill without the lock: the fence read first makes sure that an invalidation
/// during the load, or a newer fill, is not overwritten. Locally when Redis cannot be used.
pub(crate) async fn refresh<K, V, L>(
    tier: &RedisTier<K, V>,
    handle: &Handle<'_, K, V, L>,
) -> Result<V, Error>
where
    K: Key + Serialize,
    V: Value + Serialize + DeserializeOwned,
    L: Load<K, V>,
{
    let connection = match lookup(tier.connection.as_deref()) {
        Some(connection) if connection.usable() => connection,
        _ => return degraded(tier, handle).await,
    };
    let Ok(args) = keys::args_text(handle.key()) else {
        return degraded(tier, handle).await;
    };
    let keys = keys_of(tier, &connection, &args);
    let Ok(read) = connection.read_or_lock(&keys, None, true).await else {
        return degraded(tier, handle).await;
    };
    let flow = Flow {
        keys,
        connection,
        tier,
        handle,
        stale: None,
        busy_since: None,
    };
    flow.hold(None, read.fence).await
}

/// Writes a value to Redis as if it had been loaded now (a companion's `prime`), and keeps it
/// in memory. The write takes a new fence, so that a load that read the key before cannot write
/// its value over it. When Redis cannot be reached the value is kept here only, and the error
/// returned.
pub(crate) async fn prime<K, V, L>(
    tier: &RedisTier<K, V>,
    handle: &Handle<'_, K, V, L>,
    value: V,
) -> Result<(), Error>
where
    K: Key + Serialize,
    V: Value + Serialize + DeserializeOwned,
    L: Load<K, V>,
{
    let config = handle.config();
    let Some(connection) = lookup(tier.connection.as_deref()) else {
        handle.keep_loaded(value); // nothing shared
        return Ok(());
    };
    let unavailable = |message: String| Error::RedisUnavailable {
        cache: config.name.clone(),
        message: message.into(),
    };
    let args =
        keys::args_text(handle.key()).map_err(|error| Error::invalid_config(error.to_string()))?;
    let payload =
        envelope::encode(&value).map_err(|error| Error::invalid_config(error.to_string()))?;
    let keys = keys_of(tier, &connection, &args);
    let read = match connection.read_or_lock(&keys, None, true).await {
        Ok(read) => read,
        Err(failure) => {
            handle.keep_loaded(value);
            return Err(unavailable(failure.to_string()));
        }
    };
    let flow = Flow {
        keys,
        connection,
        tier,
        handle,
        stale: None,
        busy_since: None,
    };
    if !flow.tag().await {
        handle.keep_loaded(value);
        return Err(unavailable("the value's tags could not be written".into()));
    }
    let fresh = jittered_ttl(config.ttl, config.jitter);
    let filled = flow
        .connection
        .write(
            &flow.keys,
            write_of(config, "", read.fence, fresh, &payload),
        )
        .await;
    match filled {
        Ok(filled) if filled.written => {
            flow.keep(written(value, &filled));
            Ok(())
        }
        // Invalidated, or filled by a newer load, between the read and the write: that stands.
        Ok(_) => Ok(()),
        Err(failure) => {
            handle.keep_loaded(value);
            Err(unavailable(failure.to_string()))
        }
    }
}

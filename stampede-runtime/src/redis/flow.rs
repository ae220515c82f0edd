//! One key's way through the protocol (see the module above), as a state machine: each
//! [`Step`] is one method, which does one round trip (or one wait) and says the next.
//!
//! ```text
//! Read ──fresh──▶ Done(Read)
//!  │ └─locked / no lock──▶ Hold ──▶ Done(Loaded | Failed)
//!  └──busy──▶ Busy ──subscribed, woken, lease over──▶ Read
//!              ├─published──▶ Done(Read)
//!              ├─busy = "compute", waited out──▶ Hold
//!              └─busy = "error"──▶ Done(Busy)
//! any step ──Redis fails──▶ Degrade ──▶ Done(Loaded | Failed), loaded here
//! ```

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::time::Instant;
use tracing::Instrument;

use crate::clock::after;
use crate::config::{Config, Lock};
use crate::entry::Entry;
use crate::kv::{Key, Value};
use crate::load::Load;
use crate::redis::endpoint::Endpoint;
use crate::redis::envelope::{self, Decoded};
use crate::redis::keys::RedisKeys;
use crate::redis::ops::{Fill, Read, ReadState, ServerTime, Written};
use crate::redis::pubsub::Listener;
use crate::redis::tags::set_lifetime;
use crate::redis::tier::RedisTier;
use crate::redis::{Busy, lock};
use crate::tier::{Fetched, Handle, Run, Shared};

/// One key's way through the protocol, for one flight.
pub(super) struct Flow<'a, K: Key, V: Value, L> {
    tier: &'a RedisTier<K, V>,
    endpoint: Arc<Endpoint>,
    keys: RedisKeys,
    handle: &'a Handle<'a, K, V, L>,
    /// The lock's token with `lock = "redis"`; without, reads take no lock.
    token: Option<String>,
    /// Past this, a flow waiting for another process's fill loads the key itself.
    give_up_at: Instant,
    /// Read the key as if it had no value: the value does not decode, or is fresh by the
    /// server's clock and not servable by ours.
    value_unusable: bool,
    /// Read the key as if it had no value, until another process's lock is found: the value
    /// read is the one this refresh replaces (a companion's `refresh` assumes so at first).
    replaced: bool,
    /// The subscription to the key's channel, once another process's lock was found.
    listener: Option<Listener>,
    /// Whether a stale value was handed to the waiters.
    served: bool,
    /// When another process's lock was first found, if it was.
    busy_since: Option<Instant>,
    /// The server's time of the last read, which gave the fence a load writes with.
    read_at: ServerTime,
}

/// What a flow does next.
enum Step<V> {
    /// Read the key, and take its lock unless its value is fresh.
    Read,
    /// Another process holds the lock, for this much longer: wait for its fill.
    Busy { lease_left: Duration, fence: u64 },
    /// Load the key, as the lock's holder or without the lock, then write it.
    Hold { locked: bool, fence: u64 },
    /// Redis failed: load here.
    Degrade,
    /// The flight's report.
    Done(Fetched<V>),
}

/// What a read found, on this process's clock.
enum Found<V> {
    Nothing,
    Usable(Entry<V>),
    /// Present but not an envelope this type decodes.
    Undecodable,
}

impl<'a, K, V, L> Flow<'a, K, V, L>
where
    K: Key + Serialize,
    V: Value + Serialize + DeserializeOwned,
    L: Load<K, V>,
{
    pub(super) fn new(
        tier: &'a RedisTier<K, V>,
        endpoint: Arc<Endpoint>,
        keys: RedisKeys,
        handle: &'a Handle<'a, K, V, L>,
    ) -> Self {
        let token = match handle.config().lock {
            Lock::Redis => Some(lock::token()),
            Lock::Local | Lock::None => None,
        };
        Flow {
            give_up_at: after(Instant::now(), endpoint.config.lock_wait),
            tier,
            endpoint,
            keys,
            handle,
            token,
            value_unusable: false,
            replaced: handle.start().run == Run::Refresh,
            listener: None,
            served: false,
            busy_since: None,
            read_at: ServerTime::replied(0),
        }
    }

    /// Runs the flow to its report, in the `stampede.lock` span.
    pub(super) async fn run(mut self) -> Fetched<V> {
        let span = tracing::debug_span!(
            "stampede.lock",
            cache = %self.config().name,
            key = %self.keys.value,
            outcome = tracing::field::Empty,
            wait_ms = tracing::field::Empty,
        );
        async move {
            let mut step = Step::Read;
            let fetched = loop {
                step = match step {
                    Step::Read => self.read().await,
                    Step::Busy { lease_left, fence } => self.busy(lease_left, fence).await,
                    Step::Hold { locked, fence } => Step::Done(self.hold(locked, fence).await),
                    Step::Degrade => {
                        let endpoint = self.endpoint.clone();
                        Step::Done(self.tier.degraded(self.handle, Some(&endpoint)).await)
                    }
                    Step::Done(fetched) => break fetched,
                }
            };
            if let Some(since) = self.busy_since {
                let waited = since.elapsed();
                self.tier.telemetry.lock_waited(waited);
                tracing::Span::current().record("wait_ms", waited.as_millis() as u64);
            }
            fetched
        }
        .instrument(span)
        .await
    }

    /// `READ_OR_LOCK`: the value if it is fresh, else the lock if it is free.
    async fn read(&mut self) -> Step<V> {
        let read = match self
            .endpoint
            .read_or_lock(
                &self.keys,
                self.token.as_deref(),
                self.value_unusable || self.replaced,
            )
            .await
        {
            Ok(read) => read,
            Err(_) => {
                // The script may have taken the lock before the answer was lost: give it back
                // rather than make every other process wait out the lease.
                if let Some(token) = &self.token {
                    lock::give_back(&self.endpoint, &[&self.keys], token);
                }
                return Step::Degrade;
            }
        };
        self.read_at = ServerTime::replied(read.now_ms);
        let Some(current) = self.current(&read) else {
            return Step::Read; // a fresh header over bytes that do not decode: read again
        };
        match (read.state, current) {
            (ReadState::Fresh, Some(entry)) if !self.refreshes(&entry) => {
                self.record("fresh");
                Step::Done(Fetched::Read(self.keep(entry)))
            }
            // The value this refresh replaces, or fresh by the server's clock but not servable
            // by ours: read again, asking for the lock as if the key were missing.
            (ReadState::Fresh, Some(_)) => {
                self.replaced = true;
                Step::Read
            }
            (ReadState::Fresh, None) => {
                self.value_unusable = true;
                Step::Read
            }
            (ReadState::Locked, current) => {
                self.record("acquired");
                self.tier.telemetry.lock_acquired.bump();
                self.serve_stale(current);
                Step::Hold {
                    locked: true,
                    fence: read.fence,
                }
            }
            (ReadState::NoLock, current) => {
                self.record("unlocked");
                self.serve_stale(current);
                Step::Hold {
                    locked: false,
                    fence: read.fence,
                }
            }
            (ReadState::Busy(lease_left), current) => {
                if self.busy_since.is_none() {
                    // One failed attempt per flow, however many reads.
                    self.busy_since = Some(Instant::now());
                    self.tier.telemetry.lock_busy.bump();
                }
                // The holder's fill is what the next reads look for: a value filled since.
                self.replaced = false;
                self.serve_stale(current);
                Step::Busy {
                    lease_left,
                    fence: read.fence,
                }
            }
        }
    }

    /// The servable entry a read found (`Some(None)`: none); `None` when it found a fresh
    /// header over bytes that do not decode, which must be read again as missing. A value over
    /// the size bound, left on the server, is one that does not decode.
    fn current(&mut self, read: &Read) -> Option<Option<Entry<V>>> {
        let found = match read.oversized {
            true => Found::Undecodable,
            false => self.found(read.value.as_deref(), Some(read.now_ms)),
        };
        match found {
            Found::Usable(entry) => Some(Some(entry)),
            Found::Nothing => Some(None),
            Found::Undecodable => {
                if !self.value_unusable {
                    self.tier.telemetry.decode_errors.bump();
                    tracing::debug!(key = %self.keys.value, oversized = read.oversized, "stampede: value in Redis does not decode or is over max_value_size; reloading it");
                    self.value_unusable = true;
                }
                // In any state but fresh, this read's outcome (a lock taken) stands.
                (read.state != ReadState::Fresh).then_some(None)
            }
        }
    }

    /// Whether a fresh entry is the value this refresh replaces (one filled later is newer, and
    /// needs no load). Both fill times come from the server's clock through a read,
    /// each off by at most its round trip: within the operation timeout, it is the same value.
    fn refreshes(&self, entry: &Entry<V>) -> bool {
        let same_within = self.endpoint.config.op_timeout;
        self.handle
            .refreshing()
            .is_some_and(|old| entry.filled_at() <= after(old, same_within))
    }

    /// Another process holds the lock: by the busy policy, load here, fail, or wait for its
    /// fill (subscribed first, then woken by its publication or when its lease would run out).
    async fn busy(&mut self, lease_left: Duration, fence: u64) -> Step<V> {
        match self.tier.busy {
            Busy::Compute => {
                self.record("computed");
                return Step::Hold {
                    locked: false,
                    fence,
                };
            }
            // With a stale value served, its callers have it: wait for the fill as `wait` does.
            Busy::Error if !self.served => {
                self.record("busy");
                return Step::Done(Fetched::Busy);
            }
            Busy::Error | Busy::Wait => {}
        }
        let Some(listener) = self.listener.as_mut() else {
            // Subscribe, then read again: a fill published before the subscription took effect
            // is in Redis by then.
            return match self.endpoint.listen(&self.keys).await {
                Ok(subscribed) => {
                    self.listener = Some(subscribed);
                    Step::Read
                }
                Err(_) => Step::Degrade,
            };
        };
        let now = Instant::now();
        if now >= self.give_up_at {
            self.record("gave up waiting");
            return Step::Hold {
                locked: false,
                fence,
            };
        }
        let wait = lease_left.min(self.give_up_at - now) + Duration::from_millis(1);
        match tokio::time::timeout(wait, listener.next()).await {
            // Not a fill at the fence read or later (a release, or an older fill a lagging
            // subscriber handed over): read again.
            Ok(Some(payload)) if !envelope::filled_at_or_after(&payload, fence) => {}
            Ok(Some(payload)) => {
                if let Found::Usable(entry) = self.found(Some(&payload), None) {
                    self.record("published");
                    return Step::Done(Fetched::Read(self.keep(entry)));
                }
                // A release without a value (the holder's load failed): read again.
            }
            Ok(None) => self.listener = None, // the pub/sub connection died
            Err(_lease_over) => {}
        }
        Step::Read
    }

    /// Loads the key as the lock's holder (or without a lock), writes the value to Redis and
    /// publishes it. The lock is released on every path, a panicking load's included.
    async fn hold(&self, locked: bool, fence: u64) -> Fetched<V> {
        let held = locked
            .then_some(self.token.as_deref())
            .flatten()
            .map(|token| lock::Held::new(&self.endpoint, &self.keys, token));
        if !self.tag().await {
            // Its value could not be found by its tags' invalidation: keep it out of Redis.
            if let Some(held) = held {
                held.release().await;
            }
            return self.tier.degraded(self.handle, Some(&self.endpoint)).await;
        }
        let started = Instant::now();
        let loaded = match &held {
            Some(held) => held.while_held(self.handle.load()).await,
            None => lock::while_fenced(&self.endpoint, &self.keys, fence, self.handle.load()).await,
        };
        let (value, read_from) = match loaded {
            Ok(loaded) => (loaded.value, self.read_at.at(loaded.read_from)),
            Err(error) => {
                if let Some(held) = held {
                    held.release().await;
                }
                return Fetched::Failed(error);
            }
        };
        let payload = match envelope::encode(&value, self.endpoint.config.max_value_bytes) {
            Ok(payload) => payload,
            Err(error) => {
                if let Some(held) = held {
                    held.release().await;
                }
                let kept = self
                    .tier
                    .unencodable(&self.endpoint, self.handle, value, &error);
                return Fetched::Loaded(kept);
            }
        };
        let fill = Fill {
            keys: &self.keys,
            token: self
                .token
                .as_deref()
                .filter(|_| held.is_some())
                .unwrap_or(""),
            lifetime: self.handle.lifetime(&value),
            load: started.elapsed(),
            fence: Some(fence),
            source_version: self.handle.source_version(&value),
            read_from,
            payload: &payload,
        };
        match self.write(&fill, held).await {
            Some(written) if written.written => {
                Fetched::Loaded(self.keep(entry_of(value, &written)))
            }
            // Refused: Redis holds a newer source version, or the key's fence moved since the
            // read (another holder's fill, a prime, an invalidation), which orders what Redis
            // holds after this load, unless written before the source was read (then `FILL`
            // deleted it). Its callers get what Redis keeps, as every process will.
            Some(written) => {
                if written.newer {
                    self.handle.older_than_stored();
                }
                Fetched::Loaded(
                    match self.stored(written.stored.as_deref(), written.now_ms) {
                        Some(stored) => stored,
                        None => self.handle.fenced_off(value, self.trusted_for()),
                    },
                )
            }
            // Redis failed after the load: the value is good, keep it here; Redis drops its own
            // once it answers again.
            None => {
                self.tier
                    .changed_while_down(&self.endpoint, self.handle.key(), self.config());
                Fetched::Loaded(self.handle.keep_loaded(value, self.trusted_for()))
            }
        }
    }

    /// `FILL` of a loaded value (unless the fence moved), published, and the lock `held`
    /// released; `None` when Redis failed.
    async fn write(&self, fill: &Fill<'_>, held: Option<lock::Held>) -> Option<Written> {
        let written = self.endpoint.fill(fill).await.ok();
        // FILL released the lock if it ran; if it did not, the release is tried once.
        if let Some(held) = held {
            match written {
                Some(_) => held.released(),
                None => held.release().await,
            }
        }
        written
    }

    /// Writes a value given for the key (a companion's `prime`), whatever the fence (which the
    /// write moves on, fencing off every load running), and keeps it in memory; the failure's
    /// message when Redis could not be written.
    pub(super) async fn prime(&self, value: V, payload: &[u8]) -> Result<(), String> {
        if !self.tag().await {
            self.handle.keep_loaded(value, self.trusted_for());
            return Err("the value's tags could not be written".into());
        }
        let lifetime = self.handle.lifetime(&value);
        let version = self.handle.source_version(&value);
        let fill = Fill {
            keys: &self.keys,
            token: "",
            lifetime,
            load: Duration::ZERO,
            fence: None,
            source_version: version,
            read_from: 0,
            payload,
        };
        match self.endpoint.fill(&fill).await {
            Ok(written) if written.written => {
                self.keep(entry_of(value, &written));
                Ok(())
            }
            // Refused: Redis holds a newer source version. Memory keeps that one (or nothing,
            // if it is not servable), never what it held before the prime.
            Ok(written) => {
                self.handle.older_than_stored();
                if self
                    .stored(written.stored.as_deref(), written.now_ms)
                    .is_none()
                {
                    self.handle.forget();
                }
                Ok(())
            }
            Err(failure) => {
                self.handle.keep_loaded(value, self.trusted_for());
                Err(failure.to_string())
            }
        }
    }

    fn config(&self) -> &Config {
        self.handle.config()
    }

    /// How long memory may keep what this flow reads or writes now (see
    /// [`Endpoint::memory_trusted_for`]).
    fn trusted_for(&self) -> Option<Duration> {
        self.endpoint.memory_trusted_for()
    }

    /// The value `FILL` found stored when it refused this flow's, kept in memory; `None` if
    /// there is none, or it is not servable (or over the size bound, left unread).
    fn stored(&self, stored: Option<&[u8]>, server_now: u64) -> Option<V> {
        match self.found(stored, Some(server_now)) {
            Found::Usable(entry) => Some(self.keep(entry)),
            Found::Nothing | Found::Undecodable => None,
        }
    }

    /// Keeps an entry read from or written to Redis in memory, and returns its value.
    fn keep(&self, entry: Entry<V>) -> V {
        self.handle.keep(Shared::new(entry, self.trusted_for()))
    }

    /// Adds the key to its tags' sets before its load reads the source (see `tags`); `true`
    /// when done or untagged.
    async fn tag(&self) -> bool {
        let tags = self.handle.tags();
        if tags.is_empty() {
            return true;
        }
        let lifetime = set_lifetime(self.config(), self.endpoint.config.lease);
        self.endpoint.tag(&self.keys, tags, lifetime).await.is_ok()
    }

    fn record(&self, outcome: &'static str) {
        tracing::Span::current().record("outcome", outcome);
    }

    /// Hands a stale value to the waiters at once (they need not wait for the refresh), once
    /// per flow, unless the core serves none (a companion's `refresh`).
    fn serve_stale(&mut self, current: Option<Entry<V>>) {
        if let Some(entry) = current
            && !self.served
        {
            self.served = self.handle.serve(Shared::new(entry, self.trusted_for()));
        }
    }

    /// Reads an envelope (see [`envelope::decoded`]); a value past its stale deadline is
    /// offered as the last good value (kept by Redis for `fail_safe`).
    fn found(&self, bytes: Option<&[u8]>, server_now: Option<u64>) -> Found<V> {
        match envelope::decoded(bytes, server_now, self.endpoint.config.max_value_bytes) {
            Decoded::Servable(entry) => Found::Usable(entry),
            Decoded::Nothing => Found::Nothing,
            Decoded::Undecodable => Found::Undecodable,
            Decoded::Unservable(entry) => {
                self.handle
                    .last_good(Shared::new(entry, self.trusted_for()));
                Found::Nothing
            }
        }
    }
}

/// The entry of a value `FILL` wrote, with its deadlines on this process's clock.
pub(super) fn entry_of<V>(value: V, written: &Written) -> Entry<V> {
    let now = Instant::now();
    Entry::new(
        value,
        now,
        after(now, envelope::since(written.fresh_until, written.now_ms)),
        after(now, envelope::since(written.stale_until, written.now_ms)),
    )
}

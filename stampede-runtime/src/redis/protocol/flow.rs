//! The protocol of a flight through the Redis tier, for any group of keys: a batch function's
//! batch, or one key's flight (a group of one, see [`Group`]). Each step is one round trip for
//! all the keys at that step.
//!
//! ```text
//! Read (READ_OR_LOCK) ──fresh────────────────────────────────────▶ Read
//!   │ ├──locked / no lock──▶ Hold: one load of them all, FILL ▶ Loaded | Failed
//!   │ └──busy──▶ busy = "compute": Hold; busy = "error": Busy;
//!   │            else subscribe each (then Read them again together), wait for the fills:
//!   │              published ▶ Read; lease over / released ▶ Read again; gave up ▶ Hold
//!   └─Redis fails──▶ one load here of the keys left ▶ Loaded | Failed
//! ```
//!
//! A group this process loads costs two round trips beyond its load, however many keys it has:
//! one script reads every key and takes the locks of those that are missing (their fences in
//! the same script), one writes every value it loaded, publishes each on its key's channel and
//! releases each lock. Keys another process holds are waited for (subscribed to each key's
//! channel, read again, woken by the fill's publication, which carries the value), and are
//! loaded here, in one more load, only if their holder gives up its lock without a value or the
//! wait runs out. A Redis Cluster runs each script once per slot, the scripts of one round at
//! once.
//!
//! Each key keeps its own handle (its generation and tags, its stale and last good values), and
//! its outcome is reported as soon as the step that decides it is done, so the core settles
//! each key from what is reported for it.

mod ops;

use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::{join_all, select_all};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::time::Instant;
use tracing::Instrument;

use crate::clock::after;
use crate::config::{Config, Lock};
use crate::entry::Entry;
use crate::error::Error;
use crate::kv::{Key, Value};
use crate::load::{Load, Loaded};
use crate::redis::Busy;
use crate::redis::codec::envelope::{self, Decoded};
use crate::redis::codec::keys::{self, RedisKeys};
use crate::redis::protocol::lock;
use crate::redis::protocol::ops::{Fill, Read, ReadState, ServerTime, Written};
use crate::redis::protocol::tags::set_lifetime;
use crate::redis::protocol::tier::RedisTier;
use crate::redis::transport::endpoint::Endpoint;
use crate::redis::transport::failure::Failure;
use crate::redis::transport::installed::lookup;
use crate::redis::transport::pubsub::Listener;
use crate::tier::{Direct, Fetched, Group, Handle, Run, Shared};

/// How one key of a group stands.
enum Step {
    /// Read it (again), and take its lock unless its value is fresh.
    Read,
    /// Another process holds its lock until `lease_until`: wait for its fill.
    Busy { lease_until: Instant, fence: u64 },
    /// Load it, as its lock's holder or without the lock, then write it.
    Hold { locked: bool, fence: u64 },
    /// Redis cannot be used for it: load it here.
    Degrade,
    /// Answered.
    Done,
}

/// One key of a group on its way through the protocol.
struct Part {
    keys: RedisKeys,
    step: Step,
    /// Read it as if it had no value: its value does not decode, or is fresh by the server's
    /// clock and not servable by ours.
    value_unusable: bool,
    /// Read it as if it had no value, until another process's lock is found: the value read is
    /// the one its refresh replaces (see `Flow::refreshes`).
    replaced: bool,
    /// The subscription to its channel, once another process's lock was found.
    listener: Option<Listener>,
    /// Whether a stale value was handed to its waiters.
    served: bool,
    /// When another process's lock was first found, if it was.
    busy_since: Option<Instant>,
    /// The server's time of its last read, which gave the fence a load writes with.
    read_at: ServerTime,
}

/// A key this group loads to fill: its place in the group, whether this process holds its
/// lock, and the fence its read returned.
#[derive(Clone, Copy)]
struct HeldKey {
    at: usize,
    locked: bool,
    fence: u64,
}

/// A loaded value ready for `FILL`.
struct Encoded<V> {
    held: HeldKey,
    loaded: Loaded<V>,
    payload: Vec<u8>,
    /// The server's time (ms) when the source was read.
    read_from: u64,
}

/// What a read found of one key, on this process's clock.
enum Found<V> {
    Nothing,
    Usable(Entry<V>),
    /// Present but not an envelope this type decodes.
    Undecodable,
}

impl<K, V> RedisTier<K, V>
where
    K: Key + Serialize,
    V: Value + Serialize + DeserializeOwned,
{
    /// The values of a group's keys, through Redis (see the module's docs), each key's outcome
    /// reported to the group once the step that decides it is done; in the `stampede.lock`
    /// span, whose `outcome` is that of the group's last key to be decided.
    pub(in crate::redis) async fn fetch_group<G: Group<K, V>>(&self, group: &G) {
        let handles = group.handles();
        let config = match handles.first() {
            Some(handle) => handle.config(),
            None => return,
        };
        let span = tracing::debug_span!(
            "stampede.lock",
            cache = %config.name,
            keys = handles.len(),
            key = tracing::field::Empty,
            outcome = tracing::field::Empty,
            wait_ms = tracing::field::Empty,
        );
        let mut outcomes: Vec<Option<Fetched<V>>> = handles.iter().map(|_| None).collect();
        let endpoint = match self.endpoint_of(config) {
            Ok(endpoint) => endpoint,
            Err(endpoint) => {
                let all: Vec<usize> = (0..handles.len()).collect();
                self.degraded_many(group, &all, endpoint.as_ref(), &mut outcomes)
                    .instrument(span)
                    .await;
                report(group, &mut outcomes);
                return;
            }
        };
        self.register(&endpoint, &handles[0].options()).await;
        let token = (config.lock == Lock::Redis).then(lock::token);
        let mut parts = Vec::with_capacity(handles.len());
        for handle in handles {
            let refresh = handle.start().run == Run::Refresh;
            let part = match keys::args_text(handle.key()) {
                Ok(args) => {
                    let keys = self.keys(&endpoint, &args);
                    // Changed here while Redis was down: what Redis holds is older, dropped
                    // there first.
                    let clean = !endpoint.dirty.contains(keys.base())
                        || endpoint.clean(keys.base()).await.is_ok();
                    let mut part = Part::new(keys, refresh);
                    if !clean {
                        part.step = Step::Degrade;
                    }
                    part
                }
                Err(error) => {
                    tracing::warn!(cache = %config.name, %error, "stampede: key cannot be written for Redis; loading locally");
                    let mut part = Part::new(RedisKeys::of_base(""), refresh);
                    part.step = Step::Degrade;
                    part
                }
            };
            parts.push(part);
        }
        if let [part] = parts.as_slice() {
            span.record("key", part.keys.value.as_str());
        }
        endpoint.clean_all();
        let flow = Flow {
            tier: self,
            give_up_at: after(Instant::now(), endpoint.config.lock_wait),
            endpoint,
            group,
            token,
        };
        flow.run(&mut parts, &mut outcomes).instrument(span).await;
    }

    /// The endpoint, if the cache's keys can go through Redis at all; else (not shared, not
    /// configured, cooling down) the endpoint if there is one.
    fn endpoint_of(&self, config: &Config) -> Result<Arc<Endpoint>, Option<Arc<Endpoint>>> {
        if self.shared().is_err() {
            return Err(None);
        }
        let Some(endpoint) = lookup(self.connection.as_deref()) else {
            self.warn_unconfigured(config);
            return Err(None);
        };
        match endpoint.usable() {
            true => Ok(endpoint),
            false => Err(Some(endpoint)),
        }
    }

    /// Loads the keys at `indices` here with one call, without Redis, each kept in memory no
    /// longer than memory is trusted; Redis drops its own value of each once it answers again.
    async fn degraded_many<G: Group<K, V>>(
        &self,
        group: &G,
        indices: &[usize],
        endpoint: Option<&Arc<Endpoint>>,
        outcomes: &mut [Option<Fetched<V>>],
    ) {
        if indices.is_empty() {
            return;
        }
        tracing::Span::current().record("outcome", "degraded");
        for _ in indices {
            self.telemetry.degraded.bump();
        }
        let trusted_for = endpoint.and_then(|endpoint| endpoint.trusted_for_unshared());
        let loaded = group.load(indices).await;
        for (&at, loaded) in indices.iter().zip(loaded) {
            let handle = &group.handles()[at];
            outcomes[at] = Some(match loaded {
                Ok(loaded) => {
                    let value = handle.keep_loaded(loaded, trusted_for);
                    if let Some(endpoint) = endpoint {
                        self.changed_while_down(endpoint, handle.key(), handle.config());
                    }
                    Fetched::Loaded(value)
                }
                Err(error) => Fetched::Failed(error),
            });
        }
    }

    /// The fresh values of many keys in one round trip, without a lock (see [`Tier::read`]),
    /// each `None` when Redis holds no fresh one that decodes, or cannot be read.
    ///
    /// [`Tier::read`]: crate::tier::Tier::read
    pub(in crate::redis) async fn read_batch(
        &self,
        directs: &[Direct<'_, K, V>],
    ) -> Vec<Option<Shared<V>>> {
        let mut found: Vec<Option<Shared<V>>> = directs.iter().map(|_| None).collect();
        if self.shared().is_err() {
            return found;
        }
        let Some(endpoint) = lookup(self.connection.as_deref()).filter(|e| e.usable()) else {
            return found;
        };
        let (places, value_keys): (Vec<usize>, Vec<String>) = directs
            .iter()
            .enumerate()
            .filter_map(|(at, direct)| {
                let args = keys::args_text(direct.key()).ok()?;
                let value_key =
                    RedisKeys::value_key(&endpoint.config.prefix, &self.identity, &args);
                // The flight drops what Redis holds first.
                (!endpoint.dirty.contains(RedisKeys::base_of(&value_key)))
                    .then_some((at, value_key))
            })
            .unzip();
        let Ok(values) = endpoint.read_fresh_many(&value_keys).await else {
            return found;
        };
        let trusted_for = endpoint.trusted_for();
        for (at, (value, now_ms)) in places.into_iter().zip(values) {
            if let Decoded::Servable(entry) = envelope::decoded(
                value.as_deref(),
                Some(now_ms),
                endpoint.config.max_value_bytes,
            ) {
                found[at] = Some(Shared::new(entry, trusted_for));
            }
        }
        found
    }
}

/// Reports the outcomes decided since the last report: the core settles those keys now,
/// whatever the others still wait for.
fn report<K: Key, V: Value, G: Group<K, V>>(group: &G, outcomes: &mut [Option<Fetched<V>>]) {
    for (at, outcome) in outcomes.iter_mut().enumerate() {
        if let Some(fetched) = outcome.take() {
            group.report(at, fetched);
        }
    }
}

impl Part {
    fn new(keys: RedisKeys, refresh: bool) -> Self {
        Part {
            keys,
            step: Step::Read,
            value_unusable: false,
            replaced: refresh,
            listener: None,
            served: false,
            busy_since: None,
            read_at: ServerTime::replied(0),
        }
    }
}

/// One group's way through the protocol.
struct Flow<'a, K: Key, V: Value, G> {
    tier: &'a RedisTier<K, V>,
    endpoint: Arc<Endpoint>,
    group: &'a G,
    /// The locks' token with `lock = "redis"` (one for the group); without, reads take no lock.
    token: Option<String>,
    /// Past this, a key waiting for another process's fill is loaded here.
    give_up_at: Instant,
}

impl<K, V, G> Flow<'_, K, V, G>
where
    K: Key + Serialize,
    V: Value + Serialize + DeserializeOwned,
    G: Group<K, V>,
{
    /// Runs every part to its outcome, reporting each key's as soon as the step that decided
    /// it is done.
    async fn run(&self, parts: &mut [Part], outcomes: &mut [Option<Fetched<V>>]) {
        loop {
            report(self.group, outcomes);
            let reading = at_step(parts, |step| matches!(step, Step::Read));
            if !reading.is_empty() {
                self.read(parts, &reading, outcomes).await;
                continue;
            }
            let holding = at_step(parts, |step| matches!(step, Step::Hold { .. }));
            let degrading = at_step(parts, |step| matches!(step, Step::Degrade));
            if !holding.is_empty() || !degrading.is_empty() {
                self.hold(parts, &holding, &degrading, outcomes).await;
                continue;
            }
            let busy = at_step(parts, |step| matches!(step, Step::Busy { .. }));
            if busy.is_empty() {
                break;
            }
            self.wait(parts, &busy, outcomes).await;
        }
        let mut longest = None;
        for part in parts.iter() {
            if let Some(since) = part.busy_since {
                let waited = since.elapsed();
                self.tier.telemetry.lock_waited(waited);
                longest = longest.max(Some(waited));
            }
        }
        if let Some(waited) = longest {
            tracing::Span::current().record("wait_ms", waited.as_millis() as u64);
        }
    }

    /// `READ_OR_LOCK` of the parts at `reading`: each to its next step.
    async fn read(
        &self,
        parts: &mut [Part],
        reading: &[usize],
        outcomes: &mut [Option<Fetched<V>>],
    ) {
        let keys: Vec<&RedisKeys> = reading.iter().map(|&at| &parts[at].keys).collect();
        let unusable: Vec<bool> = reading
            .iter()
            .map(|&at| parts[at].value_unusable || parts[at].replaced)
            .collect();
        let read = self
            .endpoint
            .read_or_lock_many(&keys, self.token.as_deref(), &unusable)
            .await;
        let reads = match read {
            Ok(reads) => reads,
            Err(_) => {
                // The script may have taken locks before the answer was lost: give them back
                // rather than make every other process wait out the lease.
                if let Some(token) = &self.token {
                    lock::give_back(&self.endpoint, &keys, token);
                }
                for &at in reading {
                    parts[at].step = Step::Degrade;
                }
                return;
            }
        };
        for (&at, read) in reading.iter().zip(reads) {
            parts[at].read_at = ServerTime::replied(read.now_ms);
            parts[at].step = self.next_step(at, &mut parts[at], &read, outcomes);
        }
    }

    /// What a read of one key says to do next.
    fn next_step(
        &self,
        at: usize,
        part: &mut Part,
        read: &Read,
        outcomes: &mut [Option<Fetched<V>>],
    ) -> Step {
        let handle = &self.group.handles()[at];
        // A value over the size bound, left on the server, is one that does not decode.
        let found = match read.oversized {
            true => Found::Undecodable,
            false => self.found(handle, read.value.as_deref(), Some(read.now_ms)),
        };
        let current = match found {
            Found::Usable(entry) => Some(entry),
            Found::Nothing => None,
            Found::Undecodable => {
                if !part.value_unusable {
                    self.tier.telemetry.decode_errors.bump();
                    tracing::debug!(key = %part.keys.value, oversized = read.oversized, "stampede: value in Redis does not decode or is over max_value_size; reloading it");
                    part.value_unusable = true;
                }
                // A fresh header over bytes that do not decode: read again as missing.
                if read.state == ReadState::Fresh {
                    return Step::Read;
                }
                None
            }
        };
        match (read.state, current) {
            (ReadState::Fresh, Some(entry)) if !self.replaces(handle, &entry) => {
                record("fresh");
                outcomes[at] = Some(Fetched::Read(self.keep(handle, entry)));
                Step::Done
            }
            // The value its refresh replaces, or fresh by the server's clock but not servable
            // by ours: read again, asking for the lock as if the key were missing.
            (ReadState::Fresh, Some(_)) => {
                part.replaced = true;
                Step::Read
            }
            (ReadState::Fresh, None) => {
                part.value_unusable = true;
                Step::Read
            }
            (ReadState::Locked, current) => {
                record("acquired");
                self.tier.telemetry.lock_acquired.bump();
                self.serve_stale(handle, part, current);
                Step::Hold {
                    locked: true,
                    fence: read.fence,
                }
            }
            (ReadState::NoLock, current) => {
                record("unlocked");
                self.serve_stale(handle, part, current);
                Step::Hold {
                    locked: false,
                    fence: read.fence,
                }
            }
            (ReadState::Busy(lease_left), current) => {
                if part.busy_since.is_none() {
                    part.busy_since = Some(Instant::now());
                    self.tier.telemetry.lock_busy.bump();
                }
                // The holder's fill is what the next reads look for: a value filled since.
                part.replaced = false;
                self.serve_stale(handle, part, current);
                self.when_busy(part, lease_left, read.fence, &mut outcomes[at])
            }
        }
    }

    /// Another process holds the key's lock: by the busy policy, load here, answer busy, or
    /// wait for its fill.
    fn when_busy(
        &self,
        part: &Part,
        lease_left: Duration,
        fence: u64,
        outcome: &mut Option<Fetched<V>>,
    ) -> Step {
        match self.tier.busy {
            Busy::Compute => {
                record("computed");
                Step::Hold {
                    locked: false,
                    fence,
                }
            }
            // With a stale value served, its callers have it: wait as `wait` does.
            Busy::Error if !part.served => {
                record("busy");
                *outcome = Some(Fetched::Busy);
                Step::Done
            }
            Busy::Error | Busy::Wait => Step::Busy {
                lease_until: after(Instant::now(), lease_left),
                fence,
            },
        }
    }

    /// Waits for the fills of the keys at `busy`, which other processes hold: subscribes to the
    /// channels of those not subscribed yet (then reads them again, so that a fill published
    /// before the subscription is not missed), else waits for the first publication, a lease
    /// that runs out, or the end of the wait.
    async fn wait(&self, parts: &mut [Part], busy: &[usize], outcomes: &mut [Option<Fetched<V>>]) {
        let unheard: Vec<usize> = busy
            .iter()
            .copied()
            .filter(|&at| parts[at].listener.is_none())
            .collect();
        if !unheard.is_empty() {
            self.subscribe(parts, &unheard).await;
            return;
        }
        if Instant::now() >= self.give_up_at {
            // Waited long enough: each is loaded here, without the lock.
            record("gave up waiting");
            for &at in busy {
                if let Step::Busy { fence, .. } = parts[at].step {
                    parts[at].step = Step::Hold {
                        locked: false,
                        fence,
                    };
                }
            }
            return;
        }
        for (at, payload) in self.published(parts, busy).await {
            self.take_published(at, &mut parts[at], payload, outcomes);
        }
        let now = Instant::now();
        for &at in busy {
            if let Step::Busy { lease_until, .. } = parts[at].step
                && now >= lease_until
            {
                parts[at].step = Step::Read; // the holder may be gone: one of us takes over
            }
        }
    }

    /// Subscribes to the channels of the keys at `unheard`, each then read again (so that a
    /// fill published before the subscription is not missed), or loaded here if Redis could not
    /// subscribe it.
    async fn subscribe(&self, parts: &mut [Part], unheard: &[usize]) {
        let listened = join_all(
            unheard
                .iter()
                .map(|&at| self.endpoint.listen(&parts[at].keys)),
        )
        .await;
        for (&at, listened) in unheard.iter().zip(listened) {
            let part = &mut parts[at];
            match listened {
                Ok(listener) => {
                    part.listener = Some(listener);
                    part.step = Step::Read;
                }
                Err(_) => part.step = Step::Degrade,
            }
        }
    }

    /// Waits for the first publication on the channels of the keys at `busy`, no longer than
    /// the first lease to run out or the end of the wait; then every publication received, not
    /// one wake-up each: (the key's place, the payload or `None` when the subscription died).
    async fn published(&self, parts: &mut [Part], busy: &[usize]) -> Vec<(usize, Option<Vec<u8>>)> {
        let until = busy
            .iter()
            .filter_map(|&at| match parts[at].step {
                Step::Busy { lease_until, .. } => Some(lease_until),
                _ => None,
            })
            .min()
            .unwrap_or_else(Instant::now)
            .min(self.give_up_at);
        let wake = after(until, Duration::from_millis(1));
        let first = {
            let listening = parts
                .iter_mut()
                .enumerate()
                .filter(|(_, part)| matches!(part.step, Step::Busy { .. }))
                .filter_map(|(at, part)| {
                    let listener = part.listener.as_mut()?;
                    Some(Box::pin(async move { (at, listener.next().await) }))
                });
            let first = select_all(listening).map(|(heard, _, _)| heard);
            tokio::time::timeout_at(wake, first).await.ok()
        };
        let mut heard: Vec<(usize, Option<Vec<u8>>)> = first.into_iter().collect();
        for &at in busy {
            if heard.iter().any(|(other, _)| *other == at) {
                continue;
            }
            if let Some(listener) = parts[at].listener.as_mut()
                && let Some(payload) = listener.next().now_or_never()
            {
                heard.push((at, payload));
            }
        }
        heard
    }

    /// What a publication on the channel of the key at `at` says: its holder's fill (answered),
    /// or read again (a release without a value, an older fill a lagging subscriber handed
    /// over, a subscription that died).
    fn take_published(
        &self,
        at: usize,
        part: &mut Part,
        payload: Option<Vec<u8>>,
        outcomes: &mut [Option<Fetched<V>>],
    ) {
        let handle = &self.group.handles()[at];
        let read_fence = match part.step {
            Step::Busy { fence, .. } => fence,
            _ => 0,
        };
        part.step = Step::Read;
        match payload {
            Some(payload) if envelope::filled_at_or_after(&payload, read_fence) => {
                if let Found::Usable(entry) = self.found(handle, Some(&payload), None) {
                    record("published");
                    outcomes[at] = Some(Fetched::Read(self.keep(handle, entry)));
                    part.step = Step::Done;
                }
            }
            Some(_) => {}
            None => part.listener = None, // the pub/sub connection died: subscribe again
        }
    }

    /// Loads the keys at `holding` (their locks held, or loaded without the lock) and those at
    /// `degrading` (Redis cannot be used for them) with one call, then writes the former in one
    /// round trip, fenced, published and released.
    async fn hold(
        &self,
        parts: &mut [Part],
        holding: &[usize],
        degrading: &[usize],
        outcomes: &mut [Option<Fetched<V>>],
    ) {
        let (fill, mut local) = self.tagged(parts, holding).await;
        local.extend_from_slice(degrading);
        let mut loading: Vec<usize> = fill.iter().map(|held| held.at).collect();
        loading.extend_from_slice(&local);
        for &at in &loading {
            parts[at].step = Step::Done;
        }
        let token = self.token.as_deref().unwrap_or("");
        let fill_locks: Vec<RedisKeys> = fill
            .iter()
            .filter(|held| held.locked)
            .map(|held| parts[held.at].keys.clone())
            .collect();
        // The fences of the keys loaded without their locks are kept alive as long, so that a
        // load longer than the lease still fills.
        let fenced: Vec<(RedisKeys, u64)> = fill
            .iter()
            .filter(|held| !held.locked)
            .map(|held| (parts[held.at].keys.clone(), held.fence))
            .collect();
        let guard = lock::Locks::new(&self.endpoint, fill_locks, fenced, token);
        let started = Instant::now();
        let loaded = guard.while_held(self.group.load(&loading)).await;
        let took = started.elapsed();
        let (filled, local_loaded) = loaded.split_at(fill.len());
        self.kept_here(&local, local_loaded, outcomes);
        let (fills, unwritten) = self.encoded(parts, &fill, filled, outcomes);
        let release: Vec<&RedisKeys> = unwritten
            .iter()
            .filter(|held| held.locked)
            .map(|held| &parts[held.at].keys)
            .collect();
        // Waiters read again at once rather than at the end of the lease.
        lock::release(&self.endpoint, &release, token).await;
        let writes: Vec<Fill<'_>> = fills
            .iter()
            .map(|encoded| Fill {
                keys: &parts[encoded.held.at].keys,
                token: if encoded.held.locked { token } else { "" },
                lifetime: self.group.handles()[encoded.held.at].lifetime(&encoded.loaded.value),
                load: took,
                fence: Some(encoded.held.fence),
                read_from: encoded.read_from,
                source_version: self.group.handles()[encoded.held.at]
                    .source_version(&encoded.loaded.value),
                payload: &encoded.payload,
            })
            .collect();
        let written = self.endpoint.fill_many(&writes).await;
        guard.done(written.is_ok());
        drop(writes);
        self.settle_fills(fills, written, outcomes);
    }

    /// Adds each key at `holding` to its tags' sets before its load reads the source: the keys
    /// to fill (each with whether its lock is held, and its fence), and those that could not be
    /// tagged, kept out of Redis, whose locks are given back now.
    async fn tagged(&self, parts: &[Part], holding: &[usize]) -> (Vec<HeldKey>, Vec<usize>) {
        let held: Vec<HeldKey> = holding
            .iter()
            .map(|&at| match parts[at].step {
                Step::Hold { locked, fence } => HeldKey { at, locked, fence },
                _ => unreachable!("only parts holding"),
            })
            .collect();
        let tagged = join_all(held.iter().map(|held| {
            let handle = &self.group.handles()[held.at];
            tag(&self.endpoint, &parts[held.at].keys, handle)
        }))
        .await;
        let (mut fill, mut untagged) = (Vec::new(), Vec::new());
        for (held, tagged) in held.into_iter().zip(tagged) {
            match tagged {
                true => fill.push(held),
                false => untagged.push(held),
            }
        }
        let token = self.token.as_deref().unwrap_or("");
        let untagged_locks: Vec<&RedisKeys> = untagged
            .iter()
            .filter(|held| held.locked)
            .map(|held| &parts[held.at].keys)
            .collect();
        lock::release(&self.endpoint, &untagged_locks, token).await;
        (fill, untagged.into_iter().map(|held| held.at).collect())
    }

    /// Keeps the values loaded for the keys at `local` here only: keys that could not be
    /// tagged, and those Redis could not be used for.
    fn kept_here(
        &self,
        local: &[usize],
        loaded: &[Result<Loaded<V>, Error>],
        outcomes: &mut [Option<Fetched<V>>],
    ) {
        let trusted_for = self.endpoint.trusted_for_unshared();
        if !local.is_empty() {
            record("degraded");
        }
        for (&at, loaded) in local.iter().zip(loaded) {
            let handle = &self.group.handles()[at];
            self.tier.telemetry.degraded.bump();
            outcomes[at] = Some(match loaded {
                Ok(loaded) => {
                    let value = handle.keep_loaded(loaded.clone(), trusted_for);
                    self.tier
                        .changed_while_down(&self.endpoint, handle.key(), handle.config());
                    Fetched::Loaded(value)
                }
                Err(error) => Fetched::Failed(error.clone()),
            });
        }
    }

    /// The loaded values of the keys `fill` encoded for `FILL`, and the keys not to write: a
    /// failed load (answered with its error) or a value that cannot be encoded (kept in memory
    /// only).
    fn encoded(
        &self,
        parts: &[Part],
        fill: &[HeldKey],
        loaded: &[Result<Loaded<V>, Error>],
        outcomes: &mut [Option<Fetched<V>>],
    ) -> (Vec<Encoded<V>>, Vec<HeldKey>) {
        let (mut fills, mut unwritten) = (Vec::new(), Vec::new());
        for (held, loaded) in fill.iter().zip(loaded) {
            let handle = &self.group.handles()[held.at];
            let loaded = match loaded {
                Ok(loaded) => loaded,
                Err(error) => {
                    unwritten.push(*held);
                    outcomes[held.at] = Some(Fetched::Failed(error.clone()));
                    continue;
                }
            };
            let (max, compress) = (
                self.endpoint.config.max_value_bytes,
                handle.options().compress,
            );
            match envelope::encode(&loaded.value, max, compress) {
                Ok(payload) => fills.push(Encoded {
                    held: *held,
                    loaded: loaded.clone(),
                    payload,
                    read_from: parts[held.at].read_at.at(loaded.read_from),
                }),
                Err(error) => {
                    unwritten.push(*held);
                    let kept =
                        self.tier
                            .unencodable(&self.endpoint, handle, loaded.clone(), &error);
                    outcomes[held.at] = Some(Fetched::Loaded(kept));
                }
            }
        }
        (fills, unwritten)
    }

    /// Each key's outcome from what `FILL` did with its value.
    fn settle_fills(
        &self,
        fills: Vec<Encoded<V>>,
        written: Result<Vec<Written>, Failure>,
        outcomes: &mut [Option<Fetched<V>>],
    ) {
        let Ok(written) = written else {
            // Redis failed after the load: the values are good, kept here; Redis drops its
            // own once it answers again.
            for encoded in fills {
                let handle = &self.group.handles()[encoded.held.at];
                self.tier
                    .changed_while_down(&self.endpoint, handle.key(), handle.config());
                outcomes[encoded.held.at] = Some(Fetched::Loaded(
                    handle.keep_loaded(encoded.loaded, self.endpoint.trusted_for()),
                ));
            }
            return;
        };
        for (encoded, written) in fills.into_iter().zip(written) {
            let at = encoded.held.at;
            let handle = &self.group.handles()[at];
            if written.written {
                outcomes[at] = Some(Fetched::Loaded(
                    self.keep(handle, entry_of(encoded.loaded, &written)),
                ));
                continue;
            }
            // Refused: Redis holds a value that may be newer (read from the source no earlier,
            // or of a newer source version), or the key's fence moved since its read with
            // nothing older stored (an invalidation, a holder that has not filled). Its callers
            // get what Redis keeps, as every process will; else their own, in memory unless
            // invalidated here.
            if written.newer {
                handle.older_than_stored();
            }
            let stored = match self.found(handle, written.stored.as_deref(), Some(written.now_ms)) {
                Found::Usable(entry) => Some(self.keep(handle, entry)),
                Found::Nothing | Found::Undecodable => None,
            };
            outcomes[at] = Some(Fetched::Loaded(stored.unwrap_or_else(|| {
                handle.fenced_off(encoded.loaded, self.endpoint.trusted_for())
            })));
        }
    }

    /// Whether a fresh entry is the value a refresh of its key replaces: one filled later is
    /// newer, and needs no load. Both fill times come from the server's clock through a read,
    /// each off by at most its round trip: within the operation timeout, it is the same value.
    fn replaces(&self, handle: &Handle<'_, K, V, G::Load>, entry: &Entry<V>) -> bool {
        let same_within = self.endpoint.config.op_timeout;
        handle
            .replacing()
            .is_some_and(|old| entry.filled_at() <= after(old, same_within))
    }

    /// Hands a key's stale value to its waiters at once (they need not wait for the refresh),
    /// once, unless the core serves none (a companion's `refresh`).
    fn serve_stale(
        &self,
        handle: &Handle<'_, K, V, G::Load>,
        part: &mut Part,
        current: Option<Entry<V>>,
    ) {
        if let Some(entry) = current
            && !part.served
        {
            part.served = handle.serve(Shared::new(entry, self.endpoint.trusted_for()));
        }
    }

    fn found(
        &self,
        handle: &Handle<'_, K, V, G::Load>,
        bytes: Option<&[u8]>,
        server_now: Option<u64>,
    ) -> Found<V> {
        found(&self.endpoint, handle, bytes, server_now)
    }

    fn keep(&self, handle: &Handle<'_, K, V, G::Load>, entry: Entry<V>) -> V {
        keep(&self.endpoint, handle, entry)
    }
}

/// Adds a key to its tags' sets before its load reads the source (see `tags`); `true` when
/// done or untagged.
async fn tag<K: Key, V: Value, L: Load<K, V>>(
    endpoint: &Endpoint,
    keys: &RedisKeys,
    handle: &Handle<'_, K, V, L>,
) -> bool {
    let tags = handle.tags();
    if tags.is_empty() {
        return true;
    }
    let lifetime = set_lifetime(&handle.options(), endpoint.config.lease);
    endpoint.tag(keys, tags, lifetime).await.is_ok()
}

/// Keeps an entry read from or written to Redis in memory, and returns its value.
fn keep<K: Key, V: Value, L: Load<K, V>>(
    endpoint: &Endpoint,
    handle: &Handle<'_, K, V, L>,
    entry: Entry<V>,
) -> V {
    handle.keep(Shared::new(entry, endpoint.trusted_for()))
}

/// Reads an envelope (see [`envelope::decoded`]); a value past its stale deadline is offered as
/// the key's last good value (kept by Redis for `fail_safe`).
fn found<K: Key, V: Value + DeserializeOwned, L: Load<K, V>>(
    endpoint: &Endpoint,
    handle: &Handle<'_, K, V, L>,
    bytes: Option<&[u8]>,
    server_now: Option<u64>,
) -> Found<V> {
    match envelope::decoded(bytes, server_now, endpoint.config.max_value_bytes) {
        Decoded::Servable(entry) => Found::Usable(entry),
        Decoded::Nothing => {
            handle.no_last_good();
            Found::Nothing
        }
        Decoded::Undecodable => Found::Undecodable,
        Decoded::Unservable(entry) => {
            handle.last_good(Shared::new(entry, endpoint.trusted_for()));
            Found::Nothing
        }
    }
}

/// Writes a value given for the key (a companion's `prime`) whatever the fence (which the write
/// moves on, fencing off every load running), and keeps it in memory; the failure's message
/// when Redis could not be written.
pub(in crate::redis) async fn prime<K, V, L>(
    endpoint: &Endpoint,
    keys: &RedisKeys,
    handle: &Handle<'_, K, V, L>,
    value: V,
    payload: &[u8],
) -> Result<(), String>
where
    K: Key,
    V: Value + DeserializeOwned,
    L: Load<K, V>,
{
    if !tag(endpoint, keys, handle).await {
        handle.keep_loaded(Loaded::now(value), endpoint.trusted_for());
        return Err("the value's tags could not be written".into());
    }
    let fill = Fill {
        keys,
        token: "",
        lifetime: handle.lifetime(&value),
        load: Duration::ZERO,
        fence: None,
        source_version: handle.source_version(&value),
        read_from: 0,
        payload,
    };
    match endpoint.fill(&fill).await {
        Ok(written) if written.written => {
            keep(endpoint, handle, entry_of(Loaded::now(value), &written));
            Ok(())
        }
        // Refused: Redis holds a newer source version. Memory keeps that one (or nothing, if it
        // is not servable), never what it held before the prime.
        Ok(written) => {
            handle.older_than_stored();
            match found(
                endpoint,
                handle,
                written.stored.as_deref(),
                Some(written.now_ms),
            ) {
                Found::Usable(entry) => drop(keep(endpoint, handle, entry)),
                Found::Nothing | Found::Undecodable => handle.forget(),
            }
            Ok(())
        }
        Err(failure) => {
            handle.keep_loaded(Loaded::now(value), endpoint.trusted_for());
            Err(failure.to_string())
        }
    }
}

/// The entry of a value `FILL` wrote, with its deadlines on this process's clock.
fn entry_of<V>(loaded: Loaded<V>, written: &Written) -> Entry<V> {
    let now = Instant::now();
    Entry::new(
        loaded.value,
        now,
        after(now, envelope::since(written.fresh_until, written.now_ms)),
        after(now, envelope::since(written.stale_until, written.now_ms)),
    )
    .read_from(loaded.read_from)
}

/// Records how the protocol went for a key in the `stampede.lock` span (for a group of many,
/// the last key's).
fn record(outcome: &'static str) {
    tracing::Span::current().record("outcome", outcome);
}

/// The places of the parts at a step.
fn at_step(parts: &[Part], at: impl Fn(&Step) -> bool) -> Vec<usize> {
    parts
        .iter()
        .enumerate()
        .filter(|(_, part)| at(&part.step))
        .map(|(place, _)| place)
        .collect()
}

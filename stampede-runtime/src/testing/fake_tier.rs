//! A fake shared tier with Redis's semantics, for the core's unit tests and the deterministic
//! simulation (`tests/simulation.rs`): an in-memory store that several caches, grouped in
//! "processes", share. Per key it keeps a value with its deadlines (and a fail-safe keep), a
//! lock with a lease that its holder renews while it loads, and a fence that every lock, write
//! and invalidation moves on (a write and an invalidation to at least its stamp): a fill is
//! written as `order::fill_lands` says, as Redis's `FILL` does. Invalidations are announced to
//! every process through its feed.
//!
//! Faults, each as the Redis tier meets it: the store down (every operation fails: loads run
//! locally, memory trusted only for the bound), stalls (every operation waits), lost messages
//! (no wake-up and no announcement), a process's feed cut (its announcements lost; the process
//! notices within the bound and drops its memory, as the heartbeat makes the Redis tier do) or
//! delayed, and lapsed leases (a paused holder does not renew its lock: another may take it).
//!
//! A store is one server, with several namespaces ([`Space`]: a database and a key prefix, as a
//! Redis connection selects them): each tier reaches one of them through its connection (named,
//! or the default one). Two namespaces share only the server: its faults, and its pub/sub (a
//! fill's wake-up reaches every waiter of the server, who reads again in its own namespace);
//! their values, locks, fences, tag sets and announced invalidations are apart, as Redis keeps
//! them apart for two databases or two prefixes, whatever the caches' names. Two connections to
//! one namespace share it.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::config::{self, Config};
use crate::entry::Entry;
use crate::error::Error;
use crate::kv::{Key, Value};
use crate::load::{Load, Loaded};
use crate::memory::Invalidation;
use crate::order;
use crate::registry::{self, AnyCache};
use crate::tier::{Batch, BatchLoad, Direct, Fetched, Group, Handle, Shared, Single, Tier};

/// The name a tier on the default connection shares its values through.
const DEFAULT_CONNECTION: &str = "default";

/// A namespace of a [`Store`]: the database and the key prefix a connection selects.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Space {
    /// The database number (`redis://host/2`).
    pub db: u8,
    /// The prefix of every key (`RedisConfig::prefix`).
    pub prefix: Arc<str>,
}

/// The store several fake tiers share: one server, with its namespaces.
pub struct Store<K, V> {
    state: Mutex<HashMap<Space, State<K, V>>>,
    filled: Notify,
    /// The store is down: every operation fails.
    pub fail: AtomicBool,
    /// Every message is lost: no wake-up, no announced invalidation.
    pub lose_messages: AtomicBool,
    /// Wake-ups are lost (waiters read again when the holder's lease would run out).
    pub lose_wakeups: AtomicBool,
    /// How long every operation waits.
    pub stall: Mutex<Duration>,
    /// While set, lock holders do not renew their leases (a paused process).
    pub lapse: AtomicBool,
    /// How long a lock is held without renewal.
    pub lease: Duration,
    /// How long after an invalidation it missed a process may still serve the old value: its
    /// memory is trusted no longer while its feed is down.
    pub bound: Duration,
    feeds: Mutex<Vec<Feed>>,
    /// Told of what detaches a process's running loads besides the calls it is asked to make
    /// (a simulation's oracle notes it).
    pub observer: Mutex<Option<Observer>>,
}

struct State<K, V> {
    values: HashMap<K, Stored<V>>,
    locks: HashMap<K, Lock>,
    fences: HashMap<K, u64>,
    /// Per tag, the keys loaded with it: added before their load reads the source, so that a
    /// tag's invalidation fences off a load running meanwhile (Redis's tag sets).
    tagged: HashMap<Box<str>, HashSet<K>>,
    /// The fence every key has at least: a clear's moment. In Redis every key a load reads
    /// has a fence (a read makes one), which a clear's `SCAN` finds and moves on; here a key
    /// read but not filled has none of its own.
    cleared: u64,
    next_token: u64,
    /// The origin of the store's clock: fences and reads compare in µs since it, as Redis's do
    /// on its `TIME` (`order`).
    epoch: Instant,
}

impl<K, V> Default for State<K, V> {
    fn default() -> Self {
        State {
            values: HashMap::new(),
            locks: HashMap::new(),
            fences: HashMap::new(),
            tagged: HashMap::new(),
            cleared: 0,
            next_token: 0,
            epoch: Instant::now(),
        }
    }
}

/// The store's lock, on one namespace's state.
struct InSpace<'a, K, V> {
    guard: MutexGuard<'a, HashMap<Space, State<K, V>>>,
    space: &'a Space,
}

impl<K, V> std::ops::Deref for InSpace<'_, K, V> {
    type Target = State<K, V>;

    fn deref(&self) -> &State<K, V> {
        &self.guard[self.space]
    }
}

impl<K, V> std::ops::DerefMut for InSpace<'_, K, V> {
    fn deref_mut(&mut self) -> &mut State<K, V> {
        self.guard
            .get_mut(self.space)
            .expect("made when the lock was taken")
    }
}

/// A value in the store, its deadlines on tokio's clock.
struct Stored<V> {
    value: V,
    filled_at: Instant,
    /// When its source was read (a prime's: when it was written): what orders it against a
    /// load's value, as the envelope's `read_at` does in Redis.
    read_at: Instant,
    fresh_until: Instant,
    stale_until: Instant,
    /// Kept past `stale_until` for `fail_safe`.
    kept_until: Instant,
    /// Expired (`expire`) since it was written: a fill orders over it as over nothing.
    expired: bool,
}

struct Lock {
    token: u64,
    until: Instant,
}

/// One process's invalidation feed, and its caches (each with its namespace and the name of its
/// connection). A fault of the feed is the process's link to the server: every connection of it.
#[derive(Default)]
struct Feed {
    caches: Vec<(Space, Option<Arc<str>>, &'static dyn AnyCache)>,
    /// Its announcements are lost.
    cut: bool,
    /// Since when they are (the last it heard was announced before): what it holds stays
    /// servable until the bound after that, as the Redis tier's feed vouches for its memory
    /// until the bound after the last heartbeat it heard.
    cut_since: Option<Instant>,
    /// It noticed the loss: memory is trusted only for the bound, until the feed is back.
    down: bool,
    /// Its announcements arrive this late.
    delay: Duration,
    /// It noticed its cut (`cut` since the time it takes to notice).
    cut_noticed: bool,
    /// It noticed its announcements (and so its heartbeats) arriving later than half the bound:
    /// the feed has gone quiet, as the Redis tier's heartbeat tells.
    late: bool,
    /// Nothing announced arrives before this: the feed is one connection, first in first out,
    /// so what was sent before a delay ended still holds back what is sent after it.
    clogged_until: Option<Instant>,
    /// What was announced while it was cut: the invalidation log's entries past its position,
    /// which it replays when its feed is back.
    missed: Vec<(Space, String, Told)>,
    /// The log no longer covers what it missed (trimmed past its position, or the server
    /// restarted empty): when its feed is back it drops its memory instead of replaying.
    gap: bool,
}

/// The connection a cache of the store is shared through.
fn through(connection: Option<&str>) -> &str {
    connection.unwrap_or(DEFAULT_CONNECTION)
}

/// A process's caches, as its feed reaches them.
struct Heard {
    observer: Observer,
    process: Process,
    caches: Vec<(Space, Option<Arc<str>>, &'static dyn AnyCache)>,
}

/// What the feed carries to the processes of caches named so.
#[derive(Clone, Debug)]
enum Told {
    /// An invalidation (`how`) of the key its `Debug` output writes so.
    Key(String, Invalidation),
    /// A clear of the cache.
    Clear,
}

impl Heard {
    /// What was `told` of the caches named `name` in `space` reaches the process (the loads it
    /// concerns detach).
    fn deliver(&self, space: &Space, name: &str, told: &Told) {
        // Which caches answer to `name` is the registry's rule, as for the real feed's.
        let named = registry::named(name);
        let mut caches = self
            .caches
            .iter()
            .filter(|(at, _, cache)| {
                at == space && named.iter().any(|other| std::ptr::addr_eq(*other, *cache))
            })
            .peekable();
        if caches.peek().is_none() {
            return;
        }
        let (process, space) = (self.process, space.clone());
        (self.observer)(match told {
            Told::Key(text, how) => Event::Announced {
                process,
                space,
                key: text.clone(),
                expired: *how == Invalidation::Expire,
            },
            Told::Clear => Event::Cleared { process, space },
        });
        for (_, _, cache) in caches {
            match told {
                Told::Key(text, how) => cache.forget_named(text, *how),
                Told::Clear => cache.clear_here(),
            }
        }
    }
}

/// A process, as the store knows it.
pub type Process = usize;

/// Who hears what the store tells ([`Event`]).
pub type Observer = Arc<dyn Fn(Event) + Send + Sync>;

/// What the store tells its observer.
#[derive(Clone, Debug)]
#[cfg_attr(not(feature = "simulation"), allow(dead_code))] // read by the simulation's observer
pub enum Event {
    /// A process's feed went down (its memory taken out of service) or came back (what it
    /// missed replayed from the log and the rest served again, or, when the log does not cover
    /// the gap, its memory dropped).
    Feed {
        /// Whose feed.
        process: Process,
        /// Down, or back up.
        down: bool,
    },
    /// A process heard an invalidation of a key announced (its loads of the key detach).
    Announced {
        /// The process.
        process: Process,
        /// The namespace of the key.
        space: Space,
        /// The key, as its `Debug` output writes it.
        key: String,
        /// Expired (`expire`), not dropped.
        expired: bool,
    },
    /// A process heard a cache's clear (every load of it detaches).
    Cleared {
        /// The process.
        process: Process,
        /// The namespace of the cache.
        space: Space,
    },
    /// A process dropped from the store a key it changed while the store was down, announcing
    /// it: a deferred invalidation.
    Cleaned {
        /// The process.
        process: Process,
        /// The namespace of the key.
        space: Space,
        /// The key, as its `Debug` output writes it.
        key: String,
    },
}

impl<K: Key, V: Value> Store<K, V> {
    /// An empty store, up, with a lease of 5 s and a bound of 2.25 s (the Redis tier's
    /// defaults).
    pub fn new() -> Arc<Self> {
        Store::with(Duration::from_secs(5), Duration::from_millis(2_250))
    }

    /// An empty store, up, with this lease and this bound.
    pub fn with(lease: Duration, bound: Duration) -> Arc<Self> {
        Arc::new(Store {
            state: Mutex::new(HashMap::new()),
            filled: Notify::new(),
            fail: AtomicBool::new(false),
            lose_messages: AtomicBool::new(false),
            lose_wakeups: AtomicBool::new(false),
            stall: Mutex::new(Duration::ZERO),
            lapse: AtomicBool::new(false),
            lease,
            bound,
            feeds: Mutex::new(Vec::new()),
            observer: Mutex::new(None),
        })
    }

    /// A new process, with a feed of its own.
    pub fn process(&self) -> Process {
        let mut feeds = lock(&self.feeds);
        feeds.push(Feed::default());
        feeds.len() - 1
    }

    /// Lists `cache` as one of `process`'s, on the default namespace through the default
    /// connection: it hears the invalidations announced to it.
    #[cfg(test)]
    pub(crate) fn attach(&self, process: Process, cache: &'static dyn AnyCache) {
        self.attach_in(process, Space::default(), None, cache);
    }

    /// Lists `cache` as one of `process`'s, on namespace `space` through `connection`: it hears
    /// the invalidations announced to its namespace.
    pub(crate) fn attach_in(
        &self,
        process: Process,
        space: Space,
        connection: Option<Arc<str>>,
        cache: &'static dyn AnyCache,
    ) {
        lock(&self.feeds)[process]
            .caches
            .push((space, connection, cache));
    }

    /// Puts an entry in the store, as another process's fill would.
    #[cfg(test)]
    pub(crate) fn put(&self, key: K, entry: Entry<V>) {
        let space = Space::default();
        let mut state = self.state(&space);
        state.stamp(&key, entry.filled_at());
        let stored = Stored {
            filled_at: entry.filled_at(),
            read_at: entry.filled_at(),
            fresh_until: entry.fresh_until(),
            stale_until: entry.stale_until(),
            kept_until: entry.stale_until(),
            value: entry.value,
            expired: false,
        };
        state.values.insert(key, stored);
    }

    /// The value the store holds for `key` in the default namespace, if any.
    pub fn value(&self, key: &K) -> Option<V> {
        self.state(&Space::default())
            .values
            .get(key)
            .map(|stored| stored.value.clone())
    }

    /// Takes the key's lock in the default namespace, as another process's flight would (held
    /// until its lease ends, and moving the key's fence on).
    pub fn lock(&self, key: K) {
        let space = Space::default();
        let mut state = self.state(&space);
        let token = state.token();
        let until = Instant::now() + self.lease;
        state.lock_fence(&key);
        state.locks.insert(key, Lock { token, until });
    }

    /// Removes the key's value from the default namespace without an announcement: an
    /// invalidation this process missed.
    pub fn drop_silently(&self, key: &K) {
        let space = Space::default();
        let mut state = self.state(&space);
        state.values.remove(key);
        state.stamp(key, Instant::now());
    }

    /// Drops every key loaded with `tag` (its value, and moves its fence on, so that a load of
    /// it that read its source before writes nothing), as a tag's invalidation does in Redis; the processes'
    /// memory hears of it through their tag marks. In every namespace, as
    /// `stampede::invalidate_tag` reaches every connection.
    #[cfg_attr(not(feature = "simulation"), allow(dead_code))] // the simulation's faults
    pub fn invalidate_tag(&self, tag: &str) {
        self.tagged_keys(tag, Invalidation::Drop);
    }

    /// Ends the freshness of every key loaded with `tag` (`expire_lua!` on each, its fence moved
    /// on as an invalidation's), as a tag's expiry does in Redis.
    #[cfg_attr(not(feature = "simulation"), allow(dead_code))] // the simulation's faults
    pub fn expire_tag(&self, tag: &str) {
        self.tagged_keys(tag, Invalidation::Expire);
    }

    fn tagged_keys(&self, tag: &str, how: Invalidation) {
        let now = Instant::now();
        for state in lock(&self.state).values_mut() {
            // The set keeps its members (Redis's `TAKE_TAGGED`): a load tagged before may read
            // its source after this, and write its value.
            let tagged = state.tagged.get(tag).cloned().unwrap_or_default();
            for key in tagged {
                match how {
                    Invalidation::Drop => {
                        state.values.remove(&key);
                    }
                    Invalidation::Expire => {
                        if let Some(stored) = state.values.get_mut(&key) {
                            stored.expire(now);
                        }
                    }
                }
                state.stamp(&key, now);
            }
        }
    }

    /// Cuts `process`'s feed for `lasting`: it notices after `noticed` (at most the bound), takes
    /// its memory out of service and trusts what it keeps for the bound only, until the feed is
    /// back, when it replays what it missed from the log, or drops its memory when `logged` is
    /// false (the log does not cover the gap).
    pub fn cut_feed(
        self: &Arc<Self>,
        process: Process,
        noticed: Duration,
        lasting: Duration,
        logged: bool,
    ) {
        {
            let mut feeds = lock(&self.feeds);
            let feed = &mut feeds[process];
            feed.cut = true;
            feed.cut_since.get_or_insert_with(Instant::now);
            feed.gap |= !logged;
        }
        let store = self.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            tokio::time::sleep(noticed.min(store.bound)).await;
            lock(&store.feeds)[process].cut_noticed = true;
            store.feed_changed(process);
            tokio::time::sleep_until(started + lasting.max(noticed)).await;
            let mut feeds = lock(&store.feeds);
            feeds[process].cut = false;
            feeds[process].cut_since = None;
            feeds[process].cut_noticed = false;
            drop(feeds);
            store.feed_changed(process);
        });
    }

    /// From now on `process`'s announcements arrive `delay` late (zero: at once), and never
    /// before those sent earlier (the feed is first in first out). When an announcement (a
    /// heartbeat) sent now arrives more than half the bound late, the process notices it within
    /// half the bound (the feed has gone quiet): its feed is down until what was sent while it
    /// lagged has arrived.
    #[cfg_attr(not(feature = "simulation"), allow(dead_code))] // the simulation's faults
    pub fn delay_feed(self: &Arc<Self>, process: Process, delay: Duration) {
        let now = Instant::now();
        let half = self.bound / 2;
        let (lag, clear_at) = {
            let mut feeds = lock(&self.feeds);
            let feed = &mut feeds[process];
            let before = std::mem::replace(&mut feed.delay, delay);
            if delay < before {
                // What was sent just before arrives `before` after it.
                let until = now + before;
                feed.clogged_until = Some(feed.clogged_until.map_or(until, |at| at.max(until)));
            }
            let clogged = feed.clogged_until.filter(|&at| at > now);
            let lag = clogged.map_or(delay, |at| delay.max(at - now));
            (lag, clogged.filter(|_| delay <= half))
        };
        if lag > half {
            let store = self.clone();
            tokio::spawn(async move {
                tokio::time::sleep(half).await;
                let now = Instant::now();
                let mut feeds = lock(&store.feeds);
                let feed = &mut feeds[process];
                // Unless it caught up meanwhile.
                if feed.delay > half || feed.clogged_until.is_some_and(|at| at > now) {
                    feed.late = true;
                }
                drop(feeds);
                store.feed_changed(process);
            });
        }
        if delay <= half {
            let store = self.clone();
            tokio::spawn(async move {
                if let Some(at) = clear_at {
                    tokio::time::sleep_until(at).await;
                }
                let now = Instant::now();
                let mut feeds = lock(&store.feeds);
                let feed = &mut feeds[process];
                // Unless it lags again.
                if feed.delay <= half && feed.clogged_until.is_none_or(|at| at <= now) {
                    feed.late = false;
                }
                drop(feeds);
                store.feed_changed(process);
            });
        }
    }

    /// The store is down for `lasting`: every operation fails, and every feed is cut (each
    /// process notices after `noticed`).
    #[cfg_attr(not(feature = "simulation"), allow(dead_code))] // the simulation's faults
    pub fn outage(self: &Arc<Self>, noticed: Duration, lasting: Duration, logged: bool) {
        self.fail.store(true, Ordering::SeqCst);
        let processes = lock(&self.feeds).len();
        for process in 0..processes {
            self.cut_feed(process, noticed, lasting, logged);
        }
        let store = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(lasting).await;
            store.fail.store(false, Ordering::SeqCst);
        });
    }

    /// A new runtime in every process (after the simulation dropped the last one, with the
    /// tasks that cut feeds and ended outages): the store is up, every feed is live again, and
    /// each process drops its memory (its first session is a recovery).
    #[cfg_attr(not(feature = "simulation"), allow(dead_code))] // the simulation's faults
    pub fn restart(&self) {
        self.fail.store(false, Ordering::SeqCst);
        self.lapse.store(false, Ordering::SeqCst);
        self.lose_wakeups.store(false, Ordering::SeqCst);
        *lock(&self.stall) = Duration::ZERO;
        let processes = lock(&self.feeds).len();
        for process in 0..processes {
            let mut feeds = lock(&self.feeds);
            feeds[process].cut = false;
            feeds[process].cut_since = None;
            feeds[process].cut_noticed = false;
            feeds[process].late = false;
            feeds[process].clogged_until = None;
            feeds[process].delay = Duration::ZERO;
            // Its position was of the runtime that is gone: the new one cannot replay.
            feeds[process].gap = true;
            drop(feeds);
            self.feed_down(process, false);
        }
    }

    /// How long `process` may trust what it keeps now.
    fn trusted_for(&self, process: Process) -> Option<Duration> {
        lock(&self.feeds)[process].down.then_some(self.bound)
    }

    /// The feed is down while a cut or a late delivery is noticed: when that changes, as
    /// [`Store::feed_down`].
    fn feed_changed(&self, process: Process) {
        let (was, now) = {
            let feeds = lock(&self.feeds);
            let feed = &feeds[process];
            (feed.down, feed.cut_noticed || feed.late)
        };
        if was != now {
            self.feed_down(process, now);
        }
    }

    fn feed_down(&self, process: Process, down: bool) {
        self.tell(Event::Feed { process, down });
        let (caches, missed, gap, until) = {
            let mut feeds = lock(&self.feeds);
            let feed = &mut feeds[process];
            feed.down = down;
            // A cut is noticed up to the bound after it began, and what was heard before it vouches
            // until then. A delayed or late feed heard its last announcement earlier than the
            // cut (what was sent before it may still be in flight): it vouches for nothing past
            // now, as the Redis tier's deadline (the last heartbeat heard plus the bound) has
            // passed when a late feed is noticed.
            let now = Instant::now();
            let delayed =
                feed.late || !feed.delay.is_zero() || feed.clogged_until.is_some_and(|at| at > now);
            let until = match (feed.cut_since, delayed) {
                (Some(since), false) => since + self.bound,
                _ => now,
            };
            let (missed, gap) = match down {
                true => (Vec::new(), false),
                false => (
                    std::mem::take(&mut feed.missed),
                    std::mem::take(&mut feed.gap),
                ),
            };
            (feed.caches.clone(), missed, gap, until)
        };
        // Each connection's caches, as the Redis tier suspends them when that connection's
        // subscription is lost, and replays its log or drops them when it is back.
        if down {
            for (_, connection, cache) in &caches {
                cache.suspend_shared(Some(through(connection.as_deref())), until);
            }
            return;
        }
        if gap {
            for (_, connection, cache) in &caches {
                cache.forget_all_shared(Some(through(connection.as_deref())));
            }
            return;
        }
        let heard = Heard {
            observer: self.observer_handle(),
            process,
            caches,
        };
        for (space, name, told) in missed {
            heard.deliver(&space, &name, &told);
        }
        let caches = heard.caches;
        for (_, connection, cache) in &caches {
            cache.resume_shared(Some(through(connection.as_deref())));
        }
    }

    /// Announces an invalidation (`how`) of the key named `text` in the caches called `name` on
    /// namespace `space`, to every process through its feed.
    fn announce(&self, space: &Space, name: &str, text: String, how: Invalidation) {
        self.tell_feeds(space, name, Told::Key(text, how));
    }

    /// Announces a clear of the caches called `name` on namespace `space`.
    fn announce_clear(&self, space: &Space, name: &str) {
        self.tell_feeds(space, name, Told::Clear);
    }

    fn tell_feeds(&self, space: &Space, name: &str, told: Told) {
        if self.lose_messages.load(Ordering::SeqCst) {
            return;
        }
        let now = Instant::now();
        let mut feeds = lock(&self.feeds);
        for feed in feeds.iter_mut().filter(|feed| feed.cut) {
            feed.missed
                .push((space.clone(), name.to_owned(), told.clone()));
        }
        for (process, feed) in feeds.iter_mut().enumerate().filter(|(_, feed)| !feed.cut) {
            // First in first out: not before what was sent earlier.
            let at = feed
                .clogged_until
                .map_or(now + feed.delay, |at| at.max(now + feed.delay));
            if at > now {
                feed.clogged_until = Some(at);
            }
            let heard = Heard {
                observer: self.observer_handle(),
                process,
                caches: feed.caches.clone(),
            };
            let (space, name, told) = (space.clone(), name.to_owned(), told.clone());
            if at <= now {
                heard.deliver(&space, &name, &told);
            } else {
                tokio::spawn(async move {
                    tokio::time::sleep_until(at).await;
                    heard.deliver(&space, &name, &told);
                });
            }
        }
    }

    fn tell(&self, event: Event) {
        self.observer_handle()(event);
    }

    /// The observer, or one that hears nothing.
    fn observer_handle(&self) -> Observer {
        lock(&self.observer)
            .clone()
            .unwrap_or_else(|| Arc::new(|_| {}))
    }

    /// The state of namespace `space`, locked.
    fn state<'a>(&'a self, space: &'a Space) -> InSpace<'a, K, V> {
        let mut guard = lock(&self.state);
        guard.entry(space.clone()).or_default();
        InSpace { guard, space }
    }

    async fn stall(&self) {
        let stall = *lock(&self.stall);
        if !stall.is_zero() {
            tokio::time::sleep(stall).await;
        }
    }

    fn down(&self) -> bool {
        self.fail.load(Ordering::SeqCst)
    }

    fn wake(&self) {
        if !self.lose_messages.load(Ordering::SeqCst) && !self.lose_wakeups.load(Ordering::SeqCst) {
            self.filled.notify_waiters();
        }
    }
}

impl<K: Key, V: Value> State<K, V> {
    /// The entry the store keeps for the flight's key, if it has a newer source version than
    /// `value` (the check of Redis's `FILL`).
    fn newer<L: Load<K, V>>(&self, handle: &Handle<'_, K, V, L>, value: &V) -> Option<Entry<V>> {
        let ours = handle.source_version(value)?;
        let stored = self
            .values
            .get(handle.key())
            .filter(|stored| stored.kept(Instant::now()))?;
        (handle.source_version(&stored.value)? > ours).then(|| stored.entry())
    }
}

impl<K: Key, V> State<K, V> {
    /// Adds the flight's key to its tags' sets: before its load reads the source, so that a
    /// tag's invalidation fences off a load running meanwhile.
    fn tag<L>(&mut self, handle: &Handle<'_, K, V, L>)
    where
        V: Value,
        L: Load<K, V>,
    {
        for tag in handle.tags() {
            self.tagged
                .entry(tag.clone())
                .or_default()
                .insert(handle.key().clone());
        }
    }

    fn token(&mut self) -> u64 {
        self.next_token += 1;
        self.next_token
    }

    fn fence(&self, key: &K) -> u64 {
        self.fences.get(key).copied().unwrap_or(0).max(self.cleared)
    }

    /// Takes the key's lock's turn of its fence: moved on by one.
    fn lock_fence(&mut self, key: &K) -> u64 {
        let moved = self.fence(key) + 1;
        self.fences.insert(key.clone(), moved);
        moved
    }

    /// Moves the key's fence on past a write or an invalidation at `at` (a fill's: when its
    /// source was read): `order::moved_fence`, as `FILL` and `INVALIDATE` move it.
    fn stamp(&mut self, key: &K, at: Instant) {
        let stamp = self.micros(at);
        let moved = order::moved_fence(self.fence(key), stamp);
        self.fences.insert(key.clone(), moved);
    }

    /// `at` on the store's clock, in µs.
    fn micros(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_micros()).unwrap_or(u64::MAX)
    }
}

/// Whether a load's value whose source was read at `read_from` lands (see `order::fill_lands`,
/// which `FILL` mirrors).
fn lands<K: Key, V: Clone>(
    state: &State<K, V>,
    key: &K,
    fence: u64,
    read_from: Instant,
) -> order::Landing {
    let now = Instant::now();
    let stored = state.values.get(key).filter(|stored| stored.kept(now));
    order::fill_lands(
        state.fence(key) == fence,
        state.fence(key),
        stored.map(|s| (state.micros(s.read_at), s.expired)),
        state.micros(read_from),
    )
}

impl<V: Clone> Stored<V> {
    /// Whether it is still in the store (Redis's key has not expired).
    fn kept(&self, now: Instant) -> bool {
        now < self.kept_until
    }

    /// No longer fresh from `now` on, stale for its stale window at most (`expire_lua!`): its
    /// time to live stays.
    fn expire(&mut self, now: Instant) {
        let window = self.stale_until.saturating_duration_since(self.fresh_until);
        self.fresh_until = self.fresh_until.min(now);
        self.stale_until = self.stale_until.min(crate::clock::after(now, window));
        self.expired = true;
    }

    fn entry(&self) -> Entry<V> {
        Entry::new(
            self.value.clone(),
            self.filled_at,
            self.fresh_until,
            self.stale_until,
        )
        .read_from(self.read_at)
    }
}

/// One process's tier over a shared [`Store`].
pub struct Fake<K, V> {
    /// The store it shares.
    pub store: Arc<Store<K, V>>,
    /// The process it is the tier of.
    pub process: Process,
    /// The namespace of the store its connection selects.
    pub space: Space,
    /// The name of its connection (`None`: the default one).
    pub connection: Option<Arc<str>>,
    /// How long a flight waits for another's fill before loading itself.
    pub lock_wait: Duration,
    /// While another process holds the lock, report it busy instead of waiting (as
    /// `busy = "error"` does), unless a stale value was served.
    pub busy_error: bool,
    /// While another process holds the lock, load here at once without it, fenced (as
    /// `busy = "compute"` does).
    pub busy_compute: bool,
    /// How long this process trusts what it keeps, whatever its feed says (a test's override).
    pub trusted_for: Option<Duration>,
    /// The keys this process changed while the store was down, each with whether it
    /// invalidated it (else it stored a value the store does not have): the store drops them
    /// before this process reads them there again (the Redis tier's `dirty`).
    dirty: Mutex<HashMap<K, bool>>,
}

/// The tier of a new process over `store`.
pub fn tier<K: Key, V: Value>(store: &Arc<Store<K, V>>) -> Fake<K, V> {
    tier_of(store, store.process())
}

/// The tier of `process` over `store`.
pub fn tier_of<K: Key, V: Value>(store: &Arc<Store<K, V>>, process: Process) -> Fake<K, V> {
    Fake {
        store: store.clone(),
        process,
        space: Space::default(),
        connection: None,
        lock_wait: Duration::from_secs(5),
        busy_error: false,
        busy_compute: false,
        trusted_for: None,
        dirty: Mutex::new(HashMap::new()),
    }
}

/// What a read of the key decided.
enum Next<V> {
    /// Answered: a fresh value read from the store, or the lock busy (`busy = "error"`).
    Done(Fetched<V>),
    /// This flight loads, holding the lock with this token (or without it), at this fence.
    Hold(Option<u64>, u64),
    /// Another holds the lock, for this much longer.
    Wait(Duration),
}

/// What a fill decided.
enum Filled<V> {
    /// The key's outcome, with the store written (or the fill refused, or the load failed).
    Stored(Fetched<V>),
    /// The store went down meanwhile: the value is good, kept in this process only.
    Here(Loaded<V>),
}

impl<K: Key, V: Value> Tier<K, V> for Fake<K, V> {
    /// The key's flight as a group of one (see `fetch_group`), as the Redis tier's.
    async fn fetch<L: Load<K, V>>(&self, handle: &Handle<'_, K, V, L>) -> Fetched<V> {
        let single = Single::new(handle);
        self.fetch_group(&single).await;
        single.outcome()
    }

    async fn fetch_many<L: BatchLoad<K, V>>(&self, batch: &Batch<'_, K, V, L>) {
        self.fetch_group(batch).await
    }

    async fn prime<L: Load<K, V>>(
        &self,
        handle: &Handle<'_, K, V, L>,
        value: V,
    ) -> Result<(), Error> {
        self.store.stall().await;
        if self.store.down() {
            handle.keep_loaded(Loaded::now(value), self.trusted());
            self.changed_while_down(handle.key(), false);
            return Err(Error::invalid_config("the fake store is down"));
        }
        self.clean(handle.key(), &handle.config().name);
        let mut state = self.state();
        if let Some(newer) = state.newer(handle, &value) {
            // Memory keeps the newer value, never what it held before the prime.
            handle.older_than_stored();
            drop(state);
            match newer.servable(Instant::now()) {
                true => drop(handle.keep(self.shared(newer))),
                false => handle.forget(),
            }
            return Ok(());
        }
        state.stamp(handle.key(), Instant::now());
        state.tag(handle);
        let stored = self.stored(handle, value, Instant::now());
        let entry = stored.entry();
        state.values.insert(handle.key().clone(), stored);
        drop(state);
        handle.keep(self.shared(entry));
        self.store.wake();
        Ok(())
    }

    async fn invalidate(
        &self,
        _: &Config,
        name: &str,
        key: &K,
        how: Invalidation,
    ) -> Result<bool, Error> {
        self.store.stall().await;
        if self.store.down() {
            // An expiry is cleaned up as an invalidation, as the Redis tier does.
            self.changed_while_down(key, true);
            return Err(Error::invalid_config("the fake store is down"));
        }
        // Dropped, the key needs no cleaning; expired, a value this process served while the
        // store was down (newer than the one expired) still has the stored one dropped, as the
        // Redis tier's cleaning does.
        if how == Invalidation::Drop {
            lock(&self.dirty).remove(key);
        }
        let now = Instant::now();
        let mut state = self.state();
        let held = match how {
            Invalidation::Drop => state.values.remove(key).is_some(),
            Invalidation::Expire => state
                .values
                .get_mut(key)
                .filter(|stored| stored.kept(now))
                .map(|stored| stored.expire(now))
                .is_some(),
        };
        state.stamp(key, now);
        drop(state);
        self.store
            .announce(&self.space, name, format!("{key:?}"), how);
        Ok(held)
    }

    async fn clear(&self, _: &Config, name: &str) -> Result<(), Error> {
        self.store.stall().await;
        if self.store.down() {
            return Err(Error::invalid_config("the fake store is down"));
        }
        let now = Instant::now();
        let mut state = self.state();
        let keys: Vec<K> = (state.values.keys())
            .chain(state.fences.keys())
            .chain(state.locks.keys())
            .cloned()
            .collect();
        state.values.clear();
        for key in keys {
            state.stamp(&key, now);
        }
        // Every other key's fence, as the keys a load has read are found in Redis.
        state.cleared = order::moved_fence(state.cleared, state.micros(now));
        drop(state);
        self.store.announce_clear(&self.space, name);
        Ok(())
    }

    fn reads(&self) -> bool {
        true
    }

    const SHARES: bool = true;

    fn shared_through(&self) -> Option<&str> {
        Some(self.connection.as_deref().unwrap_or(DEFAULT_CONNECTION))
    }

    fn trusted_for(&self) -> Option<Duration> {
        self.trusted()
    }

    async fn read(&self, direct: &Direct<'_, K, V>) -> Option<Shared<V>> {
        self.store.stall().await;
        self.read_now(direct)
    }

    /// One operation for every key, as the Redis tier's batch read.
    async fn read_many(&self, directs: &[Direct<'_, K, V>]) -> Vec<Option<Shared<V>>> {
        self.store.stall().await;
        directs.iter().map(|direct| self.read_now(direct)).collect()
    }

    fn key_name(&self) -> Option<fn(&K) -> Option<String>> {
        Some(|key| Some(format!("{key:?}")))
    }
}

impl<K: Key, V: Value> Fake<K, V> {
    /// The flow of a group of keys (a batch, or one key's flight), each step once for all the
    /// keys at it (as the Redis tier's flow: one read of every key, one load of those this
    /// process holds or loads without the lock, one fill; the keys another process holds are
    /// waited for, then read again).
    async fn fetch_group<G: Group<K, V>>(&self, group: &G) {
        let store = &self.store;

        let handles = group.handles();
        let give_up_at = Instant::now() + self.lock_wait;
        let mut served = vec![false; handles.len()];
        let mut pending: Vec<usize> = (0..handles.len()).collect();
        while !pending.is_empty() {
            store.stall().await;
            if store.down() {
                self.degraded_many(group, &pending).await;
                break;
            }
            for &at in &pending {
                self.clean(handles[at].key(), &handles[at].config().name);
            }
            let notified = store.filled.notified();
            tokio::pin!(notified);
            let (mut holding, mut busy, mut lease_left) = (Vec::new(), Vec::new(), Duration::MAX);
            {
                let mut state = self.state();
                for &at in &pending {
                    match self.decide(&handles[at], &mut state, &mut served[at]) {
                        Next::Done(fetched) => group.report(at, fetched),
                        Next::Hold(token, fence) => holding.push((at, token, fence)),
                        Next::Wait(left) => {
                            busy.push(at);
                            lease_left = lease_left.min(left);
                        }
                    }
                }
                if !busy.is_empty() {
                    // Registered before the lock is let go: a fill after this wakes it.
                    notified.as_mut().enable();
                }
            }
            pending = busy;
            if !holding.is_empty() {
                self.hold_many(group, &holding).await;
                // The keys another process holds are read again.
                continue;
            }
            if pending.is_empty() {
                break;
            }
            let now = Instant::now();
            if now >= give_up_at {
                let held: Vec<(usize, Option<u64>, u64)> = {
                    let state = self.state();
                    pending
                        .iter()
                        .map(|&at| (at, None, state.fence(handles[at].key())))
                        .collect()
                };
                self.hold_many(group, &held).await;
                break;
            }
            let until = give_up_at.min(now + lease_left + Duration::from_millis(1));
            let _ = tokio::time::timeout_at(until, notified).await;
        }
    }

    /// Loads the keys at `indices` of a group here, with one load, while the store is down;
    /// each is dropped from the store before this process reads it there again.
    async fn degraded_many<G: Group<K, V>>(&self, group: &G, indices: &[usize]) {
        let trusted = self.trusted();
        let loaded = group.load(indices).await;
        for (&at, loaded) in indices.iter().zip(loaded) {
            group.report(at, self.loaded_here(&group.handles()[at], loaded, trusted));
        }
    }

    /// A load made while the store was down: kept here for `trusted`, the key dropped from the
    /// store before this process reads it there again.
    fn loaded_here<L: Load<K, V>>(
        &self,
        handle: &Handle<'_, K, V, L>,
        loaded: Result<Loaded<V>, Error>,
        trusted: Option<Duration>,
    ) -> Fetched<V> {
        match loaded {
            Ok(loaded) => {
                let value = handle.keep_loaded(loaded, trusted);
                self.changed_while_down(handle.key(), false);
                Fetched::Loaded(value)
            }
            Err(error) => Fetched::Failed(error),
        }
    }

    /// What a read of the key (under the store's lock) decides: its fresh value; else a stale
    /// one is handed to the waiters (once: `served`) or a last good one offered, and the flight
    /// takes the lock, loads without it, waits for its holder, or is told it is busy.
    fn decide<L: Load<K, V>>(
        &self,
        handle: &Handle<'_, K, V, L>,
        state: &mut State<K, V>,
        served: &mut bool,
    ) -> Next<V> {
        let store = &self.store;
        let now = Instant::now();
        match state
            .values
            .get(handle.key())
            .filter(|stored| stored.kept(now))
        {
            Some(stored) => {
                let refreshes = handle
                    .replacing()
                    .is_some_and(|old| stored.filled_at <= old);
                if now < stored.fresh_until && !refreshes {
                    return Next::Done(Fetched::Read(handle.keep(self.shared(stored.entry()))));
                }
                if now < stored.stale_until && !*served {
                    *served = handle.serve(self.shared(stored.entry()));
                } else if now >= stored.stale_until {
                    handle.last_good(self.shared(stored.entry()));
                }
            }
            None => handle.no_last_good(),
        }
        let held = state
            .locks
            .get(handle.key())
            .filter(|held| held.until > now);
        match held {
            // No Redis lock (`READ_OR_LOCK` without a token): loaded without one, and fenced by
            // its fill, which moves the fence on.
            _ if handle.config().lock != config::Lock::Redis => {
                Next::Hold(None, state.fence(handle.key()))
            }
            None => {
                let token = state.token();
                let until = now + store.lease;
                state
                    .locks
                    .insert(handle.key().clone(), Lock { token, until });
                Next::Hold(Some(token), state.lock_fence(handle.key()))
            }
            Some(_) if self.busy_error && !*served => Next::Done(Fetched::Busy),
            Some(_) if self.busy_compute => Next::Hold(None, state.fence(handle.key())),
            Some(held) => Next::Wait(held.until - now),
        }
    }

    /// This process invalidated `key` (`invalidated`), or stored a value of it that the store
    /// does not have, while the store was down. An invalidation stays one.
    fn changed_while_down(&self, key: &K, invalidated: bool) {
        *lock(&self.dirty).entry(key.clone()).or_default() |= invalidated;
    }

    /// Drops `key` from the store if this process changed it while the store was down, and
    /// announces it if it invalidated it or the store held a value (the Redis tier's
    /// `Change`: a stored value is announced only over an older one).
    fn clean(&self, key: &K, name: &str) {
        let Some(invalidated) = lock(&self.dirty).remove(key) else {
            return;
        };
        let mut state = self.state();
        let held = state.values.remove(key).is_some();
        state.stamp(key, Instant::now());
        drop(state);
        if !invalidated && !held {
            return;
        }
        let text = format!("{key:?}");
        self.store.tell(Event::Cleaned {
            process: self.process,
            space: self.space.clone(),
            key: text.clone(),
        });
        self.store
            .announce(&self.space, name, text, Invalidation::Drop);
    }

    /// The state of its namespace, locked.
    fn state(&self) -> InSpace<'_, K, V> {
        self.store.state(&self.space)
    }

    fn trusted(&self) -> Option<Duration> {
        self.trusted_for
            .or_else(|| self.store.trusted_for(self.process))
    }

    fn shared(&self, entry: Entry<V>) -> Shared<V> {
        Shared::new(entry, self.trusted())
    }

    /// A value written now, its source read at `read_at`, as the store keeps it: for its
    /// lifetime (`Handle::lifetime`).
    fn stored<L>(&self, handle: &Handle<'_, K, V, L>, value: V, read_at: Instant) -> Stored<V>
    where
        L: Load<K, V>,
    {
        let lifetime = handle.lifetime(&value);
        let now = Instant::now();
        let fresh_until = crate::clock::after(now, lifetime.fresh);
        let stale_until = crate::clock::after(fresh_until, lifetime.stale);
        Stored {
            value,
            filled_at: now,
            read_at: read_at.min(now),
            fresh_until,
            stale_until,
            kept_until: crate::clock::after(stale_until, lifetime.fail_safe),
            expired: false,
        }
    }

    /// Loads the keys of a group at `held` (each with the token it holds its lock with, or
    /// `None` without the lock, and its fence) with one load, renewing the leases while it runs
    /// (unless leases lapse), then fills each (see `fill`) and wakes the waiters.
    async fn hold_many<G: Group<K, V>>(&self, group: &G, held: &[(usize, Option<u64>, u64)]) {
        let handles = group.handles();
        {
            let mut state = self.state();
            for &(at, ..) in held {
                state.tag(&handles[at]);
            }
        }
        let indices: Vec<usize> = held.iter().map(|&(at, ..)| at).collect();
        let locks: Vec<(&K, Option<u64>)> = held
            .iter()
            .map(|&(at, token, _)| (handles[at].key(), token))
            .collect();
        let loaded = self.renewing(&locks, group.load(&indices)).await;
        self.store.stall().await;
        let (mut here, mut wake) = (Vec::new(), false);
        {
            let mut state = self.state();
            for (&(at, token, fence), loaded) in held.iter().zip(loaded) {
                match self.fill(&mut state, &handles[at], (token, fence), loaded) {
                    Filled::Stored(fetched) => {
                        group.report(at, fetched);
                        wake = true;
                    }
                    Filled::Here(value) => here.push((at, value)),
                }
            }
        }
        for (at, value) in here {
            group.report(at, self.kept_here(&handles[at], value));
        }
        if wake {
            self.store.wake();
        }
    }

    /// Runs `work` while renewing the leases of the locks `held` (a key with the token it holds
    /// its lock with; `None`: without the lock), unless leases lapse.
    async fn renewing<F: Future>(&self, held: &[(&K, Option<u64>)], work: F) -> F::Output {
        let store = &self.store;
        let renew = async {
            loop {
                tokio::time::sleep(store.lease / 3).await;
                let mut state = self.state();
                if store.lapse.load(Ordering::SeqCst) {
                    continue;
                }
                for &(key, token) in held {
                    if let Some(lock) = state.locks.get_mut(key)
                        && Some(lock.token) == token
                    {
                        lock.until = Instant::now() + store.lease;
                    }
                }
            }
        };
        tokio::select! {
            biased;
            output = work => output,
            () = renew => unreachable!("the renewals loop until the load ends"),
        }
    }

    /// After a load: releases the key's lock if `token` still holds it, and writes the value if
    /// `order::fill_lands` lets it (the load read `fence`) and the store holds no newer source
    /// version (Redis's `FILL`); refused, its callers get what the store holds. `(token,
    /// fence)`: the lock the load held, if any, and the fence it read.
    fn fill<L: Load<K, V>>(
        &self,
        state: &mut State<K, V>,
        handle: &Handle<'_, K, V, L>,
        (token, fence): (Option<u64>, u64),
        loaded: Result<Loaded<V>, Error>,
    ) -> Filled<V> {
        if state
            .locks
            .get(handle.key())
            .is_some_and(|held| Some(held.token) == token)
        {
            state.locks.remove(handle.key());
        }
        let newer = match &loaded {
            Ok(loaded) => state.newer(handle, &loaded.value),
            Err(_) => None,
        };
        let landing = match &loaded {
            Ok(loaded) => lands(state, handle.key(), fence, loaded.read_from),
            Err(_) => order::Landing::Refused,
        };
        Filled::Stored(match (loaded, newer) {
            (Err(error), _) => Fetched::Failed(error),
            // The store went down meanwhile: the value is good, kept here.
            (Ok(loaded), _) if self.store.down() => return Filled::Here(loaded),
            (Ok(Loaded { value, read_from }), None) if landing != order::Landing::Refused => {
                state.stamp(handle.key(), read_from.min(Instant::now()));
                let mut stored = self.stored(handle, value, read_from);
                if landing == order::Landing::Expired {
                    stored.expire(Instant::now());
                }
                let entry = stored.entry();
                state.values.insert(handle.key().clone(), stored);
                Fetched::Loaded(handle.keep(self.shared(entry)))
            }
            // Refused, as `FILL` refuses: the store holds a newer source version or a value that
            // may be newer, or nothing and the fence moved past the load's read (an invalidation
            // or a write since). Its callers get what the store keeps, if servable.
            (Ok(loaded), newer) => {
                let now = Instant::now();
                if newer.is_some() {
                    handle.older_than_stored();
                }
                let stored = state
                    .values
                    .get(handle.key())
                    .filter(|stored| stored.kept(now))
                    .map(Stored::entry)
                    .filter(|entry| entry.servable(now));
                match stored {
                    Some(entry) => Fetched::Loaded(handle.keep(self.shared(entry))),
                    None => Fetched::Loaded(handle.fenced_off(loaded, self.trusted())),
                }
            }
        })
    }

    /// A value loaded while the store went down: kept here, the key dropped from the store
    /// before this process reads it there again.
    fn kept_here<L: Load<K, V>>(
        &self,
        handle: &Handle<'_, K, V, L>,
        loaded: Loaded<V>,
    ) -> Fetched<V> {
        self.changed_while_down(handle.key(), false);
        Fetched::Loaded(handle.keep_loaded(loaded, self.trusted()))
    }

    /// The fresh value the store holds for the key, read without a lock ([`Tier::read`]).
    fn read_now(&self, direct: &Direct<'_, K, V>) -> Option<Shared<V>> {
        if self.store.down() || lock(&self.dirty).contains_key(direct.key()) {
            return None;
        }
        let state = self.state();
        let stored = state.values.get(direct.key())?;
        (Instant::now() < stored.fresh_until).then(|| self.shared(stored.entry()))
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

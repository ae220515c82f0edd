//! The state of one cache that its tier is lent for a flight: its options, its memory tier, its
//! loads in flight, its counters, its breaker and how its keys' tags are rendered; and a
//! flight's hold on its key ([`Begun`]). Below `tier`, which lends it, and `cache`, which owns
//! it: this module depends only on the leaves.

use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use tokio::time::Instant;

use crate::breaker::Breaker;
use crate::clock::{Nanos, after};
use crate::config::{Config, Lifetime};
use crate::entry::{Entry, Freshness, jittered_ttl};
use crate::flight::Flights;
use crate::hot::HotKeys;
use crate::kv::{Key, Value};
use crate::limit::Limit;
use crate::load::Loaded;
use crate::memory::{Kept, Loading, Memory, Shape, lean};
use crate::order::Stays;
use crate::tags::Stamp;
use crate::telemetry::{Labels, Telemetry};

/// The tags of a key, rendered from it (`#[cached(tags = [..])]`); `None` for an untagged cache.
pub type Tags<K> = Option<fn(&K) -> Vec<String>>;

/// The tags of a cache whose keys render them with `render`.
pub fn tagged<K>(render: fn(&K) -> Vec<String>) -> Tags<K> {
    Some(render)
}

/// What the attribute says of a cache's values beyond their type.
pub struct Values<V> {
    /// `source_version = "path"`: the version of the source each value was read at (a row
    /// version, an `updated_at`). A value of an older version never replaces one of a newer
    /// version, in memory or in the shared tier. A value without one (`None`: a key a batch
    /// function's map left out) is unversioned: it replaces any value, and any value replaces
    /// it, as a fill without the option does.
    pub source_version: Option<fn(&V) -> Option<u64>>,
}

impl<V> Clone for Values<V> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<V> Copy for Values<V> {}

impl<V> Values<V> {
    /// The values of a cache the attribute says nothing more of.
    pub const NONE: Values<V> = Values {
        source_version: None,
    };
}

/// Whether a cache with these options and tags (`tagged`) keeps its entries in the lean form:
/// what a cached function's recipe decides when it is compiled ([`lean`]).
pub(crate) fn lean_for(config: &Config, tagged: bool) -> bool {
    lean(
        tagged,
        config.refresh_after.is_some(),
        config.xfetch.is_some(),
        config.fail_safe.is_some(),
    )
}

/// What every tier's flights use of a cache. A tier reaches it only through the handle it is
/// lent (`tier::Handle`, `tier::Direct`).
pub(crate) struct Core<K: Key, V: Value> {
    /// The options as the attribute built them: what shapes the cache (its name, backend,
    /// lock, which options are on) never changes; the numbers a fill or a load reads are
    /// [`Core::options`]'.
    pub(crate) config: Config,
    /// The options now: the attribute's with those set at run time (`stampede::configure`).
    options: RwLock<Arc<Config>>,
    pub(crate) memory: Memory<K, V>,
    pub(crate) flights: Flights<K, V>,
    pub(crate) telemetry: Telemetry,
    pub(crate) hot: HotKeys<K>,
    /// The upstream circuit breaker, with `breaker = N`.
    pub(crate) breaker: Option<Breaker>,
    /// The cap on concurrent loads, with `max_loads = N`.
    pub(crate) limit: Option<Limit>,
    /// How a key's tags are rendered, for a cache with `tags`.
    pub(crate) tags: Tags<K>,
    pub(crate) values: Values<V>,
}

impl<K: Key, V: Value> Core<K, V> {
    /// The core of a cache with these options, tags and values, its entries kept as `E`;
    /// `key_name`: how its tier names a key to other processes, when it does.
    pub(crate) fn new<E: Shape<V>>(
        config: Config,
        tags: Tags<K>,
        values: Values<V>,
        key_name: Option<fn(&K) -> Option<String>>,
    ) -> Self {
        let options = crate::tuning::options_of(&config);
        if tags.is_some() {
            crate::tags::keep_marks_for(options.longest_use().max(config.longest_use()));
        }
        Core {
            memory: Memory::new::<E>(config.capacity, key_name, values.source_version),
            breaker: config.breaker.map(|threshold| {
                let open = metrics::gauge!("cache_breaker_open", Labels::new(&config).cache());
                Breaker::new(threshold, config.breaker_cooldown, open)
            }),
            telemetry: Telemetry::new(&config),
            limit: Limit::of(&config),
            options: RwLock::new(Arc::new(options)),
            config,
            flights: Flights::new(),
            hot: HotKeys::new(),
            tags,
            values,
        }
    }

    /// The options a fill or a load reads now: the attribute's, with those set at run time.
    pub(crate) fn options(&self) -> Arc<Config> {
        self.options
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// New fills and loads run with `options` (the attribute's with run-time overrides, checked
    /// already). Tag marks are kept as long as the longest a value may now live.
    pub(crate) fn retune(&self, options: Config) {
        if self.tags.is_some() {
            crate::tags::keep_marks_for(options.longest_use());
        }
        *self.options.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(options);
    }

    /// How `entry` may be served at `now`: `Early` (a refresh is due) only past `refresh_after`
    /// or, with `xfetch`, when this read's draw says so.
    pub(crate) fn freshness(&self, entry: &Entry<V>, now: Instant) -> Freshness {
        match entry.freshness(now) {
            Freshness::Early if self.config.xfetch.is_some() && !entry.xfetch_due(now) => {
                Freshness::Fresh
            }
            freshness => freshness,
        }
    }

    /// Counts a hit of `key`, whose value was loaded at `filled` (read for one hit in
    /// [`SAMPLE_EVERY`](crate::hot::SAMPLE_EVERY) of a thread's, for the hot keys' sample).
    #[inline(always)]
    pub(crate) fn hit(&self, key: &K, filled: impl FnOnce() -> Nanos) {
        let hit = self.telemetry.hits.bump();
        self.hot.hit(hit, key, filled, &self.telemetry.key_age);
    }

    /// The key's entry in memory, unless one of its tags was invalidated since its load began.
    pub(crate) fn entry(&self, key: &K) -> Option<Entry<V>> {
        self.memory.get(key).filter(Entry::current)
    }

    /// The key's tags, for a load of it beginning now.
    fn stamp(&self, key: &K) -> Option<Arc<Stamp>> {
        self.tags.map(|render| Stamp::new(render(key)))
    }

    /// An entry loaded now with the cache's deadlines: fresh for a jittered `ttl` (or the
    /// value's own, `ttl_from`), then stale; its source read when the load's attempt began.
    pub(crate) fn loaded(&self, loaded: Loaded<V>) -> Entry<V> {
        let lifetime = self.lifetime(&loaded.value);
        Entry::loaded(loaded.value, Instant::now(), lifetime.fresh, lifetime.stale)
            .read_from(loaded.read_from)
    }

    /// The windows of `value`'s life, loaded now ([`Config::lifetime_of`]): its fresh time
    /// jittered. Every tier keeps a value for these.
    pub(crate) fn lifetime(&self, value: &V) -> Lifetime {
        let options = self.options();
        let lifetime = options.lifetime_of(value);
        Lifetime {
            fresh: jittered_ttl(lifetime.fresh, options.jitter),
            ..lifetime
        }
    }

    /// `entry` as the cache's options have it kept: refreshed early past `refresh_after`, kept
    /// for `fail_safe` past its stale deadline, then servable no longer than `memory_ttl` from
    /// `since` in any of its windows. The cap comes last, so no option undoes it; past it the
    /// entry is still the last good value.
    ///
    /// `since` is when the flight or read began, before the store or the source was read: the
    /// memory lifetime counts from there, as the trust bound does ([`Begun::entry`]).
    pub(crate) fn kept(&self, entry: Entry<V>, since: Instant) -> Entry<V> {
        let config = &*self.options();
        let entry = match (config.refresh_after, config.xfetch) {
            (Some(refresh_after), _) => {
                let at = after(
                    entry.filled_at(),
                    jittered_ttl(refresh_after, config.jitter),
                );
                entry.refreshing_from(at)
            }
            // The key's load time as this process measured it: from the flight's start to now.
            (None, Some(beta)) => entry.xfetching(since.elapsed(), beta),
            (None, None) => entry,
        };
        let fail_safe = config.lifetime_of(&entry.value).fail_safe;
        let entry = match fail_safe.is_zero() {
            true => entry,
            false => entry.failing_safe_for(fail_safe),
        };
        match config.memory_ttl {
            Some(memory) => entry.capped(after(since, memory)),
            None => entry,
        }
    }
}

/// A flight's or a read's hold on its key: registered with the memory tier (a value is kept
/// only if the key was not invalidated since) and, for a cache with `tags`, stamped with the
/// key's tags and the tag epoch it began in, before its source is read. Unregistered on drop.
pub(crate) struct Begun<'a, K: Key, V: Value> {
    core: &'a Core<K, V>,
    loading: Loading<'a, K, V>,
    stamp: Option<Arc<Stamp>>,
    /// When it began: the trust cap of what it keeps counts from here.
    began: Instant,
}

impl<'a, K: Key, V: Value> Begun<'a, K, V> {
    pub(crate) fn new(core: &'a Core<K, V>, key: &K) -> Self {
        Begun {
            stamp: core.stamp(key),
            loading: core.memory.begin(key),
            began: Instant::now(),
            core,
        }
    }

    /// Unless a load or a read of the key is registered already.
    pub(crate) fn alone(core: &'a Core<K, V>, key: &K) -> Option<Self> {
        Some(Begun {
            loading: core.memory.begin_alone(key)?,
            stamp: core.stamp(key),
            began: Instant::now(),
            core,
        })
    }

    /// Keeps nothing from now on: the flight was detached before this began (see
    /// `Handle::new`).
    pub(crate) fn detach(&mut self) {
        self.loading.detach();
    }

    /// The key's tags, for a cache with `tags`.
    pub(crate) fn tags(&self) -> &[Box<str>] {
        self.stamp.as_ref().map_or(&[], |stamp| stamp.tags())
    }

    /// `entry` as it is kept ([`Core::kept`]), stamped with the key's tags, and servable no
    /// longer than `trusted_for` from when this began (memory is trusted only that long while a
    /// shared tier's invalidation feed is not known to be live: an invalidation missed after
    /// this began may concern the value, so the bound counts from here, not from when a long
    /// load ended). Past the cap it is still the last good value; and if the feed's log later
    /// shows the key was not invalidated meanwhile, memory lifts the cap
    /// ([`Memory::lift_later`](crate::memory::Memory::lift_later)).
    pub(crate) fn entry(&self, entry: Entry<V>, trusted_for: Option<Duration>) -> Entry<V> {
        let entry = self.core.kept(entry, self.began);
        let entry = match trusted_for {
            Some(bound) => {
                let uncapped = entry.saved();
                let capped = entry.capped(after(self.began, bound));
                self.core.memory.lift_later(self.loading.key(), uncapped);
                capped
            }
            None => entry,
        };
        entry.stamped(self.stamp.as_ref())
    }

    /// Whether neither the key nor one of its tags was invalidated since this began.
    pub(crate) fn current(&self) -> bool {
        self.core.memory.is_current(&self.loading)
            && self.stamp.as_ref().is_none_or(|stamp| stamp.current())
    }

    /// Keeps `entry` in memory (unless values live only in the shared tier) if the key was not
    /// invalidated since this began and memory holds no newer value (one of a newer source
    /// version is counted).
    pub(crate) fn keep(&self, entry: Entry<V>) -> Kept<V> {
        if !self.core.config.in_memory() {
            return match self.core.memory.is_current(&self.loading) {
                true => Kept::Stored,
                false => Kept::Invalidated,
            };
        }
        let kept = self.core.memory.keep(&self.loading, entry);
        if let Kept::Newer(_, Stays::Version) = kept {
            self.core.telemetry.older_versions.bump();
        }
        kept
    }
}

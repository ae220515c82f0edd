//! The core's behaviour through its tiers, without a Redis: singleflight, stale serving,
//! invalidation and degradation, on tokio's paused clock, with the local tier and with the fake
//! shared tier of `fake_tier` (several caches over one store stand for several processes).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

// Every wait of a test is bounded: a hang fails it.
use stampede_test_support::within;
use tokio::time::Instant;

use crate::cache::Cache;
use crate::config::{Backend, Config, Lock};
use crate::core::Values;
use crate::entry::Entry;
use crate::error::Error;
use crate::load::Loaded;
use crate::memory::Invalidation;
use crate::registry;
use crate::testing::fake_tier::{self, Store};
use crate::tier::{Local, Tier};

fn config(name: &str) -> Config {
    Config {
        name: Arc::from(name),
        ttl: Duration::from_secs(10),
        jitter: 0,
        stale: Duration::from_secs(10),
        timeout: Duration::from_secs(30),
        retries: 0,
        backoff: Duration::from_millis(50),
        lock: Lock::Local,
        backend: Backend::Memory,
        capacity: 1_000,
        refresh_after: None,
        xfetch: None,
        fail_safe: None,
        fail_safe_throttle: Duration::from_secs(5),
        soft_timeout: None,
        memory_ttl: None,
        compress: None,
        breaker: None,
        breaker_cooldown: Duration::from_secs(30),
        key: None,
        version: None,
        ttl_from: None,
        batch_max: None,
        max_loads: None,
        max_loads_full: crate::config::LoadsFull::Wait,
    }
}

/// `config(name)` with `lock = "redis"`: one load per key across the processes sharing a store.
fn locked(name: &str) -> Config {
    Config {
        lock: Lock::Redis,
        ..config(name)
    }
}

/// A cache that lives as long as the test process, listed in the registry.
fn leak<T: Tier<u64, String>>(config: Config, tier: T) -> &'static Cache<u64, String, T> {
    let cache = Box::leak(Box::new(Cache::of_form(config, tier, None, Values::NONE)));
    registry::register(cache);
    cache
}

/// A cache over the fake shared tier, leaked like [`leak`]'s and attached to its process, which
/// then hears the invalidations announced to it.
fn shared(
    config: Config,
    tier: fake_tier::Fake<u64, String>,
) -> &'static Cache<u64, String, fake_tier::Fake<u64, String>> {
    let (store, process) = (tier.store.clone(), tier.process);
    let cache = leak(config, tier);
    store.attach(process, cache);
    cache
}

/// The function behind the caches: counts its loads, takes `delay`, and returns
/// `"{key} v{n}"` where `n` is the load's number (from 1).
#[derive(Clone)]
struct Source {
    loads: Arc<AtomicUsize>,
    delay: Duration,
}

impl Source {
    fn new(delay: Duration) -> Source {
        Source {
            loads: Arc::default(),
            delay,
        }
    }

    fn loads(&self) -> usize {
        self.loads.load(SeqCst)
    }

    fn get<T: Tier<u64, String>>(
        &self,
        cache: &'static Cache<u64, String, T>,
        key: u64,
    ) -> impl Future<Output = Result<String, Error>> + Send + 'static {
        let (loads, delay) = (self.loads.clone(), self.delay);
        cache.get(key, move || {
            move |key: &u64| {
                let (key, loads) = (*key, loads.clone());
                async move {
                    let n = loads.fetch_add(1, SeqCst) + 1;
                    tokio::time::sleep(delay).await;
                    Ok::<_, std::convert::Infallible>(format!("{key} v{n}"))
                }
            }
        })
    }

    /// The companion's `refresh` of `key` through `cache`, with this source's load.
    fn refresh<T: Tier<u64, String>>(
        &self,
        cache: &'static Cache<u64, String, T>,
        key: u64,
    ) -> impl Future<Output = Result<String, Error>> + Send + 'static {
        let (loads, delay) = (self.loads.clone(), self.delay);
        cache.call(crate::tier::Call::Refresh, key, move || {
            move |key: &u64| {
                let (key, loads) = (*key, loads.clone());
                async move {
                    let n = loads.fetch_add(1, SeqCst) + 1;
                    tokio::time::sleep(delay).await;
                    Ok::<_, std::convert::Infallible>(format!("{key} v{n}"))
                }
            }
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_hundred_callers_of_a_cold_key_share_one_load() {
    let cache = leak(config("core::local_singleflight"), Local);
    let source = Source::new(Duration::from_millis(100));
    let calls = (0..100).map(|_| tokio::spawn(source.get(cache, 7)));
    for call in calls {
        assert_eq!(within(call).await.unwrap().unwrap(), "7 v1");
    }
    assert_eq!(source.loads(), 1);
}

#[tokio::test(start_paused = true)]
async fn two_processes_share_one_load_through_the_shared_store() {
    let store = Store::new();
    let name = "core::shared_singleflight";
    let (a, b) = (
        shared(locked(name), fake_tier::tier(&store)),
        shared(locked(name), fake_tier::tier(&store)),
    );
    let source = Source::new(Duration::from_millis(100));
    let calls: Vec<_> = (0..50)
        .flat_map(|_| {
            [
                tokio::spawn(source.get(a, 1)),
                tokio::spawn(source.get(b, 1)),
            ]
        })
        .collect();
    for call in calls {
        assert_eq!(within(call).await.unwrap().unwrap(), "1 v1");
    }
    assert_eq!(source.loads(), 1, "one load across both processes");
    assert_eq!(store.value(&1).as_deref(), Some("1 v1"));
}

#[tokio::test(start_paused = true)]
async fn a_stale_value_is_served_at_once_while_one_refresh_runs() {
    let cache = leak(config("core::stale"), Local);
    let source = Source::new(Duration::from_secs(1));
    assert_eq!(within(source.get(cache, 3)).await.unwrap(), "3 v1");
    tokio::time::advance(Duration::from_secs(11)).await; // past the ttl, inside the stale window
    let started = Instant::now();
    for _ in 0..20 {
        assert_eq!(within(source.get(cache, 3)).await.unwrap(), "3 v1");
    }
    assert_eq!(started.elapsed(), Duration::ZERO, "stale calls never wait");
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert_eq!(source.loads(), 2, "one refresh for twenty stale calls");
    assert_eq!(within(source.get(cache, 3)).await.unwrap(), "3 v2");
}

#[tokio::test(start_paused = true)]
async fn a_late_joiner_does_not_get_a_served_stale_value_past_its_deadline() {
    let store = Store::new();
    let cache = shared(config("core::stale_deadline"), fake_tier::tier(&store));
    let source = Source::new(Duration::from_secs(5));
    // The store holds a value that is stale for one more second; this process has none.
    let now = Instant::now();
    store.put(
        4,
        Entry::new("4 v0".to_owned(), now, now, now + Duration::from_secs(1)),
    );
    // The refresh (5 s) serves the stale value to its waiter at once.
    assert_eq!(within(source.get(cache, 4)).await.unwrap(), "4 v0");
    tokio::time::advance(Duration::from_secs(2)).await;
    // Past the stale deadline, a caller joining the refresh waits for its value.
    let joined = Instant::now();
    assert_eq!(within(source.get(cache, 4)).await.unwrap(), "4 v1");
    assert_eq!(joined.elapsed(), Duration::from_secs(3));
    assert_eq!(source.loads(), 1);
}

#[tokio::test(start_paused = true)]
async fn an_invalidation_detaches_the_running_load() {
    let cache = leak(config("core::forget"), Local);
    let source = Source::new(Duration::from_secs(1));
    let before = tokio::spawn(source.get(cache, 5));
    tokio::time::sleep(Duration::from_millis(100)).await;
    within(cache.invalidate_as(&5, Invalidation::Drop))
        .await
        .unwrap();
    // After the invalidation returned, a call starts its own load.
    let after = within(source.get(cache, 5)).await.unwrap();
    assert_eq!(after, "5 v2");
    // The detached load's own waiter still gets its result, which is not kept.
    assert_eq!(within(before).await.unwrap().unwrap(), "5 v1");
    assert_eq!(within(source.get(cache, 5)).await.unwrap(), "5 v2");
    assert_eq!(source.loads(), 2);
}

#[tokio::test(start_paused = true)]
async fn an_invalidation_stops_only_the_loads_of_its_key() {
    let cache = leak(config("core::per_key"), Local);
    let source = Source::new(Duration::from_secs(1));
    let (one, two) = (
        tokio::spawn(source.get(cache, 1)),
        tokio::spawn(source.get(cache, 2)),
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    within(cache.invalidate_as(&1, Invalidation::Drop))
        .await
        .unwrap();
    within(one).await.unwrap().unwrap();
    within(two).await.unwrap().unwrap();
    assert_eq!(source.loads(), 2);
    // Key 2's value was kept; key 1's was not.
    within(source.get(cache, 2)).await.unwrap();
    assert_eq!(source.loads(), 2);
    within(source.get(cache, 1)).await.unwrap();
    assert_eq!(source.loads(), 3);
}

#[tokio::test(start_paused = true)]
async fn an_invalidation_reaches_the_other_processes_memory() {
    let store = Store::new();
    let name = "core::remote_forget";
    let (a, b) = (
        shared(config(name), fake_tier::tier(&store)),
        shared(config(name), fake_tier::tier(&store)),
    );
    let source = Source::new(Duration::from_millis(10));
    assert_eq!(within(source.get(a, 9)).await.unwrap(), "9 v1");
    assert_eq!(within(source.get(b, 9)).await.unwrap(), "9 v1"); // read from the store
    within(a.invalidate_as(&9, Invalidation::Drop))
        .await
        .unwrap();
    assert_eq!(within(source.get(b, 9)).await.unwrap(), "9 v2");
    assert_eq!(within(source.get(a, 9)).await.unwrap(), "9 v2");
    assert_eq!(source.loads(), 2);
}

/// Issue 37: `expire` ends a value's freshness without dropping it: the next call gets it stale
/// at once while one refresh runs (for `stale` at most from the expiry), and a load running
/// when it came stores nothing (it read the source before).
#[tokio::test(start_paused = true)]
async fn an_expired_value_is_served_stale_while_one_refresh_runs_and_a_running_load_is_detached() {
    let cache = leak(config("core::expire"), Local);
    let source = Source::new(Duration::from_secs(1));
    assert_eq!(within(source.get(cache, 6)).await.unwrap(), "6 v1");
    let refresh = tokio::spawn(source.refresh(cache, 6)); // loads "6 v2" for 1 s
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        within(cache.invalidate_as(&6, Invalidation::Expire))
            .await
            .unwrap()
    );
    // Stale at once: served without a wait, and one refresh starts.
    let started = Instant::now();
    for _ in 0..10 {
        assert_eq!(within(source.get(cache, 6)).await.unwrap(), "6 v1");
    }
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(within(refresh).await.unwrap().unwrap(), "6 v2");
    assert_eq!(
        within(source.get(cache, 6)).await.unwrap(),
        "6 v1",
        "the load running at the expiry stored nothing"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(source.loads(), 3, "the detached load, then one refresh");
    assert_eq!(within(source.get(cache, 6)).await.unwrap(), "6 v3");
    // Its stale window counts from the expiry, never past the value's own.
    within(cache.invalidate_as(&6, Invalidation::Expire))
        .await
        .unwrap();
    tokio::time::advance(Duration::from_secs(11)).await; // past `stale` (10 s) from the expiry
    let waited = Instant::now();
    assert_eq!(within(source.get(cache, 6)).await.unwrap(), "6 v4");
    assert_eq!(
        waited.elapsed(),
        Duration::from_secs(1),
        "past its window: a load, waited for"
    );
}

#[tokio::test(start_paused = true)]
async fn without_stale_an_expired_value_is_only_the_last_good_one() {
    let cache = leak(
        Config {
            stale: Duration::ZERO,
            fail_safe: Some(Duration::from_secs(60)),
            ..config("core::expire_fail_safe")
        },
        Local,
    );
    let failing = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let loads = Arc::new(AtomicUsize::new(0));
    let get = |cache: &'static Cache<u64, String, Local>| {
        let (failing, loads) = (failing.clone(), loads.clone());
        cache.get(1, move || {
            move |_: &u64| {
                loads.fetch_add(1, SeqCst);
                let failing = failing.load(SeqCst);
                async move {
                    match failing {
                        true => Err("down".to_owned()),
                        false => Ok("1 ok".to_owned()),
                    }
                }
            }
        })
    };
    assert_eq!(within(get(cache)).await.unwrap(), "1 ok");
    within(cache.invalidate_as(&1, Invalidation::Expire))
        .await
        .unwrap();
    failing.store(true, SeqCst);
    // No stale window: the call loads; the load fails and the expired value stands in for it.
    assert_eq!(within(get(cache)).await.unwrap(), "1 ok");
    assert_eq!(
        loads.load(SeqCst),
        2,
        "the expired value was not served without a load"
    );
}

#[tokio::test(start_paused = true)]
async fn an_expiry_reaches_the_store_and_the_other_processes_memory() {
    let store = Store::new();
    let name = "core::remote_expire";
    let (a, b, c) = (
        shared(locked(name), fake_tier::tier(&store)),
        shared(locked(name), fake_tier::tier(&store)),
        shared(locked(name), fake_tier::tier(&store)),
    );
    let source = Source::new(Duration::from_secs(1));
    assert_eq!(within(source.get(a, 2)).await.unwrap(), "2 v1");
    assert_eq!(within(source.get(b, 2)).await.unwrap(), "2 v1"); // read from the store
    assert!(
        within(a.invalidate_as(&2, Invalidation::Expire))
            .await
            .unwrap()
    );
    // b's memory holds it stale: served at once, and b refreshes it.
    let started = Instant::now();
    assert_eq!(within(source.get(b, 2)).await.unwrap(), "2 v1");
    // c holds nothing and reads the store's copy, stale too: served at once, no second load.
    assert_eq!(within(source.get(c, 2)).await.unwrap(), "2 v1");
    assert_eq!(started.elapsed(), Duration::ZERO);
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert_eq!(within(source.get(c, 2)).await.unwrap(), "2 v2");
    assert_eq!(source.loads(), 2, "one refresh across the processes");
}

/// Issue 36: while a process's feed is lost its memory serves what it held until the bound after
/// the last it heard, then nothing; once the feed is back and the invalidation log replayed, it
/// serves again every value whose key was not invalidated meanwhile, and drops the one that
/// was. When the log does not cover the gap, it drops them all but what it loaded while deaf.
#[tokio::test(start_paused = true)]
async fn a_feed_back_replays_what_it_missed_from_the_log_and_serves_the_rest_again() {
    for logged in [true, false] {
        let store = Store::new();
        let name = match logged {
            true => "core::replayed",
            false => "core::not_replayed",
        };
        let (a, b) = (fake_tier::tier(&store), fake_tier::tier(&store));
        let process = a.process;
        let (a, b) = (shared(config(name), a), shared(config(name), b));
        let source = Source::new(Duration::from_millis(10));
        assert_eq!(within(source.get(a, 1)).await.unwrap(), "1 v1");
        assert_eq!(within(source.get(a, 2)).await.unwrap(), "2 v2");
        let lasting = store.bound + Duration::from_millis(700);
        store.cut_feed(process, Duration::from_millis(10), lasting, logged);
        tokio::time::sleep(Duration::from_millis(100)).await;
        within(b.invalidate_as(&1, Invalidation::Drop))
            .await
            .unwrap(); // announced while a hears nothing
        assert_eq!(
            a.peek(&2).as_deref(),
            Some("2 v2"),
            "served until the bound after the last it heard"
        );
        tokio::time::sleep(store.bound).await;
        assert_eq!(a.peek(&2), None, "out of service past the bound");
        assert_eq!(a.peek(&1), None, "out of service past the bound");
        // Loaded while the feed is lost: kept for the bound only, unless the log shows later
        // that it was not invalidated meanwhile.
        assert_eq!(within(source.get(a, 3)).await.unwrap(), "3 v3");
        tokio::time::sleep(Duration::from_millis(700)).await; // the feed is back
        assert_eq!(
            a.peek(&1),
            None,
            "k1 was invalidated meanwhile (logged: {logged})"
        );
        let kept = a.peek(&2);
        match logged {
            true => assert_eq!(kept.as_deref(), Some("2 v2"), "k2 is served again"),
            false => assert_eq!(kept, None, "the log does not cover the gap: k2 dropped"),
        }
        assert_eq!(
            a.peek(&3).as_deref(),
            Some("3 v3"),
            "k3, loaded while deaf, is kept within its bound whatever the log says"
        );
        tokio::time::sleep(store.bound).await;
        let kept = a.peek(&3);
        match logged {
            true => assert_eq!(kept.as_deref(), Some("3 v3"), "k3 is kept past the bound"),
            false => assert_eq!(
                kept, None,
                "the log does not cover the gap: k3's bound stands"
            ),
        }
        assert_eq!(within(source.get(a, 1)).await.unwrap(), "1 v4");
    }
}

#[tokio::test(start_paused = true)]
async fn a_failing_store_degrades_to_local_singleflight() {
    let store = Store::new();
    store.fail.store(true, SeqCst);
    let name = "core::degraded";
    let (a, b) = (
        shared(config(name), fake_tier::tier(&store)),
        shared(config(name), fake_tier::tier(&store)),
    );
    let source = Source::new(Duration::from_millis(100));
    let calls: Vec<_> = (0..20)
        .flat_map(|_| {
            [
                tokio::spawn(source.get(a, 2)),
                tokio::spawn(source.get(b, 2)),
            ]
        })
        .collect();
    for call in calls {
        within(call).await.unwrap().unwrap();
    }
    assert_eq!(
        source.loads(),
        2,
        "one load per process while the store is down"
    );
    assert_eq!(store.value(&2), None);
}

#[tokio::test(start_paused = true)]
async fn a_lost_wake_up_costs_at_most_the_lock_wait() {
    let store = Store::new();
    store.lose_messages.store(true, SeqCst);
    let name = "core::lost_wake_up";
    let a = shared(locked(name), fake_tier::tier(&store));
    let mut waiting = fake_tier::tier(&store);
    waiting.lock_wait = Duration::from_secs(2);
    let b = shared(locked(name), waiting);
    let source = Source::new(Duration::from_secs(10));
    let holder = tokio::spawn(source.get(a, 6));
    tokio::time::sleep(Duration::from_millis(10)).await;
    let started = Instant::now();
    let waited = within(source.get(b, 6)).await.unwrap();
    // Not woken, the waiter gave up after its lock wait and loaded the key itself.
    assert_eq!(waited, "6 v2");
    assert_eq!(started.elapsed(), Duration::from_secs(12));
    within(holder).await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_stalled_store_delays_calls_without_failing_them() {
    let store = Store::new();
    *store.stall.lock().unwrap() = Duration::from_millis(300);
    let cache = shared(config("core::stalled"), fake_tier::tier(&store));
    let source = Source::new(Duration::from_millis(100));
    let started = Instant::now();
    assert_eq!(within(source.get(cache, 8)).await.unwrap(), "8 v1");
    // Two round trips, each stalled (the read that takes the lock, the fill), and the load.
    assert_eq!(started.elapsed(), Duration::from_millis(2 * 300 + 100));
}

#[tokio::test(start_paused = true)]
async fn a_refresh_that_the_store_refuses_after_an_invalidation_is_not_shared() {
    let store = Store::new();
    let name = "core::fill_refused";
    let (a, b) = (
        shared(config(name), fake_tier::tier(&store)),
        shared(config(name), fake_tier::tier(&store)),
    );
    let source = Source::new(Duration::from_secs(1));
    let loading = tokio::spawn(source.get(a, 3));
    tokio::time::sleep(Duration::from_millis(100)).await;
    within(b.invalidate_as(&3, Invalidation::Drop))
        .await
        .unwrap();
    assert_eq!(within(loading).await.unwrap().unwrap(), "3 v1");
    assert_eq!(store.value(&3), None, "the old load wrote nothing");
    assert_eq!(within(source.get(a, 3)).await.unwrap(), "3 v2");
}

#[tokio::test(start_paused = true)]
async fn stats_read_right_after_one_fill_and_one_hit() {
    use crate::registry::AnyCache;

    let cache = leak(config("core::stats"), Local);
    let source = Source::new(Duration::ZERO);
    within(source.get(cache, 1)).await.unwrap();
    let stats = cache.stats();
    assert_eq!(stats.entries, 1, "the value just cached is counted");
    within(source.get(cache, 1)).await.unwrap();
    let stats = cache.stats();
    assert_eq!((stats.hits, stats.misses, stats.loads), (1, 1, 1));
    assert_eq!(stats.hot_keys.len(), 1);
    assert_eq!(stats.hot_keys[0].hits, 1, "one hit reads as one");
}

#[tokio::test(start_paused = true)]
async fn refresh_ahead_keeps_a_steadily_read_key_from_ever_making_a_caller_wait() {
    let mut ahead = config("core::refresh_ahead");
    ahead.ttl = Duration::from_secs(60);
    ahead.stale = Duration::ZERO;
    ahead.refresh_after = Some(Duration::from_secs(45));
    let cache = leak(ahead, Local);
    let source = Source::new(Duration::from_millis(100));
    within(source.get(cache, 1)).await.unwrap();
    // Read every second for ten minutes.
    for _ in 0..600 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let started = Instant::now();
        within(source.get(cache, 1)).await.unwrap();
        assert_eq!(
            started.elapsed(),
            Duration::ZERO,
            "a call waited for a load"
        );
    }
    // The first load, then one refresh each time the value passes 45 s (plus its 100 ms load
    // and the second the next read comes at): 600 s / 46 s.
    assert_eq!(source.loads(), 1 + 600 / 46);
}

#[tokio::test(start_paused = true)]
async fn fail_safe_serves_the_last_good_value_throttled_until_its_window_ends() {
    use std::sync::atomic::AtomicBool;

    static FAILING: AtomicBool = AtomicBool::new(false);
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    fn get(
        cache: &'static Cache<u64, String, Local>,
    ) -> impl Future<Output = Result<String, Error>> + Send + 'static {
        cache.get(1, || {
            |_: &u64| async {
                let n = LOADS.fetch_add(1, SeqCst) + 1;
                if FAILING.load(SeqCst) {
                    Err(format!("load {n}: the database is down"))
                } else {
                    Ok(format!("v{n}"))
                }
            }
        })
    }

    let mut safe = config("core::fail_safe");
    safe.ttl = Duration::from_secs(10);
    safe.stale = Duration::from_secs(5);
    safe.fail_safe = Some(Duration::from_secs(3_600));
    safe.fail_safe_throttle = Duration::from_secs(5);
    let cache = leak(safe, Local);
    assert_eq!(within(get(cache)).await.unwrap(), "v1");
    FAILING.store(true, SeqCst);
    tokio::time::advance(Duration::from_secs(16)).await; // past ttl + stale

    // A call every second for a minute: the last good value each time, the source asked once
    // per throttle period.
    for _ in 0..60 {
        assert_eq!(within(get(cache)).await.unwrap(), "v1");
        tokio::time::advance(Duration::from_secs(1)).await;
    }
    assert_eq!(LOADS.load(SeqCst), 1 + 60 / 5);
    assert_eq!(
        crate::registry::AnyCache::stats(cache).fail_safe_served,
        60 / 5
    );

    // Past the fail-safe window, the error.
    tokio::time::advance(Duration::from_secs(3_600)).await;
    assert!(matches!(within(get(cache)).await, Err(Error::Upstream(_))));
}

#[tokio::test(start_paused = true)]
async fn a_soft_timeout_hands_a_waiting_caller_the_fail_safe_value_and_the_load_still_lands() {
    let mut soft = config("core::soft_timeout");
    soft.ttl = Duration::from_secs(10);
    soft.stale = Duration::ZERO;
    soft.fail_safe = Some(Duration::from_secs(3_600));
    soft.soft_timeout = Some(Duration::from_millis(100));
    let cache = leak(soft, Local);
    let source = Source::new(Duration::from_secs(1));
    assert_eq!(within(source.get(cache, 5)).await.unwrap(), "5 v1");
    tokio::time::advance(Duration::from_secs(11)).await; // expired; fail-safe value at hand
    let started = Instant::now();
    assert_eq!(within(source.get(cache, 5)).await.unwrap(), "5 v1");
    assert_eq!(
        started.elapsed(),
        Duration::from_millis(100),
        "waited the soft timeout"
    );
    tokio::time::sleep(Duration::from_secs(1)).await; // the load ends and is stored
    let started = Instant::now();
    assert_eq!(within(source.get(cache, 5)).await.unwrap(), "5 v2");
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(source.loads(), 2);
}

#[tokio::test(start_paused = true)]
async fn an_open_breaker_skips_the_source_until_one_probe_after_the_cooldown() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    fn get(
        cache: &'static Cache<u64, String, Local>,
        key: u64,
    ) -> impl Future<Output = Result<String, Error>> + Send + 'static {
        cache.get(key, || {
            |_: &u64| async {
                LOADS.fetch_add(1, SeqCst);
                Err::<String, _>("the database is down".to_owned())
            }
        })
    }

    let mut guarded = config("core::breaker");
    guarded.breaker = Some(3);
    guarded.breaker_cooldown = Duration::from_secs(30);
    let cache = leak(guarded, Local);
    for key in 0..3 {
        assert!(matches!(
            within(get(cache, key)).await,
            Err(Error::Upstream(_))
        ));
    }
    assert_eq!(LOADS.load(SeqCst), 3);
    // Open: calls fail at once, without calling the source.
    for key in 10..20 {
        assert!(matches!(
            within(get(cache, key)).await,
            Err(Error::CircuitOpen { .. })
        ));
    }
    assert_eq!(LOADS.load(SeqCst), 3);
    assert!(crate::registry::AnyCache::stats(cache).breaker_open);
    // After the cool-down, exactly one probe; it fails, and the breaker opens again.
    tokio::time::advance(Duration::from_secs(31)).await;
    let probes: Vec<_> = (20..30).map(|key| tokio::spawn(get(cache, key))).collect();
    for probe in probes {
        let _ = within(probe).await.unwrap();
    }
    assert_eq!(LOADS.load(SeqCst), 4, "one probe load");
    assert!(matches!(
        within(get(cache, 40)).await,
        Err(Error::CircuitOpen { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn retry_if_retries_only_the_errors_it_accepts() {
    use crate::load::RetryIf;

    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[allow(clippy::ptr_arg)] // the function's error type is `String`
    fn transient(error: &String) -> bool {
        error.starts_with("transient")
    }

    fn get(
        cache: &'static Cache<u64, String, Local>,
        key: u64,
    ) -> impl Future<Output = Result<String, Error>> + Send + 'static {
        cache.get(key, || RetryIf {
            load: |key: &u64| {
                let key = *key;
                async move {
                    LOADS.fetch_add(1, SeqCst);
                    match key {
                        1 => Err::<String, _>("permanent: no such row".to_owned()),
                        _ => Err("transient: connection reset".to_owned()),
                    }
                }
            },
            retry_if: transient,
        })
    }

    let mut retrying = config("core::retry_if");
    retrying.retries = 2;
    let cache = leak(retrying, Local);
    assert!(within(get(cache, 1)).await.is_err());
    assert_eq!(LOADS.load(SeqCst), 1, "a permanent error is tried once");
    assert!(within(get(cache, 2)).await.is_err());
    assert_eq!(
        LOADS.load(SeqCst),
        1 + 3,
        "a transient one up to retries + 1 times"
    );
}

/// A source that fails while `failing` is set, counting its loads.
#[derive(Clone, Default)]
struct Flaky {
    loads: Arc<AtomicUsize>,
    failing: Arc<std::sync::atomic::AtomicBool>,
}

impl Flaky {
    fn get<T: Tier<u64, String>>(
        &self,
        cache: &'static Cache<u64, String, T>,
        key: u64,
    ) -> impl Future<Output = Result<String, Error>> + Send + 'static {
        let (loads, failing) = (self.loads.clone(), self.failing.clone());
        cache.get(key, move || {
            move |key: &u64| {
                let (key, loads, failing) = (*key, loads.clone(), failing.clone());
                async move {
                    let n = loads.fetch_add(1, SeqCst) + 1;
                    match failing.load(SeqCst) {
                        true => Err(format!("load {n}: down")),
                        false => Ok(format!("{key} v{n}")),
                    }
                }
            }
        })
    }

    fn loads(&self) -> usize {
        self.loads.load(SeqCst)
    }

    /// A batch function's call of `keys` through `cache`: one load of the keys it must load.
    fn get_many<T: Tier<u64, String>>(
        &self,
        cache: &'static Cache<u64, String, T>,
        keys: Vec<u64>,
    ) -> impl Future<Output = Vec<(u64, Result<String, Error>)>> + Send + 'static {
        let (loads, failing) = (self.loads.clone(), self.failing.clone());
        let load = move || {
            move |keys: &Vec<u64>| {
                let (keys, loads, failing) = (keys.clone(), loads.clone(), failing.clone());
                async move {
                    let n = loads.fetch_add(1, SeqCst) + 1;
                    match failing.load(SeqCst) {
                        true => Err(format!("load {n}: down")),
                        false => Ok(keys.iter().map(|key| format!("{key} v{n}")).collect()),
                    }
                }
            }
        };
        cache.get_many(keys, load, crate::tier::Call::Get)
    }
}

fn breaker_open<T: Tier<u64, String>>(cache: &'static Cache<u64, String, T>) -> bool {
    crate::registry::AnyCache::stats(cache).breaker_open
}

#[tokio::test(start_paused = true)]
async fn the_breaker_opens_after_failed_loads_while_every_caller_is_served_a_stale_value() {
    let mut guarded = config("core::breaker_stale");
    guarded.stale = Duration::from_secs(3_600);
    guarded.breaker = Some(2);
    guarded.breaker_cooldown = Duration::from_secs(3_600);
    // Locally, and through a shared store whose value (another process's) is stale.
    let store = Store::new();
    let now = Instant::now();
    store.put(
        1,
        Entry::new(
            "1 v0".to_owned(),
            now,
            now,
            now + Duration::from_secs(3_600),
        ),
    );
    let shared = shared(guarded.clone(), fake_tier::tier(&store));
    let local = leak(guarded, Local);
    let source = Flaky::default();
    assert_eq!(within(source.get(local, 1)).await.unwrap(), "1 v1");
    tokio::time::advance(Duration::from_secs(11)).await; // past the ttl: stale
    source.failing.store(true, SeqCst);
    let caches: [(&dyn Stale, &str); 2] = [(&shared, "1 v0"), (&local, "1 v1")];
    for (cache, stale) in caches {
        let before = source.loads();
        for _ in 0..6 {
            assert_eq!(within(cache.get(&source)).await.unwrap(), stale);
            tokio::time::sleep(Duration::from_millis(10)).await; // the refresh runs
        }
        assert!(cache.breaker_open(), "two failed loads open the breaker");
        assert_eq!(source.loads() - before, 2, "then the source is skipped");
    }
}

/// A cache of either tier, for a test that runs the same calls on both.
trait Stale: Sync {
    fn get(
        &self,
        source: &Flaky,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<String, Error>> + Send>>;
    fn breaker_open(&self) -> bool;
}

impl<T: Tier<u64, String>> Stale for &'static Cache<u64, String, T> {
    fn get(
        &self,
        source: &Flaky,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<String, Error>> + Send>> {
        Box::pin(source.get(self, 1))
    }

    fn breaker_open(&self) -> bool {
        breaker_open(self)
    }
}

#[tokio::test(start_paused = true)]
async fn lock_contention_alone_never_opens_the_breaker() {
    let store = Store::new();
    store.lock(4); // another process holds the key's lock
    let mut guarded = locked("core::breaker_busy");
    guarded.breaker = Some(1);
    let mut busy = fake_tier::tier(&store);
    busy.busy_error = true;
    let cache = shared(guarded, busy);
    let source = Flaky::default();
    for _ in 0..3 {
        assert!(matches!(
            within(source.get(cache, 4)).await,
            Err(Error::LockBusy { .. })
        ));
    }
    assert!(!breaker_open(cache), "a busy lock is no failed load");
    assert_eq!(source.loads(), 0);
    // The other process's value arrives: it is read, whatever the breaker says.
    let now = Instant::now();
    let fresh = now + Duration::from_secs(60);
    store.put(
        4,
        Entry::new("4 from the holder".to_owned(), now, fresh, fresh),
    );
    assert_eq!(
        within(source.get(cache, 4)).await.unwrap(),
        "4 from the holder"
    );
}

#[tokio::test(start_paused = true)]
async fn an_open_breaker_does_not_stop_a_process_from_reading_another_processs_value() {
    let store = Store::new();
    let mut guarded = config("core::breaker_reads");
    guarded.breaker = Some(1);
    guarded.breaker_cooldown = Duration::from_secs(3_600);
    let cache = shared(guarded, fake_tier::tier(&store));
    let source = Flaky::default();
    source.failing.store(true, SeqCst);
    assert!(within(source.get(cache, 8)).await.is_err());
    assert!(breaker_open(cache));
    let now = Instant::now();
    let fresh = now + Duration::from_secs(60);
    store.put(
        8,
        Entry::new("8 from elsewhere".to_owned(), now, fresh, fresh),
    );
    assert_eq!(
        within(source.get(cache, 8)).await.unwrap(),
        "8 from elsewhere"
    );
    assert_eq!(source.loads(), 1, "the breaker still skips the source");
}

#[tokio::test(start_paused = true)]
async fn past_the_trust_cap_a_fail_safe_value_is_served_only_for_a_failed_load() {
    // While the store's invalidation feed is down, memory is trusted for 2 s only: past that, a
    // value whose invalidation may have been missed is not served, but it stays the key's last
    // good value (the guide's faults page: the double failure), as FusionCache's fail-safe does.
    let store = Store::new();
    let mut safe = config("core::trust_cap");
    safe.fail_safe = Some(Duration::from_secs(3_600));
    let mut untrusted = fake_tier::tier(&store);
    untrusted.trusted_for = Some(Duration::from_secs(2));
    let cache = shared(safe, untrusted);
    let source = Flaky::default();
    assert_eq!(within(source.get(cache, 2)).await.unwrap(), "2 v1");
    store.drop_silently(&2); // another process invalidated it; the message was lost
    source.failing.store(true, SeqCst);
    tokio::time::advance(Duration::from_secs(3)).await;
    assert_eq!(
        within(source.get(cache, 2)).await.unwrap(),
        "2 v1",
        "the last good value, for a failed load"
    );
    assert_eq!(source.loads(), 2, "the source was asked first");
    source.failing.store(false, SeqCst);
    tokio::time::advance(Duration::from_secs(10)).await; // past the throttle
    assert_eq!(
        within(source.get(cache, 2)).await.unwrap(),
        "2 v3",
        "not served while the source answers"
    );
}

#[tokio::test(start_paused = true)]
async fn a_load_kept_while_the_feed_is_down_is_trusted_from_its_start_not_its_end() {
    // Simulation seed 24640: while the feed is down, another process invalidated the key during
    // this process's 1 s load (its message lost). The store refused the fill; the value was
    // kept for the bound from the fill, so it outlived the invalidation by more than the bound.
    let store = Store::new();
    let mut untrusted = fake_tier::tier(&store);
    let bound = Duration::from_secs(2);
    untrusted.trusted_for = Some(bound);
    let cache = shared(config("core::trust_from_start"), untrusted);
    let source = Source::new(Duration::from_secs(1));
    let load = tokio::spawn(source.get(cache, 4));
    tokio::time::advance(Duration::from_millis(500)).await;
    store.drop_silently(&4); // invalidated elsewhere mid-load; the message was lost
    let invalidated = Instant::now();
    assert_eq!(within(load).await.unwrap().unwrap(), "4 v1");
    tokio::time::sleep_until(invalidated + bound + Duration::from_millis(1)).await;
    assert_eq!(
        within(source.get(cache, 4)).await.unwrap(),
        "4 v2",
        "past the bound after the missed invalidation, the value read before it is not served"
    );
}

#[tokio::test(start_paused = true)]
async fn while_the_feed_is_down_a_call_does_not_join_a_flight_begun_longer_ago_than_the_bound() {
    // Simulation seed 536468 (Redis only, `lock = "local"`): this process's feed was down, and a
    // call joined a 275 ms load begun 196 ms before it, past the 151 ms bound. Another process
    // had invalidated the key 152 ms before the call (its message lost): the call got the value
    // read before that invalidation. Memory caps what it keeps at the bound from a flight's
    // start; a caller joining the flight must meet the same cap.
    for backend in [Backend::Tiered, Backend::Redis] {
        let store = Store::new();
        let mut untrusted = fake_tier::tier(&store);
        let bound = Duration::from_secs(1);
        untrusted.trusted_for = Some(bound);
        let name = format!("core::join_within_bound::{backend:?}");
        let cache = shared(
            Config {
                backend,
                ..config(&name)
            },
            untrusted,
        );
        let source = Source::new(Duration::from_secs(3));
        let first = tokio::spawn(source.get(cache, 4));
        tokio::time::advance(Duration::from_millis(500)).await;
        store.drop_silently(&4); // invalidated elsewhere mid-load; the message was lost
        tokio::time::advance(bound).await;
        let late = tokio::spawn(source.get(cache, 4));
        assert_eq!(within(first).await.unwrap().unwrap(), "4 v1", "{backend:?}");
        assert_eq!(
            within(late).await.unwrap().unwrap(),
            "4 v2",
            "{backend:?}: a caller past the bound after the missed invalidation loads anew"
        );
        // Within the bound of a flight's start, callers still share it.
        let early = tokio::spawn(source.get(cache, 5));
        tokio::time::advance(bound / 2).await;
        let joined = tokio::spawn(source.get(cache, 5));
        assert_eq!(within(early).await.unwrap().unwrap(), "5 v3", "{backend:?}");
        assert_eq!(
            within(joined).await.unwrap().unwrap(),
            "5 v3",
            "{backend:?}"
        );
        assert_eq!(source.loads(), 3, "{backend:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_failed_load_falls_back_on_memorys_newer_value_not_the_older_one_the_store_keeps() {
    // Simulation seed 713164 (`lock = "local"`, tiered, `fail_safe`): this
    // process's fill was fenced off by another's earlier fill of an older value, so memory held
    // the newer value and the store the older one. Past both stale deadlines the load failed,
    // and the store's older fail-safe value replaced memory's and was served. (Fills are now
    // ordered by their source reads, so the store takes the newer value; the fallback must still
    // be the newer one.)
    let store = Store::new();
    // The first fill has expired when the second is refused, so the second keeps its own.
    let safe = |name: &str| Config {
        backend: Backend::Tiered,
        ttl: Duration::from_millis(30),
        stale: Duration::ZERO,
        fail_safe: Some(Duration::from_secs(3_600)),
        ..config(name)
    };
    let first = shared(safe("core::fail_safe_newer"), fake_tier::tier(&store));
    let second = shared(safe("core::fail_safe_newer"), fake_tier::tier(&store));
    let source = Source::new(Duration::from_millis(100));
    let older = tokio::spawn(source.get(first, 1));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let newer = tokio::spawn(source.get(second, 1));
    assert_eq!(within(older).await.unwrap().unwrap(), "1 v1");
    assert_eq!(
        within(newer).await.unwrap().unwrap(),
        "1 v2",
        "its own load"
    );
    assert_eq!(
        store.value(&1).as_deref(),
        Some("1 v2"),
        "the second load's value, read from the source after the first's, replaced it"
    );
    tokio::time::advance(Duration::from_secs(1)).await; // past both values' ttl
    let down = Flaky::default();
    down.failing.store(true, SeqCst);
    assert_eq!(
        within(down.get(second, 1)).await.unwrap(),
        "1 v2",
        "the newer of the last good values, not the store's older one"
    );
    assert_eq!(down.loads(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_failed_load_does_not_hand_a_late_waiter_the_stale_value_past_its_deadline() {
    // Simulation seed 27791: the flight served the store's stale value to its waiters, then
    // waited for another process's lock; a caller that joined after the value's stale deadline
    // got it when the load failed (stale-if-error), older than the options allow.
    let store = Store::new(); // a 5 s lease
    let now = Instant::now();
    let stale_until = now + Duration::from_secs(1);
    store.put(3, Entry::new("3 old".to_owned(), now, now, stale_until));
    store.lock(3); // another process holds the key's lock, and never fills
    let cache = shared(locked("core::served_deadline"), fake_tier::tier(&store));
    let source = Flaky::default();
    source.failing.store(true, SeqCst);
    assert_eq!(
        within(source.get(cache, 3)).await.unwrap(),
        "3 old",
        "stale, served"
    );
    tokio::time::advance(Duration::from_secs(2)).await; // past the stale deadline
    let late = within(source.get(cache, 3)).await;
    assert!(late.is_err(), "got {late:?} past the stale deadline");
    assert_eq!(source.loads(), 1, "the late caller joined the flight");
}

#[tokio::test(start_paused = true)]
async fn a_key_of_a_batch_is_answered_when_its_load_ends_not_when_the_batchs_last_key_is() {
    // Simulation seeds 11882, 100700, 105908, 108926: a batch's keys were answered together
    // when its last key was, so a key whose load had failed stayed in flight while another
    // key waited for another process's lock; a call of it made after the failure, with the
    // source back, joined that flight and got the old failure (or its fail-safe value).
    let store = Store::new(); // a 5 s lease
    store.lock(2); // another process holds key 2's lock, and never fills
    let cache = shared(
        locked("core::batch_settles_each_key"),
        fake_tier::tier(&store),
    );
    let source = Flaky::default();
    source.failing.store(true, SeqCst);
    let batch = tokio::spawn(source.get_many(cache, vec![1, 2]));
    tokio::time::sleep(Duration::from_millis(10)).await; // key 1's load has failed by now
    assert_eq!(source.loads(), 1, "one load, of key 1");
    source.failing.store(false, SeqCst);
    assert_eq!(
        within(source.get(cache, 1)).await.unwrap(),
        "1 v2",
        "a call made after the failure loads anew"
    );
    let answers = within(batch).await.unwrap();
    assert!(
        answers[0].1.is_err(),
        "the batch's own answer for key 1 is its failure"
    );
}

#[tokio::test(start_paused = true)]
async fn a_refresh_detached_before_its_task_ran_does_not_store_over_a_newer_load() {
    // Simulation seed 35827: a tag invalidation detached a background refresh's flight in the
    // instant it began, before its task registered its load with memory; registered after the
    // detach, its load counted as current. It read the source, a newer flight of the key read
    // it later and stored first, and the refresh, slower, then stored its older value over it.
    let cache = leak(config("core::detached_before_registered"), Local);
    let slow = Source::new(Duration::from_millis(100));
    let fast = Source {
        loads: slow.loads.clone(),
        delay: Duration::ZERO,
    };
    assert_eq!(within(fast.get(cache, 4)).await.unwrap(), "4 v1");
    tokio::time::advance(Duration::from_secs(11)).await; // stale: the next call refreshes
    // Served stale at once; the refresh's task is spawned, not run yet.
    let served = futures_util::FutureExt::now_or_never(slow.get(cache, 4));
    assert_eq!(
        served.expect("a stale value is served at once").unwrap(),
        "4 v1"
    );
    cache.forget(&4); // an invalidation, before the refresh's task runs
    // The refresh's task reads the source first ("4 v2", slow); this newer flight (run on the
    // caller's task) reads it after ("4 v3", at once) and stores first.
    tokio::task::yield_now().await;
    assert_eq!(within(fast.get(cache, 4)).await.unwrap(), "4 v3");
    tokio::time::sleep(Duration::from_millis(200)).await; // the refresh has ended
    assert_eq!(slow.loads(), 3);
    assert_eq!(
        within(fast.get(cache, 4)).await.unwrap(),
        "4 v3",
        "the detached refresh's older value replaced the newer one"
    );
}

#[tokio::test(start_paused = true)]
async fn a_prime_that_a_later_prime_overtook_still_retires_the_value_it_replaces() {
    // Simulation seed 32346: a prime began, a second one began before the first had written,
    // and the first, having written, could not keep its value (the second had detached it):
    // memory still held the value from before both, served after the first prime returned.
    let store = Store::new();
    let cache = shared(config("core::racing_primes"), fake_tier::tier(&store));
    let source = Source::new(Duration::ZERO);
    assert_eq!(within(source.get(cache, 7)).await.unwrap(), "7 v1");
    *store.stall.lock().unwrap() = Duration::from_millis(100); // every store operation, slow
    let first = tokio::spawn(cache.prime(7, "7 primed first".to_owned()));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let second = tokio::spawn(cache.prime(7, "7 primed second".to_owned()));
    within(first).await.unwrap().unwrap();
    *store.stall.lock().unwrap() = Duration::ZERO;
    let got = within(source.get(cache, 7)).await.unwrap();
    assert_ne!(got, "7 v1", "the value from before a prime that returned");
    within(second).await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_flight_begun_while_a_prime_was_on_its_way_does_not_serve_what_the_prime_replaced() {
    // Simulation seed 312161: a flight began after the prime had detached the key's flights
    // but read the store before the prime wrote; it served that stale value to every caller
    // that joined it, after the prime had returned.
    for backend in [Backend::Redis, Backend::Tiered] {
        let store = Store::new();
        let now = Instant::now();
        let stale_until = now + Duration::from_secs(30);
        store.put(2, Entry::new("2 old".to_owned(), now, now, stale_until));
        let mut options = config("core::prime_overtakes_flight");
        options.backend = backend;
        let cache = shared(options, fake_tier::tier(&store));
        // The flight serves "2 old" while its 1 s load runs.
        let source = Source::new(Duration::from_secs(1));
        *store.stall.lock().unwrap() = Duration::from_millis(100); // the prime's write, slow
        let prime = tokio::spawn(cache.prime(2, "2 primed".to_owned()));
        tokio::time::sleep(Duration::from_millis(1)).await;
        *store.stall.lock().unwrap() = Duration::ZERO;
        assert_eq!(
            within(source.get(cache, 2)).await.unwrap(),
            "2 old",
            "{backend:?}"
        );
        within(prime).await.unwrap().unwrap();
        assert_eq!(
            within(source.get(cache, 2)).await.unwrap(),
            "2 primed",
            "{backend:?}: a call after the prime returned"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_refresh_does_not_serve_an_older_stale_value_from_the_store_over_memorys() {
    // Simulation seed 173083: memory held a stale value, served while a refresh ran; the
    // refresh found an older stale value in the store (this process's fill had been fenced off)
    // and served that one, in memory too: a call then got an older value than the one before.
    let store = Store::new();
    let cache = shared(config("core::serve_older"), fake_tier::tier(&store));
    let source = Source::new(Duration::from_secs(1));
    assert_eq!(within(source.get(cache, 6)).await.unwrap(), "6 v1");
    let loaded = Instant::now();
    // Its source read before this process's (at the start of its 1 s load).
    let before = loaded - Duration::from_secs(2);
    let stale_until = loaded + Duration::from_secs(20);
    store.put(
        6,
        Entry::new("6 older".to_owned(), before, before, stale_until),
    );
    tokio::time::advance(Duration::from_secs(11)).await; // past the ttl: stale, refreshed
    assert_eq!(within(source.get(cache, 6)).await.unwrap(), "6 v1");
    tokio::time::sleep(Duration::from_millis(10)).await; // the refresh read the store
    assert_eq!(
        within(source.get(cache, 6)).await.unwrap(),
        "6 v1",
        "an older value after a newer one"
    );
}

#[tokio::test(start_paused = true)]
async fn a_fill_fenced_off_by_a_later_load_retires_the_older_value_it_was_to_replace() {
    // Simulation seed 190888: a refresh loaded v2, and another process began a load meanwhile,
    // which fenced its fill off. The store kept v1 (written before the refresh began) and this
    // process kept v2 in memory only; its feed went down, it dropped its memory, and served v1
    // from the store: an older value after a newer one.
    let store = Store::new();
    let cache = shared(config("core::retire_older"), fake_tier::tier(&store));
    let source = Source::new(Duration::from_secs(1));
    assert_eq!(within(source.get(cache, 5)).await.unwrap(), "5 v1");
    tokio::time::advance(Duration::from_secs(11)).await; // past the ttl: stale, refreshed
    assert_eq!(within(source.get(cache, 5)).await.unwrap(), "5 v1");
    tokio::time::advance(Duration::from_millis(500)).await;
    store.lock(5); // another process begins a load of the key, and is still loading
    tokio::time::sleep(Duration::from_millis(1600)).await; // the refresh.s fill is refused
    assert_eq!(within(source.get(cache, 5)).await.unwrap(), "5 v2");
    // The log does not cover the cut: memory is taken out of service, then dropped.
    store.cut_feed(
        0,
        Duration::from_millis(10),
        Duration::from_millis(20),
        false,
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_ne!(
        store.value(&5).as_deref(),
        Some("5 v1"),
        "v1 is older than what was served"
    );
    assert_ne!(
        within(source.get(cache, 5)).await.unwrap(),
        "5 v1",
        "an older value after a newer one"
    );
}

/// The trust cap (memory while a shared tier's feed is not live) bounds every window in which
/// an entry is served, early refresh included; past it, the entry is still its key's last good
/// value for its fail-safe window (served only when a load fails: the double failure).
#[test]
fn the_trust_cap_bounds_every_serving_window_and_leaves_the_last_good_value() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut options = config("core::kept");
        options.fail_safe = Some(Duration::from_secs(3_600));
        options.refresh_after = Some(Duration::from_secs(5));
        let core = crate::core::Core::<u64, String>::new::<crate::entry::Entry<String>>(
            options,
            None,
            Values::NONE,
            None,
        );
        let bound = Duration::from_secs(2);
        let begun = crate::core::Begun::new(&core, &1);
        let entry = begun.entry(core.loaded(Loaded::now("v".to_owned())), Some(bound));
        let past = Instant::now() + bound;
        assert!(!entry.servable(past), "{entry:?}");
        assert!(entry.fail_safe(past + Duration::from_secs(60)), "{entry:?}");
        let uncapped = begun.entry(core.loaded(Loaded::now("v".to_owned())), None);
        assert!(uncapped.fail_safe(past + Duration::from_secs(60)));
    });
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_probe_without_a_lock_lets_the_next_call_probe() {
    let mut guarded = config("core::probe_cancelled");
    guarded.lock = Lock::None;
    guarded.stale = Duration::ZERO;
    guarded.breaker = Some(1);
    guarded.breaker_cooldown = Duration::from_secs(30);
    let cache = leak(guarded, Local);
    let source = Flaky::default();
    source.failing.store(true, SeqCst);
    assert!(within(source.get(cache, 1)).await.is_err());
    tokio::time::advance(Duration::from_secs(31)).await;
    // The probe runs on its caller's task (`lock = "none"`); the caller gives up mid-load.
    let slow = Source::new(Duration::from_secs(10));
    let probe = tokio::spawn(slow.get(cache, 1));
    tokio::time::sleep(Duration::from_millis(10)).await;
    probe.abort();
    let _ = probe.await;
    source.failing.store(false, SeqCst);
    assert_eq!(
        within(source.get(cache, 1)).await.unwrap(),
        "1 v2",
        "the next call probes, and closes the breaker"
    );
    assert!(!breaker_open(cache));
}

#[tokio::test(start_paused = true)]
async fn with_lock_redis_a_refresh_holds_the_shared_lock_so_other_processes_wait_for_its_value() {
    // Simulation seed 44039: a refresh took no lock, so another process loaded the key beside
    // it; the refresh's newer value was fenced off by that load, whose older value then won.
    let store = Store::new();
    let name = "core::refresh_locks";
    let (a, b) = (
        shared(locked(name), fake_tier::tier(&store)),
        shared(locked(name), fake_tier::tier(&store)),
    );
    let source = Source::new(Duration::from_secs(1));
    assert_eq!(within(source.get(a, 5)).await.unwrap(), "5 v1");
    tokio::time::advance(Duration::from_secs(11)).await; // past the ttl: stale
    let refresh = tokio::spawn(source.refresh(a, 5));
    tokio::time::sleep(Duration::from_millis(10)).await;
    // b has nothing in memory and finds the refresh's lock: it gets the stale value at once,
    // and waits for the refresh's fill rather than loading beside it.
    assert_eq!(within(source.get(b, 5)).await.unwrap(), "5 v1");
    assert_eq!(within(refresh).await.unwrap().unwrap(), "5 v2");
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert_eq!(
        source.loads(),
        2,
        "one load for the refresh and b's stale call"
    );
    assert_eq!(within(source.get(b, 5)).await.unwrap(), "5 v2");
    assert_eq!(store.value(&5).as_deref(), Some("5 v2"));
}

#[tokio::test(start_paused = true)]
async fn with_lock_redis_a_refresh_while_another_process_loads_returns_that_load_not_a_stale_value()
{
    let store = Store::new();
    let name = "core::refresh_waits";
    let (a, b) = (
        shared(locked(name), fake_tier::tier(&store)),
        shared(locked(name), fake_tier::tier(&store)),
    );
    let source = Source::new(Duration::from_secs(1));
    assert_eq!(within(source.get(b, 6)).await.unwrap(), "6 v1");
    tokio::time::advance(Duration::from_secs(11)).await; // past the ttl: stale
    // b serves its stale value and reloads the key under the shared lock.
    assert_eq!(within(source.get(b, 6)).await.unwrap(), "6 v1");
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(
        within(source.refresh(a, 6)).await.unwrap(),
        "6 v2",
        "the refresh gets the value loaded under the lock, neither the stale one nor a second load"
    );
    assert_eq!(source.loads(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_fill_fenced_off_by_a_prime_retires_it_when_its_retry_read_the_source_after_the_prime() {
    // Simulation seed 1367838: a load's first attempt stalled to its timeout; meanwhile another
    // process primed the key, which fenced the load off. The retry read the source after the
    // prime, so its value was newer; but the prime's value, written after the fence was read,
    // stayed in the store, and was served as fail-safe once the key's loads failed: an older
    // value after a newer one.
    for backend in [Backend::Redis, Backend::Tiered] {
        let store = Store::new();
        let mut options = locked("core::retry_after_prime");
        options.backend = backend;
        options.ttl = Duration::from_millis(500);
        options.stale = Duration::ZERO;
        options.fail_safe = Some(Duration::from_secs(60));
        options.timeout = Duration::from_secs(1);
        options.retries = 1;
        let (a, b) = (
            shared(options.clone(), fake_tier::tier(&store)),
            shared(options, fake_tier::tier(&store)),
        );
        let loads = Arc::new(AtomicUsize::new(0));
        let failing = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let get = |cache| {
            let (loads, failing) = (loads.clone(), failing.clone());
            cache_get(cache, 7, move |key| {
                let n = loads.fetch_add(1, SeqCst) + 1;
                let failing = failing.load(SeqCst);
                async move {
                    if n == 1 {
                        tokio::time::sleep(Duration::from_secs(10)).await; // past the timeout
                    }
                    match failing {
                        true => Err(format!("load {n}: down")),
                        false => Ok(format!("{key} v{n}")),
                    }
                }
            })
        };
        let first = tokio::spawn(get(a));
        tokio::time::sleep(Duration::from_millis(10)).await; // a holds the lock, loading
        within(b.prime(7, "7 primed".to_owned())).await.unwrap();
        tokio::time::sleep(Duration::from_millis(600)).await; // the prime's value expired
        let joined = tokio::spawn(get(a)); // after the prime: this call orders what follows
        assert_eq!(within(first).await.unwrap().unwrap(), "7 v2", "{backend:?}");
        assert_eq!(
            within(joined).await.unwrap().unwrap(),
            "7 v2",
            "{backend:?}"
        );
        assert_ne!(
            store.value(&7).as_deref(),
            Some("7 primed"),
            "{backend:?}: the prime's value is older than the retry's, which read the source later"
        );
        tokio::time::sleep(Duration::from_millis(600)).await; // v2 expired
        failing.store(true, SeqCst);
        // In the process that served v2 (b's memory keeps its own prime: processes are not
        // ordered with each other).
        assert_ne!(
            within(get(a)).await.as_deref().ok(),
            Some("7 primed"),
            "{backend:?}: an older value after a newer one"
        );
    }
}

/// `cache.get(key)` with `load` as the function's body.
fn cache_get<T, F, Fut>(
    cache: &'static Cache<u64, String, T>,
    key: u64,
    load: F,
) -> impl Future<Output = Result<String, Error>> + Send + 'static
where
    T: Tier<u64, String>,
    F: Fn(u64) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<String, String>> + Send + 'static,
{
    cache.get(key, move || move |key: &u64| load(*key))
}

#[tokio::test(start_paused = true)]
async fn a_refresh_that_joins_a_flight_serving_a_stale_value_returns_the_load_not_the_stale_value()
{
    // A stale call's flight hands its waiters the stale value at once while it reloads; a
    // companion's `refresh` that joins that flight asked for the source's value, not the one
    // being replaced. Both backends that share values: their flights serve stale this way.
    for backend in [Backend::Tiered, Backend::Redis] {
        let store = Store::new();
        let mut options = config("core::refresh_joins_stale");
        options.backend = backend;
        let cache = shared(options, fake_tier::tier(&store));
        let source = Source::new(Duration::from_secs(1));
        assert_eq!(within(source.get(cache, 6)).await.unwrap(), "6 v1");
        tokio::time::advance(Duration::from_secs(11)).await; // past the ttl: stale
        let stale = tokio::spawn(source.get(cache, 6));
        tokio::time::sleep(Duration::from_millis(10)).await; // its flight is loading
        assert_eq!(
            within(source.refresh(cache, 6)).await.unwrap(),
            "6 v2",
            "{backend:?}: the refresh returns the value loaded, not the stale one"
        );
        assert_eq!(within(stale).await.unwrap().unwrap(), "6 v1", "{backend:?}");
        assert_eq!(source.loads(), 2, "{backend:?}: one reload, shared");
    }
}

#[tokio::test(start_paused = true)]
async fn a_failed_load_does_not_fall_back_on_a_last_good_value_older_than_one_written_since() {
    // Simulation seed 70053874 (Redis only, `fail_safe`, `ttl_from`, `max_loads = 1`): a flight
    // read the store's value past its stale deadline (its last good value) and waited for
    // another process's load, whose newer value was written with a zero ttl (not to be kept:
    // gone at once). Its own load then failed, and a caller that had joined it after the newer
    // value was returned got the older one.
    fn not_kept(value: &(dyn std::any::Any + Send + Sync)) -> Option<Duration> {
        let value = value.downcast_ref::<String>()?;
        value.ends_with("v2").then_some(Duration::ZERO)
    }
    let store = Store::new();
    let safe = |name: &str| Config {
        backend: Backend::Redis,
        lock: Lock::Redis,
        ttl: Duration::from_millis(30),
        stale: Duration::ZERO,
        fail_safe: Some(Duration::from_secs(3_600)),
        ttl_from: Some(not_kept),
        ..config(name)
    };
    let first = shared(safe("core::last_good_newer"), fake_tier::tier(&store));
    let second = shared(safe("core::last_good_newer"), fake_tier::tier(&store));
    let source = Source::new(Duration::from_millis(100));
    assert_eq!(within(source.get(first, 1)).await.unwrap(), "1 v1");
    tokio::time::advance(Duration::from_secs(1)).await; // past its ttl: kept for fail-safe
    let newer = tokio::spawn(source.get(second, 1)); // takes the lock, loads "1 v2"
    tokio::time::sleep(Duration::from_millis(10)).await;
    let failing = tokio::spawn(first.get(1, || {
        |_: &u64| async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            Err::<String, String>("down".to_owned())
        }
    }));
    assert_eq!(within(newer).await.unwrap().unwrap(), "1 v2");
    let joined = tokio::spawn(source.get(first, 1));
    let failed = within(failing).await.unwrap();
    let joined = within(joined).await.unwrap();
    assert!(
        failed.is_err() && joined.is_err(),
        "not the last good value read before a newer one was written: {failed:?}, {joined:?}"
    );
    assert_eq!(
        source.loads(),
        2,
        "the caller that joined shared the failed load"
    );
}

#[tokio::test(start_paused = true)]
async fn a_flight_that_read_the_source_before_anothers_does_not_replace_its_value_in_memory() {
    // Simulation seeds 72506057 and 113721750 (tiered, the feed or Redis down): a call does not
    // join a flight begun longer ago than the trust bound, and loads anew. The older flight,
    // which read the source first, ended last and replaced the newer value in memory; a failed
    // load's fail-safe then served the older value after the newer one had been returned.
    let store = Store::new();
    store.fail.store(true, SeqCst); // every flight loads here, trusted for the bound
    let mut untrusted = fake_tier::tier(&store);
    untrusted.trusted_for = Some(Duration::from_secs(1));
    let safe = Config {
        fail_safe: Some(Duration::from_secs(3_600)),
        ..config("core::own_flights_by_read")
    };
    let cache = shared(safe, untrusted);
    let slow = Source::new(Duration::from_secs(3));
    let fast = Source {
        loads: slow.loads.clone(),
        delay: Duration::from_millis(500),
    };
    let first = tokio::spawn(slow.get(cache, 4)); // reads "4 v1" at once, ends at 3 s
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(within(fast.get(cache, 4)).await.unwrap(), "4 v2");
    within(first).await.unwrap().unwrap();
    let failed = within(cache.get(4, || {
        |_: &u64| async { Err::<String, String>("down".to_owned()) }
    }))
    .await;
    assert_eq!(
        failed.unwrap(),
        "4 v2",
        "the last good value is the one whose source was read last"
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_load_does_not_make_a_fresh_value_another_load_stored_live_past_its_ttl() {
    // Simulation seed 121443437 (memory, `lock = "none"`, `fail_safe`): two loads of a key
    // raced; the second stored its value, then the first failed, and its fail-safe kept that
    // still fresh value "fresh again for the throttle", past its own ttl.
    let cache = leak(
        Config {
            lock: Lock::None,
            ttl: Duration::from_secs(1),
            stale: Duration::ZERO,
            fail_safe: Some(Duration::from_secs(3_600)),
            fail_safe_throttle: Duration::from_secs(5),
            ..config("core::throttle_fresh")
        },
        Local,
    );
    let failing = tokio::spawn(cache.get(1, || {
        |_: &u64| async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            Err::<String, String>("down".to_owned())
        }
    }));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let source = Source::new(Duration::ZERO);
    assert_eq!(within(source.get(cache, 1)).await.unwrap(), "1 v1");
    assert_eq!(
        within(failing).await.unwrap().unwrap(),
        "1 v1",
        "the last good value"
    );
    tokio::time::sleep(Duration::from_millis(1_100)).await; // past v1's ttl, within the throttle
    assert_eq!(
        within(source.get(cache, 1)).await.unwrap(),
        "1 v2",
        "a fresh value keeps its own ttl"
    );
}

#[test]
fn options_set_for_a_caches_own_name_win_over_its_stems_whichever_was_set_first() {
    use crate::tuning::{Overrides, options_of, set};
    let ttl = |secs| Overrides {
        ttl: Some(Duration::from_secs(secs)),
        ..Overrides::default()
    };
    // The written name first, then one instantiation's own name; for the other pair, the
    // other way round.
    set("tuned::rows", &ttl(5));
    set("tuned::rows<u8>", &ttl(7));
    set("tuned::cols<u8>", &ttl(7));
    set("tuned::cols", &ttl(5));
    for (cache, secs) in [
        ("tuned::rows<u8>", 7),
        ("tuned::rows<u16>", 5),
        ("tuned::rows", 5),
        ("tuned::cols<u8>", 7),
        ("tuned::cols<u16>", 5),
        ("tuned::rowsx<u8>", 10),
        ("tuned::rows<u8>::inner", 10),
    ] {
        let options = options_of(&config(cache));
        assert_eq!(options.ttl, Duration::from_secs(secs), "{cache}");
    }
}

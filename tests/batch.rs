//! Batch functions in memory: many keys in one call of the function, each key cached on its own
//! with every per-key guarantee (one load per key, shared with single-key calls both ways,
//! invalidation of one key, errors only to the callers of the keys that failed, keys the
//! function leaves out), `batch_max`, `batch_window` and `ttl_from`.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use common::{AppError, eventually, within};
use stampede::cached;
use tokio::sync::Notify;

/// The calls a test's function received, each as the keys it was given.
struct Calls(Mutex<Vec<Vec<u64>>>);

impl Calls {
    const fn new() -> Self {
        Calls(Mutex::new(Vec::new()))
    }

    fn record(&self, keys: impl IntoIterator<Item = u64>) {
        let mut keys: Vec<u64> = keys.into_iter().collect();
        keys.sort_unstable();
        self.0.lock().unwrap().push(keys);
    }

    fn all(&self) -> Vec<Vec<u64>> {
        self.0.lock().unwrap().clone()
    }

    fn count(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// How many times each key was loaded, over every call.
    fn loads_per_key(&self) -> BTreeMap<u64, usize> {
        let mut loads = BTreeMap::new();
        for call in self.all() {
            for key in call {
                *loads.entry(key).or_default() += 1;
            }
        }
        loads
    }
}

fn product(id: u64) -> String {
    format!("product #{id}")
}

#[tokio::test]
async fn a_cold_batch_is_one_call_with_its_keys_and_then_every_key_is_a_hit() {
    static CALLS: Calls = Calls::new();

    #[cached(ttl = "60s", batch = ids, name = "batch::cold")]
    async fn products(ids: Vec<u64>) -> Result<HashMap<u64, String>, AppError> {
        CALLS.record(ids.iter().copied());
        Ok(ids.into_iter().map(|id| (id, product(id))).collect())
    }

    let found = within(products(vec![3, 1, 2, 1])).await.unwrap();
    let expected: HashMap<u64, String> = [1, 2, 3].map(|id| (id, product(id))).into();
    assert_eq!(found, expected);
    assert_eq!(CALLS.all(), [vec![1, 2, 3]], "one call, each key once");

    // Every key is now cached on its own: a batch of some of them, and of more, loads only the
    // keys it lacks.
    let again = within(products(vec![2, 3])).await.unwrap();
    assert_eq!(again.len(), 2);
    let more = within(products(vec![1, 4, 5])).await.unwrap();
    assert_eq!(more[&4], product(4));
    assert_eq!(CALLS.all(), [vec![1, 2, 3], vec![4, 5]]);
    let stats = stampede::stats("batch::cold").unwrap();
    assert_eq!(stats.loads, 2, "two calls of the function");
    assert_eq!(stats.misses, 5, "each key missed once");
    assert_eq!(stats.hits, 3);
    assert_eq!(stats.in_flight, 0);
    assert_eq!(stats.entries, 5);

    // The companion acts on one key.
    assert_eq!(products::peek(4), Some(Some(product(4))));
    products::invalidate(4).await.unwrap();
    assert_eq!(products::peek(4), None);
    products::prime(9, "primed".to_owned()).await.unwrap();
    let primed = within(products(vec![9, 4])).await.unwrap();
    assert_eq!(primed[&9], "primed");
    assert_eq!(
        CALLS.all().last().unwrap(),
        &vec![4],
        "only the invalidated key reloads"
    );
}

#[tokio::test]
async fn keys_the_map_leaves_out_are_answered_as_absent_and_cached_so() {
    static CALLS: Calls = Calls::new();

    /// Even ids exist.
    #[cached(ttl = "60s", batch = ids, name = "batch::missing")]
    async fn products(ids: &[u64]) -> BTreeMap<u64, String> {
        CALLS.record(ids.iter().copied());
        ids.iter()
            .filter(|id| *id % 2 == 0)
            .map(|&id| (id, product(id)))
            .collect()
    }

    let found = within(products(&[1, 2, 3, 4])).await;
    assert_eq!(found.keys().copied().collect::<Vec<_>>(), [2, 4]);
    // Absent keys are cached like values (by default for `ttl`): no call asks for them again.
    let again = within(products(&[1, 3, 4])).await;
    assert_eq!(again.keys().copied().collect::<Vec<_>>(), [4]);
    assert_eq!(CALLS.count(), 1);
    assert_eq!(products::peek(3), Some(None), "cached as absent");
}

#[tokio::test(start_paused = true)]
async fn missing_ttl_bounds_how_long_a_key_is_cached_as_absent() {
    static CALLS: Calls = Calls::new();
    static CREATED: AtomicBool = AtomicBool::new(false);

    #[cached(ttl = "60s", jitter = 0, missing_ttl = "5s", batch = ids, name = "batch::missing_ttl")]
    async fn products(ids: HashSet<u64>) -> HashMap<u64, String> {
        CALLS.record(ids.iter().copied());
        ids.into_iter()
            .filter(|id| *id == 1 || CREATED.load(SeqCst))
            .map(|id| (id, product(id)))
            .collect()
    }

    #[cached(ttl = "60s", missing_ttl = "0s", batch = ids, name = "batch::missing_uncached")]
    async fn uncached_missing(ids: Vec<u64>) -> HashMap<u64, String> {
        CALLS.record(ids.iter().map(|id| id + 100));
        ids.into_iter()
            .filter(|id| *id == 1)
            .map(|id| (id, product(id)))
            .collect()
    }

    let keys: HashSet<u64> = [1, 2].into();
    assert_eq!(within(products(keys.clone())).await.len(), 1);
    CREATED.store(true, SeqCst); // key 2 is created meanwhile
    tokio::time::advance(Duration::from_secs(4)).await;
    assert_eq!(
        within(products(keys.clone())).await.len(),
        1,
        "still cached as absent"
    );
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(
        within(products(keys.clone())).await.len(),
        2,
        "its absence expired"
    );
    assert_eq!(CALLS.all(), [vec![1, 2], vec![2]]);

    // `"0s"`: an absent key is asked for again by every call; a found one stays cached.
    for _ in 0..3 {
        assert_eq!(within(uncached_missing(vec![1, 2])).await.len(), 1);
    }
    assert_eq!(&CALLS.all()[2..], [vec![101, 102], vec![102], vec![102]]);
}

/// `missing_ttl = "0s"` is "not cached": no stale window serves the absence (the stale window is
/// for values, and an absence cached for no time has none), and no fail-safe keeps it.
#[tokio::test(start_paused = true)]
async fn missing_ttl_zero_caches_no_absence_whatever_stale_and_fail_safe_say() {
    static CALLS: Calls = Calls::new();
    static FAILING: AtomicBool = AtomicBool::new(false);

    #[cached(
        ttl = "60s",
        stale = "30s",
        fail_safe = "5m",
        missing_ttl = "0s",
        batch = ids,
        name = "batch::missing_zero_stale"
    )]
    async fn products(ids: Vec<u64>) -> Result<HashMap<u64, String>, AppError> {
        CALLS.record(ids.iter().copied());
        if FAILING.load(SeqCst) {
            return Err(AppError::Db("the source is down".into()));
        }
        Ok(ids
            .into_iter()
            .filter(|id| *id == 1)
            .map(|id| (id, product(id)))
            .collect())
    }

    assert_eq!(within(products(vec![1, 2])).await.unwrap().len(), 1);
    tokio::time::advance(Duration::from_millis(10)).await;
    assert_eq!(within(products(vec![1, 2])).await.unwrap().len(), 1);
    assert_eq!(
        CALLS.all(),
        [vec![1, 2], vec![2]],
        "the absent key is asked for again, not served stale"
    );
    FAILING.store(true, SeqCst);
    assert!(
        within(products(vec![2])).await.is_err(),
        "no absence is kept as a last good value"
    );
}

/// A gate that holds the loads of a test until it is opened.
struct Gate {
    opened: AtomicBool,
    notify: Notify,
    entered: AtomicUsize,
}

impl Gate {
    const fn new() -> Self {
        Gate {
            opened: AtomicBool::new(false),
            notify: Notify::const_new(),
            entered: AtomicUsize::new(0),
        }
    }

    async fn pass(&self) {
        self.entered.fetch_add(1, SeqCst);
        loop {
            let notified = self.notify.notified();
            if self.opened.load(SeqCst) {
                return;
            }
            notified.await;
        }
    }

    fn open(&self) {
        self.opened.store(true, SeqCst);
        self.notify.notify_waiters();
    }

    async fn entered(&self, loads: usize) {
        eventually("the loads to reach the gate", || {
            self.entered.load(SeqCst) >= loads
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_key_calls_join_a_running_batch_and_a_batch_joins_them() {
    static CALLS: Calls = Calls::new();
    static GATE: Gate = Gate::new();

    #[cached(ttl = "60s", batch = ids, name = "batch::both_ways")]
    async fn products(ids: Vec<u64>) -> Result<HashMap<u64, String>, AppError> {
        CALLS.record(ids.iter().copied());
        GATE.pass().await;
        Ok(ids.into_iter().map(|id| (id, product(id))).collect())
    }

    /// One product: a single-key call of the batch function's cache.
    #[cached(batch_loader = products)]
    async fn one(id: u64) -> Result<Option<String>, AppError>;

    // A batch of 1..=3 is loading; single-key calls of 2 and 3 join it.
    let batch = tokio::spawn(products(vec![1, 2, 3]));
    GATE.entered(1).await;
    let singles: Vec<_> = [2, 3, 3].map(|id| tokio::spawn(one(id))).into();
    // A single-key call of a key nobody loads starts its own load, and a batch asking for it and
    // for a key of the running batch joins both flights: it loads nothing itself.
    let alone = tokio::spawn(one(4));
    GATE.entered(2).await;
    let joined = tokio::spawn(products(vec![3, 4]));
    eventually("the joining calls to wait", || {
        stampede::stats("batch::both_ways").unwrap().waiters >= 6
    })
    .await;
    GATE.open();

    let batch = within(batch).await.unwrap().unwrap();
    assert_eq!(batch.len(), 3);
    for single in singles {
        let value = within(single).await.unwrap().unwrap();
        assert!(value.is_some());
    }
    assert_eq!(within(alone).await.unwrap().unwrap(), Some(product(4)));
    let joined = within(joined).await.unwrap().unwrap();
    assert_eq!(joined, [3, 4].map(|id| (id, product(id))).into());
    assert_eq!(CALLS.all(), [vec![1, 2, 3], vec![4]]);
    assert_eq!(stampede::stats("batch::both_ways").unwrap().in_flight, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_batches_and_single_key_calls_never_load_a_key_twice() {
    static CALLS: Calls = Calls::new();

    #[cached(ttl = "60s", batch = ids, name = "batch::overlapping")]
    async fn products(ids: Vec<u64>) -> Result<HashMap<u64, String>, AppError> {
        CALLS.record(ids.iter().copied());
        tokio::time::sleep(Duration::from_millis(20)).await;
        Ok(ids.into_iter().map(|id| (id, product(id))).collect())
    }

    #[cached(batch_loader = products)]
    async fn one(id: u64) -> Result<Option<String>, AppError>;

    let start = std::sync::Arc::new(tokio::sync::Barrier::new(60));
    let mut calls = Vec::new();
    for caller in 0..60u64 {
        let start = start.clone();
        calls.push(tokio::spawn(async move {
            start.wait().await;
            // Windows of 20 keys that overlap their neighbours', and single keys among them.
            let first = (caller * 7) % 80;
            let keys: Vec<u64> = (first..first + 20).collect();
            if caller % 3 == 0 {
                let id = keys[caller as usize % 20];
                let value = one(id).await.unwrap();
                assert_eq!(value, Some(product(id)));
            } else {
                let found = products(keys.clone()).await.unwrap();
                assert_eq!(found.len(), 20);
                assert!(keys.iter().all(|id| found[id] == product(*id)));
            }
        }));
    }
    for call in calls {
        within(call).await.unwrap();
    }
    let loads = CALLS.loads_per_key();
    assert!(loads.values().all(|&loads| loads == 1), "{loads:?}");
    let stats = stampede::stats("batch::overlapping").unwrap();
    assert_eq!(stats.in_flight, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalidation_during_a_batch_detaches_that_key_only() {
    static CALLS: Calls = Calls::new();
    static GATE: Gate = Gate::new();
    static VERSION: AtomicUsize = AtomicUsize::new(1);

    #[cached(ttl = "60s", batch = ids, name = "batch::invalidated")]
    async fn products(ids: Vec<u64>) -> Result<HashMap<u64, String>, AppError> {
        let version = VERSION.load(SeqCst);
        CALLS.record(ids.iter().copied());
        if version == 1 {
            GATE.pass().await;
        }
        Ok(ids
            .into_iter()
            .map(|id| (id, format!("{} v{version}", product(id))))
            .collect())
    }

    let batch = tokio::spawn(products(vec![1, 2]));
    GATE.entered(1).await;
    // The row of 1 changes while the batch reads: the write path invalidates it.
    VERSION.store(2, SeqCst);
    within(products::invalidate(1)).await.unwrap();
    GATE.open();

    // The batch's caller gets what its load read (Go's `Forget`): that load began before the
    // invalidation...
    let first = within(batch).await.unwrap().unwrap();
    assert_eq!(first[&1], "product #1 v1");
    // ... but stored nothing for key 1: the next call loads it again, and only it.
    let after = within(products(vec![1, 2])).await.unwrap();
    assert_eq!(after[&1], "product #1 v2");
    assert_eq!(after[&2], "product #2 v1", "key 2 was not invalidated");
    assert_eq!(CALLS.all(), [vec![1, 2], vec![1]]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_batch_reaches_only_the_callers_of_its_keys() {
    static CALLS: Calls = Calls::new();
    static GATE: Gate = Gate::new();

    /// Fails for any call that holds key 1.
    #[cached(ttl = "60s", batch = ids, name = "batch::failing")]
    async fn products(ids: Vec<u64>) -> Result<HashMap<u64, String>, AppError> {
        CALLS.record(ids.iter().copied());
        GATE.pass().await;
        if ids.contains(&1) {
            return Err(AppError::Db("connection reset".into()));
        }
        Ok(ids.into_iter().map(|id| (id, product(id))).collect())
    }

    #[cached(batch_loader = products)]
    async fn one(id: u64) -> Result<Option<String>, AppError>;

    let failing = tokio::spawn(products(vec![1, 2]));
    GATE.entered(1).await;
    let fine = tokio::spawn(one(3));
    GATE.entered(2).await;
    // Joins the failing load for key 2 and the fine one for key 3.
    let mixed = tokio::spawn(products(vec![2, 3]));
    let joined_failing = tokio::spawn(one(2));
    eventually("the joining calls to wait", || {
        stampede::stats("batch::failing").unwrap().waiters >= 6
    })
    .await;
    GATE.open();

    let error = within(failing).await.unwrap().unwrap_err();
    assert!(
        matches!(&error, AppError::Db(message) if message == "connection reset"),
        "{error:?}"
    );
    assert_eq!(within(fine).await.unwrap().unwrap(), Some(product(3)));
    let mixed = within(mixed).await.unwrap().unwrap_err();
    assert!(
        matches!(mixed, AppError::Db(_)),
        "it asked for key 2: {mixed:?}"
    );
    assert!(within(joined_failing).await.unwrap().is_err());
    // Errors are not cached; key 3's value is.
    assert_eq!(products::peek(3), Some(Some(product(3))));
    assert_eq!(products::peek(2), None);
    let retried = within(products(vec![2, 3])).await.unwrap();
    assert_eq!(retried.len(), 2);
    assert_eq!(CALLS.all(), [vec![1, 2], vec![3], vec![2]]);
}

#[tokio::test]
async fn the_own_error_of_a_load_with_one_caller_comes_back_as_itself() {
    #[derive(Debug)]
    struct NotClone(&'static str);
    impl std::fmt::Display for NotClone {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }
    #[derive(Debug)]
    enum Failure {
        Source(NotClone),
        Cache(#[allow(dead_code, reason = "only shown through Debug")] stampede::Error),
    }
    impl std::fmt::Display for Failure {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "{self:?}")
        }
    }
    impl From<stampede::Error> for Failure {
        fn from(error: stampede::Error) -> Self {
            Failure::Cache(error)
        }
    }

    #[cached(ttl = "60s", batch = ids, name = "batch::own_error")]
    async fn products(ids: Vec<u64>) -> Result<HashMap<u64, String>, Failure> {
        let _ = ids;
        Err(Failure::Source(NotClone("no such table")))
    }

    let error = within(products(vec![1, 2, 3])).await.unwrap_err();
    assert!(
        matches!(error, Failure::Source(NotClone("no such table"))),
        "{error:?}"
    );
}

#[tokio::test]
async fn batch_max_splits_a_large_batch_into_calls_of_at_most_that_many_keys() {
    static CALLS: Calls = Calls::new();

    #[cached(ttl = "60s", batch = ids, batch_max = 100, name = "batch::max")]
    async fn products(ids: Vec<u64>) -> Result<HashMap<u64, String>, AppError> {
        CALLS.record(ids.iter().copied());
        Ok(ids.into_iter().map(|id| (id, product(id))).collect())
    }

    let keys: Vec<u64> = (0..250).collect();
    let found = within(products(keys)).await.unwrap();
    assert_eq!(found.len(), 250);
    let mut sizes: Vec<usize> = CALLS.all().iter().map(Vec::len).collect();
    sizes.sort_unstable();
    assert_eq!(sizes, [50, 100, 100]);
    assert_eq!(CALLS.loads_per_key().len(), 250, "every key loaded once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_key_calls_within_the_window_are_loaded_by_one_call() {
    static CALLS: Calls = Calls::new();

    #[cached(ttl = "60s", batch = ids, batch_max = 40, name = "batch::window")]
    async fn products(ids: Vec<u64>) -> Result<HashMap<u64, String>, AppError> {
        CALLS.record(ids.iter().copied());
        Ok(ids.into_iter().map(|id| (id, product(id))).collect())
    }

    /// A handler written per item still makes one query.
    #[cached(batch_loader = products, batch_window = "50ms")]
    async fn one(id: u64) -> Result<Option<String>, AppError>;

    let start = std::sync::Arc::new(tokio::sync::Barrier::new(30));
    let calls: Vec<_> = (0..30u64)
        .map(|id| {
            let start = start.clone();
            tokio::spawn(async move {
                start.wait().await;
                one(id).await
            })
        })
        .collect();
    for (id, call) in (0..30u64).zip(calls) {
        assert_eq!(within(call).await.unwrap().unwrap(), Some(product(id)));
    }
    let calls = CALLS.all();
    assert_eq!(calls.len(), 1, "one call for the window: {calls:?}");
    assert_eq!(calls[0], (0..30).collect::<Vec<_>>());

    // A full window (batch_max) is loaded at once, the rest in the next window.
    let keys: Vec<u64> = (100..150).collect();
    let calls: Vec<_> = keys.iter().map(|&id| tokio::spawn(one(id))).collect();
    for call in calls {
        assert!(within(call).await.unwrap().unwrap().is_some());
    }
    let sizes: BTreeSet<usize> = CALLS.all()[1..].iter().map(Vec::len).collect();
    assert!(sizes.iter().all(|&size| size <= 40), "{sizes:?}");
    assert_eq!(CALLS.loads_per_key().len(), 80);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_key_arguments_group_the_keys_of_a_window() {
    static CALLS: Mutex<Vec<(String, Vec<u64>)>> = Mutex::new(Vec::new());

    #[cached(ttl = "60s", batch = ids, name = "batch::regions")]
    async fn prices(region: &str, ids: Vec<u64>) -> Result<HashMap<u64, String>, AppError> {
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        CALLS.lock().unwrap().push((region.to_owned(), sorted));
        Ok(ids
            .into_iter()
            .map(|id| (id, format!("{id} in {region}")))
            .collect())
    }

    #[cached(batch_loader = prices, batch_window = "50ms")]
    async fn price(region: &str, id: u64) -> Result<Option<String>, AppError>;

    let eu = tokio::spawn(async { price("eu", 1).await });
    let us = tokio::spawn(async { price("us", 1).await });
    let eu2 = tokio::spawn(async { price("eu", 2).await });
    assert_eq!(within(eu).await.unwrap().unwrap().unwrap(), "1 in eu");
    assert_eq!(within(us).await.unwrap().unwrap().unwrap(), "1 in us");
    assert_eq!(within(eu2).await.unwrap().unwrap().unwrap(), "2 in eu");
    let found = within(prices("us", vec![1, 2])).await.unwrap();
    assert_eq!(found[&2], "2 in us");
    let mut calls = CALLS.lock().unwrap().clone();
    calls.sort();
    // Each call of the function had one region; key ("us", 1) was loaded once.
    assert_eq!(
        calls,
        [
            ("eu".to_owned(), vec![1, 2]),
            ("us".to_owned(), vec![1]),
            ("us".to_owned(), vec![2])
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn stale_keys_of_a_batch_are_served_and_refreshed_by_one_call() {
    static CALLS: Calls = Calls::new();
    static VERSION: AtomicUsize = AtomicUsize::new(1);

    #[cached(ttl = "10s", jitter = 0, stale = "60s", batch = ids, name = "batch::stale")]
    async fn products(ids: Vec<u64>) -> Result<HashMap<u64, String>, AppError> {
        CALLS.record(ids.iter().copied());
        let version = VERSION.load(SeqCst);
        Ok(ids
            .into_iter()
            .map(|id| (id, format!("{id} v{version}")))
            .collect())
    }

    within(products(vec![1, 2, 3])).await.unwrap();
    tokio::time::advance(Duration::from_secs(5)).await;
    within(products(vec![4])).await.unwrap();
    tokio::time::advance(Duration::from_secs(6)).await; // 1..=3 stale, 4 fresh
    VERSION.store(2, SeqCst);
    let served = within(products(vec![1, 2, 3, 4, 5])).await.unwrap();
    assert_eq!(served[&1], "1 v1", "stale, served at once");
    assert_eq!(served[&5], "5 v2", "missing, loaded");
    eventually("the background refresh", || CALLS.count() == 4).await;
    let calls = CALLS.all();
    assert!(
        calls[2..].contains(&vec![1, 2, 3]),
        "one refresh of the stale keys: {calls:?}"
    );
    eventually("the refreshed values", || {
        products::peek(1) == Some(Some("1 v2".to_owned()))
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn ttl_from_gives_each_value_its_own_fresh_time_within_ttl() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[derive(Clone, Debug, PartialEq)]
    struct Token {
        value: String,
        /// Seconds until it expires, as the issuer said.
        expires_in: u64,
    }

    fn lifetime(token: &Token) -> Duration {
        Duration::from_secs(token.expires_in)
    }

    /// Tokens that do not say when they expire live `ttl`.
    fn maybe_lifetime(token: &Token) -> Option<Duration> {
        (token.expires_in > 0).then(|| Duration::from_secs(token.expires_in))
    }

    #[cached(ttl = "60s", jitter = 0, ttl_from = lifetime, name = "batch::ttl_from")]
    async fn token(service: u64) -> Token {
        LOADS.fetch_add(1, SeqCst);
        Token {
            value: format!("token of {service}"),
            expires_in: service,
        }
    }

    #[cached(ttl = "60s", jitter = 0, ttl_from = "maybe_lifetime", batch = services, name = "batch::ttl_from_batch")]
    async fn tokens(services: Vec<u64>) -> HashMap<u64, Token> {
        LOADS.fetch_add(100, SeqCst);
        services
            .into_iter()
            .map(|service| {
                let token = Token {
                    value: format!("token of {service}"),
                    expires_in: service,
                };
                (service, token)
            })
            .collect()
    }

    within(token(5)).await;
    within(token(600)).await; // asks for more than `ttl`: capped at it
    tokio::time::advance(Duration::from_secs(5)).await;
    within(token(5)).await;
    assert_eq!(LOADS.load(SeqCst), 3, "the 5 s token expired after 5 s");
    tokio::time::advance(Duration::from_secs(54)).await;
    within(token(600)).await;
    assert_eq!(LOADS.load(SeqCst), 3, "fresh for 59 s");
    tokio::time::advance(Duration::from_secs(1)).await;
    within(token(600)).await;
    assert_eq!(LOADS.load(SeqCst), 4, "but no longer than `ttl`");

    LOADS.store(0, SeqCst);
    within(tokens(vec![0, 2])).await;
    tokio::time::advance(Duration::from_secs(2)).await;
    within(tokens(vec![0])).await;
    assert_eq!(
        LOADS.load(SeqCst),
        100,
        "a token without a lifetime lives `ttl`"
    );
    within(tokens(vec![2])).await;
    assert_eq!(LOADS.load(SeqCst), 200, "the 2 s token expired");
}

/// `source_version` on a batch function: a refresh or a prime that read an older version of a
/// key never replaces the newer value memory holds, and its caller gets the newer one, as for a
/// single-key function; a key the function now leaves out (a deleted row) has no version, and
/// replaces what was held.
#[tokio::test]
async fn a_batch_never_replaces_a_newer_source_version_in_memory() {
    use std::sync::atomic::AtomicU64;
    static VERSION: AtomicU64 = AtomicU64::new(5);
    static DELETED: AtomicU64 = AtomicU64::new(u64::MAX);

    #[derive(Clone, Debug, PartialEq)]
    struct Row {
        id: u64,
        version: u64,
    }
    fn row_version(row: &Row) -> u64 {
        row.version
    }
    #[cached(ttl = "60s", batch = ids, source_version = row_version, name = "batch::versions")]
    async fn rows(ids: Vec<u64>) -> HashMap<u64, Row> {
        let version = VERSION.load(SeqCst);
        ids.into_iter()
            .filter(|&id| id != DELETED.load(SeqCst))
            .map(|id| (id, Row { id, version }))
            .collect()
    }
    let versions = |found: HashMap<u64, Row>| {
        let mut versions: Vec<(u64, u64)> =
            found.into_values().map(|r| (r.id, r.version)).collect();
        versions.sort_unstable();
        versions
    };

    assert_eq!(versions(within(rows(vec![1, 2])).await), [(1, 5), (2, 5)]);
    VERSION.store(4, SeqCst); // the replica the load reads lags
    assert_eq!(
        versions(within(rows::refresh(vec![1, 2])).await),
        [(1, 5), (2, 5)],
        "the newer values memory holds"
    );
    assert_eq!(
        rows::peek(1).map(|row| row.map(|row| row.version)),
        Some(Some(5))
    );
    assert_eq!(
        stampede::stats("batch::versions").unwrap().older_versions,
        2
    );
    within(rows::prime(1, Row { id: 1, version: 3 }))
        .await
        .unwrap();
    assert_eq!(
        rows::peek(1).map(|row| row.map(|row| row.version)),
        Some(Some(5))
    );

    VERSION.store(6, SeqCst);
    DELETED.store(2, SeqCst);
    assert_eq!(versions(within(rows::refresh(vec![1, 2])).await), [(1, 6)]);
    assert_eq!(rows::peek(2), Some(None), "the deleted row is absent now");
}

/// A batch function's companion `read_through` skips memory: with no shared tier, each key is
/// loaded again (one call of the function for them), and the calls after it are hits on the
/// values it loaded.
#[tokio::test]
async fn read_through_of_a_batch_function_skips_memory_and_keeps_what_it_loads() {
    static CALLS: Calls = Calls::new();
    static VERSION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

    #[cached(ttl = "60s", batch = ids, name = "batch::through")]
    async fn products(ids: Vec<u64>) -> Result<HashMap<u64, String>, AppError> {
        CALLS.record(ids.iter().copied());
        let version = VERSION.load(std::sync::atomic::Ordering::SeqCst);
        Ok(ids
            .into_iter()
            .map(|id| (id, format!("{id} v{version}")))
            .collect())
    }

    within(products(vec![1, 2])).await.unwrap();
    VERSION.store(2, std::sync::atomic::Ordering::SeqCst);
    let through = within(products::read_through(vec![1, 2])).await.unwrap();
    assert_eq!(through[&1], "1 v2");
    assert_eq!(through[&2], "2 v2");
    assert_eq!(
        CALLS.all(),
        [vec![1, 2], vec![1, 2]],
        "one call for both keys"
    );
    let after = within(products(vec![1, 2])).await.unwrap();
    assert_eq!(after[&1], "1 v2", "kept in memory");
    assert_eq!(CALLS.count(), 2, "a hit");
}

//! Options given as a path in the attribute (`ttl = config::product_ttl`): a function called or
//! a constant copied when the cache is built, converted to the option's type and checked as a
//! literal is; a value refused is an error in the log naming the cache and the option, and the
//! cache keeps nothing, never panics. On a paused clock.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use common::{AppError, telemetry, within};
use stampede::cached;

/// Where a service keeps its options: functions reading its configuration, and constants.
mod config {
    use std::time::Duration;

    pub fn product_ttl() -> Duration {
        Duration::from_secs(2)
    }

    pub const STALE: &str = "3s";

    pub fn retries() -> usize {
        2
    }

    pub const JITTER: u8 = 0;

    pub fn zero() -> Duration {
        Duration::ZERO
    }

    pub fn parsecs() -> String {
        "5 parsecs".to_owned()
    }
}

fn options_of(name: &str) -> stampede::Config {
    stampede::caches()
        .into_iter()
        .find(|cache| &*cache.config.name == name)
        .expect("the cache is listed")
        .config
}

#[tokio::test(start_paused = true)]
async fn a_function_and_constants_give_the_ttl_stale_and_jitter() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = config::product_ttl, stale = config::STALE, jitter = config::JITTER, name = "code::product")]
    async fn product(id: u64) -> usize {
        LOADS.fetch_add(1, SeqCst) + id as usize
    }

    assert_eq!(within(product(0)).await, 0);
    tokio::time::sleep(Duration::from_millis(1_900)).await;
    assert_eq!(within(product(0)).await, 0, "fresh for the function's 2 s");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        within(product(0)).await,
        0,
        "stale within the constant's \"3s\": served while one refresh runs"
    );
    let refreshed = async {
        while product(0).await == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    within(refreshed).await;
    let options = options_of("code::product");
    assert_eq!(
        (options.ttl, options.stale, options.jitter),
        (Duration::from_secs(2), Duration::from_secs(3), 0),
        "caches() shows the values the paths gave"
    );
}

#[tokio::test(start_paused = true)]
async fn a_count_of_another_integer_type_is_converted() {
    static ATTEMPTS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", retries = config::retries, backoff = "10ms", name = "code::flaky")]
    async fn flaky(id: u64) -> Result<u64, AppError> {
        if ATTEMPTS.fetch_add(1, SeqCst) < 2 {
            return Err(AppError::Db("not yet".into()));
        }
        Ok(id)
    }

    assert_eq!(within(flaky(7)).await.unwrap(), 7, "the third attempt");
    assert_eq!(ATTEMPTS.load(SeqCst), 3);
    assert_eq!(options_of("code::flaky").retries, 2);
}

#[tokio::test(start_paused = true)]
async fn run_time_configuration_wins_over_a_path() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = config::product_ttl, jitter = 0, name = "code::configured")]
    async fn page(id: u64) -> usize {
        LOADS.fetch_add(1, SeqCst) + id as usize
    }

    stampede::configure("code::configured")
        .ttl(Duration::from_secs(60))
        .apply()
        .unwrap();
    assert_eq!(within(page(0)).await, 0);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        within(page(0)).await,
        0,
        "fresh for the 60 s set at run time"
    );
    assert_eq!(options_of("code::configured").ttl, Duration::from_secs(60));
}

#[tokio::test(start_paused = true)]
async fn a_method_reads_an_associated_constant() {
    #[derive(Clone)]
    struct Repo {
        loads: std::sync::Arc<AtomicUsize>,
    }

    impl Repo {
        const TTL: Duration = Duration::from_secs(5);

        #[cached(ttl = Self::TTL, jitter = 0, name = "code::method")]
        async fn user(&self, id: u64) -> usize {
            self.loads.fetch_add(1, SeqCst) + id as usize
        }
    }

    let repo = Repo {
        loads: Default::default(),
    };
    assert_eq!(within(repo.user(0)).await, 0);
    tokio::time::sleep(Duration::from_millis(4_900)).await;
    assert_eq!(within(repo.user(0)).await, 0, "fresh for 5 s");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(within(repo.user(0)).await, 1, "loaded again after 5 s");
    assert_eq!(options_of("code::method").ttl, Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn a_refused_value_is_logged_with_the_cache_and_the_option_and_nothing_is_kept() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);
    static TEXT_LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = config::zero, name = "code::zero")]
    async fn zero(id: u64) -> usize {
        LOADS.fetch_add(1, SeqCst) + id as usize
    }

    #[cached(ttl = "60s", stale = config::parsecs, name = "code::parsecs")]
    async fn parsecs(id: u64) -> Result<usize, AppError> {
        Ok(TEXT_LOADS.fetch_add(1, SeqCst) + id as usize)
    }

    // A literal checked against a path's value: `refresh_after` must stay below the 2 s `ttl`.
    #[cached(ttl = config::product_ttl, refresh_after = "45s", name = "code::ahead")]
    async fn ahead(id: u64) -> u64 {
        id
    }

    telemetry::install();
    // A lookup by another name does not read these caches' paths: nothing is logged yet.
    assert!(stampede::configure("code::nobody").apply().is_err());
    assert!(
        telemetry::errors_with("cache", "code::zero").is_empty(),
        "a lookup by another name read the paths of `code::zero`"
    );
    assert_eq!(within(zero(0)).await, 0);
    assert_eq!(
        within(zero(0)).await,
        1,
        "no value is kept: each call loads"
    );
    assert_eq!(within(parsecs(0)).await.unwrap(), 0);
    assert_eq!(within(parsecs(0)).await.unwrap(), 1);
    assert_eq!(within(ahead(3)).await, 3);
    for (cache, option, why) in [
        ("code::zero", "ttl", "must be above zero"),
        ("code::parsecs", "stale", "`5 parsecs` is not a duration"),
        ("code::ahead", "refresh_after", "below `ttl`"),
    ] {
        let logged = telemetry::errors_with("cache", cache);
        assert!(
            logged
                .iter()
                .any(|fields| fields.get("option").is_some_and(|o| o == option)
                    && fields.get("message").is_some_and(|m| m.contains(why))),
            "{cache}: {logged:?}"
        );
    }
}

/// A batch function's `missing_ttl` and `batch_max`, and a `batch_loader` function's
/// `batch_window`, from the code: `missing_ttl` is read by each fill of a key left out, the
/// window by each call, once per process.
mod batch {
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    use std::time::Duration;

    use super::{AppError, telemetry, within};
    use stampede::cached;

    pub const MISSING: &str = "5s";
    pub const MOST: u16 = 2;

    pub fn window() -> Duration {
        Duration::from_millis(50)
    }

    pub fn no_window() -> Duration {
        Duration::ZERO
    }

    #[tokio::test(start_paused = true)]
    async fn missing_ttl_and_batch_max_from_the_code() {
        static CALLS: Mutex<Vec<Vec<u64>>> = Mutex::new(Vec::new());
        static CREATED: AtomicBool = AtomicBool::new(false);

        #[cached(ttl = "60s", jitter = 0, missing_ttl = MISSING, batch = ids, batch_max = MOST, name = "code::batch")]
        async fn products(ids: Vec<u64>) -> HashMap<u64, u64> {
            CALLS.lock().unwrap().push(ids.clone());
            ids.into_iter()
                .filter(|id| *id == 1 || CREATED.load(SeqCst))
                .map(|id| (id, id))
                .collect()
        }

        assert_eq!(within(products(vec![1, 2])).await.len(), 1);
        CREATED.store(true, SeqCst);
        tokio::time::advance(Duration::from_secs(4)).await;
        assert_eq!(
            within(products(vec![1, 2])).await.len(),
            1,
            "still cached as absent"
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(
            within(products(vec![1, 2])).await.len(),
            2,
            "absent for the constant's 5 s"
        );
        within(products(vec![3, 4, 5])).await;
        let mut sizes: Vec<usize> = CALLS.lock().unwrap()[2..].iter().map(Vec::len).collect();
        sizes.sort_unstable();
        assert_eq!(
            sizes,
            [1, 2],
            "split in calls of at most the constant's 2 keys"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_window_from_the_code_and_one_refused() {
        static CALLS: Mutex<Vec<Vec<u64>>> = Mutex::new(Vec::new());

        #[cached(ttl = "60s", batch = ids, name = "code::window")]
        async fn products(ids: Vec<u64>) -> Result<HashMap<u64, u64>, AppError> {
            CALLS.lock().unwrap().push(ids.clone());
            Ok(ids.into_iter().map(|id| (id, id)).collect())
        }

        #[cached(batch_loader = products, batch_window = window)]
        async fn one(id: u64) -> Result<Option<u64>, AppError>;

        #[cached(batch_loader = products, batch_window = no_window)]
        async fn alone(id: u64) -> Result<Option<u64>, AppError>;

        telemetry::install();
        let start = std::sync::Arc::new(tokio::sync::Barrier::new(10));
        let calls: Vec<_> = (0..10u64)
            .map(|id| {
                let start = start.clone();
                tokio::spawn(async move {
                    start.wait().await;
                    one(id).await
                })
            })
            .collect();
        for (id, call) in (0..10u64).zip(calls) {
            assert_eq!(within(call).await.unwrap().unwrap(), Some(id));
        }
        assert_eq!(CALLS.lock().unwrap().len(), 1, "one call for the window");

        for id in [20, 21] {
            assert_eq!(within(alone(id)).await.unwrap(), Some(id));
        }
        assert_eq!(
            CALLS.lock().unwrap()[1..],
            [vec![20], vec![21]],
            "no window: each alone"
        );
        let logged = telemetry::errors_with("option", "batch_window");
        assert!(
            logged.iter().any(|fields| fields
                .get("message")
                .is_some_and(|m| m.contains("cannot be zero"))
                && fields
                    .get("function")
                    .is_some_and(|f| f.ends_with("::alone"))),
            "{logged:?}"
        );
    }
}

//! Options at run time (`stampede::configure`): set at start-up or while the service runs, for
//! new fills and loads; a bad value is an error that names the cache and the option. On a
//! paused clock.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use common::{AppError, within};
use stampede::cached;

#[tokio::test(start_paused = true)]
async fn a_ttl_set_at_start_up_applies_to_the_first_fill() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "1h", jitter = 0, name = "configure::start")]
    async fn rate(id: u64) -> usize {
        LOADS.fetch_add(1, SeqCst) + id as usize
    }

    stampede::configure("configure::start")
        .ttl(Duration::from_secs(2))
        .apply()
        .unwrap();
    assert_eq!(within(rate(0)).await, 0);
    tokio::time::sleep(Duration::from_millis(1_900)).await;
    assert_eq!(within(rate(0)).await, 0, "fresh for the 2 s set");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(within(rate(0)).await, 1, "expired after 2 s, not an hour");
    let shown = stampede::caches()
        .into_iter()
        .find(|cache| &*cache.config.name == "configure::start")
        .unwrap();
    assert_eq!(
        shown.config.ttl,
        Duration::from_secs(2),
        "caches() shows it"
    );
}

#[tokio::test(start_paused = true)]
async fn a_change_at_run_time_applies_to_new_fills_and_leaves_held_values_as_they_were() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", jitter = 0, name = "configure::running")]
    async fn page(id: u64) -> usize {
        LOADS.fetch_add(1, SeqCst) + id as usize
    }

    assert_eq!(within(page(0)).await, 0);
    stampede::configure("configure::running")
        .ttl(Duration::from_secs(1))
        .apply()
        .unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(within(page(0)).await, 0, "held with its 60 s");
    assert_eq!(within(page(10)).await, 11, "a new fill");
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert_eq!(within(page(10)).await, 12, "the new fill lived 1 s");
    // Set again later: the latest value of each option wins, the others stay.
    stampede::configure("configure::running")
        .stale(Duration::from_secs(30))
        .apply()
        .unwrap();
    let shown = stampede::caches()
        .into_iter()
        .find(|cache| &*cache.config.name == "configure::running")
        .unwrap();
    assert_eq!(
        (shown.config.ttl, shown.config.stale),
        (Duration::from_secs(1), Duration::from_secs(30))
    );
}

#[tokio::test(start_paused = true)]
async fn a_timeout_set_at_run_time_bounds_the_next_load() {
    #[cached(ttl = "60s", timeout = "10s", name = "configure::slow")]
    async fn slow(id: u64) -> Result<u64, AppError> {
        tokio::time::sleep(Duration::from_secs(1)).await;
        Ok(id)
    }

    assert_eq!(within(slow(1)).await.unwrap(), 1);
    stampede::configure("configure::slow")
        .timeout(Duration::from_millis(100))
        .apply()
        .unwrap();
    let error = within(slow(2)).await.unwrap_err();
    assert!(
        error.to_string().contains("timed out after 100ms"),
        "{error}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_bad_value_is_an_error_naming_the_cache_and_the_option_and_changes_nothing() {
    #[cached(ttl = "60s", refresh_after = "30s", name = "configure::checked")]
    async fn checked(id: u64) -> u64 {
        id
    }

    let error = |configure: stampede::Configure| configure.apply().unwrap_err().to_string();
    let jitter = error(stampede::configure("configure::checked").jitter(101));
    assert!(
        jitter.contains("configure::checked") && jitter.contains("`jitter`"),
        "{jitter}"
    );
    let ttl = error(stampede::configure("configure::checked").ttl(Duration::from_secs(10)));
    assert!(
        ttl.contains("`ttl`") && ttl.contains("refresh_after"),
        "{ttl}"
    );
    let zero = error(stampede::configure("configure::checked").timeout(Duration::ZERO));
    assert!(zero.contains("`timeout`"), "{zero}");
    let off = error(stampede::configure("configure::checked").fail_safe(Duration::from_secs(1)));
    assert!(
        off.contains("`fail_safe`") && off.contains("does not turn"),
        "{off}"
    );
    let soft =
        error(stampede::configure("configure::checked").soft_timeout(Duration::from_secs(1)));
    assert!(
        soft.contains("`soft_timeout`") && soft.contains("does not turn"),
        "{soft}"
    );
    let late =
        error(stampede::configure("configure::checked").refresh_after(Duration::from_secs(90)));
    assert!(
        late.contains("`refresh_after`") && late.contains("below `ttl`"),
        "{late}"
    );
    let nobody = error(stampede::configure("configure::nobody").ttl(Duration::from_secs(1)));
    assert!(nobody.contains("configure::nobody"), "{nobody}");
    // All or nothing: a bad value next to a good one sets neither.
    let _ = error(
        stampede::configure("configure::checked")
            .stale(Duration::from_secs(5))
            .jitter(200),
    );
    let shown = stampede::caches()
        .into_iter()
        .find(|cache| &*cache.config.name == "configure::checked")
        .unwrap();
    assert_eq!(shown.config.stale, Duration::ZERO);
    assert_eq!(within(checked(3)).await, 3);
}

#[tokio::test(start_paused = true)]
async fn refresh_after_set_at_run_time_refreshes_earlier() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(
        ttl = "60s",
        refresh_after = "50s",
        jitter = 0,
        name = "configure::ahead"
    )]
    async fn quote(id: u64) -> usize {
        LOADS.fetch_add(1, SeqCst) + id as usize
    }

    stampede::configure("configure::ahead")
        .refresh_after(Duration::from_secs(5))
        .apply()
        .unwrap();
    assert_eq!(within(quote(0)).await, 0);
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(within(quote(0)).await, 0, "served, and a refresh started");
    let refreshed = async {
        while quote(0).await == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    within(refreshed).await;
    assert_eq!(LOADS.load(SeqCst), 2, "refreshed after 5 s, not 50 s");
}

#[tokio::test(start_paused = true)]
async fn a_soft_timeout_set_at_run_time_hands_the_last_good_value_sooner() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(
        ttl = "1s",
        fail_safe = "5m",
        soft_timeout = "10s",
        jitter = 0,
        name = "configure::soft"
    )]
    async fn rate(id: u64) -> usize {
        let load = LOADS.fetch_add(1, SeqCst);
        if load > 0 {
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        load + id as usize
    }

    assert_eq!(within(rate(0)).await, 0);
    tokio::time::sleep(Duration::from_secs(2)).await;
    stampede::configure("configure::soft")
        .soft_timeout(Duration::from_millis(100))
        .apply()
        .unwrap();
    assert_eq!(
        within(rate(0)).await,
        0,
        "the last good value after 100ms, not the 3 s load's"
    );
}

#[tokio::test(start_paused = true)]
async fn batch_max_set_at_run_time_splits_the_next_batch() {
    static SIZES: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());

    #[cached(ttl = "60s", batch = ids, batch_max = 100, name = "configure::batch")]
    async fn prices(ids: Vec<u64>) -> std::collections::HashMap<u64, u64> {
        SIZES.lock().unwrap().push(ids.len());
        ids.into_iter().map(|id| (id, id)).collect()
    }

    assert_eq!(within(prices(vec![1])).await.len(), 1);
    stampede::configure("configure::batch")
        .batch_max(2)
        .apply()
        .unwrap();
    assert_eq!(within(prices((10..15).collect())).await.len(), 5);
    let mut sizes = SIZES.lock().unwrap()[1..].to_vec();
    sizes.sort_unstable();
    assert_eq!(sizes, [1, 2, 2]);
}

/// A store generic over its row type, whose associated function has no receiver: each
/// instantiation with other types is a cache of its own, renamed from the name asked for.
struct Rows<T>(std::marker::PhantomData<T>);

/// How many rows `Rows::row` loaded, of every row type.
static ROWS_LOADED: AtomicUsize = AtomicUsize::new(0);

impl<T: Default + Clone + Send + Sync + 'static> Rows<T> {
    #[cached(ttl = "1h", jitter = 0, name = "configure::rows", companion = false)]
    async fn row(id: u64) -> (u64, T) {
        ROWS_LOADED.fetch_add(1, SeqCst);
        (id, T::default())
    }
}

#[tokio::test(start_paused = true)]
async fn options_set_for_a_name_reach_an_instantiation_built_after_them() {
    assert_eq!(within(Rows::<u8>::row(1)).await, (1, 0));
    stampede::configure("configure::rows")
        .ttl(Duration::from_secs(2))
        .apply()
        .unwrap();
    // Built after the options were set, under another name (`configure::rows<..>`).
    assert_eq!(within(Rows::<u16>::row(1)).await, (1, 0));
    assert_eq!(ROWS_LOADED.load(SeqCst), 2);
    let ttls: Vec<_> = stampede::caches()
        .into_iter()
        .filter(|cache| cache.config.name.starts_with("configure::rows"))
        .map(|cache| (cache.config.name.to_string(), cache.config.ttl))
        .collect();
    assert_eq!(ttls.len(), 2, "{ttls:?}");
    assert!(
        ttls.iter().all(|(_, ttl)| *ttl == Duration::from_secs(2)),
        "{ttls:?}"
    );
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    assert_eq!(within(Rows::<u16>::row(1)).await, (1, 0));
    assert_eq!(
        ROWS_LOADED.load(SeqCst),
        3,
        "the later instantiation's value expired after 2 s, not an hour"
    );
}

//! `expire`: a value no longer fresh but not dropped (the companion's `expire`, a method's
//! `<method>_expire`, a batch function's per key, and `stampede::expire` by name), on the
//! in-memory default, on a paused clock.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use common::{AppError, within};
use stampede::cached;
use tokio::time::Instant;

/// Waits until `loads` reaches `count` (a refresh in the background has run).
async fn loaded(loads: &AtomicUsize, count: usize) {
    within(async {
        while loads.load(SeqCst) < count {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn an_expired_value_is_served_stale_at_once_while_one_refresh_replaces_it() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", jitter = 0, stale = "30s", name = "expire::price")]
    async fn price(id: u64) -> u64 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        id * 100 + LOADS.fetch_add(1, SeqCst) as u64 + 1
    }

    assert_eq!(within(price(4)).await, 401);
    price::expire(4).await.unwrap();
    let started = Instant::now();
    for _ in 0..10 {
        assert_eq!(within(price(4)).await, 401, "stale, served at once");
    }
    assert_eq!(started.elapsed(), Duration::ZERO);
    loaded(&LOADS, 2).await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(within(price(4)).await, 402);
    assert_eq!(LOADS.load(SeqCst), 2, "one refresh for ten stale calls");
    // The stale window counts from the expiry: past it, a call waits for a load.
    price::expire(4).await.unwrap();
    tokio::time::advance(Duration::from_secs(31)).await;
    let waited = Instant::now();
    assert_eq!(within(price(4)).await, 403);
    assert_eq!(waited.elapsed(), Duration::from_millis(200));
    // Another key is untouched.
    assert_eq!(within(price(5)).await, 504);
    price::expire(6).await.unwrap(); // nothing held: nothing to do
    assert_eq!(within(price(5)).await, 504);
}

#[tokio::test(start_paused = true)]
async fn with_fail_safe_an_expired_value_stays_the_last_good_one() {
    static FAILING: AtomicBool = AtomicBool::new(false);
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", fail_safe = "1h", name = "expire::rate")]
    async fn rate(id: u64) -> Result<u64, AppError> {
        LOADS.fetch_add(1, SeqCst);
        match FAILING.load(SeqCst) {
            true => Err(AppError::Db("down".into())),
            false => Ok(id),
        }
    }

    assert_eq!(within(rate(8)).await.unwrap(), 8);
    rate::expire(8).await.unwrap();
    FAILING.store(true, SeqCst);
    // No `stale`: the call loads, and the failed load is answered with the expired value.
    assert_eq!(within(rate(8)).await.unwrap(), 8);
    assert_eq!(LOADS.load(SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_load_running_when_the_value_expires_does_not_store_its_value() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", jitter = 0, stale = "30s", name = "expire::row")]
    async fn row(id: u64) -> String {
        let n = LOADS.fetch_add(1, SeqCst) + 1;
        tokio::time::sleep(Duration::from_secs(1)).await;
        format!("{id} v{n}")
    }

    assert_eq!(within(row(1)).await, "1 v1");
    // A refresh reads the source, then the row changes and its value is expired.
    let refresh = tokio::spawn(row::refresh(1));
    tokio::time::sleep(Duration::from_millis(100)).await;
    row::expire(1).await.unwrap();
    assert_eq!(within(refresh).await.unwrap(), "1 v2", "its caller gets it");
    assert_eq!(
        within(row(1)).await,
        "1 v1",
        "still stale: v2 was read before"
    );
    loaded(&LOADS, 3).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(within(row(1)).await, "1 v3");
}

#[derive(Clone)]
struct Repo {
    loads: Arc<AtomicUsize>,
}

impl Repo {
    #[cached(
        ttl = "60s",
        jitter = 0,
        stale = "30s",
        companion = true,
        name = "expire::Repo::user"
    )]
    async fn user(&self, id: u64) -> String {
        let n = self.loads.fetch_add(1, SeqCst) + 1;
        format!("user {id} #{n}")
    }
}

#[tokio::test(start_paused = true)]
async fn a_methods_companion_and_the_name_expire_its_values() {
    let repo = Repo {
        loads: Arc::default(),
    };
    assert_eq!(within(repo.user(1)).await, "user 1 #1");
    Repo::user_expire(1).await.unwrap();
    assert_eq!(within(repo.user(1)).await, "user 1 #1", "stale");
    loaded(&repo.loads, 2).await;
    assert_eq!(within(repo.user(1)).await, "user 1 #2");
    stampede::expire("expire::Repo::user", (1u64,))
        .await
        .unwrap();
    assert_eq!(within(repo.user(1)).await, "user 1 #2", "stale");
    loaded(&repo.loads, 3).await;
    assert_eq!(within(repo.user(1)).await, "user 1 #3");
    // A key of another type is an error that says what a key is.
    let error = stampede::expire("expire::Repo::user", 1u64)
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("tuple of the key arguments"),
        "{error}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_batch_functions_companion_expires_one_key() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", jitter = 0, stale = "30s", batch = ids, name = "expire::stock")]
    async fn stock(ids: Vec<u64>) -> HashMap<u64, u64> {
        let n = LOADS.fetch_add(1, SeqCst) as u64 + 1;
        ids.into_iter().map(|id| (id, id * 10 + n)).collect()
    }

    assert_eq!(
        within(stock(vec![1, 2])).await,
        HashMap::from([(1, 11), (2, 21)])
    );
    stock::expire(1).await.unwrap();
    assert_eq!(
        within(stock(vec![1, 2])).await,
        HashMap::from([(1, 11), (2, 21)]),
        "k1 stale, served"
    );
    loaded(&LOADS, 2).await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(
        within(stock(vec![1, 2])).await,
        HashMap::from([(1, 12), (2, 21)]),
        "only k1 was refreshed"
    );
}

//! Tags: `#[cached(tags = [..])]` and `stampede::invalidate_tag`, on memory caches. (Through a
//! real Redis: `redis_tags.rs`, a binary of its own, since `invalidate_tag` is an error where a
//! tagged cache's Redis connection is not configured; across real processes:
//! `examples/app/tests/multi_process.rs`.)

mod common;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

use common::{AppError, within};
use stampede::cached;

static PRICE_LOADS: AtomicUsize = AtomicUsize::new(0);
static STOCK_LOADS: AtomicUsize = AtomicUsize::new(0);
static NAME_LOADS: AtomicUsize = AtomicUsize::new(0);

#[cached(ttl = "60s", tags = ["tags-product:{id}", "tags-catalog"])]
async fn price(id: u64, region: &str) -> Result<String, AppError> {
    let n = PRICE_LOADS.fetch_add(1, SeqCst) + 1;
    Ok(format!("price {id}@{region} #{n}"))
}

#[cached(ttl = "60s", key = "{sku}", tags = ["tags-product:{sku}"])]
async fn stock(sku: u64, trace: &str) -> u64 {
    let _ = (sku, trace);
    STOCK_LOADS.fetch_add(1, SeqCst) as u64 + 1
}

#[cached(ttl = "60s")]
async fn name(id: u64) -> String {
    let n = NAME_LOADS.fetch_add(1, SeqCst) + 1;
    format!("name {id} #{n}")
}

#[tokio::test]
async fn entries_of_two_functions_sharing_a_tag_are_dropped_together() {
    assert_eq!(within(price(1, "eu")).await.unwrap(), "price 1@eu #1");
    assert_eq!(within(price(2, "eu")).await.unwrap(), "price 2@eu #2");
    assert_eq!(within(stock(1, "t")).await, 1);
    assert_eq!(within(stock(2, "t")).await, 2);
    assert_eq!(within(name(1)).await, "name 1 #1");

    within(stampede::invalidate_tag("tags-product:1"))
        .await
        .unwrap();
    assert_eq!(price::peek(1, "eu"), None, "tagged: dropped");
    assert_eq!(stock::peek(1), None, "tagged in another function: dropped");
    assert!(price::peek(2, "eu").is_some(), "another product: kept");
    assert!(stock::peek(2).is_some());
    assert!(name::peek(1).is_some(), "untagged: kept");

    assert_eq!(within(price(1, "eu")).await.unwrap(), "price 1@eu #3");
    assert_eq!(within(stock(1, "t")).await, 3);
    assert_eq!(within(price(2, "eu")).await.unwrap(), "price 2@eu #2");
    assert_eq!(within(name(1)).await, "name 1 #1");

    // A tag every entry of `price` has.
    within(stampede::invalidate_tag("tags-catalog"))
        .await
        .unwrap();
    assert_eq!(price::peek(1, "eu"), None);
    assert_eq!(price::peek(2, "eu"), None);
    assert_eq!(stock::peek(2), Some(2), "not in the catalog tag");
    assert_eq!(within(price(2, "eu")).await.unwrap(), "price 2@eu #4");
}

#[tokio::test]
async fn a_load_running_when_its_tag_is_invalidated_stores_nothing() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);
    static GATE: tokio::sync::Notify = tokio::sync::Notify::const_new();

    #[cached(ttl = "60s", tags = ["tags-slow:{id}"])]
    async fn slow(id: u64) -> usize {
        let n = LOADS.fetch_add(1, SeqCst) + 1;
        if n == 1 {
            GATE.notified().await;
        }
        id as usize * 100 + n
    }

    let first = tokio::spawn(slow(7));
    common::eventually("the first load started", || LOADS.load(SeqCst) == 1).await;
    within(stampede::invalidate_tag("tags-slow:7"))
        .await
        .unwrap();
    // A call after the invalidation does not join the load that began before it.
    assert_eq!(within(slow(7)).await, 702);
    GATE.notify_waiters();
    assert_eq!(
        within(first).await.unwrap(),
        701,
        "its caller still gets its value"
    );
    assert_eq!(within(slow(7)).await, 702, "the older value was not stored");
    assert_eq!(slow::peek(7), Some(702));
}

#[tokio::test]
async fn a_value_loaded_after_the_invalidation_is_kept() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", tags = ["tags-after"])]
    async fn after(id: u64) -> usize {
        let _ = id;
        LOADS.fetch_add(1, SeqCst) + 1
    }

    within(stampede::invalidate_tag("tags-after"))
        .await
        .unwrap();
    assert_eq!(within(after(1)).await, 1);
    assert_eq!(
        within(after(1)).await,
        1,
        "loaded after the invalidation: a hit"
    );
    within(stampede::invalidate_tag("tags-after"))
        .await
        .unwrap();
    assert_eq!(within(after(1)).await, 2);
    assert_eq!(within(after(1)).await, 2);
}

#[derive(Clone)]
struct Repo;

impl Repo {
    #[cached(ttl = "60s", tags = ["tags-repo:{id}"])]
    async fn row(&self, id: u64) -> u64 {
        static LOADS: AtomicUsize = AtomicUsize::new(0);
        id * 1_000 + LOADS.fetch_add(1, SeqCst) as u64
    }
}

#[async_trait::async_trait]
trait Rows {
    async fn other_row(&self, id: u64) -> u64;
}

#[async_trait::async_trait]
impl Rows for Repo {
    #[cached(ttl = "60s", tags = ["tags-repo:{id}"])]
    async fn other_row(&self, id: u64) -> u64 {
        static LOADS: AtomicUsize = AtomicUsize::new(0);
        id * 1_000 + 500 + LOADS.fetch_add(1, SeqCst) as u64
    }
}

#[tokio::test]
async fn methods_take_tags_too() {
    let repo = Repo;
    let dynamic: &dyn Rows = &repo;
    assert_eq!(within(repo.row(3)).await, 3_000);
    assert_eq!(within(dynamic.other_row(3)).await, 3_500);
    assert_eq!(within(repo.row(3)).await, 3_000, "cached");
    within(stampede::invalidate_tag("tags-repo:3"))
        .await
        .unwrap();
    assert_eq!(within(repo.row(3)).await, 3_001);
    assert_eq!(within(dynamic.other_row(3)).await, 3_501);
}

#[tokio::test(start_paused = true)]
async fn a_tags_expiry_serves_its_entries_stale_while_each_is_refreshed() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", jitter = 0, stale = "30s", tags = ["shelf:{shelf}"])]
    async fn book(shelf: u64, id: u64) -> String {
        let n = LOADS.fetch_add(1, SeqCst) + 1;
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        format!("book {shelf}/{id} #{n}")
    }
    #[cached(ttl = "60s", jitter = 0, tags = ["shelf:{shelf}"])]
    async fn shelf_name(shelf: u64) -> String {
        LOADS.fetch_add(1, SeqCst);
        format!("shelf {shelf}")
    }

    assert_eq!(within(book(1, 1)).await, "book 1/1 #1");
    assert_eq!(within(book(2, 1)).await, "book 2/1 #2");
    assert_eq!(within(shelf_name(1)).await, "shelf 1");
    within(stampede::expire_tag("shelf:1")).await.unwrap();
    let started = tokio::time::Instant::now();
    assert_eq!(within(book(1, 1)).await, "book 1/1 #1", "stale, at once");
    assert_eq!(started.elapsed(), std::time::Duration::ZERO);
    // No `stale`: the other function's entry loads at the next call, waited for.
    assert_eq!(within(shelf_name(1)).await, "shelf 1");
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(
        LOADS.load(SeqCst),
        5,
        "book 1/1's refresh and shelf 1's load"
    );
    // The refresh's load and shelf 1's ran side by side: either may have been the 4th.
    let refreshed = within(book(1, 1)).await;
    assert!(
        ["book 1/1 #4", "book 1/1 #5"].contains(&refreshed.as_str()),
        "refreshed: {refreshed}"
    );
    // Another tag's entry stays fresh.
    assert_eq!(within(book(2, 1)).await, "book 2/1 #2");
    assert_eq!(LOADS.load(SeqCst), 5);
}

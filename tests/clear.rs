//! `clear`: every value of a cache dropped (the companion's `clear`, a method's
//! `<method>_clear`, a batch function's, and `stampede::clear` by name), on the in-memory
//! default, on a paused clock.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use common::within;
use stampede::cached;

#[tokio::test(start_paused = true)]
async fn a_clear_drops_every_value_of_the_cache_and_no_other_caches() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", name = "clear::price")]
    async fn price(id: u64) -> String {
        format!("price {id} #{}", LOADS.fetch_add(1, SeqCst) + 1)
    }
    #[cached(ttl = "60s", name = "clear::other")]
    async fn other(id: u64) -> String {
        format!("other {id} #{}", LOADS.fetch_add(1, SeqCst) + 1)
    }

    assert_eq!(within(price(1)).await, "price 1 #1");
    assert_eq!(within(price(2)).await, "price 2 #2");
    assert_eq!(within(other(1)).await, "other 1 #3");
    price::clear().await.unwrap();
    assert_eq!(price::peek(1), None);
    assert_eq!(price::peek(2), None);
    assert_eq!(within(price(1)).await, "price 1 #4");
    assert_eq!(
        within(other(1)).await,
        "other 1 #3",
        "another cache keeps its values"
    );
    stampede::clear("clear::price").await.unwrap();
    assert_eq!(within(price(1)).await, "price 1 #5");
    let unknown = stampede::clear("clear::nobody").await.unwrap_err();
    assert!(unknown.to_string().contains("clear::nobody"), "{unknown}");
}

#[tokio::test(start_paused = true)]
async fn a_load_running_during_a_clear_stores_nothing() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", name = "clear::slow")]
    async fn slow(id: u64) -> String {
        let n = LOADS.fetch_add(1, SeqCst) + 1;
        tokio::time::sleep(Duration::from_secs(1)).await;
        format!("slow {id} #{n}")
    }

    let running = tokio::spawn(slow(1));
    tokio::time::sleep(Duration::from_millis(100)).await;
    slow::clear().await.unwrap();
    assert_eq!(
        within(running).await.unwrap(),
        "slow 1 #1",
        "its caller gets it"
    );
    assert_eq!(slow::peek(1), None, "but it was not kept");
    assert_eq!(within(slow(1)).await, "slow 1 #2");
}

#[derive(Clone)]
struct Repo {
    loads: Arc<AtomicUsize>,
}

impl Repo {
    #[cached(ttl = "60s", companion = true, name = "clear::Repo::user")]
    async fn user(&self, id: u64) -> String {
        format!("user {id} #{}", self.loads.fetch_add(1, SeqCst) + 1)
    }
}

#[tokio::test(start_paused = true)]
async fn a_methods_companion_and_a_batch_functions_clear_their_caches() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", batch = ids, name = "clear::stock")]
    async fn stock(ids: Vec<u64>) -> HashMap<u64, usize> {
        let n = LOADS.fetch_add(1, SeqCst) + 1;
        ids.into_iter().map(|id| (id, n)).collect()
    }

    let repo = Repo {
        loads: Arc::default(),
    };
    assert_eq!(within(repo.user(1)).await, "user 1 #1");
    Repo::user_clear().await.unwrap();
    assert_eq!(within(repo.user(1)).await, "user 1 #2");

    assert_eq!(
        within(stock(vec![1, 2])).await,
        HashMap::from([(1, 1), (2, 1)])
    );
    stock::clear().await.unwrap();
    assert_eq!(stock::peek(1), None);
    assert_eq!(
        within(stock(vec![1, 2])).await,
        HashMap::from([(1, 2), (2, 2)])
    );
}

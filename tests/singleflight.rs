//! One load per key, however many callers ask at once, and whatever happens to them.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use common::{WAIT, eventually, within};
use stampede::cached;
use tokio::sync::{Barrier, oneshot};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_calls_on_a_cold_key_run_one_load() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", name = "sf::thousand")]
    async fn product(id: u64) -> String {
        LOADS.fetch_add(1, SeqCst);
        tokio::time::sleep(Duration::from_millis(100)).await;
        format!("product {id}")
    }

    let start = Arc::new(Barrier::new(1_000));
    let calls: Vec<_> = (0..1_000)
        .map(|_| {
            let start = start.clone();
            tokio::spawn(async move {
                start.wait().await;
                product(7).await
            })
        })
        .collect();
    for call in calls {
        assert_eq!(within(call).await.unwrap(), "product 7");
    }

    assert_eq!(LOADS.load(SeqCst), 1);
    let stats = stampede::stats("sf::thousand").unwrap();
    assert_eq!(stats.loads, 1);
    assert_eq!(stats.misses + stats.hits, 1_000);
    assert_eq!(
        stats.shared,
        stats.misses - 1,
        "every miss but the first joined the load"
    );
    assert_eq!(stats.in_flight, 0);
}

#[test]
fn ten_os_threads_with_their_own_runtimes_share_one_load() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", name = "sf::threads")]
    async fn settings(tenant: u32) -> String {
        LOADS.fetch_add(1, SeqCst);
        tokio::time::sleep(Duration::from_millis(200)).await;
        format!("settings of tenant {tenant}")
    }

    let start = Arc::new(std::sync::Barrier::new(10));
    let (results, received) = std::sync::mpsc::channel();
    for _ in 0..10 {
        let (start, results) = (start.clone(), results.clone());
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            start.wait();
            results.send(runtime.block_on(settings(3))).unwrap();
        });
    }
    for _ in 0..10 {
        let value = received
            .recv_timeout(WAIT)
            .expect("a thread's call did not return");
        assert_eq!(value, "settings of tenant 3");
    }
    assert_eq!(LOADS.load(SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn cancelling_the_caller_that_started_the_load_strands_no_one() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);
    static STARTED: std::sync::Mutex<Option<oneshot::Sender<()>>> = std::sync::Mutex::new(None);

    #[cached(ttl = "60s", name = "sf::cancelled")]
    async fn user(id: u64) -> String {
        LOADS.fetch_add(1, SeqCst);
        if let Some(started) = STARTED.lock().unwrap().take() {
            let _ = started.send(());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        format!("user {id}")
    }

    let (started, load_started) = oneshot::channel();
    *STARTED.lock().unwrap() = Some(started);
    let first = tokio::spawn(user(1));
    within(load_started).await.unwrap();

    let waiters: Vec<_> = (0..50).map(|_| tokio::spawn(user(1))).collect();
    eventually("50 callers waiting on the load", || {
        stampede::stats("sf::cancelled").is_some_and(|s| s.shared == 50)
    })
    .await;

    first.abort();
    assert!(within(first).await.unwrap_err().is_cancelled());
    for waiter in waiters {
        assert_eq!(within(waiter).await.unwrap(), "user 1");
    }
    assert_eq!(LOADS.load(SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn without_a_lock_every_concurrent_miss_loads() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", lock = "none", name = "sf::none")]
    async fn report(day: u32) -> String {
        LOADS.fetch_add(1, SeqCst);
        tokio::time::sleep(Duration::from_millis(100)).await;
        format!("report {day}")
    }

    let calls: Vec<_> = (0..10).map(|_| tokio::spawn(report(1))).collect();
    for call in calls {
        assert_eq!(within(call).await.unwrap(), "report 1");
    }
    assert_eq!(LOADS.load(SeqCst), 10, "lock = \"none\" does not coalesce");

    // The value is cached all the same.
    assert_eq!(within(report(1)).await, "report 1");
    assert_eq!(LOADS.load(SeqCst), 10);
}

//! A load that panics, fails or hangs: every waiter hears of it promptly, nothing bad is cached,
//! retries stay inside the one load, and a stale value outlives a failed refresh.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use common::{AppError, eventually, within};
use stampede::cached;
use tokio::time::Instant;

#[tokio::test(start_paused = true)]
async fn a_panicking_load_reaches_every_waiter_and_the_next_call_loads_again() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", name = "fail::panic")]
    async fn invoice(id: u64) -> Result<String, AppError> {
        let attempt = LOADS.fetch_add(1, SeqCst) + 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
        if attempt == 1 {
            panic!("driver bug while reading invoice {id}");
        }
        Ok(format!("invoice {id}"))
    }

    let start = Instant::now();
    let calls: Vec<_> = (0..20).map(|_| tokio::spawn(invoice(9))).collect();
    for call in calls {
        match within(call).await.unwrap() {
            Err(AppError::Cache(stampede::Error::LoadPanicked { message, .. })) => {
                assert_eq!(&*message, "driver bug while reading invoice 9");
            }
            other => panic!("expected the load's panic, got {other:?}"),
        }
    }
    assert_eq!(
        start.elapsed(),
        Duration::from_millis(100),
        "waiters heard of the panic when it happened"
    );
    assert_eq!(stampede::stats("fail::panic").unwrap().in_flight, 0);

    assert_eq!(within(invoice(9)).await.unwrap(), "invoice 9");
    assert_eq!(LOADS.load(SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_value_function_whose_load_panics_panics_in_its_callers() {
    #[cached(ttl = "60s", name = "fail::value_panic")]
    async fn broken(_id: u64) -> u64 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        panic!("no such row");
    }

    let calls: Vec<_> = (0..5).map(|_| tokio::spawn(broken(1))).collect();
    for call in calls {
        let panic = within(call).await.unwrap_err().into_panic();
        let message = panic.downcast_ref::<String>().unwrap();
        assert!(
            message.contains("the load panicked: no such row"),
            "{message}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_failed_load_reaches_every_waiter_and_is_not_cached() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", name = "fail::error")]
    async fn account(id: u64) -> Result<String, AppError> {
        let attempt = LOADS.fetch_add(1, SeqCst) + 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
        if attempt == 1 {
            return Err(AppError::Db("connection refused".into()));
        }
        Ok(format!("account {id}"))
    }

    let calls: Vec<_> = (0..20).map(|_| tokio::spawn(account(4))).collect();
    for call in calls {
        match within(call).await.unwrap() {
            Err(AppError::Db(message)) => assert_eq!(message, "connection refused"),
            other => panic!("expected the load's own error, got {other:?}"),
        }
    }
    assert_eq!(LOADS.load(SeqCst), 1, "one load served all 20 callers");

    assert_eq!(within(account(4)).await.unwrap(), "account 4");
    assert_eq!(LOADS.load(SeqCst), 2, "the error was not cached");
    let stats = stampede::stats("fail::error").unwrap();
    assert_eq!((stats.loads, stats.load_errors), (2, 1));
}

#[tokio::test(start_paused = true)]
async fn retries_run_inside_the_one_load_however_many_callers_wait() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", retries = 2, backoff = "10ms", name = "fail::retries")]
    async fn price(sku: u64) -> Result<u64, AppError> {
        let attempt = LOADS.fetch_add(1, SeqCst) + 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
        if attempt <= 2 {
            return Err(AppError::Db(format!("deadlock on attempt {attempt}")));
        }
        Ok(sku * 100)
    }

    let calls: Vec<_> = (0..25).map(|_| tokio::spawn(price(3))).collect();
    for call in calls {
        assert_eq!(within(call).await.unwrap().unwrap(), 300);
    }
    assert_eq!(LOADS.load(SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn retries_give_up_with_the_last_error() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(
        ttl = "60s",
        retries = 1,
        backoff = "10ms",
        name = "fail::retries_exhausted"
    )]
    async fn stock(sku: u64) -> Result<u64, AppError> {
        let attempt = LOADS.fetch_add(1, SeqCst) + 1;
        Err(AppError::Db(format!("sku {sku} attempt {attempt} failed")))
    }

    match within(stock(5)).await {
        Err(AppError::Db(message)) => assert_eq!(message, "sku 5 attempt 2 failed"),
        other => panic!("expected the last attempt's error, got {other:?}"),
    }
    assert_eq!(LOADS.load(SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_load_slower_than_the_timeout_times_out_for_every_waiter() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", timeout = "100ms", name = "fail::timeout")]
    async fn report(id: u64) -> Result<String, AppError> {
        LOADS.fetch_add(1, SeqCst);
        tokio::time::sleep(Duration::from_secs(5)).await;
        Ok(format!("report {id}"))
    }

    let start = Instant::now();
    let calls: Vec<_> = (0..10).map(|_| tokio::spawn(report(1))).collect();
    for call in calls {
        match within(call).await.unwrap() {
            Err(AppError::Cache(stampede::Error::Timeout { after, .. })) => {
                assert_eq!(after, Duration::from_millis(100));
            }
            other => panic!("expected a timeout, got {other:?}"),
        }
    }
    assert_eq!(start.elapsed(), Duration::from_millis(100));
    assert_eq!(LOADS.load(SeqCst), 1);
    assert_eq!(stampede::stats("fail::timeout").unwrap().timeouts, 1);
}

#[tokio::test(start_paused = true)]
async fn a_refresh_that_times_out_leaves_the_stale_value_served() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(
        ttl = "10s",
        jitter = 0,
        stale = "60s",
        timeout = "100ms",
        name = "fail::stale_if_error"
    )]
    async fn rate(currency: &str) -> Result<String, AppError> {
        let attempt = LOADS.fetch_add(1, SeqCst) + 1;
        if attempt > 1 {
            tokio::time::sleep(Duration::from_secs(5)).await; // the upstream hangs from now on
        }
        Ok(format!("{currency} rate #{attempt}"))
    }

    assert_eq!(within(rate("EUR")).await.unwrap(), "EUR rate #1");
    tokio::time::advance(Duration::from_secs(11)).await;

    let start = Instant::now();
    assert_eq!(within(rate("EUR")).await.unwrap(), "EUR rate #1");
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "the stale value came back without waiting"
    );
    eventually("the refresh to time out", || {
        stampede::stats("fail::stale_if_error").is_some_and(|s| s.timeouts == 1 && s.in_flight == 0)
    })
    .await;

    let start = Instant::now();
    assert_eq!(within(rate("EUR")).await.unwrap(), "EUR rate #1");
    assert_eq!(start.elapsed(), Duration::ZERO);
}

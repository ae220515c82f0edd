//! No per-key state outlives its load, on any path: value, error, panic, timeout, cancelled
//! caller. (A file of its own: it silences the panic hook for the panics it provokes.)

mod common;

use std::time::Duration;

use common::{AppError, within};
use stampede::cached;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_distinct_keys_leave_no_in_flight_state() {
    #[cached(ttl = "60s", timeout = "50ms", capacity = 1_000, name = "leaks::keys")]
    async fn lookup(key: u64) -> Result<u64, AppError> {
        tokio::task::yield_now().await;
        match key % 5 {
            0 | 4 => Ok(key * 2),
            1 => Err(AppError::Db(format!("no row {key}"))),
            2 => panic!("load of {key} panicked"),
            _ => {
                tokio::time::sleep(Duration::from_secs(10)).await;
                Ok(key)
            }
        }
    }

    std::panic::set_hook(Box::new(|_| {})); // 20,000 expected panics, nothing to print
    let calls: Vec<_> = (0..100_000u64)
        .map(|key| (key, tokio::spawn(lookup(key))))
        .collect();
    let mut served = 0;
    for (key, call) in calls {
        if key % 5 == 4 {
            call.abort(); // a caller that gives up; its load must still finish and clean up
        }
        match (key % 5, within(call).await) {
            (0, Ok(Ok(value))) => {
                assert_eq!(value, key * 2);
                served += 1;
            }
            (1, Ok(Err(AppError::Db(_))))
            | (2, Ok(Err(AppError::Cache(stampede::Error::LoadPanicked { .. }))))
            | (3, Ok(Err(AppError::Cache(stampede::Error::Timeout { .. })))) => {}
            (4, Ok(Ok(_))) => {} // finished before the abort
            (4, Err(join)) if join.is_cancelled() => {} // aborted while waiting
            (kind, other) => panic!("key {key} (kind {kind}) ended as {other:?}"),
        }
    }
    let _ = std::panic::take_hook();
    assert_eq!(served, 20_000);

    // Loads of aborted callers run on; wait for the last of them.
    common::eventually("every load to end", || {
        stampede::stats("leaks::keys").unwrap().in_flight == 0
    })
    .await;
    let stats = stampede::stats("leaks::keys").unwrap();
    assert_eq!(stats.in_flight, 0);
    // Every key was asked once, so every miss started exactly one load (an aborted caller may
    // have been cancelled before it asked).
    assert_eq!(stats.loads, stats.misses);
    assert!(stats.misses >= 80_000, "{stats:?}");
    assert_eq!(stats.timeouts, 20_000);
}

//! Bounded waits: every wait in a test has a timeout that fails the test (DESIGN.md section 6),
//! so a hang fails it instead of stalling the suite.

use std::future::Future;
use std::time::{Duration, Instant};

/// The bound on any single wait in a test.
pub const WAIT: Duration = Duration::from_secs(30);

/// Awaits `future`, failing the test if it takes longer than [`WAIT`].
pub async fn within<F: Future>(future: F) -> F::Output {
    match tokio::time::timeout(WAIT, future).await {
        Ok(output) => output,
        Err(_) => panic!("a wait in this test did not finish within {WAIT:?}"),
    }
}

/// Waits until `condition` holds, checking every millisecond, failing the test after [`WAIT`].
/// Under a paused clock the millisecond sleeps let tokio advance time while the test waits.
pub async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let waited = tokio::time::timeout(WAIT, async {
        while !condition() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "timed out waiting for: {what}");
}

/// Calls `attempt` every 20 ms until it returns `Some`, failing the test with `what` once `bound`
/// (real time) has passed; each attempt is bounded by [`within`].
pub async fn until<T, F, Fut>(what: &str, bound: Duration, mut attempt: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let started = Instant::now();
    loop {
        if let Some(found) = within(attempt()).await {
            return found;
        }
        assert!(started.elapsed() < bound, "{what}: not within {bound:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

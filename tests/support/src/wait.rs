//! Bounded waits: every wait in a test has a timeout that fails the test (DESIGN.md section 6),
//! so a hang fails it instead of stalling the suite.

use std::future::Future;
use std::time::Duration;

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

//! Freshness on the real clock, in a build like a user's: this package's tokio has no
//! `test-util`, so a hit reads the kernel's coarse clock (`stampede-runtime/src/clock.rs`) and
//! the exact one only near a deadline. Run alone (`cargo test -p stampede-quickstart`) it
//! checks that path; in `cargo test --workspace` other packages turn `test-util` on and it
//! checks tokio's clock instead.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::time::{Instant, sleep_until};

static LOADS: AtomicU32 = AtomicU32::new(0);

#[stampede::cached(ttl = "300ms", jitter = 0)]
async fn version(id: u64) -> u32 {
    let _ = id;
    LOADS.fetch_add(1, Ordering::SeqCst) + 1
}

#[tokio::test]
async fn a_value_is_served_until_its_ttl_and_loaded_again_after_it() {
    let start = Instant::now();
    assert_eq!(version(1).await, 1);
    // Well before the deadline (the coarse reading decides), then within the coarse clock's
    // allowance of it (the exact clock decides): the value loaded first.
    for at in [50, 150, 250, 290] {
        sleep_until(start + Duration::from_millis(at)).await;
        if start.elapsed() < Duration::from_millis(295) {
            assert_eq!(version(1).await, 1, "{at}ms after the load");
        }
    }
    // Past the TTL: a new load, at once.
    sleep_until(start + Duration::from_millis(320)).await;
    assert_eq!(version(1).await, 2);
    assert_eq!(LOADS.load(Ordering::SeqCst), 2);
}

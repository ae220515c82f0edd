//! The process's budget of background refreshes: at most N run at once, across every cache, so
//! that a wave of keys going stale together does not become a wave of queries. A refresh over
//! the budget waits its turn while its stale value keeps being served. A miss never waits behind
//! it: a caller with no value that joins a queued refresh makes it start at once.
//!
//! The budget is 64 unless the `STAMPEDE_MAX_REFRESHES` variable or [`set_max_refreshes`] says
//! otherwise; the gauge `cache_refresh_queued` counts the refreshes waiting for a turn.

use std::future::Future;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{Semaphore, SemaphorePermit};

/// The budget when nothing sets one: sized for a service with a few database connections per
/// core, well below any pool's size.
const DEFAULT: usize = 64;
/// The variable that sets the budget when the code does not.
pub const MAX_REFRESHES_VAR: &str = "STAMPEDE_MAX_REFRESHES";

struct Budget {
    permits: Semaphore,
    limit: AtomicUsize,
    queued: metrics::Gauge,
}

static CONFIGURED: AtomicUsize = AtomicUsize::new(0);
static BUDGET: OnceLock<Budget> = OnceLock::new();

fn budget() -> &'static Budget {
    BUDGET.get_or_init(|| {
        let configured = CONFIGURED.load(Ordering::Acquire);
        let limit = if configured > 0 {
            configured
        } else {
            std::env::var(MAX_REFRESHES_VAR)
                .ok()
                .and_then(|value| value.trim().parse().ok())
                .filter(|&limit| limit > 0)
                .unwrap_or(DEFAULT)
        };
        metrics::describe_gauge!(
            "cache_refresh_queued",
            "Background refreshes waiting for a turn in the process's refresh budget"
        );
        Budget {
            permits: Semaphore::new(limit),
            limit: AtomicUsize::new(limit),
            queued: metrics::gauge!("cache_refresh_queued"),
        }
    })
}

/// Sets how many background refreshes of stale values may run at once in this process, across
/// every cache (at least 1). Call it at start-up; a later call takes effect as running refreshes
/// finish. Misses are never counted against it.
///
/// ```
/// stampede::set_max_refreshes(16);
/// ```
pub fn set_max_refreshes(limit: usize) {
    let limit = limit.max(1);
    CONFIGURED.store(limit, Ordering::Release);
    let Some(budget) = BUDGET.get() else {
        return;
    };
    let previous = budget.limit.swap(limit, Ordering::AcqRel);
    if limit > previous {
        budget.permits.add_permits(limit - previous);
    } else {
        // Permits held by running refreshes are forgotten as they come back.
        let mut left = previous - limit;
        while left > 0 {
            let forgotten = budget.permits.forget_permits(left);
            if forgotten == 0 {
                break;
            }
            left -= forgotten;
        }
    }
}

/// How many background refreshes hold a turn now (for the simulation's check that none is
/// left behind).
#[cfg(feature = "simulation")]
pub(crate) fn turns_taken() -> usize {
    let budget = budget();
    budget.limit.load(Ordering::Acquire) - budget.permits.available_permits()
}

/// A turn for one background refresh, or `None` when a miss joined the refresh while it
/// waited (`urgent` completes): the refresh then runs at once, outside the budget.
pub(crate) async fn turn(urgent: impl Future<Output = ()>) -> Option<SemaphorePermit<'static>> {
    let budget = budget();
    if let Ok(permit) = budget.permits.try_acquire() {
        return Some(permit);
    }
    // Counted while it waits, and no longer once it stops waiting, also when dropped.
    let _queued = Queued::raise(&budget.queued);
    tokio::select! {
        // In this order, so that a run is the same each time its inputs are.
        biased;
        permit = budget.permits.acquire() => permit.ok(),
        () = urgent => None,
    }
}

/// One refresh waiting for a turn, in the `cache_refresh_queued` gauge until dropped.
struct Queued<'a>(&'a metrics::Gauge);

impl<'a> Queued<'a> {
    fn raise(gauge: &'a metrics::Gauge) -> Self {
        gauge.increment(1.0);
        Queued(gauge)
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

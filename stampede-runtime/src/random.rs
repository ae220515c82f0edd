//! The runtime's randomness (TTL jitter, retry backoff): the thread's generator, unless a
//! deterministic simulation seeded this thread's own (`seed`, with the `simulation` feature),
//! so that one seed replays one run.

use std::cell::RefCell;
use std::ops::Range;

use rand::RngExt;
use rand::rngs::SmallRng;

thread_local! {
    static SEEDED: RefCell<Option<SmallRng>> = const { RefCell::new(None) };
}

/// A number drawn uniformly from `range` (which must not be empty).
pub(crate) fn uniform(range: Range<f64>) -> f64 {
    SEEDED.with(|seeded| match &mut *seeded.borrow_mut() {
        Some(rng) => rng.random_range(range),
        None => rand::random_range(range),
    })
}

/// From now on this thread draws from a generator seeded with `seed` (`None`: the thread's
/// random generator again).
#[cfg(feature = "simulation")]
pub(crate) fn seed(seed: Option<u64>) {
    use rand::SeedableRng;
    SEEDED.with(|seeded| *seeded.borrow_mut() = seed.map(SmallRng::seed_from_u64));
}

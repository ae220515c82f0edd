//! The cap on a cache's concurrent loads in this process (`max_loads`): singleflight bounds the
//! loads of one key, this bounds those of many (a cold start of distinct keys). A load beyond it
//! waits for a free one, at most the cache's `timeout`, or with `max_loads_full = "error"`
//! fails at once; either way a refused load never calls the source.

use tokio::sync::{Semaphore, SemaphorePermit};

use crate::config::{Config, LoadsFull};
use crate::error::Error;
use crate::telemetry::Telemetry;

/// The free loads of one cache.
pub(crate) struct Limit {
    free: Semaphore,
    most: u32,
}

impl Limit {
    /// The cap of a cache with `max_loads`; `None` without.
    pub(crate) fn of(config: &Config) -> Option<Self> {
        let most = config.max_loads?;
        Some(Limit {
            free: Semaphore::new(most as usize),
            most,
        })
    }

    /// A free load, held until the permit is dropped; `Error::LoadsFull` if none is free (at
    /// once, or within `timeout`, as the cache says). Counted in `telemetry`.
    pub(crate) async fn enter(
        &self,
        config: &Config,
        telemetry: &Telemetry,
    ) -> Result<SemaphorePermit<'_>, Error> {
        if let Ok(permit) = self.free.try_acquire() {
            return Ok(permit);
        }
        let waited = match config.max_loads_full {
            LoadsFull::Error => None,
            LoadsFull::Wait => {
                telemetry.loads_queued.bump();
                let acquired = tokio::time::timeout(config.timeout, self.free.acquire()).await;
                if let Ok(Ok(permit)) = acquired {
                    return Ok(permit);
                }
                Some(config.timeout)
            }
        };
        telemetry.loads_refused.bump();
        Err(Error::LoadsFull {
            cache: config.name.clone(),
            most: self.most,
            waited,
        })
    }
}

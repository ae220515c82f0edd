//! Dropping from Redis the keys this process changed while Redis could not be used (see
//! `dirty`): before this process reads such a key there again, and from a task that tries every
//! operation timeout until Redis answers, whatever else the process does.

use std::sync::Arc;
use std::time::Duration;

use crate::redis::codec::keys::RedisKeys;
use crate::redis::transport::dirty::Change;
use crate::redis::transport::endpoint::Endpoint;
use crate::redis::transport::failure::Failure;

/// The shortest pause between two rounds of dropping the remembered keys.
const RETRY_LEAST: Duration = Duration::from_millis(10);

impl Endpoint {
    /// Drops the key of base `base` from Redis if it is remembered; `Err` when Redis failed
    /// (it stays remembered).
    pub(crate) async fn clean(&self, base: &str) -> Result<(), Failure> {
        let Some((message, change)) = self.dirty.message(base) else {
            return Ok(());
        };
        let keys = RedisKeys::of_base(base);
        // A stored value is announced only if Redis held an older one (see `Change::Stored`).
        let announce = match change {
            Change::Invalidated => true,
            Change::Stored => self.invalidate(&keys, None).await?,
        };
        if announce {
            self.invalidate(&keys, Some(&message)).await?;
        }
        self.dirty.dropped(base);
        Ok(())
    }

    /// Remembers the key of `keys` (see `Dirty::mark`) and starts the task that drops the
    /// remembered keys as soon as Redis answers.
    pub(crate) fn mark_and_clean(
        self: &Arc<Self>,
        keys: &RedisKeys,
        message: Vec<u8>,
        change: Change,
    ) {
        self.dirty.mark(keys, message, change);
        self.clean_all();
    }

    /// Drops every remembered key from Redis, one at a time, from a task of its own (one per
    /// connection): a round that Redis fails is tried again an operation timeout later, until
    /// every key is dropped. Outside a runtime, the next call in one does it.
    pub(crate) fn clean_all(self: &Arc<Self>) {
        if !self.dirty.start_cleaning() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.dirty.cleaned();
            return;
        };
        let endpoint = self.clone();
        runtime.spawn(async move {
            // Cleared however the task ends (its runtime may shut down mid-way), and a key
            // remembered meanwhile gets a task of its own.
            let cleaning = Cleaning(&endpoint);
            loop {
                let mut failed = false;
                for base in endpoint.dirty.bases() {
                    if endpoint.clean(&base).await.is_err() {
                        failed = true;
                        break;
                    }
                }
                if !failed {
                    break;
                }
                let pause = endpoint.config.op_timeout.max(RETRY_LEAST);
                tokio::time::sleep(pause).await;
            }
            drop(cleaning);
        });
    }
}

/// The cleaning task of a connection is running: cleared on drop, after which a key remembered
/// during its last round starts another.
struct Cleaning<'a>(&'a Arc<Endpoint>);

impl Drop for Cleaning<'_> {
    fn drop(&mut self) {
        self.0.dirty.cleaned();
        // Outside a runtime (a shut-down one's task dropped) this spawns nothing: the next call
        // starts it again.
        if tokio::runtime::Handle::try_current().is_ok() {
            self.0.clean_all();
        }
    }
}

//! The holder's side of a key's Redis lock: its token, and the watchdog that renews the lease
//! while the load runs.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::redis::endpoint::Endpoint;
use crate::redis::keys::RedisKeys;

/// A token no other holder will ever use: the lock's value, checked on renewal and release.
pub(crate) fn token() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// A lock this flow holds: renewed while the load runs, and given back on every path. Dropped
/// without [`release`](Held::release) or [`released`](Held::released) (a load that panicked, a
/// flight cancelled by a runtime shutting down), it releases the lock from a spawned task.
pub(crate) struct Held {
    connection: Arc<Endpoint>,
    keys: RedisKeys,
    token: String,
    done: bool,
}

impl Held {
    pub(crate) fn new(connection: &Arc<Endpoint>, keys: &RedisKeys, token: &str) -> Self {
        Held {
            connection: connection.clone(),
            keys: keys.clone(),
            token: token.to_owned(),
            done: false,
        }
    }

    /// Runs `work` while renewing the lock every third of its lease. A renewal that finds the
    /// lock gone or taken stops the renewals (the lease was lost: another holder may load too,
    /// and the release will not delete its lock); a renewal that fails is tried again next
    /// period.
    pub(crate) async fn while_held<F: Future>(&self, work: F) -> F::Output {
        let period = self.connection.config.lease / 3;
        let watchdog = async {
            loop {
                tokio::time::sleep(period.max(Duration::from_millis(10))).await;
                if let Ok(false) = self.connection.extend(&self.keys, &self.token).await {
                    tracing::warn!(lock = %self.keys.lock, "stampede: lost a Redis lock's lease while loading");
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::select! {
            biased;
            output = work => output,
            () = watchdog => unreachable!("the watchdog loops until the work ends"),
        }
    }

    /// Releases the lock if this flow still holds it (compare-and-delete).
    pub(crate) async fn release(mut self) {
        self.done = true;
        let _ = self.connection.release(&self.keys, &self.token).await;
    }

    /// The lock was released by another script (`FILL`).
    pub(crate) fn released(mut self) {
        self.done = true;
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if !self.done {
            release_later(&self.connection, &self.keys, &self.token);
        }
    }
}

/// Releases a lock that `token` may hold from a task of its own, when the flow cannot wait for
/// it (outside a runtime, the lease runs out instead).
pub(crate) fn release_later(connection: &Arc<Endpoint>, keys: &RedisKeys, token: &str) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let (connection, keys, token) = (connection.clone(), keys.clone(), token.to_owned());
    runtime.spawn(async move {
        let _ = connection.release(&keys, &token).await;
    });
}

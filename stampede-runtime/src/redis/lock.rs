//! The holder's side of a key's Redis lock: its token, and the watchdog that renews the lease
//! while the load runs; for a load without the lock, the watchdog that keeps its fence alive.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::clock::after;
use crate::redis::endpoint::Endpoint;
use crate::redis::failure::Failure;
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
        let renew = || self.connection.extend(&self.keys, &self.token);
        let lost = || tracing::warn!(lock = %self.keys.lock, "stampede: lost a Redis lock's lease while loading");
        renewing(&self.connection, renew, lost, work).await
    }

    /// Releases the lock if this flow still holds it (see [`release`]).
    pub(crate) async fn release(mut self) {
        self.done = true;
        release(&self.connection, &[&self.keys], &self.token).await;
    }

    /// The lock was released by another script (`FILL`).
    pub(crate) fn released(mut self) {
        self.done = true;
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if !self.done {
            give_back(&self.connection, &[&self.keys], &self.token);
        }
    }
}

/// Runs a load that holds no lock while keeping alive the key's fence it read, every third of
/// the lease: its fill is written only over that fence, which would otherwise expire with the
/// lease during a longer load. Once the fence moved (another fill, a prime, an invalidation)
/// the fill will be refused, and the renewals stop.
pub(crate) async fn while_fenced<F: Future>(
    connection: &Endpoint,
    keys: &RedisKeys,
    fence: u64,
    work: F,
) -> F::Output {
    let renew = || connection.keep_fence(keys, fence);
    renewing(connection, renew, || {}, work).await
}

/// Runs `work` while `renew` runs every third of the lease, until it answers `Ok(false)`
/// (`lost` is called, and the renewals stop); a renewal that fails is tried again next period.
async fn renewing<F, R, Renewed>(
    connection: &Endpoint,
    renew: R,
    lost: impl Fn(),
    work: F,
) -> F::Output
where
    F: Future,
    R: Fn() -> Renewed,
    Renewed: Future<Output = Result<bool, Failure>>,
{
    let period = connection.config.lease / 3;
    let watchdog = async {
        loop {
            tokio::time::sleep(period.max(Duration::from_millis(10))).await;
            if let Ok(false) = renew().await {
                lost();
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

/// Releases the locks that `token` holds on `keys` now, so that their waiters read again at
/// once; if Redis does not answer, gives them back from a task until it does ([`give_back`]).
pub(crate) async fn release(connection: &Arc<Endpoint>, keys: &[&RedisKeys], token: &str) {
    if !keys.is_empty() && connection.release_many(keys, token).await.is_err() {
        give_back(connection, keys, token);
    }
}

/// Gives back the locks that `token` may hold on `keys` from a task of its own, when the flow
/// cannot wait for it or a release failed: tried again every operation timeout until Redis
/// answers (a pause, a cool-down) or the lease has run out, so that the waiters are woken soon
/// after Redis answers again, not at the end of the lease. Outside a runtime, the lease runs
/// out instead.
pub(crate) fn give_back(connection: &Arc<Endpoint>, keys: &[&RedisKeys], token: &str) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let (connection, token) = (connection.clone(), token.to_owned());
    let keys: Vec<RedisKeys> = keys.iter().map(|keys| (*keys).clone()).collect();
    // The last renewal was before now: the lease runs out by then at the latest.
    let until = after(Instant::now(), connection.config.lease);
    runtime.spawn(async move {
        let keys: Vec<&RedisKeys> = keys.iter().collect();
        while connection.release_many(&keys, &token).await.is_err() {
            let now = Instant::now();
            if now >= until {
                return;
            }
            let pause = connection.config.op_timeout.min(until - now);
            tokio::time::sleep(pause.max(Duration::from_millis(10))).await;
        }
    });
}

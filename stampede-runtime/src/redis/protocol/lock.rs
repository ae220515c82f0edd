//! The holder's side of the keys' Redis locks: their token, the watchdog that renews the leases
//! while the load runs (and, for keys loaded without their lock, keeps their fences alive), and
//! the release on every path.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::clock::after;
use crate::redis::transport::endpoint::Endpoint;

use crate::redis::codec::keys::RedisKeys;

/// A token no other holder will ever use: the lock's value, checked on renewal and release.
pub(crate) fn token() -> String {
    format!("{:032x}", rand::random::<u128>())
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

/// The locks a group holds while it loads: renewed every third of the lease, given back when
/// the load is not followed by a fill that releases them (from a task, if dropped first: a load
/// that panicked, a flight cancelled by a runtime shutting down).
pub(crate) struct Locks {
    endpoint: Arc<Endpoint>,
    keys: Vec<RedisKeys>,
    /// The keys loaded without their locks, with the fence each load read.
    fenced: Vec<(RedisKeys, u64)>,
    token: String,
    released: std::sync::atomic::AtomicBool,
}

impl Locks {
    pub(crate) fn new(
        endpoint: &Arc<Endpoint>,
        keys: Vec<RedisKeys>,
        fenced: Vec<(RedisKeys, u64)>,
        token: &str,
    ) -> Self {
        Locks {
            endpoint: endpoint.clone(),
            released: std::sync::atomic::AtomicBool::new(keys.is_empty()),
            keys,
            fenced,
            token: token.to_owned(),
        }
    }

    /// Runs `work` while renewing the leases every third of the lease and keeping the fences of
    /// the keys loaded without their locks alive (their fills are written only over the fence
    /// they read, which would otherwise expire with the lease during a longer load); a renewal
    /// that finds none held (or none of those fences) any more stops those renewals, and one
    /// that fails is tried again next period.
    pub(crate) async fn while_held<F: std::future::Future>(&self, work: F) -> F::Output {
        if self.keys.is_empty() && self.fenced.is_empty() {
            return work.await;
        }
        let period = (self.endpoint.config.lease / 3).max(Duration::from_millis(10));
        let keys: Vec<&RedisKeys> = self.keys.iter().collect();
        let fenced: Vec<(&RedisKeys, u64)> = self
            .fenced
            .iter()
            .map(|(keys, fence)| (keys, *fence))
            .collect();
        let watchdog = async {
            let (mut locks, mut fences) = (!keys.is_empty(), !fenced.is_empty());
            loop {
                tokio::time::sleep(period).await;
                if locks && let Ok(0) = self.endpoint.extend_many(&keys, &self.token).await {
                    tracing::warn!(
                        locks = keys.len(),
                        "stampede: lost Redis locks' leases while loading"
                    );
                    locks = false;
                }
                if fences && let Ok(0) = self.endpoint.keep_fences(&fenced).await {
                    fences = false; // every fence moved: those fills will be refused
                }
                if !locks && !fences {
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

    /// The fill ran (`filled`: and released the locks it wrote); else the locks are given back.
    pub(crate) fn done(&self, filled: bool) {
        if !filled {
            let keys: Vec<&RedisKeys> = self.keys.iter().collect();
            give_back(&self.endpoint, &keys, &self.token);
        }
        self.released
            .store(true, std::sync::atomic::Ordering::Release);
    }
}

impl Drop for Locks {
    fn drop(&mut self) {
        if !self.released.load(std::sync::atomic::Ordering::Acquire) {
            let keys: Vec<&RedisKeys> = self.keys.iter().collect();
            give_back(&self.endpoint, &keys, &self.token);
        }
    }
}

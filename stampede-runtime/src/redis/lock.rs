//! The holder's side of a key's Redis lock: its token, and the watchdog that renews the lease
//! while the load runs.

use std::future::Future;
use std::time::Duration;

use crate::redis::keys::RedisKeys;
use crate::redis::tier::Tier;

/// A token no other holder will ever use: the lock's value, checked on renewal and release.
pub(crate) fn token() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// Runs `work` while renewing the lock every third of its lease. A renewal that finds the lock
/// gone or taken stops the renewals (the lease was lost: another holder may load too, and the
/// release will not delete its lock); a renewal that fails is tried again next period.
pub(crate) async fn while_held<F: Future>(
    tier: &Tier,
    keys: &RedisKeys,
    token: &str,
    work: F,
) -> F::Output {
    let period = tier.config.lease / 3;
    let watchdog = async {
        loop {
            tokio::time::sleep(period.max(Duration::from_millis(10))).await;
            if let Ok(false) = tier.extend(keys, token).await {
                tracing::warn!(lock = %keys.lock, "stampede: lost a Redis lock's lease while loading");
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

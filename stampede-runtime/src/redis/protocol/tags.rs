//! Tags in Redis: for each tag, the set of the key bases loaded with it (`keys::tag_set`), so
//! that a tag's invalidation finds its keys without scanning.
//!
//! A load of a tagged key adds its key base to each tag's set *before* it reads its source
//! ([`Endpoint::tag`]); a tag's invalidation reads the set's members (copied to a pending set,
//! so that one failing midway leaves the rest to the next), runs a key's invalidation on each
//! (value deleted, fence moved on past the invalidation's moment) and then announces the tag to
//! every process. A load that read its source before the invalidation is fenced off; one that
//! read it after writes its value (`order::fill_lands`), and its key is still in the set, which
//! keeps its members: the tag's next invalidation finds it. A value written to Redis is thus
//! always in its tags' sets while it lives: each set is kept as long as the values it stands
//! for (their `ttl + stale + fail_safe`, plus the longest a load may run). The sets are the
//! only per-tag state, and expire with their values; an invalidation runs on every key tagged
//! within that time, some of them gone already (a key's invalidation of nothing is one script
//! that writes nothing).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::future::try_join_all;

use crate::config::Config;
use crate::error::Error;
use crate::memory::Invalidation;
use crate::redis::codec::keys::{RedisKeys, TagKeys};
use crate::redis::protocol::ops::millis;
use crate::redis::protocol::scripts;
use crate::redis::transport::endpoint::Endpoint;
use crate::redis::transport::failure::Failure;
use crate::redis::transport::feed;
use crate::redis::transport::installed::lookup;

/// How many key invalidations of one tag are in flight at once.
pub(in crate::redis) const AT_ONCE: usize = 64;

/// Redis refuses expiries that overflow its clock; no set needs more than a century.
const LONGEST_SET: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// The connections (by name; `None`: the default one) of the caches with `tags`: where a tag's
/// keys may be.
static TAGGED: Mutex<BTreeSet<Option<Arc<str>>>> = Mutex::new(BTreeSet::new());

/// A cache with `tags` keeps its values through the connection named `connection`.
pub(crate) fn used_by_tags(connection: Option<Arc<str>>) {
    TAGGED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(connection);
}

/// Drops every key loaded with `tag` from each Redis that a cache with `tags` uses (the linked
/// functions' caches are built first, for a process that never called them), and announces the
/// tag to every process. A Redis that fails, or a connection that is not configured in this
/// process, does not keep the others from it; then the error returned is the first connection
/// not configured (an admin tool that forgot its `RedisConfig` reached nobody through it, and
/// must not be told `Ok`), else the first Redis that failed.
pub(crate) async fn invalidate_tag(tag: &str, how: Invalidation) -> Result<(), Error> {
    crate::registry::build_tagged();
    let names: Vec<Option<Arc<str>>> = TAGGED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .cloned()
        .collect();
    let (mut unconfigured, mut failed) = (None, None);
    for name in &names {
        let Some(connection) = lookup(name.as_deref()) else {
            let what = match how {
                Invalidation::Drop => {
                    format!(
                        ", so the invalidation of tag `{tag}` reached no other process through it"
                    )
                }
                Invalidation::Expire => {
                    format!(", so the expiry of tag `{tag}` reached no other process through it")
                }
            };
            unconfigured.get_or_insert(crate::redis::not_configured(name.as_deref(), &what));
            continue;
        };
        if let Err(failure) = connection.invalidate_tag(tag, how).await {
            failed.get_or_insert(Error::RedisUnavailable {
                cache: format!("tag `{tag}`").into(),
                message: failure.to_string().into(),
            });
        }
    }
    unconfigured.or(failed).map_or(Ok(()), Err)
}

/// How long a tag's set must outlive the tagging of a key with `config`: the longest a load
/// may run (every attempt timing out, with its backoffs) and the lease, then the value's life.
pub(crate) fn set_lifetime(config: &Config, lease: Duration) -> Duration {
    let attempts = config.retries.saturating_add(1);
    let loading = config
        .timeout
        .saturating_mul(attempts)
        .saturating_add(config.backoff.saturating_mul(2u32.saturating_pow(attempts)));
    loading
        .saturating_add(lease)
        .saturating_add(config.longest_use())
        .min(LONGEST_SET)
}

impl Endpoint {
    /// Adds the key base of `keys` to the set of each of `tags`, kept for `lifetime`.
    pub(crate) async fn tag(
        &self,
        keys: &RedisKeys,
        tags: &[Box<str>],
        lifetime: Duration,
    ) -> Result<(), Failure> {
        let lifetime = millis(lifetime);
        let base = keys.base();
        try_join_all(tags.iter().map(|tag| {
            let tag = TagKeys::new(&self.config.prefix, tag);
            async move {
                self.call(|mut connection| async move {
                    scripts::TAG
                        .key(&tag.set)
                        .arg(base)
                        .arg(lifetime)
                        .invoke_async::<i64>(&mut connection)
                        .await
                })
                .await
            }
        }))
        .await?;
        Ok(())
    }

    /// Reads the keys loaded with `tag`, drops each (value deleted, fence moved on; or with
    /// [`Invalidation::Expire`] only no longer fresh, under every shape), then announces the tag
    /// on the invalidation channel. A key is taken off the pending set only once done, so an
    /// invalidation that fails midway leaves the rest to the next one.
    async fn invalidate_tag(&self, tag: &str, how: Invalidation) -> Result<(), Failure> {
        let tag_keys = &TagKeys::new(&self.config.prefix, tag);
        let bases: Vec<String> = self
            .call(|mut connection| async move {
                scripts::TAKE_TAGGED
                    .key(&tag_keys.set)
                    .key(&tag_keys.pending)
                    .invoke_async(&mut connection)
                    .await
            })
            .await?;
        for chunk in bases.chunks(AT_ONCE) {
            try_join_all(chunk.iter().map(|base| async move {
                // No announcement per key: the tag's one announcement follows.
                let expire = how == Invalidation::Expire;
                self.invalidate_as(&RedisKeys::of_base(base), None, expire)
                    .await
            }))
            .await?;
            let pending = &tag_keys.pending;
            self.call(|mut connection| async move {
                redis::cmd("SREM")
                    .arg(pending)
                    .arg(chunk)
                    .query_async::<i64>(&mut connection)
                    .await
            })
            .await?;
        }
        self.announce(&feed::tag_message(tag, how)).await
    }
}

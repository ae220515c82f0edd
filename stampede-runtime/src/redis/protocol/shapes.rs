//! The identities a cache name is served with (see `keys::shapes_key`): a process registers
//! its cache's identity before its loads write under it, and an invalidation of a key drops
//! the key under each registered identity of the name, so that a deploy that changes a shape
//! (v1 and v2 processes side by side, each with its own keys) never splits the fleet: an
//! invalidation from either reaches both.

use std::time::Duration;

use tokio::time::Instant;

use crate::redis::codec::keys::{self, RedisKeys};
use crate::redis::protocol::ops::millis;
use crate::redis::protocol::scripts;
use crate::redis::transport::endpoint::Endpoint;
use crate::redis::transport::failure::Failure;
use crate::redis::transport::feed::Heard;

/// When a cache's registration is to be renewed, and where it was made (the prefix and the
/// database: a connection installed again may name others): a registration lasts twice the
/// longest a value written now may live in Redis, and is renewed once half of it is gone, so it
/// outlives every value its loads wrote. Checked on every flow, so without an allocation.
#[derive(Default)]
pub(crate) struct Registration(std::sync::Mutex<Option<Made>>);

struct Made {
    prefix: String,
    db: i64,
    renew_at: Instant,
}

impl Registration {
    /// Whether the registration under `prefix` in database `db` is due at `now` (never made
    /// there, or half gone).
    fn due(&self, prefix: &str, db: i64, now: Instant) -> bool {
        self.held()
            .as_ref()
            .is_none_or(|made| made.prefix != prefix || made.db != db || made.renew_at <= now)
    }

    fn renewed(&self, prefix: &str, db: i64, renew_at: Instant) {
        *self.held() = Some(Made {
            prefix: prefix.to_owned(),
            db,
            renew_at,
        });
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Option<Made>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Endpoint {
    /// Registers `identity` under the cache name `name`, and under its stem when it is one of a
    /// function's several caches (`names::stem`: a lookup by the stem reaches them all, in
    /// every process), unless `registration` says it is registered for longer than `lifetime`
    /// (the longest a value its loads write now may live in Redis). A failure is left to the
    /// operation that follows, which meets it too.
    pub(crate) async fn register_shape(
        &self,
        registration: &Registration,
        name: &str,
        identity: &str,
        lifetime: Duration,
    ) {
        let now = Instant::now();
        let (prefix, db) = (&self.config.prefix, self.config.db());
        if !registration.due(prefix, db, now) {
            return;
        }
        let keep = lifetime.saturating_mul(2);
        for name in std::iter::once(name).chain(crate::names::stem(name)) {
            let key = keys::shapes_key(prefix, name);
            let registered: Result<i64, Failure> = self
                .call(|mut connection| async move {
                    scripts::REGISTER
                        .key(&key)
                        .arg(identity)
                        .arg(millis(keep))
                        .invoke_async(&mut connection)
                        .await
                })
                .await;
            if registered.is_err() {
                return;
            }
        }
        registration.renewed(prefix, db, now + lifetime);
    }

    /// Drops a key's value and moves its fence on; announces `message` on the invalidation
    /// channel, unless `None` (a tag's keys: the tag is announced once for all, and a tag's set
    /// holds the keys of every shape). A key's invalidation then drops it under the name's other
    /// identities (`shapes`), and announces it again if it found any: a process of another shape
    /// may have read its old copy between the first announcement and its drop. Its own key goes
    /// first, so that a call of this process reading it meanwhile meets the drop no later than
    /// before shapes were looked up. Whether Redis held a value for the key, under any.
    pub(crate) async fn invalidate(
        &self,
        keys: &RedisKeys,
        message: Option<&[u8]>,
    ) -> Result<bool, Failure> {
        self.invalidate_as(keys, message, false).await
    }

    /// [`Endpoint::invalidate`], or with `expire` the value only no longer fresh, under every
    /// shape: the companion's `expire`.
    pub(crate) async fn invalidate_as(
        &self,
        keys: &RedisKeys,
        message: Option<&[u8]>,
        expire: bool,
    ) -> Result<bool, Failure> {
        let held = self.invalidate_one(keys, message, expire).await?;
        let Some(message) = message else {
            return Ok(held);
        };
        let Some(Heard::Key { name, .. }) = Heard::parse(message) else {
            return Ok(held);
        };
        let Some(other_held) = self.invalidate_other_shapes(keys, name, expire).await? else {
            return Ok(held);
        };
        self.announce(message).await?;
        Ok(held || other_held)
    }

    /// Drops the key of `keys` under every other identity registered for the cache name
    /// `name`: `None` when there is none, else whether Redis held a value under any. Says so
    /// when no process serves the name under this prefix (and database): the invalidation
    /// reaches nobody's Redis copy, which is almost always a wrong prefix.
    pub(crate) async fn invalidate_other_shapes(
        &self,
        keys: &RedisKeys,
        name: &str,
        expire: bool,
    ) -> Result<Option<bool>, Failure> {
        let key = keys::shapes_key(&self.config.prefix, name);
        let shapes: Vec<String> = self
            .call(|mut connection| async move {
                scripts::SHAPES
                    .key(&key)
                    .invoke_async(&mut connection)
                    .await
            })
            .await?;
        if shapes.is_empty() {
            tracing::warn!(
                cache = %name,
                prefix = %self.config.prefix,
                db = self.config.db(),
                "stampede: no process has served cache `{name}` through this Redis under prefix \
                 `{}` (database {}) lately, so this invalidation (or prime) reached no other \
                 process's value there; check the prefix and database against the serving \
                 processes' RedisConfig",
                self.config.prefix,
                self.config.db(),
            );
        }
        let mut others = None;
        for shape in &shapes {
            if let Some(other) = keys.in_identity(&self.config.prefix, shape) {
                let held = self.invalidate_one(&other, None, expire).await?;
                others = Some(others.unwrap_or(false) || held);
            }
        }
        Ok(others)
    }
}

#[cfg(test)]
mod tests {
    use stampede_test_support::redis_server::RedisServer;

    use super::*;
    use crate::redis::transport::config::RedisConfig;

    /// A registration lasts twice the lifetime it is given, is renewed once half of it is gone
    /// (not before), is never shortened by a shorter one, and is forgotten once it ran out.
    #[test]
    fn a_registration_runs_out_unless_renewed_and_is_never_shortened() {
        let server = RedisServer::start();
        let endpoint = Endpoint::new(
            "shapes_unit",
            RedisConfig::new(&server.url()).unwrap().prefix("shapes"),
        );
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let key = keys::shapes_key("shapes", "n");
        let listed = || {
            runtime.block_on(endpoint.call(|mut connection| {
                let key = key.clone();
                async move {
                    scripts::SHAPES
                        .key(&key)
                        .invoke_async(&mut connection)
                        .await
                }
            }))
        };
        let (long, short) = (Registration::default(), Registration::default());
        let lifetime = Duration::from_millis(300);
        runtime.block_on(endpoint.register_shape(&long, "n", "n~long", lifetime * 10));
        runtime.block_on(endpoint.register_shape(&short, "n", "n~short", lifetime));
        assert!(
            !long.due("shapes", 0, Instant::now()),
            "renewed at half of it"
        );
        assert!(
            long.due("elsewhere", 0, Instant::now()),
            "made under another prefix"
        );
        assert!(
            long.due("shapes", 1, Instant::now()),
            "made in another database"
        );
        // Another process of the long one's identity registers for less: still the longer.
        runtime.block_on(endpoint.register_shape(
            &Registration::default(),
            "n",
            "n~long",
            Duration::from_millis(1),
        ));
        let mut shapes: Vec<String> = listed().unwrap();
        shapes.sort();
        assert_eq!(shapes, ["n~long", "n~short"]);
        std::thread::sleep(lifetime * 2 + Duration::from_millis(100));
        assert_eq!(listed().unwrap(), ["n~long"], "the short one ran out");
        runtime.block_on(endpoint.register_shape(&Registration::default(), "n", "n~new", lifetime));
        let mut members: Vec<String> = server.command(&["ZRANGE", &key, "0", "-1"]);
        members.sort();
        assert_eq!(
            members,
            ["n~long", "n~new"],
            "forgotten at the next registration"
        );
    }
}

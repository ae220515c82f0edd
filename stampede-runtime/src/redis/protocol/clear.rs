//! A cache's clear in Redis: every key of every shape of its name under the connection's
//! prefix, found by `SCAN` (on each master of a cluster), is dropped as a key's invalidation
//! drops it (value deleted, fence moved on, so that a load that read its source before writes
//! nothing), then the clear is announced to every process. A scan of the keyspace: an operation
//! for an admin tool, not a request's path.

use std::collections::BTreeSet;

use futures_util::future::try_join_all;

use crate::redis::codec::keys::{self, RedisKeys};
use crate::redis::protocol::tags::AT_ONCE;
use crate::redis::transport::endpoint::Endpoint;
use crate::redis::transport::failure::Failure;

impl Endpoint {
    /// Drops every key of the caches that answer to the name `name` here (`names::answers_to`:
    /// every process's instantiations of a function asked for by their stem), then announces
    /// `message` (the clear) on the invalidation channel. How many cache keys it found.
    pub(crate) async fn clear(&self, name: &str, message: &[u8]) -> Result<usize, Failure> {
        let pattern = keys::name_pattern(&self.config.prefix, name);
        let answers = keys::answering(&self.config.prefix, name);
        let targets = self
            .call(|mut connection| async move { connection.scan_targets().await })
            .await?;
        let mut bases = BTreeSet::new();
        for target in targets {
            let mut cursor = 0;
            loop {
                let pattern = &pattern;
                let (next, found) = self
                    .call(|mut connection| async move {
                        connection.scan_page(target, cursor, pattern).await
                    })
                    .await?;
                bases.extend(
                    found
                        .iter()
                        .filter_map(|key| keys::base_of_key(key))
                        .filter(|base| answers(base))
                        .map(str::to_owned),
                );
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        let bases: Vec<String> = bases.into_iter().collect();
        for chunk in bases.chunks(AT_ONCE) {
            try_join_all(chunk.iter().map(|base| async move {
                let keys = RedisKeys::of_base(base);
                self.invalidate_one(&keys, None, false).await
            }))
            .await?;
        }
        self.announce(message).await?;
        Ok(bases.len())
    }
}

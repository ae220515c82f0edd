//! Invalidations announced by any process drop the key from every process's memory.
//!
//! The message on `{prefix}:invalidations` is `{cache name}\n{argument text}`: each process
//! drops, from its caches of that name, the entries whose key writes as that text; for a tag's
//! invalidation it is `\0tag\n{tag}`, and each process drops its entries with that tag. When the feed
//! itself may have lost messages, a process drops all it holds instead ([`forget_all`]).

use crate::registry;

pub(crate) fn message(name: &str, args: &str) -> Vec<u8> {
    format!("{name}\n{args}").into_bytes()
}

/// The message of a tag's invalidation: `\0tag\n{tag}` (no cache name starts with a NUL).
pub(crate) fn tag_message(tag: &str) -> Vec<u8> {
    message(TAG, tag)
}

const TAG: &str = "\0tag";

/// Handles one message of the invalidation channel.
pub(crate) fn on_message(payload: &[u8]) {
    let Some((name, args)) = std::str::from_utf8(payload)
        .ok()
        .and_then(|text| text.split_once('\n'))
    else {
        return;
    };
    if name == TAG {
        crate::registry::forget_tag(args);
        return;
    }
    for cache in registry::named(name) {
        cache.forget_named(args);
    }
}

/// Drops this process's memory of every cache whose keys are shared (any Redis connection's:
/// over-dropping costs reads, never a wrong value), because invalidations may have been missed.
pub(crate) fn forget_all() {
    for cache in registry::all() {
        cache.forget_all_shared();
    }
}

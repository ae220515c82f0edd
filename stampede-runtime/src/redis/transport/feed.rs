//! The invalidation feed's messages: their form (`{cache name}\n{argument text}`, or
//! `\0tag\n{tag}` for a tag), and what this process does with what it hears, or with the news
//! that it may have missed some. Below both the publishing side (`invalidate`) and the
//! subscriber (`pubsub`), which names no connection.

use crate::registry;

/// The message of an invalidation of the key written as `args` in the caches named `name`.
pub(crate) fn message(name: &str, args: &str) -> Vec<u8> {
    format!("{name}\n{args}").into_bytes()
}

/// The message of a tag's invalidation: `\0tag\n{tag}` (no cache name starts with a NUL).
pub(crate) fn tag_message(tag: &str) -> Vec<u8> {
    message(TAG, tag)
}

const TAG: &str = "\0tag";

/// The cache name and argument text of a key's invalidation message; `None` for a tag's, or
/// a message not of this form.
pub(crate) fn key_of(payload: &[u8]) -> Option<(&str, &str)> {
    parse(payload).filter(|(name, _)| *name != TAG)
}

fn parse(payload: &[u8]) -> Option<(&str, &str)> {
    std::str::from_utf8(payload)
        .ok()
        .and_then(|text| text.split_once('\n'))
}

/// Handles one message of the invalidation channel.
pub(crate) fn on_message(payload: &[u8]) {
    let Some((name, args)) = parse(payload) else {
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

/// Drops this process's memory of every cache whose keys are shared through the Redis
/// connection named `connection` (`None`: through any; over-dropping costs reads, never a wrong
/// value), because invalidations announced there may have been missed and the log cannot tell
/// which.
pub(crate) fn forget_all(connection: Option<&str>) {
    for cache in registry::all() {
        cache.forget_all_shared(connection);
    }
}

/// Takes out of service, from `until` on (at the latest the feed's own deadline: the last
/// heartbeat heard was sent less than the staleness bound before), this process's memory of
/// every cache whose keys are shared through the Redis connection named `connection` (`None`:
/// through any), because invalidations announced there may be missed from now on;
/// [`resume_all`] serves it again, [`forget_all`] drops it.
pub(crate) fn suspend_all(connection: Option<&str>, until: tokio::time::Instant) {
    for cache in registry::all() {
        cache.suspend_shared(connection, until);
    }
}

/// Serves again what [`suspend_all`] took out of service and memory still holds: the
/// invalidations missed meanwhile were handled (`on_message`) from the feed's log.
pub(crate) fn resume_all(connection: Option<&str>) {
    for cache in registry::all() {
        cache.resume_shared(connection);
    }
}

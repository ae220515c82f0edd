//! The invalidation feed's messages: their form (`{cache name}\n{argument text}` for a key,
//! `\0expire\n{cache name}\n{argument text}` for a key's expiry, `\0tag\n{tag}` for a tag,
//! `\0expiretag\n{tag}` for a tag's expiry, `\0clear\n{cache name}` for a cache's clear), and
//! what this process does with what it hears, or with the news that it may have missed some.
//! Below both the publishing side (`invalidate`) and the subscriber (`pubsub`), which names no
//! connection. A process of an earlier version ignores an expiry (no cache name starts with a
//! NUL): its copy stays fresh for the rest of its `ttl`.

use crate::memory::Invalidation;
use crate::registry;

/// The message of an invalidation (`how`) of the key written as `args` in the caches named
/// `name`.
pub(crate) fn message(name: &str, args: &str, how: Invalidation) -> Vec<u8> {
    match how {
        Invalidation::Drop => format!("{name}\n{args}").into_bytes(),
        Invalidation::Expire => format!("{EXPIRE}\n{name}\n{args}").into_bytes(),
    }
}

/// The message of a tag's invalidation (`how`): `\0tag\n{tag}`, `\0expiretag\n{tag}` (no cache
/// name starts with a NUL).
pub(crate) fn tag_message(tag: &str, how: Invalidation) -> Vec<u8> {
    match how {
        Invalidation::Drop => format!("{TAG}\n{tag}").into_bytes(),
        Invalidation::Expire => format!("{EXPIRE_TAG}\n{tag}").into_bytes(),
    }
}

/// The message of a clear of the caches named `name`: `\0clear\n{name}`.
pub(crate) fn clear_message(name: &str) -> Vec<u8> {
    format!("{CLEAR}\n{name}").into_bytes()
}

const TAG: &str = "\0tag";
const CLEAR: &str = "\0clear";
const EXPIRE: &str = "\0expire";
const EXPIRE_TAG: &str = "\0expiretag";

/// What a message of the feed says.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Heard<'a> {
    /// The key written as `args` in the caches named `name`.
    Key {
        name: &'a str,
        args: &'a str,
        how: Invalidation,
    },
    /// Every entry tagged so.
    Tag(&'a str, Invalidation),
    /// Every entry of the caches named so.
    Clear(&'a str),
}

impl<'a> Heard<'a> {
    /// The message's meaning; `None` for a message not of these forms (an empty one: a log's
    /// first entry; another version's).
    pub(crate) fn parse(payload: &'a [u8]) -> Option<Heard<'a>> {
        let (first, rest) = std::str::from_utf8(payload).ok()?.split_once('\n')?;
        let (name, args, how) = match first {
            TAG => return Some(Heard::Tag(rest, Invalidation::Drop)),
            EXPIRE_TAG => return Some(Heard::Tag(rest, Invalidation::Expire)),
            CLEAR => return Some(Heard::Clear(rest)),
            EXPIRE => {
                let (name, args) = rest.split_once('\n')?;
                (name, args, Invalidation::Expire)
            }
            name if name.starts_with('\0') => return None,
            name => (name, rest, Invalidation::Drop),
        };
        Some(Heard::Key { name, args, how })
    }
}

/// Handles one message of the invalidation channel.
pub(crate) fn on_message(payload: &[u8]) {
    match Heard::parse(payload) {
        Some(Heard::Tag(tag, how)) => crate::registry::forget_tag_as(tag, how),
        Some(Heard::Clear(name)) => {
            for cache in registry::named(name) {
                cache.clear_here();
            }
        }
        Some(Heard::Key { name, args, how }) => {
            for cache in registry::named(name) {
                cache.forget_named(args, how);
            }
        }
        None => {}
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_message_reads_back_as_what_it_says_and_an_unknown_kind_as_nothing() {
        let key = message("shop::price", "7:eu", Invalidation::Drop);
        let expired = message("shop::price", "7:eu", Invalidation::Expire);
        let tag = tag_message("user:42", Invalidation::Drop);
        let expired_tag = tag_message("user:42", Invalidation::Expire);
        let clear = clear_message("shop::price");
        let key_of = |how| Heard::Key {
            name: "shop::price",
            args: "7:eu",
            how,
        };
        assert_eq!(Heard::parse(&key), Some(key_of(Invalidation::Drop)));
        assert_eq!(Heard::parse(&expired), Some(key_of(Invalidation::Expire)));
        assert_eq!(
            Heard::parse(&tag),
            Some(Heard::Tag("user:42", Invalidation::Drop))
        );
        assert_eq!(
            Heard::parse(&expired_tag),
            Some(Heard::Tag("user:42", Invalidation::Expire))
        );
        assert_eq!(Heard::parse(&clear), Some(Heard::Clear("shop::price")));
        // A later version's kind, and the log's first (empty) entry, say nothing.
        assert_eq!(Heard::parse(b"\0later\nshop::price"), None);
        assert_eq!(Heard::parse(b""), None);
        // Arguments may hold a newline: only the first one ends the name.
        assert_eq!(
            Heard::parse(b"shop::price\na\nb"),
            Some(Heard::Key {
                name: "shop::price",
                args: "a\nb",
                how: Invalidation::Drop
            })
        );
    }
}

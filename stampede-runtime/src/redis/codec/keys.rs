//! The Redis keys of one cache key: stable across processes and builds, injective, readable for
//! plain arguments, bounded in length, and hash-tagged so that a key's value, lock and fence
//! live on one Redis Cluster slot.
//!
//! ```text
//! {prefix}:{{identity}|{arguments}}:v     the value (an envelope, see `envelope`)
//! {prefix}:{{identity}|{arguments}}:l     the lock, holding its holder's token
//! {prefix}:{{identity}|{arguments}}:f     the fence, taken with the lock, bumped by invalidation
//! {prefix}:{{identity}|{arguments}}:c     the channel a fill is published on (database 0)
//! {prefix}:{{identity}|{arguments}}:c@{db} the same in database `db`, if not 0
//! {prefix}:{tag|{tag}}:t                   a tag's set: the key bases loaded with the tag
//! {prefix}:{tag|{tag}}:p                   those an invalidation of the tag took, until dropped
//! {prefix}:{name|{name}}:s                 the identities a cache name is served with (below)
//! ```
//!
//! Keys live in the database the connection selects; pub/sub channels do not: Redis hands a
//! publication to every subscriber of its channel's name on the server (on a cluster, on the
//! shard), whatever database each selected. So every channel of a connection to a database other
//! than 0 ends in `@{db}` ([`in_database`]): two tenants of one server on two databases, with one
//! prefix and the same caches, never hear each other's fills or invalidations. Database 0's
//! channels keep the names of earlier versions, so processes of both versions on database 0
//! still wake each other during a rolling deploy; on another database, a process of an earlier
//! version and one of this version do not hear each other (each reads again when the lease runs
//! out, and an invalidation reaches only the processes of its own version). A Redis Cluster has
//! only database 0 (Valkey 9's clusters have more, and are named the same way).
//!
//! The identity is the cache's name, escaped (`%`, `|`, `{`, `}`, spaces and control characters
//! percent-encoded), then `~` and a [`fingerprint`]: a digest of the cache's `version`, its key
//! template and the *shapes* of its key and value types as serde sees them (`shape`), never
//! their Rust paths. Two binaries whose caches have one name and one shape share keys; one name
//! with another shape, template or version is another set of keys, so a process never decodes
//! another shape's bytes.
//!
//! The arguments' text is written by the serializer in `text`.
//!
//! A name's identities (`{prefix}:{name|{name}}:s`, a sorted set scored by when each runs out)
//! are those a process registered before its loads wrote under them: during a rolling deploy
//! that changes a shape, both. An invalidation of a key drops its value under each of them, so
//! that it reaches every shape of the name (see `Endpoint::invalidate`). One of a function's
//! several caches (`shelf<app::Euros>`) registers under its stem (`shelf`) too, so that an
//! invalidation asked for by the stem reaches every process's instantiations.

mod text;

use std::fmt::Write as _;

use sha2::{Digest, Sha256};

pub(crate) use text::args_text;

/// The Redis names of one cache key.
#[derive(Clone, Debug)]
pub(crate) struct RedisKeys {
    pub(crate) value: String,
    pub(crate) lock: String,
    pub(crate) fence: String,
    pub(crate) channel: String,
}

impl RedisKeys {
    /// The keys of `args` in the cache with this `identity` (see [`identity`]), in database
    /// `db`.
    pub(crate) fn new(prefix: &str, db: i64, identity: &str, args: &str) -> Self {
        let mut keys = RedisKeys::of_base(&base(prefix, identity, args));
        keys.channel = in_database(keys.channel, db);
        keys
    }

    /// The value key alone, for a read that needs no other.
    pub(crate) fn value_key(prefix: &str, identity: &str, args: &str) -> String {
        let mut key = base(prefix, identity, args);
        key.push_str(VALUE);
        key
    }

    /// The keys whose common part is `base` (what [`RedisKeys::base`] returns), with the
    /// channel of database 0: for the keys of a value to drop, whose channel is not used (an
    /// invalidation is announced on the feed's channel). Keys whose channel is published on or
    /// listened to come from [`RedisKeys::new`].
    pub(crate) fn of_base(base: &str) -> Self {
        RedisKeys {
            value: format!("{base}{VALUE}"),
            lock: format!("{base}{LOCK}"),
            fence: format!("{base}{FENCE}"),
            channel: format!("{base}:c"),
        }
    }

    /// The part every key of this cache key shares: what a tag's set holds.
    pub(crate) fn base(&self) -> &str {
        RedisKeys::base_of(&self.value)
    }

    /// The keys of the same arguments in the cache of identity `other` (another shape of the
    /// name); `None` when these are not keys of a cache under `prefix`.
    pub(crate) fn in_identity(&self, prefix: &str, other: &str) -> Option<RedisKeys> {
        let (own, args) = self.split(prefix)?;
        (own != other).then(|| RedisKeys::of_base(&format!("{prefix}:{{{other}|{args}")))
    }

    /// The identity these keys name, and what follows it (the arguments, and the hash tag's
    /// end): an identity is escaped, so the first `|` ends it.
    fn split<'a>(&'a self, prefix: &str) -> Option<(&'a str, &'a str)> {
        self.base()
            .strip_prefix(prefix)?
            .strip_prefix(":{")?
            .split_once('|')
    }

    /// The part of a value key that every key of its cache key shares.
    pub(crate) fn base_of(value_key: &str) -> &str {
        value_key.strip_suffix(VALUE).unwrap_or(value_key)
    }
}

/// What ends a cache key's value key, after the part its keys share.
const VALUE: &str = ":v";
/// What ends its lock's key.
const LOCK: &str = ":l";
/// What ends its fence's key.
const FENCE: &str = ":f";
/// The characters of an identity's fingerprint.
const FINGERPRINT: usize = 12;

/// The `SCAN MATCH` pattern of every key, of every shape, of the caches that answer to the
/// name `name` under `prefix` (`names::answers_to`: `name`, and `name<Args>`). It matches some
/// other names' keys too (`name~x`, `name<A>::f`): [`answering`] tells them apart.
pub(crate) fn name_pattern(prefix: &str, name: &str) -> String {
    let mut escaped = String::new();
    escape_into(&mut escaped, name);
    format!("{}:{{{}[~<]*", glob(prefix), glob(&escaped))
}

/// Whether the keys of a `base` (see [`RedisKeys::base`]) under `prefix` are a key of a cache
/// that answers to the name `name`: its identity is its escaped name, `~` and a fingerprint of
/// 12 characters, then `|` (which no escaped name holds). The name is escaped once, for every
/// base asked about.
pub(crate) fn answering<'a>(prefix: &'a str, name: &str) -> impl Fn(&str) -> bool + 'a {
    let mut escaped = String::new();
    escape_into(&mut escaped, name);
    move |base| {
        let Some((identity, _)) = base
            .strip_prefix(prefix)
            .and_then(|rest| rest.strip_prefix(":{"))
            .and_then(|rest| rest.split_once('|'))
        else {
            return false;
        };
        let cut = identity.len().saturating_sub(FINGERPRINT + 1);
        let (Some(cache), Some(fingerprint)) = (identity.get(..cut), identity.get(cut..)) else {
            return false;
        };
        fingerprint.starts_with('~') && crate::names::answers_to(cache, &escaped)
    }
}

/// `text` with the characters a glob gives a meaning to (`*`, `?`, `[`, `]`, `\`) escaped.
fn glob(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The part every Redis key of one cache key shares, from one of them (its value, lock or
/// fence); `None` for another key.
pub(crate) fn base_of_key(key: &str) -> Option<&str> {
    [VALUE, LOCK, FENCE]
        .iter()
        .find_map(|suffix| key.strip_suffix(suffix))
}

/// The part every Redis key of one cache key shares.
fn base(prefix: &str, identity: &str, args: &str) -> String {
    format!("{prefix}:{{{identity}|{args}}}")
}

/// The name of `channel` (named as in database 0) for a connection to database `db`: itself in
/// database 0, else followed by `@{db}` (see the module's docs). Injective: no channel name of
/// database 0 ends in `@` and digits (each ends in `:c`, `:invalidations` or `:heartbeat:{id}`),
/// so the database is read back from the end.
pub(crate) fn in_database(mut channel: String, db: i64) -> String {
    if db != 0 {
        let _ = write!(channel, "@{db}");
    }
    channel
}

/// The Redis keys of a tag, in a slot of their own.
pub(crate) struct TagKeys {
    /// `{prefix}:{tag|{tag}}:t`: the key bases loaded with the tag.
    pub(crate) set: String,
    /// `{prefix}:{tag|{tag}}:p`: the key bases an invalidation of the tag took and has not
    /// dropped yet (it failed midway); the next one drops them.
    pub(crate) pending: String,
}

impl TagKeys {
    pub(crate) fn new(prefix: &str, tag: &str) -> Self {
        let mut base = format!("{prefix}:{{tag|");
        escape_into(&mut base, tag);
        base.push('}');
        TagKeys {
            set: format!("{base}:t"),
            pending: format!("{base}:p"),
        }
    }
}

/// The key of the identities that processes serve the cache name `name` with, in a slot of
/// its own.
pub(crate) fn shapes_key(prefix: &str, name: &str) -> String {
    let mut key = format!("{prefix}:{{name|");
    escape_into(&mut key, name);
    key.push_str("}:s");
    key
}

/// The part of a cache's Redis keys that names the cache: its escaped name, `~`, and the
/// [`fingerprint`] of what else must match for two processes to share values.
pub(crate) fn identity(name: &str, fingerprint: &str) -> String {
    let mut out = String::with_capacity(name.len() + 1 + fingerprint.len());
    escape_into(&mut out, name);
    out.push('~');
    out.push_str(fingerprint);
    out
}

/// A digest of `parts` (version, key template, key shape, value shape), 12 hex digits: stable
/// across builds, compilers and platforms.
pub(crate) fn fingerprint(parts: &[&str]) -> String {
    let mut digest = Sha256::new();
    for part in parts {
        digest.update((part.len() as u64).to_le_bytes());
        digest.update(part.as_bytes());
    }
    let mut out = String::with_capacity(FINGERPRINT);
    for byte in &digest.finalize()[..FINGERPRINT / 2] {
        let _ = write!(out, "{byte:02x}");
    }
    out
}

/// `text` with `%`, `|`, `{`, `}`, spaces and control characters percent-encoded.
fn escape_into(out: &mut String, text: &str) {
    for c in text.chars() {
        if matches!(c, '%' | '|' | '{' | '}') || c.is_whitespace() || c.is_control() {
            let mut bytes = [0; 4];
            for byte in c.encode_utf8(&mut bytes).bytes() {
                let _ = write!(out, "%{byte:02X}");
            }
        } else {
            out.push(c);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashSet};

    use proptest::prelude::*;
    use serde::Serialize;

    use super::text::{HEAD, MAX_ARGS, is_unordered_set};
    use super::*;

    #[derive(Serialize)]
    struct Filter {
        tenant: u32,
        tags: Vec<String>,
    }

    #[derive(Serialize)]
    enum Sort {
        Newest,
        By(String),
        Range(u32, u32),
    }

    #[test]
    fn another_identity_of_a_name_gets_the_same_arguments() {
        let v1 = identity("shop::product", "aaaaaaaaaaaa");
        let v2 = identity("shop::product", "bbbbbbbbbbbb");
        let keys = RedisKeys::new("p|x{", 2, &v1, "{tenant=3}:a%7Cb");
        let other = keys.in_identity("p|x{", &v2).unwrap();
        let expected = RedisKeys::new("p|x{", 2, &v2, "{tenant=3}:a%7Cb");
        assert_eq!(
            (other.value, other.lock, other.fence),
            (expected.value, expected.lock, expected.fence)
        );
        assert!(keys.in_identity("p|x{", &v1).is_none(), "its own identity");
        assert!(keys.in_identity("other", &v2).is_none(), "another prefix");
        assert_eq!(shapes_key("shop", "a b|c"), "shop:{name|a%20b%7Cc}:s");
    }

    #[test]
    fn plain_keys_are_readable() {
        assert_eq!(args_text(&(42u64,)).unwrap(), "42");
        assert_eq!(
            args_text(&(7u32, "ann@example.com".to_owned())).unwrap(),
            "7:ann@example.com"
        );
        assert_eq!(args_text(&()).unwrap(), "");
        assert_eq!(
            args_text(&("a:b c{d}".to_owned(),)).unwrap(),
            "a%3Ab%20c%7Bd%7D"
        );
        assert_eq!(args_text(&(Some(1u8), None::<u8>)).unwrap(), "+1:~");
        let filter = Filter {
            tenant: 3,
            tags: vec!["x".into(), "y,z".into()],
        };
        // Structs are written with their field names (since issue 22; before, `[3,[x,y%2Cz]]`,
        // which told no skipped field from another).
        assert_eq!(args_text(&(filter,)).unwrap(), "{tenant=3,tags=[x,y%2Cz]}");
        assert_eq!(args_text(&("", 1u8)).unwrap(), "\"\":1");
        assert_eq!(
            args_text(&(Sort::Newest, Sort::By("n".into()), Sort::Range(1, 2))).unwrap(),
            "Newest:By(n):Range(1,2)"
        );
        let map: BTreeMap<&str, u8> = [("b", 2), ("a", 1)].into();
        assert_eq!(args_text(&(map,)).unwrap(), "{a=1,b=2}");
        assert_eq!(
            RedisKeys::new("shop", 0, "users::get_user", "42").value,
            "shop:{users::get_user|42}:v"
        );
    }

    #[test]
    fn channels_name_their_database_unless_it_is_0() {
        use crate::redis::transport::config::RedisConfig;
        use crate::redis::transport::invalidate;
        use crate::redis::transport::mode::Mode;

        let zero = RedisKeys::new("shop", 0, "users::get_user", "42");
        let two = RedisKeys::new("shop", 2, "users::get_user", "42");
        // Database 0's names are those of earlier versions.
        assert_eq!(zero.channel, "shop:{users::get_user|42}:c");
        assert_eq!(two.channel, "shop:{users::get_user|42}:c@2");
        // The keys themselves live in their database: named alike.
        assert_eq!(
            (&zero.value, &zero.lock, &zero.fence),
            (&two.value, &two.lock, &two.fence)
        );
        let cluster = Mode::Cluster { sharded: true };
        assert_eq!(
            invalidate::channel("shop", 0, Mode::Standalone),
            "shop:invalidations"
        );
        assert_eq!(
            invalidate::channel("shop", 3, Mode::Standalone),
            "shop:invalidations@3"
        );
        assert_eq!(
            invalidate::channel("shop", 0, cluster),
            "shop:{feed|shop}:invalidations"
        );
        assert_eq!(
            invalidate::channel("shop", 3, cluster),
            "shop:{feed|shop}:invalidations@3"
        );
        assert_eq!(
            invalidate::heartbeat_channel("shop", 0, Mode::Standalone, "ab"),
            "shop:heartbeat:ab"
        );
        assert_eq!(
            invalidate::heartbeat_channel("shop", 1, cluster, "ab"),
            "shop:{feed|shop}:heartbeat:ab@1"
        );
        // The database is the URL's.
        let db = |url: &str| RedisConfig::new(url).unwrap().db();
        assert_eq!(db("redis://127.0.0.1:6379"), 0);
        assert_eq!(db("redis://127.0.0.1:6379/"), 0);
        assert_eq!(db("redis://127.0.0.1:6379/2"), 2);
        assert_eq!(db("redis://:secret@127.0.0.1/15"), 15);
        assert_eq!(db("redis+unix:///tmp/redis.sock?db=4"), 4);
        assert_eq!(db("redis://127.0.0.1:7000,redis://127.0.0.1:7001"), 0);
    }

    #[test]
    fn a_name_and_its_arguments_never_run_into_each_other() {
        // Cache `n` with arguments ("", "by_id", 42) and cache `n::by_id` with (42).
        let f = fingerprint(&[]);
        let a = RedisKeys::new(
            "p",
            0,
            &identity("n", &f),
            &args_text(&("", "by_id", 42)).unwrap(),
        );
        let b = RedisKeys::new(
            "p",
            0,
            &identity("n::by_id", &f),
            &args_text(&(42,)).unwrap(),
        );
        assert_ne!(a.value, b.value);
        // A name cannot forge the separator or the hash tag.
        assert!(identity("a|b{c}", &f).starts_with("a%7Cb%7Bc%7D~"));
    }

    /// A clear by name finds the keys of the caches that answer to it, and only theirs.
    #[test]
    fn a_clear_by_name_reaches_the_caches_that_answer_to_it() {
        let fingerprint = "0123456789ab";
        let base = |name: &str| {
            RedisKeys::new("p", 0, &identity(name, fingerprint), "7")
                .base()
                .to_owned()
        };
        let price = answering("p", "shop price");
        for name in ["shop price", "shop price<app::Euros>"] {
            assert!(price(&base(name)), "{name}");
        }
        for name in ["shop price2", "shop price~x", "shop price<u8>::f", "shop"] {
            assert!(!price(&base(name)), "{name}");
        }
        assert!(
            !answering("q", "shop price")(&base("shop price")),
            "another prefix"
        );
        assert!(!answering("p", "é")("p:{é|7}"), "no fingerprint");
        assert_eq!(name_pattern("p*", "a[1]"), r"p\*:{a\[1\][~<]*");
    }

    #[test]
    fn other_shapes_templates_or_versions_are_other_fingerprints() {
        let user = fingerprint(&["", "user:{id}", "(u64)", "struct{}"]);
        assert_ne!(user, fingerprint(&["", "admin:{id}", "(u64)", "struct{}"]));
        assert_ne!(user, fingerprint(&["", "user:{id}", "(u32)", "struct{}"]));
        assert_ne!(
            user,
            fingerprint(&["", "user:{id}", "(u64)", "struct{\"a\":u8}"])
        );
        assert_ne!(user, fingerprint(&["2", "user:{id}", "(u64)", "struct{}"]));
        // Parts cannot run into each other.
        assert_ne!(fingerprint(&["ab", "c"]), fingerprint(&["a", "bc"]));
        assert_eq!(user, fingerprint(&["", "user:{id}", "(u64)", "struct{}"]));
        // Pinned: a change here moves every cache to new keys in every deployed Redis.
        assert_eq!(user, "77e282706b66");
    }

    #[test]
    fn keys_are_stable_across_builds() {
        // Pinned text: a change here changes every key in every deployed Redis.
        assert_eq!(
            args_text(&(1u64, "Zoë".to_owned(), vec![1u8, 2])).unwrap(),
            "1:Zo%C3%AB:[1,2]"
        );
        let long = "x".repeat(300);
        let bounded = args_text(&(long,)).unwrap();
        assert_eq!(bounded.len(), HEAD + 1 + 64);
        assert!(bounded.starts_with(&"x".repeat(HEAD)));
        assert_eq!(&bounded[HEAD..HEAD + 1], "#");
        assert_eq!(
            &bounded[HEAD + 1..],
            "0d4e2ca9e9cbced7a7a5380eb29e1a3783b9b6d0db72de36a1051038e1c1fbc7"
        );
    }

    #[test]
    fn an_empty_list_and_a_list_of_an_empty_string_differ() {
        let empty: Vec<String> = vec![];
        assert_ne!(
            args_text(&(empty,)).unwrap(),
            args_text(&(vec![String::new()],)).unwrap()
        );
        assert_ne!(
            args_text(&(String::new(), 1u8)).unwrap(),
            args_text(&(1u8,)).unwrap()
        );
    }

    #[test]
    fn structs_with_skipped_fields_are_told_apart() {
        #[derive(Serialize)]
        struct Query {
            #[serde(skip_serializing_if = "Option::is_none")]
            tenant: Option<u32>,
            #[serde(skip_serializing_if = "Option::is_none")]
            user: Option<u32>,
        }
        let by_tenant = Query {
            tenant: Some(1),
            user: None,
        };
        let by_user = Query {
            tenant: None,
            user: Some(1),
        };
        assert_ne!(
            args_text(&(by_tenant,)).unwrap(),
            args_text(&(by_user,)).unwrap()
        );
    }

    #[test]
    fn a_map_gives_one_key_whatever_order_it_is_written_in() {
        /// A map whose entries come in the order given (a `HashMap` iterates so).
        struct Entries(Vec<(&'static str, u8)>);
        impl Serialize for Entries {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_map(self.0.iter().map(|(k, v)| (k, v)))
            }
        }
        assert_eq!(
            args_text(&(Entries(vec![("b", 2), ("a", 1)]),)).unwrap(),
            args_text(&(Entries(vec![("a", 1), ("b", 2)]),)).unwrap()
        );
    }

    /// Two equal `HashSet`s that iterate in different orders: `a` collected in ascending order,
    /// `b` given another capacity (the first one tried that makes the orders differ) and filled
    /// in descending order.
    fn equal_sets_iterating_apart() -> (HashSet<u32>, HashSet<u32>) {
        let items = [1u32, 2, 3, 10, 20, 300, 4000];
        let a: HashSet<u32> = items.iter().copied().collect();
        for capacity in 0..256 {
            let mut b = HashSet::with_capacity(capacity);
            b.extend(items.iter().rev().copied());
            if !a.iter().eq(b.iter()) {
                assert_eq!(a, b);
                return (a, b);
            }
        }
        panic!("no capacity gave an equal set that iterates in another order")
    }

    #[test]
    fn equal_hash_sets_give_one_key_whatever_order_they_iterate_in() {
        let (a, b) = equal_sets_iterating_apart();
        let order = |set: &HashSet<u32>| set.iter().copied().collect::<Vec<_>>();
        assert_ne!(
            order(&a),
            order(&b),
            "the two sets iterate in different orders"
        );
        assert_eq!(
            args_text(&(a.clone(),)).unwrap(),
            args_text(&(b.clone(),)).unwrap(),
            "equal sets, one key"
        );
        // Written sorted by the text of their elements.
        assert_eq!(args_text(&(a.clone(),)).unwrap(), "[1,10,2,20,3,300,4000]");

        /// Asserts that `a` and `b` give one text wherever `place` puts them.
        fn same<T: Serialize>(
            a: &HashSet<u32>,
            b: &HashSet<u32>,
            place: impl Fn(HashSet<u32>) -> T,
        ) {
            let (ta, tb) = (place(a.clone()), place(b.clone()));
            assert_eq!(args_text(&ta).unwrap(), args_text(&tb).unwrap());
        }
        #[derive(Serialize)]
        struct Members {
            tenant: u8,
            ids: HashSet<u32>,
        }
        #[derive(Serialize)]
        struct Wrapped(HashSet<u32>);
        #[derive(Serialize)]
        enum Filter {
            Ids(HashSet<u32>),
            Pair(u8, HashSet<u32>),
            Named { ids: HashSet<u32> },
        }
        same(&a, &b, |set| (set,));
        same(&a, &b, |set| (1u8, set, 2u8));
        same(&a, &b, |set| {
            (Members {
                tenant: 1,
                ids: set,
            },)
        });
        same(&a, &b, |set| (Wrapped(set),));
        same(&a, &b, |set| (Some(set),));
        same(&a, &b, |set| (vec![set.clone(), set],));
        same(&a, &b, |set| (Filter::Ids(set),));
        same(&a, &b, |set| (Filter::Pair(0, set),));
        same(&a, &b, |set| (Filter::Named { ids: set },));
        same(&a, &b, |set| (BTreeMap::from([(1u8, set)]),));
        same(&a, &b, |set| (Box::new(set),));
        same(&a, &b, |set| (std::sync::Arc::new(set),));
        same(
            &a,
            &b,
            |set| (std::borrow::Cow::<HashSet<u32>>::Owned(set),),
        );
        same(&a, &b, |set| set); // a key that is the set itself, not a tuple
        // A reference to a set (a sequence of sets holds them so too).
        assert_eq!(args_text(&(&a,)).unwrap(), args_text(&(&b,)).unwrap());
    }

    #[test]
    fn the_types_written_as_unordered_sets() {
        let set = "std::collections::hash::set::HashSet<u32>";
        for name in [
            set.to_owned(),
            format!("&{set}"),
            format!("&&mut {set}"),
            format!("alloc::boxed::Box<{set}>"),
            format!("alloc::sync::Arc<&{set}>"),
            format!("alloc::rc::Rc<alloc::boxed::Box<{set}>>"),
            format!("alloc::borrow::Cow<'_, {set}>"),
            "hashbrown::set::HashSet<alloc::string::String, foldhash::fast::RandomState>".into(),
            "im::hash::set::HashSet<u8>".into(),
            "indexmap::set::IndexSet<(u8, u8)>".into(),
            "ahash::hash_set::AHashSet<u8>".into(),
            "dashmap::set::DashSet<u8>".into(),
        ] {
            assert!(is_unordered_set(&name), "{name}");
        }
        for name in [
            format!("alloc::vec::Vec<{set}>"),
            format!("core::option::Option<{set}>"),
            format!("({set},)"),
            format!("[{set}]"),
            format!("[{set}; 2]"),
            format!("dyn my::Trait<{set}>"),
            format!("my::Box<{set}>"),
            format!("alloc::boxed::Box<alloc::vec::Vec<{set}>>"),
            "alloc::collections::btree::set::BTreeSet<u8>".into(),
            "alloc::collections::vec_deque::VecDeque<u8>".into(),
            "indexmap::map::IndexMap<u8, u8>".into(),
            "std::collections::hash::map::HashMap<u8, u8>".into(),
            "my::NotAHashSet".into(),
            "alloc::boxed::Box<str>".into(),
            "&str".into(),
            "u32".into(),
        ] {
            assert!(!is_unordered_set(&name), "{name}");
        }
    }

    #[test]
    fn sets_stay_distinct_and_sequences_keep_their_order() {
        let set = |items: &[u32]| items.iter().copied().collect::<HashSet<u32>>();
        let text = |items: &[u32]| args_text(&(set(items),)).unwrap();
        assert_ne!(text(&[1, 2]), text(&[1, 3]));
        assert_ne!(text(&[1, 2]), text(&[1, 2, 3]));
        assert_ne!(text(&[]), text(&[0]));
        // Sequences and ordered sets are written in their order, as before.
        assert_ne!(
            args_text(&(vec![1u32, 2],)).unwrap(),
            args_text(&(vec![2u32, 1],)).unwrap()
        );
        assert_eq!(args_text(&(vec![10u32, 9],)).unwrap(), "[10,9]");
        let ordered: std::collections::BTreeSet<u32> = [10, 9].into();
        assert_eq!(args_text(&(ordered,)).unwrap(), "[9,10]");
    }

    #[test]
    fn equal_floats_give_one_key() {
        assert_eq!(
            args_text(&(0.0f64,)).unwrap(),
            args_text(&(-0.0f64,)).unwrap()
        );
        assert_eq!(
            args_text(&(f64::NAN,)).unwrap(),
            args_text(&(-f64::from_bits(0x7ff8_0000_0000_0001),)).unwrap()
        );
        assert_ne!(
            args_text(&(0.1f64,)).unwrap(),
            args_text(&(0.1f32 as f64,)).unwrap()
        );
    }

    /// A generated family of keys: every shape serde has, with the texts most likely to run
    /// into each other (empty, delimiters, escapes).
    #[derive(Serialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    enum Shape {
        Unit,
        Empty(()),
        Text(String),
        Texts(Vec<String>),
        Skips {
            #[serde(skip_serializing_if = "Option::is_none")]
            a: Option<u8>,
            #[serde(skip_serializing_if = "Option::is_none")]
            b: Option<u8>,
        },
        Char(char),
        Int(i64),
        Wide(u128),
        Flag(bool),
        Float(Bits),
        Bytes(#[serde(with = "as_bytes")] Vec<u8>),
        Maybe(Option<Box<Shape>>),
        List(Vec<Shape>),
        Pair(Box<Shape>, Box<Shape>),
        Map(BTreeMap<Shape, Shape>),
        Fields {
            #[serde(skip_serializing_if = "Option::is_none")]
            a: Option<Box<Shape>>,
            #[serde(skip_serializing_if = "Option::is_none")]
            b: Option<Box<Shape>>,
        },
        Tagged(Tag),
    }

    #[derive(Serialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    enum Tag {
        A,
        B(u8),
        C(u8, u8),
        D { x: u8 },
    }

    /// A float compared as the key text writes it: `-0.0` equals `0.0`, NaNs equal each other.
    #[derive(Clone, Copy, Debug)]
    struct Bits(f64);

    impl Bits {
        fn canonical(self) -> u64 {
            if self.0.is_nan() {
                f64::NAN.to_bits()
            } else if self.0 == 0.0 {
                0
            } else {
                self.0.to_bits()
            }
        }
    }

    impl PartialEq for Bits {
        fn eq(&self, other: &Self) -> bool {
            self.canonical() == other.canonical()
        }
    }
    impl Eq for Bits {}
    impl std::hash::Hash for Bits {
        fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
            self.canonical().hash(state);
        }
    }
    impl PartialOrd for Bits {
        fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
            Some(self.cmp(other))
        }
    }
    impl Ord for Bits {
        fn cmp(&self, other: &Self) -> std::cmp::Ordering {
            self.canonical().cmp(&other.canonical())
        }
    }
    impl Serialize for Bits {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_f64(self.0)
        }
    }

    mod as_bytes {
        pub(in crate::redis) fn serialize<S: serde::Serializer>(
            v: &[u8],
            s: S,
        ) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(v)
        }
    }

    fn shape() -> impl Strategy<Value = Shape> {
        let text = || "[a,:=%\"\\[\\]{}()+~x0]{0,2}";
        let small = || proptest::option::of(0u8..2);
        let leaf = prop_oneof![
            Just(Shape::Unit),
            Just(Shape::Empty(())),
            text().prop_map(Shape::Text),
            proptest::collection::vec(prop_oneof![Just(String::new()), text()], 0..3)
                .prop_map(Shape::Texts),
            (small(), small()).prop_map(|(a, b)| Shape::Skips { a, b }),
            any::<char>().prop_map(Shape::Char),
            (-3i64..3).prop_map(Shape::Int),
            prop_oneof![Just(0u128), Just(u128::MAX)].prop_map(Shape::Wide),
            any::<bool>().prop_map(Shape::Flag),
            prop_oneof![
                Just(0.0),
                Just(-0.0),
                Just(f64::NAN),
                Just(1.0),
                Just(f64::INFINITY),
                Just(1e-300),
                Just(0.1)
            ]
            .prop_map(|f| Shape::Float(Bits(f))),
            proptest::collection::vec(0u8..3, 0..3).prop_map(Shape::Bytes),
            Just(Shape::Maybe(None)),
            prop_oneof![
                Just(Tag::A),
                Just(Tag::B(0)),
                Just(Tag::C(0, 1)),
                Just(Tag::D { x: 0 })
            ]
            .prop_map(Shape::Tagged),
        ];
        leaf.prop_recursive(3, 16, 3, |inner| {
            let boxed = || inner.clone().prop_map(Box::new);
            prop_oneof![
                boxed().prop_map(|s| Shape::Maybe(Some(s))),
                proptest::collection::vec(inner.clone(), 0..3).prop_map(Shape::List),
                (boxed(), boxed()).prop_map(|(a, b)| Shape::Pair(a, b)),
                proptest::collection::btree_map(inner.clone(), inner.clone(), 0..3)
                    .prop_map(Shape::Map),
                (proptest::option::of(boxed()), proptest::option::of(boxed()))
                    .prop_map(|(a, b)| Shape::Fields { a, b }),
            ]
        })
    }

    proptest! {
        // 64 cases of up to 64 keys each: about a second in a debug build.
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Among many generated keys, two share a text only if they are equal, and equal keys
        /// share it.
        #[test]
        fn keys_share_a_text_exactly_when_they_are_equal(
            keys in proptest::collection::vec(
                prop_oneof![
                    shape().prop_map(|s| (s, None)),
                    (shape(), shape()).prop_map(|(a, b)| (a, Some(b))),
                ],
                1..64,
            ),
        ) {
            let mut seen: std::collections::HashMap<String, (Shape, Option<Shape>)> = Default::default();
            for key in keys {
                let text = args_text(&key).unwrap();
                prop_assert_eq!(&text, &args_text(&key.clone()).unwrap());
                if let Some(other) = seen.insert(text.clone(), key.clone()) {
                    prop_assert_eq!(&other, &key, "one text {} for two keys", text);
                }
            }
        }
    }

    proptest! {
        /// Hash sets share a text exactly when they are equal, however each was built (its
        /// capacity, the order its elements came in).
        #[test]
        fn hash_sets_share_a_text_exactly_when_they_are_equal(
            a in proptest::collection::vec(any::<u8>(), 0..12),
            b in proptest::collection::vec(any::<u8>(), 0..12),
            capacity in 0usize..64,
        ) {
            let text = |set: &HashSet<u8>| args_text(&(set.clone(),)).unwrap();
            let first: HashSet<u8> = a.iter().copied().collect();
            let mut reordered = HashSet::with_capacity(capacity);
            reordered.extend(a.iter().rev().copied());
            prop_assert_eq!(text(&first), text(&reordered));
            let other: HashSet<u8> = b.iter().copied().collect();
            prop_assert_eq!(first == other, text(&first) == text(&other));
        }
    }

    proptest! {

        #[test]
        fn distinct_string_pairs_get_distinct_keys(a in ".*", b in ".*", c in ".*", d in ".*") {
            prop_assume!((&a, &b) != (&c, &d));
            prop_assert_ne!(args_text(&(a, b)).unwrap(), args_text(&(c, d)).unwrap());
        }

        #[test]
        fn distinct_mixed_tuples_get_distinct_keys(
            a in (any::<u64>(), proptest::option::of(".*"), proptest::collection::vec(".*", 0..4)),
            b in (any::<u64>(), proptest::option::of(".*"), proptest::collection::vec(".*", 0..4)),
        ) {
            prop_assume!(a != b);
            prop_assert_ne!(args_text(&a).unwrap(), args_text(&b).unwrap());
        }

        #[test]
        fn long_keys_are_bounded_and_still_distinct(a in ".{150,400}", b in ".{150,400}") {
            prop_assume!(a != b);
            let (ka, kb) = (args_text(&(a,)).unwrap(), args_text(&(b,)).unwrap());
            prop_assert!(ka.len() <= MAX_ARGS && kb.len() <= MAX_ARGS);
            prop_assert_ne!(ka, kb);
        }

        #[test]
        fn the_same_arguments_always_give_the_same_key(a in ".*", n in any::<i64>()) {
            prop_assert_eq!(args_text(&(n, a.clone())).unwrap(), args_text(&(n, a)).unwrap());
        }
    }
}

//! A cache's identity in Redis (its name, `version`, and the shapes of its key and value types)
//! and the bytes it keeps there: every value comes back exactly, bounded in depth and size;
//! a type whose shape cannot be traced gets a clear answer. Real `redis-server` per test.
//! (Two binaries sharing one cache: `examples/identity`.)

mod common;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::redis_server::RedisServer;
use common::{WAIT, another_process, eventually, until, within};
use proptest::prelude::*;
use serde::{Deserialize, Serialize};
use stampede::{Error, RedisConfig, cached};

fn install(server: &RedisServer, name: &str) {
    RedisConfig::new(&server.url())
        .unwrap()
        .prefix("test")
        .install_as(name);
}

fn identity_of(name: &str) -> stampede::Identity {
    stampede::caches()
        .into_iter()
        .find(|cache| &*cache.config.name == name)
        .and_then(|cache| cache.identity)
        .unwrap_or_else(|| panic!("no cache {name} with an identity"))
}

#[derive(Serialize, Deserialize, Debug, PartialEq, Eq, Clone)]
struct Marker;

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
enum Kinds {
    Unit,
    Newtype(Option<()>),
    Tuple(u8, Option<Option<u8>>),
    Struct {
        x: Option<Marker>,
        #[serde(skip_serializing_if = "Option::is_none", default)]
        y: Option<Option<u8>>,
    },
}

/// A generated family of values: every kind of value serde has, nested.
#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
enum Family {
    Unit(()),
    Marker(Marker),
    Opt(Option<Box<Family>>),
    Ints(i8, u16, i64, u128),
    Float(f64),
    Text(String, char),
    List(Vec<Family>),
    Map(BTreeMap<(i32, Option<bool>), Family>),
    Named {
        #[serde(skip_serializing_if = "Option::is_none", default)]
        maybe: Option<Option<()>>,
        inner: Box<Family>,
        shared: Arc<Family>,
    },
    Kinds(Kinds),
}

fn family() -> impl Strategy<Value = Family> {
    let kinds = prop_oneof![
        Just(Kinds::Unit),
        proptest::option::of(Just(())).prop_map(Kinds::Newtype),
        (
            any::<u8>(),
            proptest::option::of(proptest::option::of(any::<u8>()))
        )
            .prop_map(|(a, b)| Kinds::Tuple(a, b)),
        (
            proptest::option::of(Just(Marker)),
            proptest::option::of(proptest::option::of(any::<u8>()))
        )
            .prop_map(|(x, y)| Kinds::Struct { x, y }),
    ];
    let leaf = prop_oneof![
        Just(Family::Unit(())),
        Just(Family::Marker(Marker)),
        Just(Family::Opt(None)),
        (any::<i8>(), any::<u16>(), any::<i64>(), any::<u128>())
            .prop_map(|(a, b, c, d)| Family::Ints(a, b, c, d)),
        any::<f64>()
            .prop_filter("NaN is not equal to itself", |f| !f.is_nan())
            .prop_map(Family::Float),
        (".*", any::<char>()).prop_map(|(s, c)| Family::Text(s, c)),
        kinds.prop_map(Family::Kinds),
    ];
    leaf.prop_recursive(4, 24, 3, |inner| {
        prop_oneof![
            inner.clone().prop_map(|f| Family::Opt(Some(Box::new(f)))),
            proptest::collection::vec(inner.clone(), 0..3).prop_map(Family::List),
            proptest::collection::btree_map(
                (any::<i32>(), proptest::option::of(any::<bool>())),
                inner.clone(),
                0..3
            )
            .prop_map(Family::Map),
            (
                proptest::option::of(proptest::option::of(Just(()))),
                inner.clone(),
                inner
            )
                .prop_map(|(maybe, a, b)| Family::Named {
                    maybe,
                    inner: Box::new(a),
                    shared: Arc::new(b),
                }),
        ]
    })
}

/// What the next load of `echo` returns.
static NEXT: Mutex<Option<Family>> = Mutex::new(None);

#[cached(
    ttl = "60s",
    backend = "redis",
    redis = "round_trip",
    name = "ident::echo"
)]
async fn echo(case: u64) -> Family {
    let _ = case;
    // A second load (the value did not come back from Redis) returns what the test cannot
    // have stored, so the comparison fails with both values shown.
    NEXT.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take()
        .unwrap_or(Family::Text("loaded again".into(), '!'))
}

/// Every value stored in Redis through the public API is read back equal: the first call loads
/// and writes it, the second (the cache keeps nothing in memory) reads Redis.
#[test]
fn every_value_comes_back_from_redis_as_it_was_stored() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let server = RedisServer::start();
    install(&server, "round_trip");
    let case = AtomicUsize::new(0);
    let config = ProptestConfig {
        cases: 96,
        ..ProptestConfig::default()
    };
    proptest!(config, |(value in family())| {
        let case = case.fetch_add(1, SeqCst) as u64;
        *NEXT.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(value.clone());
        let before = stampede::stats("ident::echo").map_or(0, |s| s.remote_hits);
        prop_assert_eq!(runtime.block_on(within(echo(case))), value.clone());
        prop_assert_eq!(runtime.block_on(within(echo(case))), value);
        let stats = stampede::stats("ident::echo").unwrap();
        prop_assert_eq!(stats.identity.and_then(|i| i.problem), None, "the shape was traced");
        prop_assert_eq!(stats.remote_hits, before + 1, "the second call read Redis");
        prop_assert_eq!(stats.decode_errors, 0);
    });
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
struct Price {
    sku: u64,
    cents: u64,
}

#[cached(
    ttl = "60s",
    lock = "redis",
    redis = "visible",
    name = "ident::price",
    version = "2024-cents",
    key = "{sku}"
)]
async fn price(sku: u64, region: &str) -> Price {
    let _ = region;
    Price { sku, cents: 250 }
}

#[tokio::test]
async fn the_identity_is_listed_and_names_the_keys() {
    let server = RedisServer::start();
    install(&server, "visible");
    assert_eq!(within(price(7, "eu")).await.cents, 250);
    let identity = identity_of("ident::price");
    assert_eq!(&*identity.name, "ident::price");
    assert_eq!(identity.version.as_deref(), Some("2024-cents"));
    assert_eq!(&*identity.key_shape, "(u64)");
    assert_eq!(&*identity.value_shape, r#"struct{"cents":u64,"sku":u64}"#);
    assert_eq!(identity.fingerprint.len(), 12);
    assert_eq!(identity.problem, None);
    assert_eq!(
        stampede::stats("ident::price").unwrap().identity,
        Some(identity.clone())
    );
    let key = format!("test:{{ident::price~{}|7}}:v", identity.fingerprint);
    assert_eq!(server.key(&key), Some(key));
}

/// A type that reads whatever the input holds, as `serde_json::Value` does.
type Document = serde_json::Value;

static UNTRACED_LOADS: AtomicUsize = AtomicUsize::new(0);

#[cached(
    ttl = "60s",
    lock = "redis",
    redis = "untraced",
    name = "ident::untraced"
)]
async fn untraced(id: u64) -> Document {
    UNTRACED_LOADS.fetch_add(1, SeqCst);
    serde_json::json!({ "id": id })
}

#[cached(
    ttl = "60s",
    lock = "redis",
    redis = "untraced",
    name = "ident::versioned",
    version = "1"
)]
async fn versioned(id: u64) -> Document {
    serde_json::json!({ "id": id })
}

#[tokio::test]
async fn a_type_that_cannot_be_traced_needs_a_version_and_the_error_says_so() {
    let server = RedisServer::start();
    install(&server, "untraced");

    // No version: the calls work, locally; nothing reaches Redis; the identity, and the
    // companion's operations, say why and what to do.
    assert_eq!(within(untraced(1)).await["id"], 1);
    assert_eq!(within(untraced(1)).await["id"], 1);
    assert_eq!(UNTRACED_LOADS.load(SeqCst), 1);
    let problem = identity_of("ident::untraced").problem.expect("a problem");
    assert!(problem.contains("serde_json::value::Value"), "{problem}");
    assert!(problem.contains("version = \"...\""), "{problem}");
    assert_eq!(server.key("test:{ident::untraced~*"), None);
    match within(untraced::invalidate(1)).await {
        Err(Error::InvalidConfig { message }) => {
            assert!(message.contains("serde_json::value::Value"), "{message}")
        }
        other => panic!("expected the error, got {other:?}"),
    }

    // With a version, the version stands for the shape, and the value is shared.
    assert_eq!(within(versioned(2)).await["id"], 2);
    let identity = identity_of("ident::versioned");
    assert_eq!(identity.problem, None);
    assert!(identity.value_shape.starts_with("untraceable"));
    let key = format!("test:{{ident::versioned~{}|2}}:v", identity.fingerprint);
    assert_eq!(server.key(&key), Some(key));
    within(versioned::invalidate(2)).await.unwrap();
}

static DEEP_LOADS: AtomicUsize = AtomicUsize::new(0);

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
enum Tree {
    Leaf,
    Node(Box<Tree>),
}

#[cached(ttl = "60s", lock = "redis", redis = "hostile", name = "ident::tree")]
async fn tree(id: u64) -> Tree {
    DEEP_LOADS.fetch_add(1, SeqCst);
    let _ = id;
    Tree::Node(Box::new(Tree::Leaf))
}

#[tokio::test]
async fn a_deeply_nested_or_huge_payload_in_redis_is_a_counted_miss() {
    let server = RedisServer::start();
    install(&server, "hostile");
    within(tree(1)).await;
    let fingerprint = identity_of("ident::tree").fingerprint;
    let key = |id: u64| format!("test:{{ident::tree~{fingerprint}|{id}}}:v");
    // 100_000 nested variants in this version's form, then a payload over the size bound.
    let mut deep = b"S3 99999999999999 99999999999999 0 0 0 1 -\n\xc1\x02".to_vec();
    for _ in 0..100_000 {
        deep.extend_from_slice(b"\x11\x04Node");
    }
    deep.extend_from_slice(b"\x10\x04Leaf");
    let mut conn = server.connection();
    let _: () = redis::cmd("SET")
        .arg(key(2))
        .arg(&deep)
        .query(&mut conn)
        .unwrap();
    let mut huge = b"S3 99999999999999 99999999999999 0 0 0 1 -\n\xc1\x02".to_vec();
    huge.resize(9 << 20, 0);
    let _: () = redis::cmd("SET")
        .arg(key(3))
        .arg(&huge)
        .query(&mut conn)
        .unwrap();

    assert_eq!(within(tree(2)).await, Tree::Node(Box::new(Tree::Leaf)));
    assert_eq!(within(tree(3)).await, Tree::Node(Box::new(Tree::Leaf)));
    assert_eq!(DEEP_LOADS.load(SeqCst), 3);
    assert_eq!(stampede::stats("ident::tree").unwrap().decode_errors, 2);
}

static BIG_LOADS: AtomicUsize = AtomicUsize::new(0);

#[cached(ttl = "60s", lock = "redis", redis = "big", name = "ident::big")]
async fn big(id: u64) -> String {
    BIG_LOADS.fetch_add(1, SeqCst);
    let _ = id;
    "x".repeat(9 << 20)
}

#[tokio::test]
async fn a_value_over_the_size_bound_is_kept_in_memory_and_not_written() {
    let server = RedisServer::start();
    install(&server, "big");
    assert_eq!(within(big(1)).await.len(), 9 << 20);
    assert_eq!(within(big(1)).await.len(), 9 << 20);
    assert_eq!(BIG_LOADS.load(SeqCst), 1);
    assert_eq!(server.key("test:{ident::big~*|1}:v"), None);
}

static BOUNDED_LOADS: AtomicUsize = AtomicUsize::new(0);

#[cached(
    ttl = "60s",
    lock = "redis",
    redis = "bounded",
    name = "ident::bounded"
)]
async fn bounded(id: u64) -> String {
    BOUNDED_LOADS.fetch_add(1, SeqCst);
    "x".repeat(id as usize)
}

/// `max_value_size` bounds both ways: a value over it is served and kept in memory but not
/// written, and one over it found in Redis (another process's bound was larger) is a counted
/// miss, reloaded and overwritten.
#[tokio::test]
async fn a_configured_max_value_size_bounds_what_is_written_and_read() {
    let server = RedisServer::start();
    RedisConfig::new(&server.url())
        .unwrap()
        .prefix("test")
        .max_value_size(64 << 10)
        .install_as("bounded");
    let big = 100 << 10;
    assert_eq!(within(bounded(big)).await.len(), big as usize);
    assert_eq!(
        within(bounded(big)).await.len(),
        big as usize,
        "from memory"
    );
    assert_eq!(BOUNDED_LOADS.load(SeqCst), 1);
    assert_eq!(
        server.key(&format!("test:{{ident::bounded~*|{big}}}:v")),
        None
    );

    let small = 1 << 10;
    assert_eq!(within(bounded(small)).await.len(), small as usize);
    let key = server
        .key(&format!("test:{{ident::bounded~*|{small}}}:v"))
        .expect("a value under the bound is written");
    // The key is invalidated, then another process, with a larger bound, writes a longer value.
    let mut longer = b"S3 99999999999999 99999999999999 0 0 0 1 -\n\xc1\x02".to_vec();
    longer.resize(80 << 10, b'x');
    within(bounded::invalidate(small)).await.unwrap();
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg(&longer)
        .query(&mut server.connection())
        .unwrap();
    assert_eq!(within(bounded(small)).await.len(), small as usize);
    let stats = stampede::stats("ident::bounded").unwrap();
    assert_eq!((stats.decode_errors, stats.degraded), (1, 0), "{stats:?}");
    assert_eq!(BOUNDED_LOADS.load(SeqCst), 3);
    let stored: usize = server.command(&["STRLEN", &key]);
    assert!(stored < 2 << 10, "overwritten by the load: {stored} bytes");
}

static WINDOWED_LOADS: AtomicUsize = AtomicUsize::new(0);

#[cached(
    ttl = "60s",
    backend = "redis",
    redis = "windowed",
    name = "ident::windowed"
)]
async fn windowed(len: u64) -> String {
    WINDOWED_LOADS.fetch_add(1, SeqCst);
    "y".repeat(len as usize)
}

/// A hit reads its value whole, whatever its size under the bound: one that fits the first
/// read (the first 16 KiB, with its header) and one that does not, which is read again, and
/// those at the edge between them.
#[tokio::test]
async fn values_of_every_size_under_the_bound_come_back_whole_from_redis() {
    let server = RedisServer::start();
    RedisConfig::new(&server.url())
        .unwrap()
        .prefix("test")
        .install_as("windowed");
    let edge = (16 << 10) - 100..(16 << 10) + 10;
    let lens: Vec<u64> = [0, 1, 100, 40 << 10, 1 << 20]
        .into_iter()
        .chain(edge)
        .collect();
    for &len in &lens {
        assert_eq!(within(windowed(len)).await.len(), len as usize, "loaded");
        let hit = within(windowed(len)).await;
        assert!(
            hit.len() == len as usize && hit.bytes().all(|b| b == b'y'),
            "{len} bytes"
        );
    }
    let stats = stampede::stats("ident::windowed").unwrap();
    assert_eq!(WINDOWED_LOADS.load(SeqCst), lens.len(), "{stats:?}");
    assert_eq!(stats.remote_hits, lens.len() as u64, "{stats:?}");
    assert_eq!((stats.decode_errors, stats.degraded), (0, 0), "{stats:?}");
}

/// The messages of the events logged, and their level.
#[derive(Clone, Default)]
struct Logged(Arc<Mutex<Vec<(tracing::Level, String)>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Logged {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Message<'a>(&'a mut String);
        impl tracing::field::Visit for Message<'_> {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                use std::fmt::Write as _;
                let _ = write!(self.0, " {}={value:?}", field.name());
            }
        }
        let mut text = String::new();
        event.record(&mut Message(&mut text));
        let level = *event.metadata().level();
        self.0.lock().unwrap().push((level, text));
    }
}

/// The events `calls` log, at every level: run on a runtime of their own, with a real
/// `redis-server` installed as the connection `connection`.
fn logged_by<F: std::future::Future<Output = ()>>(
    connection: &str,
    calls: impl FnOnce() -> F,
) -> Vec<(tracing::Level, String)> {
    use tracing_subscriber::layer::SubscriberExt as _;
    let logged_events = Logged::default();
    let subscriber = tracing_subscriber::registry().with(logged_events.clone());
    let server = RedisServer::start();
    install(&server, connection);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tracing::subscriber::with_default(subscriber, || runtime.block_on(calls()));
    logged_events.0.lock().unwrap().clone()
}

#[cached(ttl = "60s", lock = "redis", redis = "logged", name = "ident::logged")]
async fn logged(id: u64) -> Price {
    Price { sku: id, cents: 1 }
}

#[cached(
    ttl = "60s",
    lock = "redis",
    redis = "logged",
    name = "ident::logged_untraced"
)]
async fn logged_untraced(id: u64) -> Document {
    serde_json::json!(id)
}

/// When a cache is built, its identity is logged at debug level; a shape that cannot be traced,
/// at error level, naming the type and the fix.
#[test]
fn the_identity_is_logged_when_the_cache_is_built() {
    let events = logged_by("logged", || async {
        within(logged(1)).await;
        within(logged_untraced(1)).await;
    });
    let identity = identity_of("ident::logged");
    assert!(
        events
            .iter()
            .any(|(level, text)| *level == tracing::Level::DEBUG
                && text.contains(&format!("ident::logged~{}", identity.fingerprint))
                && text.contains(r#"value_shape=struct{"cents":u64,"sku":u64}"#)),
        "{events:#?}"
    );
    assert!(
        events
            .iter()
            .any(|(level, text)| *level == tracing::Level::ERROR
                && text.contains("serde_json::value::Value")
                && text.contains("version = \"...\"")),
        "{events:#?}"
    );
}

static KEPT_LOADS: Mutex<Vec<u64>> = Mutex::new(Vec::new());

#[cached(
    ttl = "60s",
    backend = "tiered",
    redis = "oversized_kept",
    name = "ident::oversized_kept"
)]
async fn sized(len: u64) -> String {
    KEPT_LOADS.lock().unwrap().push(len);
    "z".repeat(len as usize)
}

/// A value over `max_value_size` that a load returns is not a Redis failure: it is kept in
/// this process's memory for its ttl, and the next miss of another key (whose Redis calls would
/// clean up after a failure) does not take it from memory.
#[tokio::test]
async fn an_oversized_value_stays_in_memory_when_another_key_misses() {
    let server = RedisServer::start();
    RedisConfig::new(&server.url())
        .unwrap()
        .prefix("test")
        .max_value_size(1 << 10)
        .install_as("oversized_kept");
    stampede::require_redis(Some("oversized_kept"))
        .await
        .unwrap();
    let big = 4 << 10;
    assert_eq!(within(sized(big)).await.len(), big as usize);
    assert_eq!(within(sized(10)).await.len(), 10, "another key misses");
    // Time for an announcement to this process to arrive, were one made.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(within(sized(big)).await.len(), big as usize);
    assert_eq!(within(sized(10)).await.len(), 10);
    assert_eq!(*KEPT_LOADS.lock().unwrap(), [big, 10], "both from memory");
    let stats = stampede::stats("ident::oversized_kept").unwrap();
    assert_eq!(stats.degraded, 0, "Redis never failed: {stats:?}");
}

/// A key holding a set: equal whatever order its ids iterate in (the set's `Eq`, and a `Hash`
/// written to ignore the order), with a derived `Serialize`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
struct Members {
    team: u32,
    ids: HashSet<u32>,
}

impl std::hash::Hash for Members {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.team.hash(state);
        let mut ids: Vec<u32> = self.ids.iter().copied().collect();
        ids.sort_unstable();
        ids.hash(state);
    }
}

static MEMBER_LOADS: AtomicUsize = AtomicUsize::new(0);

#[cached(ttl = "60s", lock = "redis", redis = "sets", name = "ident::members")]
async fn members(key: Members) -> String {
    MEMBER_LOADS.fetch_add(1, SeqCst);
    format!("team {} of {}", key.team, key.ids.len())
}

/// Another process of the service.
#[cached(ttl = "60s", lock = "redis", redis = "sets", name = "ident::members")]
async fn members_elsewhere(key: Members) -> String {
    MEMBER_LOADS.fetch_add(1, SeqCst);
    format!("team {} of {} loaded elsewhere", key.team, key.ids.len())
}

/// Two equal keys whose sets iterate in different orders: one built in ascending order, the
/// other with another capacity (the first tried that makes the orders differ), in descending
/// order.
fn equal_members_iterating_apart() -> (Members, Members) {
    let ids = [3u32, 14, 15, 92, 65, 35, 89, 79];
    let a = Members {
        team: 7,
        ids: ids.iter().copied().collect(),
    };
    for capacity in 0..256 {
        let mut set = HashSet::with_capacity(capacity);
        set.extend(ids.iter().rev().copied());
        let b = Members { team: 7, ids: set };
        if !a.ids.iter().eq(b.ids.iter()) {
            assert_eq!(a, b);
            return (a, b);
        }
    }
    panic!("no capacity gave an equal set that iterates in another order")
}

/// A key holding a hash set is one Redis key whatever order the set iterates in: another
/// process reads the value filled for an equal set, and an invalidation with an equal set drops
/// it from Redis (the next call loads again).
#[tokio::test]
async fn a_key_holding_a_set_is_one_redis_key_whatever_order_the_set_iterates_in() {
    let server = RedisServer::start();
    install(&server, "sets");
    let (a, b) = equal_members_iterating_apart();
    let order = |key: &Members| key.ids.iter().copied().collect::<Vec<_>>();
    assert_ne!(
        order(&a),
        order(&b),
        "the two sets iterate in different orders"
    );

    assert_eq!(within(members(a.clone())).await, "team 7 of 8");
    assert_eq!(MEMBER_LOADS.load(SeqCst), 1);
    within(members::invalidate(b.clone())).await.unwrap();
    let keys: Vec<String> = server.command(&["KEYS", "test:{ident::members~*:v"]);
    assert!(
        keys.is_empty(),
        "the invalidation dropped the value: {keys:?}"
    );
    assert_eq!(within(members(a.clone())).await, "team 7 of 8");
    assert_eq!(
        MEMBER_LOADS.load(SeqCst),
        2,
        "loaded again after the invalidation"
    );

    assert_eq!(
        within(members_elsewhere(b.clone())).await,
        "team 7 of 8",
        "another process reads the value filled for the equal set"
    );
    assert_eq!(MEMBER_LOADS.load(SeqCst), 2);
    let keys: Vec<String> = server.command(&["KEYS", "test:{ident::members~*:v"]);
    assert_eq!(keys.len(), 1, "one value key: {keys:?}");
}

static PACKED_LOADS: AtomicUsize = AtomicUsize::new(0);
static PLAIN_LOADS: AtomicUsize = AtomicUsize::new(0);

/// A catalog page of about `rows` * 60 bytes: repeated text, as JSON-like rows are.
fn page(rows: u64) -> String {
    (0..rows)
        .map(|row| format!("{{\"id\":{row},\"name\":\"Kettle\",\"stock\":\"in stock\"}}"))
        .collect()
}

// One cache, `ident::page`, as two binaries declare it: one writes large values compressed,
// the other as they are (a deploy that turns `compress` on, half done).
#[cached(
    ttl = "60s",
    backend = "redis",
    redis = "packed",
    name = "ident::page",
    compress = 1024
)]
async fn page_packed(rows: u64) -> String {
    PACKED_LOADS.fetch_add(1, SeqCst);
    page(rows)
}

#[cached(ttl = "60s", backend = "redis", redis = "plain", name = "ident::page")]
async fn page_plain(rows: u64) -> String {
    PLAIN_LOADS.fetch_add(1, SeqCst);
    page(rows)
}

/// The payload of the value Redis holds for `ident::page`'s key `rows`.
fn stored_payload(server: &RedisServer, rows: u64) -> Vec<u8> {
    let key = server
        .key(&format!("test:{{ident::page~*|{rows}}}:v"))
        .expect("the value is in Redis");
    let bytes: Vec<u8> = server.command(&["GET", &key]);
    let newline = bytes.iter().position(|&b| b == b'\n').unwrap();
    bytes[newline + 1..].to_vec()
}

/// `compress = N` writes a payload over N bytes compressed, and a smaller one as it is; a
/// binary of the same cache without the option reads the compressed values, and the one with
/// it reads the plain ones: the option is not part of the identity.
#[tokio::test]
async fn a_large_value_goes_to_redis_compressed_and_every_binary_of_the_cache_reads_it() {
    let server = RedisServer::start();
    install(&server, "packed");
    install(&server, "plain");

    // 2,000 rows, about 100 KiB: compressed, and read back by the binary without the option.
    let rows = 2_000;
    assert_eq!(within(page_packed(rows)).await, page(rows));
    let packed = stored_payload(&server, rows);
    assert_eq!(&packed[..2], b"\xc1\x03", "the compressed form");
    let plain_size = page(rows).len();
    assert!(
        packed.len() * 4 < plain_size,
        "{} bytes stored for a {plain_size}-byte value",
        packed.len()
    );
    assert_eq!(within(page_plain(rows)).await, page(rows));

    // Written plain by the binary without the option, read by the one with it.
    let other = 1_999;
    assert_eq!(within(page_plain(other)).await, page(other));
    assert_eq!(&stored_payload(&server, other)[..2], b"\xc1\x02");
    assert_eq!(within(page_packed(other)).await, page(other));

    // Under the threshold, written as it is.
    assert_eq!(within(page_packed(3)).await, page(3));
    assert_eq!(&stored_payload(&server, 3)[..2], b"\xc1\x02", "as it is");

    assert_eq!(
        (PACKED_LOADS.load(SeqCst), PLAIN_LOADS.load(SeqCst)),
        (2, 1),
        "each key loaded once"
    );
    let fingerprints: Vec<Arc<str>> = stampede::caches()
        .into_iter()
        .filter(|cache| &*cache.config.name == "ident::page")
        .filter_map(|cache| cache.identity.map(|identity| identity.fingerprint))
        .collect();
    assert_eq!(fingerprints.len(), 2, "both binaries' caches");
    assert_eq!(fingerprints[0], fingerprints[1], "one identity");
    assert_eq!(stampede::stats("ident::page").unwrap().decode_errors, 0);
}

static GUARDED_LOADS: AtomicUsize = AtomicUsize::new(0);

#[cached(
    ttl = "60s",
    backend = "redis",
    redis = "guarded",
    name = "ident::guarded",
    compress = 1024
)]
async fn page_guarded(rows: u64) -> String {
    GUARDED_LOADS.fetch_add(1, SeqCst);
    page(rows)
}

/// A compressed payload that lies (a stated length past the bound, a block cut short) is a
/// counted miss, never a crash or an allocation of the stated size.
#[tokio::test]
async fn a_corrupt_compressed_payload_in_redis_is_a_counted_miss() {
    let server = RedisServer::start();
    install(&server, "guarded");
    let rows = 4_000;
    assert_eq!(within(page_guarded(rows)).await, page(rows));
    let key = server
        .key(&format!("test:{{ident::guarded~*|{rows}}}:v"))
        .expect("the value is in Redis");
    let stored: Vec<u8> = server.command(&["GET", &key]);
    let header = b"S3 99999999999999 99999999999999 0 0 0 1 -\n".to_vec();
    let huge = [&header[..], b"\xc1\x03\xff\xff\xff\x7f\x40abcd"].concat();
    let cut = stored[..stored.len() / 2].to_vec();
    for corrupt in [huge, cut] {
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(&corrupt)
            .query(&mut server.connection())
            .unwrap();
        assert_eq!(within(page_guarded(rows)).await, page(rows));
    }
    assert_eq!(GUARDED_LOADS.load(SeqCst), 3, "each a miss, loaded");
    let stats = stampede::stats("ident::guarded").unwrap();
    assert_eq!(stats.decode_errors, 2, "{stats:?}");
}

/// The row a rolling deploy's two shapes read: v2's `Product` gained a field.
static DEPLOY_ROW: AtomicUsize = AtomicUsize::new(0);

#[derive(Serialize, Deserialize, Debug, PartialEq, Eq, Clone)]
struct ProductV1 {
    id: u64,
    row: usize,
}

#[derive(Serialize, Deserialize, Debug, PartialEq, Eq, Clone)]
struct ProductV2 {
    id: u64,
    row: usize,
    color: String,
}

/// The v1 binary's declaration (an admin tool, or the instances not yet deployed).
#[cached(ttl = "60s", lock = "redis", redis = "deploy", name = "ident::deploy")]
async fn product_v1(id: u64) -> ProductV1 {
    let row = DEPLOY_ROW.load(SeqCst);
    ProductV1 { id, row }
}

/// The v2 binary's declaration of the same cache: another shape, so other Redis keys.
#[cached(ttl = "60s", lock = "redis", redis = "deploy", name = "ident::deploy")]
async fn product_v2(id: u64) -> ProductV2 {
    let row = DEPLOY_ROW.load(SeqCst);
    ProductV2 {
        id,
        row,
        color: "red".into(),
    }
}

/// During a rolling deploy that changes a value's shape, v1's typed invalidation and its prime
/// reach v2's value in Redis too (not only its memory): a process of either shape that reads
/// Redis afterwards gets the new row. Each shape keeps its own keys, and a process registers its shape
/// under the name before its loads write there.
#[tokio::test]
async fn an_invalidation_or_a_prime_reaches_every_shape_of_the_name() {
    let server = RedisServer::start();
    install(&server, "deploy");
    stampede::require_redis(Some("deploy")).await.unwrap();
    assert_eq!(within(product_v1(7)).await.row, 0);
    assert_eq!(within(product_v2(7)).await.row, 0);
    let keys: Vec<String> = server.command(&["KEYS", "test:{ident::deploy~*:v"]);
    assert_eq!(keys.len(), 2, "one value key per shape: {keys:?}");

    DEPLOY_ROW.store(1, SeqCst);
    within(product_v1::invalidate(7)).await.unwrap();
    // The announcement drops v2's memory of the key (by name); v2 then reads Redis.
    eventually("v2 forgets the key", || product_v2::peek(7).is_none()).await;
    assert_eq!(
        within(product_v2(7)).await.row,
        1,
        "v2 loads the new row, not its old copy in Redis"
    );

    DEPLOY_ROW.store(2, SeqCst);
    within(product_v1::prime(7, ProductV1 { id: 7, row: 2 }))
        .await
        .unwrap();
    // A prime leaves other processes' memory alone (the guide: "Other processes keep a copy
    // they already hold until it expires"); what v2 reads from Redis is no longer the old row.
    assert_eq!(
        within(product_v2::read_through(7)).await.row,
        2,
        "v2 reads past its memory after v1's prime"
    );
    assert_eq!(within(product_v1(7)).await.row, 2);
}

#[cached(
    ttl = "60s",
    lock = "redis",
    redis = "misprefixed",
    name = "ident::misprefixed"
)]
async fn misprefixed(id: u64) -> u64 {
    id
}

/// An invalidation under a prefix (or database) no process of the cache's name serves through
/// is said at warning level, naming the prefix: it reached no value in Redis. Once a process
/// served the cache there, it is not.
#[test]
fn an_invalidation_that_reaches_no_process_of_the_name_says_so() {
    use tracing_subscriber::layer::SubscriberExt as _;
    let logged_events = Logged::default();
    let subscriber = tracing_subscriber::registry().with(logged_events.clone());
    let server = RedisServer::start();
    RedisConfig::new(&server.url())
        .unwrap()
        .prefix("nobody")
        .install_as("misprefixed");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let warned = || {
        let events = logged_events.0.lock().unwrap();
        events
            .iter()
            .filter(|(level, text)| {
                *level == tracing::Level::WARN
                    && text.contains("no process has served cache `ident::misprefixed`")
                    && text.contains("prefix `nobody`")
            })
            .count()
    };
    tracing::subscriber::with_default(subscriber, || {
        runtime.block_on(async {
            within(misprefixed::invalidate(1)).await.unwrap();
            assert_eq!(warned(), 1, "{:#?}", logged_events.0.lock().unwrap());
            within(misprefixed(1)).await;
            within(misprefixed::invalidate(1)).await.unwrap();
            assert_eq!(warned(), 1, "served since: no new warning");
        })
    });
}

/// A row type of a generic store: two of them with the same serde shape.
trait Shelved: Serialize + serde::de::DeserializeOwned + Clone + std::fmt::Debug {
    fn of(id: u64) -> Self;
}

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
struct Euros(u64);

impl Shelved for Euros {
    fn of(id: u64) -> Self {
        Euros(id * 100)
    }
}

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
struct Cents(u64);

impl Shelved for Cents {
    fn of(id: u64) -> Self {
        Cents(id)
    }
}

struct Shelf<T>(std::marker::PhantomData<T>);

static SHELF_LOADS: AtomicUsize = AtomicUsize::new(0);

impl<T: Shelved + Send + Sync + 'static> Shelf<T> {
    /// Without a receiver: one cache per instantiation, all asked for by one name.
    #[cached(
        ttl = "60s",
        lock = "redis",
        backend = "redis",
        redis = "shelves",
        name = "ident::shelf",
        companion = false
    )]
    async fn item(id: u64) -> T {
        SHELF_LOADS.fetch_add(1, SeqCst);
        T::of(id)
    }
}

#[tokio::test]
async fn instantiations_of_one_name_keep_apart_in_redis_and_are_invalidated_by_it() {
    let server = RedisServer::start();
    install(&server, "shelves");
    // Every call reads Redis (`backend = "redis"`): a shared key would hand one type's value
    // to the other, as both have one shape.
    assert_eq!(within(Shelf::<Euros>::item(1)).await, Euros(100));
    assert_eq!(within(Shelf::<Cents>::item(1)).await, Cents(1));
    assert_eq!(within(Shelf::<Euros>::item(1)).await, Euros(100));
    assert_eq!(within(Shelf::<Cents>::item(1)).await, Cents(1));
    assert_eq!(
        SHELF_LOADS.load(SeqCst),
        2,
        "one load each, then Redis hits"
    );

    let identities: HashSet<_> = stampede::caches()
        .into_iter()
        .filter(|cache| cache.config.name.starts_with("ident::shelf"))
        .filter_map(|cache| cache.identity)
        .map(|identity| format!("{}~{}", identity.name, identity.fingerprint))
        .collect();
    assert_eq!(
        identities.len(),
        2,
        "two caches, two identities: {identities:?}"
    );
    let values = || server.command::<Vec<String>>(&["KEYS", "test:{ident::shelf*|1}:v"]);
    assert_eq!(
        values().len(),
        2,
        "each keeps its own Redis key: {:?}",
        values()
    );

    within(stampede::invalidate("ident::shelf", (1u64,)))
        .await
        .unwrap();
    assert_eq!(values(), Vec::<String>::new(), "the name reached both");
    assert_eq!(within(Shelf::<Cents>::item(1)).await, Cents(1));
    assert_eq!(within(Shelf::<Euros>::item(1)).await, Euros(100));
    assert_eq!(SHELF_LOADS.load(SeqCst), 4, "both loaded again");
}

/// A repository generic over its row type, whose method's cache is given one name.
#[derive(Clone)]
struct Ledger<T>(std::marker::PhantomData<T>);

static LEDGER_LOADS: AtomicUsize = AtomicUsize::new(0);

impl<T: Shelved + Send + Sync + 'static> Ledger<T> {
    #[cached(
        ttl = "60s",
        lock = "redis",
        backend = "redis",
        redis = "ledgers",
        name = "ident::ledger"
    )]
    async fn entry(&self, id: u64) -> T {
        LEDGER_LOADS.fetch_add(1, SeqCst);
        T::of(id)
    }
}

#[tokio::test]
async fn a_written_name_on_a_generic_impls_method_keeps_its_instantiations_apart_in_redis() {
    let server = RedisServer::start();
    install(&server, "ledgers");
    let (euros, cents) = (
        Ledger::<Euros>(std::marker::PhantomData),
        Ledger::<Cents>(std::marker::PhantomData),
    );
    assert_eq!(within(euros.entry(2)).await, Euros(200));
    assert_eq!(within(cents.entry(2)).await, Cents(2), "not Euros' value");
    assert_eq!(within(euros.entry(2)).await, Euros(200));
    assert_eq!(LEDGER_LOADS.load(SeqCst), 2);
    let values = || server.command::<Vec<String>>(&["KEYS", "test:{ident::ledger*|2}:v"]);
    assert_eq!(values().len(), 2, "{:?}", values());
    within(stampede::invalidate("ident::ledger", (2u64,)))
        .await
        .unwrap();
    assert_eq!(values(), Vec::<String>::new(), "the name reached both");
}

/// A repository generic over its row type, of which this process builds one instantiation and
/// another process (`bin_writer`) the other.
struct Bin<T>(std::marker::PhantomData<T>);

static BIN_LOADS: AtomicUsize = AtomicUsize::new(0);

impl<T: Shelved + Send + Sync + 'static> Bin<T> {
    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "bins",
        name = "ident::bin",
        companion = false
    )]
    async fn item(id: u64) -> T {
        BIN_LOADS.fetch_add(1, SeqCst);
        T::of(id)
    }
}

const BIN_WRITER: &str = "STAMPEDE_TEST_BIN_WRITER";

/// The other process's part (a plain pass in the normal run): builds `Bin<Euros>`'s cache only,
/// then invalidates key 3 by the written name, or expires it, or clears the name, as told.
#[test]
fn bin_writer() {
    let Ok(part) = std::env::var(BIN_WRITER) else {
        return;
    };
    let (url, how) = part.split_once(' ').expect("a URL and an operation");
    RedisConfig::new(url)
        .unwrap()
        .prefix("test")
        .install_as("bins");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        assert_eq!(within(Bin::<Euros>::item(3)).await, Euros(300));
        let done = match how {
            "invalidate" => within(stampede::invalidate("ident::bin", (3u64,))).await,
            "expire" => within(stampede::expire("ident::bin", (3u64,))).await,
            _ => within(stampede::clear("ident::bin")).await,
        };
        done.expect("the invalidation by the written name");
    });
    println!("bin writer: done");
}

/// An invalidation (expiry, clear) by a written name from a process that built one
/// instantiation reaches the instantiations only another process built, in its memory and in
/// Redis.
async fn reaches_another_process(how: &str, server: &RedisServer) {
    let loads = BIN_LOADS.load(SeqCst);
    assert_eq!(within(Bin::<Cents>::item(3)).await, Cents(3));
    assert_eq!(
        within(Bin::<Cents>::item(3)).await,
        Cents(3),
        "a memory hit"
    );
    assert_eq!(BIN_LOADS.load(SeqCst), loads + 1);
    let value = || server.command::<Vec<String>>(&["KEYS", "test:{ident::bin<*Cents>~*|3}:v"]);
    assert_eq!(value().len(), 1, "this process's value in Redis");

    let output =
        another_process("bin_writer", BIN_WRITER, &format!("{} {how}", server.url())).await;
    assert!(output.contains("bin writer: done"), "{output}");
    if how != "expire" {
        assert_eq!(value(), Vec::<String>::new(), "dropped from Redis by {how}");
    }
    // The announcement drops (or expires) this process's copy: the next call loads.
    until(
        "the other process's invalidation to reach this one",
        WAIT,
        || async {
            assert_eq!(Bin::<Cents>::item(3).await, Cents(3));
            (BIN_LOADS.load(SeqCst) > loads + 1).then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn a_written_names_invalidation_reaches_what_only_another_process_built() {
    let server = RedisServer::start();
    install(&server, "bins");
    reaches_another_process("invalidate", &server).await;
    within(stampede::invalidate("ident::bin", (3u64,)))
        .await
        .unwrap();
    reaches_another_process("expire", &server).await;
    within(stampede::invalidate("ident::bin", (3u64,)))
        .await
        .unwrap();
    reaches_another_process("clear", &server).await;
}

#[cached(ttl = "60s", lock = "redis", redis = "copied", name = "ident::copied")]
async fn copied_price(id: u64) -> u64 {
    id
}

/// The same name and value shape as `copied_price`: a copied `name`.
#[cached(ttl = "60s", lock = "redis", redis = "copied", name = "ident::copied")]
async fn copied_stock(id: u64) -> u64 {
    id + 1
}

#[test]
fn two_functions_of_one_name_in_a_process_are_reported() {
    let events = logged_by("copied", || async {
        within(copied_price(1)).await;
        within(copied_stock(1)).await;
    });
    assert!(
        events
            .iter()
            .any(|(level, text)| *level == tracing::Level::ERROR
                && text.contains("ident::copied")
                && text.contains("Give each its own `name`")),
        "{events:#?}"
    );
}

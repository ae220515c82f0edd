//! Credentials and ACL users against a real `redis-server` (and a small real cluster): a
//! password in the URL, an ACL user restricted to the cache's keys and channels, and what a
//! wrong password or a refused command does: a clear error from `require_redis`, one
//! error-level log and a counter, while the caches go on serving from this process.
//!
//! Every test has its own server (the cluster test its own cluster) and its own connection name.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use common::redis_server::{Options, RedisServer};
use common::{eventually, telemetry, within};
use stampede::{RedisConfig, cached};
use stampede_test_support::redis_cluster::{self, Cluster};

/// What the Redis tier runs, and nothing else (no `INFO`, no `CLUSTER INFO`): the command list of
/// an ACL user for stampede, as the README gives it. `HELLO` and `AUTH` need no permission; the
/// client's `CLIENT SETINFO` (Redis 7.2 and later) may be refused, it is ignored.
const TIER_COMMANDS: &str = "-@all +ping +evalsha +script|load +get +getrange +strlen +set +del \
     +exists +incr +pexpire +pttl +sadd +srem +smembers +sunionstore +zadd +zscore +zrangebyscore \
     +zremrangebyscore +xadd +xlen +xrange +xrevrange +time +publish +spublish \
     +subscribe +unsubscribe +ssubscribe +sunsubscribe +cluster|slots";

/// `ACL SETUSER name on >password keys channels TIER_COMMANDS`, as arguments.
fn acl_user<'a>(name: &'a str, password: &'a str, keys: &'a str, channels: &'a str) -> Vec<String> {
    let mut args: Vec<String> = ["ACL", "SETUSER", name, "on"].map(str::to_owned).to_vec();
    args.push(format!(">{password}"));
    args.push(keys.to_owned());
    args.push(channels.to_owned());
    args.extend(TIER_COMMANDS.split_whitespace().map(str::to_owned));
    args
}

fn set_user(server: &RedisServer, args: &[String]) {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let _: String = server.command(&args);
}

/// Short settings, so that a test does not wait out the defaults' cool-downs.
fn config(url: &str) -> RedisConfig {
    RedisConfig::new(url)
        .unwrap()
        .connect_timeout(Duration::from_secs(2))
        .op_timeout(Duration::from_secs(1))
}

#[tokio::test]
async fn a_password_in_the_url_authenticates_the_default_user() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "acl_password",
        name = "acl::password"
    )]
    async fn in_a(id: u64) -> String {
        LOADS.fetch_add(1, SeqCst);
        format!("order {id}")
    }
    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "acl_password",
        name = "acl::password"
    )]
    async fn in_b(id: u64) -> String {
        LOADS.fetch_add(1, SeqCst);
        format!("order {id} loaded by b")
    }

    let server = RedisServer::start_with(Options::default().password("s3cret"));
    config(&server.url_as("", "s3cret")).install_as("acl_password");
    within(stampede::require_redis(Some("acl_password")))
        .await
        .expect("the password is right");
    assert_eq!(within(in_a(1)).await, "order 1");
    assert_eq!(
        within(in_b(1)).await,
        "order 1",
        "b read a's value from Redis"
    );
    assert_eq!(LOADS.load(SeqCst), 1);
    assert!(server.key("stampede:{acl::password~*|1}:v").is_some());
    assert_eq!(stampede::stats("acl::password").unwrap().degraded, 0);
}

#[tokio::test]
async fn a_wrong_or_missing_password_is_a_clear_error_logged_once_and_counted() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "acl_wrong_password",
        name = "acl::wrong"
    )]
    async fn guarded(id: u64) -> String {
        LOADS.fetch_add(1, SeqCst);
        format!("item {id}")
    }

    telemetry::install();
    let server = RedisServer::start_with(Options::default().password("s3cret"));
    config(&server.url_as("", "not-it"))
        .cooldown(Duration::ZERO, 1)
        .install_as("acl_wrong_password");
    let error = within(stampede::require_redis(Some("acl_wrong_password")))
        .await
        .expect_err("a wrong password must not pass the start-up check");
    assert!(
        matches!(error, stampede::Error::InvalidConfig { .. }),
        "a wrong password is a configuration error, not an outage: {error:?}"
    );
    let message = error.to_string();
    assert!(
        message.contains("acl_wrong_password")
            && message.contains("refused")
            && message.contains("password"),
        "{message}"
    );
    assert!(
        !message.contains("not-it"),
        "the password is not shown: {message}"
    );

    // The caches go on serving from this process, loudly: one error, and a counter per refusal.
    for id in 0..5 {
        assert_eq!(within(guarded(id)).await, format!("item {id}"));
    }
    assert_eq!(LOADS.load(SeqCst), 5);
    assert!(stampede::stats("acl::wrong").unwrap().degraded >= 1);
    let errors = telemetry::errors_of("acl_wrong_password");
    assert_eq!(errors.len(), 1, "logged once at error level: {errors:?}");
    assert_eq!(
        errors[0].get("reason").map(String::as_str),
        Some("credentials")
    );
    let refusals = telemetry::counter(
        "redis_auth_failures_total",
        &[("redis", "acl_wrong_password"), ("reason", "credentials")],
    );
    assert!(
        refusals >= 2,
        "every refused attempt is counted: {refusals}"
    );

    // No password at all where one is required (NOAUTH): the same clear error.
    config(&server.url()).install_as("acl_no_password");
    let error = within(stampede::require_redis(Some("acl_no_password")))
        .await
        .expect_err("a server that requires a password refuses a client without one");
    assert!(
        matches!(error, stampede::Error::InvalidConfig { .. })
            && error.to_string().contains("password"),
        "{error:?}"
    );
}

#[tokio::test]
async fn an_acl_user_restricted_to_the_cache_prefix_and_channels_runs_the_whole_tier() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);
    static RELEASE: tokio::sync::Notify = tokio::sync::Notify::const_new();

    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "acl_restricted",
        name = "acl::restricted"
    )]
    async fn in_a(id: u64) -> String {
        let n = LOADS.fetch_add(1, SeqCst) + 1;
        if id == 7 {
            RELEASE.notified().await;
        }
        format!("price {id} v{n}")
    }
    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "acl_restricted",
        name = "acl::restricted"
    )]
    async fn in_b(id: u64) -> String {
        let n = LOADS.fetch_add(1, SeqCst) + 1;
        format!("price {id} v{n} loaded by b")
    }

    let server = RedisServer::start();
    set_user(
        &server,
        &acl_user("cache", "pw", "~stampede:*", "&stampede:*"),
    );
    // Waiters are woken by the holder's publication: never by a lease or a lock wait running
    // out, which would take an hour.
    config(&server.url_as("cache", "pw"))
        .lease(Duration::from_secs(3600))
        .lock_wait(Duration::from_secs(3600))
        .install_as("acl_restricted");
    within(stampede::require_redis(Some("acl_restricted")))
        .await
        .expect("the user may run what the tier runs");

    // The lock and a wake-up: b waits for a's load, which a holds until b is waiting.
    let a = tokio::spawn(in_a(7));
    eventually("a to hold the key's lock", || {
        stampede::stats("acl::restricted").is_some_and(|s| s.lock_acquired == 1)
    })
    .await;
    let b = tokio::spawn(in_b(7));
    eventually("b to find the lock busy", || {
        stampede::stats("acl::restricted").is_some_and(|s| s.lock_busy == 1)
    })
    .await;
    RELEASE.notify_one();
    assert_eq!(within(a).await.unwrap(), "price 7 v1");
    assert_eq!(
        within(b).await.unwrap(),
        "price 7 v1",
        "woken with a's value"
    );
    assert_eq!(LOADS.load(SeqCst), 1);

    // An invalidation: gone from Redis and from both memories.
    within(stampede::invalidate("acl::restricted", (7u64,)))
        .await
        .unwrap();
    assert_eq!(server.key("stampede:{acl::restricted~*|7}:v"), None);
    assert_eq!(within(in_b(7)).await, "price 7 v2 loaded by b");
    assert_eq!(within(in_a(7)).await, "price 7 v2 loaded by b");
    assert_eq!(stampede::stats("acl::restricted").unwrap().degraded, 0);

    // A clear needs `SCAN`, which the request path does not: refused, an error that says so;
    // with `+scan`, done.
    let refused = within(stampede::clear("acl::restricted"))
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("scan"), "{refused}");
    let _: String = server.command(&["ACL", "SETUSER", "cache", "+scan"]);
    within(stampede::clear("acl::restricted")).await.unwrap();
    assert_eq!(server.key("stampede:{acl::restricted~*|7}:v"), None);
    assert_eq!(within(in_b(7)).await, "price 7 v3 loaded by b");
}

#[tokio::test]
async fn keys_the_acl_refuses_are_a_clear_error_logged_once_and_counted() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", lock = "redis", redis = "acl_keys", name = "acl::keys")]
    async fn guarded(id: u64) -> String {
        LOADS.fetch_add(1, SeqCst);
        format!("stock {id}")
    }

    telemetry::install();
    let server = RedisServer::start();
    // The user may only touch another application's keys: the cache's prefix is `stampede`.
    set_user(&server, &acl_user("other", "pw", "~other:*", "&stampede:*"));
    config(&server.url_as("other", "pw"))
        .cooldown(Duration::ZERO, 1)
        .install_as("acl_keys");
    let error = within(stampede::require_redis(Some("acl_keys")))
        .await
        .expect_err("a user who may not touch the cache's keys fails the start-up check");
    assert!(
        matches!(error, stampede::Error::InvalidConfig { .. }),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(
        message.contains("NOPERM") && message.contains("stampede:*"),
        "says what was refused and what to allow: {message}"
    );

    for id in 0..3 {
        assert_eq!(within(guarded(id)).await, format!("stock {id}"));
    }
    assert!(stampede::stats("acl::keys").unwrap().degraded >= 1);
    let errors = telemetry::errors_of("acl_keys");
    assert_eq!(errors.len(), 1, "logged once at error level: {errors:?}");
    assert_eq!(
        errors[0].get("reason").map(String::as_str),
        Some("permission")
    );
    assert!(
        telemetry::counter(
            "redis_auth_failures_total",
            &[("redis", "acl_keys"), ("reason", "permission")]
        ) >= 1
    );
}

#[tokio::test]
async fn a_command_the_acl_refuses_is_a_clear_error() {
    telemetry::install();
    let server = RedisServer::start();
    // Every command of the tier but one that only invalidations of tags run.
    let mut user = acl_user("notags", "pw", "~stampede:*", "&stampede:*");
    user.push("-sunionstore".to_owned());
    set_user(&server, &user);
    config(&server.url_as("notags", "pw")).install_as("acl_command");
    let error = within(stampede::require_redis(Some("acl_command")))
        .await
        .expect_err("the start-up check runs every command of the tier's scripts");
    assert!(
        matches!(error, stampede::Error::InvalidConfig { .. }),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(
        message.contains("NOPERM") && message.contains("SUNIONSTORE"),
        "names the refused command: {message}"
    );
}

#[tokio::test]
async fn channels_the_acl_refuses_are_a_clear_error() {
    telemetry::install();
    let server = RedisServer::start();
    set_user(
        &server,
        &acl_user("nochan", "pw", "~stampede:*", "&other:*"),
    );
    config(&server.url_as("nochan", "pw")).install_as("acl_channels");
    let error = within(stampede::require_redis(Some("acl_channels")))
        .await
        .expect_err("a user who may not subscribe to the cache's channels fails the check");
    assert!(
        matches!(error, stampede::Error::InvalidConfig { .. }),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(
        message.contains("NOPERM") && message.contains("&stampede:*"),
        "{message}"
    );
}

#[tokio::test]
async fn info_refused_by_an_acl_does_not_make_a_cluster_node_look_standalone() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "acl_cluster",
        name = "acl::cluster"
    )]
    async fn in_a(id: u64) -> String {
        LOADS.fetch_add(1, SeqCst);
        format!("cart {id}")
    }
    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "acl_cluster",
        name = "acl::cluster"
    )]
    async fn in_b(id: u64) -> String {
        LOADS.fetch_add(1, SeqCst);
        format!("cart {id} loaded by b")
    }

    let cluster = Cluster::start(redis_cluster::Options::masters(3));
    let user = acl_user("cache", "pw", "~stampede:*", "&stampede:*");
    cluster.on_every_node(&user.iter().map(String::as_str).collect::<Vec<_>>());
    // One node's URL: whether it is a cluster is asked of it, and it refuses INFO.
    let url = cluster.url(0).replacen("://", "://cache:pw@", 1);
    config(&url).install_as("acl_cluster");
    within(stampede::require_redis(Some("acl_cluster")))
        .await
        .expect("the user may run what the tier runs");
    for id in 0..30u64 {
        assert_eq!(within(in_a(id)).await, format!("cart {id}"));
        assert_eq!(
            within(in_b(id)).await,
            format!("cart {id}"),
            "read from the cluster"
        );
    }
    assert_eq!(LOADS.load(SeqCst), 30, "one load per key across both");
    let stats = stampede::stats("acl::cluster").unwrap();
    assert_eq!(
        stats.degraded, 0,
        "every call reached the node owning its key: {stats:?}"
    );
    for (port, keys) in cluster.keys_by_node("stampede:{acl::cluster~*|*}:v") {
        assert!(!keys.is_empty(), "node {port} owns some of the 30 keys");
    }
}

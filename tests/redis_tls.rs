//! `rediss://` (feature `tls`) against a real `redis-server` that serves TLS only (`--tls-port`,
//! `--port 0`), with a CA and certificates the test makes (`rcgen`): values, the lock, pub/sub
//! wake-ups and invalidations over TLS; a client certificate for a server that asks for one; and
//! a wrong CA or a missing client certificate as a clear error, never a silent fallback.
//!
//! Every test has its own server and its own connection name.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use common::redis_server::{Options, RedisServer};
use common::{eventually, telemetry, within};
use stampede::{RedisConfig, cached};
use stampede_test_support::tls::TestCerts;

/// Short settings, so that a failing test does not wait out the defaults.
fn config(url: &str) -> RedisConfig {
    RedisConfig::new(url)
        .unwrap()
        .connect_timeout(Duration::from_secs(2))
        .op_timeout(Duration::from_secs(1))
}

#[tokio::test]
async fn values_the_lock_wake_ups_and_invalidations_go_over_tls() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);
    static RELEASE: tokio::sync::Notify = tokio::sync::Notify::const_new();

    #[cached(ttl = "60s", lock = "redis", redis = "tls_flow", name = "tls::flow")]
    async fn in_a(id: u64) -> String {
        let n = LOADS.fetch_add(1, SeqCst) + 1;
        if id == 7 {
            RELEASE.notified().await;
        }
        format!("account {id} v{n}")
    }
    #[cached(ttl = "60s", lock = "redis", redis = "tls_flow", name = "tls::flow")]
    async fn in_b(id: u64) -> String {
        let n = LOADS.fetch_add(1, SeqCst) + 1;
        format!("account {id} v{n} loaded by b")
    }

    let certs = Arc::new(TestCerts::generate("stampede test CA"));
    let server = RedisServer::start_with(Options::default().tls(certs.clone(), false));
    assert!(server.url().starts_with("rediss://"));
    // Waiters are woken by the holder's publication: never by a lease or a lock wait running
    // out, which would take an hour.
    config(&server.url())
        .tls_root_ca(&certs.ca_pem)
        .unwrap()
        .lease(Duration::from_secs(3600))
        .lock_wait(Duration::from_secs(3600))
        .install_as("tls_flow");
    within(stampede::require_redis(Some("tls_flow")))
        .await
        .expect("the server's certificate verifies against the CA given");

    // A value written by one, read by the other from Redis.
    assert_eq!(within(in_a(1)).await, "account 1 v1");
    assert_eq!(within(in_b(1)).await, "account 1 v1");
    assert!(server.key("stampede:{tls::flow~*|1}:v").is_some());

    // The lock and a wake-up: b waits for a's load, which a holds until b is waiting.
    let a = tokio::spawn(in_a(7));
    eventually("a to hold the key's lock", || {
        stampede::stats("tls::flow").is_some_and(|s| s.lock_acquired == 2)
    })
    .await;
    let b = tokio::spawn(in_b(7));
    eventually("b to find the lock busy", || {
        stampede::stats("tls::flow").is_some_and(|s| s.lock_busy == 1)
    })
    .await;
    RELEASE.notify_one();
    assert_eq!(within(a).await.unwrap(), "account 7 v2");
    assert_eq!(
        within(b).await.unwrap(),
        "account 7 v2",
        "woken with a's value"
    );
    assert_eq!(LOADS.load(SeqCst), 2);

    // An invalidation from this process: gone from Redis and from both memories.
    within(stampede::invalidate("tls::flow", (7u64,)))
        .await
        .unwrap();
    assert_eq!(server.key("stampede:{tls::flow~*|7}:v"), None);
    assert_eq!(within(in_b(7)).await, "account 7 v3 loaded by b");
    assert_eq!(within(in_a(7)).await, "account 7 v3 loaded by b");

    // An invalidation announced by another process (its message on the invalidation channel,
    // sent here through the test's own TLS connection) reaches this one's memory through the
    // subscription, which is over TLS too.
    let _: i64 = server.command(&["DEL", &server.key("stampede:{tls::flow~*|1}:v").unwrap()]);
    let _: i64 = server.command(&["PUBLISH", "stampede:invalidations", "tls::flow\n1"]);
    eventually(
        "the announced invalidation to drop key 1 from memory",
        || stampede::stats("tls::flow").is_some_and(|s| s.entries == 2),
    )
    .await;
    assert_eq!(within(in_a(1)).await, "account 1 v4");
    assert_eq!(stampede::stats("tls::flow").unwrap().degraded, 0);
}

#[tokio::test]
async fn a_client_certificate_is_presented_to_a_server_that_asks_for_one() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "tls_mutual",
        name = "tls::mutual"
    )]
    async fn guarded(id: u64) -> String {
        LOADS.fetch_add(1, SeqCst);
        format!("invoice {id}")
    }

    telemetry::install();
    let certs = Arc::new(TestCerts::generate("stampede mutual CA"));
    let server = RedisServer::start_with(Options::default().tls(certs.clone(), true));
    config(&server.url())
        .tls_root_ca(&certs.ca_pem)
        .unwrap()
        .tls_client_cert(&certs.client_cert_pem, &certs.client_key_pem)
        .unwrap()
        .install_as("tls_mutual");
    within(stampede::require_redis(Some("tls_mutual")))
        .await
        .expect("the server accepts the client certificate");
    assert_eq!(within(guarded(3)).await, "invoice 3");
    assert!(server.key("stampede:{tls::mutual~*|3}:v").is_some());

    // Without it, the server refuses the handshake: a clear error.
    config(&server.url())
        .tls_root_ca(&certs.ca_pem)
        .unwrap()
        .install_as("tls_no_client_cert");
    let error = within(stampede::require_redis(Some("tls_no_client_cert")))
        .await
        .expect_err("the server asks for a client certificate");
    assert!(
        matches!(error, stampede::Error::InvalidConfig { .. }),
        "{error:?}"
    );
    assert!(error.to_string().contains("tls_client_cert"), "{error}");
}

#[tokio::test]
async fn a_wrong_ca_is_a_clear_error_logged_once_and_counted_never_a_silent_fallback() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "tls_wrong_ca",
        name = "tls::wrong_ca"
    )]
    async fn guarded(id: u64) -> String {
        LOADS.fetch_add(1, SeqCst);
        format!("ticket {id}")
    }

    telemetry::install();
    let certs = Arc::new(TestCerts::generate("stampede server CA"));
    let other = TestCerts::generate("another CA");
    let server = RedisServer::start_with(Options::default().tls(certs, false));
    config(&server.url())
        .tls_root_ca(&other.ca_pem)
        .unwrap()
        .cooldown(Duration::ZERO, 1)
        .install_as("tls_wrong_ca");
    let error = within(stampede::require_redis(Some("tls_wrong_ca")))
        .await
        .expect_err("a certificate of another CA must not verify");
    assert!(
        matches!(error, stampede::Error::InvalidConfig { .. }),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(
        message.contains("certificate") && message.contains("tls_root_ca"),
        "{message}"
    );

    // The caches serve from this process, loudly.
    for id in 0..3 {
        assert_eq!(within(guarded(id)).await, format!("ticket {id}"));
    }
    assert_eq!(LOADS.load(SeqCst), 3);
    assert!(stampede::stats("tls::wrong_ca").unwrap().degraded >= 1);
    let errors = telemetry::errors_of("tls_wrong_ca");
    assert_eq!(errors.len(), 1, "logged once at error level: {errors:?}");
    assert_eq!(
        errors[0].get("reason").map(String::as_str),
        Some("certificate")
    );
    assert!(
        telemetry::counter(
            "redis_auth_failures_total",
            &[("redis", "tls_wrong_ca"), ("reason", "certificate")]
        ) >= 1
    );

    // Without a CA of its own, the built-in webpki roots are trusted, and a private CA is not
    // among them: the same clear error, not an unverified connection.
    config(&server.url()).install_as("tls_webpki");
    let error = within(stampede::require_redis(Some("tls_webpki")))
        .await
        .expect_err("the webpki roots do not include the test's CA");
    assert!(
        matches!(error, stampede::Error::InvalidConfig { .. })
            && error.to_string().contains("certificate"),
        "{error:?}"
    );
}

#[test]
fn certificates_that_are_not_usable_are_errors_when_given() {
    let certs = TestCerts::generate("stampede parse CA");
    let other = TestCerts::generate("stampede other CA");
    let tls = || RedisConfig::new("rediss://127.0.0.1:6380/").unwrap();

    let error = tls().tls_root_ca("not a certificate").unwrap_err();
    assert!(
        matches!(error, stampede::Error::InvalidConfig { .. }),
        "{error:?}"
    );
    assert!(error.to_string().contains("root CA"), "{error}");

    // A key that is not the certificate's.
    let error = tls()
        .tls_client_cert(&certs.client_cert_pem, &other.client_key_pem)
        .unwrap_err();
    assert!(error.to_string().contains("client certificate"), "{error}");
    let error = tls()
        .tls_client_cert(&certs.client_cert_pem, "no key here")
        .unwrap_err();
    assert!(error.to_string().contains("client key"), "{error}");

    // Certificates for a plain URL: the user meant TLS and would not get it.
    let error = RedisConfig::new("redis://127.0.0.1:6379/")
        .unwrap()
        .tls_root_ca(&certs.ca_pem)
        .unwrap_err();
    assert!(error.to_string().contains("rediss://"), "{error}");

    let shown = format!(
        "{:?}",
        tls()
            .tls_client_cert(&certs.client_cert_pem, &certs.client_key_pem)
            .unwrap()
    );
    assert!(!shown.contains("PRIVATE KEY"), "{shown}");
}

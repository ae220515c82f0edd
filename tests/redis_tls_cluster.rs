//! A Redis Cluster over TLS (feature `tls`): 3 masters serving TLS only (`--tls-port`,
//! `--port 0`, `--tls-cluster yes`) and asking clients for a certificate, with certificates the
//! test makes (`rcgen`). The CA and the client certificate must reach every connection: the
//! cluster client of commands, the sharded pub/sub client of wake-ups and the plain subscriber.
//! One cluster for the file, started by the test.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use common::{eventually, within};
use stampede::{RedisConfig, cached};
use stampede_test_support::redis_cluster::{Cluster, Options};
use stampede_test_support::tls::TestCerts;

#[tokio::test]
async fn a_tls_cluster_with_client_certificates_serves_values_wake_ups_and_invalidations() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);
    static RELEASE: tokio::sync::Notify = tokio::sync::Notify::const_new();

    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "tls_cluster",
        name = "tlsc::flow"
    )]
    async fn in_a(id: u64) -> String {
        let n = LOADS.fetch_add(1, SeqCst) + 1;
        if id == 1_000 {
            RELEASE.notified().await;
        }
        format!("basket {id} v{n}")
    }
    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "tls_cluster",
        name = "tlsc::flow"
    )]
    async fn in_b(id: u64) -> String {
        let n = LOADS.fetch_add(1, SeqCst) + 1;
        format!("basket {id} v{n} loaded by b")
    }

    let certs = Arc::new(TestCerts::generate("stampede cluster CA"));
    let cluster = Cluster::start(Options::masters(3).tls(certs.clone()));
    println!("TLS cluster of 3 masters ready in {:?}", cluster.ready_in);
    // One node's URL: the cluster is detected, and the slot map's other nodes are reached with
    // the same certificates.
    RedisConfig::new(&cluster.url(0))
        .unwrap()
        .tls_root_ca(&certs.ca_pem)
        .unwrap()
        .tls_client_cert(&certs.client_cert_pem, &certs.client_key_pem)
        .unwrap()
        .connect_timeout(Duration::from_secs(3))
        .op_timeout(Duration::from_secs(1))
        // Waiters are woken by the holder's publication, never by a lease or lock wait running out.
        .lease(Duration::from_secs(3600))
        .lock_wait(Duration::from_secs(3600))
        .install_as("tls_cluster");
    within(stampede::require_redis(Some("tls_cluster")))
        .await
        .expect("every node's certificate verifies, and each accepts the client's");

    // Values over every master.
    for id in 0..30u64 {
        assert_eq!(within(in_a(id)).await, format!("basket {id} v{}", id + 1));
        assert_eq!(
            within(in_b(id)).await,
            format!("basket {id} v{}", id + 1),
            "read from the cluster"
        );
    }
    assert_eq!(LOADS.load(SeqCst), 30);
    for (port, keys) in cluster.keys_by_node("stampede:{tlsc::flow~*|*}:v") {
        assert!(!keys.is_empty(), "node {port} owns some of the 30 keys");
    }

    // The lock and a sharded wake-up (SSUBSCRIBE on the key's master, over TLS).
    let a = tokio::spawn(in_a(1_000));
    eventually("a to hold the key's lock", || {
        stampede::stats("tlsc::flow").is_some_and(|s| s.lock_acquired == 31)
    })
    .await;
    let b = tokio::spawn(in_b(1_000));
    eventually("b to find the lock busy", || {
        stampede::stats("tlsc::flow").is_some_and(|s| s.lock_busy == 1)
    })
    .await;
    RELEASE.notify_one();
    assert_eq!(within(a).await.unwrap(), "basket 1000 v31");
    assert_eq!(
        within(b).await.unwrap(),
        "basket 1000 v31",
        "woken with a's value"
    );

    // An invalidation: gone from the key's master and from both memories.
    within(stampede::invalidate("tlsc::flow", (1_000u64,)))
        .await
        .unwrap();
    let left: usize = cluster
        .keys_by_node("stampede:{tlsc::flow~*|1000}:v")
        .iter()
        .map(|(_, keys)| keys.len())
        .sum();
    assert_eq!(left, 0);
    assert_eq!(within(in_b(1_000)).await, "basket 1000 v32 loaded by b");
    assert_eq!(within(in_a(1_000)).await, "basket 1000 v32 loaded by b");
    assert_eq!(stampede::stats("tlsc::flow").unwrap().degraded, 0);
}

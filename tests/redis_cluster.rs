//! The Redis tier on a real Redis Cluster (3 masters with a replica each, on loopback), shared
//! by every test of this file: each test installs its own connection name and cache names.
//!
//! Functions with the same `name` are what several processes of one service are: their own
//! memory and flights over the same Redis keys. They share this binary's registry, so an
//! invalidation heard by one subscriber reaches all of them; delivery through the feed is proved
//! by announcing an invalidation as another process would. The feed under faults that change
//! the cluster (a node forgotten, the one node given killed) is in `redis_cluster_feed.rs`.

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use common::{eventually, within};
use stampede::{RedisConfig, cached};
use stampede_test_support::redis_cluster::{Cluster, Options};

/// This file's cluster, started by the first test that asks for it, with how long it took to
/// come up printed once.
fn cluster() -> &'static Cluster {
    static CLUSTER: std::sync::OnceLock<Cluster> = std::sync::OnceLock::new();
    let cluster = CLUSTER.get_or_init(|| Cluster::start(Options::masters(3).replicas(1)));
    static PRINTED: std::sync::Once = std::sync::Once::new();
    PRINTED.call_once(|| {
        println!(
            "cluster of 6 nodes up (cluster_state:ok on every node) in {:?}",
            cluster.ready_in
        );
    });
    cluster
}

/// The invalidation channel on a cluster, as docs/tiers.md names it (prefix `test`).
const FEED: &str = "test:{feed|test}:invalidations";

/// Held by each test for its whole run: the tests share the cluster and this binary's registry,
/// and a feed that one test's load delays past its bound makes the process drop the memory of
/// every Redis-backed cache (as it must), which another test would see as a lost entry.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Installs connection `name` to the cluster through `url`, with bounds generous enough that a
/// loaded 2-core machine does not turn a slow answer into a local load.
fn install(url: &str, name: &str) {
    RedisConfig::new(url)
        .unwrap()
        .prefix("test")
        .op_timeout(Duration::from_secs(5))
        .connect_timeout(Duration::from_secs(5))
        .install_as(name);
}

#[tokio::test]
async fn one_node_url_is_enough_and_every_key_of_a_call_shares_one_slot() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", lock = "redis", redis = "slots", name = "clu::slots")]
    async fn report(id: u64) -> String {
        LOADS.fetch_add(1, SeqCst);
        tokio::time::sleep(Duration::from_millis(300)).await;
        format!("report {id}")
    }

    let _serial = SERIAL.lock().await;
    let cluster = cluster();
    // One node's URL: cluster mode is asked of the server.
    install(&cluster.url(0), "slots");
    let mut slots_seen = BTreeSet::new();
    for id in 0..8_u64 {
        let call = tokio::spawn(report(id));
        let pattern = format!("test:{{clu::slots~*|{id}}}:l");
        eventually("the call to take its lock", || {
            !cluster.keys(&pattern).is_empty()
        })
        .await;
        let lock = cluster.keys(&pattern).pop().unwrap();
        assert_eq!(within(call).await.unwrap(), format!("report {id}"));
        let base = lock.strip_suffix(":l").unwrap();
        let owner = cluster.owner(&lock);
        let slot = |key: &str| -> i64 { cluster.keyed(&["CLUSTER", "KEYSLOT", key]) };
        let expected = slot(&lock);
        for suffix in ["v", "l", "f", "c"] {
            let key = format!("{base}:{suffix}");
            assert_eq!(slot(&key), expected, "{key} is on the lock's slot");
        }
        for written in ["v", "f"] {
            let key = format!("{base}:{written}");
            assert_eq!(
                cluster.command::<i64>(owner, &["EXISTS", &key]),
                1,
                "{key} was written on the master owning its slot"
            );
        }
        slots_seen.insert(owner);
    }
    assert_eq!(LOADS.load(SeqCst), 8);
    println!("8 keys written through one node's URL landed on masters {slots_seen:?}");
    assert!(
        slots_seen.len() > 1,
        "keys spread over several masters: {slots_seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_stampede_on_keys_over_every_master_loads_each_key_once() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    macro_rules! process {
        ($name:ident) => {
            #[cached(ttl = "60s", lock = "redis", redis = "storm", name = "clu::storm")]
            async fn $name(key: u64) -> u64 {
                LOADS.fetch_add(1, SeqCst);
                tokio::time::sleep(Duration::from_millis(200)).await;
                key * 10
            }
        };
    }
    process!(in_a);
    process!(in_b);
    process!(in_c);
    process!(in_d);

    let _serial = SERIAL.lock().await;
    let cluster = cluster();
    install(&cluster.urls(), "storm");
    const KEYS: u64 = 30;
    const CALLERS: u64 = 25;
    let mut calls = Vec::new();
    for key in 0..KEYS {
        for caller in 0..CALLERS {
            calls.push(tokio::spawn(async move {
                let value = match caller % 4 {
                    0 => in_a(key).await,
                    1 => in_b(key).await,
                    2 => in_c(key).await,
                    _ => in_d(key).await,
                };
                assert_eq!(value, key * 10);
            }));
        }
    }
    for call in calls {
        within(call).await.unwrap();
    }
    let stats = stampede::stats("clu::storm").unwrap();
    let loads = LOADS.load(SeqCst);
    let per_master: Vec<(u16, usize)> = cluster
        .masters()
        .into_iter()
        .map(|port| {
            let keys: Vec<String> = cluster.command(port, &["KEYS", "test:{clu::storm~*}:v"]);
            (port, keys.len())
        })
        .collect();
    println!(
        "4 caches x {CALLERS} callers x {KEYS} keys: {loads} loads, degraded {}, values per \
         master {per_master:?}",
        stats.degraded
    );
    assert_eq!(loads, KEYS as usize, "each key loaded once: {stats:?}");
    assert_eq!(stats.degraded, 0, "{stats:?}");
    assert!(
        per_master.iter().all(|(_, values)| *values > 0),
        "the keys spread over every master: {per_master:?}"
    );
    assert_eq!(
        per_master.iter().map(|(_, values)| values).sum::<usize>(),
        KEYS as usize
    );
    eventually(
        "every key's sharded channel unsubscribed once no one waits",
        || shard_channels(cluster, "test:{clu::storm~").is_empty(),
    )
    .await;
}

#[tokio::test]
async fn an_invalidation_reaches_every_process_through_the_cluster() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", lock = "redis", redis = "inval", name = "clu::inval")]
    async fn in_a(id: u64) -> String {
        let n = LOADS.fetch_add(1, SeqCst) + 1;
        format!("profile {id} load {n}")
    }
    #[cached(ttl = "60s", lock = "redis", redis = "inval", name = "clu::inval")]
    async fn in_b(id: u64) -> String {
        let n = LOADS.fetch_add(1, SeqCst) + 1;
        format!("profile {id} load {n}")
    }

    let _serial = SERIAL.lock().await;
    let cluster = cluster();
    // The feed is subscribed to on the master owning its slot, and announced there; a key owned
    // by another master proves that the invalidation, run there, was announced on the feed.
    install(&cluster.urls(), "inval");
    let feed = cluster.owner(FEED);
    let mut id = 0_u64;
    let (first, owner) = loop {
        let first = within(in_a(id)).await;
        let value = cluster
            .keys(&format!("test:{{clu::inval~*|{id}}}:v"))
            .pop()
            .expect("the value is in the cluster");
        let owner = cluster.owner(&value);
        if owner != feed {
            break (first, owner);
        }
        id += 1;
    };
    assert_eq!(within(in_b(id)).await, first, "b read a's value");
    let loads = LOADS.load(SeqCst);
    let subscribed: Vec<String> =
        cluster.command(feed, &["PUBSUB", "SHARDCHANNELS", "test:{feed|test}:*"]);
    assert!(
        subscribed.iter().any(|channel| channel == FEED),
        "the feed is subscribed on its master: {subscribed:?}"
    );

    within(stampede::invalidate("clu::inval", (id,)))
        .await
        .unwrap();
    assert!(
        cluster
            .keys(&format!("test:{{clu::inval~*|{id}}}:v"))
            .is_empty(),
        "the value is gone from the cluster"
    );
    eventually("both memories to drop the key", || {
        stampede::stats("clu::inval").unwrap().entries == id
    })
    .await;
    println!("invalidated a key of master {owner}; the feed is on master {feed}");
    let second = within(in_b(id)).await;
    assert_ne!(second, first, "b loaded again");
    assert_eq!(
        within(in_a(id)).await,
        second,
        "a read b's new value from the cluster"
    );

    // Another process's announcement, on the feed's master, reaches this process.
    assert_eq!(within(in_a(id)).await, second);
    assert_eq!(within(in_b(id)).await, second);
    eventually("both memories to hold the key", || {
        stampede::stats("clu::inval").unwrap().entries == id + 2
    })
    .await;
    let message = format!("clu::inval\n{id}");
    let heard: i64 = cluster.command(feed, &["SPUBLISH", FEED, &message]);
    assert!(
        heard >= 1,
        "the feed's master has this process's subscriber"
    );
    eventually("the announcement on the feed to drop the key", || {
        stampede::stats("clu::inval").unwrap().entries == id
    })
    .await;
    // Memory refilled from the cluster's value, which nobody deleted.
    assert_eq!(within(in_a(id)).await, second);
    assert_eq!(LOADS.load(SeqCst), loads + 1);
}

#[tokio::test]
async fn a_holder_that_lost_its_lease_cannot_write_over_the_newer_value() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", lock = "redis", redis = "fence", name = "clu::fence")]
    async fn in_a(id: u64) -> String {
        LOADS.fetch_add(1, SeqCst);
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        format!("old from a {id}")
    }
    #[cached(ttl = "60s", lock = "redis", redis = "fence", name = "clu::fence")]
    async fn in_b(id: u64) -> String {
        LOADS.fetch_add(1, SeqCst);
        tokio::time::sleep(Duration::from_millis(100)).await;
        format!("new from b {id}")
    }

    let _serial = SERIAL.lock().await;
    let cluster = cluster();
    install(&cluster.urls(), "fence");
    let a = tokio::spawn(in_a(1));
    let pattern = "test:{clu::fence~*|1}:l";
    eventually("a to take the lock", || !cluster.keys(pattern).is_empty()).await;
    let lock = cluster.keys(pattern).pop().unwrap();
    // a's lease is lost (as if it expired while a was paused).
    let _: i64 = cluster.keyed(&["DEL", &lock]);
    assert_eq!(within(in_b(1)).await, "new from b 1");
    let value = format!("{}:v", lock.strip_suffix(":l").unwrap());
    let written: Vec<u8> = cluster.keyed(&["GET", &value]);
    assert!(contains(&written, b"new from b 1"));

    // b's lock moved the key's fence: a's fill is refused, and its callers get what the
    // cluster holds since, as every process does from now on (7606250).
    assert_eq!(
        within(a).await.unwrap(),
        "new from b 1",
        "a's fill is refused: its callers get what Redis holds, written since a's read"
    );
    let after: Vec<u8> = cluster.keyed(&["GET", &value]);
    assert!(
        contains(&after, b"new from b 1") && !contains(&after, b"old from a"),
        "a's late fill was refused by the fence: {}",
        String::from_utf8_lossy(&after)
    );
    assert_eq!(LOADS.load(SeqCst), 2);
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle)
}

/// The messages the cluster bus carried from node to node, summed over every node: plain
/// `PUBLISH`es (`cluster_stats_messages_publish_sent`, to every other node) and sharded ones
/// (`cluster_stats_messages_publishshard_sent`, to the shard's other nodes only).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Bus {
    publish: u64,
    publishshard: u64,
}

impl std::ops::Sub for Bus {
    type Output = Bus;
    fn sub(self, before: Bus) -> Bus {
        Bus {
            publish: self.publish - before.publish,
            publishshard: self.publishshard - before.publishshard,
        }
    }
}

fn bus_messages(cluster: &Cluster) -> Bus {
    let mut bus = Bus::default();
    for port in cluster.ports() {
        let info: String = cluster.command(port, &["CLUSTER", "INFO"]);
        let count = |name: &str| {
            info.lines()
                .find_map(|line| line.strip_prefix(name))
                .map_or(0, |count| count.trim().parse::<u64>().unwrap())
        };
        bus.publish += count("cluster_stats_messages_publish_sent:");
        bus.publishshard += count("cluster_stats_messages_publishshard_sent:");
    }
    bus
}

/// [`bus_messages`] once it has stopped changing for 200 ms: every message sent so far, and
/// those its receivers sent on, counted.
async fn settled_bus(cluster: &Cluster) -> Bus {
    within(async {
        let mut last = bus_messages(cluster);
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let now = bus_messages(cluster);
            if now == last {
                return now;
            }
            last = now;
        }
    })
    .await
}

/// The sharded channels subscribed on every master whose name starts with `prefix`.
fn shard_channels(cluster: &Cluster, prefix: &str) -> Vec<String> {
    cluster
        .masters()
        .into_iter()
        .flat_map(|port| {
            cluster
                .command::<Vec<String>>(port, &["PUBSUB", "SHARDCHANNELS", &format!("{prefix}*")])
        })
        .collect()
}

#[tokio::test]
async fn a_wake_up_goes_to_its_shard_only_and_an_invalidation_to_the_feeds_shard_only() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", lock = "redis", redis = "bus", name = "clu::bus")]
    async fn holder(id: u64) -> u64 {
        LOADS.fetch_add(1, SeqCst);
        tokio::time::sleep(Duration::from_millis(500)).await;
        id
    }
    #[cached(ttl = "60s", lock = "redis", redis = "bus", name = "clu::bus")]
    async fn waiter(id: u64) -> u64 {
        LOADS.fetch_add(1, SeqCst);
        id
    }

    let _serial = SERIAL.lock().await;
    let cluster = cluster();
    // A heartbeat far apart, so that the only publications measured are the protocol's (the
    // first heartbeat goes out as the subscriber comes up, before the measurement).
    RedisConfig::new(&cluster.urls())
        .unwrap()
        .prefix("test")
        .op_timeout(Duration::from_secs(5))
        .connect_timeout(Duration::from_secs(5))
        .heartbeat(Duration::from_secs(600))
        .install_as("bus");
    assert_eq!(within(waiter(0)).await, 0, "connected");
    // Other tests' links may still publish a heartbeat while their runtime shuts down: that only
    // adds, so the least of three rounds is the protocol's own cost.
    let least = |a: Bus, b: Bus| Bus {
        publish: a.publish.min(b.publish),
        publishshard: a.publishshard.min(b.publishshard),
    };
    let most = Bus {
        publish: u64::MAX,
        publishshard: u64::MAX,
    };
    let (mut wake_up, mut invalidation) = (most, most);
    let mut channels_while_waiting = 0;
    for id in 1..=3_u64 {
        let before = settled_bus(cluster).await;
        let held = tokio::spawn(holder(id));
        let lock = format!("test:{{clu::bus~*|{id}}}:l");
        eventually("the holder to take the lock", || {
            !cluster.keys(&lock).is_empty()
        })
        .await;
        let waiting = tokio::spawn(waiter(id));
        // The waiter subscribes to the key's channel on the master that owns the key.
        eventually("the waiter to subscribe on the key's master", || {
            let channels = shard_channels(cluster, "test:{clu::bus~");
            channels_while_waiting = channels.len();
            channels.iter().any(|c| c.ends_with(&format!("|{id}}}:c")))
        })
        .await;
        assert_eq!(
            within(waiting).await.unwrap(),
            id,
            "woken with the holder's value"
        );
        assert_eq!(within(held).await.unwrap(), id);
        wake_up = least(wake_up, settled_bus(cluster).await - before);

        let before = settled_bus(cluster).await;
        within(stampede::invalidate("clu::bus", (id,)))
            .await
            .unwrap();
        invalidation = least(invalidation, settled_bus(cluster).await - before);
    }
    eventually(
        "no sharded channel left subscribed once no one waits",
        || shard_channels(cluster, "test:{clu::bus~").is_empty(),
    )
    .await;

    println!(
        "3 masters + 3 replicas: a fill that wakes waiters: {} cluster-bus PUBLISHSHARD \
         message(s) (SPUBLISH, to the shard's replica) and {} PUBLISH; an invalidation: {} \
         PUBLISHSHARD message(s) per announcement ({} for the two caches of the name, SPUBLISH \
         on the feed's master, to its replica), {} plain; {channels_while_waiting} sharded \
         channel(s) subscribed while a waiter waited, none after",
        wake_up.publishshard,
        wake_up.publish,
        invalidation.publishshard / 2,
        invalidation.publishshard,
        invalidation.publish,
    );
    assert_eq!(LOADS.load(SeqCst), 4, "the waiters loaded nothing");
    assert_eq!(
        wake_up,
        Bus {
            publish: 0,
            publishshard: 1
        },
        "one SPUBLISH, sent by the key's master to its replica only"
    );
    // `stampede::invalidate` by name runs through every cache of that name in this process: the
    // two here stand for two processes, each of which would announce once.
    assert_eq!(
        invalidation,
        Bus {
            publish: 0,
            publishshard: 2
        },
        "one SPUBLISH per cache, sent by the feed's master to its replica only"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_survive_a_master_being_killed_and_use_the_cluster_again_after_failover() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    macro_rules! process {
        ($name:ident) => {
            #[cached(
                ttl = "60s",
                lock = "redis",
                redis = "failover",
                name = "clu::failover"
            )]
            async fn $name(key: u64) -> Result<u64, common::AppError> {
                LOADS.fetch_add(1, SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
                Ok(key * 10)
            }
        };
    }
    process!(in_a);
    process!(in_b);

    let _serial = SERIAL.lock().await;
    let cluster = cluster();
    // Short bounds: while a master is down, calls for its slots load here instead of waiting.
    RedisConfig::new(&cluster.urls())
        .unwrap()
        .prefix("test")
        .op_timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_secs(1))
        .install_as("failover");
    let subscribed = cluster.ports()[0];
    let victim = cluster
        .masters()
        .into_iter()
        .find(|port| *port != subscribed)
        .unwrap();

    // Calls loop over fresh keys (every call goes to Redis) while the master is killed and its
    // replica takes over.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let looping = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut calls = 0_u64;
            let mut key = 1_000_000_u64;
            while !stop.load(SeqCst) {
                key += 1;
                let (a, b) = tokio::join!(in_a(key), in_b(key));
                assert_eq!(a.expect("no call fails"), key * 10);
                assert_eq!(b.expect("no call fails"), key * 10);
                calls += 2;
            }
            calls
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let killed_at = std::time::Instant::now();
    cluster.kill(victim);
    eventually("a replica to take over the dead master's slots", || {
        let alive = cluster.ports();
        alive.iter().all(|port| {
            let info: String = cluster.command(*port, &["CLUSTER", "INFO"]);
            info.contains("cluster_state:ok")
        }) && cluster.masters().len() == 3
            && !cluster.masters().contains(&victim)
    })
    .await;
    let failed_over_in = killed_at.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, SeqCst);
    let calls = within(looping).await.unwrap();

    // Back on the cluster: a new cold stampede loads each key once. The client may take a
    // few rounds to learn the new slot map (a flight whose first read fails loads here, as
    // calls do during the failover); each round uses keys never asked before.
    let cold_stampede = async |first: u64| {
        let mut rounds = 0;
        let mut took = Duration::ZERO;
        let loads = within(async {
            loop {
                rounds += 1;
                let began = std::time::Instant::now();
                let degraded = stampede::stats("clu::failover").unwrap().degraded;
                let before = LOADS.load(SeqCst);
                let base = first + rounds * 100;
                let mut calls = Vec::new();
                for key in base..base + 30 {
                    for caller in 0..10 {
                        calls.push(tokio::spawn(async move {
                            if caller % 2 == 0 {
                                in_a(key).await
                            } else {
                                in_b(key).await
                            }
                        }));
                    }
                }
                for call in calls {
                    call.await.unwrap().expect("no call fails");
                }
                let loads = LOADS.load(SeqCst) - before;
                took = began.elapsed();
                if stampede::stats("clu::failover").unwrap().degraded == degraded {
                    return loads;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
        .await;
        (loads, rounds, took)
    };
    let (loads, rounds, took) = cold_stampede(2_000_000).await;
    println!(
        "killed master {victim}: failed over in {failed_over_in:?}; {calls} calls meanwhile, none \
         failed; afterwards a cold stampede (30 keys x 10 callers) loaded {loads} times, after \
         {rounds} round(s), in {took:?} (its waiters woken through the same process's sharded \
         subscriptions; a lost wake-up would wait out the 5 s lease)"
    );
    assert_eq!(loads, 30, "each key loaded once, through the cluster");
    eventually(
        "no sharded channel left subscribed after the failover",
        || shard_channels(cluster, "test:{clu::failover~").is_empty(),
    )
    .await;

    // The killed node restarted: it rejoins as a replica, and a new stampede loads each key once.
    let restarted_at = std::time::Instant::now();
    cluster.restart(victim);
    eventually("the restarted node to rejoin as a replica", || {
        let role = cluster.try_command::<String>(victim, &["INFO", "replication"]);
        let state = cluster.try_command::<String>(victim, &["CLUSTER", "INFO"]);
        role.is_ok_and(|role| role.contains("role:slave"))
            && state.is_ok_and(|state| state.contains("cluster_state:ok"))
    })
    .await;
    let rejoined_in = restarted_at.elapsed();
    let (loads, rounds, _) = cold_stampede(3_000_000).await;
    println!(
        "killed master {victim} restarted: back as a replica in {rejoined_in:?}; a cold stampede \
         (30 keys x 10 callers) then loaded {loads} times, after {rounds} round(s)"
    );
    assert_eq!(loads, 30, "each key loaded once, through the cluster");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_key_is_served_while_its_slot_moves_and_from_its_new_master_afterwards() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    macro_rules! process {
        ($name:ident) => {
            // Fresh for 100 ms only, so that calls keep going to Redis (read, lock, fill,
            // wake-ups) while the slot moves.
            #[cached(
                ttl = "100ms",
                jitter = 0,
                lock = "redis",
                redis = "reshard",
                name = "clu::reshard"
            )]
            async fn $name(key: u64) -> Result<u64, common::AppError> {
                LOADS.fetch_add(1, SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
                Ok(key * 10)
            }
        };
    }
    process!(in_a);
    process!(in_b);

    let _serial = SERIAL.lock().await;
    let cluster = cluster();
    install(&cluster.urls(), "reshard");
    assert_eq!(within(in_a(7)).await.unwrap(), 70);
    let pattern = "test:{clu::reshard~*|7}:v";
    let value = cluster
        .keys(pattern)
        .pop()
        .expect("the value is in the cluster");
    let slot: i64 = cluster.keyed(&["CLUSTER", "KEYSLOT", &value]);
    let from = cluster.owner(&value);
    let to = cluster
        .masters()
        .into_iter()
        .find(|port| *port != from)
        .unwrap();

    // Callers in two "processes" call the hot key in a loop while its slot moves.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let looping = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut calls = 0_u64;
            while !stop.load(SeqCst) {
                let (a, b) = tokio::join!(in_a(7), in_b(7));
                assert_eq!(a.expect("no call fails"), 70);
                assert_eq!(b.expect("no call fails"), 70);
                calls += 2;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            calls
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = stampede::stats("clu::reshard").unwrap();
    let began = std::time::Instant::now();
    // Each step held 300 ms: calls meet the slot migrating (ASK, TRYAGAIN) and migrated.
    let moved = cluster.move_slot(slot, from, to, Duration::from_millis(300));
    let moved_in = began.elapsed();
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    stop.store(true, SeqCst);
    let calls = within(looping).await.unwrap();
    let during = stampede::stats("clu::reshard").unwrap();
    let degraded_during = during.degraded - before.degraded;
    let through_redis =
        (during.remote_hits + during.lock_acquired) - (before.remote_hits + before.lock_acquired);
    assert_eq!(cluster.owner(&value), to, "the slot moved");

    // Afterwards: the key is read, locked and filled on its new master, not loaded locally.
    let mut rounds = 0;
    within(async {
        loop {
            rounds += 1;
            // Past the value's fresh time, so the next calls go to Redis.
            tokio::time::sleep(Duration::from_millis(150)).await;
            let before = stampede::stats("clu::reshard").unwrap();
            let (a, b) = tokio::join!(in_a(7), in_b(7));
            assert_eq!(a.unwrap(), 70);
            assert_eq!(b.unwrap(), 70);
            let after = stampede::stats("clu::reshard").unwrap();
            let through_redis =
                after.remote_hits + after.lock_acquired > before.remote_hits + before.lock_acquired;
            if after.degraded == before.degraded && through_redis {
                return;
            }
        }
    })
    .await;
    // EXISTS on the old master would answer MOVED: count the slot's keys on each instead.
    let slot_text = slot.to_string();
    let keys_on =
        |port: u16| -> i64 { cluster.command(port, &["CLUSTER", "COUNTKEYSINSLOT", &slot_text]) };
    let (on_target, on_source) = (keys_on(to), keys_on(from));
    let value_on_target: i64 = cluster.command(to, &["EXISTS", &value]);
    println!(
        "slot {slot} of a hot key moved from master {from} to {to} ({moved} key(s) migrated) \
         in {moved_in:?} while {calls} calls ran, none failed ({through_redis} read or locked \
         in Redis, {degraded_during} served without Redis); served from the new master after \
         {rounds} round(s)"
    );
    assert_eq!(value_on_target, 1, "the value lives on the new master");
    assert!(
        on_target >= 1 && on_source == 0,
        "the slot's keys are on the new master only: {on_target} there, {on_source} on the old"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_slot_moves_subscribes_again_on_the_new_master_and_is_woken() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", lock = "redis", redis = "moving", name = "clu::moving")]
    async fn holder(id: u64) -> u64 {
        LOADS.fetch_add(1, SeqCst);
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        id * 10
    }
    #[cached(ttl = "60s", lock = "redis", redis = "moving", name = "clu::moving")]
    async fn waiter(id: u64) -> u64 {
        LOADS.fetch_add(1, SeqCst);
        id * 10
    }

    let _serial = SERIAL.lock().await;
    let cluster = cluster();
    install(&cluster.urls(), "moving");
    let began = std::time::Instant::now();
    let held = tokio::spawn(holder(3));
    let lock_pattern = "test:{clu::moving~*|3}:l";
    eventually("the holder to take the lock", || {
        !cluster.keys(lock_pattern).is_empty()
    })
    .await;
    let lock = cluster.keys(lock_pattern).pop().unwrap();
    let channel = format!("{}:c", lock.strip_suffix(":l").unwrap());
    let slot: i64 = cluster.keyed(&["CLUSTER", "KEYSLOT", &lock]);
    let from = cluster.owner(&lock);
    let to = cluster
        .masters()
        .into_iter()
        .find(|port| *port != from)
        .unwrap();
    let subscribed_on = |port: u16| -> bool {
        cluster
            .command::<Vec<String>>(port, &["PUBSUB", "SHARDCHANNELS", &channel])
            .contains(&channel)
    };
    let waiting = tokio::spawn(async move {
        let value = waiter(3).await;
        (value, began.elapsed())
    });
    eventually("the waiter to subscribe on the key's master", || {
        subscribed_on(from)
    })
    .await;

    // The slot moves while the waiter waits: the old master drops the subscription itself.
    let moved = cluster.move_slot(slot, from, to, Duration::ZERO);
    eventually("the waiter to subscribe again on the new master", || {
        subscribed_on(to)
    })
    .await;
    assert!(!subscribed_on(from), "nothing left on the old master");
    let (value, returned_after) = within(waiting).await.unwrap();
    assert_eq!(value, 30, "woken with the holder's value");
    assert_eq!(within(held).await.unwrap(), 30);
    println!(
        "slot {slot} moved from master {from} to {to} ({moved} key(s)) while a waiter waited: it \
         subscribed again on {to} and got the holder's value {returned_after:?} after the \
         holder's call began (its load takes 1.5 s, the lease 5 s); loads {}",
        LOADS.load(SeqCst)
    );
    assert_eq!(LOADS.load(SeqCst), 1, "the waiter loaded nothing");
    eventually("no sharded channel left subscribed", || {
        shard_channels(cluster, "test:{clu::moving~").is_empty()
    })
    .await;
}

#[tokio::test]
async fn a_tag_drops_its_keys_on_every_master() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(
        ttl = "60s",
        lock = "redis",
        redis = "tags",
        name = "clu::tagged",
        tags = ["clu-shop:{shop}"]
    )]
    async fn item(shop: u64, id: u64) -> String {
        let n = LOADS.fetch_add(1, SeqCst) + 1;
        format!("item {shop}/{id} load {n}")
    }

    let _serial = SERIAL.lock().await;
    let cluster = cluster();
    install(&cluster.urls(), "tags");
    for id in 0..30_u64 {
        within(item(1, id)).await;
        within(item(2, id)).await;
    }
    let tagged = cluster.keys("test:{clu::tagged~*|1:*}:v");
    let owners: BTreeSet<u16> = tagged.iter().map(|key| cluster.owner(key)).collect();
    assert_eq!(tagged.len(), 30);
    assert_eq!(owners.len(), 3, "the shop's keys are on every master");
    let set = cluster.keys("test:{tag|clu-shop:1}:t");
    assert_eq!(set.len(), 1, "one set for the tag, in a slot of its own");

    within(stampede::invalidate_tag("clu-shop:1"))
        .await
        .unwrap();
    assert!(
        cluster.keys("test:{clu::tagged~*|1:*}:v").is_empty(),
        "gone from every master"
    );
    assert!(
        cluster.keys("test:{tag|clu-shop:1}:p").is_empty(),
        "nothing pending for the tag"
    );
    assert_eq!(
        cluster.keys("test:{clu::tagged~*|2:*}:v").len(),
        30,
        "another tag: kept"
    );
    let loads = LOADS.load(SeqCst);
    for id in 0..30_u64 {
        assert!(
            within(item(1, id))
                .await
                .ends_with(&format!("load {}", loads + id as usize + 1))
        );
        within(item(2, id)).await;
    }
    assert_eq!(
        LOADS.load(SeqCst),
        loads + 30,
        "only the tagged keys loaded again"
    );
    println!(
        "a tag over 30 keys on {} masters: dropped with 1 + 30 + 1 round trips",
        owners.len()
    );
}

/// `clear` (issue 37) on a cluster: the keys of the cache's name are found by `SCAN` on every
/// master, and dropped there; another cache's stay.
#[tokio::test]
async fn a_clear_drops_the_caches_keys_on_every_master() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", lock = "redis", redis = "clear", name = "clu::cleared")]
    async fn row(id: u64) -> String {
        format!("row {id} load {}", LOADS.fetch_add(1, SeqCst) + 1)
    }
    #[cached(ttl = "60s", lock = "redis", redis = "clear", name = "clu::kept")]
    async fn kept(id: u64) -> String {
        format!("kept {id} load {}", LOADS.fetch_add(1, SeqCst) + 1)
    }

    let _serial = SERIAL.lock().await;
    let cluster = cluster();
    install(&cluster.urls(), "clear");
    for id in 0..30_u64 {
        within(row(id)).await;
        within(kept(id)).await;
    }
    let values = cluster.keys("test:{clu::cleared~*}:v");
    let owners: BTreeSet<u16> = values.iter().map(|key| cluster.owner(key)).collect();
    assert_eq!(values.len(), 30);
    assert_eq!(owners.len(), 3, "the cache's keys are on every master");

    within(row::clear()).await.unwrap();
    assert!(
        cluster.keys("test:{clu::cleared~*}:v").is_empty(),
        "gone from every master"
    );
    assert_eq!(
        cluster.keys("test:{clu::kept~*}:v").len(),
        30,
        "another cache: kept"
    );
    let loads = LOADS.load(SeqCst);
    for id in 0..30_u64 {
        within(row(id)).await;
        within(kept(id)).await;
    }
    assert_eq!(
        LOADS.load(SeqCst),
        loads + 30,
        "only the cleared cache loaded again"
    );
}

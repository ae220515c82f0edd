//! The invalidation feed on a real Redis Cluster (3 masters with a replica each, on loopback) of
//! its own, under faults that change the cluster for a while or for good, which the other cluster
//! tests could not share: a master whose cluster bus no longer reaches one node (`CLUSTER
//! FORGET`, undone at the end of the test), and the one node a process was configured with
//! killed.
//!
//! The process that invalidates is a real other process: this test binary started again as a
//! writer (the `writer` test, told its part by an environment variable), which invalidates keys
//! with `stampede::invalidate` on its own connection to every node. Its invalidations travel the
//! way the library sends them, so these tests say nothing of the channels and commands used.

mod common;

use std::collections::BTreeSet;
use std::future::Future;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::{Duration, Instant};

use common::{WAIT, eventually, misses, until, within};
use stampede::{RedisConfig, cached};
use stampede_test_support::redis_cluster::{Cluster, Options};
use tokio::sync::mpsc;

/// The feed's heartbeat here and its operation timeout, and the bound they give:
/// `2 × heartbeat + op_timeout`, as `RedisConfig::heartbeat` documents.
const HEARTBEAT: Duration = Duration::from_millis(300);
const OP_TIMEOUT: Duration = Duration::from_secs(1);
const STALENESS_BOUND: Duration = Duration::from_millis(2 * 300 + 1_000);
/// Room for a loaded machine on top of a documented bound, and for the call that observes it.
const SLACK: Duration = Duration::from_secs(2);

/// The invalidation channel on a cluster, as docs/tiers.md names it: the master owning its slot
/// carries the feed.
const FEED_CHANNEL: &str = "test:{feed|test}:invalidations";

/// Set in the writer process: its connection's name and the cluster's URLs.
const WRITER: &str = "STAMPEDE_TEST_FEED_WRITER";

fn cluster() -> &'static Cluster {
    static CLUSTER: std::sync::OnceLock<Cluster> = std::sync::OnceLock::new();
    let cluster = CLUSTER.get_or_init(|| Cluster::start(Options::masters(3).replicas(1)));
    static PRINTED: std::sync::Once = std::sync::Once::new();
    PRINTED.call_once(|| {
        println!("cluster of 6 nodes up in {:?}", cluster.ready_in);
    });
    cluster
}

/// Held by each test for its whole run: a process that loses its feed drops the memory of every
/// Redis-backed cache, and the faults of one test must not meet those of the other.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn install(url: &str, connection: &str) {
    RedisConfig::new(url)
        .unwrap()
        .prefix("test")
        .heartbeat(HEARTBEAT)
        .op_timeout(OP_TIMEOUT)
        .connect_timeout(Duration::from_secs(2))
        .cooldown(Duration::from_millis(200), 3)
        .install_as(connection);
}

static VERSION: AtomicUsize = AtomicUsize::new(0);

fn version() -> usize {
    VERSION.fetch_add(1, SeqCst) + 1
}

#[cached(ttl = "60s", lock = "redis", redis = "feed_cut", name = "feed::cut")]
async fn cut_item(id: u64) -> String {
    format!("cut {id} v{}", version())
}

#[cached(ttl = "60s", lock = "redis", redis = "feed_seed", name = "feed::seed")]
async fn seed_item(id: u64) -> String {
    format!("seed {id} v{}", version())
}

/// The masters that the heartbeats of this cluster's subscribers are published on: the owners
/// of every heartbeat channel subscribed on any node, plain or sharded.
fn heartbeat_masters(cluster: &Cluster) -> BTreeSet<u16> {
    let mut channels = BTreeSet::new();
    for port in cluster.ports() {
        for kind in ["CHANNELS", "SHARDCHANNELS"] {
            let found: Vec<String> = cluster.command(port, &["PUBSUB", kind, "test:*heartbeat*"]);
            channels.extend(found);
        }
    }
    channels
        .iter()
        .map(|channel| cluster.owner(channel))
        .collect()
}

/// The key `id` of `name` in Redis, once loaded.
fn value_key(cluster: &Cluster, name: &str, id: u64) -> String {
    cluster
        .keys(&format!("test:{{{name}~*|{id}}}:v"))
        .pop()
        .expect("the value is in the cluster")
}

/// Another process of the service: this binary run as the `writer` test, on its own connection
/// to every node given. Killed when dropped.
struct Writer {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::UnboundedReceiver<String>,
}

impl Writer {
    /// Starts the writer on connection `connection` to `urls` and waits until it is connected.
    async fn start(connection: &str, urls: &str) -> Writer {
        let exe = std::env::current_exe().expect("this test binary's path");
        let mut child = Command::new(exe)
            .args(["--exact", "writer", "--nocapture", "--test-threads", "1"])
            .env(WRITER, format!("{connection} {urls}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("cannot start the writer process");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (sender, lines) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                // The harness's `test writer ... ` may begin the first line.
                if let Some((_, said)) = line.split_once("writer: ") {
                    let _ = sender.send(said.to_owned());
                }
            }
        });
        let mut writer = Writer {
            child,
            stdin,
            lines,
        };
        assert_eq!(writer.next().await, "ready");
        writer
    }

    async fn next(&mut self) -> String {
        match tokio::time::timeout(WAIT, self.lines.recv()).await {
            Ok(Some(line)) => line,
            Ok(None) => panic!("the writer process ended"),
            Err(_) => panic!("the writer did not answer within {WAIT:?}"),
        }
    }

    /// Has the writer invalidate key `id` of the cache `name`: `Err` with its error if it failed.
    async fn invalidate(&mut self, name: &str, id: u64) -> Result<(), String> {
        writeln!(self.stdin, "{name} {id}").expect("the writer reads its commands");
        let answer = self.next().await;
        match answer.strip_prefix("failed: ") {
            Some(error) => Err(error.to_owned()),
            None => {
                assert_eq!(answer, "invalidated");
                Ok(())
            }
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The writer process's part (a plain pass in the normal run): reads `name id` lines, invalidates
/// each with `stampede::invalidate`, and says how it went.
#[test]
fn writer() {
    let Ok(part) = std::env::var(WRITER) else {
        return;
    };
    let (connection, urls) = part.split_once(' ').expect("connection and URLs");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    install(urls, connection);
    runtime
        .block_on(async {
            tokio::time::timeout(WAIT, stampede::require_redis(Some(connection))).await
        })
        .expect("the writer connects in time")
        .expect("the writer connects");
    println!("writer: ready");
    for line in std::io::stdin().lines().map_while(Result::ok) {
        let (name, id) = line.split_once(' ').expect("a name and an id");
        let id: u64 = id.parse().expect("an id");
        let invalidated = runtime.block_on(async {
            tokio::time::timeout(WAIT, stampede::invalidate(name, (id,))).await
        });
        match invalidated {
            Ok(Ok(())) => println!("writer: invalidated"),
            Ok(Err(error)) => println!("writer: failed: {error}"),
            Err(_) => println!("writer: failed: no answer within {WAIT:?}"),
        }
    }
}

/// Undoes a `CLUSTER FORGET` when dropped, even when the test fails: the master meets the
/// forgotten node again, and the test waits until it knows it.
struct Forgotten<'a> {
    cluster: &'a Cluster,
    master: u16,
    node: u16,
}

impl Drop for Forgotten<'_> {
    fn drop(&mut self) {
        let port = self.node.to_string();
        let address = format!("127.0.0.1:{port}@");
        let deadline = Instant::now() + WAIT;
        let _: redis::RedisResult<String> = self
            .cluster
            .try_command(self.master, &["CLUSTER", "MEET", "127.0.0.1", &port]);
        while Instant::now() < deadline {
            let known = self
                .cluster
                .try_command::<String>(self.master, &["CLUSTER", "NODES"])
                .is_ok_and(|nodes| {
                    nodes
                        .lines()
                        .any(|line| line.contains(&address) && line.contains(" connected"))
                });
            if known {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // Not a panic: this may run while the test fails already.
        eprintln!("master {} did not meet node {port} again", self.master);
    }
}

/// The key's master is cut off from the node the process was given (it forgets it: nothing of
/// its cluster bus reaches that node any more), while the heartbeats of the process, published on
/// other masters, keep coming. An invalidation of the key must still reach the process, or the
/// process must stop trusting its memory within the documented bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalidation_is_not_lost_when_its_master_cannot_reach_the_node_the_process_was_given() {
    let _serial = SERIAL.lock().await;
    let cluster = cluster();
    // One replica's URL, of a master other than the feed's: a master that forgets that replica
    // must not keep the feed's master from being failed over (the other test kills it).
    let feed_master = cluster.owner(FEED_CHANNEL);
    let (given, given_master) = cluster
        .replicas()
        .into_iter()
        .find(|(_, master)| *master != feed_master)
        .expect("a replica of another master than the feed's");
    install(&cluster.url_of(given), "feed_cut");
    within(cut_item(0)).await;
    let beats = heartbeat_masters(cluster);
    let master = cluster
        .masters()
        .into_iter()
        .find(|master| !beats.contains(master) && *master != given_master)
        .expect("a master that no heartbeat is published on");
    // A key of that master, in the process's memory.
    let mut id = 1;
    let old = loop {
        let value = within(cut_item(id)).await;
        if cluster.owner(&value_key(cluster, "feed::cut", id)) == master {
            break value;
        }
        id += 1;
    };
    let before = misses("feed::cut");
    assert_eq!(within(cut_item(id)).await, old);
    assert_eq!(misses("feed::cut"), before, "served from memory");

    let given_id: String = cluster.command(given, &["CLUSTER", "MYID"]);
    let _: String = cluster.command(master, &["CLUSTER", "FORGET", &given_id]);
    let _forgotten = Forgotten {
        cluster,
        master,
        node: given,
    };
    let mut writer = Writer::start("feed_cut", &cluster.urls()).await;
    writer
        .invalidate("feed::cut", id)
        .await
        .expect("the writer invalidated the key");
    let invalidated = Instant::now();
    let new = until(
        "the process to stop serving the invalidated value",
        STALENESS_BOUND + SLACK,
        || async { Some(cut_item(id).await).filter(|value| *value != old) },
    )
    .await;
    println!(
        "key {id} of master {master}, which forgot node {given} (the process's URL; heartbeats \
         on {beats:?}): served {new:?} instead of {old:?} {:?} after another process invalidated \
         it (documented bound {STALENESS_BOUND:?})",
        invalidated.elapsed()
    );
}

/// One round of [`invalidations_arrive`]: `Some` if the writer's invalidation of `key` reached
/// this process's memory through a live feed.
async fn invalidation_arrives<F, Fut>(
    writer: &mut Writer,
    name: &str,
    item: &F,
    key: u64,
) -> Option<()>
where
    F: Fn(u64) -> Fut,
    Fut: Future<Output = String>,
{
    let witness = key + 1;
    let old = item(key).await;
    let kept = item(witness).await;
    let kept_at = Instant::now();
    writer.invalidate(name, key).await.ok()?;
    until(
        &format!("key {key} to be served no more after its invalidation"),
        STALENESS_BOUND + SLACK,
        || async { (item(key).await != old).then_some(()) },
    )
    .await;
    // Memory is trusted longer than the bound only while the feed is known to be live: the
    // witness, kept before the invalidation, is still served from memory past the bound.
    tokio::time::sleep_until((kept_at + STALENESS_BOUND + Duration::from_millis(200)).into()).await;
    let before = misses(name);
    (item(witness).await == kept && misses(name) == before).then_some(())
}

/// An invalidation that the writer makes reaches this process through its feed, which is live:
/// tried with fresh keys until a round passes, within `bound`.
async fn invalidations_arrive<F, Fut>(
    writer: &mut Writer,
    name: &str,
    item: F,
    first_key: u64,
    bound: Duration,
) -> usize
where
    F: Fn(u64) -> Fut,
    Fut: Future<Output = String>,
{
    let started = Instant::now();
    let mut round = 0;
    loop {
        round += 1;
        let key = first_key + 2 * round as u64;
        if within(invalidation_arrives(writer, name, &item, key))
            .await
            .is_some()
        {
            return round;
        }
        assert!(
            started.elapsed() < bound,
            "an invalidation to arrive through a live feed: not within {bound:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The process was given one node's URL, the master that carries the feed, and that node dies:
/// its replica takes over, and the feed comes back by itself (found through the cluster's
/// topology, not the one URL given): invalidations arrive again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_feed_comes_back_when_the_one_node_given_dies() {
    let _serial = SERIAL.lock().await;
    let cluster = cluster();
    let given = cluster.owner(FEED_CHANNEL);
    install(&cluster.url_of(given), "feed_seed");
    within(seed_item(0)).await;
    let mut writer = Writer::start("feed_seed", &cluster.urls()).await;
    let rounds = invalidations_arrive(&mut writer, "feed::seed", seed_item, 100, WAIT).await;
    println!("before: an invalidation arrived through the feed in round {rounds}");

    let killed_at = Instant::now();
    cluster.kill(given);
    eventually("a replica to take over the killed master's slots", || {
        cluster.masters().len() == 3 && !cluster.masters().contains(&given)
    })
    .await;
    let failed_over_in = killed_at.elapsed();
    let rounds = invalidations_arrive(&mut writer, "feed::seed", seed_item, 1_000, WAIT).await;
    println!(
        "killed node {given}, the one URL given: failed over in {failed_over_in:?}; an \
         invalidation arrived through the feed again in round {rounds}, {:?} after the kill",
        killed_at.elapsed()
    );

    // A runtime started now makes connections of its own (they are per runtime), through the
    // nodes the cluster named: the one URL given is dead.
    let before = stampede::stats("feed::seed").unwrap();
    let value = std::thread::spawn(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async { within(seed_item(5_000)).await })
    })
    .join()
    .unwrap();
    let after = stampede::stats("feed::seed").unwrap();
    assert!(value.starts_with("seed 5000 "));
    assert_eq!(
        (after.degraded, after.lock_acquired),
        (before.degraded, before.lock_acquired + 1),
        "a new runtime's call went through the cluster, locked and filled there: {after:?}"
    );
}

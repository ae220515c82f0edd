//! A real Redis Cluster on loopback for one test file: 3 masters with a replica each (every
//! replica synced before it is handed out), started once and shared by the file's tests (each
//! uses its own connection name and cache names).
//!
//! The nodes are stopped and their directory deleted when the cluster is dropped, and, since a
//! `static` is never dropped, also by a watchdog shell that outlives the test binary by at most
//! half a second.

#![allow(dead_code)] // each test file uses its own subset

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Masters and replicas.
const NODES: usize = 6;
/// The bound on the cluster coming up.
const UP_WITHIN: Duration = Duration::from_secs(60);

pub struct RedisCluster {
    ports: Vec<u16>,
    dir: PathBuf,
    /// One per port, in the same order.
    children: Mutex<Vec<Child>>,
    /// Ports of nodes killed by a test.
    killed: Mutex<Vec<u16>>,
    /// From the first `redis-server` spawned to `cluster_state:ok` on every node.
    pub ready_in: Duration,
}

/// This test binary's cluster, started by the first test that asks for it.
pub fn shared() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    CLUSTER.get_or_init(RedisCluster::start)
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        let dir = std::env::temp_dir().join(format!(
            "stampede-cluster-{}-{:x}",
            std::process::id(),
            rand_suffix()
        ));
        std::fs::create_dir_all(&dir).expect("cannot create the cluster's directory");
        let ports = free_ports(NODES);
        let began = Instant::now();
        let mut children = Vec::new();
        for port in &ports {
            children.push(spawn_node(&dir, *port));
        }
        let mut cluster = RedisCluster {
            ports,
            dir,
            children: Mutex::new(children),
            killed: Mutex::new(Vec::new()),
            ready_in: Duration::ZERO,
        };
        cluster.watchdog();
        for port in &cluster.ports {
            wait_for(&format!("node {port} to answer"), || {
                cluster.try_command::<String>(*port, &["PING"]).is_some()
            });
        }
        let nodes: Vec<String> = cluster
            .ports
            .iter()
            .map(|port| format!("127.0.0.1:{port}"))
            .collect();
        let created = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&nodes)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("cannot run redis-cli");
        assert!(created.success(), "redis-cli --cluster create failed");
        for port in &cluster.ports {
            wait_for(&format!("node {port} to report cluster_state:ok"), || {
                cluster
                    .try_command::<String>(*port, &["CLUSTER", "INFO"])
                    .is_some_and(|info| {
                        info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:6")
                    })
                    && cluster
                        .try_command::<String>(*port, &["CLUSTER", "NODES"])
                        .is_some_and(|nodes| {
                            masters_in(&nodes).len() == 3
                                && nodes
                                    .lines()
                                    .filter(|l| {
                                        l.split(' ').nth(2).is_some_and(|f| f.contains("slave"))
                                    })
                                    .count()
                                    == 3
                        })
            });
        }
        // A replica that has not synced with its master yet cannot be promoted: a failover test
        // needs every replica's link up.
        for port in &cluster.ports {
            wait_for(
                &format!("node {port} to be a master or a synced replica"),
                || {
                    cluster
                        .try_command::<String>(*port, &["INFO", "replication"])
                        .is_some_and(|info| {
                            info.contains("role:master") || info.contains("master_link_status:up")
                        })
                },
            );
        }
        cluster.ready_in = began.elapsed();
        cluster
    }

    /// Every node's URL, comma-separated, as `RedisConfig::new` takes it.
    pub fn urls(&self) -> String {
        self.ports
            .iter()
            .map(|port| format!("redis://127.0.0.1:{port}/"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// One node's URL.
    pub fn url(&self, node: usize) -> String {
        format!("redis://127.0.0.1:{}/", self.ports[node])
    }

    /// The ports of the nodes not killed.
    pub fn ports(&self) -> Vec<u16> {
        let killed = self.killed.lock().unwrap();
        self.ports
            .iter()
            .copied()
            .filter(|port| !killed.contains(port))
            .collect()
    }

    /// Kills the node at `port` with SIGKILL, as a crash would.
    pub fn kill(&self, port: u16) {
        let index = self.ports.iter().position(|p| *p == port).expect("a node");
        let mut children = self.children.lock().unwrap();
        let _ = children[index].kill();
        let _ = children[index].wait();
        self.killed.lock().unwrap().push(port);
    }

    /// Starts the node at `port` again, killed before, with its cluster configuration: it
    /// rejoins the cluster (a killed master as a replica of the one that took its slots).
    pub fn restart(&self, port: u16) {
        let index = self.ports.iter().position(|p| *p == port).expect("a node");
        let child = spawn_node(&self.dir, port);
        self.guard(&[child.id()], false);
        self.children.lock().unwrap()[index] = child;
        self.killed.lock().unwrap().retain(|killed| *killed != port);
        wait_for(&format!("node {port} to answer again"), || {
            self.try_command::<String>(port, &["PING"]).is_some()
        });
    }

    /// The ports of the masters that serve slots, from `CLUSTER NODES`.
    pub fn masters(&self) -> Vec<u16> {
        masters_in(&self.command::<String>(self.ports()[0], &["CLUSTER", "NODES"]))
    }

    /// The port of the master that owns `key`'s slot.
    pub fn owner(&self, key: &str) -> u16 {
        let node = self.ports()[0];
        let slot: i64 = self.command(node, &["CLUSTER", "KEYSLOT", key]);
        let slots: redis::Value = self.command(node, &["CLUSTER", "SLOTS"]);
        let redis::Value::Array(ranges) = slots else {
            panic!("unexpected CLUSTER SLOTS reply {slots:?}");
        };
        for range in ranges {
            let redis::Value::Array(fields) = range else {
                continue;
            };
            let (Some(redis::Value::Int(start)), Some(redis::Value::Int(end))) =
                (fields.first(), fields.get(1))
            else {
                continue;
            };
            if (*start..=*end).contains(&slot)
                && let Some(redis::Value::Array(master)) = fields.get(2)
                && let Some(redis::Value::Int(port)) = master.get(1)
            {
                return u16::try_from(*port).expect("a port");
            }
        }
        panic!("no master owns slot {slot}");
    }

    /// Moves `slot` from the master at `from` to the master at `to`, as `redis-cli --cluster
    /// reshard` does: `SETSLOT IMPORTING` on the target, `MIGRATING` on the source, `MIGRATE`
    /// of its keys in batches, then `SETSLOT NODE` on the target, the source and the other
    /// masters. Each of the three stages (migrating, keys moved, reassigned) is held `pause`.
    /// Returns how many keys were migrated.
    pub fn move_slot(&self, slot: i64, from: u16, to: u16, pause: Duration) -> usize {
        let slot = slot.to_string();
        let from_id: String = self.command(from, &["CLUSTER", "MYID"]);
        let to_id: String = self.command(to, &["CLUSTER", "MYID"]);
        let _: String = self.command(to, &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &from_id]);
        let _: String = self.command(from, &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &to_id]);
        std::thread::sleep(pause);
        let mut moved = 0;
        loop {
            let keys: Vec<String> = self.command(from, &["CLUSTER", "GETKEYSINSLOT", &slot, "100"]);
            if keys.is_empty() {
                break;
            }
            let port = to.to_string();
            let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
            args.extend(keys.iter().map(String::as_str));
            // NOKEY when every key expired meanwhile: nothing left to move.
            let _: Option<String> = self.try_command(from, &args);
            moved += keys.len();
        }
        std::thread::sleep(pause);
        for port in [to, from] {
            let _: String = self.command(port, &["CLUSTER", "SETSLOT", &slot, "NODE", &to_id]);
        }
        for port in self.masters() {
            if port != to && port != from {
                let _: String = self.command(port, &["CLUSTER", "SETSLOT", &slot, "NODE", &to_id]);
            }
        }
        std::thread::sleep(pause);
        moved
    }

    /// The keys matching `pattern` on every master.
    pub fn keys(&self, pattern: &str) -> Vec<String> {
        self.masters()
            .into_iter()
            .flat_map(|port| self.command::<Vec<String>>(port, &["KEYS", pattern]))
            .collect()
    }

    /// Runs one command on the node at `port`.
    pub fn command<T: redis::FromRedisValue>(&self, port: u16, args: &[&str]) -> T {
        self.try_command(port, args)
            .unwrap_or_else(|| panic!("the test's command {args:?} on node {port} failed"))
    }

    /// Runs one command on the master that owns `key` (the command's first argument after its
    /// name is taken to be the key).
    pub fn keyed<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        self.command(self.owner(args[1]), args)
    }

    /// Runs one command on the node at `port`; `None` if it fails (a node down or loading).
    pub fn try_command<T: redis::FromRedisValue>(&self, port: u16, args: &[&str]) -> Option<T> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).ok()?;
        let mut connection = client
            .get_connection_with_timeout(Duration::from_secs(5))
            .ok()?;
        let mut command = redis::cmd(args[0]);
        for arg in &args[1..] {
            command.arg(*arg);
        }
        command.query(&mut connection).ok()
    }

    /// A shell that kills the nodes and deletes their directory once this process is gone.
    fn watchdog(&self) {
        let pids: Vec<u32> = self
            .children
            .lock()
            .unwrap()
            .iter()
            .map(Child::id)
            .collect();
        self.guard(&pids, true);
    }

    /// Kills `pids` (and with `remove_dir` deletes the cluster's directory) when this test
    /// process ends, however it ends: the shared cluster is a static, never dropped.
    fn guard(&self, pids: &[u32], remove_dir: bool) {
        let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
        let remove = if remove_dir {
            format!("rm -rf '{}'", self.dir.display())
        } else {
            String::from("true")
        };
        let script = format!(
            "while kill -0 {parent} 2>/dev/null; do sleep 0.5; done; kill -9 {pids} 2>/dev/null; \
             {remove}",
            parent = std::process::id(),
            pids = pids.join(" "),
        );
        let _ = Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
    }
}

/// One node of the cluster, with its configuration file in `dir`.
fn spawn_node(dir: &std::path::Path, port: u16) -> Child {
    let conf = dir.join(format!("nodes-{port}.conf"));
    Command::new("redis-server")
        .args(["--cluster-enabled", "yes", "--cluster-config-file"])
        .arg(&conf)
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--dir"])
        .arg(dir)
        .args(["--protected-mode", "no", "--loglevel", "warning"])
        // A dead master is failed over after about 2 s instead of 15.
        .args(["--cluster-node-timeout", "2000"])
        // A replica's first sync starts at once, not after 5 s of waiting for others.
        .args(["--repl-diskless-sync-delay", "0"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("cannot start redis-server (is it installed?)")
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        let mut children = self.children.lock().unwrap_or_else(|e| e.into_inner());
        for child in children.iter_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
        children.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The masters serving slots in a `CLUSTER NODES` reply (fields: id, address, flags, master,
/// ping, pong, epoch, link state, slots...).
fn masters_in(nodes: &str) -> Vec<u16> {
    let mut masters: Vec<u16> = nodes
        .lines()
        .map(|line| line.split(' ').collect::<Vec<_>>())
        .filter(|fields| fields.len() > 8 && fields[2].contains("master"))
        .filter(|fields| !fields[2].contains("fail"))
        .filter_map(|fields| fields[1].split(['@', ':']).nth(1)?.parse().ok())
        .collect();
    masters.sort_unstable();
    masters
}

/// `count` free loopback ports whose cluster bus ports (+10000) are free too.
fn free_ports(count: usize) -> Vec<u16> {
    let mut held = Vec::new();
    let mut ports = Vec::new();
    while ports.len() < count {
        let listener = TcpListener::bind("127.0.0.1:0").expect("no free loopback port");
        let port = listener.local_addr().unwrap().port();
        let bus_free = port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok();
        if bus_free {
            ports.push(port);
        }
        held.push(listener);
    }
    ports
}

fn wait_for(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + UP_WITHIN;
    while !condition() {
        assert!(
            Instant::now() < deadline,
            "timed out after {UP_WITHIN:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn rand_suffix() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(Instant::now())
}

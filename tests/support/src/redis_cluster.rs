//! A real Redis Cluster on loopback: [`Options::masters`] masters, each with
//! [`Options::replicas`] replicas (every replica synced before the cluster is handed out), plain
//! or TLS only ([`Options::tls`]: `--tls-port`, `--port 0`, `--tls-cluster yes` and
//! `--tls-replication yes`, so the cluster bus and the replication links are TLS too). The nodes
//! are the server [`binary`] names (`STAMPEDE_TEST_SERVER`, e.g. `valkey-server`), joined with
//! cluster commands (`CLUSTER ADDSLOTS`, `MEET`, `REPLICATE`): no command-line client is needed.
//!
//! Fault tests [`kill`](Cluster::kill) and [`restart`](Cluster::restart) nodes, find the
//! [`owner`](Cluster::owner) of a key and [`move_slot`](Cluster::move_slot)s between masters.
//!
//! One cluster per test file: a test file starts one and shares it among its tests (a `static`),
//! or starts one in its only test. Since a `static` is never dropped, a watchdog shell stops the
//! nodes and deletes their directory at most half a second after the test process is gone.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::redis_server::binary;
use crate::tls::TestCerts;

/// Slots of a Redis Cluster.
const SLOTS: u16 = 16_384;
/// The bound on the cluster coming up.
const UP_WITHIN: Duration = Duration::from_secs(60);
/// How many times a cluster is started before its start fails (see [`Cluster::start`]).
const STARTS: usize = 4;

/// How a [`Cluster`] is made: how many masters, replicas per master, plain or TLS.
#[derive(Clone)]
pub struct Options {
    masters: usize,
    replicas: usize,
    tls: Option<Arc<TestCerts>>,
}

impl Options {
    /// `count` masters (at least 1), each serving an equal share of the slots, no replicas.
    pub fn masters(count: usize) -> Options {
        Options {
            masters: count.max(1),
            replicas: 0,
            tls: None,
        }
    }

    /// `per_master` replicas of each master, which take over its slots when it dies.
    pub fn replicas(mut self, per_master: usize) -> Options {
        self.replicas = per_master;
        self
    }

    /// TLS only, clients needing a certificate signed by `certs`' CA.
    pub fn tls(mut self, certs: Arc<TestCerts>) -> Options {
        self.tls = Some(certs);
        self
    }

    fn nodes(&self) -> usize {
        self.masters * (1 + self.replicas)
    }
}

/// A running cluster.
pub struct Cluster {
    /// The masters' first, then the replicas'.
    ports: Vec<u16>,
    dir: PathBuf,
    options: Options,
    /// One per port, in the same order.
    children: Mutex<Vec<Child>>,
    /// Ports of nodes killed by a test.
    killed: Mutex<Vec<u16>>,
    /// From the first node spawned to `cluster_state:ok` on every node.
    pub ready_in: Duration,
}

impl Cluster {
    /// Starts the nodes, gives each master an equal share of the slots, joins them and makes
    /// the replicas. Returns once every node reports `cluster_state:ok`, sees every master and
    /// replica, and every replica is synced with its master.
    ///
    /// The ports are free when probed, but one (or its bus port, 10,000 above it) may be taken
    /// before its node binds it (another test's client socket): when a node exits before it
    /// answers, every node is stopped and the cluster started again on other ports, a few times.
    pub fn start(options: Options) -> Cluster {
        let began = Instant::now();
        let mut exits = Vec::new();
        for _ in 0..STARTS {
            match Cluster::spawn(options.clone()) {
                Ok(mut cluster) => {
                    cluster.join();
                    cluster.ready_in = began.elapsed();
                    return cluster;
                }
                Err(exit) => exits.push(exit),
            }
        }
        panic!("the cluster did not start in {STARTS} tries: {exits:?}");
    }

    /// Spawns the nodes on free ports and waits until each answers; a node's exit before it
    /// answers (its port taken meanwhile), said.
    fn spawn(options: Options) -> Result<Cluster, String> {
        let dir = crate::temp_dir("stampede-cluster");
        let ports = free_ports(options.nodes());
        let children = ports
            .iter()
            .map(|port| spawn_node(&dir, *port, options.tls.as_deref()))
            .collect();
        let cluster = Cluster {
            ports,
            dir,
            options,
            children: Mutex::new(children),
            killed: Mutex::new(Vec::new()),
            ready_in: Duration::ZERO,
        };
        cluster.watchdog();
        for (index, port) in cluster.ports.iter().enumerate() {
            let mut exited = None;
            wait_for(&format!("node {port} to answer"), || {
                let mut children = cluster.children.lock().unwrap_or_else(|e| e.into_inner());
                if let Ok(Some(status)) = children[index].try_wait() {
                    exited = Some(status);
                    return true;
                }
                drop(children);
                cluster.try_command::<String>(*port, &["PING"]).is_ok()
            });
            if let Some(status) = exited {
                return Err(format!("node {port} exited ({status}) before it answered"));
            }
        }
        Ok(cluster)
    }

    /// Makes a cluster of the started nodes, as `redis-cli --cluster create` does: a config
    /// epoch of its own for each node, the slots shared among the masters, every node met,
    /// each replica set to replicate its master; then waits until every node agrees.
    fn join(&self) {
        let masters = self.options.masters;
        let (master_ports, replica_ports) = self.ports.split_at(masters);
        for (index, port) in self.ports.iter().enumerate() {
            let epoch = (index + 1).to_string();
            let _: String = self.command(*port, &["CLUSTER", "SET-CONFIG-EPOCH", &epoch]);
        }
        let share = SLOTS / masters as u16;
        for (index, port) in master_ports.iter().enumerate() {
            let first = share * index as u16;
            let last = if index + 1 == masters {
                SLOTS - 1
            } else {
                first + share - 1
            };
            let slots: Vec<String> = (first..=last).map(|slot| slot.to_string()).collect();
            let mut args = vec!["CLUSTER", "ADDSLOTS"];
            args.extend(slots.iter().map(String::as_str));
            let _: String = self.command(*port, &args);
        }
        let first = self.ports[0];
        for port in &self.ports[1..] {
            let _: String =
                self.command(first, &["CLUSTER", "MEET", "127.0.0.1", &port.to_string()]);
        }
        for (index, port) in replica_ports.iter().enumerate() {
            let master = master_ports[index % masters];
            let id: String = self.command(master, &["CLUSTER", "MYID"]);
            // Refused ("Unknown node") until the replica has heard of its master.
            wait_for(&format!("node {port} to replicate node {master}"), || {
                self.try_command::<String>(*port, &["CLUSTER", "REPLICATE", &id])
                    .is_ok()
            });
        }
        let known = format!("cluster_known_nodes:{}", self.ports.len());
        let replicas = replica_ports.len();
        for port in &self.ports {
            wait_for(&format!("node {port} to report cluster_state:ok"), || {
                self.try_command::<String>(*port, &["CLUSTER", "INFO"])
                    .is_ok_and(|info| info.contains("cluster_state:ok") && info.contains(&known))
                    && self
                        .try_command::<String>(*port, &["CLUSTER", "NODES"])
                        .is_ok_and(|nodes| {
                            masters_in(&nodes).len() == masters
                                && nodes
                                    .lines()
                                    .filter(|l| {
                                        l.split(' ').nth(2).is_some_and(|f| f.contains("slave"))
                                    })
                                    .count()
                                    == replicas
                        })
            });
        }
        // A replica that has not synced with its master yet cannot be promoted: a failover test
        // needs every replica's link up.
        for port in replica_ports {
            wait_for(&format!("node {port} to be a synced replica"), || {
                self.try_command::<String>(*port, &["INFO", "replication"])
                    .is_ok_and(|info| info.contains("master_link_status:up"))
            });
        }
    }

    /// Every node's URL, comma-separated, as `RedisConfig::new` takes it (`rediss://` with TLS).
    pub fn urls(&self) -> String {
        (0..self.ports.len())
            .map(|node| self.url(node))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// One node's URL (the masters are the first nodes).
    pub fn url(&self, node: usize) -> String {
        self.url_of(self.ports[node])
    }

    /// The URL of the node at `port`.
    pub fn url_of(&self, port: u16) -> String {
        let scheme = if self.options.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{port}/")
    }

    /// The ports of the nodes not killed.
    pub fn ports(&self) -> Vec<u16> {
        let killed = self.killed.lock().unwrap_or_else(|e| e.into_inner());
        self.ports
            .iter()
            .copied()
            .filter(|port| !killed.contains(port))
            .collect()
    }

    /// Kills the node at `port` with SIGKILL, as a crash would.
    pub fn kill(&self, port: u16) {
        let index = self.index(port);
        let mut children = self.children.lock().unwrap_or_else(|e| e.into_inner());
        let _ = children[index].kill();
        let _ = children[index].wait();
        self.killed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(port);
    }

    /// Starts the node at `port` again, killed before, with its cluster configuration: it
    /// rejoins the cluster (a killed master as a replica of the one that took its slots).
    pub fn restart(&self, port: u16) {
        let index = self.index(port);
        let child = spawn_node(&self.dir, port, self.options.tls.as_deref());
        self.guard(&[child.id()], false);
        self.children.lock().unwrap_or_else(|e| e.into_inner())[index] = child;
        self.killed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|killed| *killed != port);
        wait_for(&format!("node {port} to answer again"), || {
            self.try_command::<String>(port, &["PING"]).is_ok()
        });
    }

    fn index(&self, port: u16) -> usize {
        self.ports
            .iter()
            .position(|p| *p == port)
            .unwrap_or_else(|| panic!("no node of this cluster has port {port}"))
    }

    /// The ports of the masters that serve slots, from `CLUSTER NODES`, in ascending order.
    pub fn masters(&self) -> Vec<u16> {
        masters_in(&self.command::<String>(self.ports()[0], &["CLUSTER", "NODES"]))
    }

    /// The replicas not failed, each with its master's port, from `CLUSTER NODES`.
    pub fn replicas(&self) -> Vec<(u16, u16)> {
        let nodes: String = self.command(self.ports()[0], &["CLUSTER", "NODES"]);
        let lines: Vec<Vec<&str>> = nodes
            .lines()
            .map(|line| line.split(' ').collect())
            .filter(|fields: &Vec<&str>| fields.len() > 3)
            .collect();
        let port_of =
            |fields: &[&str]| -> Option<u16> { fields[1].split(['@', ':']).nth(1)?.parse().ok() };
        let mut replicas: Vec<(u16, u16)> = lines
            .iter()
            .filter(|fields| fields[2].contains("slave") && !fields[2].contains("fail"))
            .filter_map(|fields| {
                let master = lines.iter().find(|other| other[0] == fields[3])?;
                Some((port_of(fields)?, port_of(master)?))
            })
            .collect();
        replicas.sort_unstable();
        replicas
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
            let _: redis::RedisResult<String> = self.try_command(from, &args);
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

    /// The keys matching `pattern` on each node not killed, by port.
    pub fn keys_by_node(&self, pattern: &str) -> Vec<(u16, Vec<String>)> {
        self.ports()
            .into_iter()
            .map(|port| (port, self.command(port, &["KEYS", pattern])))
            .collect()
    }

    /// Runs one command on every node not killed (an `ACL SETUSER`: ACLs are per node).
    pub fn on_every_node(&self, args: &[&str]) {
        for port in self.ports() {
            let _: redis::Value = self.command(port, args);
        }
    }

    /// Runs one command on the node at `port`, as the `default` user.
    pub fn command<T: redis::FromRedisValue>(&self, port: u16, args: &[&str]) -> T {
        self.try_command(port, args)
            .unwrap_or_else(|e| panic!("the test's command {args:?} on node {port} failed: {e}"))
    }

    /// Runs one command on the master that owns `key` (the command's first argument after its
    /// name is taken to be the key).
    pub fn keyed<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        self.command(self.owner(args[1]), args)
    }

    /// Runs one command on the node at `port`; an error if it fails (a node down or loading,
    /// a refusal).
    pub fn try_command<T: redis::FromRedisValue>(
        &self,
        port: u16,
        args: &[&str],
    ) -> redis::RedisResult<T> {
        let url = self.url_of(port);
        let client = match &self.options.tls {
            Some(certs) => redis::Client::build_with_tls(url, certs.redis_certificates()),
            None => redis::Client::open(url),
        }?;
        let mut connection = client.get_connection_with_timeout(Duration::from_secs(5))?;
        let mut command = redis::cmd(args[0]);
        for arg in &args[1..] {
            command.arg(*arg);
        }
        command.query(&mut connection)
    }

    /// A shell that kills the nodes and deletes their directory once this process is gone.
    fn watchdog(&self) {
        let pids: Vec<u32> = self
            .children
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(Child::id)
            .collect();
        self.guard(&pids, true);
    }

    /// Kills `pids` (and with `remove_dir` deletes the cluster's directory) when this test
    /// process ends, however it ends: a shared cluster is a static, never dropped.
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

impl Drop for Cluster {
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

/// One node, with its cluster configuration file in `dir`.
fn spawn_node(dir: &Path, port: u16, tls: Option<&TestCerts>) -> Child {
    let conf = dir.join(format!("nodes-{port}.conf"));
    let mut command = Command::new(binary());
    command
        .args(["--cluster-enabled", "yes", "--cluster-config-file"])
        .arg(&conf);
    match tls {
        Some(certs) => {
            command.args(["--port", "0", "--tls-port", &port.to_string()]);
            command.args(["--tls-cluster", "yes", "--tls-replication", "yes"]);
            command.args(certs.server_args(true));
        }
        None => {
            command.args(["--port", &port.to_string()]);
        }
    }
    command
        .args(["--bind", "127.0.0.1"])
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
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary().display()))
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
        let port = listener.local_addr().expect("a bound port").port();
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

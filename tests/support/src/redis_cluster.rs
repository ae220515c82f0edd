//! A small real Redis Cluster on loopback: `masters` nodes without replicas, plain or TLS only
//! (`--tls-port`, `--port 0`, `--tls-cluster yes`: the cluster bus is TLS too), made with
//! `CLUSTER ADDSLOTS` and `CLUSTER MEET` (no `redis-cli` needed). For the tests of what a
//! production cluster asks of a client (TLS, ACL users); `tests/common/redis_cluster.rs` has the
//! 6-node one with replicas that the failover and resharding tests use.
//!
//! A test file starts one and shares it (a `static`); since a `static` is never dropped, a
//! watchdog shell stops the nodes and deletes their directory at most half a second after the
//! test process is gone.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::redis_server::binary;
use crate::tls::TestCerts;

/// Slots of a Redis Cluster.
const SLOTS: u16 = 16_384;
/// The bound on the cluster coming up.
const UP_WITHIN: Duration = Duration::from_secs(60);

/// A running cluster of masters.
pub struct Cluster {
    ports: Vec<u16>,
    dir: PathBuf,
    children: Mutex<Vec<Child>>,
    tls: Option<Arc<TestCerts>>,
    /// From the first node spawned to `cluster_state:ok` on every node.
    pub ready_in: Duration,
}

impl Cluster {
    /// Starts `masters` nodes (at least 1), gives each an equal share of the slots and joins
    /// them; with `tls`, TLS only, clients needing a certificate signed by its CA. Returns once
    /// every node reports `cluster_state:ok`.
    pub fn start(masters: usize, tls: Option<Arc<TestCerts>>) -> Cluster {
        let masters = masters.max(1);
        let dir = crate::temp_dir("stampede-cluster");
        let ports = free_ports(masters);
        let began = Instant::now();
        let children = ports
            .iter()
            .map(|port| spawn_node(&dir, *port, tls.as_deref()))
            .collect();
        let mut cluster = Cluster {
            ports,
            dir,
            children: Mutex::new(children),
            tls,
            ready_in: Duration::ZERO,
        };
        cluster.watchdog();
        for port in &cluster.ports {
            wait_for(&format!("node {port} to answer"), || {
                cluster.try_command::<String>(*port, &["PING"]).is_ok()
            });
        }
        let share = SLOTS / masters as u16;
        for (index, port) in cluster.ports.iter().enumerate() {
            let first = share * index as u16;
            let last = if index + 1 == masters {
                SLOTS - 1
            } else {
                first + share - 1
            };
            let slots: Vec<String> = (first..=last).map(|slot| slot.to_string()).collect();
            let mut args = vec!["CLUSTER", "ADDSLOTS"];
            args.extend(slots.iter().map(String::as_str));
            let _: String = cluster.command(*port, &args);
        }
        let first = cluster.ports[0];
        for port in &cluster.ports[1..] {
            let _: String =
                cluster.command(first, &["CLUSTER", "MEET", "127.0.0.1", &port.to_string()]);
        }
        let known = format!("cluster_known_nodes:{masters}");
        for port in &cluster.ports {
            wait_for(&format!("node {port} to report cluster_state:ok"), || {
                cluster
                    .try_command::<String>(*port, &["CLUSTER", "INFO"])
                    .is_ok_and(|info| info.contains("cluster_state:ok") && info.contains(&known))
            });
        }
        cluster.ready_in = began.elapsed();
        cluster
    }

    /// Every node's URL, comma-separated, as `RedisConfig::new` takes it (`rediss://` with TLS).
    pub fn urls(&self) -> String {
        (0..self.ports.len())
            .map(|node| self.url(node))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// One node's URL.
    pub fn url(&self, node: usize) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}/", self.ports[node])
    }

    /// The nodes' ports.
    pub fn ports(&self) -> &[u16] {
        &self.ports
    }

    /// The keys matching `pattern` on each node, by port.
    pub fn keys_by_node(&self, pattern: &str) -> Vec<(u16, Vec<String>)> {
        self.ports
            .iter()
            .map(|port| (*port, self.command(*port, &["KEYS", pattern])))
            .collect()
    }

    /// Runs one command on every node (an `ACL SETUSER`: ACLs are per node).
    pub fn on_every_node(&self, args: &[&str]) {
        for port in &self.ports {
            let _: redis::Value = self.command(*port, args);
        }
    }

    /// Runs one command on the node at `port`, as the `default` user.
    pub fn command<T: redis::FromRedisValue>(&self, port: u16, args: &[&str]) -> T {
        self.try_command(port, args)
            .unwrap_or_else(|e| panic!("the test's command {args:?} on node {port} failed: {e}"))
    }

    /// Runs one command on the node at `port`.
    pub fn try_command<T: redis::FromRedisValue>(
        &self,
        port: u16,
        args: &[&str],
    ) -> redis::RedisResult<T> {
        let url = format!(
            "{}://127.0.0.1:{port}/",
            if self.tls.is_some() {
                "rediss"
            } else {
                "redis"
            }
        );
        let client = match &self.tls {
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
        let pids: Vec<String> = self
            .children
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|child| child.id().to_string())
            .collect();
        let script = format!(
            "while kill -0 {parent} 2>/dev/null; do sleep 0.5; done; kill -9 {pids} 2>/dev/null; \
             rm -rf '{dir}'",
            parent = std::process::id(),
            pids = pids.join(" "),
            dir = self.dir.display(),
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
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One node, with its cluster configuration file in `dir`.
fn spawn_node(dir: &std::path::Path, port: u16, tls: Option<&TestCerts>) -> Child {
    let conf = dir.join(format!("nodes-{port}.conf"));
    let mut command = Command::new(binary());
    command
        .args(["--cluster-enabled", "yes", "--cluster-config-file"])
        .arg(&conf);
    match tls {
        Some(certs) => {
            command.args(["--port", "0", "--tls-port", &port.to_string()]);
            command.args(["--tls-cluster", "yes"]);
            command.args(certs.server_args(true));
        }
        None => {
            command.args(["--port", &port.to_string()]);
        }
    }
    command
        .args([
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
        ])
        .arg(dir)
        .args(["--protected-mode", "no", "--loglevel", "warning"])
        .args(["--cluster-node-timeout", "2000"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary().display()))
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

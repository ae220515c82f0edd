//! A contender's instances: copies of this binary (`stampede-storm service ...`), each on a
//! loopback port it picks and prints, read through `/stats` and `/proc/<pid>/stat`.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::contender::Contender;
use crate::orchestrate::cleanup;
use crate::wire::{InstanceStats, READY};

/// One running instance.
pub struct Instance {
    /// Where it listens.
    pub address: SocketAddr,
    child: Child,
    pid: u32,
}

/// The instances of one contender.
pub struct Fleet {
    /// Them, in the order requests go round.
    pub instances: Vec<Instance>,
    client: Client<HttpConnector, Empty<Bytes>>,
}

/// How an instance is started.
pub struct Launch<'a> {
    /// How it caches.
    pub contender: Contender,
    /// The database's port.
    pub db_port: u16,
    /// Its pool's size.
    pub pool: usize,
    /// The Redis the Redis contenders use.
    pub redis_url: &'a str,
    /// A cache call this long counts as a wait.
    pub wait_threshold: Duration,
}

impl Fleet {
    /// Starts `count` instances and waits until each listens.
    pub async fn start(count: usize, launch: &Launch<'_>) -> Result<Fleet, String> {
        let exe = std::env::current_exe().map_err(|e| format!("where is this binary? {e}"))?;
        let mut fleet = Fleet {
            instances: Vec::with_capacity(count),
            client: Client::builder(TokioExecutor::new()).build_http(),
        };
        for index in 0..count {
            let mut std_command = std::process::Command::new(&exe);
            cleanup::lower_priority(&mut std_command);
            let mut command = Command::from(std_command);
            command
                .arg("service")
                .args(["--contender", launch.contender.name()])
                .args(["--db-port", &launch.db_port.to_string()])
                .args(["--pool", &launch.pool.to_string()])
                .args([
                    "--wait-threshold-us",
                    &launch.wait_threshold.as_micros().to_string(),
                ])
                .env_remove(stampede::REDIS_URL_VAR)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .kill_on_drop(true);
            if launch.contender.uses_redis() {
                command
                    .env(stampede::REDIS_URL_VAR, launch.redis_url)
                    .env("CACHED_REDIS_CONNECTION_STRING", launch.redis_url);
            }
            let mut child = command
                .spawn()
                .map_err(|e| format!("cannot start instance {index}: {e}"))?;
            let pid = child.id().ok_or("an instance exited at once")?;
            cleanup::track(pid, libc::SIGKILL);
            let stdout = child.stdout.take().ok_or("no stdout of the instance")?;
            let mut lines = BufReader::new(stdout).lines();
            let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
                .await
                .map_err(|_| format!("instance {index} did not listen within 30s"))?
                .map_err(|e| format!("instance {index}: {e}"))?
                .ok_or_else(|| format!("instance {index} exited before it listened"))?;
            let address = line
                .strip_prefix(READY)
                .and_then(|address| address.trim().parse().ok())
                .ok_or_else(|| format!("instance {index} printed `{line}`"))?;
            // Keep draining its stdout, so it never blocks on a full pipe.
            tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
            fleet.instances.push(Instance {
                address,
                child,
                pid,
            });
        }
        Ok(fleet)
    }

    /// Every instance's counters, in order.
    pub async fn stats(&self) -> Result<Vec<InstanceStats>, String> {
        let mut all = Vec::with_capacity(self.instances.len());
        for instance in &self.instances {
            let uri: hyper::Uri = format!("http://{}/stats", instance.address)
                .parse()
                .map_err(|e| format!("{e}"))?;
            let read = async {
                let response = self.client.get(uri).await.map_err(|e| e.to_string())?;
                let body = response
                    .into_body()
                    .collect()
                    .await
                    .map_err(|e| e.to_string())?;
                serde_json::from_slice::<InstanceStats>(&body.to_bytes()).map_err(|e| e.to_string())
            };
            let stats = tokio::time::timeout(Duration::from_secs(10), read)
                .await
                .map_err(|_| format!("{}/stats did not answer in 10s", instance.address))?
                .map_err(|e| format!("{}/stats: {e}", instance.address))?;
            all.push(stats);
        }
        Ok(all)
    }

    /// Every instance's CPU time so far (user + system), in seconds.
    pub fn cpu(&self) -> Vec<f64> {
        self.instances
            .iter()
            .map(|instance| cpu_seconds(instance.pid, false))
            .collect()
    }

    /// Kills the instances and waits for them.
    pub async fn stop(mut self) {
        for instance in &mut self.instances {
            let _ = instance.child.kill().await;
            cleanup::untrack(instance.pid);
        }
    }
}

/// Clock ticks per second of `/proc/<pid>/stat`.
fn ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

/// `pid`'s CPU time in seconds (user + system; with `children`, also that of its reaped
/// children), 0 when it is gone.
pub fn cpu_seconds(pid: u32, children: bool) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command name, which is in parentheses and may hold spaces: state is
    // field 3, utime 14, stime 15, cutime 16, cstime 17.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    let fields: Vec<f64> = rest
        .split_whitespace()
        .skip(11)
        .take(4)
        .map(|field| field.parse().unwrap_or(0.0))
        .collect();
    let own = fields.iter().take(2).sum::<f64>();
    let reaped = if children {
        fields.iter().skip(2).sum::<f64>()
    } else {
        0.0
    };
    (own + reaped) / ticks()
}

/// The CPU time of `pid` and of its living children, in seconds (PostgreSQL: the postmaster
/// and its backends).
pub fn tree_cpu_seconds(pid: u32) -> f64 {
    let mut total = cpu_seconds(pid, true);
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(child) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        let parent = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|ppid| ppid.parse::<u32>().ok());
        if parent == Some(pid) {
            total += cpu_seconds(child, false);
        }
    }
    total
}

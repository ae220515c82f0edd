//! The run's Redis: a `redis-server` on a free loopback port, without persistence, which the
//! plan kills (SIGKILL) and starts again, empty, on the same port; and the commands it served
//! (`INFO commandstats`), summed over its lives.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::orchestrate::{cleanup, free_port};

/// The server, and what it served before its last restart.
pub struct RedisServer {
    binary: PathBuf,
    /// Its port on 127.0.0.1.
    pub port: u16,
    child: Option<Child>,
    /// Commands served by its earlier lives.
    retired: u64,
}

/// Commands the orchestrator sends itself, left out of the count.
const OURS: [&str; 3] = ["cmdstat_info", "cmdstat_flushall", "cmdstat_config"];

impl RedisServer {
    /// Starts `binary` on a free port.
    pub async fn start(binary: PathBuf) -> Result<RedisServer, String> {
        let mut server = RedisServer {
            binary,
            port: free_port()?,
            child: None,
            retired: 0,
        };
        server.spawn().await?;
        Ok(server)
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    async fn spawn(&mut self) -> Result<(), String> {
        let child = Command::new(&self.binary)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .args(["--loglevel", "warning"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", self.binary.display()))?;
        cleanup::track(child.id(), libc::SIGTERM);
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if self.connection().await.is_ok() {
                return Ok(());
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                return Err(format!(
                    "redis-server exited at start ({status}): is port {} taken?",
                    self.port
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "redis-server did not answer on port {} within 10s",
                    self.port
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn connection(&self) -> Result<redis::aio::MultiplexedConnection, String> {
        let client = redis::Client::open(self.url()).map_err(|e| e.to_string())?;
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(1)))
            .set_response_timeout(Some(Duration::from_secs(2)));
        client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| format!("Redis on port {}: {e}", self.port))
    }

    /// Whether it runs.
    pub fn is_up(&self) -> bool {
        self.child.is_some()
    }

    /// Commands served so far, over every life (the orchestrator's own left out). `None` while
    /// it is down.
    pub async fn commands(&self) -> Option<u64> {
        if !self.is_up() {
            return Some(self.retired);
        }
        let mut connection = self.connection().await.ok()?;
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut connection)
            .await
            .ok()?;
        Some(self.retired + served(&info))
    }

    /// Empties it (between contenders).
    pub async fn flush(&self) -> Result<(), String> {
        let mut connection = self.connection().await?;
        redis::cmd("FLUSHALL")
            .query_async::<()>(&mut connection)
            .await
            .map_err(|e| format!("FLUSHALL: {e}"))
    }

    /// Kills it: SIGKILL, as a crashed or lost server (no goodbye to its clients).
    pub async fn kill(&mut self) {
        if let Some(served) = self.commands().await {
            self.retired = served;
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            cleanup::untrack(child.id());
        }
    }

    /// Starts it again on the same port, empty.
    pub async fn restart(&mut self) -> Result<(), String> {
        if self.is_up() {
            return Ok(());
        }
        self.spawn().await
    }

    /// Stops it for good.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            cleanup::untrack(child.id());
        }
    }
}

/// The calls in an `INFO commandstats` reply (`cmdstat_get:calls=12,usec=...`), less ours.
fn served(info: &str) -> u64 {
    info.lines()
        .filter_map(|line| line.split_once(':'))
        .filter(|(name, _)| name.starts_with("cmdstat_") && !OURS.contains(name))
        .filter_map(|(_, fields)| {
            fields
                .split(',')
                .find_map(|field| field.strip_prefix("calls="))
                .and_then(|calls| calls.parse::<u64>().ok())
        })
        .sum()
}

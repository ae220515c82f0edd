//! The run's Redis: a `redis-server` on a free loopback port, without persistence, which the
//! plan kills (SIGKILL) and starts again, empty, on the same port; and the commands its clients
//! sent, summed over its lives.
//!
//! The commands are counted through `MONITOR`, which marks those a Lua script ran (`[0 lua]`):
//! `INFO commandstats` counts a script's own `GET`s and `SET`s too, so a script call, one round
//! trip, would count as several. A client's command is one round trip at most (fewer when
//! pipelined).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::orchestrate::{cleanup, free_port};

/// The server, and what it served before its last restart.
pub struct RedisServer {
    binary: PathBuf,
    /// Its port on 127.0.0.1.
    pub port: u16,
    child: Option<Child>,
    /// Client commands seen so far, over every life.
    commands: Arc<AtomicU64>,
}

/// Commands the orchestrator sends itself, left out of the count.
const OURS: [&str; 3] = ["flushall", "info", "ping"];

impl RedisServer {
    /// Starts `binary` on a free port.
    pub async fn start(binary: PathBuf) -> Result<RedisServer, String> {
        let mut server = RedisServer {
            binary,
            port: free_port()?,
            child: None,
            commands: Arc::new(AtomicU64::new(0)),
        };
        server.spawn().await?;
        Ok(server)
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    async fn spawn(&mut self) -> Result<(), String> {
        let mut command = Command::new(&self.binary);
        cleanup::lower_priority(&mut command);
        let child = command
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
                return self.monitor().await;
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

    /// Counts the clients' commands of this life, until the server goes.
    async fn monitor(&self) -> Result<(), String> {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .map_err(|e| format!("MONITOR connection: {e}"))?;
        stream
            .write_all(b"MONITOR\r\n")
            .await
            .map_err(|e| format!("MONITOR: {e}"))?;
        let mut lines = BufReader::new(stream).lines();
        match lines.next_line().await {
            Ok(Some(line)) if line == "+OK" => {}
            other => return Err(format!("MONITOR answered {other:?}")),
        }
        let commands = Arc::clone(&self.commands);
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                if counts(&line) {
                    commands.fetch_add(1, Relaxed);
                }
            }
        });
        Ok(())
    }

    /// Whether it runs.
    pub fn is_up(&self) -> bool {
        self.child.is_some()
    }

    /// Client commands so far, over every life (the orchestrator's own left out).
    pub fn commands(&self) -> u64 {
        self.commands.load(Relaxed)
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
    pub fn kill(&mut self) {
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

/// Whether a `MONITOR` line (`+1700000000.123456 [0 127.0.0.1:5000] "get" "k"`) is a client's
/// command other than the orchestrator's: not run by a script (`[0 lua]`), not one of [`OURS`].
fn counts(line: &str) -> bool {
    let Some((source, command)) = line
        .split_once(" [")
        .and_then(|(_, rest)| rest.split_once("] "))
    else {
        return false;
    };
    if source.ends_with(" lua") {
        return false;
    }
    let name = command
        .trim_start_matches('"')
        .split('"')
        .next()
        .unwrap_or("")
        .to_ascii_lowercase();
    !OURS.contains(&name.as_str())
}

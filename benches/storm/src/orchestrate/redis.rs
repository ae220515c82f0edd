//! The run's Redis: a `redis-server` on a free loopback port, without persistence, which the
//! plan kills (SIGKILL) and starts again, empty, on the same port; and the round trips its
//! clients made, summed over its lives.
//!
//! The round trips are the server's `total_reads_processed` (`INFO stats`), polled every
//! [`POLL`] on a connection of the orchestrator's own, less that connection's own reads (one per
//! poll): each read is a client's request, or several of them sent together (a pipeline, or
//! requests of one multiplexed connection that arrived at once). A script's own commands are not
//! reads, so a script call counts once, as the round trip it is. Not `MONITOR`: a monitor makes
//! the server format every command a script runs for it, and that cost fell on the contenders
//! whose calls run scripts (issue 38: a `lock = "redis"` miss 146 to 231 µs with a monitor
//! attached, `cached`'s `GET` and `SET` 112 to 132 µs, in `redis_miss`). Reads since the last
//! poll before a kill are lost with the server.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use crate::orchestrate::{cleanup, free_port};

/// The server, and what it served before its last restart.
pub struct RedisServer {
    binary: PathBuf,
    /// Its port on 127.0.0.1.
    pub port: u16,
    child: Option<Child>,
    /// Client round trips seen so far, over every life.
    round_trips: Arc<AtomicU64>,
}

/// How often the round trips are read.
const POLL: Duration = Duration::from_millis(50);

impl RedisServer {
    /// Starts `binary` on a free port.
    pub async fn start(binary: PathBuf) -> Result<RedisServer, String> {
        let mut server = RedisServer {
            binary,
            port: free_port()?,
            child: None,
            round_trips: Arc::new(AtomicU64::new(0)),
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
                return self.count_round_trips().await;
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

    /// Counts the clients' round trips of this life, until the server goes.
    async fn count_round_trips(&self) -> Result<(), String> {
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .map_err(|e| format!("round trips' connection: {e}"))?;
        let mut stream = BufReader::new(stream);
        // What the earlier lives counted, to which this one's adds.
        let before = self.round_trips.load(Relaxed);
        let first = reads_processed(&mut stream).await?;
        let round_trips = Arc::clone(&self.round_trips);
        tokio::spawn(async move {
            let mut own = 1; // the reads of this connection's `INFO`s so far
            while let Ok(reads) = reads_processed(&mut stream).await {
                own += 1;
                let clients = reads.saturating_sub(first).saturating_sub(own - 1);
                round_trips.store(before + clients, Relaxed);
                tokio::time::sleep(POLL).await;
            }
        });
        Ok(())
    }

    /// Whether it runs.
    pub fn is_up(&self) -> bool {
        self.child.is_some()
    }

    /// Client round trips so far, over every life (the orchestrator's own left out).
    pub fn round_trips(&self) -> u64 {
        self.round_trips.load(Relaxed)
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

/// The server's `total_reads_processed`, asked with `INFO stats` on `stream` (one read of its own).
async fn reads_processed(stream: &mut BufReader<tokio::net::TcpStream>) -> Result<u64, String> {
    let failed = |e: std::io::Error| format!("INFO stats: {e}");
    stream
        .get_mut()
        .write_all(b"INFO stats\r\n")
        .await
        .map_err(failed)?;
    // A bulk string: `$<length>\r\n`, the text, `\r\n`.
    let mut header = String::new();
    stream.read_line(&mut header).await.map_err(failed)?;
    let length: usize = header
        .trim_end()
        .strip_prefix('$')
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("INFO stats answered {header:?}"))?;
    let mut body = vec![0; length + 2];
    stream.read_exact(&mut body).await.map_err(failed)?;
    String::from_utf8_lossy(&body)
        .lines()
        .find_map(|line| line.strip_prefix("total_reads_processed:"))
        .and_then(|n| n.trim().parse().ok())
        .ok_or_else(|| "INFO stats has no total_reads_processed".to_owned())
}

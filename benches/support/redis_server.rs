//! A Redis for the benchmarks: the URL given on the command line, or a `redis-server` of their
//! own, started on a free loopback port with no persistence and stopped when dropped.
//!
//! Shared by `hit.rs` and `scenarios.rs` through `#[path]`.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where the benchmarks' Redis is, and the server this process started, if it started one.
pub struct BenchRedis {
    pub url: String,
    /// How it came to be, for the printed header.
    pub origin: &'static str,
    server: Option<Child>,
}

impl BenchRedis {
    /// `url` when one is given; otherwise a `redis-server` of our own when the binary is found.
    /// `Err` says why there is no Redis (the Redis rows are then left out).
    pub fn get(url: Option<String>) -> Result<BenchRedis, String> {
        if let Some(url) = url {
            return Ok(BenchRedis {
                url,
                origin: "given with --redis",
                server: None,
            });
        }
        let binary = binary().ok_or(
            "no redis-server on PATH (install it, or pass --redis URL); the Redis rows are left out",
        )?;
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map_err(|e| format!("no free loopback port: {e}"))?
            .port();
        let child = Command::new(binary)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .args(["--loglevel", "warning"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start redis-server: {e}"))?;
        let redis = BenchRedis {
            url: format!("redis://127.0.0.1:{port}/"),
            origin: "a redis-server of its own",
            server: Some(child),
        };
        // Dropped on failure, which stops the server.
        redis.wait_until_it_answers(Duration::from_secs(10))?;
        Ok(redis)
    }

    fn wait_until_it_answers(&self, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        loop {
            let answers = redis::Client::open(self.url.as_str())
                .and_then(|client| client.get_connection_with_timeout(Duration::from_secs(1)))
                .and_then(|mut connection| redis::cmd("PING").query::<String>(&mut connection))
                .is_ok();
            if answers {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "redis-server did not answer at {} within {limit:?}",
                    self.url
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for BenchRedis {
    fn drop(&mut self) {
        if let Some(mut child) = self.server.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `redis-server` from `PATH` or the usual places.
fn binary() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/bin", "/usr/sbin", "/usr/local/bin"].map(PathBuf::from))
        .map(|dir| dir.join("redis-server"))
        .find(|candidate| candidate.is_file())
}

/// The name of the Redis connection the benchmarks' `lock = "redis"` functions use.
pub const CONNECTION: &str = "bench";

impl BenchRedis {
    /// Installs this Redis as the [`CONNECTION`], its keys under a prefix of this process's
    /// own, so that a Redis given with `--redis` holds no value from an earlier run for them.
    pub fn install(&self) -> Result<(), String> {
        stampede::RedisConfig::new(&self.url)
            .map_err(|e| e.to_string())?
            .prefix(format!("stampede-bench-{}", std::process::id()))
            .install_as(CONNECTION);
        Ok(())
    }
}

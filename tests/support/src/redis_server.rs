//! A real `redis-server` for one test: started on a free loopback port, stopped on drop, and
//! killable, restartable and pausable for fault tests.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer {
    port: u16,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a server with no persistence on a free port and waits until it answers.
    pub fn start() -> RedisServer {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("no free loopback port")
            .port();
        let mut server = RedisServer { port, child: None };
        server.spawn();
        server
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Kills the server with SIGKILL, as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port, empty.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// A connection for the test's own commands (reading keys, writing garbage, pausing).
    pub fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .and_then(|client| client.get_connection_with_timeout(Duration::from_secs(5)))
            .expect("cannot connect to the test's redis-server")
    }

    /// Runs one command and returns its reply.
    pub fn command<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let mut command = redis::cmd(args[0]);
        for arg in &args[1..] {
            command.arg(*arg);
        }
        command
            .query(&mut self.connection())
            .expect("the test's redis command failed")
    }

    /// The one key that matches a glob `pattern`, if there is one. The runtime names a cache's
    /// keys `{prefix}:{{name}~{digest}|{args}}:{v|l|f|c}`, where the digest covers the key and
    /// value types, so tests find them by pattern: `test:{red::shared~*|42}:v`.
    pub fn key(&self, pattern: &str) -> Option<String> {
        let mut keys: Vec<String> = self.command(&["KEYS", pattern]);
        assert!(keys.len() <= 1, "{pattern} matches several keys: {keys:?}");
        keys.pop()
    }

    fn spawn(&mut self) {
        let port = self.port.to_string();
        let child = Command::new(binary())
            .args([
                "--port",
                &port,
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args(["--protected-mode", "no", "--loglevel", "warning"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("cannot start redis-server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let answers = TcpStream::connect(("127.0.0.1", self.port)).is_ok()
                && redis::cmd("PING")
                    .query::<String>(&mut self.connection())
                    .is_ok();
            if answers {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "redis-server did not answer on port {port} within 10 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `redis-server` from `PATH` or the usual places; a missing binary fails the test with the fix.
fn binary() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/bin", "/usr/sbin", "/usr/local/bin"].map(PathBuf::from))
        .map(|dir| dir.join("redis-server"))
        .find(|candidate| candidate.is_file())
        .expect("redis-server is not installed: `apt-get install redis-server` (.ci/run does this)")
}

//! A real `redis-server` for one test: started on a free loopback port, stopped on drop, and
//! killable, restartable and pausable for fault tests. [`Options`] make it a TLS server
//! (`--tls-port`, no plain port) or one that requires a password.
//!
//! The binary is `redis-server`, or the one named by `STAMPEDE_TEST_SERVER` (e.g.
//! `valkey-server`): [`binary`].

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::tls::TestCerts;

/// The variable that names the server binary the tests start (default `redis-server`).
pub const SERVER_VAR: &str = "STAMPEDE_TEST_SERVER";

pub struct RedisServer {
    port: u16,
    child: Option<Child>,
    options: Options,
}

/// How a [`RedisServer`] is started beyond the defaults (plain TCP, no password).
#[derive(Clone, Default)]
pub struct Options {
    tls: Option<Arc<TestCerts>>,
    client_certificates: bool,
    password: Option<String>,
    args: Vec<String>,
}

impl Options {
    /// TLS only (`--tls-port`, `--port 0`) with `certs`' server certificate; with
    /// `clients_need_a_certificate`, clients must present one signed by its CA.
    pub fn tls(mut self, certs: Arc<TestCerts>, clients_need_a_certificate: bool) -> Self {
        self.tls = Some(certs);
        self.client_certificates = clients_need_a_certificate;
        self
    }

    /// `--requirepass`: the `default` user's password.
    pub fn password(mut self, password: &str) -> Self {
        self.password = Some(password.to_owned());
        self
    }

    /// Further `redis-server` arguments.
    pub fn arg(mut self, arg: &str) -> Self {
        self.args.push(arg.to_owned());
        self
    }
}

impl RedisServer {
    /// Starts a server with no persistence on a free port and waits until it answers.
    pub fn start() -> RedisServer {
        RedisServer::start_with(Options::default())
    }

    /// Starts a server with `options` on a free port and waits until it answers.
    pub fn start_with(options: Options) -> RedisServer {
        RedisServer::try_start_with(options).unwrap_or_else(|why| panic!("{why}"))
    }

    /// [`RedisServer::start_with`], or why there is no server (none installed, or it did not
    /// start or answer), for a program that goes on without one (the benchmarks).
    ///
    /// The port is free when probed, but may be taken before the server binds it (another
    /// test's client socket, given it as its own port): a server that exits before it answers
    /// is started again on another port, a few times.
    pub fn try_start_with(options: Options) -> Result<RedisServer, String> {
        let mut exited = String::new();
        for _ in 0..PORT_ATTEMPTS {
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|listener| listener.local_addr())
                .map_err(|e| format!("no free loopback port: {e}"))?
                .port();
            let mut server = RedisServer {
                port,
                child: None,
                options: options.clone(),
            };
            // Dropped on failure, which stops the server.
            match server.spawn() {
                Ok(()) => return Ok(server),
                Err(Spawn::Exited(why)) => exited = why,
                Err(Spawn::Failed(why)) => return Err(why),
            }
        }
        Err(exited)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL a cache is given: `rediss://` for a TLS server, without credentials.
    pub fn url(&self) -> String {
        let scheme = if self.options.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}/", self.port)
    }

    /// The URL with `user` (empty: none, the `default` user) and `password`.
    pub fn url_as(&self, user: &str, password: &str) -> String {
        self.url()
            .replacen("://", &format!("://{user}:{password}@"), 1)
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
        if let Err(Spawn::Exited(why) | Spawn::Failed(why)) = self.spawn() {
            panic!("{why}");
        }
    }

    /// A connection for the test's own commands (reading keys, writing garbage, pausing), as
    /// the `default` user, over TLS with the client certificate for a TLS server.
    pub fn connection(&self) -> redis::Connection {
        self.try_connection()
            .expect("cannot connect to the test's redis-server")
    }

    fn try_connection(&self) -> redis::RedisResult<redis::Connection> {
        let url = match &self.options.password {
            Some(password) => self.url_as("", password),
            None => self.url(),
        };
        let client = match &self.options.tls {
            Some(certs) => redis::Client::build_with_tls(url, certs.redis_certificates()),
            None => redis::Client::open(url),
        }?;
        client.get_connection_with_timeout(Duration::from_secs(5))
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
    /// keys `{prefix}:{{name}~{fingerprint}|{args}}:{v|l|f|c}`, where the fingerprint covers the
    /// cache's version and the shapes of its key and value, so tests find them by pattern:
    /// `test:{red::shared~*|42}:v`.
    pub fn key(&self, pattern: &str) -> Option<String> {
        let mut keys: Vec<String> = self.command(&["KEYS", pattern]);
        assert!(keys.len() <= 1, "{pattern} matches several keys: {keys:?}");
        keys.pop()
    }

    fn spawn(&mut self) -> Result<(), Spawn> {
        let binary = find_binary().map_err(Spawn::Failed)?;
        let port = self.port.to_string();
        let mut command = Command::new(&binary);
        match &self.options.tls {
            Some(certs) => {
                command.args(["--port", "0", "--tls-port", &port]);
                command.args(certs.server_args(self.options.client_certificates));
            }
            None => {
                command.args(["--port", &port]);
            }
        }
        if let Some(password) = &self.options.password {
            command.args(["--requirepass", password]);
        }
        let child = command
            .args(&self.options.args)
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--protected-mode", "no", "--loglevel", "warning"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| Spawn::Failed(format!("cannot start {}: {e}", binary.display())))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let answers = TcpStream::connect(("127.0.0.1", self.port)).is_ok()
                && self.try_connection().is_ok_and(|mut connection| {
                    redis::cmd("PING").query::<String>(&mut connection).is_ok()
                });
            if answers {
                return Ok(());
            }
            // A server that refused its options (a build without TLS) says why and exits.
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                let mut said = String::new();
                if let Some(mut stderr) = child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut stderr, &mut said);
                }
                return Err(Spawn::Exited(format!(
                    "{} exited ({status}) instead of answering on port {port}: {said}",
                    binary.display()
                )));
            }
            if Instant::now() >= deadline {
                return Err(Spawn::Failed(format!(
                    "{} did not answer on port {port} within 10 s",
                    binary.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// How many ports a server is started on before its start fails.
const PORT_ATTEMPTS: usize = 5;

/// Why a server did not start: it exited before it answered (its port taken meanwhile, or
/// options it refused: it says which on stdout, which is not kept), or anything else.
enum Spawn {
    Exited(String),
    Failed(String),
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The server the tests start: `STAMPEDE_TEST_SERVER` (a name in `PATH` or a path) or
/// `redis-server`, from `PATH` or the usual places; a missing binary fails the test with the fix.
pub fn binary() -> PathBuf {
    find_binary().unwrap_or_else(|why| panic!("{why}"))
}

/// [`binary`], or why there is none: it is not installed, and how to install it.
pub fn find_binary() -> Result<PathBuf, String> {
    let name = std::env::var(SERVER_VAR)
        .ok()
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "redis-server".to_owned());
    find(&name).ok_or_else(|| {
        format!(
            "{name} is not installed: run `cargo xtask test`, which installs it when it may, or \
             `sudo apt-get install {name}`"
        )
    })
}

/// What [`binary`] says of itself (`--version`), for a test's output.
pub fn version() -> String {
    Command::new(binary())
        .arg("--version")
        .output()
        .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_owned())
        .unwrap_or_default()
}

fn find(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        return Some(PathBuf::from(name)).filter(|path| path.is_file());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/bin", "/usr/sbin", "/usr/local/bin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

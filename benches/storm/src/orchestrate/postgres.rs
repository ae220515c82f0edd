//! The run's PostgreSQL: a cluster made by `initdb` in a temporary folder, served by `postgres`
//! on a free loopback port (TCP only, no Unix socket), with `pg_stat_statements` loaded, seeded
//! with the products and stopped (fast shutdown) at the end.
//!
//! PostgreSQL refuses to run as root. Run as root, the benchmark runs `initdb` and `postgres`
//! as the `postgres` system user (Debian's package makes it), or as `nobody` when there is no
//! such user, and gives that user the data folder.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio_postgres::{Client, NoTls};

use crate::orchestrate::{cleanup, free_port, setup};
use crate::schema::{ANALYZE, PRODUCT_QUERY, QUERY_MARK, SETUP};

/// A running cluster.
pub struct Postgres {
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// The folder of the data and the log.
    folder: PathBuf,
    child: Child,
}

/// The user the servers run as when this process is root: uid and gid, and the name.
fn server_user() -> Result<Option<(u32, u32, String)>, String> {
    if !setup::is_root() {
        return Ok(None);
    }
    let passwd =
        fs::read_to_string("/etc/passwd").map_err(|e| format!("cannot read /etc/passwd: {e}"))?;
    for name in ["postgres", "nobody"] {
        let found = passwd.lines().find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            (fields.len() > 3 && fields[0] == name)
                .then(|| Some((fields[2].parse().ok()?, fields[3].parse().ok()?)))
                .flatten()
        });
        if let Some((uid, gid)) = found {
            return Ok(Some((uid, gid, name.to_owned())));
        }
    }
    Err(
        "running as root, and neither a `postgres` nor a `nobody` user exists to run PostgreSQL \
         as (it refuses to run as root): create one, e.g. `useradd --system postgres`"
            .to_owned(),
    )
}

impl Postgres {
    /// Makes a cluster with the binaries in `bin` and starts it.
    pub async fn start(bin: &Path) -> Result<Postgres, String> {
        let user = server_user()?;
        let folder = std::env::temp_dir().join(format!("stampede-storm-{}", std::process::id()));
        let data = folder.join("data");
        fs::create_dir_all(&folder)
            .map_err(|e| format!("cannot make {}: {e}", folder.display()))?;
        cleanup::track_folder(folder.clone());
        fs::set_permissions(&folder, fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("cannot open {} to the server: {e}", folder.display()))?;
        fs::create_dir(&data).map_err(|e| format!("cannot make {}: {e}", data.display()))?;
        fs::set_permissions(&data, fs::Permissions::from_mode(0o700))
            .map_err(|e| format!("{}: {e}", data.display()))?;
        let as_user = |command: &mut Command| {
            if let Some((uid, gid, _)) = &user {
                command.uid(*uid).gid(*gid);
            }
        };
        if let Some((uid, gid, name)) = &user {
            std::os::unix::fs::chown(&data, Some(*uid), Some(*gid))
                .map_err(|e| format!("cannot give {} to the user {name}: {e}", data.display()))?;
        }

        let log = folder.join("postgres.log");
        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .arg("-D")
            .arg(&data)
            .args(["-U", "storm", "--auth=trust", "-E", "UTF8", "--no-sync"])
            .stdin(Stdio::null())
            .current_dir(&folder);
        as_user(&mut initdb);
        let output = initdb
            .output()
            .map_err(|e| format!("cannot run {}: {e}", bin.join("initdb").display()))?;
        if !output.status.success() {
            return Err(format!(
                "initdb failed ({}):\n{}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            ));
        }

        let port = free_port()?;
        let log_file = fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let mut postgres = Command::new(bin.join("postgres"));
        postgres
            .arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", "unix_socket_directories="])
            .args(["-c", "shared_preload_libraries=pg_stat_statements"])
            .args(["-c", "pg_stat_statements.track=top"])
            // A throwaway database: no durability to pay for, the same plan for every query.
            .args(["-c", "fsync=off", "-c", "synchronous_commit=off"])
            .args(["-c", "full_page_writes=off"])
            .args(["-c", "max_connections=100", "-c", "shared_buffers=128MB"])
            .args(["-c", "max_parallel_workers_per_gather=0", "-c", "jit=off"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .current_dir(&folder);
        as_user(&mut postgres);
        cleanup::lower_priority(&mut postgres);
        let child = postgres
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bin.join("postgres").display()))?;
        cleanup::track(child.id(), libc::SIGINT);
        let mut server = Postgres {
            port,
            folder,
            child,
        };
        server
            .wait_until_it_answers(Duration::from_secs(30))
            .await?;
        Ok(server)
    }

    async fn wait_until_it_answers(&mut self, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                cleanup::untrack(self.child.id());
                return Err(format!(
                    "postgres exited at start ({status}); its log:\n{}",
                    self.log_tail()
                ));
            }
            if self.connect("postgres").await.is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "postgres did not answer on 127.0.0.1:{} within {limit:?}; its log:\n{}",
                    self.port,
                    self.log_tail()
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn log_tail(&self) -> String {
        let log = fs::read_to_string(self.folder.join("postgres.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// A connection to `database`, its driver running on this runtime.
    pub async fn connect(&self, database: &str) -> Result<Client, String> {
        let mut config = tokio_postgres::Config::new();
        config
            .host("127.0.0.1")
            .port(self.port)
            .user("storm")
            .dbname(database)
            .application_name("storm-orchestrator")
            .connect_timeout(Duration::from_secs(2));
        let (client, connection) = config
            .connect(NoTls)
            .await
            .map_err(|e| format!("cannot connect to PostgreSQL on port {}: {e}", self.port))?;
        tokio::spawn(connection);
        Ok(client)
    }

    /// Creates the `storm` database, its tables and its 100,000 products.
    pub async fn seed(&self) -> Result<Client, String> {
        let admin = self.connect("postgres").await?;
        admin
            .batch_execute("CREATE DATABASE storm")
            .await
            .map_err(|e| format!("CREATE DATABASE storm: {}", pg_error(&e)))?;
        let client = self.connect("storm").await?;
        client
            .batch_execute(SETUP)
            .await
            .map_err(|e| format!("seeding the products: {}", pg_error(&e)))?;
        client
            .batch_execute(ANALYZE)
            .await
            .map_err(|e| format!("{ANALYZE}: {}", pg_error(&e)))?;
        Ok(client)
    }

    /// Stops the server (fast shutdown) and waits for it.
    pub fn stop(&mut self) {
        cleanup::signal(self.child.id(), libc::SIGINT);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                cleanup::untrack(self.child.id());
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        cleanup::untrack(self.child.id());
    }

    /// The postmaster's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// The database's side of the run: the knob of the slowdown and the statistics.
pub struct Database {
    client: Client,
}

/// What PostgreSQL counted of the product query so far.
#[derive(Clone, Copy, Debug, Default)]
pub struct QueryCount {
    /// Executions finished.
    pub calls: u64,
    /// Their total execution time, in milliseconds.
    pub total_ms: f64,
}

impl Database {
    /// Over a connection to the `storm` database.
    pub fn new(client: Client) -> Database {
        Database { client }
    }

    /// The product query's count and time from `pg_stat_statements`.
    pub async fn product_queries(&self) -> Result<QueryCount, String> {
        let row = self
            .client
            .query_one(
                "SELECT coalesce(sum(calls), 0)::int8, coalesce(sum(total_exec_time), 0)::float8 \
                 FROM pg_stat_statements WHERE strpos(query, $1) > 0",
                &[&QUERY_MARK],
            )
            .await
            .map_err(|e| format!("reading pg_stat_statements: {}", pg_error(&e)))?;
        Ok(QueryCount {
            calls: u64::try_from(row.get::<_, i64>(0)).unwrap_or(0),
            total_ms: row.get(1),
        })
    }

    /// Every product query sleeps `extra_ms` more at the database from now on.
    pub async fn set_extra_ms(&self, extra_ms: f64) -> Result<(), String> {
        self.client
            .execute("UPDATE storm_knobs SET extra_ms = $1", &[&extra_ms])
            .await
            .map(drop)
            .map_err(|e| format!("setting the slowdown: {}", pg_error(&e)))
    }

    /// Runs the product query `count` times over ids spread across the table, one at a time,
    /// and returns the server's mean execution time in milliseconds (`pg_stat_statements`) and
    /// the client's median round trip. Warms the buffers too.
    pub async fn calibrate(&self, count: u32) -> Result<(f64, Duration), String> {
        let statement = self
            .client
            .prepare(PRODUCT_QUERY)
            .await
            .map_err(|e| format!("preparing the product query: {}", pg_error(&e)))?;
        let before = self.product_queries().await?;
        let mut times = Vec::with_capacity(count as usize);
        for i in 0..count {
            let id = 1 + (i as i32 * 7_919) % crate::schema::PRODUCTS;
            let started = Instant::now();
            self.client
                .query_opt(&statement, &[&id])
                .await
                .map_err(|e| format!("the product query: {}", pg_error(&e)))?;
            times.push(started.elapsed());
        }
        let after = self.product_queries().await?;
        times.sort();
        let median = times.get(times.len() / 2).copied().unwrap_or_default();
        let runs = after.calls.saturating_sub(before.calls).max(1);
        Ok(((after.total_ms - before.total_ms) / runs as f64, median))
    }

    /// Waits (up to `limit`) until no other session runs a statement.
    pub async fn wait_idle(&self, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        loop {
            let row = self
                .client
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity \
                     WHERE state = 'active' AND pid <> pg_backend_pid() AND backend_type = 'client backend'",
                    &[],
                )
                .await
                .map_err(|e| format!("reading pg_stat_activity: {}", pg_error(&e)))?;
            if row.get::<_, i64>(0) == 0 || Instant::now() > deadline {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The server's message when there is one (tokio-postgres displays only "db error").
pub fn pg_error(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => error.to_string(),
    }
}

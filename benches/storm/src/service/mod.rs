//! One instance of the service (`stampede-storm service ...`): axum on a loopback port of its
//! own choosing, which it prints once it listens, over a fixed-size pool to the database.
//!
//! The Redis contenders find their Redis in `STAMPEDE_REDIS_URL` (stampede) and
//! `CACHED_REDIS_CONNECTION_STRING` (the `cached` crate), which the orchestrator sets.

pub mod db;
pub mod http;
pub mod lookup;

use std::io::Write as _;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use crate::contender::Contender;
use crate::wire::READY;

/// What the orchestrator passes an instance.
#[derive(Debug)]
pub struct ServiceArgs {
    /// How it caches.
    pub contender: Contender,
    /// The database's port on 127.0.0.1.
    pub db_port: u16,
    /// Connections in its pool.
    pub pool: usize,
    /// A cache call at least this long counts as a wait.
    pub wait_threshold: Duration,
}

impl ServiceArgs {
    /// Parses `--contender NAME --db-port PORT --pool N --wait-threshold-us US`.
    pub fn parse(args: &[String]) -> Result<ServiceArgs, String> {
        let mut contender = None;
        let mut db_port = None;
        let mut pool = 10;
        let mut wait_threshold = Duration::from_millis(1);
        let mut args = args.iter();
        while let Some(flag) = args.next() {
            let mut value = || {
                args.next()
                    .ok_or_else(|| format!("{flag} needs a value"))
                    .cloned()
            };
            match flag.as_str() {
                "--contender" => contender = Some(value()?.parse()?),
                "--db-port" => db_port = Some(number(flag, &value()?)?),
                "--pool" => pool = number(flag, &value()?)?,
                "--wait-threshold-us" => {
                    wait_threshold = Duration::from_micros(number(flag, &value()?)?)
                }
                other => return Err(format!("service: unknown argument `{other}`")),
            }
        }
        Ok(ServiceArgs {
            contender: contender.ok_or("service: --contender is required")?,
            db_port: db_port.ok_or("service: --db-port is required")?,
            pool,
            wait_threshold,
        })
    }
}

fn number<T: std::str::FromStr>(flag: &str, text: &str) -> Result<T, String> {
    text.parse()
        .map_err(|_| format!("{flag}: expected a number, got `{text}`"))
}

/// Runs the instance until it is killed.
pub async fn run(args: ServiceArgs) -> Result<(), String> {
    let db = lookup::install(db::Db::connect(args.db_port, args.pool).await?);
    if args.contender == Contender::StampedeRedisTrusting {
        lookup::install_trusting()?;
    }
    let app = Arc::new(http::App {
        contender: args.contender,
        db,
        wait_threshold: args.wait_threshold,
        requests: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        waits: AtomicU64::new(0),
        hot_waits: AtomicU64::new(0),
    });
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .map_err(|e| format!("cannot listen on a loopback port: {e}"))?;
    let address = listener
        .local_addr()
        .map_err(|e| format!("no local address: {e}"))?;
    let mut stdout = std::io::stdout();
    let _ = writeln!(stdout, "{READY}{address}");
    let _ = stdout.flush();
    axum::serve(listener, http::router(app))
        .await
        .map_err(|e| format!("the server stopped: {e}"))
}

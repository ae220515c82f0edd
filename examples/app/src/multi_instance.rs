//! Several processes of one service, one Redis, one cold key: how many loads run, and how soon
//! the processes that waited get the value after it is filled.
//!
//! [`run`] starts copies of the running program as the processes; each of them calls
//! [`child_if_asked`] first thing in `main`, which plays one process when the program was
//! started that way. Each fires its concurrent calls at the same cold key at the same instant.
//! With `lock = "redis"`, one process loads the key; the others wait for its publication, which
//! carries the value.
//!
//! `examples/multi_instance.rs` prints what the processes saw, `tests/multi_process.rs` asserts
//! it, and the benchmarks' scenario runner (`benches/scenarios/main.rs`, 4 processes x 250
//! callers) measures it through this package's library.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

/// Set in a child process: the run's id, which names its key and its load counter.
const CHILD_VAR: &str = "MULTI_INSTANCE_RUN";
/// Set in a child process: how many concurrent calls it fires.
const CALLERS_VAR: &str = "MULTI_INSTANCE_CALLERS";
/// How long the one load takes.
pub const LOAD_TIME: Duration = Duration::from_millis(300);

static LOADED_HERE: AtomicUsize = AtomicUsize::new(0);

#[stampede::cached(ttl = "60s", lock = "redis", name = "multi_instance::report")]
async fn report(run: u64) -> String {
    LOADED_HERE.fetch_add(1, SeqCst);
    tokio::time::sleep(LOAD_TIME).await; // the slow query
    println!("FILLED_AT {}", unix_micros());
    format!("the report of run {run}")
}

/// What one run of the scenario saw.
#[derive(Debug)]
pub struct Report {
    /// Loads in all processes together.
    pub loads: u64,
    /// Calls that got the value, out of `processes * callers`.
    pub calls_ok: u64,
    /// For each process that did not load: how long after the fill its last caller returned.
    pub release_delays: Vec<Duration>,
    /// For each process that did not load: how long after the fill its first caller returned
    /// (the rest of its release delay is waking its other callers).
    pub first_release_delays: Vec<Duration>,
}

/// Starts `processes` copies of `exe` against the Redis at `url`, each firing `callers`
/// concurrent calls, and gathers what they saw.
pub fn run(exe: &Path, url: &str, processes: usize, callers: usize) -> Result<Report, String> {
    let run_id = unix_micros();
    let start_at = run_id / 1_000 + 500; // ms: time for every process to start
    let children: Vec<_> = (0..processes)
        .map(|_| {
            Command::new(exe)
                .env(CHILD_VAR, run_id.to_string())
                .env("MULTI_INSTANCE_START_AT", start_at.to_string())
                .env(CALLERS_VAR, callers.to_string())
                .env(stampede::REDIS_URL_VAR, url)
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .map_err(|e| format!("cannot start a process: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let mut filled_at = None;
    let mut last_returns = Vec::new();
    let mut first_returns = Vec::new();
    let mut calls_ok = 0;
    let mut loads = 0;
    for child in children {
        let output = wait_bounded(child, Duration::from_secs(30))?;
        let mut last_return = None;
        let mut first_return = None;
        for line in String::from_utf8_lossy(&output).lines() {
            let mut words = line.split(' ');
            match (
                words.next(),
                words.next().and_then(|w| w.parse::<u64>().ok()),
            ) {
                (Some("FILLED_AT"), Some(at)) => {
                    // Every load prints it once: the processes' lines count the loads, whatever
                    // Redis (a server or a cluster) they share.
                    loads += 1;
                    filled_at = Some(at);
                }
                (Some("OK"), Some(count)) => calls_ok += count,
                (Some("LAST_RETURN"), Some(at)) => last_return = Some(at),
                (Some("FIRST_RETURN"), Some(at)) => first_return = Some(at),
                _ => {}
            }
        }
        let loaded_here = String::from_utf8_lossy(&output).contains("FILLED_AT");
        if !loaded_here {
            last_returns.push(last_return.ok_or("a process reported no calls")?);
            first_returns.push(first_return.ok_or("a process reported no calls")?);
        }
    }
    let filled_at = filled_at.ok_or("no process loaded the key")?;
    let after_fill = |returns: Vec<u64>| {
        returns
            .into_iter()
            .map(|at| Duration::from_micros(at.saturating_sub(filled_at)))
            .collect()
    };
    Ok(Report {
        loads,
        calls_ok,
        release_delays: after_fill(last_returns),
        first_release_delays: after_fill(first_returns),
    })
}

/// In a child process: fires the calls, prints what it saw, and returns true. Otherwise false.
pub fn child_if_asked() -> bool {
    let Some(run_id) = std::env::var(CHILD_VAR)
        .ok()
        .and_then(|id| id.parse::<u64>().ok())
    else {
        return false;
    };
    let start_at: u64 = std::env::var("MULTI_INSTANCE_START_AT")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let callers: usize = std::env::var(CALLERS_VAR)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("cannot build a tokio runtime");
    runtime.block_on(async {
        let wait = Duration::from_millis(start_at.saturating_sub(unix_micros() / 1_000));
        tokio::time::sleep(wait).await;
        let started = Instant::now();
        let calls: Vec<_> = (0..callers)
            .map(|_| tokio::spawn(async move { (report(run_id).await, unix_micros()) }))
            .collect();
        let (mut ok, mut first_return, mut last_return) = (0, u64::MAX, 0);
        let expected = format!("the report of run {run_id}");
        for call in calls {
            if let Ok((value, returned_at)) = call.await {
                ok += u64::from(value == expected);
                first_return = first_return.min(returned_at);
                last_return = last_return.max(returned_at);
            }
        }
        println!("OK {ok}");
        println!("FIRST_RETURN {first_return}");
        println!("LAST_RETURN {last_return}");
        println!("WALL_MS {}", started.elapsed().as_millis());
    });
    true
}

fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// The child's stdout once it exits, or an error (and the child killed) past `limit`.
fn wait_bounded(mut child: std::process::Child, limit: Duration) -> Result<Vec<u8>, String> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            let mut output = Vec::new();
            if let Some(mut stdout) = child.stdout.take() {
                std::io::Read::read_to_end(&mut stdout, &mut output).map_err(|e| e.to_string())?;
            }
            return if status.success() {
                Ok(output)
            } else {
                Err(format!("a process failed: {status}"))
            };
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            return Err(format!("a process did not finish within {limit:?}"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

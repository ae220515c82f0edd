//! Real OS processes sharing one real Redis Cluster (3 masters with a replica each, on
//! loopback), started once for this file and shared by its scenarios.
//!
//! Like `multi_process.rs`, this file is its own harness (`harness = false`): run by `cargo
//! test`, it runs each scenario, starting copies of itself as the processes; a copy started
//! with `MPC_ROLE` set plays one process. The processes find the cluster the way a service
//! does: `STAMPEDE_REDIS_URL`, here the comma-separated list of every node's URL. Figures are
//! printed as it goes.

mod common;

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::processes::{self, Lines, Process, check, finish};
use stampede::{RedisConfig, cached};
use stampede_test_support::redis_cluster::{Cluster, Options};

const ROLE: &str = "MPC_ROLE";
type Scenario = fn(&Cluster) -> Result<(), String>;
/// Every wait of the parent on its children.
const WAIT: Duration = Duration::from_secs(60);
/// Cold keys per stampede, and concurrent callers of each key in each process.
const KEYS: u64 = 30;
const CALLERS: u64 = 25;
const PROCESSES: usize = 4;

fn main() {
    if let Ok(role) = std::env::var(ROLE) {
        child(&role);
        return;
    }
    let cluster = Cluster::start(Options::masters(3).replicas(1));
    println!(
        "cluster of 6 nodes up (cluster_state:ok on every node) in {:.1}s",
        cluster.ready_in.as_secs_f64()
    );
    let scenarios: [(&str, Scenario); 3] = [
        (
            "cold stampede: 4 processes x 25 callers x 30 keys over every master, 30 loads",
            cold_stampede,
        ),
        (
            "an invalidation in one process drops the key from another's memory",
            invalidation_across_processes,
        ),
        (
            "a master SIGKILLed while 2 processes call: no call fails; then 30 loads again",
            master_killed,
        ),
    ];
    let failed = processes::run_scenarios(scenarios, |scenario| scenario(&cluster));
    drop(cluster);
    if failed > 0 {
        std::process::exit(1);
    }
}

// ---- the processes -------------------------------------------------------------------------

/// Loads in this process.
static LOADED_HERE: AtomicU64 = AtomicU64::new(0);

/// What a call that failed got: the cache's own error.
#[derive(Clone, Debug, PartialEq)]
struct Failed(String);

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<stampede::Error> for Failed {
    fn from(error: stampede::Error) -> Self {
        Failed(error.to_string())
    }
}

/// A cold key: each load takes 200 ms and says so on stdout.
#[cached(ttl = "60s", lock = "redis", name = "mpc::storm")]
async fn storm(key: u64) -> Result<u64, Failed> {
    LOADED_HERE.fetch_add(1, SeqCst);
    println!("LOADED {key}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(key * 10)
}

/// Every load's value is new (its process and its count in that process).
#[cached(ttl = "60s", lock = "redis", name = "mpc::inval")]
async fn profile(id: u64) -> String {
    let n = LOADED_HERE.fetch_add(1, SeqCst) + 1;
    format!("profile {id} from process {} load {n}", std::process::id())
}

fn child(role: &str) {
    // The cluster as a service finds it: STAMPEDE_REDIS_URL, a list of nodes here.
    let config = RedisConfig::from_env().expect("STAMPEDE_REDIS_URL");
    let config = match role {
        // While a master is down, calls for its slots load here instead of waiting long.
        "loop" => config
            .op_timeout(Duration::from_millis(300))
            .connect_timeout(Duration::from_secs(1)),
        // Generous bounds: 4 processes on 2 loaded cores must not turn slow answers into loads.
        _ => config
            .op_timeout(Duration::from_secs(5))
            .connect_timeout(Duration::from_secs(5)),
    };
    config.install();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        match role {
            "storm" => {
                let base: u64 = env("MPC_BASE");
                tokio::time::sleep(Duration::from_millis(
                    env::<u64>("MPC_START_AT").saturating_sub(unix_ms()),
                ))
                .await;
                let calls: Vec<_> = (base..base + KEYS)
                    .flat_map(|key| {
                        (0..CALLERS)
                            .map(move |_| tokio::spawn(async move { (key, storm(key).await) }))
                    })
                    .collect();
                let mut ok = 0;
                for call in calls {
                    let (key, value) = call.await.unwrap();
                    ok += u64::from(value == Ok(key * 10));
                }
                println!("OK {ok}");
            }
            "loop" => {
                // Fresh keys, each asked once (every call goes to Redis), until told to stop.
                let base: u64 = env("MPC_BASE");
                let stop = std::path::PathBuf::from(env::<String>("MPC_STOP"));
                let (mut calls, mut failed) = (0_u64, 0_u64);
                let mut key = base;
                while !stop.exists() {
                    key += 1;
                    match storm(key).await {
                        Ok(value) if value == key * 10 => {}
                        other => {
                            failed += 1;
                            println!("FAILED {key} {other:?}");
                        }
                    }
                    calls += 1;
                    if calls == 1 {
                        println!("LOOPING");
                    }
                }
                println!("CALLS {calls} FAILED {failed}");
            }
            "reader" => {
                // Reads the key into memory, then watches its memory until the key is dropped.
                let first = profile(1).await;
                println!("READ {first}");
                while stampede::stats("mpc::inval").is_some_and(|stats| stats.entries > 0) {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                println!("DROPPED {}", unix_micros());
                // Past the bound, this process must not serve the old value from memory.
                println!("AFTER {}", profile(1).await);
            }
            "invalidator" => {
                println!("READ {}", profile(1).await);
                println!("INVALIDATING {}", unix_micros());
                stampede::invalidate("mpc::inval", (1_u64,))
                    .await
                    .expect("invalidated");
                println!("INVALIDATED {}", unix_micros());
            }
            other => panic!("unknown role {other}"),
        }
    });
}

fn env<T: std::str::FromStr>(name: &str) -> T {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("{name} is not set"))
}

// ---- the parent's side ---------------------------------------------------------------------

/// Starts `count` processes in `role` on the cluster, which they find as a service does:
/// `STAMPEDE_REDIS_URL`, the list of every node.
fn start(
    role: &str,
    count: usize,
    cluster: &Cluster,
    env: &[(&str, String)],
) -> Result<(Vec<Process>, Lines), String> {
    let mut all = vec![
        (ROLE, role.to_owned()),
        (stampede::REDIS_URL_VAR, cluster.urls()),
    ];
    all.extend(env.iter().cloned());
    processes::start(count, &all)
}

/// The next line starting with `prefix`, within [`WAIT`]; other lines are returned too.
fn next_line(
    lines: &Lines,
    prefix: &str,
    seen: &mut Vec<(usize, String)>,
) -> Result<(usize, String), String> {
    let deadline = Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let (index, line) = lines
            .recv_timeout(left)
            .map_err(|_| format!("no process printed {prefix} within {WAIT:?}"))?;
        if line.starts_with(prefix) {
            return Ok((index, line));
        }
        seen.push((index, line));
    }
}

/// Runs a cold stampede of 4 processes on the keys `base..base + KEYS`; returns the loads in
/// all processes together and the values per master.
fn stampede_of_four(cluster: &Cluster, base: u64) -> Result<(usize, Vec<(u16, usize)>), String> {
    let start_at = unix_ms() + 1_500; // time for every process to start and connect
    let (mut processes, lines) = start(
        "storm",
        PROCESSES,
        cluster,
        &[
            ("MPC_BASE", base.to_string()),
            ("MPC_START_AT", start_at.to_string()),
        ],
    )?;
    finish(&mut processes, WAIT)?;
    let lines: Vec<String> = lines.try_iter().map(|(_, line)| line).collect();
    let loads = lines
        .iter()
        .filter(|line| line.starts_with("LOADED"))
        .count();
    let ok: u64 = lines
        .iter()
        .filter_map(|line| line.strip_prefix("OK ")?.parse::<u64>().ok())
        .sum();
    let calls = PROCESSES as u64 * KEYS * CALLERS;
    check(ok == calls, || {
        format!("{ok} calls of {calls} got the value")
    })?;
    let per_master = cluster
        .masters()
        .into_iter()
        .map(|port| {
            let values = (base..base + KEYS)
                .filter(|key| {
                    !cluster
                        .command::<Vec<String>>(
                            port,
                            &["KEYS", &format!("stampede:{{mpc::storm~*|{key}}}:v")],
                        )
                        .is_empty()
                })
                .count();
            (port, values)
        })
        .collect();
    Ok((loads, per_master))
}

fn cold_stampede(cluster: &Cluster) -> Result<(), String> {
    let started = Instant::now();
    let (loads, per_master) = stampede_of_four(cluster, 1_000)?;
    println!(
        "  {PROCESSES} processes x {CALLERS} callers x {KEYS} keys: {loads} loads in total; values \
         per master {per_master:?}; {:.1}s with the processes' start",
        started.elapsed().as_secs_f64()
    );
    check(loads == KEYS as usize, || {
        format!("{loads} loads ran, expected {KEYS}")
    })?;
    check(
        per_master.len() == 3 && per_master.iter().all(|(_, values)| *values > 0),
        || format!("the keys did not spread over every master: {per_master:?}"),
    )?;
    check(
        per_master.iter().map(|(_, values)| values).sum::<usize>() == KEYS as usize,
        || format!("values in the cluster: {per_master:?}"),
    )
}

fn invalidation_across_processes(cluster: &Cluster) -> Result<(), String> {
    let (mut reader, reader_lines) = start("reader", 1, cluster, &[])?;
    let mut seen = Vec::new();
    let (_, read) = next_line(&reader_lines, "READ ", &mut seen)?;
    let (mut invalidator, invalidator_lines) = start("invalidator", 1, cluster, &[])?;
    finish(&mut invalidator, WAIT)?;
    finish(&mut reader, WAIT)?;
    let lines: Vec<String> = invalidator_lines.try_iter().map(|(_, line)| line).collect();
    let field = |lines: &[String], prefix: &str| -> Option<String> {
        lines
            .iter()
            .find_map(|line| line.strip_prefix(prefix).map(str::to_owned))
    };
    let other_read = field(&lines, "READ ").ok_or("the invalidator read nothing")?;
    let invalidating: u64 = field(&lines, "INVALIDATING ")
        .and_then(|at| at.parse().ok())
        .ok_or("the invalidator did not invalidate")?;
    let reader_lines: Vec<String> = reader_lines.try_iter().map(|(_, line)| line).collect();
    let dropped: u64 = field(&reader_lines, "DROPPED ")
        .and_then(|at| at.parse().ok())
        .ok_or("the reader's memory kept the key")?;
    let after = field(&reader_lines, "AFTER ").ok_or("the reader did not read again")?;
    let read = read.trim_start_matches("READ ").to_owned();
    println!(
        "  the reader's memory dropped the key {:.2}ms after the other process began to \
         invalidate it (the documented bound for a missed one: 2 x heartbeat + op_timeout)",
        dropped.saturating_sub(invalidating) as f64 / 1_000.0
    );
    check(other_read == read, || {
        format!("the invalidator read {other_read:?}, not the reader's {read:?}")
    })?;
    check(after != read, || {
        format!("the reader served the invalidated value again: {after:?}")
    })
}

fn master_killed(cluster: &Cluster) -> Result<(), String> {
    let stop = std::env::temp_dir().join(format!("stampede-mpc-stop-{}", std::process::id()));
    let _ = std::fs::remove_file(&stop);
    let stop_path = stop.display().to_string();
    let (mut loopers, lines) = (0..2).try_fold(
        (Vec::new(), Vec::new()),
        |(mut all, mut receivers), index| {
            let (processes, received) = start(
                "loop",
                1,
                cluster,
                &[
                    ("MPC_BASE", (10_000_000 * (index + 1)).to_string()),
                    ("MPC_STOP", stop_path.clone()),
                ],
            )?;
            all.extend(processes);
            receivers.push(received);
            Ok::<_, String>((all, receivers))
        },
    )?;
    let mut seen = Vec::new();
    for received in &lines {
        next_line(received, "LOOPING", &mut seen)?;
    }
    std::thread::sleep(Duration::from_millis(300));
    let victim = cluster.masters()[1];
    let killed_at = Instant::now();
    cluster.kill(victim);
    let deadline = Instant::now() + WAIT;
    loop {
        let alive = cluster.ports();
        let masters = cluster.masters();
        let ok = alive.iter().all(|port| {
            cluster
                .command::<String>(*port, &["CLUSTER", "INFO"])
                .contains("cluster_state:ok")
        });
        if ok && masters.len() == 3 && !masters.contains(&victim) {
            break;
        }
        check(Instant::now() < deadline, || {
            let nodes: String = cluster.command(cluster.ports()[0], &["CLUSTER", "NODES"]);
            format!(
                "no failover within {WAIT:?} of {victim}: masters {masters:?}, ok {ok}\n{nodes}"
            )
        })?;
        std::thread::sleep(Duration::from_millis(50));
    }
    let failed_over_in = killed_at.elapsed();
    std::thread::sleep(Duration::from_millis(500));
    std::fs::write(&stop, b"").map_err(|e| e.to_string())?;
    let finished = finish(&mut loopers, WAIT);
    let _ = std::fs::remove_file(&stop);
    finished?;
    let mut calls = 0;
    let mut failures = Vec::new();
    for received in &lines {
        for (_, line) in received.try_iter() {
            if let Some(rest) = line.strip_prefix("CALLS ") {
                let mut words = rest.split(' ');
                calls += words
                    .next()
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or(0);
                if words.nth(1) != Some("0") {
                    failures.push(line.clone());
                }
            } else if line.starts_with("FAILED") {
                failures.push(line);
            }
        }
    }
    let (loads, per_master) = stampede_of_four(cluster, 2_000)?;
    println!(
        "  killed master {victim}: failed over in {:.1}s; {calls} calls in 2 processes \
         meanwhile, failures: {failures:?}; then 4 new processes' cold stampede: {loads} loads, \
         values per master {per_master:?}",
        failed_over_in.as_secs_f64()
    );
    check(calls > 0 && failures.is_empty(), || {
        format!("calls failed: {failures:?}")
    })?;
    check(loads == KEYS as usize, || {
        format!("{loads} loads after the failover, expected {KEYS}")
    })
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

//! Real OS processes sharing one real Redis.
//!
//! This file is its own harness (`harness = false` in Cargo.toml): run by `cargo test`, it runs
//! each scenario, starting copies of itself as the processes; a copy started with
//! `STAMPEDE_CHILD` set plays one process of a scenario. Figures are printed as it goes.

mod common;

use common::processes::{self, Lines, Process, check, finish};

use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::redis_server::RedisServer;
use stampede::{RedisConfig, cached};
use stampede_examples::multi_instance;

const ROLE: &str = "STAMPEDE_CHILD";
type Scenario = fn() -> Result<(), String>;
/// Every wait of the parent on its children.
const WAIT: Duration = Duration::from_secs(60);

fn main() {
    if multi_instance::child_if_asked() {
        return;
    }
    if let Ok(role) = std::env::var(ROLE) {
        child(&role);
        return;
    }
    let scenarios: [(&str, Scenario); 5] = [
        (
            "cold key: 4 processes x 100 callers, one load",
            cold_key_four_processes,
        ),
        (
            "the lock holder is killed mid-load: one more load",
            holder_killed_mid_load,
        ),
        (
            "stale value across processes: served at once, one refresh",
            stale_across_processes,
        ),
        (
            "a holder paused past its lease (SIGSTOP) never overwrites the newer value",
            paused_holder_is_fenced,
        ),
        (
            "a process that never called the functions invalidates a tag, a key, and primes",
            handle_and_tags_across_processes,
        ),
    ];
    let failed = processes::run_scenarios(scenarios, |scenario| scenario());
    if failed > 0 {
        std::process::exit(1);
    }
}

fn cold_key_four_processes() -> Result<(), String> {
    let server = RedisServer::start();
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let report = multi_instance::run(&exe, &server.url(), 4, 100)?;
    let delays: Vec<String> = report
        .release_delays
        .iter()
        .map(|d| format!("{:.2}ms", d.as_secs_f64() * 1_000.0))
        .collect();
    println!(
        "  loads in total: {}; calls that got the value: {} of 400; waiters in the 3 other processes released {} after the fill",
        report.loads,
        report.calls_ok,
        delays.join(", ")
    );
    check(report.loads == 1, || format!("{} loads ran", report.loads))?;
    check(report.calls_ok == 400, || {
        format!("{} calls of 400 got the value", report.calls_ok)
    })?;
    check(report.release_delays.len() == 3, || {
        "three processes should have waited".into()
    })?;
    // The lease is 5 s and a waiter would otherwise wake when it runs out: a release well within
    // it shows the publication woke them.
    let slowest = report
        .release_delays
        .iter()
        .max()
        .copied()
        .unwrap_or_default();
    check(slowest < Duration::from_millis(500), || {
        format!("a process was released {slowest:?} after the fill")
    })
}

// ---- the processes of the other scenarios -------------------------------------------------

/// The loads of a scenario across its processes, counted in Redis.
const LOADS: &str = "mp:loads";

async fn count_load() -> i64 {
    command(&["INCR", LOADS]).await.expect("INCR failed")
}

/// One command on the scenario's Redis, outside stampede.
async fn command<T: redis::FromRedisValue>(args: &[&str]) -> redis::RedisResult<T> {
    let url = std::env::var("MP_REDIS").unwrap_or_default();
    let client = redis::Client::open(url).expect("bad MP_REDIS");
    let mut connection = client
        .get_multiplexed_async_connection()
        .await
        .expect("no Redis");
    redis::cmd(args[0])
        .arg(&args[1..])
        .query_async(&mut connection)
        .await
}

/// Two functions sharing a tag, and one without: the reader calls them, the writer never does.
#[cached(ttl = "60s", lock = "redis", name = "mp::price", tags = ["mp-product:{id}"])]
async fn price(id: u64) -> String {
    format!("price {id} v{}", count_load().await)
}

#[cached(ttl = "60s", lock = "redis", name = "mp::label", tags = ["mp-product:{id}"])]
async fn label(id: u64) -> String {
    format!("label {id} v{}", count_load().await)
}

#[cached(ttl = "60s", lock = "redis", name = "mp::plain")]
async fn plain(id: u64) -> String {
    format!("plain {id} v{}", count_load().await)
}

/// What the reader holds: the values of its calls.
async fn reader_values() -> String {
    format!(
        "{} | {} | {} | {} | {}",
        price(1).await,
        label(1).await,
        plain(1).await,
        price(2).await,
        plain(2).await
    )
}

/// The first load hangs (its process gets killed); the next one is quick.
#[cached(ttl = "60s", lock = "redis", name = "mp::killed")]
async fn orders(customer: u64) -> String {
    let n = count_load().await;
    println!("LOADING {n}");
    let hang = if n == 1 {
        Duration::from_secs(30)
    } else {
        Duration::from_millis(100)
    };
    tokio::time::sleep(hang).await;
    format!("orders of {customer}, load {n}")
}

/// Fresh for 1 s, then stale for 30 s; each load takes 500 ms.
#[cached(
    ttl = "1s",
    jitter = 0,
    stale = "30s",
    lock = "redis",
    name = "mp::stale"
)]
async fn quote(symbol: u64) -> String {
    let n = count_load().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    format!("quote {symbol} v{n}")
}

/// The first load is slow enough for the parent to stop its process mid-load; the next is quick.
#[cached(ttl = "60s", lock = "redis", name = "mp::fenced")]
async fn balance(account: u64) -> String {
    let n = count_load().await;
    println!("LOADING {n}");
    let took = if n == 1 { 500 } else { 50 };
    tokio::time::sleep(Duration::from_millis(took)).await;
    format!("balance of {account} v{n}")
}

fn child(role: &str) {
    let url = std::env::var("MP_REDIS").expect("MP_REDIS is not set");
    RedisConfig::new(&url)
        .expect("bad URL")
        .lease(Duration::from_millis(1_000))
        .install();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        match role {
            "killed" => {
                let calls: Vec<_> = (0..25).map(|_| tokio::spawn(orders(1))).collect();
                for call in calls {
                    println!("VALUE {}", call.await.unwrap());
                }
            }
            "fill" => println!("VALUE {}", quote(1).await),
            "stale" => {
                let start_at: u64 = std::env::var("MP_START_AT").unwrap().parse().unwrap();
                tokio::time::sleep(Duration::from_millis(start_at.saturating_sub(unix_ms()))).await;
                let calls: Vec<_> = (0..50)
                    .map(|_| {
                        tokio::spawn(async {
                            let started = Instant::now();
                            let value = quote(1).await;
                            (value, started.elapsed())
                        })
                    })
                    .collect();
                for call in calls {
                    let (value, took) = call.await.unwrap();
                    println!("FIRST {} {value}", took.as_micros());
                }
                // The refresh ran meanwhile in one process; every process now has its value.
                tokio::time::sleep(Duration::from_millis(1_500)).await;
                println!("SECOND 0 {}", quote(1).await);
            }
            "paused" => {
                println!("VALUE {}", balance(1).await);
                // Its own load's value went to its caller only: Redis and memory hold the newer.
                println!("AFTER {}", balance(1).await);
            }
            "fenced" => println!("VALUE {}", balance(1).await),
            "reader" => {
                println!("BEFORE {}", reader_values().await);
                let waited = tokio::time::timeout(Duration::from_secs(30), async {
                    while command::<Option<String>>(&["GET", "mp:go"])
                        .await
                        .ok()
                        .flatten()
                        .is_none()
                    {
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                });
                waited.await.expect("the writer never said go");
                // The writer's invalidations arrive on the invalidation channel.
                let told = Instant::now();
                let dropped = tokio::time::timeout(Duration::from_secs(10), async {
                    while price::peek(1).is_some()
                        || label::peek(1).is_some()
                        || price::peek(2).is_some()
                    {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                });
                dropped
                    .await
                    .expect("the reader's memory kept invalidated values");
                println!("DROPPED {}", told.elapsed().as_micros());
                println!("AFTER {} | {}", reader_values().await, price(3).await);
            }
            "writer" => {
                // Never calls the functions: the companion, the tag and the dynamic form.
                stampede::invalidate_tag("mp-product:1")
                    .await
                    .expect("invalidate_tag");
                price::invalidate(2).await.expect("invalidate");
                stampede::invalidate("mp::plain", (2u64,))
                    .await
                    .expect("invalidate by name");
                price::prime(3, "primed".to_owned()).await.expect("prime");
                command::<()>(&["SET", "mp:go", "1"]).await.expect("SET");
            }
            other => panic!("unknown role {other}"),
        }
    });
}

// ---- the parent's side ---------------------------------------------------------------------

/// Starts `count` processes in `role`, on the scenario's Redis.
fn start(
    role: &str,
    count: usize,
    server: &RedisServer,
    env: &[(&str, String)],
) -> Result<(Vec<Process>, Lines), String> {
    let mut all = vec![(ROLE, role.to_owned()), ("MP_REDIS", server.url())];
    all.extend(env.iter().cloned());
    processes::start(count, &all)
}

fn loads(server: &RedisServer) -> i64 {
    server.command::<Option<i64>>(&["GET", LOADS]).unwrap_or(0)
}

fn holder_killed_mid_load() -> Result<(), String> {
    let server = RedisServer::start();
    let (mut processes, lines) = start("killed", 4, &server, &[])?;
    let holder = loop {
        match lines
            .recv_timeout(WAIT)
            .map_err(|_| "no process started loading".to_owned())?
        {
            (index, line) if line.starts_with("LOADING") => break index,
            _ => {}
        }
    };
    let killed_at = Instant::now();
    processes[holder].child.kill().map_err(|e| e.to_string())?;
    let _ = processes[holder].child.wait();
    let mut survivors: Vec<Process> = processes
        .drain(..)
        .enumerate()
        .filter(|(i, _)| *i != holder)
        .map(|(_, p)| p)
        .collect();
    finish(&mut survivors, WAIT)?;
    let recovered = killed_at.elapsed();
    let values: Vec<String> = lines
        .try_iter()
        .filter(|(_, l)| l.starts_with("VALUE"))
        .map(|(_, l)| l)
        .collect();
    println!(
        "  holder killed; the other 3 processes finished {:.0}ms later (lease 1000ms); loads in total: {}",
        recovered.as_secs_f64() * 1_000.0,
        loads(&server)
    );
    check(loads(&server) == 2, || {
        format!(
            "{} loads ran, expected the killed one and one more",
            loads(&server)
        )
    })?;
    check(values.len() == 75, || {
        format!("{} of 75 calls returned", values.len())
    })?;
    check(
        values.iter().all(|v| v == "VALUE orders of 1, load 2"),
        || format!("unexpected values: {values:?}"),
    )?;
    check(recovered < Duration::from_millis(3_000), || {
        format!("recovery took {recovered:?} with a 1s lease")
    })
}

fn stale_across_processes() -> Result<(), String> {
    let server = RedisServer::start();
    let (mut filler, _) = start("fill", 1, &server, &[])?;
    finish(&mut filler, WAIT)?;
    std::thread::sleep(Duration::from_millis(1_300)); // past the 1 s fresh time: stale in Redis

    let start_at = unix_ms() + 500;
    let (mut processes, lines) = start(
        "stale",
        4,
        &server,
        &[("MP_START_AT", start_at.to_string())],
    )?;
    finish(&mut processes, WAIT)?;
    let mut first = Vec::new();
    let mut second = Vec::new();
    for (_, line) in lines.try_iter() {
        let mut words = line.splitn(3, ' ');
        match (
            words.next(),
            words.next().and_then(|t| t.parse::<u64>().ok()),
            words.next(),
        ) {
            (Some("FIRST"), Some(micros), Some(value)) => {
                first.push((Duration::from_micros(micros), value.to_owned()))
            }
            (Some("SECOND"), _, Some(value)) => second.push(value.to_owned()),
            _ => {}
        }
    }
    let slowest = first
        .iter()
        .map(|(took, _)| *took)
        .max()
        .unwrap_or_default();
    println!(
        "  200 calls on a stale key in 4 processes: slowest {:.2}ms (a load takes 500ms); loads in total: {} (1 fill + refreshes)",
        slowest.as_secs_f64() * 1_000.0,
        loads(&server)
    );
    check(first.len() == 200, || {
        format!("{} of 200 first calls returned", first.len())
    })?;
    check(first.iter().all(|(_, v)| v == "quote 1 v1"), || {
        "a first call did not get the stale value".into()
    })?;
    check(slowest < Duration::from_millis(250), || {
        format!("a stale call waited {slowest:?}")
    })?;
    check(loads(&server) == 2, || {
        format!(
            "{} loads: expected the fill and exactly one refresh",
            loads(&server)
        )
    })?;
    check(
        second.len() == 4 && second.iter().all(|v| v == "quote 1 v2"),
        || format!("after the refresh: {second:?}"),
    )
}

/// Sends a signal to a process with `kill`, as an operator (or a stalled VM) would.
fn signal(process: &Process, signal: &str) -> Result<(), String> {
    let status = Command::new("kill")
        .args([signal, &process.child.id().to_string()])
        .status()
        .map_err(|e| format!("cannot run kill: {e}"))?;
    check(status.success(), || format!("kill {signal} failed"))
}

fn paused_holder_is_fenced() -> Result<(), String> {
    let server = RedisServer::start();
    let (mut paused, paused_lines) = start("paused", 1, &server, &[])?;
    match paused_lines.recv_timeout(WAIT) {
        Ok((_, line)) if line == "LOADING 1" => {}
        other => {
            return Err(format!(
                "the first process did not start loading: {other:?}"
            ));
        }
    }
    // Stopped mid-load: its watchdog stops too, and its 1 s lease runs out.
    signal(&paused[0], "-STOP")?;
    let (mut fenced, fenced_lines) = start("fenced", 1, &server, &[])?;
    let finished = finish(&mut fenced, WAIT);
    signal(&paused[0], "-CONT")?;
    finished?;
    finish(&mut paused, WAIT)?;
    let newer: Vec<String> = fenced_lines.try_iter().map(|(_, l)| l).collect();
    let older: Vec<String> = paused_lines.try_iter().map(|(_, l)| l).collect();
    let key = server
        .key("stampede:{mp::fenced~*|1}:v")
        .ok_or("no value in Redis")?;
    let stored: Vec<u8> = server.command(&["GET", &key]);
    let stored = String::from_utf8_lossy(&stored).into_owned();
    println!(
        "  second process: {newer:?}; the paused one, resumed: {older:?}; Redis holds {:?}",
        stored.rsplit('\n').next().unwrap_or_default()
    );
    check(newer.contains(&"VALUE balance of 1 v2".to_owned()), || {
        format!("the second process did not load v2: {newer:?}")
    })?;
    check(stored.ends_with("balance of 1 v2"), || {
        format!("the paused holder overwrote the newer value: {stored:?}")
    })?;
    check(older.contains(&"AFTER balance of 1 v2".to_owned()), || {
        format!("the resumed process kept its older value: {older:?}")
    })
}

fn handle_and_tags_across_processes() -> Result<(), String> {
    let server = RedisServer::start();
    let (mut reader, reader_lines) = start("reader", 1, &server, &[])?;
    let before = match reader_lines.recv_timeout(WAIT) {
        Ok((_, line)) if line.starts_with("BEFORE ") => line["BEFORE ".len()..].to_owned(),
        other => return Err(format!("the reader did not start: {other:?}")),
    };
    let loads_before = loads(&server);
    let (mut writer, _) = start("writer", 1, &server, &[])?;
    finish(&mut writer, WAIT)?;
    finish(&mut reader, WAIT)?;
    let lines: Vec<String> = reader_lines.try_iter().map(|(_, l)| l).collect();
    let dropped_after = lines
        .iter()
        .find_map(|l| l.strip_prefix("DROPPED "))
        .and_then(|micros| micros.parse::<u64>().ok())
        .ok_or_else(|| format!("the reader never dropped its copies: {lines:?}"))?;
    let after = lines
        .iter()
        .find_map(|l| l.strip_prefix("AFTER "))
        .ok_or_else(|| format!("no AFTER line: {lines:?}"))?;
    println!(
        "  reader before: {before}\n  reader after:  {after}\n  the reader's memory dropped the tag's and the key's values {:.2}ms after the writer's go; loads: {loads_before} before, {} after",
        dropped_after as f64 / 1_000.0,
        loads(&server)
    );
    check(
        before == "price 1 v1 | label 1 v2 | plain 1 v3 | price 2 v4 | plain 2 v5",
        || format!("unexpected first values: {before}"),
    )?;
    // The tag's two entries and the keys invalidated (through the companion, and by name)
    // reload; the untagged one stays; the primed value is read from Redis without a load.
    check(
        after == "price 1 v6 | label 1 v7 | plain 1 v3 | price 2 v8 | plain 2 v9 | primed",
        || format!("unexpected values after: {after}"),
    )?;
    check(loads(&server) == 9, || format!("{} loads", loads(&server)))
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

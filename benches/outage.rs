//! What Redis faults cost the database and the callers (issue 36): three instances of a
//! service (three caches of one name, each with its own memory and its own Redis connection,
//! as the tests' "processes" are) serve 1,000 requests a second over 100 keys
//! (`ttl = "10s"`, `lock = "redis"`, a 2 ms query). Two faults: redis-server killed for 7 s,
//! then started again, empty; and a 3 s `CLIENT PAUSE`. Per second: the source's queries,
//! the requests, the p99; and the requests slower than 1 s. Side by side in one run: the
//! default (while its feed is down a process trusts what it loads for the staleness bound,
//! 2.25 s) and `RedisConfig::trust_while_deaf(30 s)`.
//!
//! Needs `redis-server` on `PATH` (it starts its own, on a free loopback port, to kill it).
//! Run: `cargo bench -p stampede-benches --bench outage` (about 90 s).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use stampede_test_support::redis_server::{Options, RedisServer};

const KEYS: u64 = 100;
const RATE: u32 = 1_000;
/// When the fault begins, and when it ends (Redis started again, or the pause over), from the
/// start of the measured run.
const FAULT: Duration = Duration::from_secs(3);
const KILLED_FOR: Duration = Duration::from_secs(7);
const PAUSED_FOR: Duration = Duration::from_secs(3);
const RUN: Duration = Duration::from_secs(18);
/// A request slower than this is a stall.
const STALL: Duration = Duration::from_secs(1);

/// The fault of a run.
#[derive(Clone, Copy)]
enum Fault {
    /// redis-server killed, then started again empty.
    Kill,
    /// `CLIENT PAUSE` of every client.
    Pause,
}

impl Fault {
    fn lasts(self) -> Duration {
        match self {
            Fault::Kill => KILLED_FOR,
            Fault::Pause => PAUSED_FOR,
        }
    }
}
const QUERY: Duration = Duration::from_millis(2);

static QUERIES: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

async fn query(contender: usize, id: u64) -> String {
    QUERIES[contender].fetch_add(1, Relaxed);
    tokio::time::sleep(QUERY).await;
    format!("product {id}")
}

/// The three instances of a contender: `$name`, one cache name, connections `$prefix0..2`.
macro_rules! instances {
    ($module:ident, $contender:literal, $name:literal, $c0:literal, $c1:literal, $c2:literal) => {
        mod $module {
            #[stampede::cached(ttl = "10s", lock = "redis", redis = $c0, name = $name)]
            pub async fn i0(id: u64) -> String {
                super::query($contender, id).await
            }
            #[stampede::cached(ttl = "10s", lock = "redis", redis = $c1, name = $name)]
            pub async fn i1(id: u64) -> String {
                super::query($contender, id).await
            }
            #[stampede::cached(ttl = "10s", lock = "redis", redis = $c2, name = $name)]
            pub async fn i2(id: u64) -> String {
                super::query($contender, id).await
            }

            /// A request to instance `instance`.
            pub async fn call(instance: usize, id: u64) -> String {
                match instance {
                    0 => i0(id).await,
                    1 => i1(id).await,
                    _ => i2(id).await,
                }
            }
        }
    };
}

instances!(
    plain,
    0,
    "outage::default",
    "default0",
    "default1",
    "default2"
);
instances!(deaf, 1, "outage::deaf", "deaf0", "deaf1", "deaf2");

/// One second of a run: queries, requests, latencies and stalls.
struct Second {
    queries: u64,
    requests: u64,
    latency: Histogram<u64>,
    stalls: u64,
}

async fn call(contender: usize, instance: usize, id: u64) -> String {
    match contender {
        0 => plain::call(instance, id).await,
        _ => deaf::call(instance, id).await,
    }
}

/// Runs one contender: a cold start, then `RUN` at `RATE`, with `fault` from `FAULT` for its
/// time; returns each second's figures.
async fn run(contender: usize, fault: Fault, server: &mut RedisServer) -> Vec<Second> {
    for id in 0..KEYS {
        for instance in 0..3 {
            call(contender, instance, id).await;
        }
    }
    let seconds: Vec<Mutex<Second>> = (0..RUN.as_secs())
        .map(|_| {
            Mutex::new(Second {
                queries: 0,
                requests: 0,
                latency: Histogram::new(3).expect("a histogram"),
                stalls: 0,
            })
        })
        .collect();
    let seconds = Arc::new(seconds);
    let start = Instant::now();
    let mut ticks = tokio::time::interval(Duration::from_secs(1) / RATE);
    let (mut began, mut ended, mut request) = (false, false, 0u64);
    let mut queries_before = QUERIES[contender].load(Relaxed);
    let mut second = 0;
    while start.elapsed() < RUN {
        ticks.tick().await;
        let now = start.elapsed();
        if now.as_secs() as usize > second {
            let queries = QUERIES[contender].load(Relaxed);
            seconds[second].lock().unwrap().queries = queries - queries_before;
            (queries_before, second) = (queries, now.as_secs() as usize);
        }
        if !began && now >= FAULT {
            match fault {
                Fault::Kill => server.kill(),
                Fault::Pause => {
                    let millis = PAUSED_FOR.as_millis().to_string();
                    let () = server.command(&["CLIENT", "PAUSE", &millis, "ALL"]);
                }
            }
            began = true;
        }
        if !ended && now >= FAULT + fault.lasts() {
            if let Fault::Kill = fault {
                server.restart();
            }
            ended = true;
        }
        request += 1;
        let (seconds, id) = (seconds.clone(), request * 7919 % KEYS);
        tokio::spawn(async move {
            let began = Instant::now();
            let value = call(contender, (request % 3) as usize, id).await;
            let took = began.elapsed();
            assert_eq!(value, format!("product {id}"));
            if let Some(second) = seconds.get((began - start).as_secs() as usize) {
                let mut second = second.lock().unwrap();
                second.requests += 1;
                second.stalls += u64::from(took > STALL);
                let _ = second.latency.record(took.as_micros() as u64);
            }
        });
    }
    if let Some(last) = seconds.get(second) {
        last.lock().unwrap().queries = QUERIES[contender].load(Relaxed) - queries_before;
    }
    // The slowest request of the last second may wait for a lease (5 s) at most.
    tokio::time::sleep(Duration::from_secs(6)).await;
    Arc::into_inner(seconds)
        .expect("every request ended")
        .into_iter()
        .map(|second| second.into_inner().unwrap())
        .collect()
}

fn install(server: &RedisServer, connection: &str, deaf: Option<Duration>) {
    let mut config = stampede::RedisConfig::new(&server.url())
        .expect("a Redis URL")
        .prefix("outage");
    if let Some(trust) = deaf {
        config = config.trust_while_deaf(trust);
    }
    config.install_as(connection);
}

fn main() {
    let mut server = match RedisServer::try_start_with(Options::default()) {
        Ok(server) => server,
        Err(why) => {
            eprintln!("no redis-server: {why}");
            return;
        }
    };
    for i in 0..3 {
        install(&server, &format!("default{i}"), None);
        install(&server, &format!("deaf{i}"), Some(Duration::from_secs(30)));
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    for fault in [Fault::Kill, Fault::Pause] {
        let runs: Vec<Vec<Second>> = (0..2)
            .map(|contender| rt.block_on(run(contender, fault, &mut server)))
            .collect();
        report(fault, &runs);
    }
}

/// Prints the runs of the two contenders under `fault`, second by second, then in sum.
fn report(fault: Fault, runs: &[Vec<Second>]) {
    let names = ["default (bound 2.25 s)", "trust_while_deaf(30 s)"];
    let what = match fault {
        Fault::Kill => "redis-server killed, then started again empty",
        Fault::Pause => "CLIENT PAUSE ALL",
    };
    println!(
        "\n{what} at {FAULT:?} for {:?}: 3 instances, {RATE} requests/s, {KEYS} keys, ttl 10s, \
         lock = \"redis\", a {QUERY:?} query",
        fault.lasts()
    );
    println!("queries per second (requests, p99 ms, requests over {STALL:?}):");
    print!("{:>6}", "second");
    for name in names {
        print!(" | {name:>36}");
    }
    println!();
    for s in 0..RUN.as_secs() as usize {
        print!("{s:>6}");
        for run in runs {
            let second = &run[s];
            let p99 = second.latency.value_at_quantile(0.99) as f64 / 1_000.0;
            print!(
                " | {:>10} ({:>5}, {:>8.1}, {:>4})",
                second.queries, second.requests, p99, second.stalls
            );
        }
        println!();
    }
    let (from, to) = (
        FAULT.as_secs() as usize,
        (FAULT + fault.lasts()).as_secs() as usize,
    );
    for (name, run) in names.iter().zip(runs) {
        let during: u64 = run[from..to].iter().map(|s| s.queries).sum();
        let after: u64 = run[to..].iter().map(|s| s.queries).sum();
        let stalls: u64 = run.iter().map(|s| s.stalls).sum();
        let slowest = run.iter().map(|s| s.latency.max()).max().unwrap_or(0) as f64 / 1e3;
        println!(
            "{name}: {during} queries in the fault's {} s ({:.0}/s), {after} in the {} s after \
             it; {stalls} requests over {STALL:?}, the slowest {slowest:.1} ms",
            to - from,
            during as f64 / (to - from) as f64,
            run.len() - to
        );
    }
}

//! The simulation's oracle (`tests/sim/oracle.rs`) against a real `redis-server`: a shorter
//! randomized run in real time, where the simulation runs on a fake shared tier and a paused
//! clock.
//!
//! Three caches of one name stand for three processes: each has its own memory and its own
//! connection, through a fault proxy of its own, to one `redis-server`. Clients call, write the
//! source and invalidate, write and prime, and peek, at random, while faults come: a process's
//! link delayed, blackholed (its feed and commands lost until it reconnects) or cut, and the
//! server restarted empty. Every returned value is checked by the oracle: its own key's, not
//! older than an invalidation that completed before the call began (in another process, once
//! the feed's bound has passed), no older than its options allow, and, where the options order
//! values, never older than one an earlier call of that process returned. Loads' overlaps are
//! not checked here (real time gives a flight no epoch to tell a detached one by).
//!
//! `STAMPEDE_ORACLE_SEED=n` runs another seed; the seed is printed, with the trace of a failure
//! (`STAMPEDE_ORACLE_TRACE=path` writes the whole trace).

mod common;
mod sim;

use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use common::fault_proxy::FaultProxy;
use common::redis_server::RedisServer;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use serde::{Deserialize, Serialize};
use sim::oracle::{Effect, Oracle, Reach, Rules, Seen, Val};
use stampede::{RedisConfig, cached};

const PROCESSES: usize = 3;
const FUNCTIONS: u8 = 3;
const KEYS: u16 = 4;
const CLIENTS: usize = 6;
/// How long the clients run.
const RUN: Duration = Duration::from_secs(8);
/// An operation that takes longer hung.
const HANG: Duration = Duration::from_secs(10);
const HEARTBEAT: Duration = Duration::from_millis(100);
const OP_TIMEOUT: Duration = Duration::from_millis(100);
/// The longest delay a fault adds to a link, each way.
const MOST_DELAY: Duration = Duration::from_millis(120);
/// How late a loaded machine runs the runtime's timers and handles its replies. README, Redis:
/// a process serves a value at most the bound after an invalidation it missed, "plus however
/// late its runtime runs the timer that notices the silence (a starved runtime runs it late)";
/// and a value's deadlines read from Redis count from when its reply is handled.
const SCHEDULING: Duration = Duration::from_millis(500);

/// A value of the source: whose it is, the version it read, and when.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Loaded {
    function: u8,
    key: u16,
    version: u64,
    read_at_us: u64,
}

impl Loaded {
    fn val(&self) -> Val {
        Val {
            function: self.function,
            key: self.key,
            version: self.version,
            read_at: Duration::from_micros(self.read_at_us),
        }
    }
}

/// `source_version` of the versioned function.
pub fn version_of(value: &Loaded) -> u64 {
    value.version
}

static ORACLE: OnceLock<Arc<Oracle>> = OnceLock::new();
static RNG: Mutex<Option<SmallRng>> = Mutex::new(None);

fn random<T>(draw: impl FnOnce(&mut SmallRng) -> T) -> T {
    let mut rng = RNG.lock().unwrap();
    draw(rng.as_mut().expect("the run seeded the generator"))
}

fn oracle() -> &'static Oracle {
    ORACLE.get().expect("the run made the oracle")
}

/// The source: reads the key's version, then takes a few milliseconds, as a query would.
async fn load(function: u8, process: usize, key: u16) -> Loaded {
    let (version, read_at) = (oracle().version(function, key), oracle().now());
    let took = random(|rng| rng.random_range(2..LOAD_MOST.as_millis() as u64));
    tokio::time::sleep(Duration::from_millis(took)).await;
    oracle().note(format!(
        "p{process} loaded f{function} k{key}: v{version} read at {read_at:?}"
    ));
    Loaded {
        function,
        key,
        version,
        read_at_us: read_at.as_micros() as u64,
    }
}

/// The three functions of one process, on its own connection.
macro_rules! process {
    ($module:ident, $process:literal, $connection:literal) => {
        mod $module {
            use super::*;

            #[cached(name = "oracle::tiered", ttl = "400ms", stale = "300ms", lock = "redis", redis = $connection)]
            pub async fn tiered(key: u16) -> Loaded {
                load(0, $process, key).await
            }

            #[cached(name = "oracle::versioned", ttl = "300ms", jitter = 20, lock = "redis", redis = $connection, source_version = "version_of")]
            pub async fn versioned(key: u16) -> Loaded {
                load(1, $process, key).await
            }

            #[cached(name = "oracle::shared", ttl = "300ms", backend = "redis", redis = $connection)]
            pub async fn shared(key: u16) -> Loaded {
                load(2, $process, key).await
            }
        }
    };
}

process!(p0, 0, "oracle_p0");
process!(p1, 1, "oracle_p1");
process!(p2, 2, "oracle_p2");

/// Runs `$body` with `$function` naming function `$f` of process `$p` (and its companion).
macro_rules! on {
    ($f:expr, $p:expr, |$function:ident| $body:expr) => {
        match ($f, $p) {
            (0, 0) => {
                use p0::tiered as $function;
                $body
            }
            (0, 1) => {
                use p1::tiered as $function;
                $body
            }
            (0, _) => {
                use p2::tiered as $function;
                $body
            }
            (1, 0) => {
                use p0::versioned as $function;
                $body
            }
            (1, 1) => {
                use p1::versioned as $function;
                $body
            }
            (1, _) => {
                use p2::versioned as $function;
                $body
            }
            (_, 0) => {
                use p0::shared as $function;
                $body
            }
            (_, 1) => {
                use p1::shared as $function;
                $body
            }
            (_, _) => {
                use p2::shared as $function;
                $body
            }
        }
    };
}

/// The longest the source takes (see `load`).
const LOAD_MOST: Duration = Duration::from_millis(30);
/// The longest round trip of a Redis call that answers: its timeout, and a fault's delay each way.
const ROUND_TRIP: Duration = OP_TIMEOUT
    .saturating_add(MOST_DELAY)
    .saturating_add(MOST_DELAY);
/// What a value may age past its windows in real time: its load (read at the start, filled at
/// the end), the fill's round trip, the round trip of a read in another process (whose deadlines
/// count from the reply: README, Redis, the envelope's deadlines are "in the Redis server's
/// clock"), and how late a loaded machine handles replies (`SCHEDULING`).
const AGE_SLACK: Duration = LOAD_MOST
    .saturating_add(ROUND_TRIP)
    .saturating_add(ROUND_TRIP)
    .saturating_add(SCHEDULING);

/// What the oracle must know of each function: their options, the bounds of real time.
fn rules() -> Vec<Rules> {
    let rule = |ttl_and_stale: u64, unordered: bool| Rules {
        // The functions have no `stale`, `ttl_from` nor `fail_safe`: their ttl and stale are one.
        ttl: Duration::from_millis(ttl_and_stale),
        ttl_from: None,
        missing_ttl: None,
        jitter: 0,
        stale: Duration::ZERO,
        slack: AGE_SLACK,
        stalls: AGE_SLACK,
        fail_safe: None,
        retry_if: false,
        breaker: false,
        busy_error: false,
        shared: true,
        no_singleflight: false,
        // Redis only: a load fenced off by another's fill is kept nowhere (see the simulation).
        unordered,
        one_load_everywhere: false,
        lock_wait: Duration::MAX,
    };
    vec![rule(700, false), rule(360, false), rule(360, true)]
}

/// The operation's output, or `None` and a violation past [`HANG`].
async fn bounded<T>(what: &str, future: impl Future<Output = T>) -> Option<T> {
    match tokio::time::timeout(HANG, future).await {
        Ok(output) => Some(output),
        Err(_) => {
            oracle().violation(format!("{what} hung for {HANG:?}"));
            None
        }
    }
}

/// One client: random operations until the run ends.
async fn client(until: tokio::time::Instant) -> usize {
    let mut operations = 0;
    while tokio::time::Instant::now() < until {
        operations += 1;
        let (op, f, p, k) = random(|rng| {
            (
                rng.random_range(0..100u32),
                rng.random_range(0..FUNCTIONS),
                rng.random_range(0..PROCESSES),
                rng.random_range(0..KEYS),
            )
        });
        let oracle = oracle();
        match op {
            0..65 => {
                let call = oracle.call(f, p, k);
                if let Some(value) =
                    bounded("a call", async { on!(f, p, |function| function(k).await) }).await
                {
                    oracle.returned(&call, Ok(Seen::Value(&value.val())), "call");
                }
            }
            65..75 => {
                let call = oracle.call(f, p, k);
                let held = on!(f, p, |function| function::peek(k));
                let held = held.map(|held| held.val());
                let seen = held.as_ref().map_or(Seen::Nothing, Seen::Value);
                oracle.returned(&call, Ok(seen), "peek");
            }
            75..85 => {
                let version = oracle.write(f, k);
                let began = oracle.prime_begins();
                oracle.detaching(f, k);
                let done = bounded("an invalidation", async {
                    on!(f, p, |function| function::invalidate(k).await)
                })
                .await;
                oracle.detaching(f, k);
                match done {
                    Some(Ok(())) => {
                        oracle.invalidated_racing_primes(f, k, version, Reach::From(p), began)
                    }
                    // Redis did not answer: nothing is promised until it does.
                    Some(Err(error)) => {
                        oracle.note(format!("invalidation of f{f} k{k} in p{p}: {error}"))
                    }
                    None => {}
                }
            }
            85..93 => {
                let version = oracle.write(f, k);
                let began = oracle.prime_begins();
                oracle.detaching(f, k);
                let value = Loaded {
                    function: f,
                    key: k,
                    version,
                    read_at_us: oracle.now().as_micros() as u64,
                };
                oracle.prime_running(f, k, version);
                let done = bounded("a prime", async {
                    on!(f, p, |function| function::prime(k, value).await)
                })
                .await;
                match done {
                    Some(Ok(())) => {
                        oracle.primed(f, k, version, p, began);
                        oracle.prime_over(f, k, version);
                    }
                    // Its write may still land (sent before the timeout, delayed on the way)
                    // until the process drops the key once Redis answers again.
                    _ => {
                        tokio::spawn(async move {
                            tokio::time::sleep(oracle.bound).await;
                            oracle.prime_over(f, k, version);
                        });
                    }
                }
            }
            93..97 => {
                oracle.write(f, k);
            }
            _ => {
                let pause = random(|rng| rng.random_range(1..40));
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
        }
    }
    operations
}

/// Faults until the run ends, told to the oracle as they begin and end; the server restarted
/// once, mid-run.
async fn faults(
    proxies: Arc<Vec<FaultProxy>>,
    mut server: RedisServer,
    until: tokio::time::Instant,
) -> (RedisServer, usize) {
    let mut count = 0;
    let mut restarted = false;
    while tokio::time::Instant::now() < until {
        let (wait, kind, p, delay, lasts) = random(|rng| {
            (
                rng.random_range(200..700),
                rng.random_range(0..3u8),
                rng.random_range(0..PROCESSES),
                rng.random_range(10..=MOST_DELAY.as_millis() as u64),
                rng.random_range(200..1_000),
            )
        });
        tokio::time::sleep(Duration::from_millis(wait)).await;
        let lasts = Duration::from_millis(lasts);
        count += 1;
        let oracle = oracle();
        if !restarted && tokio::time::Instant::now() + RUN / 2 > until {
            restarted = true;
            oracle.fault(
                "the server restarts, empty".into(),
                true,
                Effect::Detaches,
                None,
            );
            tokio::task::block_in_place(|| server.restart());
            tokio::time::sleep(lasts).await;
            oracle.fault("the server restarted".into(), false, Effect::Detaches, None);
            continue;
        }
        let proxy = &proxies[p];
        let what = match kind {
            0 => {
                proxy.delay(Duration::from_millis(delay));
                format!("p{p}'s link delayed {delay}ms")
            }
            1 => {
                proxy.blackhole();
                format!("p{p}'s link blackholed")
            }
            _ => {
                proxy.cut();
                format!("p{p}'s link cut")
            }
        };
        oracle.fault(what.clone(), true, Effect::Detaches, None);
        tokio::time::sleep(lasts).await;
        proxy.pass();
        oracle.fault(format!("{what}: over"), false, Effect::Detaches, None);
    }
    (server, count)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_redis_under_faults_keeps_the_oracles_rules() {
    let seed = std::env::var("STAMPEDE_ORACLE_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or(20_261_202u64);
    *RNG.lock().unwrap() = Some(SmallRng::seed_from_u64(seed));
    // README, Redis: "at most `2 x heartbeat + op_timeout` ... after an invalidation it missed,
    // plus however late its runtime runs the timer that notices the silence"; "a delayed link
    // does not add to it" (the link delays of the faults are not added).
    let bound = HEARTBEAT * 2 + OP_TIMEOUT + SCHEDULING;
    assert!(ORACLE.set(Oracle::new(rules(), bound)).is_ok());

    let server = RedisServer::start();
    let proxies: Arc<Vec<FaultProxy>> = Arc::new(
        (0..PROCESSES)
            .map(|_| FaultProxy::start(server.port()))
            .collect(),
    );
    for (p, proxy) in proxies.iter().enumerate() {
        RedisConfig::new(&proxy.url())
            .unwrap()
            .prefix("oracle")
            .op_timeout(OP_TIMEOUT)
            .connect_timeout(OP_TIMEOUT * 3)
            .heartbeat(HEARTBEAT)
            .cooldown(Duration::from_millis(200), 2)
            .install_as(&format!("oracle_p{p}"));
    }

    let until = tokio::time::Instant::now() + RUN;
    let faults = tokio::spawn(faults(proxies.clone(), server, until));
    let clients: Vec<_> = (0..CLIENTS).map(|_| tokio::spawn(client(until))).collect();
    let mut operations = 0;
    for client in clients {
        operations += tokio::time::timeout(RUN + HANG, client)
            .await
            .expect("a client hung")
            .expect("a client panicked");
    }
    let (_server, faults) = tokio::time::timeout(RUN + HANG, faults)
        .await
        .expect("the faults hung")
        .expect("the faults panicked");

    if let Ok(path) = std::env::var("STAMPEDE_ORACLE_TRACE") {
        std::fs::write(path, oracle().whole_trace().join("\n")).unwrap();
    }
    let violations = oracle().violations();
    println!(
        "seed {seed}: {operations} operations by {CLIENTS} clients in 3 processes, {faults} faults (one a restart), {} violations",
        violations.len()
    );
    assert!(
        violations.is_empty(),
        "seed {seed} violates the oracle (replay: STAMPEDE_ORACLE_SEED={seed}):\n  - {}\nthe run's last steps:\n{}",
        violations.join("\n  - "),
        oracle().trace(80).join("\n")
    );
    assert!(operations > 1_000, "only {operations} operations ran");
}

//! The drivers: how calls are made in each scenario, and what is measured of them.
//!
//! Every run gets a fresh 2-worker tokio runtime (the machine's two cores), is bounded in time
//! (a run that overstays is aborted and marked), and measures each call from just before it is
//! made to just after it returns, into an HDR histogram. Before the clock starts, one call on a
//! key no scenario uses warms the contender on that runtime: its statics are built and, for
//! `lock = "redis"`, the runtime's Redis connections are open, as in a service that has run
//! for a while. Its load is not counted.

use std::future::Future;
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use hdrhistogram::Histogram;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use rand_distr::{Distribution, Zipf};
use tokio::runtime::Runtime;
use tokio::sync::Barrier;
use tokio::time::Instant;

use crate::contenders::{LOAD, Value};

/// Width of one step of the timeline.
pub const BUCKET: Duration = Duration::from_millis(10);
/// How long a run may go on past its calling time before it is aborted.
const GRACE: Duration = Duration::from_secs(20);
/// The key of the warming call: none of the scenarios' keys.
const WARM_KEY: u64 = u64::MAX;

/// What one contender did in one scenario.
pub struct Run {
    pub label: &'static str,
    /// Upstream loads during the run.
    pub loads: u64,
    /// Latency of every call, in nanoseconds.
    pub latency: Histogram<u64>,
    /// From the first call to the last return.
    pub wall: Duration,
    /// False when the run was aborted at its time bound; its figures then cover the calls that
    /// returned.
    pub finished: bool,
    /// The slowest call that started after the first call returned (the cold start).
    pub max_after_cold: Duration,
    /// The fewest loads that any cache with this TTL could have made for this run's calls.
    pub lower_bound: u64,
    /// The slowest call started in each [`BUCKET`] of the run, if any started.
    pub timeline: Vec<Option<Duration>>,
}

impl Run {
    pub fn calls(&self) -> u64 {
        self.latency.len()
    }
}

/// What a contender is to a driver: an async function from key to value.
pub trait Call: Fn(u64) -> Self::Fut + Copy + Send + Sync + 'static {
    type Fut: Future<Output = Value> + Send + 'static;
}

impl<F, Fut> Call for F
where
    F: Fn(u64) -> Fut + Copy + Send + Sync + 'static,
    Fut: Future<Output = Value> + Send + 'static,
{
    type Fut = Fut;
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a 2-worker tokio runtime")
}

/// One call on [`WARM_KEY`], bounded like a run.
fn warm<F: Call>(runtime: &Runtime, call: F) {
    let warmed =
        runtime.block_on(async { tokio::time::timeout(LOAD + GRACE, call(WARM_KEY)).await });
    if warmed.is_err() {
        eprintln!(
            "warning: the warming call did not return within {:?}",
            LOAD + GRACE
        );
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 1_000_000_000_000, 3).expect("valid histogram bounds")
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// `calls` concurrent calls on one cold key, released together by a barrier.
pub struct Cold {
    pub calls: usize,
}

impl Cold {
    pub fn run<F: Call>(&self, label: &'static str, loads: &AtomicU64, call: F) -> Run {
        let runtime = runtime();
        warm(&runtime, call);
        let loads_before = loads.load(Relaxed);
        let calls = self.calls;
        let (latencies, wall, finished) = runtime.block_on(async move {
            let start_line = Arc::new(Barrier::new(calls + 1));
            let tasks: Vec<_> = (0..calls)
                .map(|_| {
                    let start_line = start_line.clone();
                    tokio::spawn(async move {
                        start_line.wait().await;
                        let started = Instant::now();
                        black_box(call(0).await);
                        (started, Instant::now())
                    })
                })
                .collect();
            start_line.wait().await;
            let (calls, finished) = join_bounded(tasks, LOAD + GRACE).await;
            // From the first call made to the last call returned.
            let first = calls.iter().map(|(started, _)| *started).min();
            let last = calls.iter().map(|(_, returned)| *returned).max();
            let wall = first.zip(last).map_or(Duration::ZERO, |(f, l)| l - f);
            (calls, wall, finished)
        });
        runtime.shutdown_timeout(Duration::from_secs(1));
        let mut latency = histogram();
        for (started, returned) in latencies {
            latency.saturating_record(nanos(returned - started));
        }
        Run {
            label,
            loads: loads.load(Relaxed) - loads_before,
            max_after_cold: Duration::ZERO,
            lower_bound: 1,
            latency,
            wall,
            finished,
            timeline: Vec::new(),
        }
    }
}

/// Which keys a calling task asks for.
#[derive(Clone, Copy)]
pub enum Keys {
    /// Always the same key.
    One,
    /// Zipf-distributed ranks over `keys` keys with exponent `exponent`.
    Zipf { keys: u64, exponent: f64 },
}

/// `tasks` tasks calling in a loop for `duration`, each yielding to the runtime after every
/// call, so that a loop of hits never starves the timers and the loads.
pub struct Loop {
    pub tasks: usize,
    pub duration: Duration,
    pub keys: Keys,
    /// The TTL of the contenders, for the lower bound on loads.
    pub ttl: Duration,
}

/// What every task of a [`Loop`] run shares.
struct Shared {
    start: Instant,
    deadline: Instant,
    /// Nanoseconds from `start` to the first return of a call; `u64::MAX` before it.
    first_return: AtomicU64,
    /// Per key, the first millisecond (from `start`) that the loads counted so far for the lower
    /// bound do not cover; 0 before the key's first call.
    covered_until: Vec<AtomicU32>,
    /// How long one load covers a key: from its start until its value stops being fresh.
    window_ms: u32,
}

impl Shared {
    /// Whether a call on `key` at `at` needs a load of its own in the best case. One load
    /// covers the calls that arrive while it runs and while its value is fresh; scanning each
    /// key's calls in time order and opening a window at each uncovered call gives the fewest
    /// loads that can serve them all.
    fn needs_load(&self, key: u64, at: Instant) -> bool {
        let Some(cover) = self.covered_until.get(key as usize) else {
            return false;
        };
        let now_ms = u32::try_from(at.duration_since(self.start).as_millis()).unwrap_or(u32::MAX);
        let until = cover.load(Relaxed);
        now_ms >= until
            && cover
                .compare_exchange(until, now_ms + self.window_ms, Relaxed, Relaxed)
                .is_ok()
    }
}

/// What one calling task measured.
struct TaskLog {
    latency: Histogram<u64>,
    max_after_cold: u64,
    timeline: Vec<u64>,
    lower_bound: u64,
}

impl Loop {
    pub fn run<F: Call>(&self, label: &'static str, loads: &AtomicU64, call: F) -> Run {
        let runtime = runtime();
        warm(&runtime, call);
        let loads_before = loads.load(Relaxed);
        let buckets = ((self.duration + LOAD + GRACE).as_millis() / BUCKET.as_millis()) as usize;
        let key_space = match self.keys {
            Keys::One => 1,
            Keys::Zipf { keys, .. } => keys as usize,
        };
        let keys = self.keys;
        let tasks = self.tasks;
        let duration = self.duration;
        // A load takes 100 ms and up: tokio's timer rounds a sleep up to the next millisecond and
        // a busy runtime wakes it later. Allowing 2 ms keeps the bound below what is reachable.
        let window = self.ttl + LOAD + Duration::from_millis(2);
        let window_ms = u32::try_from(window.as_millis()).unwrap_or(u32::MAX);
        let (logs, wall, finished) = runtime.block_on(async move {
            let start = Instant::now();
            let shared = Arc::new(Shared {
                start,
                deadline: start + duration,
                first_return: AtomicU64::new(u64::MAX),
                covered_until: (0..key_space).map(|_| AtomicU32::new(0)).collect(),
                window_ms,
            });
            let handles: Vec<_> = (0..tasks)
                .map(|task| {
                    let shared = shared.clone();
                    tokio::spawn(caller(call, keys, task as u64, buckets, shared))
                })
                .collect();
            let (logs, finished) = join_bounded(handles, duration + LOAD + GRACE).await;
            (logs, start.elapsed(), finished)
        });
        runtime.shutdown_timeout(Duration::from_secs(1));

        let mut latency = histogram();
        let mut max_after_cold = 0;
        let mut timeline = vec![0; buckets];
        let mut lower_bound = 0;
        for log in logs {
            latency
                .add(&log.latency)
                .expect("histograms of the same bounds add up");
            max_after_cold = max_after_cold.max(log.max_after_cold);
            for (merged, slowest) in timeline.iter_mut().zip(&log.timeline) {
                *merged = (*merged).max(*slowest);
            }
            lower_bound += log.lower_bound;
        }
        while timeline.last() == Some(&0) {
            timeline.pop();
        }
        Run {
            label,
            loads: loads.load(Relaxed) - loads_before,
            latency,
            wall,
            finished,
            max_after_cold: Duration::from_nanos(max_after_cold),
            lower_bound,
            timeline: timeline
                .into_iter()
                .map(|slowest| (slowest > 0).then(|| Duration::from_nanos(slowest)))
                .collect(),
        }
    }
}

/// One calling task of a [`Loop`]: calls until the deadline, yielding after each call.
async fn caller<F: Call>(
    call: F,
    keys: Keys,
    seed: u64,
    buckets: usize,
    shared: Arc<Shared>,
) -> TaskLog {
    let mut rng = SmallRng::seed_from_u64(seed);
    let zipf = match keys {
        Keys::One => None,
        Keys::Zipf { keys, exponent } => {
            Some(Zipf::new(keys as f64, exponent).expect("valid Zipf parameters"))
        }
    };
    let mut log = TaskLog {
        latency: histogram(),
        max_after_cold: 0,
        timeline: vec![0; buckets],
        lower_bound: 0,
    };
    loop {
        // Zipf ranks run from 1 to `keys`; rank 1 is the most popular key.
        let key = zipf.map_or(0, |zipf| zipf.sample(&mut rng) as u64 - 1);
        let started = Instant::now();
        if started >= shared.deadline {
            break;
        }
        if shared.needs_load(key, started) {
            log.lower_bound += 1;
        }
        black_box(call(key).await);
        let returned = Instant::now();
        let elapsed = nanos(returned - started);
        log.latency.saturating_record(elapsed);
        let since_start = |at: Instant| nanos(at.duration_since(shared.start));
        if shared.first_return.load(Relaxed) == u64::MAX {
            shared
                .first_return
                .fetch_min(since_start(returned), Relaxed);
        }
        if since_start(started) >= shared.first_return.load(Relaxed) {
            log.max_after_cold = log.max_after_cold.max(elapsed);
        }
        let bucket = (since_start(started) / nanos(BUCKET)) as usize;
        if let Some(slowest) = log.timeline.get_mut(bucket) {
            *slowest = (*slowest).max(elapsed);
        }
        tokio::task::yield_now().await;
    }
    log
}

/// Awaits every task up to `bound`; past it, aborts those still running. Returns what the tasks
/// that finished returned, and whether all did.
async fn join_bounded<T: Send + 'static>(
    handles: Vec<tokio::task::JoinHandle<T>>,
    bound: Duration,
) -> (Vec<T>, bool) {
    let deadline = Instant::now() + bound;
    let mut results = Vec::with_capacity(handles.len());
    let mut finished = true;
    for mut handle in handles {
        if !finished && !handle.is_finished() {
            handle.abort();
            continue;
        }
        match tokio::time::timeout_at(deadline, &mut handle).await {
            Ok(Ok(result)) => results.push(result),
            Ok(Err(error)) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            Ok(Err(_cancelled)) => {}
            Err(_elapsed) => {
                handle.abort();
                finished = false;
            }
        }
    }
    (results, finished)
}

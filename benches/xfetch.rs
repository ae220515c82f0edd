//! Probabilistic early refresh (`xfetch`, Vattani et al., VLDB 2015) against a fixed point
//! (`refresh_after`) and no early refresh, side by side in one run, on the paper's setting: one
//! key read 10 times a second whose load takes 3 s, here 100 times faster (a read every
//! millisecond, a 30 ms load, a 600 ms `ttl`), which keeps every ratio the paper's (reads per
//! load time, load time per `ttl`). Each contender is read for 20 `ttl` periods; the figures
//! are its loads (recomputations) and the reads that waited for one.
//!
//! `cargo bench -p stampede-benches --bench xfetch`

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

const LOAD: Duration = Duration::from_millis(30);
const READ_EVERY: Duration = Duration::from_millis(1);
/// 20 periods of the 600 ms `ttl`.
const RUN: Duration = Duration::from_millis(12_000);
/// A read that took this long waited for a load (a hit takes microseconds).
const WAITED: Duration = Duration::from_millis(5);

static LOADS: [AtomicU64; 3] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];

async fn load(contender: usize) -> u64 {
    LOADS[contender].fetch_add(1, Relaxed);
    tokio::time::sleep(LOAD).await;
    7
}

#[stampede::cached(ttl = "600ms", jitter = 0, name = "xfetch::none")]
async fn none(id: u64) -> u64 {
    load(0).await + id
}

#[stampede::cached(
    ttl = "600ms",
    jitter = 0,
    refresh_after = "450ms",
    name = "xfetch::fixed"
)]
async fn fixed(id: u64) -> u64 {
    load(1).await + id
}

#[stampede::cached(ttl = "600ms", jitter = 0, xfetch = 1.0, name = "xfetch::xfetch")]
async fn xfetch(id: u64) -> u64 {
    load(2).await + id
}

/// What one contender cost over the run.
struct Figures {
    reads: u64,
    waited: u64,
    longest: Duration,
}

async fn read<F: std::future::Future<Output = u64>>(call: impl Fn() -> F) -> Figures {
    call().await; // the cold start: not counted
    let (mut reads, mut waited, mut longest) = (0, 0, Duration::ZERO);
    let end = Instant::now() + RUN;
    let mut ticks = tokio::time::interval(READ_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while Instant::now() < end {
        ticks.tick().await;
        let started = Instant::now();
        call().await;
        let took = started.elapsed();
        reads += 1;
        if took >= WAITED {
            waited += 1;
        }
        longest = longest.max(took);
    }
    Figures {
        reads,
        waited,
        longest,
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let rows = [
        ("no early refresh", 0, runtime.block_on(read(|| none(1)))),
        (
            "refresh_after = 450ms",
            1,
            runtime.block_on(read(|| fixed(1))),
        ),
        ("xfetch = 1.0", 2, runtime.block_on(read(|| xfetch(1)))),
    ];
    let periods = RUN.as_millis() as f64 / 600.0;
    let base = LOADS[0].load(Relaxed).max(1) as f64;
    println!(
        "one key read every {READ_EVERY:?}, a {LOAD:?} load, ttl 600ms, {RUN:?} per contender ({periods} ttl periods)\n"
    );
    println!("| contender | loads | loads per ttl | vs none | reads that waited | longest read |");
    println!("|---|---|---|---|---|---|");
    for (label, at, figures) in rows {
        let loads = LOADS[at].load(Relaxed) - 1; // the cold start's
        println!(
            "| {label} | {loads} | {:.2} | {:.2}x | {} of {} | {:.1?} |",
            loads as f64 / periods,
            loads as f64 / (base - 1.0).max(1.0),
            figures.waited,
            figures.reads,
            figures.longest,
        );
    }
}

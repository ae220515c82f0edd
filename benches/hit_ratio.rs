//! Hit ratios of the memory stores on generated traces (issue 14): moka (TinyLFU admission, the
//! store stampede used before), quick_cache (the store stampede's memory tier is built on now)
//! and stampede's memory tier itself, through `#[stampede::cached]` functions.
//!
//! Traces, each over a space of 1,000,000 keys and drawn from a fixed seed (the same requests
//! for every store):
//!
//! - `zipf 0.8` and `zipf 1.0`: keys drawn from a Zipf distribution with that exponent.
//! - `scan`: half the requests a Zipf (1.0) draw over the 1,000,000 keys, half the next key of
//!   a loop over 1,000,000 other keys (each seen once per lap, which is longer than any
//!   capacity here: a store that admits them evicts hot keys for nothing).
//!
//! Capacities: 1% and 10% of the key space (10,000 and 100,000 entries). Each store replays the
//! first [`WARM`] requests to fill up, then the hit ratio is counted over the next [`COUNTED`].
//! A miss inserts the key (moka, quick_cache) or loads it (stampede).
//!
//! Run: `cargo bench -p stampede-benches --bench hit_ratio` (about a minute).

use std::sync::LazyLock;
use std::time::Instant;

use rand::SeedableRng;
use rand::rngs::SmallRng;
use rand_distr::{Distribution, Zipf};

/// The key space of the Zipf draws.
const KEYS: u64 = 1_000_000;
/// Requests replayed before counting.
const WARM: usize = 1_000_000;
/// Requests counted.
const COUNTED: usize = 2_000_000;

#[derive(Clone, Copy)]
enum Trace {
    Zipf(f64),
    Scan,
}

impl Trace {
    fn name(self) -> String {
        match self {
            Trace::Zipf(s) => format!("zipf {s:.1}"),
            Trace::Scan => "scan".to_owned(),
        }
    }

    /// The trace's requests, from a seed fixed per trace.
    fn requests(self) -> Vec<u64> {
        let len = WARM + COUNTED;
        match self {
            Trace::Zipf(s) => {
                let mut rng = SmallRng::seed_from_u64(s.to_bits());
                let zipf = Zipf::new(KEYS as f64, s).expect("valid Zipf parameters");
                (0..len).map(|_| zipf.sample(&mut rng) as u64 - 1).collect()
            }
            Trace::Scan => {
                let mut rng = SmallRng::seed_from_u64(0x5ca9);
                let zipf = Zipf::new(KEYS as f64, 1.0).expect("valid Zipf parameters");
                let mut lap = 0;
                (0..len)
                    .map(|_| {
                        if rand::RngExt::random_bool(&mut rng, 0.5) {
                            zipf.sample(&mut rng) as u64 - 1
                        } else {
                            lap = (lap + 1) % KEYS;
                            KEYS + lap
                        }
                    })
                    .collect()
            }
        }
    }
}

/// The value every store keeps: 100 bytes, as in the hit benchmarks.
fn value() -> String {
    "v".repeat(100)
}

/// Hits over the counted requests, as a fraction.
fn ratio(hits: usize) -> f64 {
    hits as f64 / COUNTED as f64
}

fn moka(rt: &tokio::runtime::Runtime, requests: &[u64], capacity: u64) -> f64 {
    let cache = moka::future::Cache::new(capacity);
    rt.block_on(async {
        let mut hits = 0;
        for (i, key) in requests.iter().enumerate() {
            if cache.get(key).await.is_some() {
                hits += usize::from(i >= WARM);
            } else {
                cache.insert(*key, value()).await;
            }
        }
        ratio(hits)
    })
}

fn quick_cache(requests: &[u64], capacity: u64) -> f64 {
    let cache = quick_cache::sync::Cache::new(capacity as usize);
    let mut hits = 0;
    for (i, key) in requests.iter().enumerate() {
        if cache.get(key).is_some() {
            hits += usize::from(i >= WARM);
        } else {
            cache.insert(*key, value());
        }
    }
    ratio(hits)
}

/// One `#[stampede::cached]` function per trace and capacity, so each replay starts empty.
macro_rules! stampede_fns {
    ($($name:ident = $capacity:literal as $cache:literal),* $(,)?) => {
        $(
            #[stampede::cached(ttl = "1h", capacity = $capacity, name = $cache)]
            async fn $name(id: u64) -> String {
                std::hint::black_box(id);
                value()
            }
        )*
    };
}

stampede_fns!(
    zipf08_small = 10_000 as "zipf08_small",
    zipf08_large = 100_000 as "zipf08_large",
    zipf10_small = 10_000 as "zipf10_small",
    zipf10_large = 100_000 as "zipf10_large",
    scan_small = 10_000 as "scan_small",
    scan_large = 100_000 as "scan_large",
);

/// Replays `requests` through the cached function `call`, named `name`; hits are read from its
/// stats (memory hits), after the warm-up and at the end.
fn stampede<F, Fut>(rt: &tokio::runtime::Runtime, requests: &[u64], name: &str, call: F) -> f64
where
    F: Fn(u64) -> Fut,
    Fut: Future<Output = String>,
{
    rt.block_on(async {
        let hits = || stampede::stats(name).map_or(0, |stats| stats.hits);
        let mut before = 0;
        for (i, key) in requests.iter().enumerate() {
            if i == WARM {
                before = hits();
            }
            std::hint::black_box(call(*key).await);
        }
        ratio((hits() - before) as usize)
    })
}

static RT: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime")
});

fn main() {
    let rt = &*RT;
    let started = Instant::now();
    println!(
        "hit ratio over {COUNTED} requests after {WARM} to warm up; key space {KEYS} (scan: twice that)"
    );
    println!(
        "{:<9} {:>13} {:>8} {:>12} {:>9} {:>15} {:>15}",
        "trace", "capacity", "moka", "quick_cache", "stampede", "stampede-moka", "quick-moka"
    );
    for trace in [Trace::Zipf(0.8), Trace::Zipf(1.0), Trace::Scan] {
        let requests = trace.requests();
        for (capacity, label) in [(10_000u64, "1%"), (100_000, "10%")] {
            let moka = moka(rt, &requests, capacity);
            let quick = quick_cache(&requests, capacity);
            let ours = match (trace.name().as_str(), label) {
                ("zipf 0.8", "1%") => stampede(rt, &requests, "zipf08_small", zipf08_small),
                ("zipf 0.8", _) => stampede(rt, &requests, "zipf08_large", zipf08_large),
                ("zipf 1.0", "1%") => stampede(rt, &requests, "zipf10_small", zipf10_small),
                ("zipf 1.0", _) => stampede(rt, &requests, "zipf10_large", zipf10_large),
                (_, "1%") => stampede(rt, &requests, "scan_small", scan_small),
                _ => stampede(rt, &requests, "scan_large", scan_large),
            };
            println!(
                "{:<9} {:>13} {:>7.2}% {:>11.2}% {:>8.2}% {:>+13.2}pt {:>+13.2}pt",
                trace.name(),
                format!("{capacity} ({label})"),
                moka * 100.0,
                quick * 100.0,
                ours * 100.0,
                (ours - moka) * 100.0,
                (quick - moka) * 100.0,
            );
        }
    }
    println!("({:.0?})", started.elapsed());
}

//! The open-loop load: requests at a fixed rate, each sent at its intended time whatever the
//! earlier ones are doing (so a slow service does not slow the sender), its latency measured
//! from that intended time (so the time a request would have queued counts: no coordinated
//! omission). Keys are drawn from a Zipf distribution over the products with a fixed seed (the
//! same sequence for every contender); request `i` goes to instance `i mod n`.
//!
//! A pacing thread sleeps until each request's time and hands it to the runtime; a failed
//! request (an error status, no answer within the timeout, a refused connection) is recorded
//! with the time it took, and counted.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, Zipf};

use crate::plan::{HOT_KEYS, Plan};
use crate::schema::PRODUCTS;

/// The width of one point of the timeline.
pub const BUCKET: Duration = Duration::from_millis(100);

/// How long a request may take before it counts as failed.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// What the load is.
#[derive(Clone, Debug)]
pub struct LoadConfig {
    /// Requests per second, over all instances.
    pub rate: f64,
    /// The Zipf exponent over the products.
    pub zipf: f64,
    /// The key sequence's seed.
    pub seed: u64,
}

/// Requests of one phase: their latency and failures.
pub struct PhaseLoad {
    /// Latency of every request intended in the phase, failed ones included, in microseconds.
    pub latency: Histogram<u64>,
    /// The same, of the requests of hot keys only.
    pub hot_latency: Histogram<u64>,
    /// Requests answered with an error status.
    pub error_status: u64,
    /// Requests not answered within [`REQUEST_TIMEOUT`].
    pub timeouts: u64,
    /// Requests that found no connection (refused, reset).
    pub io_errors: u64,
}

impl PhaseLoad {
    fn new() -> PhaseLoad {
        PhaseLoad {
            // 1 µs to 60 s, 3 significant digits.
            latency: Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds"),
            hot_latency: Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds"),
            error_status: 0,
            timeouts: 0,
            io_errors: 0,
        }
    }

    /// Every failed request.
    pub fn errors(&self) -> u64 {
        self.error_status + self.timeouts + self.io_errors
    }
}

/// One point of the timeline: the requests intended in one [`BUCKET`].
#[derive(Clone, Copy, Debug, Default)]
pub struct Bucket {
    /// Their count.
    pub requests: u64,
    /// The slowest, in microseconds.
    pub slowest_us: u64,
    /// Failed ones.
    pub errors: u64,
}

/// Everything the load recorded for one contender.
pub struct Recorded {
    /// Per phase of the plan.
    pub phases: Vec<PhaseLoad>,
    /// Per [`BUCKET`] from the first request.
    pub timeline: Vec<Bucket>,
    /// How late the pacing thread handed requests over, at worst, in microseconds.
    pub pacing_lag_max_us: u64,
}

enum Outcome {
    Ok,
    Status,
    Timeout,
    Io,
}

struct Shared {
    recorded: Mutex<Recorded>,
    in_flight: AtomicU64,
    plan: Plan,
    start: Instant,
}

impl Shared {
    fn record(&self, intended: Instant, hot: bool, outcome: Outcome) {
        let offset = intended.saturating_duration_since(self.start);
        let took = u64::try_from(intended.elapsed().as_micros()).unwrap_or(u64::MAX);
        let phase = self.plan.phase_at(offset);
        let bucket = (offset.as_nanos() / BUCKET.as_nanos()) as usize;
        let mut recorded = self.recorded.lock().unwrap_or_else(|p| p.into_inner());
        let load = &mut recorded.phases[phase];
        load.latency.saturating_record(took.max(1));
        if hot {
            load.hot_latency.saturating_record(took.max(1));
        }
        match outcome {
            Outcome::Ok => {}
            Outcome::Status => load.error_status += 1,
            Outcome::Timeout => load.timeouts += 1,
            Outcome::Io => load.io_errors += 1,
        }
        if let Some(point) = recorded.timeline.get_mut(bucket) {
            point.requests += 1;
            point.slowest_us = point.slowest_us.max(took);
            if !matches!(outcome, Outcome::Ok) {
                point.errors += 1;
            }
        }
    }
}

/// A load running in the background; [`Running::finish`] waits for its end.
pub struct Running {
    shared: Arc<Shared>,
    pacer: std::thread::JoinHandle<u64>,
    /// When the first request was due.
    pub start: Instant,
}

/// Starts the load on `targets` for the length of `plan`, on the current runtime.
pub fn start(config: &LoadConfig, plan: &Plan, targets: &[SocketAddr]) -> Result<Running, String> {
    let zipf = Zipf::new(f64::from(PRODUCTS), config.zipf)
        .map_err(|e| format!("Zipf exponent {}: {e}", config.zipf))?;
    if !(config.rate > 0.0 && config.rate.is_finite()) {
        return Err(format!("rate {}: must be above 0", config.rate));
    }
    let buckets = (plan.end().as_nanos() / BUCKET.as_nanos()) as usize + 1;
    let start = Instant::now() + Duration::from_millis(50);
    let shared = Arc::new(Shared {
        recorded: Mutex::new(Recorded {
            phases: plan.phases.iter().map(|_| PhaseLoad::new()).collect(),
            timeline: vec![Bucket::default(); buckets],
            pacing_lag_max_us: 0,
        }),
        in_flight: AtomicU64::new(0),
        plan: plan.clone(),
        start,
    });
    let client: Client<HttpConnector, Empty<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build_http();
    let uris: Vec<String> = targets
        .iter()
        .map(|address| format!("http://{address}/products/"))
        .collect();
    let runtime = tokio::runtime::Handle::current();
    let period = Duration::from_secs_f64(1.0 / config.rate);
    let end = plan.end();
    let seed = config.seed;
    let pacer_shared = Arc::clone(&shared);
    let pacer = std::thread::Builder::new()
        .name("storm-pacer".to_owned())
        .spawn(move || {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut lag_max = 0u64;
            for i in 0u64.. {
                let offset = period.mul_f64(i as f64);
                if offset >= end {
                    break;
                }
                let intended = start + offset;
                let now = Instant::now();
                if intended > now {
                    std::thread::sleep(intended - now);
                } else {
                    let lag = u64::try_from((now - intended).as_micros()).unwrap_or(u64::MAX);
                    lag_max = lag_max.max(lag);
                }
                let id = (zipf.sample(&mut rng) as i32).clamp(1, PRODUCTS);
                let uri = format!("{}{id}", uris[(i % uris.len() as u64) as usize]);
                let client = client.clone();
                let shared = Arc::clone(&pacer_shared);
                shared.in_flight.fetch_add(1, Relaxed);
                runtime.spawn(async move {
                    let outcome = request(&client, &uri).await;
                    shared.record(intended, id <= HOT_KEYS as i32, outcome);
                    shared.in_flight.fetch_sub(1, Relaxed);
                });
            }
            lag_max
        })
        .map_err(|e| format!("cannot start the pacing thread: {e}"))?;
    Ok(Running {
        shared,
        pacer,
        start,
    })
}

async fn request(client: &Client<HttpConnector, Empty<Bytes>>, uri: &str) -> Outcome {
    let Ok(uri) = uri.parse::<hyper::Uri>() else {
        return Outcome::Io;
    };
    let call = async {
        let response = client.get(uri).await.map_err(|_| Outcome::Io)?;
        let ok = response.status().is_success();
        response
            .into_body()
            .collect()
            .await
            .map_err(|_| Outcome::Io)?;
        Ok::<bool, Outcome>(ok)
    };
    match tokio::time::timeout(REQUEST_TIMEOUT, call).await {
        Ok(Ok(true)) => Outcome::Ok,
        Ok(Ok(false)) => Outcome::Status,
        Ok(Err(outcome)) => outcome,
        Err(_) => Outcome::Timeout,
    }
}

impl Running {
    /// Waits until the last request was sent and every request has an outcome (or the
    /// request timeout has passed since).
    pub async fn finish(self) -> Recorded {
        let lag = tokio::task::spawn_blocking(move || self.pacer.join().unwrap_or(0))
            .await
            .unwrap_or(0);
        let deadline = Instant::now() + REQUEST_TIMEOUT + Duration::from_secs(2);
        while self.shared.in_flight.load(Relaxed) > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut recorded = self
            .shared
            .recorded
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let mut taken = std::mem::replace(
            &mut *recorded,
            Recorded {
                phases: Vec::new(),
                timeline: Vec::new(),
                pacing_lag_max_us: 0,
            },
        );
        taken.pacing_lag_max_us = lag;
        taken
    }
}

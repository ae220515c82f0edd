//! The figures of one contender's phase, from what the load recorded and what the instances,
//! PostgreSQL, Redis and `/proc` said at the phase's two ends.

use std::time::Duration;

use crate::contender::Contender;
use crate::orchestrate::load::{Bucket, PhaseLoad};
use crate::orchestrate::postgres::QueryCount;
use crate::plan::Phase;
use crate::wire::{CacheCounters, InstanceStats};

/// What was read at one moment of the run.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// When, from the first request.
    pub at: Duration,
    /// Each instance's counters.
    pub instances: Vec<InstanceStats>,
    /// Each instance's CPU seconds.
    pub cpu: Vec<f64>,
    /// PostgreSQL's CPU seconds (postmaster and backends).
    pub db_cpu: f64,
    /// `pg_stat_statements` on the product query.
    pub db: QueryCount,
    /// Redis round trips of the clients so far (`RedisServer::round_trips`).
    pub redis: Option<u64>,
}

/// One row of the report.
#[derive(Clone, Debug)]
pub struct PhaseFigures {
    /// Which phase.
    pub phase: Phase,
    /// Requests intended in it.
    pub requests: u64,
    /// Of them, failed (error status, timeout, no connection).
    pub errors: u64,
    /// Latency quantiles from the intended send time, microseconds: p50, p99, p99.9, max.
    pub latency_us: [u64; 4],
    /// Of the requests of hot keys: p99 and max, microseconds.
    pub hot_latency_us: [u64; 2],
    /// Product queries PostgreSQL executed (`pg_stat_statements`).
    pub db_queries: u64,
    /// The most it executed in one second of the phase.
    pub db_peak: u64,
    /// Product queries the instances sent (their own count).
    pub sent_queries: u64,
    /// The most queries one hot key cost, summed over the instances.
    pub hot_max: u64,
    /// Hot keys queried at least once.
    pub hot_queried: usize,
    /// The queries of each hot key across the instances in the phase.
    pub hot_queries: Vec<u64>,
    /// Mean wait for a pool connection, microseconds.
    pub pool_wait_mean_us: f64,
    /// The longest wait for one, microseconds.
    pub pool_wait_max_us: u64,
    /// Requests whose cache call took at least the wait threshold, and of those of hot keys.
    pub waits: (u64, u64),
    /// The cache's own counters over the phase, summed over the instances (stampede only).
    pub cache: CacheCounters,
    /// Redis round trips per request answered.
    pub redis_per_request: Option<f64>,
    /// Mean CPU per instance, in percent of one core.
    pub cpu_per_instance: f64,
    /// PostgreSQL's CPU, in percent of one core.
    pub db_cpu: f64,
}

/// The figures of one contender.
#[derive(Clone, Debug)]
pub struct ContenderRun {
    /// Which.
    pub contender: Contender,
    /// One per phase of the plan.
    pub phases: Vec<PhaseFigures>,
    /// The load's timeline.
    pub timeline: Vec<Bucket>,
    /// The pacing thread's worst lag, microseconds.
    pub pacing_lag_max_us: u64,
}

impl ContenderRun {
    /// The figures of `phase`.
    pub fn phase(&self, phase: Phase) -> Option<&PhaseFigures> {
        self.phases.iter().find(|figures| figures.phase == phase)
    }
}

/// The figures between snapshots `from` and `to`, with the load of the phase and the samples
/// of PostgreSQL's count `(at, calls)` taken meanwhile.
pub fn phase_figures(
    phase: Phase,
    load: &PhaseLoad,
    from: &Snapshot,
    to: &Snapshot,
    samples: &[(Duration, u64)],
) -> PhaseFigures {
    let seconds = to.at.saturating_sub(from.at).as_secs_f64().max(1e-3);
    let sum = |field: fn(&InstanceStats) -> u64| -> u64 {
        to.instances
            .iter()
            .zip(&from.instances)
            .map(|(to, from)| field(to).saturating_sub(field(from)))
            .sum()
    };
    let hot: Vec<u64> = (0..to.instances.first().map_or(0, |s| s.hot_queries.len()))
        .map(|key| {
            to.instances
                .iter()
                .zip(&from.instances)
                .map(|(to, from)| {
                    let get = |s: &InstanceStats| s.hot_queries.get(key).copied().unwrap_or(0);
                    get(to).saturating_sub(get(from))
                })
                .sum()
        })
        .collect();
    let pool_waits = sum(|s| s.pool_waits);
    let answered = sum(|s| s.requests);
    let cpu: Vec<f64> = to
        .cpu
        .iter()
        .zip(&from.cpu)
        .map(|(to, from)| (to - from).max(0.0))
        .collect();
    let quantile = |q: f64| load.latency.value_at_quantile(q);
    PhaseFigures {
        phase,
        requests: load.latency.len(),
        errors: load.errors(),
        latency_us: [
            quantile(0.5),
            quantile(0.99),
            quantile(0.999),
            load.latency.max(),
        ],
        hot_latency_us: [
            load.hot_latency.value_at_quantile(0.99),
            load.hot_latency.max(),
        ],
        db_queries: to.db.calls.saturating_sub(from.db.calls),
        db_peak: peak_per_second(samples, from.at, to.at),
        sent_queries: sum(|s| s.queries),
        hot_max: hot.iter().copied().max().unwrap_or(0),
        hot_queried: hot.iter().filter(|&&n| n > 0).count(),
        hot_queries: hot.clone(),
        pool_wait_mean_us: if pool_waits == 0 {
            0.0
        } else {
            sum(|s| s.pool_wait_us) as f64 / pool_waits as f64
        },
        pool_wait_max_us: to
            .instances
            .iter()
            .map(|s| s.pool_wait_max_us)
            .max()
            .unwrap_or(0),
        waits: (sum(|s| s.waits), sum(|s| s.hot_waits)),
        cache: to
            .instances
            .iter()
            .zip(&from.instances)
            .fold(CacheCounters::default(), |total, (to, from)| {
                total.plus(&to.cache.since(&from.cache))
            }),
        redis_per_request: match (from.redis, to.redis) {
            (Some(from), Some(to)) if answered > 0 => {
                Some(to.saturating_sub(from) as f64 / answered as f64)
            }
            _ => None,
        },
        cpu_per_instance: if cpu.is_empty() {
            0.0
        } else {
            100.0 * cpu.iter().sum::<f64>() / cpu.len() as f64 / seconds
        },
        db_cpu: 100.0 * (to.db_cpu - from.db_cpu).max(0.0) / seconds,
    }
}

/// The most calls in any one second between `from` and `to`, from cumulative samples.
fn peak_per_second(samples: &[(Duration, u64)], from: Duration, to: Duration) -> u64 {
    let second = Duration::from_secs(1);
    let mut peak = 0.0f64;
    for (j, &(at, calls)) in samples.iter().enumerate() {
        if at < from || at > to {
            continue;
        }
        // The latest sample at least a second earlier (or the phase's first).
        let earlier = samples[..j]
            .iter()
            .rev()
            .find(|(t, _)| *t + second <= at || *t <= from);
        if let Some(&(t, c)) = earlier {
            let span = (at - t).as_secs_f64().max(1.0);
            peak = peak.max(calls.saturating_sub(c) as f64 / span);
        }
    }
    peak.round() as u64
}

//! The report: the setting, one table row per contender and phase, and the goals of issue 25
//! as ratios of this run's figures.

use std::fmt::Write as _;
use std::time::Duration;

use crate::contender::Contender;
use crate::orchestrate::figures::{ContenderRun, PhaseFigures};
use crate::plan::{HOT_KEYS, Phase, Plan, TTL};

/// How the run was set up, for the report's header.
#[derive(Clone, Debug)]
pub struct Setting {
    /// The short plan.
    pub quick: bool,
    /// Requests per second.
    pub rate: f64,
    /// The Zipf exponent.
    pub zipf: f64,
    /// Instances per contender.
    pub instances: usize,
    /// Pool connections per instance.
    pub pool: usize,
    /// The product query's mean execution at the server, ms.
    pub query_ms: f64,
    /// Its median round trip from the orchestrator.
    pub round_trip: Duration,
    /// The slow phase's extra sleep per query, ms.
    pub slow_extra_ms: f64,
    /// A cache call this long counts as a wait.
    pub wait_threshold: Duration,
    /// The plan.
    pub plan: Plan,
}

/// A duration in microseconds with three significant digits in a unit that suits it.
pub fn micros(us: u64) -> String {
    let us = us as f64;
    if us < 1_000.0 {
        format!("{us:.0}µs")
    } else if us < 10_000.0 {
        format!("{:.2}ms", us / 1e3)
    } else if us < 1_000_000.0 {
        format!("{:.1}ms", us / 1e3)
    } else {
        format!("{:.2}s", us / 1e6)
    }
}

/// A few lines on one contender, printed as the run goes.
pub fn short(run: &ContenderRun) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "  (the pacing thread was {} late at worst)",
        micros(run.pacing_lag_max_us)
    );
    for figures in &run.phases {
        let _ = writeln!(
            out,
            "  {:<14} p99 {:>8}  max {:>8}  errors {:>6}  db queries {:>6} (sent {}, peak {}/s, hot key max {})",
            figures.phase.label(),
            micros(figures.latency_us[1]),
            micros(figures.latency_us[3]),
            figures.errors,
            figures.db_queries,
            figures.sent_queries,
            figures.db_peak,
            figures.hot_max,
        );
    }
    out
}

fn row(out: &mut String, label: &str, figures: &PhaseFigures) {
    let [p50, p99, p999, max] = figures.latency_us.map(micros);
    let redis = figures
        .redis_per_request
        .map_or("-".to_owned(), |trips| format!("{trips:.2}"));
    let _ = writeln!(
        out,
        "| {label} | {} | {} | {} | {p50} | {p99} | {p999} | {max} | {} / {} | {} | {} | {} ({}) | {} / {} | {} ({}) | {redis} | {:.0}% | {:.0}% |",
        figures.phase.label(),
        figures.requests,
        figures.errors,
        micros(figures.hot_latency_us[0]),
        micros(figures.hot_latency_us[1]),
        figures.db_queries,
        figures.db_peak,
        figures.hot_max,
        figures.hot_queried,
        micros(figures.pool_wait_mean_us.round() as u64),
        micros(figures.pool_wait_max_us),
        figures.waits.0,
        figures.waits.1,
        figures.cpu_per_instance,
        figures.db_cpu,
    );
}

/// The whole report in Markdown.
pub fn markdown(setting: &Setting, runs: &[ContenderRun]) -> String {
    let mut out = String::new();
    let phases: Vec<String> = setting
        .plan
        .phases
        .iter()
        .map(|(phase, from, to)| {
            format!(
                "{} {:.1}-{:.1}s",
                phase.label(),
                from.as_secs_f64(),
                to.as_secs_f64()
            )
        })
        .collect();
    let _ = writeln!(
        out,
        "## Expiry storm{}\n\n\
         {} instances per contender, each with a pool of {} PostgreSQL connections; one \
         redis-server; {:.0} requests/s open-loop, Zipf ({}) over 100,000 products, round-robin \
         over the instances. The product query: {:.2}ms at the server ({} round trip); slow \
         database: +{:.1}ms per query (10x). TTL {}s in every contender, no jitter. Phases: {}.\n",
        if setting.quick { " (--quick)" } else { "" },
        setting.instances,
        setting.pool,
        setting.rate,
        setting.zipf,
        setting.query_ms,
        micros(setting.round_trip.as_micros() as u64),
        setting.slow_extra_ms,
        TTL.as_secs(),
        phases.join(", "),
    );
    let _ = writeln!(
        out,
        "| contender | phase | requests | errors | p50 | p99 | p99.9 | max | hot keys p99 / max | DB queries | peak/s | \
         per hot key, max (keys) | pool wait mean / max | waits (hot) | Redis round trips/req | CPU/instance | DB CPU |"
    );
    let _ = writeln!(out, "|{}", "---|".repeat(17));
    for run in runs {
        for figures in &run.phases {
            row(&mut out, run.contender.label(), figures);
        }
    }
    let _ = writeln!(
        out,
        "\nLatency from each request's intended send time, failed requests included; hot keys: the \
         requests of the {HOT_KEYS} hottest products alone. DB queries and \
         peak/s: PostgreSQL's `pg_stat_statements` on the product query. Per hot key: the most \
         queries one of them cost across the instances in the phase (and \
         how many of them were queried). Waits: requests whose cache call took at least {} in the \
         service (a wait for a load; a hit descheduled that long counts too), and of those, of hot \
         keys. Redis round trips: the server's reads of client requests (`INFO stats`), a script \
         call one, requests sent together one. CPU: percent of one core, per instance (mean) and \
         PostgreSQL's (all its processes).\n",
        micros(setting.wait_threshold.as_micros() as u64)
    );
    counters(&mut out, runs);
    goals(&mut out, runs, setting.instances);
    out
}

/// The stampede contenders' own counters per phase (`stampede::stats`, summed over the
/// instances): why requests waited (misses) and what answered the others.
fn counters(out: &mut String, runs: &[ContenderRun]) {
    let stampede: Vec<&ContenderRun> = runs
        .iter()
        .filter(|run| run.contender.stampede_name().is_some())
        .collect();
    if stampede.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "### The cache's own counters\n\n\
         `stampede::stats` of each instance, summed over the 4, per phase: calls answered fresh \
         from memory (hits) and with a stale value while one refresh ran; calls that found no \
         servable value in the instance's memory (misses), and of them those answered by a \
         value read from Redis (from Redis); the others waited for a load. Background refreshes; \
         loads run without Redis (degraded: down or slow); the last good value served for a \
         failed load.\n\n\
         | contender | phase | hits | stale served | misses | of them from Redis | refreshes | degraded | fail-safe served |\n\
         |---|---|---|---|---|---|---|---|---|"
    );
    for run in stampede {
        for figures in &run.phases {
            let c = &figures.cache;
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                run.contender.label(),
                figures.phase.label(),
                c.hits,
                c.stale_served,
                c.misses,
                c.remote_hits,
                c.refreshes,
                c.degraded,
                c.fail_safe_served,
            );
        }
    }
    let _ = writeln!(out);
}

fn p99(run: &ContenderRun, phase: Phase) -> Option<u64> {
    run.phase(phase).map(|figures| figures.latency_us[1])
}

fn hot_p99(run: &ContenderRun, phase: Phase) -> Option<u64> {
    run.phase(phase).map(|figures| figures.hot_latency_us[0])
}

/// Reads one p99 of a contender's phase.
type P99 = fn(&ContenderRun, Phase) -> Option<u64>;

/// Issue 36's goals for the Redis restart: no hot-key wait past its first second, and at most
/// one query per hot key across the instances plus one per instance (a load each while Redis is
/// away), counted per key over both of the restart's phases.
fn restart_goals(out: &mut String, run: &ContenderRun, instances: usize) {
    let (Some(first), Some(after)) = (run.phase(Phase::RedisRestart), run.phase(Phase::RedisAway))
    else {
        return;
    };
    let label = run.contender.label();
    let waits = after.waits.1;
    let _ = writeln!(
        out,
        "| {label}: Redis restart, no hot-key wait after its first second | {waits} | {} |",
        verdict(waits == 0),
    );
    let most = first
        .hot_queries
        .iter()
        .zip(&after.hot_queries)
        .map(|(first, after)| first + after)
        .max()
        .unwrap_or(0);
    let allowed = 1 + instances as u64;
    let _ = writeln!(
        out,
        "| {label}: Redis restart, at most {allowed} queries per hot key (one across the instances, one per instance) | {most} | {} |",
        verdict(most <= allowed),
    );
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "missed" }
}

fn goals(out: &mut String, runs: &[ContenderRun], instances: usize) {
    let find = |contender| runs.iter().find(|run| run.contender == contender);
    let Some(redis) = find(Contender::StampedeRedis) else {
        let _ = writeln!(out, "(The goals need the stampede-redis contender.)");
        return;
    };
    let _ = writeln!(out, "### Goals\n\n| goal | this run | |\n|---|---|---|");
    for phase in [Phase::Cold, Phase::Expiry] {
        let mine = redis.phase(phase).map_or(0, |f| f.hot_max);
        let others: Vec<String> = runs
            .iter()
            .filter(|run| run.contender != Contender::StampedeRedis)
            .filter_map(|run| {
                run.phase(phase)
                    .map(|f| format!("{} {}", run.contender.label(), f.hot_max))
            })
            .collect();
        let _ = writeln!(
            out,
            "| {}: `lock = \"redis\"` at most one query per hot key across the instances | {mine} (others: {}) | {} |",
            phase.label(),
            others.join(", "),
            verdict(mine <= 1),
        );
    }
    for (whose, read) in [("all requests", p99 as P99), ("hot keys", hot_p99 as P99)] {
        let (Some(expiry), Some(steady)) = (read(redis, Phase::Expiry), read(redis, Phase::Steady))
        else {
            continue;
        };
        let ratio = expiry as f64 / steady.max(1) as f64;
        let _ = writeln!(
            out,
            "| expiry p99 at most 2x steady p99 (`lock = \"redis\"`), {whose} | {} / {} = {ratio:.2}x | {} |",
            micros(expiry),
            micros(steady),
            verdict(ratio <= 2.0),
        );
        let peers: Vec<(&str, u64)> = runs
            .iter()
            .filter(|run| !run.contender.label().starts_with("stampede"))
            .filter_map(|run| read(run, Phase::Expiry).map(|p| (run.contender.label(), p)))
            .collect();
        let below = peers.iter().all(|(_, p)| expiry < *p);
        let listed: Vec<String> = peers
            .iter()
            .map(|(label, p)| {
                format!(
                    "{label} {} ({:.2}x)",
                    micros(*p),
                    *p as f64 / expiry.max(1) as f64
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "| expiry p99 below every peer's, {whose} | {} against {} | {} |",
            micros(expiry),
            listed.join(", "),
            verdict(below),
        );
    }
    for run in runs.iter().filter(|run| run.contender.serves_ahead()) {
        let after: Vec<&PhaseFigures> = run
            .phases
            .iter()
            .filter(|f| f.phase != Phase::Cold)
            .collect();
        let hot: u64 = after.iter().map(|f| f.waits.1).sum();
        let all: u64 = after.iter().map(|f| f.waits.0).sum();
        let requests: u64 = after.iter().map(|f| f.requests).sum();
        let _ = writeln!(
            out,
            "| {}: no request waits for the database after the cold start | hot keys: {hot} waits; all keys: {all} of {requests} requests ({:.2}%) | {} |",
            run.contender.label(),
            100.0 * all as f64 / requests.max(1) as f64,
            if all == 0 {
                "met"
            } else if hot == 0 {
                "met for hot keys; missed for the tail"
            } else {
                "missed"
            },
        );
    }
    for run in runs.iter().filter(|run| run.contender.serves_ahead()) {
        restart_goals(out, run, instances);
    }
    for run in runs.iter().filter(|run| run.contender.serves_ahead()) {
        for (whose, read) in [("all requests", p99 as P99), ("hot keys", hot_p99 as P99)] {
            let (Some(slow), Some(steady)) = (read(run, Phase::SlowDb), read(run, Phase::Steady))
            else {
                continue;
            };
            let ratio = slow as f64 / steady.max(1) as f64;
            let _ = writeln!(
                out,
                "| {}: slow database p99 at the steady level (within 1.5x), {whose} | {} / {} = {ratio:.2}x | {} |",
                run.contender.label(),
                micros(slow),
                micros(steady),
                verdict(ratio <= 1.5),
            );
        }
    }
}

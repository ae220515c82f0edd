//! The scenario runner: what each contender does to the upstream, and to its callers, when many
//! calls meet a cold key, an expiring key, or a skewed key space.
//!
//! ```sh
//! cargo bench -p stampede-benches --bench scenarios              # the full run, about 80 s
//! cargo bench -p stampede-benches --bench scenarios -- --quick   # under a minute
//! ```
//!
//! Options: `--quick`; `--only cold,expiry,zipf,many` to run some scenarios; `--svg PATH` to
//! write the expiry timeline there (the full run writes `docs/expiry-timeline.svg` by default);
//! `--redis URL` to use that Redis, `--no-redis` to leave the Redis rows out (with neither, the
//! runner starts a `redis-server` of its own on a free loopback port and stops it at the end, or
//! leaves the Redis rows out when none is installed); `--many 4x250` to change the shape of the
//! many-processes scenario.
//!
//! `-p stampede-benches` matters: from the workspace root without it, Cargo also selects the
//! `stampede` package and unifies its test dependencies' features into the build (tokio's
//! `test-util`, whose clock is slower to read), which a user's build does not have.
//!
//! Scenarios, each with one row per contender (see `scenarios/contenders.rs`):
//! - cold stampede: 10,000 concurrent calls on one cold key, a 100 ms load;
//! - expiry under load: TTL 1 s, 64 tasks calling one key in a loop for 5 s, 100 ms loads
//!   (`stampede` with `stale = "5s"`), plus `stampede` on a key that never expires as the
//!   reference for a pure hit;
//! - Zipf (s = 1.0) over 100,000 keys, TTL 2 s, 64 tasks calling for 5 s: loads against the
//!   fewest loads any cache with that TTL could have made for the same calls;
//! - many processes (Redis only): 4 processes x 250 callers on one cold key, `lock = "redis"`
//!   (`examples/app/src/multi_instance.rs`): loads in all, and how long after the fill the last
//!   caller of each waiting process returned, against a Redis round trip measured in the same run.

mod contenders;
mod drive;
mod many;
mod report;
mod timeline;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use contenders::for_each;
use drive::{Cold, Keys, Loop, Run};
use report::{Extra, latency, table, thousands};
use stampede_benches::BenchRedis;
// The processes of the many-processes scenario are copies of this program.
use stampede_examples::multi_instance;

const USAGE: &str = "usage: cargo bench --bench scenarios -- [--quick] \
                     [--only cold,expiry,zipf,many] [--svg PATH] [--redis URL | --no-redis] \
                     [--many PROCESSESxCALLERS]";
const SCENARIOS: [&str; 4] = ["cold", "expiry", "zipf", "many"];

struct Options {
    quick: bool,
    only: Vec<String>,
    svg: Option<PathBuf>,
    redis: Option<String>,
    no_redis: bool,
    /// Processes and callers in each of the many-processes scenario.
    many: (usize, usize),
}

impl Options {
    fn parse() -> Result<Options, String> {
        let mut options = Options {
            quick: false,
            only: Vec::new(),
            svg: None,
            redis: None,
            no_redis: false,
            many: (4, 250),
        };
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--quick" => options.quick = true,
                "--only" => {
                    let names = args.next().ok_or("--only needs a list of scenarios")?;
                    for name in names.split(',') {
                        if !SCENARIOS.contains(&name) {
                            return Err(format!("no scenario called `{name}`"));
                        }
                        options.only.push(name.to_owned());
                    }
                }
                "--svg" => options.svg = Some(args.next().ok_or("--svg needs a path")?.into()),
                "--redis" => options.redis = Some(args.next().ok_or("--redis needs a URL")?),
                "--no-redis" => options.no_redis = true,
                "--many" => {
                    let shape = args.next().ok_or("--many needs PROCESSESxCALLERS")?;
                    options.many = shape
                        .split_once('x')
                        .and_then(|(p, c)| Some((p.parse().ok()?, c.parse().ok()?)))
                        .filter(|&(p, c)| p >= 2 && c >= 1)
                        .ok_or(format!("`{shape}` is not PROCESSESxCALLERS, e.g. 4x250"))?;
                }
                // What `cargo bench` passes to every benchmark binary.
                "--bench" => {}
                other => return Err(format!("unknown argument `{other}`")),
            }
        }
        if options.svg.is_none() && !options.quick {
            options.svg =
                Some(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/expiry-timeline.svg"));
        }
        Ok(options)
    }

    fn runs(&self, scenario: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|name| name == scenario)
    }
}

fn main() -> ExitCode {
    if multi_instance::child_if_asked() {
        return ExitCode::SUCCESS;
    }
    let options = match Options::parse() {
        Ok(options) => options,
        Err(error) => {
            eprintln!("{error}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let began = Instant::now();
    let calling_time = if options.quick {
        Duration::from_millis(2_500)
    } else {
        Duration::from_secs(5)
    };
    println!(
        "stampede scenarios{}: {} cores, load average {} at start",
        if options.quick { " (--quick)" } else { "" },
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load_average()
    );
    println!("each run: a fresh 2-worker tokio runtime; latency of each call, HDR histogram");
    let redis = if options.no_redis {
        println!("Redis: left out (--no-redis)");
        None
    } else {
        match BenchRedis::get(options.redis.clone()).and_then(|redis| {
            redis.install()?;
            Ok(redis)
        }) {
            Ok(redis) => {
                println!(
                    "Redis: {} at {}, version {}",
                    redis.origin,
                    redis.url,
                    many::server_version(&redis.url).unwrap_or_else(|| "unknown".into())
                );
                Some(redis)
            }
            Err(why) => {
                println!("Redis: none ({why})");
                None
            }
        }
    };
    println!();

    let with_redis = redis.is_some();
    if options.runs("cold") {
        cold(with_redis);
    }
    if options.runs("expiry") {
        expiry(calling_time, options.svg.as_deref(), with_redis);
    }
    if options.runs("zipf") {
        zipf(calling_time, with_redis);
    }
    if options.runs("many") {
        match &redis {
            Some(redis) => many(&redis.url, options.many, if options.quick { 2 } else { 5 }),
            None => println!("many processes: left out, no Redis\n"),
        }
    }
    drop(redis);
    println!(
        "done in {:.1} s, load average {} at the end",
        began.elapsed().as_secs_f64(),
        load_average()
    );
    ExitCode::SUCCESS
}

fn cold(with_redis: bool) {
    let runs = for_each!(cold, Cold { calls: 10_000 }, with_redis);
    print!(
        "{}",
        table(
            "cold stampede: 10,000 concurrent calls on one cold key, 100 ms load",
            &runs,
            &[],
        )
    );
    for ours in runs.iter().filter(|run| run.label.starts_with("stampede")) {
        println!(
            "target: exactly one load per cold stampede; {} made {}",
            ours.label, ours.loads
        );
    }
    redis_note(with_redis, contenders::cold::REDIS_NAME);
    println!();
}

fn expiry(calling_time: Duration, svg: Option<&std::path::Path>, with_redis: bool) {
    let driver = Loop {
        tasks: 64,
        duration: calling_time,
        keys: Keys::One,
        ttl: Duration::from_secs(1),
    };
    let mut runs = for_each!(expiry, driver, with_redis);
    runs.push(driver.run(
        "stampede, never expires",
        &contenders::expiry::LOADS.stampede_hits,
        contenders::expiry::stampede_hits,
    ));
    let title = format!(
        "expiry under load: TTL 1 s, 64 tasks calling one key for {} s, 100 ms loads \
         (stampede: stale = \"5s\")",
        calling_time.as_secs_f64()
    );
    let extras = [Extra {
        header: "max after cold start",
        cell: |run| latency(run.max_after_cold),
    }];
    print!("{}", table(&title, &runs, &extras));
    if let Some(hits) = find(&runs, "stampede, never expires") {
        let p99 = |run: &Run| run.latency.value_at_quantile(0.99) as f64;
        for ours in runs
            .iter()
            .filter(|run| run.label.starts_with("stampede lock"))
        {
            println!(
                "targets, {}: no call slower than 50 ms after the cold start: slowest {}; \
                 p99 within 2x of pure hits: {} / {} = {:.2}x",
                ours.label,
                latency(ours.max_after_cold),
                latency(Duration::from_nanos(p99(ours) as u64)),
                latency(Duration::from_nanos(p99(hits) as u64)),
                p99(ours) / p99(hits),
            );
        }
    }
    redis_note(with_redis, contenders::expiry::REDIS_NAME);
    if let Some(path) = svg {
        match timeline::draw(path, &title, &runs) {
            Ok(()) => println!("timeline written to {}", path.display()),
            Err(error) => eprintln!("could not draw the timeline to {}: {error}", path.display()),
        }
    }
    println!();
}

fn zipf(calling_time: Duration, with_redis: bool) {
    let driver = Loop {
        tasks: 64,
        duration: calling_time,
        keys: Keys::Zipf {
            keys: 100_000,
            exponent: 1.0,
        },
        ttl: Duration::from_secs(2),
    };
    let runs = for_each!(zipf, driver, with_redis);
    let extras = [
        Extra {
            header: "lower bound",
            cell: |run| thousands(run.lower_bound),
        },
        Extra {
            header: "loads/bound",
            cell: |run| format!("{:.2}", run.loads as f64 / run.lower_bound.max(1) as f64),
        },
    ];
    let title = format!(
        "Zipf (s = 1.0) over 100,000 keys, TTL 2 s, 64 tasks calling for {} s, 100 ms loads",
        calling_time.as_secs_f64()
    );
    print!("{}", table(&title, &runs, &extras));
    println!(
        "lower bound: the fewest loads that could serve this run's calls, one load serving a \
         key's calls from its start until its value expires (100 ms + 2 s later, +2 ms for \
         timer rounding)"
    );
    redis_note(with_redis, contenders::zipf::REDIS_NAME);
    println!();
}

/// What the `lock = "redis"` contender did with Redis in a scenario, from its stats (the
/// warming call's Redis lock included).
fn redis_note(with_redis: bool, name: &str) {
    let Some(stats) = with_redis.then(|| stampede::stats(name)).flatten() else {
        return;
    };
    println!(
        "stampede lock=redis, from its stats: {} Redis locks taken (1 by the warming call), \
         {} values read from Redis, {} loads without Redis (degraded)",
        thousands(stats.lock_acquired),
        thousands(stats.remote_hits),
        thousands(stats.degraded),
    );
}

fn many(url: &str, (processes, callers): (usize, usize), repeats: usize) {
    println!(
        "many processes: {processes} processes x {callers} callers on one cold key, \
         lock = \"redis\", 300 ms load; {repeats} runs"
    );
    let round_trip = match many::round_trip(url, 1_000) {
        Ok(round_trip) => round_trip,
        Err(error) => {
            println!("could not measure a Redis round trip: {error}\n");
            return;
        }
    };
    let publication = many::publication_delay(url, 200);
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(error) => {
            println!("cannot find this program to start its copies: {error}\n");
            return;
        }
    };
    println!(
        "{:<4}  {:>5}  {:>16}  after the fill, in each waiting process: its first caller \
         returned / its last",
        "run", "loads", "calls with value"
    );
    let mut slowest = Duration::ZERO;
    let mut all_delays = Vec::new();
    let mut first_delays = Vec::new();
    for run in 1..=repeats {
        match multi_instance::run(&exe, url, processes, callers) {
            Ok(report) => {
                let delays = &report.release_delays;
                slowest = slowest.max(delays.iter().max().copied().unwrap_or_default());
                all_delays.extend(delays.iter().copied());
                first_delays.extend(report.first_release_delays.iter().copied());
                println!(
                    "{run:<4}  {:>5}  {:>16}  {}",
                    report.loads,
                    format!(
                        "{} / {}",
                        thousands(report.calls_ok),
                        thousands((processes * callers) as u64)
                    ),
                    report
                        .first_release_delays
                        .iter()
                        .zip(delays)
                        .map(|(first, last)| format!("{} / {}", latency(*first), latency(*last)))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
            Err(error) => println!("{run:<4}  failed: {error}"),
        }
    }
    let median = |mut delays: Vec<Duration>| {
        delays.sort();
        delays
            .get(delays.len() / 2)
            .copied()
            .map_or("-".into(), latency)
    };
    let finished = !all_delays.is_empty();
    let budget = round_trip.p50 + Duration::from_millis(1);
    println!(
        "Redis round trip, {} PINGs in a row on one connection, this run: p50 {}, p99 {}",
        thousands(round_trip.pings),
        latency(round_trip.p50),
        latency(round_trip.p99)
    );
    match publication {
        Ok(publication) => println!(
            "a publication's way to an idle subscriber (PUBLISH to a plain redis pub/sub stream \
             on another runtime), {} messages: p50 {}, p99 {}",
            thousands(publication.pings),
            latency(publication.p50),
            latency(publication.p99)
        ),
        Err(error) => println!("could not time a publication: {error}"),
    }
    println!(
        "target: waiters released within one round trip + 1 ms = {} of the fill; last callers: \
         median {}, slowest {} ({}); first callers: median {}",
        latency(budget),
        median(all_delays),
        latency(slowest),
        if !finished {
            "no run finished"
        } else if slowest <= budget {
            "met"
        } else {
            "missed"
        },
        median(first_delays),
    );
    println!(
        "the fill: the moment the loading process's load returned its value; each delay includes \
         writing it to Redis and publishing it (one round trip), the publication's way to the \
         waiting process, and its {callers} callers' wake-up"
    );
    println!();
}

fn find<'a>(runs: &'a [Run], label_start: &str) -> Option<&'a Run> {
    runs.iter().find(|run| run.label.starts_with(label_start))
}

/// The 1-minute load average, to say how busy the machine was.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "unknown".into())
}

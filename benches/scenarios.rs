//! The scenario runner: what each contender does to the upstream, and to its callers, when many
//! calls meet a cold key, an expiring key, or a skewed key space.
//!
//! ```sh
//! cargo bench --bench scenarios              # the full run, about a minute and a half
//! cargo bench --bench scenarios -- --quick   # shorter calling loops, under a minute
//! ```
//!
//! Options: `--quick`; `--only cold,expiry,zipf` to run some scenarios; `--svg PATH` to write
//! the expiry timeline there (the full run writes `docs/expiry-timeline.svg` by default).
//!
//! Scenarios, each with one row per contender (see `scenarios/contenders.rs`):
//! - cold stampede: 10,000 concurrent calls on one cold key, a 100 ms load;
//! - expiry under load: TTL 1 s, 64 tasks calling one key in a loop for 5 s, 100 ms loads
//!   (`stampede` with `stale = "5s"`), plus `stampede` on a key that never expires as the
//!   reference for a pure hit;
//! - Zipf (s = 1.0) over 100,000 keys, TTL 2 s, 64 tasks calling for 5 s: loads against the
//!   fewest loads any cache with that TTL could have made for the same calls.

#[path = "scenarios/contenders.rs"]
mod contenders;
#[path = "scenarios/drive.rs"]
mod drive;
#[path = "scenarios/report.rs"]
mod report;
#[path = "scenarios/timeline.rs"]
mod timeline;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use contenders::for_each;
use drive::{Cold, Keys, Loop, Run};
use report::{Extra, latency, table, thousands};

const USAGE: &str = "usage: cargo bench --bench scenarios -- [--quick] \
                     [--only cold,expiry,zipf] [--svg PATH]";

struct Options {
    quick: bool,
    only: Vec<String>,
    svg: Option<PathBuf>,
}

impl Options {
    fn parse() -> Result<Options, String> {
        let mut options = Options {
            quick: false,
            only: Vec::new(),
            svg: None,
        };
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--quick" => options.quick = true,
                "--only" => {
                    let names = args.next().ok_or("--only needs a list of scenarios")?;
                    for name in names.split(',') {
                        if !["cold", "expiry", "zipf"].contains(&name) {
                            return Err(format!("no scenario called `{name}`"));
                        }
                        options.only.push(name.to_owned());
                    }
                }
                "--svg" => options.svg = Some(args.next().ok_or("--svg needs a path")?.into()),
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
    println!();

    if options.runs("cold") {
        cold();
    }
    if options.runs("expiry") {
        expiry(calling_time, options.svg.as_deref());
    }
    if options.runs("zipf") {
        zipf(calling_time);
    }
    println!(
        "done in {:.1} s, load average {} at the end",
        began.elapsed().as_secs_f64(),
        load_average()
    );
    ExitCode::SUCCESS
}

fn cold() {
    let runs = for_each!(cold, Cold { calls: 10_000 });
    print!(
        "{}",
        table(
            "cold stampede: 10,000 concurrent calls on one cold key, 100 ms load",
            &runs,
            &[],
        )
    );
    if let Some(ours) = find(&runs, "stampede") {
        println!(
            "target: exactly one load per cold stampede; stampede made {}",
            ours.loads
        );
    }
    println!();
}

fn expiry(calling_time: Duration, svg: Option<&std::path::Path>) {
    let driver = Loop {
        tasks: 64,
        duration: calling_time,
        keys: Keys::One,
        ttl: Duration::from_secs(1),
    };
    let mut runs = for_each!(expiry, driver);
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
    if let (Some(ours), Some(hits)) = (
        find(&runs, "stampede lock"),
        find(&runs, "stampede, never expires"),
    ) {
        let p99 = |run: &Run| run.latency.value_at_quantile(0.99) as f64;
        println!(
            "targets: no call slower than 50 ms after the cold start: stampede's slowest {}; \
             p99 within 2x of pure hits: {} / {} = {:.2}x",
            latency(ours.max_after_cold),
            latency(Duration::from_nanos(p99(ours) as u64)),
            latency(Duration::from_nanos(p99(hits) as u64)),
            p99(ours) / p99(hits),
        );
    }
    if let Some(path) = svg {
        match timeline::draw(path, &title, &runs) {
            Ok(()) => println!("timeline written to {}", path.display()),
            Err(error) => eprintln!("could not draw the timeline to {}: {error}", path.display()),
        }
    }
    println!();
}

fn zipf(calling_time: Duration) {
    let driver = Loop {
        tasks: 64,
        duration: calling_time,
        keys: Keys::Zipf {
            keys: 100_000,
            exponent: 1.0,
        },
        ttl: Duration::from_secs(2),
    };
    let runs = for_each!(zipf, driver);
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

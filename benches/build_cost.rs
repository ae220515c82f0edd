//! What a cached function costs the build (issue 38): generates throwaway crates of N functions
//! that are identical but for the cache, rebuilds each one alone after a touch of its source, and
//! prints a markdown table of the build time, peak memory and binary size per function, with
//! `stampede` (memory, and `lock = "redis"`) next to the `cached` crate and no cache at all.
//!
//! ```sh
//! cargo run --release -p stampede-benches --bin build_cost             # N = 1, 50, 200; 3 profiles; 3 runs
//! cargo run --release -p stampede-benches --bin build_cost -- --quick  # N = 1, 50; debug only; 1 run
//! ```
//!
//! Other options: `--runs R`, `--ns 1,50,200`, `--profiles debug,debug-noincr,release`,
//! `--work DIR` (where the crates and their shared target dir go; by default `build-cost/` in
//! `CARGO_TARGET_DIR`, or in the repository's `target/`), `--stampede PATH` (the repository whose
//! `stampede-cache` the crates depend on; by default the one this program was built from),
//! `--distinct-types` (each function returns a type of its own, `struct Vk(String)` with serde's
//! derives, as a service's repository functions do, rather than every function a `String`).
//!
//! Only `std`: the builds are `cargo` processes, peak memory is read from `/usr/bin/time`
//! (GNU time's `%M`, the largest resident set of cargo, rustc and the linker) when it is
//! installed, and the stripped size from `strip` when it is.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Instant, SystemTime};

/// What the generated crates are told to cache with.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Contender {
    /// `#[stampede::cached(ttl = "60s")]`: the memory tier.
    Stampede,
    /// `#[stampede::cached(ttl = "60s", lock = "redis")]`: the Redis tier.
    StampedeRedis,
    /// The `cached` crate's `#[cached(ttl_secs = 60)]` on an async fn (4.x's name for `time`).
    Cached,
    /// No cache: the baseline every other contender is measured against.
    NoCache,
}

impl Contender {
    /// Every contender, in the order of the table.
    const ALL: [Contender; 4] = [
        Contender::Stampede,
        Contender::StampedeRedis,
        Contender::Cached,
        Contender::NoCache,
    ];

    /// The name in the table.
    fn label(self) -> &'static str {
        match self {
            Contender::Stampede => "stampede",
            Contender::StampedeRedis => "stampede `lock = \"redis\"`",
            Contender::Cached => "`cached`",
            Contender::NoCache => "no cache",
        }
    }

    /// The package name of its crate of `n` functions (`bt_`: of distinct value types).
    fn package(self, n: usize, distinct: bool) -> String {
        let tag = match self {
            Contender::Stampede => "stampede",
            Contender::StampedeRedis => "redis",
            Contender::Cached => "cached",
            Contender::NoCache => "none",
        };
        let prefix = if distinct { "bt" } else { "bc" };
        format!("{prefix}_{tag}_{n}")
    }

    /// The attribute line above each function (empty for no cache).
    fn attribute(self) -> &'static str {
        match self {
            Contender::Stampede => "#[stampede::cached(ttl = \"60s\")]\n",
            Contender::StampedeRedis => "#[stampede::cached(ttl = \"60s\", lock = \"redis\")]\n",
            Contender::Cached => "#[cached::cached(ttl_secs = 60)]\n",
            Contender::NoCache => "",
        }
    }

    /// Whether the ratio column compares this contender with `cached`.
    fn is_stampede(self) -> bool {
        matches!(self, Contender::Stampede | Contender::StampedeRedis)
    }
}

/// A cargo profile the crates are built with.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Profile {
    /// `dev` as a user's `cargo build` has it: incremental.
    Debug,
    /// `dev` without incremental compilation (a profile of the generated workspace).
    DebugNoIncr,
    /// `release` as cargo defines it.
    Release,
}

impl Profile {
    /// Parses a `--profiles` item.
    fn parse(name: &str) -> Result<Profile, String> {
        match name {
            "debug" => Ok(Profile::Debug),
            "debug-noincr" => Ok(Profile::DebugNoIncr),
            "release" => Ok(Profile::Release),
            other => Err(format!(
                "unknown profile {other:?} (debug, debug-noincr, release)"
            )),
        }
    }

    /// The name given to `cargo build --profile`.
    fn cargo_name(self) -> &'static str {
        match self {
            Profile::Debug => "dev",
            Profile::DebugNoIncr => "dev-noincr",
            Profile::Release => "release",
        }
    }

    /// The folder of the target dir its binaries land in.
    fn dir(self) -> &'static str {
        match self {
            Profile::Debug => "debug",
            Profile::DebugNoIncr => "dev-noincr",
            Profile::Release => "release",
        }
    }

    /// The heading of its table.
    fn heading(self) -> &'static str {
        match self {
            Profile::Debug => "debug (`dev`, incremental: a user's `cargo build`)",
            Profile::DebugNoIncr => "debug without incremental (`dev`, `incremental = false`)",
            Profile::Release => "release (`release`, cargo's defaults)",
        }
    }
}

/// The command line.
struct Options {
    ns: Vec<usize>,
    profiles: Vec<Profile>,
    runs: usize,
    work: PathBuf,
    stampede: PathBuf,
    /// Each function returns a type of its own.
    distinct: bool,
}

impl Options {
    /// Reads the options from the command line (see the module documentation).
    fn parse() -> Result<Options, String> {
        let mut options = Options {
            ns: vec![1, 50, 200],
            profiles: vec![Profile::Debug, Profile::DebugNoIncr, Profile::Release],
            runs: 3,
            work: default_work_dir(),
            stampede: Path::new(env!("CARGO_MANIFEST_DIR")).join(".."),
            distinct: false,
        };
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            let mut value = || args.next().ok_or(format!("{arg} needs a value"));
            match arg.as_str() {
                "--quick" => {
                    options.ns = vec![1, 50];
                    options.profiles = vec![Profile::Debug, Profile::DebugNoIncr];
                    options.runs = 1;
                }
                "--runs" => options.runs = parse_number(&value()?)?,
                "--ns" => options.ns = parse_list(&value()?, parse_number)?,
                "--profiles" => options.profiles = parse_list(&value()?, Profile::parse)?,
                "--work" => options.work = PathBuf::from(value()?),
                "--stampede" => options.stampede = PathBuf::from(value()?),
                "--distinct-types" => options.distinct = true,
                "--bench" => {} // what `cargo bench` passes to every target
                other => return Err(format!("unknown option {other:?}")),
            }
        }
        if options.runs == 0 || options.ns.is_empty() || options.profiles.is_empty() {
            return Err("nothing to measure".into());
        }
        options.stampede = fs::canonicalize(&options.stampede)
            .map_err(|e| format!("{}: {e}", options.stampede.display()))?;
        Ok(options)
    }
}

/// `build-cost/` in `CARGO_TARGET_DIR`, else in the repository's `target/`.
fn default_work_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("build-cost")
}

/// A positive whole number.
fn parse_number(text: &str) -> Result<usize, String> {
    text.parse()
        .map_err(|_| format!("{text:?} is not a whole number"))
}

/// A comma-separated list of items.
fn parse_list<T>(text: &str, item: impl Fn(&str) -> Result<T, String>) -> Result<Vec<T>, String> {
    text.split(',').map(|part| item(part.trim())).collect()
}

/// The source of a crate of `n` functions cached by `contender`, each called once by `main` so
/// that none is dead code; with `distinct`, each returning a type of its own.
fn main_rs(contender: Contender, n: usize, distinct: bool) -> String {
    let mut source = String::from("//! Generated by benches/build_cost.rs: do not edit.\n\n");
    for k in 0..n {
        if distinct {
            let _ = writeln!(
                source,
                "#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]\n\
                 pub struct V{k}(pub String);\n"
            );
        }
        source.push_str(contender.attribute());
        let _ = match distinct {
            true => writeln!(
                source,
                "async fn f{k}(id: u64) -> V{k} {{\n    V{k}(format!(\"f{k} {{id}}\"))\n}}\n"
            ),
            false => writeln!(
                source,
                "async fn f{k}(id: u64) -> String {{\n    format!(\"f{k} {{id}}\")\n}}\n"
            ),
        };
    }
    source.push_str("#[tokio::main(flavor = \"current_thread\")]\nasync fn main() {\n");
    source.push_str("    let mut total = 0;\n");
    let field = if distinct { ".0" } else { "" };
    for k in 0..n {
        let _ = writeln!(source, "    total += f{k}({k}).await{field}.len();");
    }
    source.push_str("    println!(\"{total}\");\n}\n");
    source
}

/// The manifest of one generated crate: the same dependencies for every contender.
fn crate_manifest(package: &str, stampede: &Path) -> String {
    format!(
        "[package]\nname = \"{package}\"\nversion = \"0.0.0\"\nedition = \"2024\"\npublish = false\n\n\
         [dependencies]\n\
         stampede = {{ package = \"stampede-cache\", path = {:?} }}\n\
         cached = {{ version = \"4.1\", features = [\"async\"] }}\n\
         serde = {{ version = \"1\", features = [\"derive\"] }}\n\
         tokio = {{ version = \"1\", features = [\"rt\", \"macros\"] }}\n",
        stampede.display().to_string()
    )
}

/// The workspace of every generated crate: one lock file, and the profile without incremental.
fn workspace_manifest(members: &[String]) -> String {
    let members: Vec<String> = members.iter().map(|m| format!("{m:?}")).collect();
    format!(
        "# Generated by benches/build_cost.rs: throwaway crates, never committed.\n\
         [workspace]\nmembers = [{}]\nresolver = \"3\"\n\n\
         [profile.dev-noincr]\ninherits = \"dev\"\nincremental = false\n",
        members.join(", ")
    )
}

/// Writes the workspace and its crates under `options.work`/crates; the lock file starts as
/// the repository's, so the crates build the versions the repository is tested with.
fn generate(options: &Options) -> Result<PathBuf, String> {
    let root = options.work.join("crates");
    let mut members = Vec::new();
    for &n in &options.ns {
        for contender in Contender::ALL {
            let package = contender.package(n, options.distinct);
            let dir = root.join(&package);
            write(
                &dir.join("Cargo.toml"),
                &crate_manifest(&package, &options.stampede),
            )?;
            write(
                &dir.join("src/main.rs"),
                &main_rs(contender, n, options.distinct),
            )?;
            members.push(package);
        }
    }
    write(&root.join("Cargo.toml"), &workspace_manifest(&members))?;
    let lock = root.join("Cargo.lock");
    if !lock.exists() {
        let _ = fs::copy(options.stampede.join("Cargo.lock"), &lock);
    }
    Ok(root)
}

/// Writes `text` to `path`, creating its folder.
fn write(path: &Path, text: &str) -> Result<(), String> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Sets the modification time of `path` to now, as `touch` does.
fn touch(path: &Path) -> Result<(), String> {
    fs::File::options()
        .write(true)
        .open(path)
        .and_then(|file| file.set_modified(SystemTime::now()))
        .map_err(|e| format!("touch {}: {e}", path.display()))
}

/// One build: its wall time and the peak resident set of the processes it ran.
struct Sample {
    secs: f64,
    peak_kib: Option<u64>,
}

/// Builds the crates of one workspace with one target dir.
struct Builder {
    cargo: String,
    workspace: PathBuf,
    target: PathBuf,
    /// GNU time, when installed: it reports the peak resident set.
    time: Option<PathBuf>,
}

impl Builder {
    /// Builds `package` with `profile`, and times it.
    fn build(&self, package: &str, profile: Profile) -> Result<Sample, String> {
        let peak_file = self.target.join("peak-rss.txt");
        let mut command = match &self.time {
            Some(time) => {
                let mut command = Command::new(time);
                command.arg("-f").arg("%M").arg("-o").arg(&peak_file);
                command.arg(&self.cargo);
                command
            }
            None => Command::new(&self.cargo),
        };
        command
            .args(["build", "--quiet", "--profile", profile.cargo_name(), "-p"])
            .arg(package)
            .arg("--manifest-path")
            .arg(self.workspace.join("Cargo.toml"))
            .arg("--target-dir")
            .arg(&self.target)
            // The profile decides incremental compilation, as in a user's build.
            .env_remove("CARGO_INCREMENTAL")
            .env_remove("CARGO_TARGET_DIR")
            .env_remove("CARGO_BUILD_TARGET_DIR")
            .stdout(Stdio::null());
        let started = Instant::now();
        let status = command
            .status()
            .map_err(|e| format!("{}: {e}", self.cargo))?;
        let secs = started.elapsed().as_secs_f64();
        if !status.success() {
            return Err(format!("cargo build -p {package} failed: {status}"));
        }
        let peak_kib = self.time.as_ref().and_then(|_| {
            fs::read_to_string(&peak_file)
                .ok()
                .and_then(|text| text.lines().last()?.trim().parse().ok())
        });
        Ok(Sample { secs, peak_kib })
    }

    /// The path of `package`'s binary built with `profile`.
    fn binary(&self, package: &str, profile: Profile) -> PathBuf {
        self.target.join(profile.dir()).join(package)
    }
}

/// The size of a file in bytes, and of a stripped copy when `strip` runs.
fn sizes(binary: &Path) -> Result<(u64, Option<u64>), String> {
    let size = fs::metadata(binary)
        .map_err(|e| format!("{}: {e}", binary.display()))?
        .len();
    let copy = binary.with_extension("stripped");
    fs::copy(binary, &copy).map_err(|e| format!("{}: {e}", copy.display()))?;
    let stripped = Command::new("strip")
        .arg(&copy)
        .status()
        .ok()
        .filter(|status| status.success())
        .and_then(|_| fs::metadata(&copy).ok())
        .map(|meta| meta.len());
    let _ = fs::remove_file(&copy);
    Ok((size, stripped))
}

/// What was measured for one crate with one profile.
#[derive(Default)]
struct Measure {
    samples: Vec<Sample>,
    size: u64,
    stripped: Option<u64>,
}

impl Measure {
    /// The median build time in seconds.
    fn secs(&self) -> f64 {
        median(self.samples.iter().map(|s| s.secs).collect())
    }

    /// The median peak resident set in MiB, when known.
    fn peak_mib(&self) -> Option<f64> {
        let peaks: Vec<f64> = self
            .samples
            .iter()
            .filter_map(|s| s.peak_kib)
            .map(|kib| kib as f64 / 1024.0)
            .collect();
        (!peaks.is_empty()).then(|| median(peaks))
    }

    /// The fastest and slowest build, for the spread column.
    fn range(&self) -> (f64, f64) {
        let secs = self.samples.iter().map(|s| s.secs);
        let min = secs.clone().fold(f64::INFINITY, f64::min);
        (min, secs.fold(0.0, f64::max))
    }
}

/// The median of some values (the mean of the middle two for an even count).
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

/// Every measure, by profile, N and contender.
type Results = BTreeMap<(Profile, usize, Contender), Measure>;

/// Runs every build of one profile: a warm-up that builds the dependencies (and, with
/// incremental compilation, each crate once so that its incremental state exists), then `runs`
/// rounds of touch-and-build per N, the contenders interleaved so that a change in the
/// machine's load falls on all of them alike.
fn measure_profile(
    builder: &Builder,
    options: &Options,
    profile: Profile,
    results: &mut Results,
) -> Result<(), String> {
    eprintln!("{}: building the dependencies", profile.cargo_name());
    builder.build(
        &Contender::NoCache.package(options.ns[0], options.distinct),
        profile,
    )?;
    if profile == Profile::Debug {
        for &n in &options.ns {
            for contender in Contender::ALL {
                builder.build(&contender.package(n, options.distinct), profile)?;
            }
        }
    }
    for &n in &options.ns {
        for run in 0..options.runs {
            for contender in Contender::ALL {
                let package = contender.package(n, options.distinct);
                touch(&builder.workspace.join(&package).join("src/main.rs"))?;
                let sample = builder.build(&package, profile)?;
                eprintln!(
                    "{} N={n} {} run {}: {:.2}s, peak {} KiB",
                    profile.cargo_name(),
                    contender.label(),
                    run + 1,
                    sample.secs,
                    sample.peak_kib.unwrap_or(0)
                );
                results
                    .entry((profile, n, contender))
                    .or_default()
                    .samples
                    .push(sample);
            }
        }
        for contender in Contender::ALL {
            let package = contender.package(n, options.distinct);
            let (size, stripped) = sizes(&builder.binary(&package, profile))?;
            let measure = results.entry((profile, n, contender)).or_default();
            measure.size = size;
            measure.stripped = stripped;
        }
    }
    Ok(())
}

/// The first line a command prints, or `unknown`.
fn first_line(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .ok()
        .and_then(|out| {
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            text.lines().next().map(str::to_owned)
        })
        .unwrap_or_else(|| "unknown".into())
}

/// The CPU model from /proc/cpuinfo.
fn cpu_model() -> String {
    fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|line| line.starts_with("model name"))
                .and_then(|line| line.split(':').nth(1))
                .map(|model| model.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// The 1-minute load average, for the header.
fn load_average() -> String {
    fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "unknown".into())
}

/// The lines above the tables: when, what and where.
fn header(options: &Options, date: &str, load_before: &str, minutes: f64) -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let args: Vec<String> = std::env::args().skip(1).collect();
    format!(
        "Build cost of a cached function, started {date}\n\n\
         - rustc: `{}`; machine: {cores} cores (nproc), {}; 1-minute load average {load_before} \
         before, {} after\n\
         - command: `cargo run --release -p stampede-benches --bin build_cost{}{}`; {} min\n\
         - each crate alone rebuilt after a touch of its source, median of {} run(s); \
         the per-function columns are (crate - no cache with the same N) / N; \
         `x cached` is stampede's per-function figure over `cached`'s\n\
         - the functions: {}\n",
        first_line("rustc", &["-V"]),
        cpu_model(),
        load_average(),
        if args.is_empty() { "" } else { " -- " },
        args.join(" "),
        format_args!("{minutes:.1}"),
        options.runs,
        match options.distinct {
            true => "`async fn fK(id: u64) -> VK`, each of its own `struct VK(String)`",
            false => "`async fn fK(id: u64) -> String`",
        },
    )
}

/// Per function: what `value` of the crate adds over the no-cache crate of the same N.
fn per_function(value: f64, baseline: f64, n: usize) -> f64 {
    (value - baseline) / n as f64
}

/// Bytes as KB.
fn kb(bytes: u64) -> f64 {
    bytes as f64 / 1000.0
}

/// A stampede contender's figure over `cached`'s (see [`ratio`]); empty for the others, or when
/// either is unknown.
fn versus(contender: Contender, ours: Option<f64>, theirs: Option<f64>) -> String {
    match (ours, theirs) {
        (Some(ours), Some(theirs)) if contender.is_stampede() => ratio(ours, theirs),
        _ => String::new(),
    }
}

/// `ours / theirs` as `1.2x`, or `n/a` when `theirs` is not above zero (noise).
fn ratio(ours: f64, theirs: f64) -> String {
    if theirs > 0.0 {
        format!("{:.1}x", ours / theirs)
    } else {
        "n/a".into()
    }
}

/// The table of one profile.
fn table(results: &Results, options: &Options, profile: Profile) -> String {
    let mut out = format!("\n### {}\n\n", profile.heading());
    out.push_str(
        "| N | contender | build s (median [min..max]) | s per fn | x cached | peak RSS MiB \
         | binary KB | KB per fn | x cached | stripped KB | stripped KB per fn | x cached |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for &n in &options.ns {
        let Some(base) = results.get(&(profile, n, Contender::NoCache)) else {
            continue;
        };
        let cached = results.get(&(profile, n, Contender::Cached));
        for contender in Contender::ALL {
            if let Some(measure) = results.get(&(profile, n, contender)) {
                out.push_str(&row(n, contender, measure, base, cached));
            }
        }
    }
    out
}

/// One row of a table.
fn row(
    n: usize,
    contender: Contender,
    measure: &Measure,
    base: &Measure,
    cached: Option<&Measure>,
) -> String {
    let secs_fn = |m: &Measure| per_function(m.secs(), base.secs(), n);
    let size_fn = |m: &Measure| per_function(kb(m.size), kb(base.size), n);
    let stripped_fn = |m: &Measure| Some(per_function(kb(m.stripped?), kb(base.stripped?), n));
    let versus = |ours, theirs| versus(contender, ours, theirs);
    let is_base = contender == Contender::NoCache;
    let dash_or = |text: String| if is_base { "-".to_owned() } else { text };
    let (min, max) = measure.range();
    let stripped = measure.stripped.map(kb);
    format!(
        "| {n} | {} | {:.2} [{min:.2}..{max:.2}] | {} | {} | {} | {:.0} | {} | {} | {} | {} | {} |\n",
        contender.label(),
        measure.secs(),
        dash_or(format!("{:.3}", secs_fn(measure))),
        versus(Some(secs_fn(measure)), cached.map(secs_fn)),
        measure
            .peak_mib()
            .map_or("?".into(), |mib| format!("{mib:.0}")),
        kb(measure.size),
        dash_or(format!("{:.1}", size_fn(measure))),
        versus(Some(size_fn(measure)), cached.map(size_fn)),
        stripped.map_or("?".into(), |s| format!("{s:.0}")),
        dash_or(stripped_fn(measure).map_or("?".into(), |s| format!("{s:.1}"))),
        versus(stripped_fn(measure), cached.and_then(stripped_fn)),
    )
}

/// What one more function costs, apart from what the crate pays once (the runtime's generic
/// code instantiated for the key and value types, the Redis client linked in): the slope
/// between the smallest and the largest N, `(crate(N2) - crate(N1)) / (N2 - N1)`, and the
/// intercept, what a crate of N1 costs over no cache less N1 times that slope. Nothing when
/// only one N was measured.
fn marginal_table(results: &Results, options: &Options, profile: Profile) -> String {
    let (Some(&low), Some(&high)) = (options.ns.iter().min(), options.ns.iter().max()) else {
        return String::new();
    };
    if low == high {
        return String::new();
    }
    let mut out = format!(
        "\n#### one more function ({}): N = {low} to {high}\n\n\
         | contender | s per fn | x cached | fixed s | stripped KB per fn | x cached | fixed stripped KB |\n\
         |---|---|---|---|---|---|---|\n",
        profile.cargo_name()
    );
    let get = |n, contender| results.get(&(profile, n, contender));
    // Slope and intercept of one quantity, when both crates and the baseline were measured.
    let line = |contender, of: &dyn Fn(&Measure) -> Option<f64>| {
        let (a, b, base) = (
            of(get(low, contender)?)?,
            of(get(high, contender)?)?,
            of(get(low, Contender::NoCache)?)?,
        );
        let slope = (b - a) / (high - low) as f64;
        Some((slope, a - base - slope * low as f64))
    };
    let secs = |m: &Measure| Some(m.secs());
    let stripped = |m: &Measure| m.stripped.map(kb);
    let cached = (
        line(Contender::Cached, &secs),
        line(Contender::Cached, &stripped),
    );
    for contender in Contender::ALL {
        if contender == Contender::NoCache {
            continue;
        }
        let (time, size) = (line(contender, &secs), line(contender, &stripped));
        // The slopes compared.
        let versus = |ours: Option<(f64, f64)>, theirs: Option<(f64, f64)>| {
            versus(
                contender,
                ours.map(|line| line.0),
                theirs.map(|line| line.0),
            )
        };
        let shown = |value: Option<(f64, f64)>, digits: usize, pick: fn((f64, f64)) -> f64| {
            value.map_or("?".into(), |value| format!("{:.digits$}", pick(value)))
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} |",
            contender.label(),
            shown(time, 3, |(slope, _)| slope),
            versus(time, cached.0),
            shown(time, 2, |(_, fixed)| fixed),
            shown(size, 1, |(slope, _)| slope),
            versus(size, cached.1),
            shown(size, 0, |(_, fixed)| fixed),
        );
    }
    out
}

/// GNU time, if installed.
fn gnu_time() -> Option<PathBuf> {
    let time = PathBuf::from("/usr/bin/time");
    let works = Command::new(&time)
        .args(["-f", "%M", "true"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    works.then_some(time)
}

fn main() {
    if let Err(error) = run() {
        eprintln!("build_cost: {error}");
        std::process::exit(1);
    }
}

/// Generates the crates, measures every profile and prints the tables.
fn run() -> Result<(), String> {
    let options = Options::parse()?;
    let started = Instant::now();
    let date = first_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"]);
    let load_before = load_average();
    let builder = Builder {
        cargo: std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()),
        workspace: generate(&options)?,
        target: options.work.join("target"),
        time: gnu_time(),
    };
    fs::create_dir_all(&builder.target).map_err(|e| format!("{e}"))?;
    eprintln!("crates in {}", builder.workspace.display());
    let mut results = Results::new();
    for &profile in &options.profiles {
        measure_profile(&builder, &options, profile, &mut results)?;
        // Each table as soon as its profile is done: a run cut short keeps what it measured.
        print!("{}", table(&results, &options, profile));
        print!("{}", marginal_table(&results, &options, profile));
    }
    let minutes = started.elapsed().as_secs_f64() / 60.0;
    println!();
    print!("{}", header(&options, &date, &load_before, minutes));
    if builder.time.is_none() {
        println!("- peak memory unknown: /usr/bin/time (GNU time) is not installed");
    }
    Ok(())
}

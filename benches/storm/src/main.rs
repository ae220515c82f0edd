//! `stampede-storm`: the expiry-storm benchmark (issue 25). See README.md beside this folder.
//!
//! ```sh
//! cargo run --release -p stampede-storm            # every contender, the full plan
//! cargo run --release -p stampede-storm -- --quick # the short plan
//! ```
//!
//! `stampede-storm service ...` is one instance of the service; the benchmark starts those
//! itself.

mod contender;
mod orchestrate;
mod plan;
mod product;
mod schema;
mod service;
mod wire;

use std::path::PathBuf;
use std::process::ExitCode;

use crate::contender::Contender;
use crate::orchestrate::Options;
use crate::orchestrate::load::LoadConfig;

const USAGE: &str = "\
usage: stampede-storm [--quick] [--rate N] [--zipf S] [--seed N] [--instances N] [--pool N]
                      [--contenders a,b,...] [--out DIR]

Runs every contender (none, moka, cached-redis, stampede-local, stampede-redis,
stampede-refresh) as 4 instances over one PostgreSQL and one Redis it starts on loopback,
through a cold start, steady state, a synchronized expiry, a slow database and a Redis restart,
under an open-loop HTTP load; writes DIR/report.md and DIR/storm-timeline.svg (DIR defaults to
target/storm in the workspace).

  --quick        the short plan (24 s per contender instead of 37 s)
  --rate N       requests per second over all instances (default 1000)
  --zipf S       the Zipf exponent over the 100,000 products (default 1.2)
  --seed N       the key sequence's seed (default 25)
  --instances N  instances per contender (default 4)
  --pool N       PostgreSQL connections per instance (default 10)
  --contenders   which, in order (default: all)
";

fn options(args: &[String]) -> Result<Options, String> {
    let mut options = Options {
        quick: false,
        load: LoadConfig {
            rate: 1000.0,
            zipf: 1.2,
            seed: 25,
        },
        instances: 4,
        pool: 10,
        contenders: Contender::ALL.to_vec(),
        out: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/storm"),
    };
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        fn number<T: std::str::FromStr>(flag: &str, text: &str) -> Result<T, String> {
            text.parse()
                .map_err(|_| format!("{flag}: expected a number, got `{text}`"))
        }
        match flag.as_str() {
            "--quick" => options.quick = true,
            "--rate" => options.load.rate = number(flag, value()?)?,
            "--zipf" => options.load.zipf = number(flag, value()?)?,
            "--seed" => options.load.seed = number(flag, value()?)?,
            "--instances" => options.instances = number(flag, value()?)?,
            "--pool" => options.pool = number(flag, value()?)?,
            "--contenders" => {
                options.contenders = value()?
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()?
            }
            "--out" => options.out = PathBuf::from(value()?),
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    if options.instances == 0 || options.pool == 0 || options.contenders.is_empty() {
        return Err("--instances, --pool and --contenders need at least one".to_owned());
    }
    Ok(options)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("storm: cannot start a tokio runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = if args.first().map(String::as_str) == Some("service") {
        service::ServiceArgs::parse(&args[1..])
            .and_then(|service_args| runtime.block_on(service::run(service_args)))
    } else {
        match options(&args) {
            Ok(options) => runtime.block_on(orchestrate::run(options)),
            Err(message) if message.is_empty() => {
                print!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            Err(message) => Err(format!("{message}\n\n{USAGE}")),
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("storm: {error}");
            ExitCode::FAILURE
        }
    }
}

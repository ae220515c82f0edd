//! What the benchmarks share: [`BenchRedis`], their Redis, and [`median`].

use std::time::Duration;

use stampede_test_support::redis_server::{Options, RedisServer};

/// The name of the Redis connection the benchmarks' `lock = "redis"` functions use.
pub const CONNECTION: &str = "bench";

/// Where the benchmarks' Redis is: the URL given on the command line, or a server of their own
/// (the test support's [`RedisServer`]: `redis-server`, or `STAMPEDE_TEST_SERVER`'s), started on
/// a free loopback port with no persistence and stopped when this is dropped.
pub struct BenchRedis {
    pub url: String,
    /// How it came to be, for the printed header.
    pub origin: &'static str,
    /// The server this process started, if it started one.
    _server: Option<RedisServer>,
}

impl BenchRedis {
    /// `url` when one is given; otherwise a server of our own when the binary is found.
    /// `Err` says why there is no Redis (the Redis rows are then left out).
    pub fn get(url: Option<String>) -> Result<BenchRedis, String> {
        if let Some(url) = url {
            return Ok(BenchRedis {
                url,
                origin: "given with --redis",
                _server: None,
            });
        }
        let server = RedisServer::try_start_with(Options::default())
            .map_err(|why| format!("{why} (or pass a Redis URL); the Redis rows are left out"))?;
        Ok(BenchRedis {
            url: server.url(),
            origin: "a redis-server of its own",
            _server: Some(server),
        })
    }

    /// The Redis of `STAMPEDE_BENCH_REDIS`, or one of our own, installed as the [`CONNECTION`];
    /// `None`, said on stderr, when there is none (a benchmark of Redis then has nothing to do).
    pub fn installed() -> Option<BenchRedis> {
        let redis = BenchRedis::get(std::env::var("STAMPEDE_BENCH_REDIS").ok())
            .and_then(|redis| redis.install().map(|()| redis));
        redis.map_err(|why| eprintln!("no Redis: {why}")).ok()
    }

    /// The Redis of [`BenchRedis::installed`], also given to the `cached` crate's Redis store,
    /// which reads its URL from `CACHED_REDIS_CONNECTION_STRING`. Call it before any other
    /// thread of the program runs.
    pub fn installed_for_cached() -> Option<BenchRedis> {
        let redis = BenchRedis::installed()?;
        // SAFETY: the caller sets it before any thread of its program reads the environment.
        unsafe { std::env::set_var("CACHED_REDIS_CONNECTION_STRING", &redis.url) };
        Some(redis)
    }

    /// Installs this Redis as the [`CONNECTION`], its keys under a prefix of this process's
    /// own, so that a Redis given with `--redis` holds no value from an earlier run for them.
    pub fn install(&self) -> Result<(), String> {
        stampede::RedisConfig::new(&self.url)
            .map_err(|e| e.to_string())?
            .prefix(format!("stampede-bench-{}", std::process::id()))
            .install_as(CONNECTION);
        Ok(())
    }
}

/// The median of a benchmark's runs (the upper one of an even count).
pub fn median(mut runs: Vec<Duration>) -> Duration {
    runs.sort();
    runs[runs.len() / 2]
}

/// Prints one row per contender: the median of its runs in µs per call, its ratio to the
/// median of the contender at `reference` (named `versus` in the header), and every run.
pub fn print_runs(names: &[&str], runs: &[Vec<Duration>], reference: usize, versus: &str) {
    let medians: Vec<Duration> = runs.iter().cloned().map(median).collect();
    let width = versus.len() + 1;
    println!(
        "{:<32} {:>10} {:>width$}   runs (µs per call)",
        "contender", "median µs", versus
    );
    for (i, name) in names.iter().enumerate() {
        let each: Vec<String> = runs[i]
            .iter()
            .map(|t| format!("{:.1}", t.as_secs_f64() * 1e6))
            .collect();
        let ratio = medians[i].as_secs_f64() / medians[reference].as_secs_f64();
        println!(
            "{name:<32} {:>10.1} {:>w$.2}x   {}",
            medians[i].as_secs_f64() * 1e6,
            ratio,
            each.join(" "),
            w = width - 1
        );
    }
}

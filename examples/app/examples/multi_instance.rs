//! Several processes of one service, one Redis, one cold key: how many loads run, and how soon
//! the processes that waited get the value after it is filled. Start a `redis-server` first.
//!
//! ```sh
//! cargo run -p stampede-examples --example multi_instance -- redis://127.0.0.1:6379/ 4 100
//! ```
//!
//! The arguments are the Redis URL, the number of processes (default 4; the program starts that
//! many copies of itself) and the concurrent calls of each process (default 100).

use std::time::Duration;

use stampede_examples::multi_instance::{LOAD_TIME, child_if_asked, run};

fn main() {
    if child_if_asked() {
        return;
    }
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "redis://127.0.0.1:6379/".to_owned());
    let processes: usize = args.next().and_then(|n| n.parse().ok()).unwrap_or(4);
    let callers: usize = args.next().and_then(|n| n.parse().ok()).unwrap_or(100);
    let exe = std::env::current_exe().expect("cannot find this program's path");
    println!("{processes} processes x {callers} callers on one cold key, Redis at {url}");
    match run(&exe, &url, processes, callers) {
        Ok(report) => {
            println!(
                "  calls that got the value: {} of {}",
                report.calls_ok,
                processes * callers
            );
            println!("  loads in all processes together: {}", report.loads);
            println!(
                "  one process loaded the key ({LOAD_TIME:?}); in the others, after the fill:"
            );
            let ms = |delay: &Duration| delay.as_secs_f64() * 1_000.0;
            for (first, last) in report
                .first_release_delays
                .iter()
                .zip(&report.release_delays)
            {
                println!(
                    "    first caller returned {:.2}ms, last {:.2}ms",
                    ms(first),
                    ms(last)
                );
            }
        }
        Err(error) => {
            eprintln!("error: {error}");
            std::process::exit(1);
        }
    }
}

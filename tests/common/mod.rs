//! Helpers shared by the integration tests.
#![allow(dead_code)] // each test file uses its own subset

#[allow(unused_imports)] // each test file uses its own subset
pub use stampede_test_support::{
    WAIT, eventually, fault_proxy, monitor, redis_server, until, within,
};

pub mod telemetry;

/// The misses of the cache `name` so far (calls that found no servable value in memory and
/// waited for a load or a read), 0 before its first call.
pub fn misses(name: &str) -> u64 {
    stampede::stats(name).map_or(0, |stats| stats.misses)
}

/// The error type of the test functions: a database failure, or the cache's own error.
///
/// It is `Clone`, so `From<stampede::Error>` can hand every caller the original error of a
/// failed load, as the README recommends.
#[derive(Clone, Debug)]
pub enum AppError {
    Db(String),
    Cache(stampede::Error),
}

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AppError::Db(message) => write!(f, "database: {message}"),
            AppError::Cache(message) => write!(f, "cache: {message}"),
        }
    }
}

impl From<stampede::Error> for AppError {
    fn from(error: stampede::Error) -> Self {
        match error.upstream::<AppError>() {
            Some(original) => original.clone(),
            None => AppError::Cache(error),
        }
    }
}

/// Runs this test binary's test `part` as another process of the service, told its part by the
/// environment variable `var` (`value`), and waits for it to end; its output. Fails the test if
/// it does not end within [`WAIT`], or fails. The part is a `#[test]` that returns at once when
/// `var` is unset (a plain pass in the normal run).
pub async fn another_process(part: &str, var: &str, value: &str) -> String {
    use std::io::Read as _;
    use std::process::{Command, Stdio};

    /// Kills the process when dropped (a failed test leaves no process behind).
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    let exe = std::env::current_exe().expect("this test binary's path");
    let mut child = Killed(
        Command::new(exe)
            .args(["--exact", part, "--nocapture", "--test-threads", "1"])
            .env(var, value)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|error| panic!("cannot start the {part} process: {error}")),
    );
    let status = until(&format!("the {part} process to end"), WAIT, || {
        let exited = child.0.try_wait().expect("the process's status");
        async move { exited }
    })
    .await;
    let mut output = String::new();
    child
        .0
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut output)
        .unwrap();
    assert!(status.success(), "the {part} process failed: {output}");
    output
}

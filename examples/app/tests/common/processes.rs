//! The processes of a multi-process scenario: copies of the test binary, each told its part by
//! environment variables, their stdout lines collected as they come.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Lines of the processes' stdout: (process index, line).
pub type Lines = mpsc::Receiver<(usize, String)>;

/// One child process, killed if still running when dropped.
pub struct Process {
    pub child: Child,
    /// The thread that forwards its stdout lines: done once every line is on the receiver.
    forwarding: std::thread::JoinHandle<()>,
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `count` copies of this binary with `env` set; their stdout lines arrive on the
/// receiver as (process index, line).
pub fn start(count: usize, env: &[(&str, String)]) -> Result<(Vec<Process>, Lines), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    start_exe(&exe, count, env)
}

/// Starts `count` copies of the binary `exe` with `env` set, as [`start`] does; their stdin is
/// a pipe the caller may write commands to (`process.child.stdin`).
pub fn start_exe(
    exe: &Path,
    count: usize,
    env: &[(&str, String)],
) -> Result<(Vec<Process>, Lines), String> {
    let (lines, received) = mpsc::channel();
    let mut processes = Vec::new();
    for index in 0..count {
        let mut command = Command::new(exe);
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command
            .spawn()
            .map_err(|e| format!("cannot start a process: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let lines = lines.clone();
        let forwarding = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = lines.send((index, line));
            }
        });
        processes.push(Process { child, forwarding });
    }
    Ok((processes, received))
}

/// Waits for every process to exit successfully, within `limit`, and for every line it wrote
/// to be on the receiver (its exit does not wait for the thread that forwards them).
pub fn finish(processes: &mut [Process], limit: Duration) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    for process in processes.iter_mut() {
        loop {
            match process.child.try_wait().map_err(|e| e.to_string())? {
                Some(status) if status.success() => break,
                Some(status) => return Err(format!("a process failed: {status}")),
                None if Instant::now() > deadline => {
                    return Err(format!("a process did not finish within {limit:?}"));
                }
                None => std::thread::sleep(Duration::from_millis(10)),
            }
        }
        while !process.forwarding.is_finished() {
            if Instant::now() > deadline {
                return Err(format!("a process's output did not end within {limit:?}"));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    Ok(())
}

/// Runs each scenario with `run`, in turn, printing its outcome as the test harness prints a
/// test's; returns how many failed.
pub fn run_scenarios<S>(
    scenarios: impl IntoIterator<Item = (&'static str, S)>,
    mut run: impl FnMut(S) -> Result<(), String>,
) -> usize {
    let mut failed = 0;
    for (name, scenario) in scenarios {
        let started = Instant::now();
        match run(scenario) {
            Ok(()) => println!(
                "test {name} ... ok ({:.1}s)",
                started.elapsed().as_secs_f64()
            ),
            Err(error) => {
                failed += 1;
                println!("test {name} ... FAILED\n  {error}");
            }
        }
    }
    failed
}

/// `Ok` if `condition` holds, else the scenario's failure, `message`.
pub fn check(condition: bool, message: impl FnOnce() -> String) -> Result<(), String> {
    if condition { Ok(()) } else { Err(message()) }
}

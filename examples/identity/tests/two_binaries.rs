//! Two binaries of different crates (`node`, `admin`), each with its own copy of the cached type
//! and one cache name, share that cache through a real Redis: a fill in one is a hit in the
//! other; an invalidation and a tag invalidation in one reach the other's memory. A third
//! (`reshaped`), whose type has another shape under that name, never reads their bytes: it
//! loads its own values, and nobody counts a decode error; an invalidation from either shape
//! still reaches the other's values (a rolling deploy never splits the fleet).
//!
//! Its own harness (`harness = false`): it runs the scenario, starting the three binaries as
//! real processes that answer commands on stdin (see the package's src/lib.rs).

#[path = "../../app/tests/common/processes.rs"]
#[allow(dead_code)] // the harness of examples/app, of which this test uses a part
mod processes;

use std::io::Write;
use std::process::ChildStdin;
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

use processes::{Lines, Process, check};
use stampede_test_support::redis_server::RedisServer;

/// Every wait on a process's reply, and on an invalidation reaching another process.
const WAIT: Duration = Duration::from_secs(30);

fn main() {
    let failed = processes::run_scenarios(
        [(
            "two binaries share a cache by name and shape; a third shape keeps its own values, and an invalidation from either shape reaches both",
            one_cache_across_binaries as fn() -> Result<(), String>,
        )],
        |scenario| scenario(),
    );
    if failed > 0 {
        std::process::exit(1);
    }
}

/// One binary, running: commands go to its stdin, replies come back one line each.
struct Binary {
    name: &'static str,
    stdin: ChildStdin,
    lines: Lines,
    _process: Process,
}

impl Binary {
    fn start(name: &'static str, exe: &str, redis: &str) -> Result<Binary, String> {
        let env = [("IDENTITY_REDIS", redis.to_owned())];
        let (mut processes, lines) = processes::start_exe(exe.as_ref(), 1, &env)?;
        let mut process = processes.pop().ok_or("no process")?;
        let stdin = process.child.stdin.take().ok_or("no stdin")?;
        Ok(Binary {
            name,
            stdin,
            lines,
            _process: process,
        })
    }

    /// Sends `command`; its reply, which must be `ok ...`, without the `ok `.
    fn ask(&mut self, command: &str) -> Result<String, String> {
        writeln!(self.stdin, "{command}").map_err(|e| format!("{}: {e}", self.name))?;
        match self.lines.recv_timeout(WAIT) {
            Ok((_, line)) => match line.strip_prefix("ok ") {
                Some(reply) => Ok(reply.to_owned()),
                None => Err(format!("{} answered {command:?} with {line:?}", self.name)),
            },
            Err(RecvTimeoutError::Timeout) => Err(format!(
                "{} did not answer {command:?} within {WAIT:?}",
                self.name
            )),
            Err(RecvTimeoutError::Disconnected) => {
                Err(format!("{} exited before answering {command:?}", self.name))
            }
        }
    }

    /// Asks `get ID` until the reply holds `expected`, within [`WAIT`]; the last reply.
    fn get_until(&mut self, id: u64, expected: &str) -> Result<String, String> {
        let deadline = Instant::now() + WAIT;
        loop {
            let reply = self.ask(&format!("get {id}"))?;
            if reply.contains(expected) {
                return Ok(reply);
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{} still answers {reply:?} after {WAIT:?}, not {expected}",
                    self.name
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn one_cache_across_binaries() -> Result<(), String> {
    let server = RedisServer::start();
    let redis = server.url();
    let mut node = Binary::start("node", env!("CARGO_BIN_EXE_node"), &redis)?;
    let mut admin = Binary::start("admin", env!("CARGO_BIN_EXE_admin"), &redis)?;
    let mut reshaped = Binary::start("reshaped", env!("CARGO_BIN_EXE_reshaped"), &redis)?;

    // A fill in one binary is a hit in the other.
    node.ask("set 42 100")?;
    let filled = node.ask("get 42")?;
    check(filled.starts_with("price=100 loads=1 "), || {
        format!("node: {filled}")
    })?;
    let read = admin.ask("get 42")?;
    check(
        read == "price=100 loads=0 remote_hits=1 decode_errors=0",
        || format!("admin did not read node's value from Redis: {read}"),
    )?;

    // An invalidation in the admin tool reaches the service's memory.
    admin.ask("set 42 200")?;
    admin.ask("invalidate 42")?;
    let after = node.get_until(42, "price=200")?;
    println!("  node after admin's invalidation: {after}");

    // And so does a tag invalidation.
    admin.ask("set 42 300")?;
    admin.ask("tag product:42")?;
    let after = node.get_until(42, "price=300")?;
    println!("  node after admin's tag invalidation: {after}");
    let read = admin.ask("get 42")?;
    check(read.starts_with("price=300 "), || format!("admin: {read}"))?;

    // Another shape under the same name: its own values, loaded by itself, never the others'
    // bytes; and no decode error anywhere, however often each side reads.
    let own = reshaped.ask("get 42")?;
    check(
        own == "price=300 currency=EUR loads=1 remote_hits=0 decode_errors=0",
        || format!("reshaped: {own}"),
    )?;
    // An invalidation from either shape reaches the other's values in Redis too (each process
    // registers its shape under the name): a rolling deploy never splits the fleet.
    node.ask("set 42 400")?;
    reshaped.ask("invalidate 42")?;
    for binary in [&mut node, &mut admin] {
        let after = binary.get_until(42, "price=400 ")?;
        println!(
            "  {} after the other shape's invalidation: {after}",
            binary.name
        );
    }
    node.ask("set 42 500")?;
    admin.ask("invalidate 42")?;
    let after = reshaped.get_until(42, "price=500 ")?;
    println!("  reshaped after admin's invalidation: {after}");
    for _ in 0..3 {
        let own = reshaped.ask("get 42")?;
        check(
            own.contains("currency=EUR") && own.ends_with("decode_errors=0"),
            || format!("reshaped: {own}"),
        )?;
        for binary in [&mut node, &mut admin] {
            let reply = binary.ask("get 42")?;
            check(
                reply.starts_with("price=500 ") && reply.ends_with("decode_errors=0"),
                || format!("{}, after the other shape's reads: {reply}", binary.name),
            )?;
        }
    }
    for mut binary in [node, admin, reshaped] {
        writeln!(binary.stdin, "quit").map_err(|e| e.to_string())?;
    }
    Ok(())
}

//! The repository's own commands, run as `cargo xtask <command>` (an alias in
//! `.cargo/config.toml`):
//!
//! - `cargo xtask test [ARGS...]`: makes sure the test servers are installed, then runs
//!   `cargo test --workspace --features stampede-cache/tls ARGS...` (the `tls` feature so that the
//!   TLS tests run too). The Redis tests start their own `redis-server` (or the
//!   server named by `STAMPEDE_TEST_SERVER`, e.g. `valkey-server`) on free loopback ports, the
//!   nodes of their clusters too (joined with cluster commands, no `redis-cli`). When it is
//!   missing it is installed through `apt-get` if this user may (root, or `sudo` without a
//!   password prompt); otherwise the command stops at once and prints the one command to run.
//! - `cargo xtask setup`: only the installation step.
//!
//! Nothing else is installed: the TLS tests make their certificates themselves (`rcgen`).

use std::env;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

/// The variable that names the server the tests start (`tests/support`).
const SERVER_VAR: &str = "STAMPEDE_TEST_SERVER";

fn main() -> ExitCode {
    let mut args = env::args_os().skip(1);
    let command = args.next();
    let rest: Vec<OsString> = args.collect();
    match command.as_ref().and_then(|command| command.to_str()) {
        Some("test") => match setup() {
            Ok(()) => test(&rest),
            Err(stop) => stop.report(),
        },
        Some("setup") => match setup() {
            Ok(()) => ExitCode::SUCCESS,
            Err(stop) => stop.report(),
        },
        Some("help" | "-h" | "--help") => {
            print!("{USAGE}");
            ExitCode::SUCCESS
        }
        Some(other) => {
            eprint!("xtask: unknown command `{other}`\n\n{USAGE}");
            ExitCode::from(2)
        }
        None => {
            eprint!("{USAGE}");
            ExitCode::from(2)
        }
    }
}

const USAGE: &str = "\
usage: cargo xtask <command>

commands:
  test [ARGS...]  install the test servers if missing, then
                  `cargo test --workspace --features stampede-cache/tls ARGS...`
  setup           only install the test servers if missing

The tests start `redis-server` (or $STAMPEDE_TEST_SERVER, e.g. `valkey-server`) themselves.
";

/// Why the tests cannot run yet, and what the user should do.
struct Stop(String);

impl Stop {
    fn report(&self) -> ExitCode {
        eprintln!("xtask: {}", self.0);
        ExitCode::FAILURE
    }
}

/// A binary the tests run, and the Debian package that provides it.
struct Needed {
    binary: String,
    package: Option<&'static str>,
}

/// The binaries the tests start: `redis-server`, and the server named by
/// `STAMPEDE_TEST_SERVER` when it is another.
fn needed() -> Vec<Needed> {
    let mut needed = vec![Needed {
        binary: "redis-server".to_owned(),
        package: Some("redis-server"),
    }];
    if let Some(server) = env::var_os(SERVER_VAR).filter(|server| !server.is_empty()) {
        let server = server.to_string_lossy().into_owned();
        if server != "redis-server" {
            let package = match server.as_str() {
                "valkey-server" => Some("valkey-server"),
                _ => None,
            };
            needed.push(Needed {
                binary: server,
                package,
            });
        }
    }
    needed
}

/// Installs what is missing, or says what to run.
fn setup() -> Result<(), Stop> {
    let missing: Vec<Needed> = needed()
        .into_iter()
        .filter(|needed| find(&needed.binary).is_none())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let names: Vec<&str> = missing.iter().map(|m| m.binary.as_str()).collect();
    let names = names.join(", ");
    if let Some(unknown) = missing.iter().find(|m| m.package.is_none()) {
        return Err(Stop(format!(
            "{SERVER_VAR}={} is not installed (not found in PATH); install it, or unset \
             {SERVER_VAR} to test against redis-server",
            unknown.binary
        )));
    }
    let mut packages: Vec<&str> = missing.iter().filter_map(|m| m.package).collect();
    packages.dedup();
    let packages = packages.join(" ");
    if find("apt-get").is_none() {
        return Err(Stop(format!(
            "{names} not installed, and this machine has no apt-get: install it with its package \
             manager (e.g. `brew install redis`, `dnf install redis`), then run `cargo xtask test` \
             again"
        )));
    }
    let sudo = if is_root() {
        false
    } else if sudo_without_prompt() {
        true
    } else {
        return Err(Stop(format!(
            "{names} not installed, and installing it needs root. Run:\n\n    \
             sudo apt-get install -y {packages}\n\nthen `cargo xtask test` again"
        )));
    };
    eprintln!("xtask: {names} not installed; installing {packages} with apt-get");
    let apt = |args: &[&str]| -> Result<(), Stop> {
        let mut command = if sudo {
            let mut command = Command::new("sudo");
            command.args(["-n", "apt-get"]);
            command
        } else {
            Command::new("apt-get")
        };
        command
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(Stdio::null());
        let shown = format!("apt-get {}", args.join(" "));
        match command.status() {
            Ok(status) if status.success() => Ok(()),
            Ok(status) => Err(Stop(format!("`{shown}` failed ({status})"))),
            Err(error) => Err(Stop(format!("cannot run `{shown}`: {error}"))),
        }
    };
    apt(&["update", "-qq"])?;
    let mut install = vec!["install", "-y", "-qq", "--no-install-recommends"];
    install.extend(missing.iter().filter_map(|m| m.package));
    apt(&install)?;
    let still: Vec<&str> = missing
        .iter()
        .filter(|m| find(&m.binary).is_none())
        .map(|m| m.binary.as_str())
        .collect();
    if !still.is_empty() {
        return Err(Stop(format!(
            "apt-get installed {packages}, but {} is still not found",
            still.join(", ")
        )));
    }
    for needed in &missing {
        if let Some(path) = find(&needed.binary) {
            eprintln!("xtask: installed {}", path.display());
        }
    }
    Ok(())
}

/// What `test` runs before the passed arguments: every package, with the facade's `tls`
/// feature on so that the TLS tests (`tests/redis_tls*.rs`, which require it) run too.
const TEST: [&str; 4] = ["test", "--workspace", "--features", "stampede-cache/tls"];

/// Runs `cargo test --workspace --features stampede-cache/tls` with `args`, and exits as it did.
fn test(args: &[OsString]) -> ExitCode {
    for needed in needed() {
        let version = Command::new(find(&needed.binary).unwrap_or(needed.binary.into()))
            .arg("--version")
            .output();
        if let Ok(output) = version {
            eprint!("xtask: {}", String::from_utf8_lossy(&output.stdout));
        }
    }
    let cargo = env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    let mut command = Command::new(&cargo);
    command.args(TEST).args(args);
    eprintln!(
        "xtask: cargo {}",
        TEST.iter()
            .map(|arg| std::borrow::Cow::Borrowed(*arg))
            .chain(args.iter().map(|arg| arg.to_string_lossy()))
            .collect::<Vec<_>>()
            .join(" ")
    );
    match command.status() {
        Ok(status) if status.success() => ExitCode::SUCCESS,
        Ok(status) => ExitCode::from(status.code().map_or(1, |code| code.clamp(1, 255) as u8)),
        Err(error) => {
            eprintln!("xtask: cannot run {}: {error}", Path::new(&cargo).display());
            ExitCode::FAILURE
        }
    }
}

/// `binary` in `PATH` or the usual places (as `tests/support` looks for it).
fn find(binary: &str) -> Option<PathBuf> {
    if binary.contains('/') {
        return Some(PathBuf::from(binary)).filter(|path| path.is_file());
    }
    let path = env::var_os("PATH").unwrap_or_default();
    env::split_paths(&path)
        .chain(["/usr/bin", "/usr/sbin", "/usr/local/bin", "/bin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(binary))
        .find(|candidate| candidate.is_file())
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|output| output.status.success() && output.stdout.trim_ascii() == b"0")
}

/// Whether `sudo` runs without asking for a password.
fn sudo_without_prompt() -> bool {
    find("sudo").is_some()
        && Command::new("sudo")
            .args(["-n", "true"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
}

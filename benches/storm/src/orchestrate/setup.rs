//! The servers the benchmark runs, found on this machine or installed through `apt-get` (as
//! `cargo xtask setup` does for the tests' `redis-server`): PostgreSQL (the server binaries and
//! the `pg_stat_statements` extension, Debian's `postgresql` and `postgresql-contrib`) and
//! `redis-server`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Where the servers' binaries are.
#[derive(Debug)]
pub struct Binaries {
    /// The folder holding `initdb` and `postgres`.
    pub postgres: PathBuf,
    /// `redis-server`.
    pub redis: PathBuf,
}

/// Finds the binaries, installing the packages that provide the missing ones when this user
/// may (root, or `sudo` without a password prompt); otherwise says what to run.
pub fn binaries() -> Result<Binaries, String> {
    let mut missing = Vec::new();
    if postgres_dir().is_none() {
        missing.extend(["postgresql", "postgresql-contrib"]);
    }
    if redis_server().is_none() {
        missing.push("redis-server");
    }
    if !missing.is_empty() {
        install(&missing)?;
    }
    let postgres = postgres_dir().ok_or(
        "PostgreSQL's server binaries (initdb, postgres) are not found, in PATH nor in \
         /usr/lib/postgresql/*/bin, even after installing postgresql",
    )?;
    let extension = postgres
        .parent()
        .map(|version| version.join("lib/pg_stat_statements.so"));
    if let Some(extension) = extension.filter(|path| path.parent().is_some_and(Path::is_dir))
        && !extension.is_file()
    {
        install(&["postgresql-contrib"])?;
    }
    let redis = redis_server().ok_or("redis-server is not found, even after installing it")?;
    Ok(Binaries { postgres, redis })
}

/// The newest `/usr/lib/postgresql/<version>/bin` (Debian's layout, not on `PATH`), else the
/// folder of an `initdb` on `PATH` that has a `postgres` beside it.
fn postgres_dir() -> Option<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            (bin.join("initdb").is_file() && bin.join("postgres").is_file())
                .then_some((version, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Some(bin);
    }
    let initdb = on_path("initdb")?.canonicalize().ok()?;
    let bin = initdb.parent()?.to_path_buf();
    bin.join("postgres").is_file().then_some(bin)
}

fn redis_server() -> Option<PathBuf> {
    on_path("redis-server").or_else(|| {
        ["/usr/bin/redis-server", "/usr/local/bin/redis-server"]
            .map(PathBuf::from)
            .into_iter()
            .find(|path| path.is_file())
    })
}

fn on_path(binary: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(binary))
        .find(|candidate| candidate.is_file())
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn install(packages: &[&str]) -> Result<(), String> {
    let list = packages.join(" ");
    if on_path("apt-get").is_none() {
        return Err(format!(
            "{list} not installed, and this machine has no apt-get: install PostgreSQL (with its \
             pg_stat_statements extension) and redis-server with its package manager, then run \
             the benchmark again"
        ));
    }
    let sudo = if is_root() {
        false
    } else if Command::new("sudo")
        .args(["-n", "true"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
    {
        true
    } else {
        return Err(format!(
            "{list} not installed, and installing needs root. Run:\n\n    \
             sudo apt-get install -y {list}\n\nthen the benchmark again"
        ));
    };
    eprintln!("storm: installing {list} with apt-get");
    let apt = |args: &[&str]| -> Result<(), String> {
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
            Ok(status) => Err(format!("`{shown}` failed ({status})")),
            Err(error) => Err(format!("cannot run `{shown}`: {error}")),
        }
    };
    apt(&["update", "-qq"])?;
    let mut install = vec!["install", "-y", "-qq", "--no-install-recommends"];
    install.extend(packages);
    apt(&install)
}

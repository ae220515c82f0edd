//! What the run must undo however it ends: the processes it started and the folders it made.
//! Each is registered when made; [`Cleanup`]'s drop (a normal end, an error, a panic) and the
//! Ctrl-C / SIGTERM handler ([`on_signal`]) stop what is left and remove the folders.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A process to stop: its id, and the signal that asks it to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Tracked {
    pid: u32,
    signal: libc::c_int,
}

struct Registry {
    processes: Vec<Tracked>,
    folders: Vec<PathBuf>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    processes: Vec::new(),
    folders: Vec::new(),
});

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    REGISTRY
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Registers a process this run started; `signal` asks it to stop (SIGKILL follows if it has
/// not after 5 s).
pub fn track(pid: u32, signal: libc::c_int) {
    registry().processes.push(Tracked { pid, signal });
}

/// Forgets a process that was stopped and reaped already.
pub fn untrack(pid: u32) {
    registry().processes.retain(|tracked| tracked.pid != pid);
}

/// Registers a folder to remove at the end.
pub fn track_folder(folder: PathBuf) {
    registry().folders.push(folder);
}

/// Sends `signal` to `pid`.
pub fn signal(pid: u32, signal: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: kill has no memory preconditions; a stale pid at worst gets ESRCH.
        unsafe {
            libc::kill(pid, signal);
        }
    }
}

fn alive(pid: u32) -> bool {
    // A zombie (a child not reaped yet) counts as gone.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start());
            !matches!(state.and_then(|rest| rest.chars().next()), Some('Z') | None)
        })
        .unwrap_or(false)
}

/// Stops every registered process (its signal, then SIGKILL after 5 s) and removes every
/// registered folder.
pub fn run() {
    let (processes, folders) = {
        let mut registry = registry();
        (
            std::mem::take(&mut registry.processes),
            std::mem::take(&mut registry.folders),
        )
    };
    for tracked in &processes {
        signal(tracked.pid, tracked.signal);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while processes.iter().any(|tracked| alive(tracked.pid)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    for tracked in processes.iter().filter(|tracked| alive(tracked.pid)) {
        signal(tracked.pid, libc::SIGKILL);
    }
    for folder in folders {
        let _ = std::fs::remove_dir_all(folder);
    }
}

/// Runs [`run`] when dropped.
pub struct Cleanup;

impl Drop for Cleanup {
    fn drop(&mut self) {
        run();
    }
}

/// Waits for Ctrl-C or SIGTERM, then cleans up and exits (130 or 143).
pub async fn on_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut interrupt), Ok(mut terminate)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        eprintln!("storm: cannot listen for Ctrl-C; stop the run with care");
        return;
    };
    let code = tokio::select! {
        _ = interrupt.recv() => 130,
        _ = terminate.recv() => 143,
    };
    eprintln!("storm: stopping: killing the services, the database and Redis");
    tokio::task::spawn_blocking(run).await.ok();
    std::process::exit(code);
}

/// How much lower the servers' scheduling priority is than the load generator's (`nice`): on a
/// machine whose cores the servers can saturate (the no-cache contender does), the load
/// generator keeps sending on time and measuring, as if it ran on a machine of its own.
pub const SERVER_NICENESS: libc::c_int = 5;

/// Makes `command`'s process (and every thread and process it starts) run at
/// [`SERVER_NICENESS`].
pub fn lower_priority(command: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and makes one async-signal-safe
    // system call, touching no memory of the parent.
    unsafe {
        command.pre_exec(|| {
            libc::setpriority(libc::PRIO_PROCESS, 0, SERVER_NICENESS);
            Ok(())
        });
    }
}

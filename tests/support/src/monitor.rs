//! What clients send a plain test server, command by command, through `MONITOR`: how a test
//! counts the round trips a call makes. A command a Lua script runs is marked `[0 lua]` there and
//! left out (the script's call is the round trip); `INFO commandstats` would count it.

use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::redis_server::RedisServer;

/// A `MONITOR` connection to a server, read on a thread of its own until dropped.
pub struct Monitor {
    lines: Arc<(Mutex<Vec<String>>, Condvar)>,
    stream: TcpStream,
}

impl Monitor {
    /// Starts watching `server` (plain TCP): every command a client sends from now on.
    pub fn start(server: &RedisServer) -> Monitor {
        let mut stream = TcpStream::connect(("127.0.0.1", server.port()))
            .expect("cannot connect to the test's redis-server for MONITOR");
        stream
            .write_all(b"MONITOR\r\n")
            .expect("cannot send MONITOR");
        let mut reader = BufReader::new(stream.try_clone().expect("cannot clone a TcpStream"));
        let mut ok = String::new();
        reader.read_line(&mut ok).expect("no answer to MONITOR");
        assert_eq!(ok.trim_end(), "+OK", "MONITOR answered {ok:?}");
        let lines = Arc::new((Mutex::new(Vec::new()), Condvar::new()));
        let seen = Arc::clone(&lines);
        std::thread::spawn(move || {
            for line in reader.lines() {
                let Ok(line) = line else { return };
                let (lines, changed) = &*seen;
                lines
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(line);
                changed.notify_all();
            }
        });
        Monitor { lines, stream }
    }

    /// The commands clients sent since the last call (or the start), in the order the server
    /// ran them, as lowercase names (`evalsha`, `getrange`, ...), without those a script ran and
    /// without this method's own marker. Everything sent before the call is in: the marker, sent
    /// through `server` now, is run after it. Fails the test if the marker is not seen in 10 s.
    pub fn sent(&self, server: &RedisServer) -> Vec<String> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let marker = format!(
            "stampede-test-marker-{}",
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let _: String = server.command(&["ECHO", &marker]);
        let (lines, changed) = &*self.lines;
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut held = lines.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(at) = held.iter().position(|line| line.contains(&marker)) {
                let before: Vec<String> = held.drain(..=at).collect();
                return before[..at]
                    .iter()
                    .filter(|line| !line.contains(" lua]"))
                    .filter_map(|line| command_name(line))
                    .collect();
            }
            let left = deadline
                .checked_duration_since(Instant::now())
                .expect("MONITOR did not show the marker within 10 s");
            held = changed
                .wait_timeout(held, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

/// The command of a `MONITOR` line (`+1700000000.123456 [0 127.0.0.1:5000] "get" "k"`).
fn command_name(line: &str) -> Option<String> {
    let after = line.split_once("] \"")?.1;
    Some(after.split('"').next()?.to_ascii_lowercase())
}

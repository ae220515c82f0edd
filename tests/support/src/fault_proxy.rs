//! A TCP proxy between the caches and the test's `redis-server`, on a free loopback port, that a
//! fault test tells what the network does: pass bytes through, delay every chunk, blackhole the
//! connections established so far (they stay open and carry nothing either way, as a half-open
//! connection does) while new ones pass, cut every connection, or send new connections to
//! another server (a failover behind DNS).
//!
//! It runs on the runtime it was started on, holds at most [`MAX_CONNECTIONS`] connections with
//! one [`CHUNK`] buffer per direction, listens on 127.0.0.1 only, and stops (cutting every
//! connection) when dropped.

use std::io::ErrorKind;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub const MAX_CONNECTIONS: usize = 64;
pub const CHUNK: usize = 16 * 1024;

pub struct FaultProxy {
    port: u16,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

struct Shared {
    upstream: AtomicU16,
    delay: Mutex<Duration>,
    accepted: AtomicUsize,
    /// The state of each connection that may still be open.
    connections: Mutex<Vec<watch::Sender<State>>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Open,
    /// Nothing is read or written any more; both sockets stay open.
    Blackholed,
    Cut,
}

impl FaultProxy {
    /// Starts a proxy to `127.0.0.1:upstream` on the current tokio runtime.
    pub fn start(upstream: u16) -> FaultProxy {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("no free loopback port");
        let port = listener.local_addr().expect("a bound listener").port();
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let listener = TcpListener::from_std(listener).expect("a tokio runtime to proxy on");
        let shared = Arc::new(Shared {
            upstream: AtomicU16::new(upstream),
            delay: Mutex::new(Duration::ZERO),
            accepted: AtomicUsize::new(0),
            connections: Mutex::new(Vec::new()),
        });
        let accept = tokio::spawn(accept(listener, shared.clone()));
        FaultProxy {
            port,
            shared,
            accept,
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Connections accepted since the start.
    pub fn accepted(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Forwards every chunk at once again (blackholed connections stay blackholed).
    pub fn pass(&self) {
        self.set_delay(Duration::ZERO);
    }

    /// Holds every chunk, either way, for `delay` before forwarding it.
    pub fn delay(&self, delay: Duration) {
        self.set_delay(delay);
    }

    /// Stops forwarding on every connection established so far, without closing any; new
    /// connections are forwarded.
    pub fn blackhole(&self) {
        self.set_all(State::Blackholed);
    }

    /// Closes every connection established so far.
    pub fn cut(&self) {
        self.set_all(State::Cut);
    }

    /// An outage: every connection established so far is closed, and new ones are sent to a
    /// loopback port nothing listens on, until [`retarget`](Self::retarget) points the proxy at
    /// a server again.
    pub fn outage(&self) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
        let dead = listener.local_addr().expect("its address").port();
        drop(listener);
        self.retarget(dead);
        self.cut();
    }

    /// Sends new connections to `127.0.0.1:upstream`; established ones stay where they are.
    pub fn retarget(&self, upstream: u16) {
        self.shared.upstream.store(upstream, Ordering::SeqCst);
    }

    fn set_delay(&self, delay: Duration) {
        *self
            .shared
            .delay
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = delay;
    }

    fn set_all(&self, state: State) {
        let connections = self
            .shared
            .connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for connection in connections.iter() {
            connection.send_if_modified(|current| {
                let change = *current != State::Cut && *current != state;
                if change {
                    *current = state;
                }
                change
            });
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

async fn accept(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        let state = {
            let mut connections = shared
                .connections
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            // A connection whose task ended dropped its receivers.
            connections.retain(|connection| connection.receiver_count() > 0);
            if connections.len() >= MAX_CONNECTIONS {
                continue; // refused: the client sees its connection closed
            }
            let (state, _) = watch::channel(State::Open);
            connections.push(state.clone());
            state
        };
        let upstream = shared.upstream.load(Ordering::SeqCst);
        let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
            continue;
        };
        shared.accepted.fetch_add(1, Ordering::SeqCst);
        let (client_read, client_write) = client.into_split();
        let (server_read, server_write) = server.into_split();
        let up = pump(client_read, server_write, state.subscribe(), shared.clone());
        let down = pump(server_read, client_write, state.subscribe(), shared.clone());
        tokio::spawn(async move {
            // Either side closing closes both: every half is dropped here.
            tokio::select! {
                () = up => {}
                () = down => {}
            }
            drop(state);
        });
    }
}

/// Forwards chunks from `from` to `to` until either closes or the connection is cut; while
/// blackholed, reads and writes nothing and keeps both open.
async fn pump(
    from: OwnedReadHalf,
    to: OwnedWriteHalf,
    mut state: watch::Receiver<State>,
    shared: Arc<Shared>,
) {
    let mut buffer = vec![0; CHUNK];
    loop {
        let current = *state.borrow_and_update();
        match current {
            State::Open => {}
            State::Blackholed => {
                let _ = state.wait_for(|state| *state == State::Cut).await;
                return;
            }
            State::Cut => return,
        }
        tokio::select! {
            readable = from.readable() => {
                if readable.is_err() {
                    return;
                }
            }
            _ = state.changed() => continue,
        }
        let read = match from.try_read(&mut buffer) {
            Ok(0) => return,
            Ok(read) => read,
            Err(error) if error.kind() == ErrorKind::WouldBlock => continue,
            Err(_) => return,
        };
        let delay = *shared.delay.lock().unwrap_or_else(PoisonError::into_inner);
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        if *state.borrow() != State::Open {
            continue; // the chunk is lost, as the network would lose it
        }
        let mut rest = &buffer[..read];
        while !rest.is_empty() {
            if to.writable().await.is_err() {
                return;
            }
            match to.try_write(rest) {
                Ok(written) => rest = &rest[written..],
                Err(error) if error.kind() == ErrorKind::WouldBlock => {}
                Err(_) => return,
            }
        }
    }
}

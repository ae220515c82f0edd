//! The oracle of the simulations: it is told every write, invalidation, prime and load attempt
//! (and how it ended) as it happens, and checks every value a call returns against that history.
//! Each exemption cites the README sentence that grants it; `docs/oracle.md` lists them all.
//!
//! What it checks (each a violation, with the trace of the key's history):
//!
//! - **own key**: a value is the value of its own function and key (a function of the same name
//!   on another namespace of the server is another function: its values never cross);
//! - **absent keys** (batch functions): a key answered absent is the key's absence at one of the
//!   versions at which the source left it out, each check below holding for one of them;
//! - **not older than a completed invalidation**: its version is at least the version written
//!   before the last invalidation (or tag invalidation, or prime) of that key that completed
//!   before the call began, in the call's process; in another process (a shared backend only),
//!   once the documented bound has passed since it completed;
//! - **age**: a value is no older than its fresh time (`ttl`, or its own with `ttl_from`) plus
//!   `stale`, plus what a load and the store's stalls take; `fail_safe` adds its window only for
//!   a call that met a failed load of its key, an open breaker or its `soft_timeout`, or came
//!   within `fail_safe_throttle` after one of those;
//! - **no older value over a newer one**: in one process, a call that began after another ended
//!   returns a version at least that one's (unless the other overlapped an invalidation, a
//!   prime or a feed going down or up, or the cache's racing loads nothing orders: no lock, or
//!   Redis only with loads outside the Redis lock);
//! - **one load at a time**: at most one load of a key runs at a time in a process (unless an
//!   invalidation, a prime or a feed event detached the one running, or the process's feed is
//!   down and the one running began the bound ago or longer, or `lock = "none"`), and
//!   across processes with `lock = "redis"` (unless a lease lapsed or the store failed, `busy =
//!   "compute"`, or a flight's lock wait ran out);
//! - **retry_if**: a load never retries an error its `retry_if` refuses;
//! - **allowed errors**: a call fails only as a failing source, a timeout, a panic, an open
//!   breaker (with `breaker`) or a busy lock (with `busy = "error"`) make it (never "the load
//!   was dropped" while its runtime runs);
//! - **no hang** and **nothing left behind** are checked by the runs themselves.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// How long after a fault of a process's link to the store ends an invalidation made during it
/// may still be missed (on top of the bound): the longest delay a delayed feed is given.
pub const DEAF_SLACK: Duration = Duration::from_secs(3);

/// A value the simulated sources produce: whose it is, which version, and when it was read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Val {
    pub function: u8,
    pub key: u16,
    pub version: u64,
    /// When the source produced it, since the run began.
    pub read_at: Duration,
}

/// Whether a batch function's source leaves `key` out of its map at `version` (a version of a
/// key is its value, or its absence: README, Batch functions: "Keys left out of the map are
/// absent ... and they are cached as absent").
pub fn absent(function: u8, key: u16, version: u64) -> bool {
    (version * 5 + u64::from(key) * 3 + u64::from(function)) % 4 == 1
}

/// What a call returned, when it returned something.
#[derive(Clone, Copy, Debug)]
pub enum Seen<'a> {
    /// A peek that found nothing.
    Nothing,
    /// A batch function's key absent (`None`).
    Absent,
    /// A value.
    Value(&'a Val),
}

impl<'a> Seen<'a> {
    /// What a cache held: a value, or (a batch function's) an absence.
    pub fn of(held: &'a Option<Val>) -> Self {
        match held {
            Some(value) => Seen::Value(value),
            None => Seen::Absent,
        }
    }
}

/// What the oracle must know of one function.
#[derive(Clone, Debug)]
pub struct Rules {
    /// How long a value is fresh: `ttl`, or its own time (`ttl_from`, given the value) capped at
    /// `ttl` (README, options: "each value's own fresh time ..., capped at `ttl`").
    pub ttl: Duration,
    pub ttl_from: Option<fn(&Val) -> Option<Duration>>,
    /// A batch function's `missing_ttl`: how long an absent key is fresh (zero: not cached, so
    /// no `stale` or `fail_safe` window either); `None` for a single-key function, whose keys
    /// are never absent.
    pub missing_ttl: Option<Duration>,
    /// Percent by which a fill may shorten its fresh time.
    pub jitter: u8,
    pub stale: Duration,
    /// What a value may age beyond its windows: the time between its read and its fill (a load,
    /// its retries and backoffs) and the store's stalls.
    pub slack: Duration,
    /// The part of `slack` that the store's operations (their stalls) take: what a value given
    /// for a failed attempt may come after it.
    pub stalls: Duration,
    /// `fail_safe`, when the function has it: the longer age it grants after a failed load.
    pub fail_safe: Option<FailSafe>,
    /// `retry_if` refuses the source's permanent errors: a load never retries one.
    pub retry_if: bool,
    /// `breaker`: a call may fail with `CircuitOpen`.
    pub breaker: bool,
    /// `busy = "error"`: a call may fail with `LockBusy`.
    pub busy_error: bool,
    /// `max_loads`: a call may fail with `LoadsFull` (README, options: a load beyond them "fails
    /// with `stampede::Error::LoadsFull`").
    pub loads_full: bool,
    /// Values are shared between processes (tiered or Redis-only): invalidations reach them.
    pub shared: bool,
    /// No lock: loads of one key may overlap.
    pub no_singleflight: bool,
    /// Nothing orders the values of loads that race (no lock; or Redis only, where a load
    /// without the Redis lock may be fenced off by another's fill and kept nowhere).
    pub unordered: bool,
    /// `lock = "redis"` and `busy` not `"compute"`: one load across processes, but for a waiter
    /// whose lock wait ran out.
    pub one_load_everywhere: bool,
    /// The connection's `lock_wait`: a flight that waited this long loads beside the holder.
    pub lock_wait: Duration,
    /// `refresh_after` or `early = "xfetch"`: a fresh value's call may start a refresh.
    pub refreshes_early: bool,
}

/// A function's fail-safe options: when a value past its stale deadline may still be served.
#[derive(Clone, Copy, Debug)]
pub struct FailSafe {
    /// `fail_safe`: how long past its stale deadline the last good value may be served.
    pub keep: Duration,
    /// `fail_safe_throttle` (zero with `backend = "redis"`, which keeps no throttle): how long
    /// after a failed load the last good value stands without another load.
    pub throttle: Duration,
    /// `soft_timeout`: a call that waited this long may get the last good value.
    pub soft_timeout: Option<Duration>,
    /// `breaker` and `breaker_cooldown`: after how many consecutive failed loads of the cache
    /// the breaker opens, and how long it then serves the last good value without a load.
    pub breaker: Option<(u32, Duration)>,
}

impl Rules {
    /// How long `value` is fresh.
    fn ttl_of(&self, value: &Val) -> Duration {
        match self.ttl_from.and_then(|own| own(value)) {
            Some(own) => own.min(self.ttl),
            None => self.ttl,
        }
    }
}

/// Where an invalidation reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// The process that made it, and the others through the shared tier.
    From(usize),
    /// Only the process that made it (a prime).
    Only(usize),
    /// Every process at once (a tag's marks are process-wide in a simulation).
    Everywhere,
}

#[derive(Clone, Debug)]
struct Floor {
    version: u64,
    /// Set by a prime (else an invalidation).
    prime: bool,
    reach: Reach,
    done: Duration,
    /// Its place in the run's order of events (two at one instant are still ordered).
    seq: u64,
}

/// An expiry of a key (`expire`) that completed: a value read before it began is no longer
/// fresh from its end on (in another process, once the bound has passed).
#[derive(Clone, Debug)]
struct Expiry {
    /// Where it was made (`None`: in every process at once, a tag's).
    process: Option<usize>,
    /// The versions of primes running when it completed: one may land after it, the latest
    /// write ("`prime` is the latest write"), which it does not age.
    racing: Vec<u64>,
    began: Duration,
    done: Duration,
    /// Its place in the run's order of events.
    seq: u64,
}

#[derive(Clone, Debug)]
struct Running {
    id: u64,
    process: usize,
    started: Duration,
    /// The key's detach epoch and the run's fault epoch when it started.
    epochs: Epochs,
    /// When the call that started its flight began.
    flight_began: Duration,
    /// The flight (the call whose load it is an attempt of).
    flight: u64,
}

/// What has detached a key's loads, or let them run in several processes, so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Epochs {
    /// Bumped when an invalidation, a prime or an announcement detaches the key's loads.
    detach: u64,
    /// Bumped when a fault detaches every load of the function ([`Effect::Detaches`]).
    faults: u64,
    /// Bumped when a fault that lets loads run in several processes begins or ends
    /// ([`Effect::Overlapping`]).
    overlap: u64,
}

impl Epochs {
    /// What orders calls: the loads detached (not those that may have run beside another
    /// process's, which one process's calls still see in order).
    fn ordering(self) -> (u64, u64) {
        (self.detach, self.faults)
    }
}

/// What the oracle knows of a flight from the call that may start it: the key's epochs then,
/// and when that call began.
#[derive(Clone, Copy, Debug)]
pub struct Flight {
    epochs: Epochs,
    began: Duration,
    /// Which call's load it is: every attempt of one load carries it.
    id: u64,
}

/// What a fault does to the oracle's rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    /// It detaches every running load of the function's keys (README, "A lost invalidation is
    /// never silent": a process "takes its memory of every Redis-backed cache out of service
    /// when the subscription is lost"; "What was missed is read back": when it is back, the
    /// process "drops exactly the keys and tags invalidated meanwhile", or its memory "when the
    /// log cannot say what was missed"; a server restarted empty): a load running then is
    /// compared with no later one, and a call that overlapped it orders none after it.
    Detaches,
    /// While it lasts, loads of one key may run in several processes: the store is down (README,
    /// "When Redis is sick": "the cache falls back to local singleflight and the function's own
    /// load") or leases lapse (README, Redis: "If the holder dies, its lease runs out and one of
    /// them takes over"; "A holder paused past its lease ... never writes its older value over
    /// the next holder's"). A load that begins meanwhile is held to one load per process only.
    Overlapping,
}

/// Why a call may have been given the last good value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Grant {
    /// A failed load, an open breaker, a soft timeout.
    Failure,
    /// The throttle after one.
    Throttle,
}

/// How an attempt of a load ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// It returned a value.
    Loaded,
    /// It failed with an error that `retry_if` accepts (or there is no `retry_if`).
    Failed,
    /// It failed with an error `retry_if` refuses: the load may not try again.
    Permanent,
    /// It panicked, or was dropped (timed out, or its runtime dropped).
    Dropped,
}

#[derive(Default)]
struct History {
    versions: HashMap<(u8, u16), u64>,
    /// Per (function, key): when each version from 1 on was written (version `v` at `v - 1`).
    written: HashMap<(u8, u16), Vec<Duration>>,
    floors: HashMap<(u8, u16), Vec<Floor>>,
    /// Per (function, key): the expiries (`expire`) that completed.
    expiries: HashMap<(u8, u16), Vec<Expiry>>,
    /// Per function: the shortest `ttl` and `stale` set at run time (`configure`), which a
    /// fill may have had: what may have made a value stale, or past it, sooner than the plan's.
    least: HashMap<u8, (Duration, Duration)>,
    /// Per function: the shortest `soft_timeout` set at run time, which a wait may have had.
    least_soft: HashMap<u8, Duration>,
    /// Per function: each setting of `ttl` and `stale` at run time, and when.
    configured: HashMap<u8, Vec<(Duration, Duration, Duration)>>,
    /// Per (function, key): bumped when something detaches the key's running loads.
    detach: HashMap<(u8, u16), u64>,
    /// Per function: bumped by every beginning and end of a fault that reaches its cache
    /// (outages, feed events, lapsed leases, ... of its shared tier; a new runtime).
    faults: HashMap<u8, u64>,
    /// Per function: faults going on that let loads of one key run in several processes (an
    /// outage, lapsed leases).
    overlapping: HashMap<u8, usize>,
    /// Per function: bumped by the beginning and end of each of those faults (a load that ran
    /// across one may have lost its lock, or never had it).
    overlap_epochs: HashMap<u8, u64>,
    /// Per (function, process, key): when an attempt of a load last failed (an error, a panic,
    /// a timeout).
    failed: HashMap<(u8, usize, u16), Duration>,
    /// Per (function, process): when an attempt of a load of any key last failed (the breaker's
    /// count is the cache's), and how many attempts in a row have failed since one loaded.
    cache_failed: HashMap<(u8, usize), (Option<Duration>, u32)>,
    /// Per (function, process): how many loads its cache refused (`max_loads`) as last told,
    /// and when a call ending first found that count grown.
    refused: HashMap<(u8, usize), (u64, Duration)>,
    /// Per (function, process, key): when a call was last given the last good value past its
    /// stale deadline for a failed load, an open breaker or a soft timeout (the throttle counts
    /// from then).
    fail_safe_served: HashMap<(u8, usize, u16), Duration>,
    /// Per (function, process, key): until when a flight of a dropped call may still be
    /// waiting to start its load (README: "The load runs detached, so a caller that gives up
    /// ... neither cancels it"). A breaker that opens meanwhile skips it, and the key's last
    /// good value stands for the throttle, with no caller told.
    unwatched: HashMap<(u8, usize, u16), Duration>,
    /// Per flight: its attempts that failed with an error `retry_if` refuses.
    permanent: std::collections::HashSet<u64>,
    /// The flights whose load is over: an attempt loaded, or failed with an error `retry_if`
    /// refuses. No attempt of theirs follows.
    over: std::collections::HashSet<u64>,
    next_flight: u64,
    running: HashMap<(u8, u16), Vec<Running>>,
    /// The (function, process) pairs whose feed is down: the process trusts a flight only for
    /// the bound from its start, and a call past that starts another load beside it.
    feed_down: std::collections::HashSet<(u8, usize)>,
    /// Per process: when its link to the shared store was faulted (cut, delayed, the store
    /// down), from the fault's beginning to its end (`None` while it lasts): an invalidation
    /// another process made then may not have been heard.
    deaf: HashMap<usize, Vec<(Duration, Option<Duration>)>>,
    next_load: u64,
    /// Per (function, process, key): the version of the last call that ended, and when (its
    /// place in the order of events).
    last: HashMap<(u8, usize, u16), (u64, u64)>,
    /// Per (function, key): the versions of the primes running (or whose write may still land).
    priming: HashMap<(u8, u16), Vec<u64>>,
    /// Per (function, key): the versions of primes that raced each other.
    raced: HashMap<(u8, u16), Vec<u64>>,
    /// The order of events.
    seq: u64,
    trace: Vec<String>,
    violations: Vec<String>,
}

/// The oracle of one run.
pub struct Oracle {
    history: Mutex<History>,
    rules: Vec<Rules>,
    /// How long after an invalidation another process may still serve the old value.
    pub bound: Duration,
    /// The clock of the run: when its current runtime's clock began, and the run's time then.
    clock: Mutex<(Instant, Duration)>,
}

/// A call the oracle watches, from its beginning.
pub struct Call {
    function: u8,
    process: usize,
    key: u16,
    began: Duration,
    seq: u64,
    /// The key's detach epoch and the run's fault epoch when it began.
    detach: Epochs,
    /// How many attempts of its cache's loads had failed in a row when it began.
    breaker_count: u32,
    /// A key of a batch call of several keys: answered when the last of them is.
    among_others: bool,
}

impl Call {
    /// The call is of one key of a batch call of several keys.
    pub fn among_others(mut self) -> Self {
        self.among_others = true;
        self
    }
}

impl Oracle {
    pub fn new(rules: Vec<Rules>, bound: Duration) -> Arc<Self> {
        Arc::new(Oracle {
            history: Mutex::new(History::default()),
            rules,
            bound,
            clock: Mutex::new((Instant::now(), Duration::ZERO)),
        })
    }

    /// The run's time: since it began, across its runtimes.
    pub fn now(&self) -> Duration {
        let (began, at) = *self.clock.lock().unwrap_or_else(PoisonError::into_inner);
        at + Instant::now().saturating_duration_since(began)
    }

    /// The run's time at `instant` of the current runtime's clock.
    pub fn now_at(&self, instant: Instant) -> Duration {
        let (began, at) = *self.clock.lock().unwrap_or_else(PoisonError::into_inner);
        at + instant.saturating_duration_since(began)
    }

    /// The faults of the last runtime ended with it.
    pub fn restarted(&self) {
        let now = self.now();
        let mut history = self.history();
        // The loads of the last runtime were dropped with it (each told the oracle so), and no
        // call spans the restart: nothing to exempt. The faults it ran end with it.
        history.overlapping.clear();
        history.note(now, "a new runtime".into());
    }

    /// A new runtime's clock takes over, `gap` after the run's time now on the last one's.
    pub fn new_clock(&self, ended: Duration, gap: Duration) {
        *self.clock.lock().unwrap_or_else(PoisonError::into_inner) = (Instant::now(), ended + gap);
    }

    /// The source's current version of a key.
    pub fn version(&self, function: u8, key: u16) -> u64 {
        *self.history().versions.get(&(function, key)).unwrap_or(&0)
    }

    /// The source changed the key: its new version.
    pub fn write(&self, function: u8, key: u16) -> u64 {
        let now = self.now();
        let mut history = self.history();
        let version = history.versions.entry((function, key)).or_default();
        *version += 1;
        let version = *version;
        history
            .written
            .entry((function, key))
            .or_default()
            .push(now);
        history.note(now, format!("write f{function} k{key} -> v{version}"));
        version
    }

    /// Something is about to detach the key's running loads (an invalidation, a prime).
    pub fn detaching(&self, function: u8, key: u16) {
        *self.history().detach.entry((function, key)).or_default() += 1;
    }

    /// A fault begins (`began`) or ends, reaching `function`'s cache (`None`: every function's),
    /// with its `effect` on the rules. Only the functions it reaches are exempted by it.
    pub fn fault(&self, what: String, began: bool, effect: Effect, function: Option<u8>) {
        let now = self.now();
        let mut history = self.history();
        let reached: Vec<u8> = match function {
            Some(function) => vec![function],
            None => (0..self.rules.len() as u8).collect(),
        };
        for function in reached {
            match effect {
                Effect::Detaches => *history.faults.entry(function).or_default() += 1,
                Effect::Overlapping => {
                    *history.overlap_epochs.entry(function).or_default() += 1;
                    let count = history.overlapping.entry(function).or_default();
                    match began {
                        true => *count += 1,
                        false => *count = count.saturating_sub(1),
                    }
                }
            }
        }
        history.note(now, what);
    }

    /// An invalidation (or prime) of a key completed: from now on (in another process, after
    /// the bound) no call may return a version below `version`.
    pub fn invalidated(&self, function: u8, key: u16, version: u64, reach: Reach) {
        let done = self.now();
        let mut history = self.history();
        history.note(
            done,
            format!("invalidated f{function} k{key} at v{version} ({reach:?})"),
        );
        let seq = history.next_seq();
        history
            .floors
            .entry((function, key))
            .or_default()
            .push(Floor {
                version,
                prime: false,
                reach,
                done,
                seq,
            });
    }

    /// The options of `function`'s name were set at run time: its fills are fresh for `ttl` and
    /// stale for `stale` from now on (never longer than the plan's, which bound every age).
    pub fn configured(
        &self,
        function: u8,
        ttl: Duration,
        stale: Duration,
        soft_timeout: Option<Duration>,
    ) {
        let now = self.now();
        let mut history = self.history();
        history.note(
            now,
            format!("f{function} configured: ttl {ttl:?}, stale {stale:?}, soft_timeout {soft_timeout:?}"),
        );
        if let Some(soft) = soft_timeout {
            let least = history.least_soft.entry(function).or_insert(soft);
            *least = (*least).min(soft);
        }
        let least = history.least.entry(function).or_insert((ttl, stale));
        *least = (least.0.min(ttl), least.1.min(stale));
        history
            .configured
            .entry(function)
            .or_default()
            .push((now, ttl, stale));
    }

    /// An expiry (`expire`) of a key, begun at `began` in `process` (`None`: a tag's, in every
    /// process at once), completed.
    pub fn expired(&self, function: u8, key: u16, process: Option<usize>, began: Duration) {
        let done = self.now();
        let mut history = self.history();
        history.note(done, format!("expired f{function} k{key} in {process:?}"));
        let seq = history.next_seq();
        let racing = history
            .priming
            .get(&(function, key))
            .cloned()
            .unwrap_or_default();
        history
            .expiries
            .entry((function, key))
            .or_default()
            .push(Expiry {
                racing,
                process,
                began,
                done,
                seq,
            });
    }

    /// An invalidation that began at `began` (a place in the order of events, see
    /// [`Oracle::prime_begins`]) completed, while primes of the key may have run: a prime that
    /// overlapped it may land after it (either order is theirs), so the lowest of their versions
    /// bounds the key.
    pub fn invalidated_racing_primes(
        &self,
        function: u8,
        key: u16,
        version: u64,
        reach: Reach,
        began: u64,
    ) {
        let lowest = self
            .history()
            .racing_primes(function, key, began, None)
            .into_iter()
            .min();
        let version = lowest.map_or(version, |lowest| lowest.min(version));
        self.invalidated(function, key, version, reach);
    }

    /// Notes a line in the trace.
    pub fn note(&self, line: String) {
        let now = self.now();
        self.history().note(now, line);
    }

    /// A prime of a key begins: its place in the order of events.
    pub fn prime_begins(&self) -> u64 {
        self.history().next_seq()
    }

    /// A prime of `version` runs (its write may land from now on).
    pub fn prime_running(&self, function: u8, key: u16, version: u64) {
        let mut history = self.history();
        history
            .priming
            .entry((function, key))
            .or_default()
            .push(version);
    }

    /// The prime of `version` is over: its write landed, or never will.
    pub fn prime_over(&self, function: u8, key: u16, version: u64) {
        let mut history = self.history();
        if let Some(running) = history.priming.get_mut(&(function, key)) {
            running.retain(|&other| other != version);
        }
    }

    /// A prime that began at `began` (see [`Oracle::prime_begins`]) stored `version`. It may
    /// take effect after an invalidation that completed while it ran (they overlapped: either
    /// order is theirs), so such invalidations no longer bound the key; the prime does.
    pub fn primed(&self, function: u8, key: u16, version: u64, process: usize, began: u64) {
        let done = self.now();
        let mut history = self.history();
        let seq = history.next_seq();
        // Racing primes of one key: nothing orders their versions (the store keeps the last
        // write, which may be the older version), so a process may see one after the other.
        // README, Invalidation: "`prime` is the latest write: it is written whatever the fence".
        let raced = history.racing_primes(function, key, began, Some(version));
        let floors = history.floors.entry((function, key)).or_default();
        // What completed while it ran (an invalidation, another prime) or still runs overlapped
        // it: either may take effect last, so the lowest of them bounds the key (README,
        // Invalidation: "`prime` is the latest write"; an invalidation guarantees only what
        // began "before it" returned).
        let lowest = floors
            .iter()
            .filter(|floor| floor.seq >= began)
            .map(|floor| floor.version)
            .chain(raced.iter().copied())
            .min();
        floors.retain(|floor| floor.seq < began);
        floors.push(Floor {
            version: lowest.map_or(version, |lowest| lowest.min(version)),
            prime: true,
            reach: Reach::Only(process),
            done,
            seq,
        });
        // The primed value is what every process reads from the store from now on, after
        // whatever it held before (README, Invalidation: "`prime` is the latest write"; "Other
        // processes keep a copy they already hold until it expires"): it orders each process's
        // later calls from its own version (seed 20025065: a read-through in another process
        // returned the primed v3 after its memory's v4, loaded before the prime landed).
        for ((f, _, k), last) in history.last.iter_mut() {
            if (*f, *k) == (function, key) && last.0 > version {
                *last = (version, seq);
            }
        }
        if !raced.is_empty() {
            let versions = history.raced.entry((function, key)).or_default();
            versions.extend(raced);
            versions.push(version);
        }
        history.note(
            done,
            format!("primed f{function} k{key} at v{version} in p{process}"),
        );
    }

    /// How many loads the cache of `function` in `process` refused so far (`max_loads`), told as
    /// a call of it ends.
    pub fn refusals(&self, function: u8, process: usize, count: u64) {
        let now = self.now();
        let mut history = self.history();
        let told = history.refused.entry((function, process)).or_default();
        if count > told.0 {
            *told = (count, now);
        }
    }

    /// A call begins; `breaker_open`: its cache's `Stats::breaker_open` says the breaker skips
    /// the source now (open, or its probe running).
    pub fn call(&self, function: u8, process: usize, key: u16, breaker_open: bool) -> Call {
        let began = self.now();
        let rules = &self.rules[function as usize];
        let mut history = self.history();
        // A call that meets an open breaker may be given the last good value at once, which
        // then stands for the throttle, whatever the call is told: a dropped call's flight
        // still settles (a throttle may begin once the store answered). The breaker's probe is
        // the first load after its cool-down, which may start long after it: while it runs the
        // breaker is open, which the failures told cannot say (seed 70878047), so the cache's
        // own `Stats::breaker_open` says it too.
        if let Some(fail_safe) = &rules.fail_safe
            && (breaker_open
                || history.breaker_may_be_open(function, process, began, 0, fail_safe, rules))
        {
            history
                .fail_safe_served
                .insert((function, process, key), began + rules.stalls);
        }
        Call {
            function,
            process,
            key,
            began,
            seq: history.next_seq(),
            detach: history.epochs(function, key),
            breaker_count: history
                .cache_failed
                .get(&(function, process))
                .map_or(0, |failed| failed.1),
            among_others: false,
        }
    }

    /// A call begins whose caller is dropped before or after it answers: told, never checked.
    /// Its flight runs on, detached, and may start its load until the time a load of the
    /// function may take (and a wait for the Redis lock's holder) has passed.
    pub fn unwatched_call(&self, function: u8, process: usize, key: u16, breaker_open: bool) {
        let call = self.call(function, process, key, breaker_open);
        let rules = &self.rules[function as usize];
        self.history()
            .unwatched_flight(rules, (function, process, key), call.began);
    }

    /// What a call returned.
    pub fn returned(&self, call: &Call, outcome: Result<Seen<'_>, &stampede::Error>, what: &str) {
        let now = self.now();
        let rules = &self.rules[call.function as usize];
        let mut history = self.history();
        let Call {
            function,
            process,
            key,
            began,
            seq: began_seq,
            detach,
            ..
        } = *call;
        let seen = match outcome {
            Ok(seen) => seen,
            Err(error) => {
                history.note(
                    now,
                    format!("{what} p{process} f{function} k{key} -> {error}"),
                );
                if !allowed(error, rules) {
                    history.violate(
                        now,
                        format!(
                            "{what} of p{process} f{function} k{key} failed as it may not: {error}"
                        ),
                    );
                }
                return;
            }
        };
        // README (Operations under faults, the double failure): with `fail_safe`, a value kept
        // through a lost feed is still the last good value, served for a failed load even if
        // another process invalidated it while this one could not hear it.
        let floor = match rules
            .fail_safe
            .as_ref()
            .and_then(|fail_safe| history.fail_safe_grant(call, fail_safe, now, rules))
        {
            Some(_) => history.floor_heard(call, rules.shared, self.bound),
            None => history.floor(call, rules.shared, self.bound),
        };
        // The version the call returned, how old it is at the least, and how long it is fresh.
        let (version, age, own_ttl) = match seen {
            Seen::Nothing => return,
            Seen::Value(value) => {
                history.note(
                    now,
                    format!(
                        "{what} p{process} f{function} k{key} (began {began:?}) -> v{} read at {:?}",
                        value.version, value.read_at
                    ),
                );
                // Another function's value, a twin's included: a function of the same name on
                // another namespace (database or prefix) of the same server, whose values the
                // README keeps apart (Redis, Keys and values: "tenants on two databases of one
                // server, with one prefix and the same caches, never hear each other's fills or
                // invalidations"; the prefix is the "namespace of every key").
                if (value.function, value.key) != (function, key) {
                    history.violate(
                        now,
                        format!("{what} of f{function} k{key} returned another's value (another function's or namespace's): {value:?}"),
                    );
                }
                (
                    value.version,
                    now.saturating_sub(value.read_at),
                    rules.ttl_of(value),
                )
            }
            // An absence carries no version: it is one of the versions at which the source left
            // the key out. Those the checks below allow are its candidates: the floor and the
            // order are checked against the least of them (what a later call is held to), the
            // age against the youngest (read at the latest while it was current).
            Seen::Absent => {
                history.note(
                    now,
                    format!("{what} p{process} f{function} k{key} (began {began:?}) -> absent"),
                );
                let Some(missing_ttl) = rules.missing_ttl else {
                    history.violate(
                        now,
                        format!("{what} of f{function} k{key} returned an absence, and the function is not a batch function"),
                    );
                    return;
                };
                let current = history.versions.get(&(function, key)).copied().unwrap_or(0);
                let absences: Vec<u64> = (0..=current)
                    .filter(|&version| absent(function, key, version))
                    .collect();
                let ordered_after = history.ordered_after(call, rules);
                // Primes that raced are unordered (as the order check below grants, seed 28421:
                // a raced prime's v5, then an absence at v1).
                let raced = |version: u64| {
                    history.raced.get(&(function, key)).is_some_and(|raced| {
                        ordered_after.is_some_and(|last| raced.contains(&last))
                            && raced.contains(&version)
                    })
                };
                let candidates: Vec<u64> = absences
                    .iter()
                    .copied()
                    .filter(|&version| version >= floor)
                    .filter(|&version| {
                        ordered_after.is_none_or(|last| version >= last) || raced(version)
                    })
                    .collect();
                let (Some(&least), Some(&youngest)) = (candidates.first(), candidates.last())
                else {
                    history.violate(now, format!(
                        "{what} of p{process} f{function} k{key}, begun at {began:?}, returned an absence, though the key was absent at none of the versions it may return (absent at {absences:?}; an invalidation at v{floor} had completed; an earlier call had returned v{ordered_after:?})"
                    ));
                    return;
                };
                // Read while it was current: before the next version was written.
                let until = history
                    .written
                    .get(&(function, key))
                    .and_then(|written| written.get(youngest as usize).copied())
                    .unwrap_or(now);
                let _ = least;
                (least, now.saturating_sub(until), missing_ttl)
            }
        };
        if version < floor {
            history.violate(now, format!(
                "{what} of p{process} f{function} k{key}, begun at {began:?}, returned v{version} though an invalidation at v{floor} had completed"
            ));
        }
        let absence = matches!(seen, Seen::Absent);
        // A key of a batch call of several keys is answered when the call's last key is: its
        // value may have aged since the call got it by up to the call's time (README, Batch
        // functions: "a batch answers all its keys or an error"; "A call returns once its last
        // key is answered"). Its age is counted from the call's beginning at the latest.
        let aged = age;
        let age = match call.among_others {
            true => age.saturating_sub(now.saturating_sub(began)),
            false => age,
        };
        // README, "Which option applies when": a value is served fresh for its ttl (its own,
        // with `ttl_from`; an absence for `missing_ttl`), then stale for `stale`; past that, "a
        // load; if it fails, or takes longer than `soft_timeout`, the last good value"
        // (`fail_safe`). Every value is counted from its read, so the time its load took to
        // fill it (and the store's stalls) is added. An absence not cached (`missing_ttl =
        // "0s"`) has neither window: "no `stale` or `fail_safe` window serves the absence".
        let not_cached = absence && own_ttl.is_zero();
        let stale = if not_cached {
            Duration::ZERO
        } else {
            rules.stale
        };
        let servable = own_ttl + stale + rules.slack;
        // Options set at run time bound what was filled with them (README, Options at run time:
        // "to the new fills and loads of every cache of that name"): a value read after a
        // setting was filled under it or under one set later still.
        let servable = match seen {
            Seen::Value(value) => history.configured_for(function, value.read_at, now).map_or(
                servable,
                |(ttl, configured_stale)| {
                    servable.min(own_ttl.min(ttl) + configured_stale + rules.slack)
                },
            ),
            _ => servable,
        };
        let grant = rules
            .fail_safe
            .filter(|_| !not_cached)
            .and_then(|fail_safe| history.fail_safe_grant(call, &fail_safe, now, rules));
        // Past its stale deadline at the earliest (a fill's fresh time is cut by `jitter` at
        // most), a value given for a failure stands for `fail_safe_throttle` (README, options:
        // "how long a served last good value stands before the source is asked again"). A key of
        // a batch may have been given it while the call's other keys were still out (seed
        // 3141513: an open breaker's probe running): its age now, not at the call's beginning,
        // says whether it may have been.
        // With options set at run time, a fill may have been fresh and stale shorter.
        let (own_ttl_least, stale_least) = match history.least.get(&function) {
            Some(&(ttl, least_stale)) => (own_ttl.min(ttl), stale.min(least_stale)),
            None => (own_ttl, stale),
        };
        let fresh_least = own_ttl_least.mul_f64(1.0 - f64::from(rules.jitter) / 100.0);
        let past_stale = aged > fresh_least + stale_least;
        // A value served past its fresh time (or any, where a refresh may come early) may have
        // started a refresh in the background, which no caller watches: an open breaker may skip
        // it, and the value then stands for the throttle (sim seed 187461879: a stale value's
        // refresh waited for the breaker's probe and met it half-open).
        if !not_cached && (rules.refreshes_early || aged > fresh_least) {
            history.unwatched_flight(rules, (function, process, key), now);
        }
        if grant == Some(Grant::Failure) && past_stale {
            history
                .fail_safe_served
                .insert((function, process, key), now);
        }
        if let Seen::Value(value) = seen
            && let Some(deadline) = history.expired_by(call, value, rules.shared, self.bound)
        {
            // README, Invalidation, `expire`: "the next call gets it stale at once while one
            // refresh runs, for the cache's `stale` at most from the expiry ..., and with
            // `fail_safe` it stays the key's last good value" (for its own fail-safe window,
            // which the age rule below bounds); in another process "once the announcement
            // arrives, as for `invalidate`" (the bound). A key of a batch call was found when
            // the call began.
            let at = if call.among_others { began } else { now };
            let deadline = deadline + stale + rules.slack;
            let last_good = rules.fail_safe.is_some() && grant.is_some();
            if at > deadline && !last_good {
                history.violate(now, format!(
                    "{what} of p{process} f{function} k{key} returned v{version} read at {:?}, {:?} past its expiry's stale window (to {deadline:?})",
                    value.read_at,
                    at - deadline,
                ));
            }
        }
        if age > servable {
            let granted = rules.fail_safe.filter(|_| grant.is_some());
            match granted {
                Some(fail_safe) if age <= servable + fail_safe.keep => {}
                Some(fail_safe) => history.violate(now, format!(
                    "{what} of p{process} f{function} k{key} returned a value {age:?} old, past the {:?} its options allow with fail-safe",
                    servable + fail_safe.keep
                )),
                None => history.violate(now, format!(
                    "{what} of p{process} f{function} k{key} returned a{} value {age:?} old, past the {servable:?} its options allow without a failed load{}",
                    if absence { "n absent" } else { "" },
                    if rules.fail_safe.is_some() && !not_cached { " (fail-safe needs one)" } else { "" }
                )),
            }
        }
        // Exempt: caches whose racing loads nothing orders (`Rules::unordered`, README, "Source
        // versions": fences "cannot order values read from the source at different moments by
        // loads that do not share a lock"; "with `lock = "none"` ... a load of an older version
        // still running when the newer value expires is stored and served after it"), and
        // primes that raced ("`prime` is the latest write").
        if !rules.unordered
            && let Some(&(last, ended)) = history.last.get(&(function, process, key))
            && ended < began_seq
            && version < last
            && !history
                .raced
                .get(&(function, key))
                .is_some_and(|raced| raced.contains(&last) && raced.contains(&version))
        {
            history.violate(now, format!(
                "{what} of p{process} f{function} k{key} returned v{version} after an earlier call had returned v{last}"
            ));
        }
        // A call that overlapped an invalidation or a prime of its key, or a feed going down or
        // up (which detaches every load), may have got the value of a flight that detached:
        // ordered before it, not after (README, Invalidation: a load "that was running meanwhile
        // is detached ..., still answers the callers already waiting for it"; "A lost
        // invalidation is never silent": a process "takes its memory of every Redis-backed cache
        // out of service when the subscription is lost", and when it is back drops what was
        // invalidated meanwhile, or all of it). A prime still running when
        // the call ends may land after it: the primed value then follows, whatever its version
        // (seeds 1590120, 1990573; "`prime` is the latest write").
        // A value this process held from before another process's prime completed is a copy it
        // keeps until it expires (README, Invalidation: "Other processes keep a copy they already
        // hold until it expires"): the primed value may still follow it, so it orders later
        // calls from the primed version at most (seed 20025065). An absence carries no read
        // time: it may have been read as soon as its version was written (seed 72134292: a
        // process kept the absence it loaded just before a stalled prime of an older value
        // landed, then read the primed value).
        let read_at = match seen {
            Seen::Value(value) => Some(value.read_at),
            Seen::Absent => Some(match version {
                0 => Duration::ZERO,
                version => history.written[&(function, key)][version as usize - 1],
            }),
            Seen::Nothing => None,
        };
        let version = match read_at {
            Some(read_at) => history
                .floors
                .get(&(function, key))
                .into_iter()
                .flatten()
                .filter(|floor| {
                    floor.prime && floor.reach != Reach::Only(process) && floor.done > read_at
                })
                .map(|floor| floor.version)
                .fold(version, u64::min),
            None => version,
        };
        let ended = history.next_seq();
        let now_epochs = history.epochs(function, key);
        let primes_running = history
            .priming
            .get(&(function, key))
            .is_some_and(|running| !running.is_empty());
        if now_epochs.ordering() == detach.ordering() && !primes_running {
            let last = history
                .last
                .entry((function, process, key))
                .or_insert((0, ended));
            if version >= last.0 {
                *last = (version, ended);
            }
        }
    }

    /// The key's epochs now (what a flight starting now is detached by when they move on), and
    /// the time now.
    pub fn flight(&self, function: u8, key: u16) -> Flight {
        let began = self.now();
        let mut history = self.history();
        history.next_flight += 1;
        Flight {
            epochs: history.epochs(function, key),
            began,
            id: history.next_flight,
        }
    }

    /// A flight the oracle compares with no other load (its epochs are its own): for a load
    /// whose flight may have begun before something that detached it, when nothing tells when
    /// it began (the Redis oracle test, in real time).
    pub fn flight_apart(&self, function: u8, key: u16) -> Flight {
        let mut flight = self.flight(function, key);
        flight.epochs.detach = u64::MAX - flight.id;
        flight
    }

    /// The feed of `function`'s cache in `process` went down or came back up.
    /// A fault of `process`'s link to the shared store (`None`: every process's) begins or
    /// ends: invalidations announced meanwhile may not reach it.
    pub fn deaf(&self, process: Option<usize>, processes: usize, began: bool) {
        let now = self.now();
        let mut history = self.history();
        let reached: Vec<usize> = match process {
            Some(process) => vec![process],
            None => (0..processes).collect(),
        };
        for process in reached {
            let windows = history.deaf.entry(process).or_default();
            match began {
                true => windows.push((now, None)),
                false => {
                    if let Some(open) = windows.iter_mut().rev().find(|(_, end)| end.is_none()) {
                        open.1 = Some(now);
                    }
                }
            }
        }
    }

    pub fn feed(&self, function: u8, process: usize, down: bool) {
        let mut history = self.history();
        match down {
            true => history.feed_down.insert((function, process)),
            false => history.feed_down.remove(&(function, process)),
        };
    }

    /// An attempt of a load of a key starts in `process`: checked against the loads running.
    /// `flight` holds the epochs of the call that started its flight: a flight detached before
    /// or during its load (its retries included) is still that detached flight.
    pub fn load_started(&self, function: u8, process: usize, key: u16, flight: Flight) -> u64 {
        let now = self.now();
        let rules = &self.rules[function as usize];
        let mut history = self.history();
        history.next_load += 1;
        let id = history.next_load;
        let current = history.epochs(function, key);
        let epochs = flight.epochs;
        // With its feed down, a process does not join a flight past the bound from its start.
        let untrusted = history.feed_down.contains(&(function, process));
        // README, options: "`retry_if` ...: only errors it accepts are retried".
        if rules.retry_if && history.permanent.contains(&flight.id) {
            history.violate(now, format!(
                "a load of f{function} k{key} in p{process} tried again after an error retry_if refuses"
            ));
        }
        let overlapping = history.overlapping.get(&function).copied().unwrap_or(0);
        let running = history
            .running
            .get(&(function, key))
            .cloned()
            .unwrap_or_default();
        for other in running
            .iter()
            // Loads detached since they began are compared with none (README, Invalidation: a
            // detached load "stores nothing, and the next call starts a new load"; a feed going
            // down or up: see `Effect::Detaches`), nor those that may have run beside another
            // process's during an outage or lapsed leases (`Effect::Overlapping`).
            .filter(|other| other.epochs == epochs && epochs == current)
        {
            let same_process = other.process == process;
            // The older of the two flights may have been past the bound when the other began
            // (README, "A lost invalidation is never silent": with its subscription quiet, a
            // process "lets a call join a load in flight only within that bound of the load's
            // start (a later call loads anew beside it)").
            let aged_out = untrusted && other.flight_began.min(flight.began) + self.bound <= now;
            // README, options: "`busy` | ... `"wait"` for its value (then load it here after the
            // connection's `lock_wait`)": either load may be a waiter's that gave up (its
            // flight began `lock_wait` or longer before it).
            let gave_up = other.started.saturating_sub(other.flight_began) >= rules.lock_wait
                || now.saturating_sub(flight.began) >= rules.lock_wait;
            // `lock = "none"` (README, options: "no coordination, every miss loads"); across
            // processes only `lock = "redis"` promises one load ("one load per key across every
            // process sharing the Redis"), and not with `busy = "compute"` ("`"compute"` at
            // once"), during an outage or lapsed leases (`Effect::Overlapping`), or past a lock
            // wait.
            if same_process && !rules.no_singleflight && !aged_out {
                history.violate(now, format!(
                    "two loads of f{function} k{key} overlap in p{process} (the other began at {:?})",
                    other.started
                ));
            } else if !same_process && rules.one_load_everywhere && overlapping == 0 && !gave_up {
                history.violate(now, format!(
                    "loads of f{function} k{key} overlap in p{process} and p{} with lock = \"redis\" (the other began at {:?})",
                    other.process, other.started
                ));
            }
        }
        history.note(
            now,
            format!("load {id} of f{function} k{key} starts in p{process}"),
        );
        history
            .running
            .entry((function, key))
            .or_default()
            .push(Running {
                id,
                process,
                started: now,
                epochs,
                flight_began: flight.began,
                flight: flight.id,
            });
        id
    }

    /// A load of `key` of `function` was given `previous` (`stampede::previous`) and read the
    /// source at `version`: the value it replaces, so one of that key, never of a version the
    /// source did not hold yet (README, Features: "`stampede::previous::<T>()` is the value the
    /// cache holds for the key being loaded").
    pub fn previous_given(&self, function: u8, key: u16, previous: &Val, version: u64) {
        let now = self.now();
        let mut history = self.history();
        if (previous.function, previous.key) != (function, key) || previous.version > version {
            history.violate(now, format!(
                "a load of f{function} k{key} was given another's value, or a later one, as its previous (the source at v{version}): {previous:?}"
            ));
        }
    }

    /// An attempt of a load ended (finished, failed or dropped).
    pub fn load_ended(&self, function: u8, key: u16, id: u64, how: Attempt) {
        let now = self.now();
        let mut history = self.history();
        let Some(running) = history.running.get_mut(&(function, key)) else {
            return;
        };
        let Some(at) = running.iter().position(|load| load.id == id) else {
            return;
        };
        let ended = running.remove(at);
        let cache = history
            .cache_failed
            .entry((function, ended.process))
            .or_default();
        match how {
            Attempt::Loaded => cache.1 = 0,
            _ => *cache = (Some(now), cache.1 + 1),
        }
        if how != Attempt::Loaded {
            let rules = &self.rules[function as usize];
            history.breaker_may_skip_unwatched(rules, function, ended.process, now);
            history.note(
                now,
                format!("load {id} of f{function} k{key} ends: {how:?}"),
            );
            history.failed.insert((function, ended.process, key), now);
        }
        if how == Attempt::Permanent {
            history.permanent.insert(ended.flight);
        }
        if matches!(how, Attempt::Loaded | Attempt::Permanent) {
            history.over.insert(ended.flight);
        }
    }

    /// Whether `flight`'s load is over (an attempt loaded, or failed with an error `retry_if`
    /// refuses): a later load of its key is another flight's.
    pub fn flight_over(&self, flight: &Flight) -> bool {
        self.history().over.contains(&flight.id)
    }

    /// A violation the run itself found (a hang, something left behind).
    pub fn violation(&self, what: String) {
        let now = self.now();
        self.history().violate(now, what);
    }

    pub fn violations(&self) -> Vec<String> {
        self.history().violations.clone()
    }

    /// The last `lines` lines of the run's trace.
    pub fn trace(&self, lines: usize) -> Vec<String> {
        let history = self.history();
        let skip = history.trace.len().saturating_sub(lines);
        history.trace[skip..].to_vec()
    }

    /// Every line of the trace, for a replay's comparison.
    pub fn whole_trace(&self) -> Vec<String> {
        self.history().trace.clone()
    }

    fn history(&self) -> MutexGuard<'_, History> {
        self.history.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl History {
    /// The versions of the key's primes that overlap something that began at `began`: those
    /// still running (but `own`), and those that completed since.
    fn racing_primes(&self, function: u8, key: u16, began: u64, own: Option<u64>) -> Vec<u64> {
        let running = self
            .priming
            .get(&(function, key))
            .into_iter()
            .flatten()
            .copied()
            .filter(|&version| Some(version) != own);
        let completed = self
            .floors
            .get(&(function, key))
            .into_iter()
            .flatten()
            .filter(|floor| floor.prime && floor.seq >= began)
            .map(|floor| floor.version);
        running.chain(completed).collect()
    }

    /// The key's epochs now.
    fn epochs(&self, function: u8, key: u16) -> Epochs {
        Epochs {
            detach: *self.detach.get(&(function, key)).unwrap_or(&0),
            faults: *self.faults.get(&function).unwrap_or(&0),
            overlap: *self.overlap_epochs.get(&function).unwrap_or(&0),
        }
    }

    /// Whether `call`, ending `now`, may have been given the last good value (README, options:
    /// "`fail_safe` | when a load fails (error, timeout, panic, open breaker), serve the last
    /// good value ..."), and why: an attempt of a load of its key in its process failed while
    /// it ran; or, with `breaker`, a load of its cache failed within `breaker_cooldown` (and a
    /// probe's load) before it began ("skip the source for `breaker_cooldown`: the fail-safe
    /// value ... at once; then one probe"); or it waited `soft_timeout` ("a caller waiting for
    /// a load gets the last good value after this"). Or a failure of its key, or a last good
    /// value given for one, came within `fail_safe_throttle` before it began
    /// (`fail_safe_throttle`: "how long a served last good value stands before the source is
    /// asked again").
    fn fail_safe_grant(
        &self,
        call: &Call,
        fail_safe: &FailSafe,
        now: Duration,
        rules: &Rules,
    ) -> Option<Grant> {
        let since = |at: Option<&Duration>, window: Duration| {
            at.is_some_and(|&at| at + window >= call.began)
        };
        let key = (call.function, call.process, call.key);
        let breaker = self.breaker_may_be_open(
            call.function,
            call.process,
            call.began,
            call.breaker_count,
            fail_safe,
            rules,
        );
        // A load refused by `max_loads` is a failed load (README, options: it "fails with
        // `stampede::Error::LoadsFull` ..., which a stale or fail-safe value covers as it covers
        // any failed load"). Which key's was refused is not told: one of the cache's in this
        // process, found when a call of it ended after the call began, grants it (wider than
        // the key, never than the process).
        let refused = self
            .refused
            .get(&(call.function, call.process))
            .is_some_and(|&(_, found)| found >= call.began);
        let failure = since(self.failed.get(&key), Duration::ZERO)
            || refused
            || breaker
            || fail_safe.soft_timeout.is_some_and(|soft| {
                // The shortest set at run time since, if shorter (`configure`).
                let soft = self
                    .least_soft
                    .get(&call.function)
                    .map_or(soft, |&least| soft.min(least));
                now.saturating_sub(call.began) >= soft
            });
        // The last good value is given (and its throttle begins) once the store answered after
        // the failed attempt.
        let refused_at = self
            .refused
            .get(&(call.function, call.process))
            .map(|(_, found)| found);
        let throttled = since(self.failed.get(&key), fail_safe.throttle + rules.stalls)
            || since(refused_at, fail_safe.throttle + rules.stalls)
            || since(self.fail_safe_served.get(&key), fail_safe.throttle);
        match (failure, throttled) {
            (true, _) => Some(Grant::Failure),
            (false, true) => Some(Grant::Throttle),
            (false, false) => None,
        }
    }

    /// A flight of `key` begun at `began` that no caller watches (a dropped call's, a refresh
    /// in the background) may start its load until the time a load of the function may take,
    /// and a wait for the Redis lock's holder, have passed.
    fn unwatched_flight(&mut self, rules: &Rules, key: (u8, usize, u16), began: Duration) {
        let lock_wait = match rules.one_load_everywhere {
            true => rules.lock_wait,
            false => Duration::ZERO,
        };
        let until = began + rules.slack + lock_wait;
        let pending = self.unwatched.entry(key).or_default();
        *pending = until.max(*pending);
    }

    /// A load of `function` failed in `process` at `now`: with `breaker`, the breaker may open
    /// and skip the flights of dropped calls still waiting to start their loads (sim seed
    /// 140877845: a batch's first chunk panicked and its later chunks met the open breaker),
    /// and each of those keys' last good value may stand for the throttle from as late as its
    /// flight may start.
    fn breaker_may_skip_unwatched(
        &mut self,
        rules: &Rules,
        function: u8,
        process: usize,
        now: Duration,
    ) {
        if rules
            .fail_safe
            .is_none_or(|fail_safe| fail_safe.breaker.is_none())
        {
            return;
        }
        let stalls = rules.stalls;
        self.unwatched.retain(|_, until| *until >= now);
        let skipped: Vec<_> = self
            .unwatched
            .iter()
            .filter(|&(&(f, p, _), _)| f == function && p == process)
            .map(|(&key, &until)| (key, until + stalls))
            .collect();
        for (key, served) in skipped {
            let at = self.fail_safe_served.entry(key).or_default();
            *at = served.max(*at);
        }
    }

    /// Whether the cache's breaker may be open for a call that began at `began`, when
    /// `count_then` attempts in a row had failed: as many attempts of the cache's loads have
    /// failed in a row (then, or now) as open it, and no probe has loaded since (a load that
    /// fails several attempts is one failed load: the count is a bound); or one failed within
    /// a cooldown (and a load's time, the probe's) before the call began.
    fn breaker_may_be_open(
        &self,
        function: u8,
        process: usize,
        began: Duration,
        count_then: u32,
        fail_safe: &FailSafe,
        rules: &Rules,
    ) -> bool {
        let (last, count) = self
            .cache_failed
            .get(&(function, process))
            .copied()
            .unwrap_or_default();
        fail_safe.breaker.is_some_and(|(opens, cooldown)| {
            count_then.max(count) >= opens
                || last.is_some_and(|last| last + cooldown + rules.slack >= began)
        })
    }

    /// The version an earlier call of the process returned that `call` may not return below
    /// (see the order check in [`Oracle::returned`]), if any.
    fn ordered_after(&self, call: &Call, rules: &Rules) -> Option<u64> {
        let &(last, ended) = self.last.get(&(call.function, call.process, call.key))?;
        (!rules.unordered && ended < call.seq).then_some(last)
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    fn note(&mut self, at: Duration, line: String) {
        self.trace.push(format!("{at:>12.3?} {line}"));
    }

    fn violate(&mut self, at: Duration, what: String) {
        self.note(at, format!("VIOLATION: {what}"));
        self.violations.push(what);
    }

    /// The least version a call may return.
    fn floor(&self, call: &Call, shared: bool, bound: Duration) -> u64 {
        self.floor_where(call, shared, bound, |_| true)
    }

    /// The least version a call may return as the last good value for a failed load: the floor
    /// of the invalidations its process may have heard (none another process made while this
    /// one's link to the store was faulted, or within the bound and a delay after that).
    fn floor_heard(&self, call: &Call, shared: bool, bound: Duration) -> u64 {
        let windows = self.deaf.get(&call.process);
        let heard = |floor: &Floor| {
            matches!(floor.reach, Reach::From(other) if other == call.process)
                || !matches!(floor.reach, Reach::From(_))
                || !windows.is_some_and(|windows| {
                    windows.iter().any(|&(start, end)| {
                        start <= floor.done
                            && end.is_none_or(|end| floor.done <= end + bound + DEAF_SLACK)
                    })
                })
        };
        self.floor_where(call, shared, bound, heard)
    }

    /// The longest `ttl` and `stale` a value of `function` read at `read_at` may have been
    /// filled with by `now`, when options set at run time were in force at its read: the
    /// setting then, or any set since. `None` when none was (the plan's apply).
    fn configured_for(
        &self,
        function: u8,
        read_at: Duration,
        now: Duration,
    ) -> Option<(Duration, Duration)> {
        let settings = self.configured.get(&function)?;
        // At one instant the order of a setting and a fill is not known: a value read then may
        // have been filled before it.
        let in_force = settings.iter().rev().find(|(at, ..)| *at < read_at)?;
        let later = settings
            .iter()
            .filter(|(at, ..)| read_at <= *at && *at <= now);
        std::iter::once(in_force)
            .chain(later)
            .map(|&(_, ttl, stale)| (ttl, stale))
            .reduce(|a, b| (a.0.max(b.0), a.1.max(b.1)))
    }

    /// When the earliest expiry that binds `call` made a value read at `read_at` (before the
    /// expiry began) no longer fresh: its end in the call's process, the bound after it in
    /// another (through a shared tier only), as an invalidation's floor binds.
    fn expired_by(
        &self,
        call: &Call,
        value: &Val,
        shared: bool,
        bound: Duration,
    ) -> Option<Duration> {
        self.expiries
            .get(&(call.function, call.key))?
            .iter()
            .filter(|expiry| {
                value.read_at < expiry.began && !expiry.racing.contains(&value.version)
            })
            .filter_map(|expiry| match expiry.process {
                Some(process) if process != call.process => {
                    (shared && expiry.done + bound <= call.began).then_some(expiry.done + bound)
                }
                _ => (expiry.seq < call.seq).then_some(expiry.done),
            })
            .min()
    }

    fn floor_where(
        &self,
        call: &Call,
        shared: bool,
        bound: Duration,
        counts: impl Fn(&Floor) -> bool,
    ) -> u64 {
        let Some(floors) = self.floors.get(&(call.function, call.key)) else {
            return 0;
        };
        floors
            .iter()
            .filter(|floor| counts(floor))
            .filter(|floor| match floor.reach {
                Reach::Everywhere => floor.seq < call.seq,
                // A prime reaches its own process only (README, Invalidation: "Other processes
                // keep a copy they already hold until it expires, so `invalidate` when every
                // process must drop it").
                Reach::Only(process) => process == call.process && floor.seq < call.seq,
                Reach::From(process) if process == call.process => floor.seq < call.seq,
                // Another process: only through a shared tier (README, options: `"memory"`:
                // "values live in this process"), and after the bound (README, Invalidation:
                // another process "drops its copy when the announcement arrives; if its
                // subscription was lost, it trusts its memory at most `2 x heartbeat +
                // op_timeout` ... after the last sign of life").
                Reach::From(_) => shared && floor.done + bound <= call.began,
            })
            .map(|floor| floor.version)
            .max()
            .unwrap_or(0)
    }
}

/// The errors a call may end with in a run, each as the README grants it (a load dropped
/// unfinished while its runtime runs, or a call outside a runtime, is a defect):
///
/// - the source's own: "Only `Ok` is cached; errors never are" (Errors), shared as
///   `Error::Upstream` ("every caller of a shared load, when `E` is not `Clone` |
///   `E::from(stampede::Error::Upstream(..))`");
/// - "a load that timed out (`timeout`) or panicked" (Errors);
/// - `CircuitOpen` with `breaker` only: "skip the source for `breaker_cooldown`: the fail-safe
///   value, else `stampede::Error::CircuitOpen`, at once" (options);
/// - `LockBusy` with `busy = "error"` only: "`"error"`" (options, `busy`), and "(with
///   `busy = "error"`, `Error::LockBusy`)" for a refresh (Invalidation).
fn allowed(error: &stampede::Error, rules: &Rules) -> bool {
    match error {
        stampede::Error::Upstream(_)
        | stampede::Error::Timeout { .. }
        | stampede::Error::LoadPanicked { .. } => true,
        stampede::Error::CircuitOpen { .. } => rules.breaker,
        stampede::Error::LockBusy { .. } => rules.busy_error,
        stampede::Error::LoadsFull { .. } => rules.loads_full,
        _ => false,
    }
}

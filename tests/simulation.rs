//! A deterministic simulation of the runtime, in the spirit of FoundationDB's simulation and
//! TigerBeetle's VOPR: one seed generates one run, and replays it exactly.
//!
//! A run generates a few cached functions with random but valid options (every option of the
//! README's table in [`PLANNED`]: ttl and ttl_from, jitter, stale, refresh_after, xfetch, fail_safe and
//! its throttle, soft_timeout, retries, retry_if, timeout, breaker, tags, capacity, lock, busy,
//! backend, the connection's lock wait, and batch functions: `batch`, `batch_max`, `missing_ttl`,
//! single-key calls through `batch_loader`, alone or in bursts loaded together by a
//! `batch_window`; and `redis`, named connections: a function's processes on connections
//! named apart, and a twin of a function, with its name, on another database or prefix of its
//! server; `max_loads` and `max_loads_full`, low caps that queue, time out and shed loads of
//! distinct keys; and every load is a conditional read of the previous value it is given
//! (`previous`, `previous_of`), answered "unchanged" when the source still holds its version;
//! options set at run time (`configure`: `ttl`, `stale`, `timeout`, `backoff` shortened,
//! `jitter` and `retries` lowered, and where on `refresh_after`, `memory_ttl`, `soft_timeout`,
//! `xfetch`, `batch_max`, `fail_safe` and its throttle);
//! those not yet simulated are in [`NOT_SIMULATED`],
//! with why), several "processes" (a cache per function and process; with a shared
//! backend, the processes share the runtime's fake tier, which has Redis's semantics: a lock
//! with a lease and a fence, values with deadlines, an invalidation feed per process), a
//! versioned source per key that fails, panics, stalls past the timeout or is slow, and clients
//! that call, peek, write and invalidate, invalidate tags, prime, refresh and drop calls
//! mid-way (a batch function's calls and refreshes of 1 to 50 keys too, sharing flights with its
//! single-key calls; its source leaves some keys out at some versions). Faults hit the shared tier meanwhile: outages, cut or delayed feeds (delays past the
//! bound too), lost wake-ups, lapsed leases, stalls; and the runtime itself is dropped mid-run
//! and replaced by a new one.
//! The oracle (`sim/oracle.rs`) checks every value returned; at the end of each runtime nothing
//! may be left in flight.
//!
//! Everything runs on one current-thread tokio runtime with a paused clock, and the runtime's
//! randomness is seeded, so a run depends on its seed only.
//!
//! ```text
//! cargo test --test simulation                                # the fixed seeds CI runs
//! STAMPEDE_SIM_SEEDS=100000 cargo test --release --test simulation   # more, by hand
//! STAMPEDE_SIM_SEED=1234 cargo test --test simulation         # replay one, with its trace
//! STAMPEDE_SIM_TRACE=400 ...                                   # a longer trace (40 lines by default)
//! ```
//!
//! A failing seed is shrunk (its plan cut to the fewest operations that still fail) and printed
//! with the trace of its last steps and the command that replays it.

mod sim;

use std::collections::{BTreeSet, HashMap};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use sim::oracle::{Attempt, Effect, FailSafe, Flight, Oracle, Reach, Rules, Seen, Val};
use stampede_runtime::sim::{Call, Event, Fake, Local, SimCache, Space, Store, Values, tier_of};
use stampede_runtime::{Backend, Config, LoadsFull, Lock, previous, previous_of};

type Key = u16;
/// What a cache holds: a function's value, or for a batch function a key its map left out
/// (`None`, absent). A single-key function's cache holds `Some` only.
type Held = Option<Val>;

/// How many seeds CI runs, from `FIRST_SEED`.
const CI_SEEDS: u64 = 250;
const FIRST_SEED: u64 = 1;
/// Seeds past CI's range that found a defect, run by CI too (with the plans of this generator:
/// a change to how plans are drawn changes what a seed runs).
/// 301432: a Redis-only flight served its stale value to a call that joined it after another
/// flight of the process had returned a newer value (`Leader::finish` stops it serving).
/// 11882, 100700, 105908, 108926: a batch's keys were answered only when its last key was, so a
/// call that joined a key whose load had already failed got that failure's fail-safe value (the
/// tier reports each key as soon as it is decided: `Batch::report`).
/// 94684, 263377: a window held two flights of one key (a call joined it after an invalidation
/// detached the first), the function was given the key twice and the second was answered absent
/// (`Batch::load` gives the function each key once).
/// 35827: a tag invalidation detached a batch refresh's flights before its task registered
/// their loads; slower than a newer flight of a key, it stored its older value over the newer
/// one (a flight detached before its handle registers keeps nothing: `Handle::new`).
/// 1497733: two processes refreshed a key without the lock; the one that read the source first
/// (an absence) wrote last-but-one, and the other's fill, refused by the fence, was handed that
/// older absence because Redis ordered by write time (the envelope's `read_at` orders now).
/// 1629118: a load that did not wait for the lock (`busy = "compute"`) shares its holder's
/// fence; it read the source before the holder's retry did and wrote after it, over the newer
/// value (a fill lands only over an older one: `FILL`).
/// 3026770: a retried load, refused by a fence another process's fill had moved, retired that
/// older value and handed out its newer one; the other process's refresh, under the moved fence,
/// then wrote a value older still (a fill that retires an older value now writes its own, moving
/// the fence on).
/// 3141513 (the oracle's): a key of a batch refresh was given its last good value by an open
/// breaker (its probe running) while the call's other keys were out; the oracle counted the
/// value's age from the call's beginning and did not start the throttle the runtime had.
/// 70926432, 72215820: two loads without the lock (`lock = "local"`); the first to fill moved
/// the fence, and its value expired (`ttl_from`); the load that read the source after it was
/// refused over nothing and handed out its own value, and the one that read before it, under
/// the fence as moved, then landed: an older value served after a newer (the fence is now the
/// key's greatest stamp, and a fill read after it lands over nothing).
/// 70053874: a Redis-only flight kept as its last good value one it read before another
/// process wrote a newer one, not to be kept (`ttl_from`'s zero); its load then failed
/// (`max_loads`) and a caller that joined after the newer value was returned got the older one
/// (a read that finds nothing kept drops the last good value: `Handle::no_last_good`).
/// 72134292 (the oracle's): a process kept the absence it loaded just before another process's
/// stalled prime of an older value landed, then read the primed value; the oracle let a prime
/// order later calls from its version after a copy held from before it, but not an absence.
/// 70878047 (the oracle's): a failed probe reopened a memory cache's breaker; the next probe
/// began a second later, and a call during it was given the fail-safe value at once, as the
/// README says; the oracle's model of the breaker ended with the cool-down (it now also reads
/// `Stats::breaker_open` as a call begins).
/// 72506057 and 113721750 (tiered, the feed or Redis down): a call did not join a flight begun
/// longer ago than the trust bound and loaded anew; the older flight, whose source was read
/// first, ended last and replaced the newer value in memory (served by fail-safe in the first,
/// by a hit in the second, where the newer value was kept already past the bound). Memory
/// entries now carry their source read, and a key's loads remember the latest kept.
/// 121443437 (memory, `lock = "none"`, `fail_safe`, a batch function): two loads of a key
/// raced; one stored its value, then the other failed, and its fail-safe kept that still fresh
/// value "fresh again for the throttle", past its ttl. The throttle leaves a fresh value as is.
/// 143922967 and 147459162 (the oracle's; `batch_window`, `retry_if`): a tag invalidation
/// detached a window's flights of two keys, and later calls sent the keys again, to the same
/// window; the runtime loaded the detached flights (a permanent failure), then the new ones,
/// through one load closure, whose second call took the first call's flights again by
/// occurrence: "tried again after an error retry_if refuses". A flight whose load is over now
/// gives way to the window's next flight of its key.
/// 140877845 (the oracle's; a batch function, `breaker = 1`, `max_loads`, `fail_safe`): a
/// dropped batch call's first chunk panicked, the breaker opened, and its later chunks, still
/// waiting for a free load, met it: their keys' last good values stood for the throttle, and
/// a call 1.4 s later was served them. The oracle now grants the throttle to a dropped call's
/// keys when a load of their cache fails while their flight may still be waiting to start.
/// 187461879 (the oracle's; tiered, `lock = "redis"`, `breaker = 2`, `fail_safe`): a call was
/// served a stale value, and its refresh in the background waited for the breaker's probe and
/// was skipped; the value stood for the throttle, and a call 1.1 s later was served it. A
/// background refresh is a flight no caller watches, as a dropped call's is.
/// 188002401 (`expire`, tiered, `lock = "local"`): a refresh that read the source between a
/// value's read and its expiry filled over the expired value, which the store ordered as any
/// older value; an expired value now orders a fill as nothing stored does (`envelope::EXPIRED`).
/// 188023196 (`expire`, Redis only, an outage): the fake tier's expiry forgot that the process
/// had served a newer value while the store was down, and the older stored value was served
/// after it; an expiry, unlike an invalidation, leaves that key's cleaning to do.
/// 190001203 (`clear`, Redis only, `lock = "none"`, a batch refresh): the fake store's clear
/// moved only the fences it had, and a key read but not filled has none there (in Redis a read
/// makes one, which the clear's `SCAN` finds): the refresh's older values landed after the
/// clear. A clear now moves every key's fence (`State::cleared`).
/// 191415049 (the same, at the store's first instant): the clear's stamp was 0 µs on the
/// store's clock, which moved no fence; it now moves on by one at least (`order::moved_fence`).
/// 191422771 (the oracle's; a tag's expiry while a prime of the key stalled): the prime landed
/// after the expiry, the latest write, and the oracle aged it by the expiry.
/// 191516300 (Redis only, `fail_safe`, a delayed feed and lost wake-ups; older than this
/// session): a refresh detached by the feed's loss answered v1; the key's newer flight, which
/// had served v0 stale, stopped serving it, but its load then failed and its stale-if-error
/// answer gave v0 to a call that joined it after v1 was returned. A flight overtaken so
/// (`Leader::overtaken`) no longer answers a failure with the stale or last good value it read.
/// 195572659 (`expire`, Redis only, `lock = "redis"`, `fail_safe`): a load read before an
/// expiry was fenced off by it and its value, handed to its callers, was kept nowhere; a later
/// failed load was answered with the expired, older value. A fill newer than an expired value
/// now replaces it, expired too (`order::Landing::Expired`).
const FOUND: &[u64] = &[
    11_882,
    35_827,
    94_684,
    100_700,
    105_908,
    108_926,
    263_377,
    301_432,
    1_497_733,
    1_629_118,
    3_026_770,
    3_141_513,
    20_025_065,
    70_053_874,
    70_926_432,
    72_134_292,
    72_215_820,
    70_878_047,
    72_506_057,
    113_721_750,
    121_443_437,
    143_922_967,
    147_459_162,
    140_877_845,
    186_110_297,
    186_449_956,
    187_461_879,
    188_002_401,
    188_023_196,
    190_001_203,
    191_415_049,
    191_422_771,
    191_516_300,
    195_572_659,
];
/// The salt of the draws of `read_through` operations (see `read_through`).
const READ_THROUGH_SALT: u64 = 0x7e4d_0780;
/// The salt of `memory_ttl`'s draws (see `function`).
const MEMORY_TTL_SALT: u64 = 0x3e3_0007;
/// The salt of `xfetch`'s draws (see `xfetch`).
const XFETCH_SALT: u64 = 0xf37c_009c;
/// The salt of the draws of `expire` operations (see `expiring`).
const EXPIRE_SALT: u64 = 0x0e70_1430;
/// The salt of the draws of options set at run time (see `configuring`).
const CONFIGURE_SALT: u64 = 0x0c0f_0371;
/// The salt of `max_loads`' draws (see `max_loads`).
const MAX_LOADS_SALT: u64 = 0x3a7_0472;
/// No operation of a run may take longer (virtual time): past it, it hung.
const HANG: Duration = Duration::from_secs(600);
/// How long after the first runtime ends the second begins.
const RESTART_GAP: Duration = Duration::from_secs(3_600);

// ---- the plan of a run -------------------------------------------------------------------------

/// Everything a run does, drawn from its seed.
#[derive(Clone, Debug)]
struct Plan {
    seed: u64,
    processes: usize,
    keys: Key,
    functions: Vec<FunctionPlan>,
    clients: Vec<Vec<Op>>,
    faults: Vec<(Duration, Fault)>,
    /// When the first runtime is dropped (its tasks with it) and a new one takes over.
    restart_after: usize,
    lease: Duration,
    bound: Duration,
}

#[derive(Clone, Debug)]
struct FunctionPlan {
    config: Config,
    /// `ttl_from`: a value's own fresh time (`own_ttl_of`).
    ttl_from: bool,
    /// `batch`: a batch function, with its options.
    batch: Option<BatchPlan>,
    tagged: bool,
    /// `source_version`: the version the source read is the value's.
    versioned: bool,
    /// `busy`, with `lock = "redis"`.
    busy: Busy,
    /// The connection's `lock_wait`: how long a flight waits for another process's fill.
    lock_wait: Duration,
    /// `retry_if`: the source's permanent errors are not retried.
    retry_if: bool,
    /// Per mille of failed loads whose error is permanent (not found, refused).
    permanent: u32,
    /// Per mille of loads that fail, panic, stall past the timeout.
    fails: u32,
    panics: u32,
    stalls: u32,
    /// The longest a load takes.
    slowest: Duration,
    /// `redis`: the connection its caches share values through, with a shared backend.
    connection: Connection,
}

/// `redis = "..."`: a named connection, and the namespace (database, prefix) of the server it
/// selects. Every function's store is a server of its own, but a twin's: it shares the server of
/// the function it is the twin of, and its name, on another namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Connection {
    /// Each process names its connection apart (`sim-c{process}`), all to one namespace; else
    /// the default connection.
    named: bool,
    /// The namespace its connection selects.
    space: Space,
    /// The function whose server and name it shares (on another namespace).
    twin_of: Option<u8>,
}

/// What a batch function's plan adds.
#[derive(Clone, Copy, Debug)]
struct BatchPlan {
    /// Its keys are `0..keys`: its batch calls draw from all of them, the other operations
    /// (single-key calls through `batch_loader`, writes, ...) from them or from the plan's keys.
    keys: Key,
    /// `missing_ttl`: how long a key the map leaves out is cached as absent.
    missing: Missing,
    /// `batch_window`: the single-key calls (through `batch_loader`) that must load within it
    /// are loaded by one call of the function.
    window: Option<Duration>,
}

/// `missing_ttl`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Missing {
    /// `"0s"`: not cached at all.
    Zero,
    /// Shorter than `ttl` (one of the fixed times `batch_ttl` is made for).
    Short(u64),
    /// `ttl` (the default).
    Ttl,
}

impl Missing {
    /// The fresh time of an absence.
    fn fresh(self, ttl: Duration) -> Duration {
        match self {
            Missing::Zero => Duration::ZERO,
            Missing::Short(ms) => Duration::from_millis(ms).min(ttl),
            Missing::Ttl => ttl,
        }
    }
}

/// `busy = "wait" | "compute" | "error"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Busy {
    Wait,
    Compute,
    Error,
}

/// The options of the README's table that the plans draw (each takes more than one value across
/// plans: see `the_plans_cover_the_readmes_options`).
const PLANNED: &[&str] = &[
    "ttl",
    "jitter",
    "stale",
    "timeout",
    "retries",
    "backoff",
    "lock",
    "backend",
    "busy",
    "refresh_after",
    "xfetch",
    "fail_safe",
    "fail_safe_throttle",
    "soft_timeout",
    "memory_ttl",
    "retry_if",
    "source_version",
    "ttl_from",
    "breaker",
    "breaker_cooldown",
    "capacity",
    "tags",
    "batch",
    "batch_max",
    "missing_ttl",
    "batch_loader",
    "batch_window",
    "redis",
    "max_loads",
    "max_loads_full",
];

/// The options of the README's table that the plans do not draw yet, and why: each needs work
/// in the runtime's simulation hooks or fake tier first. None now.
const NOT_SIMULATED: &[(&str, &str)] = &[];

/// The options of the README's table that change nothing a run could see: the cache's identity
/// (a fake store per function, but a twin's, which shares its name on another namespace: see
/// `redis`), what the macro accepts at compile time, or only the bytes a value takes in Redis
/// (the fake tier holds values, not bytes).
const UNSEEN_BY_A_RUN: &[(&str, &str)] = &[
    (
        "name",
        "identity: the plans name each cache `sim<seed>::f<n>` (a twin on another namespace \
         takes its twin's: see `redis`)",
    ),
    ("version", "identity in a shared tier, beside the name"),
    ("key", "identity: the key template; keys are numbers here"),
    (
        "companion",
        "compile time: which operations the macro emits (the plans call them all)",
    ),
    ("crate", "compile time: the path of the crate"),
    (
        "long_windows",
        "compile time: accepts a `stale` or `fail_safe` over 1,000 times `ttl`",
    ),
    (
        "compress",
        "bytes only: how a value is written to Redis, which every reader reads either way \
         (tests/redis_oracle.rs runs two processes compressed and one not, on a real Redis)",
    ),
];

#[derive(Clone, Copy, Debug)]
enum Op {
    Sleep(Duration),
    Call(u8, usize, Key),
    Peek(u8, usize, Key),
    /// The source changes, nothing is invalidated.
    Write(u8, Key),
    WriteInvalidate(u8, usize, Key),
    /// The source changes, and the key's value is expired (`expire`) rather than dropped.
    WriteExpire(u8, usize, Key),
    WritePrime(u8, usize, Key),
    WriteInvalidateTag(u8, Key),
    /// The source changes, and the tag's entries are expired (`expire_tag`).
    WriteExpireTag(u8, Key),
    /// Every key of the function changes, and its cache is cleared (`clear`) in a process.
    WriteClear(u8, usize),
    /// The options of the function's name are set at run time (`stampede::configure`): its
    /// `ttl`, `stale` and `timeout` shortened to this many per mille of the plan's (never
    /// longer, so the oracle's rules, drawn from the plan, stay bounds).
    Configure(u8, u16),
    Refresh(u8, usize, Key),
    /// The companion's `read_through`: a call that skips this process's memory.
    ReadThrough(u8, usize, Key),
    /// A call its caller gives up on after this long.
    Dropped(u8, usize, Key, Duration),
    /// A call of a batch function (of its companion's `refresh`; one its caller gives up on).
    Batch(u8, usize, BatchKeys, BatchCall),
    /// Single-key calls of a batch function (through `batch_loader`), made at once.
    Burst(u8, usize, BatchKeys),
}

/// The keys of a batch call: `count` keys drawn from `seed` among the function's (repeats
/// included: a call gives each key once).
#[derive(Clone, Copy, Debug)]
struct BatchKeys {
    seed: u64,
    count: u8,
}

impl BatchKeys {
    fn keys(self, of: Key) -> Vec<Key> {
        let mut rng = SmallRng::seed_from_u64(self.seed);
        (0..self.count).map(|_| rng.random_range(0..of)).collect()
    }
}

#[derive(Clone, Copy, Debug)]
enum BatchCall {
    Get,
    Refresh,
    Dropped(Duration),
}

#[derive(Clone, Copy, Debug)]
enum Fault {
    Outage {
        noticed: Duration,
        lasting: Duration,
    },
    CutFeed {
        process: usize,
        noticed: Duration,
        lasting: Duration,
    },
    DelayFeed {
        process: usize,
        delay: Duration,
        lasting: Duration,
    },
    LoseWakeups(Duration),
    LapseLeases(Duration),
    Stall {
        each: Duration,
        lasting: Duration,
    },
    SourceDown {
        function: u8,
        lasting: Duration,
    },
}

fn ms(rng: &mut SmallRng, low: u64, high: u64) -> Duration {
    Duration::from_millis(rng.random_range(low..=high))
}

/// `max_loads` and `max_loads_full` of a seed's function at `index`, drawn apart (the salt is
/// one with which no seed of `FOUND` draws it: they run as they did). Low caps, so that loads of
/// distinct keys queue, and time out or are shed.
fn max_loads(seed: u64, index: usize, salt: u64) -> Option<(u32, LoadsFull)> {
    let capped = &mut SmallRng::seed_from_u64(seed ^ salt ^ index as u64);
    if !chance(capped, 300) {
        return None;
    }
    let full = match chance(capped, 400) {
        true => LoadsFull::Error,
        false => LoadsFull::Wait,
    };
    Some((capped.random_range(1..=3), full))
}

/// `xfetch`'s beta for a seed's function at `index`, drawn apart (the salt is one with which no
/// seed of `FOUND` draws it).
fn xfetch(seed: u64, index: usize, salt: u64) -> Option<f64> {
    let early = &mut SmallRng::seed_from_u64(seed ^ salt ^ index as u64);
    chance(early, 300).then(|| early.random_range(0.5..4.0))
}

fn chance(rng: &mut SmallRng, per_mille: u32) -> bool {
    rng.random_range(0..1000) < per_mille
}

impl Plan {
    /// The plan of `seed`, with at most `ops` operations per client (`usize::MAX`: all).
    fn of(seed: u64, ops: usize) -> Plan {
        let mut rng = SmallRng::seed_from_u64(seed);
        let processes = rng.random_range(1..=3);
        let keys = rng.random_range(1..=4);
        let mut functions: Vec<FunctionPlan> = (0..rng.random_range(1..=2))
            .map(|f| function(&mut rng, seed, f, keys))
            .collect();
        connections(&mut functions, seed);
        // Drawn whole, then cut: a shrunk plan is a prefix of the full one.
        let clients = (0..rng.random_range(2..=5))
            .map(|client| {
                let count = rng.random_range(10..=40);
                let mut drawn: Vec<Op> = (0..count)
                    .flat_map(|_| {
                        let pause = Op::Sleep(ms(&mut rng, 0, 300));
                        [pause, op(&mut rng, &functions, processes, keys)]
                    })
                    .collect();
                batched(&mut drawn, &functions, seed, client);
                windowed(&mut drawn, &functions, seed, client);
                read_through(&mut drawn, &functions, seed, client);
                expiring(&mut drawn, seed, client);
                configuring(&mut drawn, seed, client);
                drawn.truncate(ops.saturating_mul(2));
                drawn
            })
            .collect::<Vec<Vec<Op>>>();
        let faults = (0..rng.random_range(0..=4))
            .map(|_| {
                let at = ms(&mut rng, 0, 8_000);
                (at, fault(&mut rng, processes, functions.len()))
            })
            .collect();
        let longest = clients.iter().map(Vec::len).max().unwrap_or(0);
        Plan {
            seed,
            processes,
            keys,
            functions,
            clients,
            faults,
            restart_after: rng.random_range(0..=longest),
            lease: ms(&mut rng, 100, 2_000),
            bound: ms(&mut rng, 100, 2_000),
        }
    }

    fn ops(&self) -> usize {
        self.clients.iter().map(Vec::len).sum::<usize>() / 2
    }
}

/// A function's random but valid options, as `#[cached]` would accept them.
fn function(rng: &mut SmallRng, seed: u64, index: usize, keys: Key) -> FunctionPlan {
    let lock = [Lock::Local, Lock::Redis, Lock::None][rng.random_range(0..3)];
    let backend = match lock {
        Lock::Redis => [Backend::Tiered, Backend::Redis][rng.random_range(0..2)],
        _ => [Backend::Memory, Backend::Tiered, Backend::Redis][rng.random_range(0..3)],
    };
    let ttl = ms(rng, 50, 3_000);
    let locked = lock != Lock::None;
    let fail_safe = chance(rng, 400).then(|| ms(rng, 500, 20_000));
    let breaker = chance(rng, 300).then(|| rng.random_range(1..=4));
    let config = Config {
        name: format!("sim{seed}::f{index}").into(),
        ttl,
        jitter: rng.random_range(0..=50),
        stale: match locked && chance(rng, 600) {
            true => ms(rng, 10, 3_000),
            false => Duration::ZERO,
        },
        timeout: ms(rng, 20, 1_000),
        retries: rng.random_range(0..=2),
        backoff: ms(rng, 1, 50),
        lock,
        backend,
        capacity: 1_000,
        refresh_after: (locked && chance(rng, 300))
            .then(|| ttl.mul_f64(rng.random_range(0.2..0.9)))
            .filter(|after| !after.is_zero()),
        xfetch: None,
        fail_safe,
        fail_safe_throttle: ms(rng, 10, 3_000),
        soft_timeout: (fail_safe.is_some() && locked && chance(rng, 400)).then(|| ms(rng, 5, 300)),
        memory_ttl: None,
        compress: None,
        breaker,
        breaker_cooldown: ms(rng, 50, 3_000),
        key: None,
        version: None,
        ttl_from: None,
        batch_max: None,
        max_loads: None,
        max_loads_full: LoadsFull::Wait,
    };
    // Drawn apart from the rest, so that the plans of the seeds replayed in CI stay as they were.
    let versioned = chance(
        &mut SmallRng::seed_from_u64(seed ^ 0x5eed_0000 ^ index as u64),
        400,
    );
    // The options planned later, drawn apart too for the same reason.
    let later = &mut SmallRng::seed_from_u64(seed ^ 0x0071_0000 ^ index as u64);
    let mut config = config;
    let ttl_from = chance(later, 300);
    if ttl_from {
        config.ttl_from = Some(own_ttl);
    }
    let busy_error = lock == Lock::Redis && chance(rng, 300);
    let busy = match busy_error {
        true => Busy::Error,
        false if lock == Lock::Redis && chance(later, 300) => Busy::Compute,
        false => Busy::Wait,
    };
    // Mostly longer than any load, so that a flight gives up waiting only when a lease lapsed;
    // sometimes shorter than the slowest load, so that a waiter loads beside the holder.
    let lock_wait = match chance(later, 300) {
        true => ms(later, 5, 1_500),
        false => Duration::from_secs(60),
    };
    let retry_if = chance(later, 400);
    let permanent = later.random_range(0..=500);
    // A memory that holds fewer keys than the run uses evicts.
    if chance(later, 250) {
        config.capacity = later.random_range(1..=3);
    }
    // Batch functions, drawn apart too.
    let batchy = &mut SmallRng::seed_from_u64(seed ^ 0xba7c_0000 ^ index as u64);
    let batch = chance(batchy, 350).then(|| {
        config.batch_max = chance(batchy, 500).then(|| batchy.random_range(1..=8));
        let missing = match batchy.random_range(0..3) {
            0 => Missing::Zero,
            1 if config.ttl >= Duration::from_millis(400) => Missing::Short(300),
            1 => Missing::Short(50),
            _ => Missing::Ttl,
        };
        config.ttl_from = batch_ttl(ttl_from, missing);
        // Drawn apart again, so that the batch plans drawn before it stay as they were (the
        // salt is one with which no seed of `FOUND` draws a window: they run as they did).
        let windowed = &mut SmallRng::seed_from_u64(seed ^ 0xb1f7_0000 ^ index as u64);
        BatchPlan {
            keys: keys + batchy.random_range(0..=40),
            missing,
            window: chance(windowed, 400).then(|| ms(windowed, 1, 20)),
        }
    });
    // `memory_ttl`, for a tiered cache: drawn apart (the salt is one with which no seed of
    // `FOUND` draws it: they run as they did).
    let tiered = &mut SmallRng::seed_from_u64(seed ^ MEMORY_TTL_SALT ^ index as u64);
    if backend == Backend::Tiered && chance(tiered, 300) {
        let longest = u64::try_from(config.ttl.as_millis()).unwrap_or(u64::MAX);
        config.memory_ttl = Some(ms(tiered, 1, longest.max(1)));
    }
    // XFetch, where refresh-ahead may be (a lock, values in memory) and `refresh_after` is not.
    if let Some(beta) = xfetch(seed, index, XFETCH_SALT)
        && config.lock != Lock::None
        && config.refresh_after.is_none()
        && backend != Backend::Redis
    {
        config.xfetch = Some(beta);
    }
    if let Some((most, full)) = max_loads(seed, index, MAX_LOADS_SALT) {
        config.max_loads = Some(most);
        config.max_loads_full = full;
    }
    FunctionPlan {
        config,
        ttl_from,
        batch,
        versioned,
        tagged: chance(rng, 400),
        busy,
        lock_wait,
        retry_if,
        permanent,
        fails: rng.random_range(0..=300),
        panics: rng.random_range(0..=30),
        stalls: rng.random_range(0..=50),
        slowest: ms(rng, 0, 400),
        connection: Connection::default(),
    }
}

/// The functions' connections (drawn apart, so that the rest of a plan stays as drawn; the salt
/// is one with which no seed of `FOUND` draws a twin or a named connection: they run as they
/// did): some on named connections, and, of two functions with a shared backend, the second
/// sometimes the twin of the first: one name, one server, another database or prefix.
fn connections(functions: &mut [FunctionPlan], seed: u64) {
    let rng = &mut SmallRng::seed_from_u64(seed ^ 0xdb59_0000);
    for function in functions.iter_mut() {
        function.connection.named = chance(rng, 300);
    }
    let twins = chance(rng, 400);
    if let [first, second] = functions
        && twins
        && first.config.backend != Backend::Memory
        && second.config.backend != Backend::Memory
    {
        second.config.name = first.config.name.clone();
        second.connection.twin_of = Some(0);
        second.connection.space = match rng.random_range(0..2) {
            0 => Space {
                db: 1,
                prefix: Arc::default(),
            },
            _ => Space {
                db: 0,
                prefix: "other".into(),
            },
        };
    }
}

fn op(rng: &mut SmallRng, functions: &[FunctionPlan], processes: usize, keys: Key) -> Op {
    let f = rng.random_range(0..functions.len()) as u8;
    let p = rng.random_range(0..processes);
    let k = rng.random_range(0..keys);
    match rng.random_range(0..100) {
        0..55 => Op::Call(f, p, k),
        55..60 => Op::Peek(f, p, k),
        60..66 => Op::Write(f, k),
        66..76 => Op::WriteInvalidate(f, p, k),
        76..81 => Op::WritePrime(f, p, k),
        81..86 if functions[f as usize].tagged => Op::WriteInvalidateTag(f, k),
        81..92 => Op::Refresh(f, p, k),
        _ => Op::Dropped(f, p, k, ms(rng, 0, 100)),
    }
}

/// Turns a client's operations on batch functions into theirs (from a generator of their own, so
/// that the other functions' operations stay as drawn): half their calls are batch calls of 1
/// to 50 keys, the others single-key calls through `batch_loader`; a refresh is the companion's
/// `refresh` of many keys; and half of the keys of single-key operations are drawn among all
/// the function's keys.
fn batched(ops: &mut [Op], functions: &[FunctionPlan], seed: u64, client: usize) {
    let rng = &mut SmallRng::seed_from_u64(seed ^ 0xba7c_c000 ^ client as u64);
    for op in ops.iter_mut() {
        let f = match *op {
            Op::Sleep(_) => continue,
            Op::Call(f, ..)
            | Op::Peek(f, ..)
            | Op::Write(f, _)
            | Op::WriteInvalidate(f, ..)
            | Op::WriteExpire(f, ..)
            | Op::WritePrime(f, ..)
            | Op::WriteInvalidateTag(f, _)
            | Op::WriteExpireTag(f, _)
            | Op::WriteClear(f, _)
            | Op::Configure(f, _)
            | Op::Refresh(f, ..)
            | Op::ReadThrough(f, ..)
            | Op::Dropped(f, ..)
            | Op::Batch(f, ..)
            | Op::Burst(f, ..) => f,
        };
        let Some(batch) = functions[f as usize].batch else {
            continue;
        };
        let keys = BatchKeys {
            seed: rng.random(),
            count: rng.random_range(1..=50),
        };
        let mut wide = |k: Key| match chance(rng, 500) {
            true => rng.random_range(0..batch.keys),
            false => k,
        };
        *op = match *op {
            Op::Call(f, p, _) if keys.seed.is_multiple_of(2) => {
                Op::Batch(f, p, keys, BatchCall::Get)
            }
            Op::Call(f, p, k) => Op::Call(f, p, wide(k)),
            Op::Refresh(f, p, _) => Op::Batch(f, p, keys, BatchCall::Refresh),
            Op::Dropped(f, p, _, after) if keys.seed.is_multiple_of(2) => {
                Op::Batch(f, p, keys, BatchCall::Dropped(after))
            }
            Op::Dropped(f, p, k, after) => Op::Dropped(f, p, wide(k), after),
            Op::Peek(f, p, k) => Op::Peek(f, p, wide(k)),
            Op::Write(f, k) => Op::Write(f, wide(k)),
            Op::WriteInvalidate(f, p, k) => Op::WriteInvalidate(f, p, wide(k)),
            Op::WriteExpire(f, p, k) => Op::WriteExpire(f, p, wide(k)),
            Op::WritePrime(f, p, k) => Op::WritePrime(f, p, wide(k)),
            other => other,
        };
    }
}

/// Turns some single-key calls of a function that is not a batch function into its companion's
/// `read_through`, in some seeds only (a salt with which no seed of `FOUND` is one: they run as
/// they did), from generators of their own so that the other operations stay as drawn.
fn read_through(ops: &mut [Op], functions: &[FunctionPlan], seed: u64, client: usize) {
    if !chance(&mut SmallRng::seed_from_u64(seed ^ READ_THROUGH_SALT), 300) {
        return;
    }
    let rng = &mut SmallRng::seed_from_u64(seed ^ READ_THROUGH_SALT ^ (client as u64 + 1));
    for op in ops.iter_mut() {
        if let Op::Call(f, p, k) = *op
            && functions[f as usize].batch.is_none()
            && chance(rng, 200)
        {
            *op = Op::ReadThrough(f, p, k);
        }
    }
}

/// Turns some of the source's writes into options set at run time (`configure`), in some seeds
/// only (a salt with which no seed found before draws them), from a generator of its own.
fn configuring(ops: &mut [Op], seed: u64, client: usize) {
    if !chance(&mut SmallRng::seed_from_u64(seed ^ CONFIGURE_SALT), 300) {
        return;
    }
    let rng = &mut SmallRng::seed_from_u64(seed ^ CONFIGURE_SALT ^ (client as u64 + 1));
    for op in ops.iter_mut() {
        if let Op::Write(f, _) = *op
            && chance(rng, 300)
        {
            *op = Op::Configure(f, rng.random_range(200..=1000));
        }
    }
}

/// Turns some invalidations into expiries (`expire`, `expire_tag`) and a few into clears
/// (`clear`), in some seeds only (a salt with which no seed found before it draws them: they
/// run as they did), from generators of their own so that the other operations stay as drawn.
fn expiring(ops: &mut [Op], seed: u64, client: usize) {
    if !chance(&mut SmallRng::seed_from_u64(seed ^ EXPIRE_SALT), 300) {
        return;
    }
    let rng = &mut SmallRng::seed_from_u64(seed ^ EXPIRE_SALT ^ (client as u64 + 1));
    // Tags' and clears' from generators apart from keys', so that each draws as it did alone.
    let tags = &mut SmallRng::seed_from_u64(seed ^ EXPIRE_SALT ^ ((client as u64 + 1) << 32));
    let clears = &mut SmallRng::seed_from_u64(seed ^ EXPIRE_SALT ^ ((client as u64 + 1) << 40));
    for op in ops.iter_mut() {
        *op = match *op {
            Op::WriteInvalidate(f, p, k) if chance(rng, 500) => Op::WriteExpire(f, p, k),
            Op::WriteInvalidate(f, p, _) if chance(clears, 100) => Op::WriteClear(f, p),
            Op::WriteInvalidateTag(f, k) if chance(tags, 500) => Op::WriteExpireTag(f, k),
            other => other,
        };
    }
}

/// Turns some single-key calls of a function with `batch_window` into bursts of them (from a
/// generator of its own, so that the other operations stay as drawn): a handler written per
/// item, its calls made at once, which the window loads together.
fn windowed(ops: &mut [Op], functions: &[FunctionPlan], seed: u64, client: usize) {
    let rng = &mut SmallRng::seed_from_u64(seed ^ 0xb1d0_c000 ^ client as u64);
    for op in ops.iter_mut() {
        let Op::Call(f, p, _) = *op else {
            continue;
        };
        let windowed = functions[f as usize]
            .batch
            .is_some_and(|batch| batch.window.is_some());
        if windowed && chance(rng, 600) {
            let keys = BatchKeys {
                seed: rng.random(),
                count: rng.random_range(2..=8),
            };
            *op = Op::Burst(f, p, keys);
        }
    }
}

/// Whether the invalidation log still covers what a feed cut for `lasting` missed: for three
/// cuts in four. Read off the fault's own duration, not drawn, so that every seed keeps the plan
/// it had before the log was modelled; the fourth drops its memory when its feed is back, as a
/// process does when its position was trimmed away or the server restarted empty.
fn covered_by_the_log(lasting: Duration) -> bool {
    !lasting.as_millis().is_multiple_of(4)
}

fn fault(rng: &mut SmallRng, processes: usize, functions: usize) -> Fault {
    let lasting = ms(rng, 50, 3_000);
    match rng.random_range(0..7) {
        0 => Fault::Outage {
            noticed: ms(rng, 0, 2_000),
            lasting,
        },
        1 => Fault::CutFeed {
            process: rng.random_range(0..processes),
            noticed: ms(rng, 0, 2_000),
            lasting,
        },
        2 => Fault::DelayFeed {
            process: rng.random_range(0..processes),
            // Up to longer than any bound: past half of it, the process notices its feed late.
            delay: ms(rng, 1, 3_000),
            lasting,
        },
        3 => Fault::LoseWakeups(lasting),
        4 => Fault::LapseLeases(lasting),
        5 => Fault::Stall {
            each: ms(rng, 1, 200),
            lasting,
        },
        _ => Fault::SourceDown {
            function: rng.random_range(0..functions) as u8,
            lasting,
        },
    }
}

// ---- the world of a run ------------------------------------------------------------------------

/// One function's caches (one per process) and its source.
struct Function {
    index: u8,
    plan: FunctionPlan,
    caches: Vec<Cache>,
    store: Option<Arc<Store<Key, Held>>>,
    source: Arc<Source>,
    /// The flights of its single-key calls that had to start a load (a batch function's).
    book: Arc<Mutex<Book>>,
}

#[derive(Clone, Copy)]
enum Cache {
    Local(SimCache<Key, Held, Local>),
    Shared(SimCache<Key, Held, Fake<Key, Held>>),
}

/// The database behind one function: versions per key (kept by the oracle), and how it fails.
struct Source {
    function: u8,
    plan: FunctionPlan,
    oracle: Arc<Oracle>,
    rng: Mutex<SmallRng>,
    down: std::sync::atomic::AtomicBool,
}

/// The tags of a key of a tagged function: its parity and all keys, named by run.
/// A value's source version (`source_version`): the version of the source its load read.
/// A batch function's absent key has none (README, Batch functions: "an absent key has no
/// version").
fn version_of(value: &Held) -> Option<u64> {
    value.as_ref().map(|value| value.version)
}

/// `ttl_from`: a value's own fresh time, a function of its version (some longer than any
/// `ttl`, capped; some none, `ttl` then).
fn own_ttl(value: &(dyn std::any::Any + Send + Sync)) -> Option<Duration> {
    let value = value.downcast_ref::<Held>()?.as_ref()?;
    own_ttl_of(value)
}

/// A batch function's `ttl_from`, as the macro makes it: a found value's own time (`OWN`: with
/// `ttl_from`), and for an absent key `missing_ttl` (`MISSING_MS`; `u64::MAX`: none, `ttl`).
fn batch_ttl_of<const OWN: bool, const MISSING_MS: u64>(
    value: &(dyn std::any::Any + Send + Sync),
) -> Option<Duration> {
    match value.downcast_ref::<Held>()? {
        Some(found) if OWN => own_ttl_of(found),
        Some(_) => None,
        None => (MISSING_MS != u64::MAX).then(|| Duration::from_millis(MISSING_MS)),
    }
}

type TtlFrom = fn(&(dyn std::any::Any + Send + Sync)) -> Option<Duration>;

/// The `ttl_from` of a batch function's cache (none without `ttl_from` and `missing_ttl`).
fn batch_ttl(own: bool, missing: Missing) -> Option<TtlFrom> {
    Some(match (own, missing) {
        (false, Missing::Ttl) => return None,
        (false, Missing::Zero) => batch_ttl_of::<false, 0>,
        (false, Missing::Short(50)) => batch_ttl_of::<false, 50>,
        (false, Missing::Short(_)) => batch_ttl_of::<false, 300>,
        (true, Missing::Ttl) => batch_ttl_of::<true, { u64::MAX }>,
        (true, Missing::Zero) => batch_ttl_of::<true, 0>,
        (true, Missing::Short(50)) => batch_ttl_of::<true, 50>,
        (true, Missing::Short(_)) => batch_ttl_of::<true, 300>,
    })
}

fn own_ttl_of(value: &Val) -> Option<Duration> {
    match value.version % 5 {
        0 => None,
        1 => Some(Duration::ZERO),
        n => Some(Duration::from_millis(400 * n * n)),
    }
}

/// `retry_if`: the source's permanent errors are not worth another attempt.
#[allow(clippy::ptr_arg)] // `retry_if` takes `fn(&E)`, and the source's error `E` is `String`
fn transient(error: &String) -> bool {
    !error.contains("permanent")
}

fn tags_of(key: &Key) -> Vec<String> {
    RUN.with(|run| {
        let run = run.get();
        vec![format!("sim{run}:k{}", key % 2), format!("sim{run}:all")]
    })
}

thread_local! {
    /// The seed of the run on this thread, for the tags' names.
    static RUN: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

impl Source {
    /// One attempt of a load of `key` in `process`.
    async fn load(
        self: Arc<Self>,
        process: usize,
        key: Key,
        flight: Flight,
    ) -> Result<Val, String> {
        let id = self
            .oracle
            .load_started(self.function, process, key, flight);
        let ended = Ended(&self, vec![(key, id)], Attempt::Dropped);
        let previous = previous::<Held>().flatten();
        self.attempt(format!("k{key}"), ended, || self.read_since(key, previous))
            .await
    }

    /// One attempt of a batch function's load of `keys` in `process`: one call of the source
    /// for them all, the map of the keys present at the version it reads (`flights`: the flight
    /// of each key, in order, as the call that started it made it).
    async fn load_many(
        self: Arc<Self>,
        process: usize,
        keys: Vec<Key>,
        flights: Vec<Flight>,
    ) -> Result<HashMap<Key, Val>, String> {
        let oracle = &self.oracle;
        let ids = keys
            .iter()
            .zip(flights)
            .map(|(&key, flight)| {
                (
                    key,
                    oracle.load_started(self.function, process, key, flight),
                )
            })
            .collect();
        let ended = Ended(&self, ids, Attempt::Dropped);
        let previous: Vec<_> = keys
            .iter()
            .map(|key| previous_of::<Key, Held>(key).flatten())
            .collect();
        self.attempt(format!("k{keys:?}"), ended, || {
            keys.iter()
                .zip(previous)
                .map(|(&key, previous)| (key, self.read_since(key, previous)))
                .filter(|(_, value)| !sim::oracle::absent(self.function, value.key, value.version))
                .collect()
        })
        .await
    }

    /// A conditional read of `key` by a load given `previous` (`stampede::previous`): the
    /// previous value itself when the source still holds its version ("unchanged", as of now),
    /// else what the source holds. The oracle checks what the load was given.
    fn read_since(&self, key: Key, previous: Option<Val>) -> Val {
        let read = self.read(key);
        match previous {
            Some(previous) => {
                self.oracle
                    .previous_given(self.function, key, &previous, read.version);
                match (previous.function, previous.key, previous.version)
                    == (read.function, read.key, read.version)
                {
                    true => Val {
                        read_at: read.read_at,
                        ..previous
                    },
                    false => read,
                }
            }
            None => read,
        }
    }

    /// What the source holds for `key` when a load reads it.
    fn read(&self, key: Key) -> Val {
        Val {
            function: self.function,
            key,
            version: self.oracle.version(self.function, key),
            read_at: self.oracle.now(),
        }
    }

    /// One attempt of a load: reads the source (`read`), takes its time, and fails, panics or
    /// stalls past the timeout as the plan draws; `ended` tells the oracle how it ended.
    async fn attempt<T>(
        &self,
        what: String,
        mut ended: Ended<'_>,
        read: impl FnOnce() -> T,
    ) -> Result<T, String> {
        let (delay, outcome) = {
            let mut rng = self.rng.lock().unwrap();
            let delay =
                Duration::from_millis(rng.random_range(0..=self.plan.slowest.as_millis() as u64));
            let roll = rng.random_range(0..1000);
            (delay, roll)
        };
        let value = read();
        tokio::time::sleep(delay).await;
        let plan = &self.plan;
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            ended.2 = Attempt::Failed;
            return Err(format!("f{} {what}: the database is down", self.function));
        }
        if outcome < plan.fails {
            // The first part of the failures (per mille of them) is permanent.
            if outcome * 1000 < plan.fails * plan.permanent {
                ended.2 = match plan.retry_if {
                    true => Attempt::Permanent,
                    false => Attempt::Failed,
                };
                return Err(format!("f{} {what}: a permanent failure", self.function));
            }
            ended.2 = Attempt::Failed;
            return Err(format!("f{} {what}: the database failed", self.function));
        }
        if outcome < plan.fails + plan.panics {
            panic!("simulated panic: f{} {what}", self.function);
        }
        if outcome < plan.fails + plan.panics + plan.stalls {
            tokio::time::sleep(plan.config.timeout * 2).await;
        }
        ended.2 = Attempt::Loaded;
        Ok(value)
    }
}

/// Tells the oracle an attempt of a load of some keys ended, however it ended (a panic, or
/// dropped when it timed out or its runtime was dropped: [`Attempt::Dropped`] unless it said
/// otherwise).
struct Ended<'a>(&'a Source, Vec<(Key, u64)>, Attempt);

impl Drop for Ended<'_> {
    fn drop(&mut self) {
        for &(key, id) in &self.1 {
            self.0.oracle.load_ended(self.0.function, key, id, self.2);
        }
    }
}

impl Function {
    /// The rules the oracle checks this function's values against.
    fn rules(plan: &FunctionPlan, stall: Duration, lease: Duration) -> Rules {
        let config = &plan.config;
        let attempts = config.retries + 1;
        let backoffs: Duration = (0..config.retries)
            .map(|retry| config.backoff.mul_f64(1.5) * (1 << retry))
            .sum();
        let loading = (config.timeout * 2).max(plan.slowest) * attempts + backoffs;
        let stalls = stall * 4 + Duration::from_millis(5);
        let slack = loading + stalls;
        let redis_lock = config.lock == Lock::Redis;
        // A waiter loads without the Redis lock: at once with `busy = "compute"`, and when its
        // lock wait runs out (README, options: "`"wait"` for its value (then load it here after
        // the connection's `lock_wait`), `"compute"` at once"): a wait lasts a holder's load and
        // its stalls, or with lost wake-ups until the holder's lease would run out, and may
        // meet several holders in turn; only the 60 s wait outlasts them all.
        let unlocked_waiters =
            redis_lock && (plan.busy == Busy::Compute || plan.lock_wait <= (slack + lease) * 4);
        Rules {
            ttl: config.ttl,
            ttl_from: config
                .ttl_from
                .filter(|_| plan.ttl_from)
                .map(|_| own_ttl_of as fn(&Val) -> Option<Duration>),
            // README, options: `missing_ttl` "how long a key the map leaves out is cached as
            // absent (at most `ttl`; `"0s"`: not cached at all ...)".
            missing_ttl: plan.batch.map(|batch| batch.missing.fresh(config.ttl)),
            jitter: config.jitter,
            stale: config.stale,
            slack,
            stalls,
            fail_safe: config.fail_safe.map(|keep| FailSafe {
                keep,
                // README, options: "`fail_safe_throttle` ... kept in memory, so not with
                // `backend = "redis"`".
                throttle: match config.backend {
                    Backend::Redis => Duration::ZERO,
                    _ => config.fail_safe_throttle,
                },
                soft_timeout: config.soft_timeout,
                breaker: config.breaker.map(|opens| (opens, config.breaker_cooldown)),
            }),
            retry_if: plan.retry_if,
            breaker: config.breaker.is_some(),
            busy_error: plan.busy == Busy::Error,
            loads_full: config.max_loads.is_some(),
            shared: config.backend != Backend::Memory,
            no_singleflight: config.lock == Lock::None,
            // Without a lock, loads race: in memory the last to finish stays, in the shared tier
            // the first to fill does (a later fill read its fence before it). With Redis only, a
            // load without the Redis lock (`lock = "local"`, a waiter's with `busy = "compute"`
            // or past its lock wait) may be fenced off by another's fill and is kept nowhere,
            // though its callers got it. Nothing orders those values without source versions;
            // with them, memory keeps the newest it holds, so only Redis only is left unordered
            // under a lock. Without a lock, versions do not order either: a value's version is
            // compared with what is stored now (README, "Source versions"), and once the newer
            // value expires, a racing load of an older version that is still running is stored
            // (seeds 862568, 904459). With the Redis lock every load (a refresh's too) holds it,
            // unless a waiter loads beside it.
            unordered: config.lock == Lock::None
                || (config.backend == Backend::Redis && (!redis_lock || unlocked_waiters)),
            one_load_everywhere: redis_lock && plan.busy != Busy::Compute,
            lock_wait: plan.lock_wait,
            refreshes_early: config.refresh_after.is_some() || config.xfetch.is_some(),
        }
    }

    fn cache(&self, process: usize) -> Cache {
        self.caches[process]
    }

    /// Its `retry_if`, if it has one.
    fn retry_if(&self) -> Option<fn(&String) -> bool> {
        self.plan
            .retry_if
            .then_some(transient as fn(&String) -> bool)
    }

    /// The keys of this function (a batch function's, the plan's and more).
    fn keys(&self, plan: &Plan) -> Key {
        self.plan.batch.map_or(plan.keys, |batch| batch.keys)
    }

    /// The load a call of this function makes in `process`.
    fn load(&self, process: usize, key: Key) -> impl Load {
        let source = self.source.clone();
        // Made by the call, which becomes its flight's leader if it starts one: the flight's
        // attempts carry the key's epochs from before it began.
        let flight = self.source.oracle.flight(self.index, key);
        move |key: &Key| -> Pinned<Result<Held, String>> {
            let load = source.clone().load(process, *key, flight);
            Box::pin(async move { load.await.map(Some) })
        }
    }

    /// The load a call of this batch function makes in `process` for `keys`, each key's
    /// flight made now.
    fn load_many(&self, process: usize, keys: &[Key]) -> impl LoadMany {
        let source = self.source.clone();
        let flights: Arc<HashMap<Key, Flight>> = Arc::new(
            keys.iter()
                .map(|&key| (key, self.source.oracle.flight(self.index, key)))
                .collect(),
        );
        move |keys: &Vec<Key>| -> Pinned<Result<HashMap<Key, Val>, String>> {
            let oracle = &source.oracle;
            let flights = keys
                .iter()
                .map(|key| {
                    flights
                        .get(key)
                        .copied()
                        .unwrap_or_else(|| oracle.flight(source.function, *key))
                })
                .collect();
            Box::pin(source.clone().load_many(process, keys.clone(), flights))
        }
    }

    /// The load a single-key call of this batch function (through `batch_loader`) makes in
    /// `process` for `key`, made (the returned maker called) only if the call must start one;
    /// the call's flight is made now, at its beginning.
    ///
    /// With `batch_window`, the window's load is the one its first call made, called with the
    /// keys of every call the window holds: each key's attempts are tied to the flight of the
    /// call that sent that key to the window (its epochs, when it began), which the maker
    /// writes down in the function's [`Book`]. The load takes, for each key of another call,
    /// the first flight of that key written down after its own and not taken yet (a window
    /// holds the calls sent after the one that opened it, in their order), and keeps it for
    /// its retries.
    fn load_one(
        &self,
        process: usize,
        key: Key,
    ) -> impl FnOnce() -> Box<dyn LoadMany> + Send + use<> {
        let source = self.source.clone();
        let book = self.book.clone();
        let window = self.plan.batch.is_some_and(|batch| batch.window.is_some());
        let flight = self.source.oracle.flight(self.index, key);
        move || -> Box<dyn LoadMany> {
            let seq = book.lock().unwrap().write(process, key, flight, window);
            // Each key's flights in this load, by occurrence (a window may hold a key twice: a
            // call detached, and a later one).
            let bound: Mutex<HashMap<Key, Vec<Flight>>> =
                Mutex::new(HashMap::from([(key, vec![flight])]));
            Box::new(
                move |keys: &Vec<Key>| -> Pinned<Result<HashMap<Key, Val>, String>> {
                    let oracle = &source.oracle;
                    let mut bound = bound.lock().unwrap();
                    let mut book = book.lock().unwrap();
                    book.take(process, key, seq);
                    let mut seen: HashMap<Key, usize> = HashMap::new();
                    let flights = keys
                        .iter()
                        .map(|&k| {
                            let flights = bound.entry(k).or_default();
                            // A flight whose load is over is not tried again: a later call of
                            // the load for its key is the window's next flight of that key
                            // (seeds 143922967, 147459162: the window held the key twice).
                            let nth = seen.entry(k).or_insert_with(|| {
                                flights
                                    .iter()
                                    .position(|flight| !oracle.flight_over(flight))
                                    .unwrap_or(flights.len())
                            });
                            if *nth == flights.len() {
                                let flight = book
                                    .first_after(process, k, seq)
                                    .unwrap_or_else(|| oracle.flight(source.function, k));
                                flights.push(flight);
                            }
                            *nth += 1;
                            flights[*nth - 1]
                        })
                        .collect();
                    drop((book, bound));
                    Box::pin(source.clone().load_many(process, keys.clone(), flights))
                },
            )
        }
    }
}

type Pinned<T> = std::pin::Pin<Box<dyn Future<Output = T> + Send>>;

/// A single-key function's load.
trait Load: Fn(&Key) -> Pinned<Result<Held, String>> + Send + Sync + 'static {}
impl<F: Fn(&Key) -> Pinned<Result<Held, String>> + Send + Sync + 'static> Load for F {}

/// The flights that a batch function's single-key calls made when they had to start a load
/// (`batch_window`), per process and key, in the order made (see [`Function::load_one`]).
#[derive(Default)]
struct Book {
    next: u64,
    made: HashMap<(usize, Key), Vec<Made>>,
}

struct Made {
    seq: u64,
    flight: Flight,
    /// A window's load has taken it (or its own call's load ran).
    taken: bool,
}

impl Book {
    /// A call of `key` in `process` must start a load, whose flight is `flight`: its place in
    /// the order (written down only when a window may hold it).
    fn write(&mut self, process: usize, key: Key, flight: Flight, window: bool) -> u64 {
        self.next += 1;
        let seq = self.next;
        if window {
            self.made.entry((process, key)).or_default().push(Made {
                seq,
                flight,
                taken: false,
            });
        }
        seq
    }

    /// The load made at `seq` runs: no other window takes its call's flight.
    fn take(&mut self, process: usize, key: Key, seq: u64) {
        if let Some(made) = self
            .made
            .get_mut(&(process, key))
            .and_then(|made| made.iter_mut().find(|made| made.seq == seq))
        {
            made.taken = true;
        }
    }

    /// The first flight of `key` in `process` made after `seq` and not taken yet, taken now.
    fn first_after(&mut self, process: usize, key: Key, seq: u64) -> Option<Flight> {
        let made = self
            .made
            .get_mut(&(process, key))?
            .iter_mut()
            .find(|made| made.seq > seq && !made.taken)?;
        made.taken = true;
        Some(made.flight)
    }
}

/// A batch function's load: the map of the keys found.
trait LoadMany:
    Fn(&Vec<Key>) -> Pinned<Result<HashMap<Key, Val>, String>> + Send + Sync + 'static
{
}
impl<F> LoadMany for F where
    F: Fn(&Vec<Key>) -> Pinned<Result<HashMap<Key, Val>, String>> + Send + Sync + 'static
{
}

impl Cache {
    /// A single-key call (`Call::Get`; of a batch function, through `batch_loader`: its load
    /// calls the batch function with the key), or a companion's `refresh` (which loads whatever
    /// other processes hold, under the Redis lock with `lock = "redis"`) or `read_through`.
    async fn call(
        self,
        what: Call,
        function: &Function,
        process: usize,
        key: Key,
    ) -> Result<Held, stampede::Error> {
        let retry_if = function.retry_if();
        if let Some(batch) = function.plan.batch.filter(|_| what == Call::Get) {
            let make = function.load_one(process, key);
            return match self {
                Cache::Local(cache) => cache.get_one(key, make, retry_if, batch.window).await,
                Cache::Shared(cache) => cache.get_one(key, make, retry_if, batch.window).await,
            };
        }
        let load = function.load(process, key);
        match self {
            Cache::Local(cache) => cache.call(what, key, load, retry_if).await,
            Cache::Shared(cache) => cache.call(what, key, load, retry_if).await,
        }
    }

    /// A call of a batch function (`refresh`: its companion's `refresh`).
    async fn get_many(
        self,
        function: &Function,
        process: usize,
        keys: Vec<Key>,
        refresh: bool,
    ) -> Vec<(Key, Result<Held, stampede::Error>)> {
        let load = function.load_many(process, &keys);
        let retry_if = function.retry_if();
        match self {
            Cache::Local(cache) => cache.get_many(keys, load, retry_if, refresh).await,
            Cache::Shared(cache) => cache.get_many(keys, load, retry_if, refresh).await,
        }
    }

    async fn invalidate(self, key: Key) -> Result<bool, stampede::Error> {
        match self {
            Cache::Local(cache) => cache.invalidate(key).await,
            Cache::Shared(cache) => cache.invalidate(key).await,
        }
    }

    async fn clear(self) -> Result<(), stampede::Error> {
        match self {
            Cache::Local(cache) => cache.clear().await,
            Cache::Shared(cache) => cache.clear().await,
        }
    }

    async fn expire(self, key: Key) -> Result<bool, stampede::Error> {
        match self {
            Cache::Local(cache) => cache.expire(key).await,
            Cache::Shared(cache) => cache.expire(key).await,
        }
    }

    async fn prime(self, key: Key, value: Held) -> Result<(), stampede::Error> {
        match self {
            Cache::Local(cache) => cache.prime(key, value).await,
            Cache::Shared(cache) => cache.prime(key, value).await,
        }
    }

    fn peek(self, key: Key) -> Option<Held> {
        match self {
            Cache::Local(cache) => cache.peek(&key),
            Cache::Shared(cache) => cache.peek(&key),
        }
    }

    /// Whether this process's cache's breaker skips the source now (`Stats::breaker_open`).
    fn breaker_open(self) -> bool {
        match self {
            Cache::Local(cache) => cache.stats().breaker_open,
            Cache::Shared(cache) => cache.stats().breaker_open,
        }
    }

    /// The loads this process's cache refused so far (`max_loads`).
    fn refused(self) -> u64 {
        match self {
            Cache::Local(cache) => cache.stats().loads_refused,
            Cache::Shared(cache) => cache.stats().loads_refused,
        }
    }

    fn leftovers(self) -> stampede_runtime::sim::Leftovers {
        match self {
            Cache::Local(cache) => cache.leftovers(),
            Cache::Shared(cache) => cache.leftovers(),
        }
    }

    /// # Safety
    ///
    /// As [`SimCache::free`].
    unsafe fn free(self) {
        unsafe {
            match self {
                Cache::Local(cache) => cache.free(),
                Cache::Shared(cache) => cache.free(),
            }
        }
    }
}

/// A store (a server), with the processes it knows.
type Server = (Arc<Store<Key, Held>>, Vec<usize>);

/// A run's world: its functions (caches, stores, sources) and its oracle.
struct World {
    plan: Plan,
    functions: Vec<Function>,
    oracle: Arc<Oracle>,
}

impl World {
    fn build(plan: &Plan) -> World {
        let stall = plan
            .faults
            .iter()
            .filter_map(|(_, fault)| match fault {
                Fault::Stall { each, .. } => Some(*each),
                _ => None,
            })
            .max()
            .unwrap_or_default();
        let rules = plan
            .functions
            .iter()
            .map(|f| Function::rules(f, stall, plan.lease))
            .collect();
        let oracle = Oracle::new(rules, plan.bound);
        // A store (a server) per function with a shared backend, with its processes; a twin
        // shares its twin's, on another namespace.
        let mut servers: Vec<Option<Server>> = Vec::new();
        for (index, fplan) in plan.functions.iter().enumerate() {
            let server = match (fplan.config.backend, fplan.connection.twin_of) {
                (Backend::Memory, _) => None,
                (_, Some(twin)) => servers[twin as usize].clone(),
                _ => {
                    let store = Store::with(plan.lease, plan.bound);
                    // The functions on this server, by namespace.
                    let on: Vec<(Space, u8)> = plan
                        .functions
                        .iter()
                        .enumerate()
                        .filter(|(other, f)| {
                            *other == index || f.connection.twin_of == Some(index as u8)
                        })
                        .map(|(other, f)| (f.connection.space.clone(), other as u8))
                        .collect();
                    let of = move |space: &Space| {
                        on.iter()
                            .find(|(at, _)| at == space)
                            .map(|&(_, function)| function)
                            .expect("a namespace of the server's functions")
                    };
                    let all: Vec<u8> = plan
                        .functions
                        .iter()
                        .enumerate()
                        .filter(|(other, f)| {
                            *other == index || f.connection.twin_of == Some(index as u8)
                        })
                        .map(|(other, _)| other as u8)
                        .collect();
                    // A feed going down or up drops the process's memory and detaches its
                    // loads (every function's on the server: the feed is the process's link to
                    // it): the oracle notes it.
                    let oracle = oracle.clone();
                    *store.observer.lock().unwrap() = Some(Arc::new(move |event| match event {
                        Event::Feed { process, down } => {
                            let state = if down { "down" } else { "up" };
                            for &function in &all {
                                oracle.feed(function, process, down);
                                oracle.fault(
                                    format!("f{function}: the feed of p{process} is {state}"),
                                    true,
                                    Effect::Detaches,
                                    Some(function),
                                );
                            }
                        }
                        Event::Cleared { process, space } => {
                            let function = of(&space);
                            oracle.fault(
                                format!("f{function}: p{process} hears it cleared"),
                                true,
                                Effect::Detaches,
                                Some(function),
                            );
                        }
                        Event::Cleaned {
                            process,
                            space,
                            key,
                        } => {
                            let function = of(&space);
                            oracle.note(format!("f{function} k{key} dropped from the store by p{process}, changed while it was down"));
                        }
                        Event::Announced {
                            process,
                            space,
                            key,
                            expired,
                        } => {
                            let function = of(&space);
                            let what = if expired { "expired" } else { "invalidated" };
                            oracle.note(format!("f{function} k{key}: p{process} hears it {what}"));
                            oracle.detaching(function, key.parse().unwrap());
                        }
                    }));
                    let processes = (0..plan.processes).map(|_| store.process()).collect();
                    Some((store, processes))
                }
            };
            servers.push(server);
        }
        let functions = plan
            .functions
            .iter()
            .enumerate()
            .map(|(index, fplan)| {
                let server = servers[index].clone();
                let store = server.as_ref().map(|(store, _)| store.clone());
                let processes = server.map(|(_, processes)| processes);
                let tags = fplan.tagged.then_some(tags_of as fn(&Key) -> Vec<String>);
                let values = Values {
                    source_version: fplan
                        .versioned
                        .then_some(version_of as fn(&Held) -> Option<u64>),
                };
                let caches = (0..plan.processes)
                    .map(|p| match (&store, &processes) {
                        (Some(store), Some(processes)) => {
                            let mut tier = tier_of(store, processes[p]);
                            tier.space = fplan.connection.space.clone();
                            tier.connection =
                                fplan.connection.named.then(|| format!("sim-c{p}").into());
                            tier.lock_wait = fplan.lock_wait;
                            tier.busy_error = fplan.busy == Busy::Error;
                            tier.busy_compute = fplan.busy == Busy::Compute;
                            Cache::Shared(SimCache::shared(
                                fplan.config.clone(),
                                tier,
                                tags,
                                values,
                            ))
                        }
                        _ => Cache::Local(SimCache::new(fplan.config.clone(), Local, tags, values)),
                    })
                    .collect();
                let source = Arc::new(Source {
                    function: index as u8,
                    plan: fplan.clone(),
                    oracle: oracle.clone(),
                    rng: Mutex::new(SmallRng::seed_from_u64(
                        plan.seed ^ (index as u64 + 1) << 32,
                    )),
                    down: std::sync::atomic::AtomicBool::new(false),
                });
                Function {
                    index: index as u8,
                    plan: fplan.clone(),
                    caches,
                    store,
                    source,
                    book: Arc::default(),
                }
            })
            .collect();
        World {
            plan: plan.clone(),
            functions,
            oracle,
        }
    }

    /// Each store (server) once.
    fn stores(&self) -> impl Iterator<Item = &Arc<Store<Key, Held>>> {
        self.functions
            .iter()
            .filter(|f| f.plan.connection.twin_of.is_none())
            .filter_map(|f| f.store.as_ref())
    }

    /// Runs one operation, and tells the oracle what happened.
    async fn run(self: &Arc<Self>, op: Op) {
        let oracle = &self.oracle;
        if !matches!(op, Op::Sleep(_)) {
            oracle.note(format!("{op:?} begins"));
        }
        match op {
            Op::Sleep(pause) => tokio::time::sleep(pause).await,
            Op::Call(f, p, k) => self.call(Call::Get, f, p, k).await,
            Op::Refresh(f, p, k) => self.call(Call::Refresh, f, p, k).await,
            Op::ReadThrough(f, p, k) => self.call(Call::ReadThrough, f, p, k).await,
            Op::Peek(f, p, k) => {
                let cache = self.functions[f as usize].cache(p);
                let call = oracle.call(f, p, k, cache.breaker_open());
                let held = cache.peek(k);
                let seen = held.as_ref().map_or(Seen::Nothing, Seen::of);
                oracle.refusals(f, p, cache.refused());
                oracle.returned(&call, Ok(seen), "peek");
            }
            Op::Write(f, k) => {
                oracle.write(f, k);
            }
            Op::Configure(f, per_mille) => self.configure(f, per_mille),
            Op::WriteInvalidate(f, p, k) => {
                let version = oracle.write(f, k);
                oracle.detaching(f, k);
                let done = self
                    .bounded(self.functions[f as usize].cache(p).invalidate(k))
                    .await;
                // An invalidation forgets the key again once the shared tier answered: a flight
                // begun meanwhile is detached too.
                oracle.detaching(f, k);
                if let Some(Ok(_found)) = done {
                    oracle.invalidated(f, k, version, Reach::From(p));
                }
            }
            Op::WriteExpire(f, p, k) => {
                oracle.write(f, k);
                let began = oracle.now();
                oracle.detaching(f, k);
                let done = self
                    .bounded(self.functions[f as usize].cache(p).expire(k))
                    .await;
                oracle.detaching(f, k);
                if let Some(Ok(_found)) = done {
                    oracle.expired(f, k, Some(p), began);
                }
            }
            Op::WritePrime(f, p, k) => {
                let version = oracle.write(f, k);
                let began = oracle.prime_begins();
                oracle.detaching(f, k);
                let value = Val {
                    function: f,
                    key: k,
                    version,
                    read_at: oracle.now(),
                };
                oracle.prime_running(f, k, version);
                // A batch function's `prime(id, value)` stores `Some(value)` too.
                let done = self
                    .bounded(self.functions[f as usize].cache(p).prime(k, Some(value)))
                    .await;
                oracle.prime_over(f, k, version);
                // A prime, like an invalidation, detaches the key's flights again once the tier
                // answered: one begun meanwhile may have read the value it replaces.
                oracle.detaching(f, k);
                if let Some(Ok(())) = done {
                    oracle.primed(f, k, version, p, began);
                }
            }
            Op::WriteInvalidateTag(f, k) => self.invalidate_tag(f, k, false),
            Op::WriteExpireTag(f, k) => self.invalidate_tag(f, k, true),
            Op::WriteClear(f, p) => {
                let function = &self.functions[f as usize];
                let written: Vec<(Key, u64)> = (0..function.keys(&self.plan))
                    .map(|k| (k, oracle.write(f, k)))
                    .collect();
                for &(k, _) in &written {
                    oracle.detaching(f, k);
                }
                let done = self.bounded(function.cache(p).clear()).await;
                for &(k, _) in &written {
                    oracle.detaching(f, k);
                }
                if let Some(Ok(())) = done {
                    for (k, version) in written {
                        oracle.invalidated(f, k, version, Reach::From(p));
                    }
                }
            }
            Op::Dropped(f, p, k, after) => {
                let world = self.clone();
                let call = tokio::spawn(async move {
                    let function = &world.functions[f as usize];
                    // Told, not checked: its caller is gone before or after it answers.
                    let open = function.cache(p).breaker_open();
                    world.oracle.unwatched_call(f, p, k, open);
                    let _ = function.cache(p).call(Call::Get, function, p, k).await;
                });
                tokio::time::sleep(after).await;
                call.abort();
            }
            Op::Burst(f, p, keys) => {
                let function = &self.functions[f as usize];
                let calls: Vec<_> = keys
                    .keys(function.keys(&self.plan))
                    .into_iter()
                    .map(|k| {
                        let world = self.clone();
                        tokio::spawn(async move { world.call(Call::Get, f, p, k).await })
                    })
                    .collect();
                for call in calls {
                    if call.await.is_err() {
                        oracle.violation("a call of a burst panicked".into());
                    }
                }
            }
            Op::Batch(f, p, keys, how) => {
                let function = &self.functions[f as usize];
                let keys = keys.keys(function.keys(&self.plan));
                // Each key once, in the order first given (as the call answers them).
                let mut seen = std::collections::HashSet::new();
                let unique: Vec<Key> = keys.iter().copied().filter(|k| seen.insert(*k)).collect();
                let what = match how {
                    BatchCall::Get => "batch call",
                    BatchCall::Refresh => "batch refresh",
                    BatchCall::Dropped(after) => {
                        let world = self.clone();
                        let call = tokio::spawn(async move {
                            let function = &world.functions[f as usize];
                            // Told, not checked: its caller is gone before or after it answers.
                            let open = function.cache(p).breaker_open();
                            for &k in &unique {
                                world.oracle.unwatched_call(f, p, k, open);
                            }
                            let _ = function.cache(p).get_many(function, p, keys, false).await;
                        });
                        tokio::time::sleep(after).await;
                        call.abort();
                        return;
                    }
                };
                let several = unique.len() > 1;
                let open = self.functions[f as usize].cache(p).breaker_open();
                let calls: Vec<_> = unique
                    .iter()
                    .map(|&k| oracle.call(f, p, k, open))
                    .map(|call| if several { call.among_others() } else { call })
                    .collect();
                let refresh = matches!(how, BatchCall::Refresh);
                let outcome = self
                    .bounded(function.cache(p).get_many(function, p, keys, refresh))
                    .await;
                let Some(answers) = outcome else {
                    return;
                };
                let answered: Vec<Key> = answers.iter().map(|(k, _)| *k).collect();
                if answered != unique {
                    oracle.violation(format!(
                        "a {what} of p{p} f{f} asked for {unique:?} and was answered for {answered:?}"
                    ));
                    return;
                }
                oracle.refusals(f, p, function.cache(p).refused());
                for (call, (_, answer)) in calls.iter().zip(&answers) {
                    oracle.returned(call, answer.as_ref().map(Seen::of), what);
                }
            }
        }
    }

    /// A single-key call (`Call::Get`), or a companion's `refresh` or `read_through`, checked.
    async fn call(&self, what: Call, f: u8, p: usize, k: Key) {
        let function = &self.functions[f as usize];
        let call = self.oracle.call(f, p, k, function.cache(p).breaker_open());
        let outcome = self
            .bounded(function.cache(p).call(what, function, p, k))
            .await;
        let name = match what {
            Call::Get => "call",
            Call::Refresh => "refresh",
            Call::ReadThrough => "read_through",
        };
        if let Some(outcome) = outcome {
            self.oracle.refusals(f, p, function.cache(p).refused());
            self.oracle
                .returned(&call, outcome.as_ref().map(Seen::of), name);
        }
    }

    /// Writes every key that has the tag of `k`'s parity, then invalidates the tag as
    /// `stampede::invalidate_tag` does: marked here, dropped from the stores, marked again.
    /// Shortens the options of `f`'s name (its twin's too) to `per_mille` of the shortest the
    /// plan gives them, within what the attribute allows (`ttl` above `refresh_after`, at least
    /// `memory_ttl`): the runtime must accept it. `jitter`, `retries` and `backoff` are scaled
    /// down the same way; where every cache of the name has them on, `refresh_after`,
    /// `memory_ttl`, `soft_timeout`, `xfetch`'s beta, `batch_max`, `fail_safe` and its throttle
    /// too.
    fn configure(&self, f: u8, per_mille: u16) {
        let name = &self.functions[f as usize].plan.config.name;
        let twins: Vec<&Function> = (self.functions.iter())
            .filter(|function| &function.plan.config.name == name)
            .collect();
        let named: Vec<&Config> = twins.iter().map(|function| &function.plan.config).collect();
        let scale = |of: fn(&Config) -> Duration| {
            let least = named
                .iter()
                .map(|config| of(config))
                .min()
                .unwrap_or_default();
            least.mul_f64(f64::from(per_mille) / 1000.0)
        };
        let floor = (named.iter())
            .flat_map(|config| {
                let after = config.refresh_after.map(|at| at + Duration::from_millis(1));
                after.into_iter().chain(config.memory_ttl)
            })
            .max()
            .unwrap_or(Duration::from_millis(1));
        // Never above any twin's own `ttl`: where the floor is, `ttl` stays the plan's.
        let shortest = named
            .iter()
            .map(|config| config.ttl)
            .min()
            .unwrap_or_default();
        let ttl = scale(|config| config.ttl).max(floor);
        let ttl = (ttl <= shortest).then_some(ttl);
        let timeout = scale(|config| config.timeout).max(Duration::from_millis(1));
        let stale = scale(|config| config.stale);
        let mut configure = stampede_runtime::configure(name)
            .stale(stale)
            .timeout(timeout);
        if let Some(ttl) = ttl {
            configure = configure.ttl(ttl);
        }
        // Each only where every cache of the name has it on; never longer than the plan's, so
        // `refresh_after` stays below and `memory_ttl` at most the `ttl` above.
        let all_on = |of: fn(&Config) -> Option<Duration>| {
            let each: Option<Vec<Duration>> = named.iter().map(|config| of(config)).collect();
            let least = each?.into_iter().min()?;
            Some(
                least
                    .mul_f64(f64::from(per_mille) / 1000.0)
                    .max(Duration::from_millis(1)),
            )
        };
        let soft = all_on(|config| config.soft_timeout);
        if let Some(after) = all_on(|config| config.refresh_after) {
            configure = configure.refresh_after(after);
        }
        if let Some(memory) = all_on(|config| config.memory_ttl) {
            configure = configure.memory_ttl(memory);
        }
        // The oracle's fail-safe grants read the plan's windows as the longest allowed.
        if let Some(keep) = all_on(|config| config.fail_safe) {
            configure = configure
                .fail_safe(keep)
                .fail_safe_throttle(scale(|config| config.fail_safe_throttle));
        }
        if let Some(soft) = soft {
            configure = configure.soft_timeout(soft);
        }
        if named.iter().all(|config| config.xfetch.is_some()) {
            configure = configure.xfetch(f64::from(per_mille) / 1000.0);
        }
        // What bounds a load or a fill, never above the plan's: the oracle's rules read the
        // plan's as bounds (a fill's fresh time cut by at most `jitter`; a load's retries and
        // backoffs in its slack), which fewer and shorter keep. A count is scaled as `all_on`
        // scales a duration: `None` where a cache of the name has none.
        let fewer = |of: fn(&Config) -> Option<usize>| {
            let each: Option<Vec<usize>> = named.iter().map(|config| of(config)).collect();
            Some(each?.into_iter().min()? * usize::from(per_mille) / 1000)
        };
        let jitter = fewer(|config| Some(config.jitter.into())).unwrap_or(0);
        let retries = fewer(|config| Some(config.retries as usize)).unwrap_or(0);
        configure = configure
            .jitter(jitter as u8)
            .retries(retries as u32)
            .backoff(scale(|config| config.backoff).max(Duration::from_millis(1)));
        if let Some(most) = fewer(|config| config.batch_max) {
            configure = configure.batch_max(most.max(1));
        }
        match configure.apply() {
            Ok(()) => {
                for twin in &twins {
                    let ttl = ttl.unwrap_or(twin.plan.config.ttl);
                    self.oracle.configured(twin.index, ttl, stale, soft);
                }
            }
            Err(error) => self.oracle.violation(format!(
                "configure of f{f} (ttl {ttl:?}, stale {stale:?}, timeout {timeout:?}, soft_timeout {soft:?}) refused: {error}"
            )),
        }
    }

    /// A tag's invalidation, or with `expire` its expiry (`expire_tag`), after a write of
    /// every key it tags.
    fn invalidate_tag(&self, f: u8, k: Key, expire: bool) {
        let oracle = &self.oracle;
        let began = oracle.now();
        let tag = tags_of(&k).remove(0);
        let written: Vec<(u8, Key, u64)> = self
            .functions
            .iter()
            .filter(|function| function.plan.tagged)
            .flat_map(|function| {
                (0..function.keys(&self.plan))
                    .filter(|key| tags_of(key).contains(&tag))
                    .map(|key| (function.index, key, oracle.write(function.index, key)))
                    .collect::<Vec<_>>()
            })
            .collect();
        for &(function, key, _) in &written {
            oracle.detaching(function, key);
        }
        let here = |tag: &str| match expire {
            true => stampede_runtime::sim::expire_tag(tag),
            false => stampede_runtime::sim::forget_tag(tag),
        };
        here(&tag);
        for store in self.stores() {
            match expire {
                true => store.expire_tag(&tag),
                false => store.invalidate_tag(&tag),
            }
        }
        here(&tag);
        for &(function, key, _) in &written {
            oracle.detaching(function, key);
        }
        for (function, key, version) in written {
            match expire {
                true => oracle.expired(function, key, None, began),
                false => oracle.invalidated(function, key, version, Reach::Everywhere),
            }
        }
        let _ = f;
    }

    /// `future`'s output, or `None` (a violation: it hung) past [`HANG`].
    async fn bounded<T>(&self, future: impl Future<Output = T>) -> Option<T> {
        match tokio::time::timeout(HANG, future).await {
            Ok(output) => Some(output),
            Err(_) => {
                self.oracle
                    .violation(format!("an operation hung for {HANG:?}"));
                None
            }
        }
    }

    /// Injects one fault at its time.
    async fn inject(self: Arc<Self>, at: Duration, fault: Fault) {
        tokio::time::sleep(at).await;
        // The functions it reaches, and how: the store down or leases lapsed let loads of one
        // key run in several processes (the functions of the shared tier). The other faults of
        // the store (stalls, lost wake-ups, a cut or delayed feed) grant nothing by themselves:
        // what they cause (a feed noticed down or back up, an announcement heard) is told by
        // the store as it happens. A source that fails grants nothing either: its failed loads
        // are told load by load.
        let reached: Vec<u8> = match fault {
            Fault::Outage { .. } | Fault::LapseLeases(_) => self
                .functions
                .iter()
                .filter(|function| function.store.is_some())
                .map(|function| function.index)
                .collect(),
            _ => Vec::new(),
        };
        let tell = |what: String, began: bool| {
            self.oracle.note(what);
            for &function in &reached {
                self.oracle.fault(
                    format!("  reaches f{function}"),
                    began,
                    Effect::Overlapping,
                    Some(function),
                );
            }
        };
        tell(format!("fault: {fault:?}"), true);
        // Whose link to the store it cuts or delays (a process may miss an announcement).
        let deaf = match fault {
            Fault::Outage { .. } => Some(None),
            Fault::CutFeed { process, .. } | Fault::DelayFeed { process, .. } => {
                Some(Some(process))
            }
            _ => None,
        };
        if let Some(process) = deaf {
            self.oracle.deaf(process, self.plan.processes, true);
        }
        let stores: Vec<_> = self.stores().cloned().collect();
        let logged = |lasting: Duration| covered_by_the_log(lasting);
        let (lasting, undo): (Duration, Box<dyn FnOnce() + Send>) = match fault {
            Fault::Outage { noticed, lasting } => {
                for store in &stores {
                    store.outage(noticed, lasting, logged(lasting));
                }
                (lasting, Box::new(|| {}))
            }
            Fault::CutFeed {
                process,
                noticed,
                lasting,
            } => {
                for store in &stores {
                    store.cut_feed(process, noticed, lasting, logged(lasting));
                }
                (lasting, Box::new(|| {}))
            }
            Fault::DelayFeed {
                process,
                delay,
                lasting,
            } => {
                for store in &stores {
                    store.delay_feed(process, delay);
                }
                let stores = stores.clone();
                (
                    lasting,
                    Box::new(move || {
                        stores
                            .iter()
                            .for_each(|s| s.delay_feed(process, Duration::ZERO))
                    }),
                )
            }
            Fault::LoseWakeups(lasting) => {
                flag(&stores, |s| &s.lose_wakeups, true);
                let stores = stores.clone();
                (
                    lasting,
                    Box::new(move || flag(&stores, |s| &s.lose_wakeups, false)),
                )
            }
            Fault::LapseLeases(lasting) => {
                flag(&stores, |s| &s.lapse, true);
                let stores = stores.clone();
                (
                    lasting,
                    Box::new(move || flag(&stores, |s| &s.lapse, false)),
                )
            }
            Fault::Stall { each, lasting } => {
                stores.iter().for_each(|s| *s.stall.lock().unwrap() = each);
                let stores = stores.clone();
                (
                    lasting,
                    Box::new(move || {
                        stores
                            .iter()
                            .for_each(|s| *s.stall.lock().unwrap() = Duration::ZERO)
                    }),
                )
            }
            Fault::SourceDown { function, lasting } => {
                let source = self.functions[function as usize].source.clone();
                source.down.store(true, std::sync::atomic::Ordering::SeqCst);
                (
                    lasting,
                    Box::new(move || {
                        source
                            .down
                            .store(false, std::sync::atomic::Ordering::SeqCst)
                    }),
                )
            }
        };
        tokio::time::sleep(lasting).await;
        undo();
        if let Some(process) = deaf {
            self.oracle.deaf(process, self.plan.processes, false);
        }
        tell(format!("fault over: {fault:?}"), false);
    }

    /// What the caches hold that must be gone now that nothing runs.
    fn check_leftovers(&self, when: &str) {
        for function in &self.functions {
            for (process, cache) in function.caches.iter().enumerate() {
                let left = cache.leftovers();
                if left != Default::default() {
                    self.oracle.violation(format!(
                        "{when}: f{} in p{process} left {left:?}",
                        function.index
                    ));
                }
            }
        }
    }
}

fn flag(
    stores: &[Arc<Store<Key, Held>>],
    which: fn(&Store<Key, Held>) -> &std::sync::atomic::AtomicBool,
    on: bool,
) {
    for store in stores {
        which(store).store(on, std::sync::atomic::Ordering::SeqCst);
    }
}

// ---- a run -------------------------------------------------------------------------------------

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

/// Runs a plan: its first runtime until the clients have done `restart_after` operations each
/// (then dropped, tasks and all), the rest on a second one; returns the oracle's violations
/// and trace.
fn run(plan: &Plan) -> (Vec<String>, Arc<Oracle>) {
    // One run at a time: the refresh budget and the tag marks are the process's.
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _alone = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    RUN.with(|run| run.set(plan.seed));
    stampede_runtime::sim::seed(Some(plan.seed));
    // Options set at run time are the process's, by name: a replay of the seed starts anew.
    forget_configured(plan);
    let first = runtime();
    let world = first.block_on(async { Arc::new(World::build(plan)) });
    let split = plan.restart_after;
    let began = first.block_on(async { tokio::time::Instant::now() });
    let ended = first.block_on(epoch(&world, 0, split, plan.faults.clone()));
    drop(first); // the tasks it ran (flights, refreshes, fault timers) are dropped with it
    world.check_leftovers("after the first runtime was dropped");
    let run_time = world.oracle.now_at(ended);
    let second = runtime();
    second.block_on(async {
        // The new runtime's clock starts at the real time; it is moved on to an hour after the
        // first ended (a process restarted after a while, so that no deadline of the first
        // runtime is near), by whole milliseconds: the timer wheel of a paused clock advances it
        // by whole ticks from its start, so a run's times after the restart are the same
        // whatever the real time the runtime was made at.
        let now = tokio::time::Instant::now();
        let gap = (ended + RESTART_GAP).saturating_duration_since(now);
        tokio::time::advance(Duration::from_millis(gap.as_millis() as u64 + 1)).await;
        world.oracle.new_clock(run_time, RESTART_GAP);
        world.oracle.restarted();
        for store in world.stores() {
            store.restart();
        }
        // The faults the first runtime did not reach, at their times.
        let elapsed = ended - began;
        let later = plan
            .faults
            .iter()
            .filter(|(at, _)| *at > elapsed)
            .map(|&(at, fault)| (at - elapsed, fault))
            .collect();
        epoch(&world, split, usize::MAX, later).await;
        // Quiet: every background refresh and timer ends.
        tokio::time::sleep(Duration::from_secs(120)).await;
        world.check_leftovers("at the end");
        if stampede_runtime::sim::refresh_turns_taken() != 0 {
            world
                .oracle
                .violation("a turn of the refresh budget was left taken".into());
        }
    });
    drop(second);
    stampede_runtime::sim::seed(None);
    let violations = world.oracle.violations();
    let oracle = world.oracle.clone();
    // SAFETY: both runtimes are gone with every task that borrowed the caches, the stores that
    // listed them are dropped first, and no copy of the caches is used again.
    let World { functions, .. } = Arc::into_inner(world).expect("no task holds the world");
    let caches: Vec<Cache> = functions.iter().flat_map(|f| f.caches.clone()).collect();
    drop(functions);
    for cache in caches {
        unsafe { cache.free() };
    }
    // Nor do the options this run set outlive it: the names of every seed would pile up.
    forget_configured(plan);
    (violations, oracle)
}

/// Forgets the options set at run time for the names of `plan`'s functions.
fn forget_configured(plan: &Plan) {
    for function in &plan.functions {
        stampede_runtime::sim::forget_configured(&function.config.name);
    }
}

/// The clients' operations `from..until`, with `faults` at their times from now; returns when
/// the clients are done, at the clock's time then (the faults may go on).
async fn epoch(
    world: &Arc<World>,
    from: usize,
    until: usize,
    faults: Vec<(Duration, Fault)>,
) -> tokio::time::Instant {
    for (at, fault) in faults {
        tokio::spawn(world.clone().inject(at, fault));
    }
    let clients: Vec<_> = world
        .plan
        .clients
        .iter()
        .map(|ops| {
            let world = world.clone();
            let ops: Vec<Op> = ops
                .iter()
                .copied()
                .skip(from * 2)
                .take(until.saturating_sub(from).saturating_mul(2))
                .collect();
            tokio::spawn(async move {
                for op in ops {
                    world.run(op).await;
                }
            })
        })
        .collect();
    for client in clients {
        if client.await.is_err() {
            world.oracle.violation("a client panicked".into());
        }
    }
    tokio::time::Instant::now()
}

/// The smallest number of operations per client with which `seed` still fails, and its run.
fn shrink(seed: u64) -> (Plan, Vec<String>, Arc<Oracle>) {
    let full = Plan::of(seed, usize::MAX);
    let (violations, oracle) = run(&full);
    let (mut best, mut best_run) = (full, (violations, oracle));
    let (mut low, mut high) = (
        1usize,
        best.clients.iter().map(|c| c.len() / 2).max().unwrap_or(1),
    );
    while low < high {
        let mid = (low + high) / 2;
        let plan = Plan::of(seed, mid);
        let (violations, oracle) = run(&plan);
        if violations.is_empty() {
            low = mid + 1;
        } else {
            high = mid;
            best = plan;
            best_run = (violations, oracle);
        }
    }
    (best, best_run.0, best_run.1)
}

fn report(seed: u64) -> String {
    let (plan, violations, oracle) = shrink(seed);
    let ops = plan.clients.iter().map(|c| c.len() / 2).max().unwrap_or(0);
    let mut text = format!(
        "seed {seed} violates the oracle ({} operations after shrinking):\n",
        plan.ops()
    );
    for violation in violations.iter().take(5) {
        text.push_str(&format!("  - {violation}\n"));
    }
    text.push_str("the run's last steps:\n");
    let lines = env("STAMPEDE_SIM_TRACE").map_or(40, |lines| lines as usize);
    for line in oracle.trace(lines) {
        text.push_str(&format!("  {line}\n"));
    }
    text.push_str(&format!(
        "replay: STAMPEDE_SIM_SEED={seed} STAMPEDE_SIM_OPS={ops} cargo test --test simulation -- --nocapture\n"
    ));
    text
}

fn quiet_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let simulated = info
                .payload()
                .downcast_ref::<String>()
                .is_some_and(|message| message.starts_with("simulated panic"));
            if !simulated {
                default(info);
            }
        }));
    });
}

fn env(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.trim().parse().ok()
}

#[test]
fn the_runtime_keeps_the_oracles_rules_on_every_seed() {
    quiet_panics();
    if let Some(seed) = env("STAMPEDE_SIM_SEED") {
        let ops = env("STAMPEDE_SIM_OPS").map_or(usize::MAX, |ops| ops as usize);
        let plan = Plan::of(seed, ops);
        println!("{plan:#?}");
        let (violations, oracle) = run(&plan);
        for line in oracle.whole_trace() {
            println!("{line}");
        }
        assert!(violations.is_empty(), "{}", report(seed));
        return;
    }
    let seeds = env("STAMPEDE_SIM_SEEDS").unwrap_or(CI_SEEDS);
    let first = env("STAMPEDE_SIM_FIRST").unwrap_or(FIRST_SEED);
    let mut failed = BTreeSet::new();
    for seed in (first..first + seeds).chain(FOUND.iter().copied()) {
        let outcome =
            std::panic::catch_unwind(AssertUnwindSafe(|| run(&Plan::of(seed, usize::MAX)).0));
        match outcome {
            Ok(violations) if violations.is_empty() => {}
            _ => {
                failed.insert(seed);
                if failed.len() >= 3 {
                    break;
                }
            }
        }
    }
    let reports: Vec<String> = failed.iter().map(|&seed| report(seed)).collect();
    assert!(
        failed.is_empty(),
        "{} seeds failed: {failed:?}\n{}",
        failed.len(),
        reports.join("\n")
    );
    println!("{seeds} seeds from {first}: no violation");
}

#[test]
fn a_seed_replays_the_same_run() {
    quiet_panics();
    // Seeds of their own: no other run of this binary uses their names.
    for seed in u64::MAX - 20..u64::MAX {
        let plan = Plan::of(seed, usize::MAX);
        let (_, first) = run(&plan);
        let (_, second) = run(&plan);
        let (first, second) = (first.whole_trace(), second.whole_trace());
        if let Some(at) = first.iter().zip(&second).position(|(a, b)| a != b) {
            panic!(
                "seed {seed} ran two ways; from line {at}:\n{}\n---\n{}",
                first[at..(at + 5).min(first.len())].join("\n"),
                second[at..(at + 5).min(second.len())].join("\n")
            );
        }
        assert_eq!(first.len(), second.len(), "seed {seed}");
        assert!(first.len() > 20, "the run did something");
    }
}

/// The backquoted option names of the first column of the options table, which moved from the
/// README to the guide's options page (`src/guide/options.md`, its `# Options` section).
fn readme_options() -> Vec<String> {
    let readme = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/src/guide/options.md"));
    let table = readme
        .split("\n# Options\n")
        .nth(1)
        .expect("the guide's options page has an `# Options` section");
    table
        .lines()
        .skip_while(|line| !line.starts_with('|'))
        .take_while(|line| line.starts_with('|'))
        .skip(2) // the header and its rule
        .flat_map(|row| {
            let first = row.split('|').nth(1).unwrap_or_default();
            first
                .split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// What a plan drew for `option` (its `Debug`), for the README option `option`.
fn drawn(plan: &FunctionPlan, option: &str) -> String {
    let config = &plan.config;
    match option {
        "ttl" => format!("{:?}", config.ttl),
        "jitter" => format!("{:?}", config.jitter),
        "stale" => format!("{:?}", config.stale),
        "timeout" => format!("{:?}", config.timeout),
        "retries" => format!("{:?}", config.retries),
        "backoff" => format!("{:?}", config.backoff),
        "lock" => format!("{:?}", config.lock),
        "backend" => format!("{:?}", config.backend),
        "busy" => format!("{:?}", plan.busy),
        "refresh_after" => format!("{:?}", config.refresh_after),
        "xfetch" => format!("{:?}", config.xfetch),
        "fail_safe" => format!("{:?}", config.fail_safe),
        "fail_safe_throttle" => format!("{:?}", config.fail_safe_throttle),
        "soft_timeout" => format!("{:?}", config.soft_timeout),
        "memory_ttl" => format!("{:?}", config.memory_ttl),
        "retry_if" => format!("{:?}", plan.retry_if),
        "source_version" => format!("{:?}", plan.versioned),
        "ttl_from" => format!("{:?}", plan.ttl_from),
        "breaker" => format!("{:?}", config.breaker),
        "breaker_cooldown" => format!("{:?}", config.breaker_cooldown),
        "capacity" => format!("{:?}", config.capacity),
        "tags" => format!("{:?}", plan.tagged),
        "batch" => format!("{:?}", plan.batch.is_some()),
        "batch_max" => format!("{:?}", config.batch_max),
        "missing_ttl" => format!("{:?}", plan.batch.map(|batch| batch.missing)),
        // A batch function's single-key calls are those of a function with `batch_loader`.
        "batch_loader" => format!("{:?}", plan.batch.is_some()),
        "batch_window" => format!("{:?}", plan.batch.and_then(|batch| batch.window)),
        "redis" => format!("{:?}", plan.connection),
        "max_loads" => format!("{:?}", config.max_loads),
        "max_loads_full" => format!("{:?}", config.max_loads_full),
        other => panic!("`{other}` is in PLANNED but `drawn` does not read it"),
    }
}

#[test]
fn the_plans_cover_the_readmes_options() {
    let readme = readme_options();
    assert!(readme.len() > 20, "the table was read: {readme:?}");
    let listed: Vec<&str> = PLANNED
        .iter()
        .copied()
        .chain(NOT_SIMULATED.iter().map(|(name, _)| *name))
        .chain(UNSEEN_BY_A_RUN.iter().map(|(name, _)| *name))
        .collect();
    let unlisted: Vec<&String> = readme
        .iter()
        .filter(|name| !listed.contains(&name.as_str()))
        .collect();
    assert!(
        unlisted.is_empty(),
        "README options neither planned (PLANNED) nor listed with a reason (NOT_SIMULATED, \
         UNSEEN_BY_A_RUN): {unlisted:?}"
    );
    let gone: Vec<&&str> = listed
        .iter()
        .filter(|name| !readme.iter().any(|option| option == *name))
        .collect();
    assert!(
        gone.is_empty(),
        "listed, but not in the README's table: {gone:?}"
    );
    let mut seen = BTreeSet::new();
    let twice: Vec<&&str> = listed.iter().filter(|name| !seen.insert(**name)).collect();
    assert!(twice.is_empty(), "listed twice: {twice:?}");
    // Each planned option takes more than one value across plans.
    let plans: Vec<FunctionPlan> = (1..=2_000)
        .flat_map(|seed| Plan::of(seed, 0).functions)
        .collect();
    for option in PLANNED {
        let values: BTreeSet<String> = plans.iter().map(|plan| drawn(plan, option)).collect();
        assert!(
            values.len() > 1,
            "`{option}` is planned but always {values:?}"
        );
    }
}

/// Seed 94684 (200,000 seeds from 1, after `batch_window` was planned), shrunk to its core: a
/// call of a key waits in a window, an invalidation of the key detaches its flight, and another
/// call of the key joins the same window as the key's new leader; the window's load calls the
/// function with the key twice, and the second is answered from a map that the first already
/// took its value out of: absent, though the source has the key (and the absence is kept for
/// `missing_ttl`). README, Batch functions: "Per key, everything else holds"; an absent key is
/// one "left out of the map".
#[test]
fn a_window_that_holds_a_key_twice_answers_the_second_call_with_the_keys_value() {
    let runtime = runtime();
    let answer = runtime.block_on(async {
        let config = Config {
            name: "sim::window_twice".into(),
            ttl: Duration::from_secs(60),
            jitter: 0,
            stale: Duration::ZERO,
            timeout: Duration::from_secs(1),
            retries: 0,
            backoff: Duration::from_millis(1),
            lock: Lock::Local,
            backend: Backend::Memory,
            capacity: 1_000,
            refresh_after: None,
            xfetch: None,
            fail_safe: None,
            fail_safe_throttle: Duration::from_millis(10),
            soft_timeout: None,
            memory_ttl: None,
            compress: None,
            breaker: None,
            breaker_cooldown: Duration::from_millis(50),
            key: None,
            version: None,
            ttl_from: None,
            batch_max: None,
            max_loads: None,
            max_loads_full: LoadsFull::Wait,
        };
        let values = Values {
            source_version: None,
        };
        let cache: SimCache<Key, Held, Local> = SimCache::new(config, Local, None, values);
        // The source has every key it is asked for.
        let make = || {
            |keys: &Vec<Key>| {
                let found: HashMap<Key, Val> = keys
                    .iter()
                    .map(|&key| {
                        let value = Val {
                            function: 0,
                            key,
                            version: 1,
                            read_at: Duration::ZERO,
                        };
                        (key, value)
                    })
                    .collect();
                async move { Ok::<_, String>(found) }
            }
        };
        let window = Some(Duration::from_millis(10));
        let first = tokio::spawn(cache.get_one(7, make, None, window));
        tokio::time::sleep(Duration::from_millis(1)).await;
        cache
            .invalidate(7)
            .await
            .expect("a memory cache invalidates");
        let second = tokio::spawn(cache.get_one(7, make, None, window));
        let first = tokio::time::timeout(HANG, first).await;
        let second = tokio::time::timeout(HANG, second).await;
        let answer = |outcome: Result<Result<Result<Held, stampede::Error>, _>, _>| {
            outcome
                .expect("answered in time")
                .expect("the call ran")
                .map(|held| held.map(|value| value.key))
                .map_err(|error| error.to_string())
        };
        let answers = (answer(first), answer(second));
        // SAFETY: the calls are done, and nothing else holds the cache.
        unsafe { cache.free() };
        answers
    });
    assert_eq!(answer, (Ok(Some(7)), Ok(Some(7))));
}

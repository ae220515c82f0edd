//! The fill's ordering, Rust against Lua, on a real `redis-server`: whether a value Redis holds
//! may be newer than a load's is `order::may_be_newer` of the two source reads in both, a fill
//! lands only over a value that is older, and what a refused load's callers are handed is what
//! Redis keeps.

use std::time::Duration;

use proptest::prelude::*;
use stampede_test_support::redis_server::RedisServer;

use crate::config::Lifetime;
use crate::order;
use crate::redis::codec::envelope::{EXPIRED, Envelope};
use crate::redis::codec::keys::RedisKeys;
use crate::redis::protocol::ops::{Fill, ReadState};
use crate::redis::transport::config::RedisConfig;
use crate::redis::transport::endpoint::Endpoint;

/// One fill over a value another load of the key wrote: the fence moved since this load's read
/// (`moved_by` > 0: another holder's fill) or did not (a load without the lock wrote under the
/// fence this one read). Either way the fill lands exactly when the stored value is older (its
/// source read before this load's), and otherwise the stored value stays and is what the
/// load's callers are handed; a fill that lands over a moved fence moves it on, so that the
/// load that moved it cannot write its older value after it. The stored value's source was read `written_off - stored_read_off`
/// ms (clamped at 0) before it was written: a slow load that writes after this one read may
/// still hold an older value.
fn refused_fill(endpoint: &Endpoint, server: &RedisServer, case: (u64, u64, u64, u64, u64)) {
    let (written_off, stored_read_off, read_off, stored_fence_off, moved_by) = case;
    let now: u64 = {
        let (seconds, micros): (u64, u64) = server.command(&["TIME"]);
        seconds * 1_000 + micros / 1_000
    };
    let keys = RedisKeys::of_base("order:{k}");
    let read_fence = 1_000_u64;
    let (written_at, read_from) = (now - 10 + written_off, now - 10 + read_off);
    let stored_read_at = now - 10 + stored_read_off.min(written_off);
    let stored = format!(
        "S3 {} {} {written_at} {stored_read_at} {} 0 -\nstored",
        now + 60_000,
        now + 120_000,
        read_fence - 1 + stored_fence_off
    );
    let fence_now = (read_fence + moved_by).to_string();
    let _: () = server.command(&["SET", &keys.value, &stored]);
    let _: () = server.command(&["SET", &keys.fence, &fence_now]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let written = runtime
        .block_on(endpoint.fill(&Fill {
            keys: &keys,
            token: "",
            lifetime: Lifetime {
                fresh: Duration::from_secs(60),
                stale: Duration::ZERO,
                fail_safe: Duration::ZERO,
            },
            load: Duration::ZERO,
            fence: Some(read_fence),
            source_version: None,
            read_from,
            payload: b"loaded",
        }))
        .expect("redis-server answers");
    let stored_fence = read_fence - 1 + stored_fence_off;
    let newer = order::may_be_newer(stored_read_at, read_from);
    assert_eq!(
        written.written, !newer,
        "stored (fence {stored_fence}, written at {written_at}) from a read at {stored_read_at}, \
         this load's at {read_from}, the fence moved by {moved_by}: a fill lands exactly over an \
         older value"
    );
    let held: String = server.command(&["GET", &keys.value]);
    assert_eq!(held.ends_with("stored"), newer, "Redis holds {held}");
    assert_eq!(
        written.stored.is_some(),
        !written.written,
        "a refused load's callers are handed what Redis keeps"
    );
    if written.written && moved_by > 0 {
        let fence: u64 = server.command(&["GET", &keys.fence]);
        assert!(
            fence > read_fence + moved_by,
            "a load that read the moved fence is fenced off by the newer value"
        );
    }
}

#[test]
fn a_refused_fill_hands_its_callers_what_redis_keeps() {
    let server = RedisServer::start();
    let endpoint = Endpoint::new(
        "order_unit",
        RedisConfig::new(&server.url()).unwrap().prefix("order"),
    );
    // Ties and near ties of the three times, stored fences before, at and after the read's, and
    // a fence that moved or did not.
    proptest!(ProptestConfig::with_cases(200), |(
        written_off in 0_u64..6,
        stored_read_off in 0_u64..6,
        read_off in 0_u64..6,
        stored_fence_off in 0_u64..3,
        moved_by in 0_u64..3,
    )| {
        refused_fill(
            &endpoint,
            &server,
            (written_off, stored_read_off, read_off, stored_fence_off, moved_by),
        );
    });
}

/// One step of a key's history, as the flows and the companion make them.
#[derive(Clone, Debug)]
enum Step {
    /// `READ_OR_LOCK` of a load that replaces the value (read as missing), with a token (a
    /// holder, or a waiter when the lock is taken) or without.
    Read { locked: bool },
    /// `FILL` of the value of the `load`-th read (of those not filled yet), its source read
    /// `read_off` ms after the case's base.
    Fill { load: usize, read_off: u64 },
    /// A companion's `prime`: written whatever the fence.
    Prime,
    /// An invalidation.
    Invalidate,
    /// The value expires (its fence lives on, as the longest load that may still fill keeps
    /// it).
    Expire,
    /// The companion's `expire`: the value stays, no longer fresh; the fence moves as an
    /// invalidation's.
    StaleNow,
}

/// A load of the sequence: its token if it holds the lock, and the fence its read gave.
struct Load {
    token: Option<String>,
    fence: u64,
}

/// What the Rust side says Redis holds for the key: its fence, the lock's token, and the stored
/// value's source read and payload.
struct Model {
    fence: u64,
    lock: Option<String>,
    stored: Option<(u64, String)>,
    /// The value stored was expired (`expire`) since it was written: a fill orders over it as
    /// over nothing.
    expired: bool,
}

/// The payload and source read (`read_at`) of an envelope Redis holds.
fn stored(server: &RedisServer, keys: &RedisKeys) -> Option<(u64, String)> {
    let held: Option<Vec<u8>> = server.command(&["GET", &keys.value]);
    let held = String::from_utf8(held?).expect("an envelope is text here");
    let (header, payload) = held.split_once('\n').expect("a header line");
    let read_at = header
        .split(' ')
        .nth(4)
        .expect("S3's read_at")
        .parse()
        .unwrap();
    Some((read_at, payload.to_owned()))
}

/// Runs `steps` on a fresh key in Redis (the real scripts) and in the model, whose decisions are
/// the fake tier's: `order::fill_lands` for a fill, `order::moved_fence` for the fence a write
/// or an invalidation moves. After every step Redis and the model agree on the fence, the lock
/// and what is stored, and every refused fill is handed what Redis keeps. Source reads fall
/// around the steps' own moments (the base is the server's time when the case begins), so a
/// read may come before or after an invalidation or a prime.
fn sequence(endpoint: &Endpoint, server: &RedisServer, case: usize, steps: &[Step]) {
    let keys = RedisKeys::of_base(&format!("sequence:{{{case}}}"));
    let _: () = server.command(&["SET", &keys.fence, "1000"]);
    let mut run = Sequence {
        runtime: tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap(),
        endpoint,
        server,
        base: server_micros(server) / 1_000 - 2,
        keys,
        model: Model {
            fence: 1_000,
            lock: None,
            stored: None,
            expired: false,
        },
        loads: Vec::new(),
    };
    for (at, step) in steps.iter().enumerate() {
        match *step {
            Step::Read { locked } => run.read(at, locked),
            Step::Fill { load, read_off } => run.fill(at, load, read_off),
            Step::Prime => run.prime(at),
            Step::Invalidate => run.invalidate(at),
            Step::StaleNow => run.stale_now(at),
            Step::Expire => {
                let _: () = server.command(&["DEL", &run.keys.value]);
                run.model.stored = None;
            }
        }
        run.agree(at, step);
    }
}

/// One sequence's key in Redis and in the model, and the loads that read it and have not
/// filled yet.
struct Sequence<'a> {
    runtime: tokio::runtime::Runtime,
    endpoint: &'a Endpoint,
    server: &'a RedisServer,
    /// The server's time (ms) the reads' offsets count from.
    base: u64,
    keys: RedisKeys,
    model: Model,
    loads: Vec<Load>,
}

impl Sequence<'_> {
    /// A value fresh for a minute.
    const LIFETIME: Lifetime = Lifetime {
        fresh: Duration::from_secs(60),
        stale: Duration::ZERO,
        fail_safe: Duration::ZERO,
    };

    /// `READ_OR_LOCK`, with a token when `locked`: the lock is taken when free.
    fn read(&mut self, at: usize, locked: bool) {
        let token = locked.then(crate::redis::protocol::lock::token);
        let read = self
            .runtime
            .block_on(
                self.endpoint
                    .read_or_lock_many(&[&self.keys], token.as_deref(), &[true]),
            )
            .expect("redis-server answers")
            .pop()
            .unwrap();
        let model = &mut self.model;
        let holds = token.is_some() && model.lock.is_none();
        if holds {
            model.fence += 1;
            model.lock.clone_from(&token);
        }
        assert_eq!(read.fence, model.fence, "step {at}: the fence a read gives");
        assert_eq!(
            read.state == ReadState::Locked,
            holds,
            "step {at}: the lock"
        );
        self.loads.push(Load {
            token: token.filter(|_| holds),
            fence: read.fence,
        });
    }

    /// `FILL` of the load at `load` (modulo the loads waiting), its source read `read_off` ms
    /// after the base.
    fn fill(&mut self, at: usize, load: usize, read_off: u64) {
        if self.loads.is_empty() {
            return;
        }
        let load = self.loads.remove(load % self.loads.len());
        let read_from = self.base + read_off;
        let payload = format!("fill {at}");
        let written = self
            .runtime
            .block_on(self.endpoint.fill(&Fill {
                keys: &self.keys,
                token: load.token.as_deref().unwrap_or(""),
                lifetime: Self::LIFETIME,
                load: Duration::ZERO,
                fence: Some(load.fence),
                source_version: None,
                read_from,
                payload: payload.as_bytes(),
            }))
            .expect("redis-server answers");
        let model = &mut self.model;
        let landing = order::fill_lands(
            model.fence == load.fence,
            model.fence,
            model
                .stored
                .as_ref()
                .map(|(read_at, _)| (read_at * 1_000, model.expired)),
            read_from * 1_000,
        );
        let lands = landing != order::Landing::Refused;
        assert_eq!(
            written.written, lands,
            "step {at}: a fill read at {read_from} under fence {} (now {}) over {:?}",
            load.fence, model.fence, model.stored
        );
        if load.token.is_some() && model.lock == load.token {
            model.lock = None;
        }
        if lands {
            let read_at = read_from.min(written.now_ms);
            model.fence = order::moved_fence(model.fence, read_at * 1_000);
            model.stored = Some((read_at, payload));
            model.expired = landing == order::Landing::Expired;
            let held: Vec<u8> = self.server.command(&["GET", &self.keys.value]);
            let envelope = Envelope::parse(&held).expect("an envelope");
            assert_eq!(
                (
                    envelope.fence == EXPIRED,
                    envelope.fresh_until <= written.now_ms
                ),
                (model.expired, model.expired),
                "step {at}: landed expired exactly when over an expired value it is newer than"
            );
            return;
        }
        let handed = written.stored.map(|bytes| {
            let text = String::from_utf8(bytes).unwrap();
            text.split_once('\n').unwrap().1.to_owned()
        });
        let kept = model.stored.as_ref().map(|(_, payload)| payload.clone());
        assert_eq!(
            handed, kept,
            "step {at}: a refused fill is handed what Redis keeps"
        );
    }

    /// A prime: written whatever the fence, which it moves to its moment.
    fn prime(&mut self, at: usize) {
        let payload = format!("prime {at}");
        let written = self
            .runtime
            .block_on(self.endpoint.fill(&Fill {
                keys: &self.keys,
                token: "",
                lifetime: Self::LIFETIME,
                load: Duration::ZERO,
                fence: None,
                source_version: None,
                read_from: 0,
                payload: payload.as_bytes(),
            }))
            .expect("redis-server answers");
        assert!(
            written.written,
            "step {at}: a prime is written whatever the fence"
        );
        let moment = written.now_ms * 1_000..(written.now_ms + 1) * 1_000;
        self.model.fence = moved_at(self.server, &self.keys, self.model.fence, moment, at);
        self.model.stored = Some((written.now_ms, payload));
        self.model.expired = false;
    }

    /// An invalidation: the value deleted, the fence moved to its moment.
    fn invalidate(&mut self, at: usize) {
        let before = server_micros(self.server);
        self.runtime
            .block_on(self.endpoint.invalidate(&self.keys, None))
            .expect("redis-server answers");
        let moment = before..server_micros(self.server) + 1;
        self.model.fence = moved_at(self.server, &self.keys, self.model.fence, moment, at);
        self.model.stored = None;
    }

    /// The companion's `expire`: the value, its source read and its time to live stay; its
    /// fresh deadline is at most the moment, its stale one at most its stale window (none here)
    /// after; the fence moved as an invalidation's.
    fn stale_now(&mut self, at: usize) {
        let ttl_before: i64 = self.server.command(&["PTTL", &self.keys.value]);
        let before = server_micros(self.server);
        self.runtime
            .block_on(self.endpoint.invalidate_as(&self.keys, None, true))
            .expect("redis-server answers");
        let after = server_micros(self.server) / 1_000;
        let moment = before..server_micros(self.server) + 1;
        self.model.fence = moved_at(self.server, &self.keys, self.model.fence, moment, at);
        let held: Option<Vec<u8>> = self.server.command(&["GET", &self.keys.value]);
        let Some(held) = held else {
            return;
        };
        self.model.expired = true;
        let envelope = Envelope::parse(&held).expect("still an envelope");
        assert_eq!(envelope.fence, EXPIRED, "step {at}: marked expired");
        assert!(
            envelope.fresh_until <= after,
            "step {at}: fresh past the expiry"
        );
        assert!(
            envelope.stale_until <= after,
            "step {at}: stale past its window"
        );
        let ttl_after: i64 = self.server.command(&["PTTL", &self.keys.value]);
        assert!(
            ttl_after <= ttl_before && ttl_after > ttl_before - 1_000,
            "step {at}: the time to live {ttl_before} became {ttl_after}"
        );
    }

    /// Redis and the model agree on the fence, the lock and what is stored after `step`.
    fn agree(&self, at: usize, step: &Step) {
        let (server, keys, model) = (self.server, &self.keys, &self.model);
        let fence: u64 = server.command(&["GET", &keys.fence]);
        assert_eq!(fence, model.fence, "step {at} ({step:?}): the fence");
        let lock: Option<String> = server.command(&["GET", &keys.lock]);
        assert_eq!(lock, model.lock, "step {at} ({step:?}): the lock");
        assert_eq!(
            stored(server, keys),
            model.stored,
            "step {at} ({step:?}): what Redis holds"
        );
    }
}

/// The server's clock, in µs.
fn server_micros(server: &RedisServer) -> u64 {
    let (seconds, micros): (u64, u64) = server.command(&["TIME"]);
    seconds * 1_000_000 + micros
}

/// The fence a prime or an invalidation made at a moment within `moment` (µs of the server's
/// clock, which the model cannot know more exactly) moved on from `fence`: checked to be
/// `order::moved_fence` of it at a moment in that range, and returned.
fn moved_at(
    server: &RedisServer,
    keys: &RedisKeys,
    fence: u64,
    moment: std::ops::Range<u64>,
    at: usize,
) -> u64 {
    let moved: u64 = server.command(&["GET", &keys.fence]);
    let range = order::moved_fence(fence, moment.start)..order::moved_fence(fence, moment.end);
    assert!(
        range.contains(&moved) || moved == range.start,
        "step {at}: the fence {moved} is not {fence} moved on to a moment in {moment:?}"
    );
    moved
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => any::<bool>().prop_map(|locked| Step::Read { locked }),
        4 => (0_usize..4, 0_u64..8).prop_map(|(load, read_off)| Step::Fill { load, read_off }),
        1 => Just(Step::Prime),
        1 => Just(Step::Invalidate),
        1 => Just(Step::Expire),
        1 => Just(Step::StaleNow),
    ]
}

#[test]
fn sequences_of_reads_fills_primes_invalidations_and_expiries_decide_in_lua_as_in_rust() {
    let server = RedisServer::start();
    let endpoint = Endpoint::new(
        "sequence_unit",
        RedisConfig::new(&server.url()).unwrap().prefix("sequence"),
    );
    let case = std::sync::atomic::AtomicUsize::new(0);
    proptest!(ProptestConfig::with_cases(128), |(steps in prop::collection::vec(step(), 1..24))| {
        let case = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        sequence(&endpoint, &server, case, &steps);
    });
}

/// How many `GET`s the server has run, scripts' included.
fn gets_run(server: &RedisServer) -> u64 {
    let stats: String = server.command(&["INFO", "commandstats"]);
    stats
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_get:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |calls| calls.parse().unwrap())
}

#[test]
fn the_scripts_read_no_value_that_strlen_says_is_missing() {
    let server = RedisServer::start();
    let endpoint = Endpoint::new(
        "read_unit",
        RedisConfig::new(&server.url()).unwrap().prefix("read"),
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let keys = RedisKeys::of_base("read:{missing}");
    let before = gets_run(&server);
    let read = runtime
        .block_on(endpoint.read_fresh_many(&[&keys.value]))
        .unwrap();
    assert_eq!(read.len(), 1);
    assert_eq!(read[0].0, None);
    let read = runtime
        .block_on(endpoint.read_or_lock_many(&[&keys], None, &[false]))
        .unwrap();
    assert_eq!(read.len(), 1);
    // The lock-free read looked for a fence (a `GET` of its own); no value was read.
    assert_eq!(
        gets_run(&server) - before,
        1,
        "a missing value was read with GET"
    );
}

//! The timeline every contender runs through: its phases, and what the orchestrator does to the
//! database and Redis at which moment. Times are offsets from the first request of the
//! contender's load.
//!
//! Every contender caches for [`TTL`] with no jitter, so the hot keys, all filled in the first
//! few hundred milliseconds of the cold start, expire together one TTL later: that is the
//! synchronized expiry, the worst case (jitter would only spread it).

use std::time::Duration;

/// How long a value is fresh in every contender (the services' attributes say `"10s"`).
pub const TTL: Duration = Duration::from_secs(10);

/// The products whose queries are counted one by one: the most requested ids (the Zipf draw's
/// ranks 1 to `HOT_KEYS`, which are ids `1..=HOT_KEYS`).
pub const HOT_KEYS: usize = 100;

/// A phase of the run, over which every figure of the report is taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// All 4 instances start empty at the full request rate.
    Cold,
    /// Warm caches; the reference for the other phases' latency.
    Steady,
    /// The hot keys' TTL runs out, all at once.
    Expiry,
    /// Every query is 10x slower (a sleep inside the query, at the database).
    SlowDb,
    /// Redis is killed, and restarted empty some seconds later: from a second before the kill
    /// to a second after it.
    RedisRestart,
    /// The rest of the restart, from a second after the kill: Redis away, then back empty.
    RedisAway,
}

impl Phase {
    /// Its name in the report.
    pub fn label(self) -> &'static str {
        match self {
            Phase::Cold => "cold start",
            Phase::Steady => "steady",
            Phase::Expiry => "expiry",
            Phase::SlowDb => "slow db",
            Phase::RedisRestart => "redis restart",
            Phase::RedisAway => "redis restart, after 1 s",
        }
    }
}

/// Something the orchestrator does at a moment of the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Every query becomes this many times slower (1: back to normal).
    SlowDown(u32),
    /// Kill the redis-server (SIGKILL: no goodbye to the clients).
    KillRedis,
    /// Start it again, empty, on the same port.
    StartRedis,
}

/// The phases' bounds and the actions, for one contender.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Each phase with its start and end.
    pub phases: Vec<(Phase, Duration, Duration)>,
    /// Each action with its moment.
    pub actions: Vec<(Duration, Action)>,
}

impl Plan {
    /// The full plan: the database slow for 10 s, Redis down for 3 s; 37 s per contender.
    /// `quick`: the slow database for 5 s, Redis down for 2 s; 24 s per contender. Both keep
    /// the expiry at one TTL after the cold start.
    pub fn new(quick: bool) -> Plan {
        let s = Duration::from_secs_f64;
        let (cold, slow, slow_for, redis, kill_at, down_for, end) = if quick {
            (2.0, 13.0, 5.0, 18.0, 19.0, 2.0, 24.0)
        } else {
            (3.0, 14.0, 10.0, 27.0, 28.0, 3.0, 37.0)
        };
        // The expiry phase opens half a second before the hot keys' TTL runs out.
        let expiry = TTL.as_secs_f64() - 0.5;
        Plan {
            phases: vec![
                (Phase::Cold, s(0.0), s(cold)),
                (Phase::Steady, s(cold), s(expiry)),
                (Phase::Expiry, s(expiry), s(slow)),
                (Phase::SlowDb, s(slow), s(redis)),
                (Phase::RedisRestart, s(redis), s(kill_at + 1.0)),
                (Phase::RedisAway, s(kill_at + 1.0), s(end)),
            ],
            actions: vec![
                (s(slow), Action::SlowDown(10)),
                (s(slow + slow_for), Action::SlowDown(1)),
                (s(kill_at), Action::KillRedis),
                (s(kill_at + down_for), Action::StartRedis),
            ],
        }
    }

    /// When the load stops.
    pub fn end(&self) -> Duration {
        self.phases.last().map_or(Duration::ZERO, |phase| phase.2)
    }

    /// The phase `offset` falls in (the last one past the end).
    pub fn phase_at(&self, offset: Duration) -> usize {
        self.phases
            .iter()
            .position(|(_, _, end)| offset < *end)
            .unwrap_or(self.phases.len() - 1)
    }
}

/// `beta` must be above zero.
#[stampede::cached(ttl = "60s", xfetch = 0.0)]
async fn zero(id: u64) -> u64 {
    id
}

/// Two early refreshes: the fixed point or the draw, not both.
#[stampede::cached(ttl = "60s", refresh_after = "45s", xfetch = 1.0)]
async fn both(id: u64) -> u64 {
    id
}

/// An early refresh takes a lock.
#[stampede::cached(ttl = "60s", lock = "none", xfetch = 1.0)]
async fn unlocked(id: u64) -> u64 {
    id
}

/// The load time it scales by is kept in memory, which Redis-only caches have not.
#[stampede::cached(ttl = "60s", lock = "redis", backend = "redis", xfetch = 1.0)]
async fn without_memory(id: u64) -> u64 {
    id
}

/// A number, not a string.
#[stampede::cached(ttl = "60s", xfetch = "1.0")]
async fn quoted(id: u64) -> u64 {
    id
}

fn main() {}

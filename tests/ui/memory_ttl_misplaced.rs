// `memory_ttl` is the life of a value in memory in front of Redis: not for a cache that keeps
// its values in memory only, nor for one that keeps none there, and at most `ttl`.
#[stampede::cached(ttl = "60s", memory_ttl = "5s")]
async fn in_memory_only(id: u64) -> u64 {
    id
}

#[stampede::cached(ttl = "60s", lock = "redis", backend = "redis", memory_ttl = "5s")]
async fn in_redis_only(id: u64) -> u64 {
    id
}

#[stampede::cached(ttl = "60s", lock = "redis", memory_ttl = "2m")]
async fn longer_than_ttl(id: u64) -> u64 {
    id
}

#[stampede::cached(ttl = "60s", lock = "redis", memory_ttl = "5s")]
async fn in_front_of_redis(id: u64) -> u64 {
    id
}

fn main() {}

// `compress` shrinks what is written to Redis: not for a cache that keeps its values in memory
// only; its threshold is a number of bytes.
#[stampede::cached(ttl = "60s", compress = 16_384)]
async fn in_memory_only(id: u64) -> String {
    id.to_string()
}

#[stampede::cached(ttl = "60s", lock = "redis", compress = "16KiB")]
async fn a_size_in_words(id: u64) -> String {
    id.to_string()
}

#[stampede::cached(ttl = "60s", lock = "redis", compress = 16_384)]
async fn in_front_of_redis(id: u64) -> String {
    id.to_string()
}

fn main() {}

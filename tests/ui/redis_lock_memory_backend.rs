#[stampede::cached(ttl = "60s", lock = "redis", backend = "memory")]
async fn product(id: u64) -> u64 {
    id
}

fn main() {}

#[stampede::cached(ttl = "60s", lock = "none", stale = "10s")]
async fn product(id: u64) -> u64 {
    id
}

fn main() {}

#[stampede::cached(ttl = "60s", version = "2")]
async fn in_memory(id: u64) -> u64 {
    id
}

#[stampede::cached(ttl = "60s", lock = "redis", version = " ")]
async fn empty(id: u64) -> u64 {
    id
}

fn main() {}

#[stampede::cached(ttl = "60s", jitter = 10, jitter = 20)]
async fn product(id: u64) -> u64 {
    id
}

fn main() {}

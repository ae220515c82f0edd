#[stampede::cached(ttl = "60s", jitter = 150)]
async fn product(id: u64) -> u64 {
    id
}

fn main() {}

// `jitter` is a whole percent: `jitter = 20` for 20%.
#[stampede::cached(ttl = "60s", jitter = 0.2)]
async fn fraction(id: u64) -> u64 {
    id
}

#[stampede::cached(ttl = "60s", jitter = "20")]
async fn quoted(id: u64) -> u64 {
    id
}

#[stampede::cached(ttl = "60s", capacity = 1e4)]
async fn exponent(id: u64) -> u64 {
    id
}

fn main() {}

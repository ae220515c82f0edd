#[stampede::cached(ttl = "60s", redis = "sessions")]
async fn session(token: String) -> u64 {
    token.len() as u64
}

#[stampede::cached(ttl = "60s", lock = "local", busy = "compute")]
async fn product(id: u64) -> u64 {
    id
}

fn main() {}

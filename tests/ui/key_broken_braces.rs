#[stampede::cached(ttl = "60s", key = "user:{id")]
async fn user(id: u64) -> u64 {
    id
}

fn main() {}

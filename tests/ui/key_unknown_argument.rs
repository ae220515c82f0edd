#[stampede::cached(ttl = "60s", key = "user:{user_id}")]
async fn user(id: u64) -> u64 {
    id
}

fn main() {}

#[stampede::cached(ttl = "60 seconds please")]
async fn product(id: u64) -> u64 {
    id
}

fn main() {}

#[stampede::cached(ttl = "0s")]
async fn product(id: u64) -> u64 {
    id
}

fn main() {}

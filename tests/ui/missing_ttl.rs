#[stampede::cached(stale = "30s")]
async fn product(id: u64) -> u64 {
    id
}

fn main() {}

#[stampede::cached(tll = "60s")]
async fn product(id: u64) -> u64 {
    id
}

fn main() {}

#[stampede::cached(ttl = "60s")]
struct Product {
    id: u64,
}

fn main() {}

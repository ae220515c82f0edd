#[stampede::cached(ttl = "60s")]
fn product(id: u64) -> u64 {
    id
}

fn main() {
    // The function is emitted unchanged next to the error: no cascade here.
    let _ = product(1);
}

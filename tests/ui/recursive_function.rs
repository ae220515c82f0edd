#[stampede::cached(ttl = "60s")]
async fn countdown(n: u64) -> u64 {
    if n == 0 { 0 } else { countdown(n - 1).await + 1 }
}

fn main() {}

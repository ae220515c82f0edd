/// `Box<dyn Error>` is not `Send`: reported in the words a named error type gets.
#[stampede::cached(ttl = "60s")]
async fn user(id: u64) -> Result<u64, Box<dyn std::error::Error>> {
    Ok(id)
}

#[stampede::cached(ttl = "60s")]
async fn order(id: u64) -> Result<u64, Box<dyn std::error::Error + Send>> {
    Ok(id)
}

fn main() {
    // The function is emitted unchanged next to the error: no cascade here.
    let _ = user(1);
}

#[stampede::cached(ttl = "60s")]
async fn describe(item: impl std::fmt::Display) -> String {
    item.to_string()
}

fn main() {}

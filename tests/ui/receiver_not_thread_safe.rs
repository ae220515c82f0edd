use std::cell::Cell;

#[derive(Clone)]
struct Repo {
    calls: std::sync::Arc<Cell<u64>>,
}

impl Repo {
    #[stampede::cached(ttl = "60s")]
    async fn user(&self, id: u64) -> u64 {
        id
    }
}

fn main() {}

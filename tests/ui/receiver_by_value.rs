#[derive(Clone)]
struct Repo;

impl Repo {
    #[stampede::cached(ttl = "60s")]
    async fn by_mut(&mut self, id: u64) -> u64 {
        id
    }

    #[stampede::cached(ttl = "60s")]
    async fn by_value(self, id: u64) -> u64 {
        id
    }
}

fn main() {}

/// In an `#[async_trait]` impl the type checks land on the user's tokens too.
pub struct Report;

#[async_trait::async_trait]
trait Reports {
    async fn report(&self, id: u64) -> Report;
}

#[derive(Clone)]
struct Db;

#[async_trait::async_trait]
impl Reports for Db {
    #[stampede::cached(ttl = "60s")]
    async fn report(&self, id: u64) -> Report {
        let _ = id;
        Report
    }
}

fn main() {}

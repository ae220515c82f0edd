// A trait impl takes no items but the trait's, so a method there cannot have companions: with
// `#[async_trait]` the attribute says so; in a native trait impl rustc refuses the items. Such a
// method's key is dropped with `stampede::invalidate(name, key)`.
#[derive(Clone)]
struct Db;

#[async_trait::async_trait]
trait Users {
    async fn user(&self, id: u64) -> u64;
}

#[async_trait::async_trait]
impl Users for Db {
    #[stampede::cached(ttl = "60s", companion = true)]
    async fn user(&self, id: u64) -> u64 {
        id
    }
}

trait Prices {
    async fn price(&self, id: u64) -> u64;
}

impl Prices for Db {
    #[stampede::cached(ttl = "60s", companion = true)]
    async fn price(&self, id: u64) -> u64 {
        id
    }
}

fn main() {}

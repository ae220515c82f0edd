// A trait impl takes no items but the trait's, so `companion = true` on a method there needs
// `#[stampede::companions]` on the impl, which emits the companion in an inherent impl. With
// `#[async_trait]` the attribute says so; in a native trait impl, which it cannot tell from an
// inherent one, rustc refuses the items, the first of them named after the fix.
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

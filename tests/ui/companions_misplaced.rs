// `#[stampede::companions]` goes on a trait impl with `#[cached(companion = true)]` methods.
#[derive(Clone)]
struct Db;

trait Prices {
    async fn price(&self, id: u64) -> u64;
}

// An inherent impl: `companion = true` alone does it there.
#[stampede::companions]
impl Db {
    #[stampede::cached(ttl = "60s", companion = true)]
    async fn stock(&self, id: u64) -> u64 {
        id
    }
}

// No method asks for a companion.
#[stampede::companions]
impl Prices for Db {
    #[stampede::cached(ttl = "60s")]
    async fn price(&self, id: u64) -> u64 {
        id
    }
}

// Not an impl.
#[stampede::companions]
#[derive(Clone)]
struct Shop;

// An argument that is not a visibility.
#[stampede::companions(public)]
impl Prices for Shop {
    #[stampede::cached(ttl = "60s", companion = true)]
    async fn price(&self, id: u64) -> u64 {
        id
    }
}

fn main() {}

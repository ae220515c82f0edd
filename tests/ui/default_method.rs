// `#[cached]` on a trait's default method, whose trait does not require what the cache needs of
// `self` (`Clone + Send + Sync + 'static`). With those supertraits it works (tests/placement.rs).
trait Catalog {
    #[stampede::cached(ttl = "60s")]
    async fn count(&self, shop: u64) -> u64 {
        shop
    }
}

fn main() {}

//! An admin tool of the same service, built as its own crate with its own copy of `Product`:
//! reads, and after a change in the database invalidates, the cache `rproduct`.

use serde::{Deserialize, Serialize};
use stampede::cached;
use stampede_identity_example::{Command, counters, price, serve};

/// The admin tool's copy of the product type: the same fields, another Rust path.
#[derive(Serialize, Deserialize, Clone, Debug)]
struct Product {
    id: u64,
    price_cents: u64,
}

#[cached(ttl = "60s", lock = "redis", name = "rproduct", tags = ["product:{id}"])]
async fn rproduct(id: u64) -> Product {
    Product {
        id,
        price_cents: price(id).await,
    }
}

fn main() {
    serve(|command| {
        Box::pin(async move {
            match command {
                Command::Get(id) => {
                    let product = rproduct(id).await;
                    Ok(format!(
                        "price={} {}",
                        product.price_cents,
                        counters("rproduct")
                    ))
                }
                Command::Invalidate(id) => rproduct::invalidate(id)
                    .await
                    .map(|()| "invalidated".into())
                    .map_err(|e| e.to_string()),
                Command::Tag(tag) => stampede::invalidate_tag(&tag)
                    .await
                    .map(|()| "tag invalidated".into())
                    .map_err(|e| e.to_string()),
            }
        })
    });
}

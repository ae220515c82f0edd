//! A later deploy of the service whose product type has another shape (a currency was added),
//! under the same cache name: it must never read the other binaries' bytes as its own type.

use serde::{Deserialize, Serialize};
use stampede::cached;
use stampede_identity_example::{Command, counters, price, serve};

/// This deploy's product type: a field more than the others'.
#[derive(Serialize, Deserialize, Clone, Debug)]
struct Product {
    id: u64,
    price_cents: u64,
    #[serde(default)]
    currency: Option<String>,
}

#[cached(ttl = "60s", lock = "redis", name = "rproduct", tags = ["product:{id}"])]
async fn rproduct(id: u64) -> Product {
    Product {
        id,
        price_cents: price(id).await,
        currency: Some("EUR".into()),
    }
}

fn main() {
    serve(|command| {
        Box::pin(async move {
            match command {
                Command::Get(id) => {
                    let product = rproduct(id).await;
                    let currency = product.currency.as_deref().unwrap_or("none");
                    Ok(format!(
                        "price={} currency={currency} {}",
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

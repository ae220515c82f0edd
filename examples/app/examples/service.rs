//! An HTTP service over a cached product repository (SQLite, seeded at start), to watch the
//! cache at work: `GET /products/{id}`, `GET /metrics` (Prometheus text), `GET /debug/caches`.
//!
//! ```sh
//! cargo run -p stampede-examples --example service            # http://127.0.0.1:3000
//! PORT=3001 cargo run -p stampede-examples --example service  # or: ... --example service -- 3001
//! ```
//!
//! Product lookups take a Redis lock: with `STAMPEDE_REDIS_URL=redis://127.0.0.1:6379/` set,
//! instances on different ports share one Redis and one load per product runs across all of
//! them; without it, each instance runs on local singleflight. `DB_LATENCY_MS` (default 20) is
//! added to every database query, to stand for a database under load.

use std::error::Error;
use std::sync::Arc;
use std::time::Duration;

use stampede_examples::product_repository::SqliteProducts;
use stampede_examples::product_service;

const PRODUCTS: i64 = 1_000;

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .init();
    // Before any cached call: a cache registers its metrics with the recorder it first sees.
    let metrics = product_service::install_metrics();

    let port = setting(std::env::args().nth(1), "PORT", 3000)?;
    let latency = Duration::from_millis(setting(None, "DB_LATENCY_MS", 20)?);
    let products = SqliteProducts::in_memory(PRODUCTS, latency).await?;

    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    tracing::info!(
        "listening on http://{}: {PRODUCTS} products (ids 1..={PRODUCTS}), \
         {latency:?} per database query",
        listener.local_addr()?
    );
    if std::env::var_os(stampede::REDIS_URL_VAR).is_some() {
        tracing::info!(
            "{} is set: one load per product across every instance sharing that Redis",
            stampede::REDIS_URL_VAR
        );
    } else {
        tracing::info!(
            "{} is not set: one load per product in this instance (local singleflight)",
            stampede::REDIS_URL_VAR
        );
    }
    axum::serve(
        listener,
        product_service::router(Arc::new(products), metrics),
    )
    .await?;
    Ok(())
}

/// A number from the command line, else from the environment variable `var`, else `default`.
fn setting<T>(argument: Option<String>, var: &str, default: T) -> Result<T, String>
where
    T: std::str::FromStr,
{
    match argument.or_else(|| std::env::var(var).ok()) {
        Some(text) => text
            .parse()
            .map_err(|_| format!("{var}: expected a number, got {text:?}")),
        None => Ok(default),
    }
}

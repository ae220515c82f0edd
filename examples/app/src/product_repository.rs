//! A product catalogue over SQLite (through sqlx) whose lookup by id is cached with
//! `#[cached(lock = "redis")]` on an `#[async_trait]` method, served over HTTP by
//! [`product_service`](crate::product_service).
//!
//! Every query that reaches the database increments the `db_queries_total` counter of the
//! `metrics` facade, so that `/metrics` shows database queries next to requests.

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sqlx::Row;
use sqlx::sqlite::SqlitePool;
use stampede::cached;

use crate::sqlite::{RepoError, in_memory_pool};

/// A product as the API returns it. Stored in Redis too, so it is `Serialize + Deserialize`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Product {
    pub id: i64,
    pub name: String,
    pub price_cents: i64,
}

/// What the HTTP handlers call; they hold it as `Arc<dyn ProductRepository>`.
#[async_trait]
pub trait ProductRepository: Send + Sync {
    /// The product `id`, or `None` when there is none.
    async fn product(&self, id: i64) -> Result<Option<Product>, RepoError>;
}

/// The SQLite store. Cloning it is cheap: the pool is shared.
#[derive(Clone)]
pub struct SqliteProducts {
    pool: SqlitePool,
    /// Added to every query, to stand for a database under load (an in-memory SQLite answers in
    /// microseconds, too fast for a stampede to show).
    latency: Duration,
}

impl SqliteProducts {
    /// An in-memory database on one connection that lives as long as the pool (an in-memory
    /// SQLite database belongs to its connection), with `count` products, ids `1..=count`.
    pub async fn in_memory(count: i64, latency: Duration) -> Result<Self, RepoError> {
        let pool = in_memory_pool().await?;
        sqlx::query(
            "CREATE TABLE products (
                id INTEGER PRIMARY KEY,
                name TEXT NOT NULL,
                price_cents INTEGER NOT NULL
            )",
        )
        .execute(&pool)
        .await?;
        for id in 1..=count {
            sqlx::query("INSERT INTO products (id, name, price_cents) VALUES (?, ?, ?)")
                .bind(id)
                .bind(seeded_name(id))
                .bind(seeded_price(id))
                .execute(&pool)
                .await?;
        }
        Ok(SqliteProducts { pool, latency })
    }
}

/// The name the seed gives product `id`.
pub fn seeded_name(id: i64) -> String {
    format!("product #{id}")
}

/// The price the seed gives product `id`.
pub fn seeded_price(id: i64) -> i64 {
    100 + id * 25
}

#[async_trait]
impl ProductRepository for SqliteProducts {
    /// Fresh for 10 s (less up to 10% of jitter), then served stale for a minute while one
    /// refresh runs. With `STAMPEDE_REDIS_URL` set, one load per product runs across every
    /// instance sharing the Redis; without it, one per instance.
    ///
    /// A missing product is cached too (`None`, like any value): a client asking again and again
    /// for an id that does not exist costs one query per TTL, not one per request. The price is
    /// that a product created meanwhile shows once that `None` is refreshed. `capacity` bounds
    /// how many ids, existing or not, are kept.
    #[cached(
        ttl = "10s",
        stale = "1m",
        lock = "redis",
        timeout = "2s",
        name = "products::by_id"
    )]
    async fn product(&self, id: i64) -> Result<Option<Product>, RepoError> {
        metrics::counter!("db_queries_total").increment(1);
        tokio::time::sleep(self.latency).await;
        let row = sqlx::query("SELECT id, name, price_cents FROM products WHERE id = ?")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|row| Product {
            id: row.get("id"),
            name: row.get("name"),
            price_cents: row.get("price_cents"),
        }))
    }
}

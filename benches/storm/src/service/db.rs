//! The instance's database: a fixed-size pool and the product query, with what the report
//! needs counted (queries, per hot key, the wait for a connection).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;

use crate::plan::HOT_KEYS;
use crate::product::Product;
use crate::schema::PRODUCT_QUERY;

/// How long a request may wait for a pool connection before it fails (a 503).
pub const POOL_WAIT: Duration = Duration::from_secs(2);

/// The pool and the counters of what went through it.
pub struct Db {
    pool: Pool,
    /// Queries sent.
    pub queries: AtomicU64,
    /// Queries that failed.
    pub query_errors: AtomicU64,
    /// Queries per hot key.
    pub hot_queries: Vec<AtomicU64>,
    /// Connections taken.
    pub pool_waits: AtomicU64,
    /// Their total wait, in microseconds.
    pub pool_wait_us: AtomicU64,
    /// The longest wait since the last read, in microseconds.
    pub pool_wait_max_us: AtomicU64,
}

impl Db {
    /// A pool of `size` connections to the database on `127.0.0.1:port`, every connection
    /// opened before this returns (the cold start is the caches', not the pool's).
    pub async fn connect(port: u16, size: usize) -> Result<Db, String> {
        let mut config = tokio_postgres::Config::new();
        config
            .host("127.0.0.1")
            .port(port)
            .user("storm")
            .dbname("storm")
            .application_name("storm-service")
            .connect_timeout(Duration::from_secs(5));
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(size)
            .wait_timeout(Some(POOL_WAIT))
            .create_timeout(Some(Duration::from_secs(5)))
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|e| format!("cannot build the pool: {e}"))?;
        // Open all of them now, and prepare the query on each.
        let mut held = Vec::with_capacity(size);
        for _ in 0..size {
            let client = pool
                .get()
                .await
                .map_err(|e| format!("cannot connect to the database on port {port}: {e}"))?;
            client
                .prepare_cached(PRODUCT_QUERY)
                .await
                .map_err(|e| format!("cannot prepare the product query: {e}"))?;
            held.push(client);
        }
        drop(held);
        Ok(Db {
            pool,
            queries: AtomicU64::new(0),
            query_errors: AtomicU64::new(0),
            hot_queries: (0..HOT_KEYS).map(|_| AtomicU64::new(0)).collect(),
            pool_waits: AtomicU64::new(0),
            pool_wait_us: AtomicU64::new(0),
            pool_wait_max_us: AtomicU64::new(0),
        })
    }

    /// The product `id`, or `None` when there is none: one query, on a pooled connection.
    pub async fn product(&self, id: i32) -> Result<Option<Product>, String> {
        self.queries.fetch_add(1, Relaxed);
        if let Some(hot) = usize::try_from(id)
            .ok()
            .and_then(|id| id.checked_sub(1))
            .and_then(|index| self.hot_queries.get(index))
        {
            hot.fetch_add(1, Relaxed);
        }
        let result = self.query(id).await;
        if result.is_err() {
            self.query_errors.fetch_add(1, Relaxed);
        }
        result
    }

    async fn query(&self, id: i32) -> Result<Option<Product>, String> {
        let asked = Instant::now();
        let client = self.pool.get().await;
        let waited = u64::try_from(asked.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.pool_waits.fetch_add(1, Relaxed);
        self.pool_wait_us.fetch_add(waited, Relaxed);
        self.pool_wait_max_us.fetch_max(waited, Relaxed);
        let client = client.map_err(|e| format!("no database connection: {e}"))?;
        let statement = client
            .prepare_cached(PRODUCT_QUERY)
            .await
            .map_err(|e| format!("prepare: {}", crate::orchestrate::postgres::pg_error(&e)))?;
        let row = client
            .query_opt(&statement, &[&id])
            .await
            .map_err(|e| format!("query: {}", crate::orchestrate::postgres::pg_error(&e)))?;
        row.map(|row| {
            Ok(Product {
                id: row.try_get("id")?,
                name: row.try_get("name")?,
                price_cents: row.try_get("price_cents")?,
                stock: row.try_get("stock")?,
                category: row.try_get("category")?,
                in_category: row.try_get("in_category")?,
                average_cents: row.try_get("average_cents")?,
                median_cents: row.try_get("median_cents")?,
                cheaper: row.try_get("cheaper")?,
            })
        })
        .transpose()
        .map_err(|e: tokio_postgres::Error| format!("row: {e}"))
    }
}

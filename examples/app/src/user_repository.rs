//! A user repository over SQLite, with cached reads, and the scenario that shows what the cache
//! saves: `examples/repository.rs` prints the scenario's report, `tests/repository.rs` asserts it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use sqlx::Row;
use sqlx::sqlite::{SqlitePool, SqliteRow};
use stampede::cached;

use crate::sqlite::{RepoError, in_memory_pool};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    pub id: i64,
    pub name: String,
    pub email: String,
}

/// What the services call; they hold it as `Arc<dyn UserRepository>`.
#[async_trait]
pub trait UserRepository: Send + Sync {
    async fn get_user(&self, id: i64) -> Result<Option<User>, RepoError>;
    async fn list_recent(&self, limit: u32) -> Result<Vec<User>, RepoError>;
    async fn count(&self) -> Result<i64, RepoError>;
}

/// The SQLite store. Cloning it is cheap: the pool and the query counter are shared.
#[derive(Clone)]
pub struct SqliteUsers {
    pool: SqlitePool,
    queries: Arc<AtomicUsize>,
}

impl SqliteUsers {
    /// An in-memory database on one connection that lives as long as the pool (an in-memory
    /// SQLite database belongs to its connection).
    pub async fn in_memory() -> Result<Self, RepoError> {
        let pool = in_memory_pool().await?;
        sqlx::query(
            "CREATE TABLE users (
                id INTEGER PRIMARY KEY,
                name TEXT NOT NULL,
                email TEXT NOT NULL UNIQUE,
                created_at INTEGER NOT NULL
            )",
        )
        .execute(&pool)
        .await?;
        Ok(SqliteUsers {
            pool,
            queries: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// Inserts `count` users, the later ones more recent. Not counted as queries.
    pub async fn seed(&self, count: i64) -> Result<(), RepoError> {
        for id in 1..=count {
            sqlx::query("INSERT INTO users (id, name, email, created_at) VALUES (?, ?, ?, ?)")
                .bind(id)
                .bind(format!("user {id}"))
                .bind(format!("user{id}@example.com"))
                .bind(1_700_000_000 + id)
                .execute(&self.pool)
                .await?;
        }
        Ok(())
    }

    /// How many read queries have run against the database.
    pub fn queries(&self) -> usize {
        self.queries.load(Ordering::SeqCst)
    }

    fn query_ran(&self) {
        self.queries.fetch_add(1, Ordering::SeqCst);
    }
}

fn user(row: &SqliteRow) -> User {
    User {
        id: row.get("id"),
        name: row.get("name"),
        email: row.get("email"),
    }
}

#[async_trait]
impl UserRepository for SqliteUsers {
    /// A user changes rarely: fresh for 30 s, then served stale for 5 min while one refresh runs.
    #[cached(ttl = "30s", stale = "5m", timeout = "2s", name = "users::get_user")]
    async fn get_user(&self, id: i64) -> Result<Option<User>, RepoError> {
        self.query_ran();
        let row = sqlx::query("SELECT id, name, email FROM users WHERE id = ?")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.as_ref().map(user))
    }

    /// The "recent sign-ups" box: a short TTL, and a bounded retry for a busy database.
    #[cached(ttl = "2s", retries = 1, backoff = "20ms", name = "users::list_recent")]
    async fn list_recent(&self, limit: u32) -> Result<Vec<User>, RepoError> {
        self.query_ran();
        let rows =
            sqlx::query("SELECT id, name, email FROM users ORDER BY created_at DESC LIMIT ?")
                .bind(limit)
                .fetch_all(&self.pool)
                .await?;
        Ok(rows.iter().map(user).collect())
    }

    /// A cheap aggregate: cached, but without a lock (a cold burst may run it more than once).
    #[cached(ttl = "10s", lock = "none", name = "users::count")]
    async fn count(&self) -> Result<i64, RepoError> {
        self.query_ran();
        let row = sqlx::query("SELECT COUNT(*) AS n FROM users")
            .fetch_one(&self.pool)
            .await?;
        Ok(row.get("n"))
    }
}

/// Calls and queries of one step of the scenario.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub what: &'static str,
    pub calls: usize,
    pub queries: usize,
}

/// Concurrent requests against a cold cache, as a service sees them after a deploy.
pub async fn scenario(store: &SqliteUsers) -> Result<Vec<Step>, RepoError> {
    let repo: Arc<dyn UserRepository> = Arc::new(store.clone());
    let mut steps = Vec::new();

    // 1. 500 concurrent profile requests spread over 10 users.
    let before = store.queries();
    let calls: Vec<_> = (0..500)
        .map(|i| {
            let repo = repo.clone();
            tokio::spawn(async move { repo.get_user(i % 10 + 1).await })
        })
        .collect();
    let count = calls.len();
    for (i, call) in calls.into_iter().enumerate() {
        let user = join(call).await??.expect("seeded user");
        assert_eq!(user.id, i as i64 % 10 + 1);
    }
    steps.push(Step {
        what: "get_user (10 users)",
        calls: count,
        queries: store.queries() - before,
    });

    // 2. 200 concurrent home pages asking for the recent sign-ups.
    let before = store.queries();
    let calls: Vec<_> = (0..200)
        .map(|_| {
            let repo = repo.clone();
            tokio::spawn(async move { repo.list_recent(5).await })
        })
        .collect();
    let count = calls.len();
    for call in calls {
        let recent = join(call).await??;
        assert_eq!(recent.len(), 5);
    }
    steps.push(Step {
        what: "list_recent(5)",
        calls: count,
        queries: store.queries() - before,
    });

    // 3. `count` has no lock: one call fills it, then 100 concurrent calls are hits.
    let before = store.queries();
    let total = repo.count().await?;
    let calls: Vec<_> = (0..100)
        .map(|_| {
            let repo = repo.clone();
            tokio::spawn(async move { repo.count().await })
        })
        .collect();
    let count = calls.len() + 1;
    for call in calls {
        assert_eq!(join(call).await??, total);
    }
    steps.push(Step {
        what: "count (warm, no lock)",
        calls: count,
        queries: store.queries() - before,
    });

    Ok(steps)
}

async fn join<T>(task: tokio::task::JoinHandle<T>) -> Result<T, RepoError> {
    task.await
        .map_err(|e| RepoError::Db(format!("request task failed: {e}").into()))
}

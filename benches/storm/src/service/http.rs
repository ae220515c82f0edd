//! The instance's routes: `GET /products/{id}` through the contender's lookup, and
//! `GET /stats`, its counters for the orchestrator.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};

use crate::contender::Contender;
use crate::plan::HOT_KEYS;
use crate::service::db::Db;
use crate::service::lookup;
use crate::wire::{CacheCounters, InstanceStats};

/// What the handlers share.
pub struct App {
    /// How this instance caches.
    pub contender: Contender,
    /// Its database and the counters of its queries.
    pub db: &'static Db,
    /// A cache call at least this long counts as a wait.
    pub wait_threshold: Duration,
    /// Requests answered.
    pub requests: AtomicU64,
    /// Of them, with an error status.
    pub errors: AtomicU64,
    /// Cache calls that took at least `wait_threshold`.
    pub waits: AtomicU64,
    /// Of them, of a hot key.
    pub hot_waits: AtomicU64,
}

/// The routes over `app`.
pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/products/{id}", get(product))
        .route("/stats", get(stats))
        .with_state(app)
}

async fn product(State(app): State<Arc<App>>, Path(id): Path<i32>) -> Response {
    let started = Instant::now();
    let result = lookup::product(app.contender, id).await;
    if started.elapsed() >= app.wait_threshold {
        app.waits.fetch_add(1, Relaxed);
        if (1..=HOT_KEYS as i32).contains(&id) {
            app.hot_waits.fetch_add(1, Relaxed);
        }
    }
    app.requests.fetch_add(1, Relaxed);
    match result {
        Ok(Some(product)) => Json(product).into_response(),
        Ok(None) => (StatusCode::NOT_FOUND, "no such product").into_response(),
        Err(error) => {
            app.errors.fetch_add(1, Relaxed);
            (StatusCode::SERVICE_UNAVAILABLE, error.to_string()).into_response()
        }
    }
}

async fn stats(State(app): State<Arc<App>>) -> Json<InstanceStats> {
    let db = app.db;
    Json(InstanceStats {
        requests: app.requests.load(Relaxed),
        errors: app.errors.load(Relaxed),
        queries: db.queries.load(Relaxed),
        query_errors: db.query_errors.load(Relaxed),
        hot_queries: db.hot_queries.iter().map(|hot| hot.load(Relaxed)).collect(),
        pool_waits: db.pool_waits.load(Relaxed),
        pool_wait_us: db.pool_wait_us.load(Relaxed),
        pool_wait_max_us: db.pool_wait_max_us.swap(0, Relaxed),
        waits: app.waits.load(Relaxed),
        hot_waits: app.hot_waits.load(Relaxed),
        cache: app
            .contender
            .stampede_name()
            .and_then(stampede::stats)
            .map(|stats| CacheCounters {
                hits: stats.hits,
                misses: stats.misses,
                stale_served: stats.stale_served,
                remote_hits: stats.remote_hits,
                degraded: stats.degraded,
                refreshes: stats.refreshes,
                fail_safe_served: stats.fail_safe_served,
            })
            .unwrap_or_default(),
    })
}

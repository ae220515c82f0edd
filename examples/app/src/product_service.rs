//! The HTTP side of the service example: the metrics recorder and the router.
//! `examples/service.rs` serves it on a port; `tests/service.rs` starts it in-process and checks
//! what `/metrics` says.
//!
//! - `GET /products/{id}`: the product as JSON, 404 when there is none;
//! - `GET /metrics`: every metric of the process in the Prometheus text format;
//! - `GET /debug/caches`: `stampede::caches()` as JSON, every cache with its options and stats.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use crate::product_repository::ProductRepository;

/// Installs the Prometheus recorder as the process's `metrics` recorder, once; later calls
/// return the same handle. Call it before the first call of a cached function: a cache takes
/// its metric handles from the recorder installed when it is first called.
///
/// Must be called inside a tokio runtime: it starts the recorder's upkeep task (which drains
/// histogram samples into their summaries every 5 s).
pub fn install_metrics() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let handle = PrometheusBuilder::new()
                .install_recorder()
                .expect("another metrics recorder is installed already");
            metrics::describe_counter!(
                "db_queries_total",
                "Queries the product repository sent to the database"
            );
            metrics::describe_counter!(
                "http_requests_total",
                "Product requests answered, by status"
            );
            let upkeep = handle.clone();
            tokio::spawn(async move {
                let mut every = tokio::time::interval(Duration::from_secs(5));
                loop {
                    every.tick().await;
                    upkeep.run_upkeep();
                }
            });
            handle
        })
        .clone()
}

/// What every handler is given.
#[derive(Clone)]
struct App {
    products: Arc<dyn ProductRepository>,
    metrics: PrometheusHandle,
}

/// The service's routes over `products`, with `/metrics` rendered by `metrics`.
pub fn router(products: Arc<dyn ProductRepository>, metrics: PrometheusHandle) -> Router {
    Router::new()
        .route("/products/{id}", get(product))
        .route("/metrics", get(prometheus))
        .route("/debug/caches", get(debug_caches))
        .with_state(App { products, metrics })
}

async fn product(State(app): State<App>, Path(id): Path<i64>) -> Response {
    let (status, response) = match app.products.product(id).await {
        Ok(Some(product)) => ("200", Json(product).into_response()),
        Ok(None) => (
            "404",
            (
                StatusCode::NOT_FOUND,
                Json(serde_json::json!({ "error": format!("no product {id}") })),
            )
                .into_response(),
        ),
        Err(error) => {
            tracing::error!(id, %error, "product lookup failed");
            (
                "500",
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    Json(serde_json::json!({ "error": error.to_string() })),
                )
                    .into_response(),
            )
        }
    };
    metrics::counter!("http_requests_total", "route" => "/products/{id}", "status" => status)
        .increment(1);
    response
}

async fn prometheus(State(app): State<App>) -> impl IntoResponse {
    (
        [(CONTENT_TYPE, "text/plain; version=0.0.4")],
        app.metrics.render(),
    )
}

async fn debug_caches() -> Json<Vec<stampede::CacheInfo>> {
    Json(stampede::caches())
}

//! The service example, started in-process on a free port and driven over HTTP: a burst of
//! concurrent requests on a cold product runs one database query, and `/metrics` and
//! `/debug/caches` say exactly what happened. Runs without Redis: the product cache asks for a
//! Redis lock and degrades to local singleflight, which is what is counted here.

mod common;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use common::{WAIT, within};
use http_body_util::{BodyExt, Empty};
use hyper::StatusCode;
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use stampede_examples::product_repository::{SqliteProducts, seeded_name, seeded_price};
use stampede_examples::product_service;

/// The product cache's name, as `#[cached(name = ...)]` gives it.
const CACHE: &str = "products::by_id";
/// How long each database query takes: long enough for the whole burst to arrive during it.
const LATENCY: Duration = Duration::from_millis(500);
/// Concurrent requests per burst.
const BURST: usize = 64;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_on_a_cold_product_runs_one_query_and_the_metrics_agree() {
    assert!(
        std::env::var_os(stampede::REDIS_URL_VAR).is_none(),
        "this test runs the service without Redis: unset {}",
        stampede::REDIS_URL_VAR
    );
    let service = Service::start().await;
    let cold = service.metrics().await;
    assert_eq!(
        cold.get("db_queries_total", &[]),
        None,
        "no query before any request"
    );

    // 1. A burst on a cold product; the requests arrive while its one query runs.
    let burst = service.burst("/products/7");
    service
        .metrics_once("the query to run with callers waiting for it", |m| {
            m.get("inflight_refresh_count", &cache()) == Some(1.0)
                && m.get("singleflight_waiters", &cache()).unwrap_or(0.0) >= 1.0
                && m.get("db_queries_total", &[]) == Some(1.0)
        })
        .await;
    let product7 = json!({ "id": 7, "name": seeded_name(7), "price_cents": seeded_price(7) });
    for (status, body) in within(burst).await {
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(serde_json::from_str::<Value>(&body).unwrap(), product7);
    }
    let after = service.settled().await;
    assert_eq!(
        after.value("db_queries_total", &[]),
        1.0,
        "one query for the burst"
    );
    assert_eq!(after.value("cache_load_total", &cache()), 1.0);
    assert_eq!(after.value("cache_refresh_total", &reason("miss")), 1.0);
    assert_eq!(after.value("cache_refresh_total", &reason("stale")), 0.0);
    let hits = after.value("cache_hit_total", &cache());
    let misses = after.value("cache_miss_total", &cache());
    let shared = after.value("singleflight_shared_result_total", &cache());
    assert_eq!(
        hits + shared + 1.0,
        BURST as f64,
        "every request but the one that loaded is a hit or shares the load"
    );
    assert_eq!(misses, shared + 1.0, "each miss loads or shares the load");
    assert!(
        shared > 0.0,
        "the burst was concurrent, so requests shared the load"
    );
    assert_eq!(after.value("cache_stale_served_total", &cache()), 0.0);
    assert_eq!(after.value("cache_refresh_error_total", &cache()), 0.0);
    assert_eq!(after.value("cache_refresh_timeout_total", &cache()), 0.0);
    // No Redis: the load ran on local singleflight, and is counted as degraded.
    assert_eq!(after.value("cache_degraded_load_total", &cache()), 1.0);
    assert_eq!(
        after.value("redis_lock_acquire_success_total", &cache()),
        0.0
    );
    // The load's duration is the query's, at least.
    assert_eq!(
        after.value("cache_refresh_duration_seconds_count", &cache()),
        1.0
    );
    assert!(after.value("cache_refresh_duration_seconds_sum", &cache()) >= LATENCY.as_secs_f64());
    assert_eq!(
        after.value("http_requests_total", &status("200")),
        BURST as f64
    );
    assert_eq!(after.get("http_requests_total", &status("500")), None);

    // 2. The same burst on the now warm product: every request is a hit, nothing is queried.
    for (status, body) in within(service.burst("/products/7")).await {
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(serde_json::from_str::<Value>(&body).unwrap(), product7);
    }
    let warm = service.settled().await;
    assert_eq!(warm.value("cache_hit_total", &cache()), hits + BURST as f64);
    assert_eq!(warm.value("cache_miss_total", &cache()), misses);
    assert_eq!(warm.value("db_queries_total", &[]), 1.0);
    assert_eq!(
        warm.value("http_requests_total", &status("200")),
        2.0 * BURST as f64
    );

    // 3. A product that does not exist: 404, and the `None` is cached like a value.
    for _ in 0..2 {
        let (status, body) = service.get("/products/9999").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(
            serde_json::from_str::<Value>(&body).unwrap(),
            json!({ "error": "no product 9999" })
        );
    }
    let missing = service.settled().await;
    assert_eq!(
        missing.value("db_queries_total", &[]),
        2.0,
        "one query for 9999"
    );
    assert_eq!(missing.value("cache_refresh_total", &reason("miss")), 2.0);
    assert_eq!(missing.value("http_requests_total", &status("404")), 2.0);
    assert_eq!(missing.get("http_requests_total", &status("500")), None);

    // 4. The debug page lists the cache, its options, and the same counts.
    let (status, body) = service.get("/debug/caches").await;
    assert_eq!(status, StatusCode::OK);
    let caches: Value = serde_json::from_str(&body).unwrap();
    let listed: Vec<&Value> = caches
        .as_array()
        .expect("a list of caches")
        .iter()
        .filter(|info| info["config"]["name"] == CACHE)
        .collect();
    assert_eq!(listed.len(), 1, "{caches:#}");
    let config = &listed[0]["config"];
    assert_eq!(config["lock"], "redis");
    assert_eq!(config["backend"], "tiered");
    assert_eq!(config["ttl_ms"], 10_000);
    assert_eq!(config["stale_ms"], 60_000);
    let stats = &listed[0]["stats"];
    let count = |field: &str| {
        stats[field]
            .as_f64()
            .unwrap_or_else(|| panic!("{field}: {stats}"))
    };
    for (field, metric) in [
        ("hits", "cache_hit_total"),
        ("misses", "cache_miss_total"),
        ("loads", "cache_load_total"),
        ("shared", "singleflight_shared_result_total"),
        ("degraded", "cache_degraded_load_total"),
        ("load_errors", "cache_refresh_error_total"),
    ] {
        assert_eq!(count(field), missing.value(metric, &cache()), "{field}");
    }
    assert_eq!(count("loads"), 2.0);
    assert_eq!(count("in_flight"), 0.0);
    assert_eq!(count("waiters"), 0.0);
    let hot = stats["hot_keys"].as_array().expect("a list of hot keys");
    assert!(
        hot.iter().any(|key| key["key"] == "(7,)"),
        "product 7 is the hot key: {hot:?}"
    );
}

fn cache() -> Vec<(&'static str, &'static str)> {
    vec![("cache", CACHE)]
}

fn reason(reason: &'static str) -> Vec<(&'static str, &'static str)> {
    vec![("cache", CACHE), ("reason", reason)]
}

fn status(status: &'static str) -> Vec<(&'static str, &'static str)> {
    vec![("route", "/products/{id}"), ("status", status)]
}

/// The service, listening on a free loopback port, and an HTTP client for it.
struct Service {
    address: String,
    client: Client<HttpConnector, Empty<Bytes>>,
}

impl Service {
    async fn start() -> Service {
        // Before any cached call, as `main` does.
        let metrics = product_service::install_metrics();
        let products = within(SqliteProducts::in_memory(20, LATENCY))
            .await
            .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let router = product_service::router(Arc::new(products), metrics);
        tokio::spawn(async move { axum::serve(listener, router).await });
        Service {
            address,
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    /// GETs `path`: the status and the body.
    async fn get(&self, path: &str) -> (StatusCode, String) {
        get(&self.client, &self.address, path).await
    }

    /// `BURST` concurrent GETs of `path`, each on its own task; resolves to their answers.
    fn burst(&self, path: &str) -> impl Future<Output = Vec<(StatusCode, String)>> + use<> {
        let requests: Vec<_> = (0..BURST)
            .map(|_| {
                let (client, address, path) =
                    (self.client.clone(), self.address.clone(), path.to_owned());
                tokio::spawn(async move { get(&client, &address, &path).await })
            })
            .collect();
        async move {
            let mut answers = Vec::with_capacity(requests.len());
            for request in requests {
                answers.push(request.await.expect("a request task failed"));
            }
            answers
        }
    }

    /// Scrapes `/metrics`.
    async fn metrics(&self) -> Metrics {
        let (status, text) = self.get("/metrics").await;
        assert_eq!(status, StatusCode::OK, "{text}");
        Metrics::parse(&text)
    }

    /// Scrapes `/metrics` until `condition` holds, failing the test after `WAIT`.
    async fn metrics_once(&self, what: &str, condition: impl Fn(&Metrics) -> bool) -> Metrics {
        let waited = tokio::time::timeout(WAIT, async {
            loop {
                let metrics = self.metrics().await;
                if condition(&metrics) {
                    return metrics;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        waited.unwrap_or_else(|_| panic!("timed out waiting for {what}"))
    }

    /// The metrics once no load runs and nobody waits (a load's task ends a moment after its
    /// waiters are answered).
    async fn settled(&self) -> Metrics {
        self.metrics_once("the loads to end", |m| {
            m.get("inflight_refresh_count", &cache()) == Some(0.0)
                && m.get("singleflight_waiters", &cache()) == Some(0.0)
        })
        .await
    }
}

async fn get(
    client: &Client<HttpConnector, Empty<Bytes>>,
    address: &str,
    path: &str,
) -> (StatusCode, String) {
    let uri = format!("http://{address}{path}").parse().unwrap();
    within(async {
        let response = client.get(uri).await.expect("the request failed");
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8(body.to_vec()).unwrap())
    })
    .await
}

/// The samples of a Prometheus text exposition: for each metric name, its series.
struct Metrics(BTreeMap<String, Vec<Series>>);

/// One series of a metric: its labels and its value.
type Series = (Labels, f64);
type Labels = BTreeMap<String, String>;

impl Metrics {
    fn parse(text: &str) -> Metrics {
        let mut metrics: BTreeMap<_, Vec<_>> = BTreeMap::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (name, labels, rest) = sample(line).unwrap_or_else(|| panic!("bad line: {line}"));
            let value = rest
                .split_whitespace()
                .next()
                .and_then(|value| value.parse().ok())
                .unwrap_or_else(|| panic!("bad value: {line}"));
            metrics
                .entry(name.to_owned())
                .or_default()
                .push((labels, value));
        }
        Metrics(metrics)
    }

    /// The sum of the series of `name` that carry `labels`, or `None` if there is none.
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let matching: Vec<f64> = self
            .0
            .get(name)?
            .iter()
            .filter(|(have, _)| {
                labels
                    .iter()
                    .all(|(key, value)| have.get(*key).map(String::as_str) == Some(*value))
            })
            .map(|(_, value)| *value)
            .collect();
        (!matching.is_empty()).then(|| matching.iter().sum())
    }

    /// Like [`get`](Self::get), failing the test when no series matches.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels)
            .unwrap_or_else(|| panic!("/metrics has no {name} with {labels:?}"))
    }
}

/// Splits `name{key="value",...} rest` (or `name rest`) into its name, labels and the rest.
/// Label values may hold braces, commas and escaped characters.
fn sample(line: &str) -> Option<(&str, Labels, &str)> {
    let end = line.find(['{', ' '])?;
    let (name, mut rest) = line.split_at(end);
    let mut labels = BTreeMap::new();
    if let Some(mut inner) = rest.strip_prefix('{') {
        loop {
            if let Some(after) = inner.strip_prefix('}') {
                rest = after;
                break;
            }
            let (key, quoted) = inner.split_once("=\"")?;
            let mut value = String::new();
            let mut chars = quoted.char_indices();
            let close = loop {
                match chars.next()? {
                    (at, '"') => break at,
                    (_, '\\') => match chars.next()?.1 {
                        'n' => value.push('\n'),
                        escaped => value.push(escaped),
                    },
                    (_, other) => value.push(other),
                }
            };
            labels.insert(key.to_owned(), value);
            inner = &quoted[close + 1..];
            inner = inner.strip_prefix(',').unwrap_or(inner);
        }
    }
    Some((name, labels, rest))
}

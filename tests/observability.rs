//! What a cache tells the outside: metrics through the `metrics` facade, tracing spans and
//! warnings, and the stats snapshot with its hot keys.
//!
//! The test binary installs one metrics recorder and one tracing subscriber for all its tests
//! (they are process-wide); each test reads only the metrics and spans of its own caches.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use common::redis_server::RedisServer;
use common::{AppError, eventually, within};
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use metrics_util::registry::{AtomicStorage, Registry};
use stampede::{RedisConfig, cached};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Instrument, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

// ---- a recorder that keeps every value (unlike a draining snapshot) ----------------------------

struct Kept(Registry<Key, AtomicStorage>);

impl Recorder for Kept {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        self.0
            .get_or_create_counter(key, |c| Counter::from_arc(c.clone()))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        self.0
            .get_or_create_gauge(key, |g| Gauge::from_arc(g.clone()))
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        self.0
            .get_or_create_histogram(key, |h| Histogram::from_arc(h.clone()))
    }
}

/// The process's recorder and subscriber, installed by the first test that asks.
fn telemetry() -> &'static (Arc<Kept>, Captured) {
    static INSTALLED: OnceLock<(Arc<Kept>, Captured)> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let recorder = Arc::new(Kept(Registry::atomic()));
        metrics::set_global_recorder(Forward(recorder.clone()))
            .expect("a recorder was installed already");
        let captured = Captured::default();
        let subscriber = tracing_subscriber::registry().with(captured.clone());
        tracing::subscriber::set_global_default(subscriber)
            .expect("a subscriber was installed already");
        (recorder, captured)
    })
}

/// Lets the test keep a handle on the installed recorder.
struct Forward(Arc<Kept>);

impl Recorder for Forward {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        self.0.register_counter(key, metadata)
    }
    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        self.0.register_gauge(key, metadata)
    }
    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        self.0.register_histogram(key, metadata)
    }
}

fn labelled(key: &Key, name: &str, labels: &[(&str, &str)]) -> bool {
    key.name() == name
        && labels.iter().all(|(k, v)| {
            key.labels()
                .any(|label| label.key() == *k && label.value() == *v)
        })
}

fn counter(name: &str, labels: &[(&str, &str)]) -> u64 {
    let handles = telemetry().0.0.get_counter_handles();
    handles
        .iter()
        .filter(|(key, _)| labelled(key, name, labels))
        .map(|(_, value)| value.load(SeqCst))
        .sum()
}

fn gauge(name: &str, labels: &[(&str, &str)]) -> f64 {
    let handles = telemetry().0.0.get_gauge_handles();
    handles
        .iter()
        .filter(|(key, _)| labelled(key, name, labels))
        .map(|(_, value)| f64::from_bits(value.load(SeqCst)))
        .sum()
}

fn histogram(name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
    let handles = telemetry().0.0.get_histogram_handles();
    handles
        .iter()
        .filter(|(key, _)| labelled(key, name, labels))
        .flat_map(|(_, bucket)| bucket.data())
        .collect()
}

// ---- a layer that keeps every span and warning ------------------------------------------------

#[derive(Clone, Debug, Default)]
struct SpanSeen {
    name: String,
    fields: HashMap<String, String>,
    parent: Option<String>,
    follows: Vec<String>,
}

#[derive(Clone, Default)]
struct Captured {
    open: Arc<Mutex<HashMap<u64, SpanSeen>>>,
    closed: Arc<Mutex<Vec<SpanSeen>>>,
    warnings: Arc<Mutex<Vec<HashMap<String, String>>>>,
}

struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(
            field.name().to_owned(),
            format!("{value:?}").trim_matches('"').to_owned(),
        );
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Captured {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut seen = SpanSeen {
            name: attrs.metadata().name().to_owned(),
            parent: ctx
                .span(id)
                .and_then(|span| span.parent())
                .map(|parent| parent.name().to_owned()),
            ..SpanSeen::default()
        };
        attrs.record(&mut Fields(&mut seen.fields));
        self.open.lock().unwrap().insert(id.into_u64(), seen);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        if let Some(seen) = self.open.lock().unwrap().get_mut(&id.into_u64()) {
            values.record(&mut Fields(&mut seen.fields));
        }
    }

    fn on_follows_from(&self, id: &Id, follows: &Id, ctx: Context<'_, S>) {
        let followed = ctx
            .span(follows)
            .map(|span| span.name().to_owned())
            .unwrap_or_default();
        if let Some(seen) = self.open.lock().unwrap().get_mut(&id.into_u64()) {
            seen.follows.push(followed);
        }
    }

    fn on_close(&self, id: Id, _: Context<'_, S>) {
        if let Some(seen) = self.open.lock().unwrap().remove(&id.into_u64()) {
            self.closed.lock().unwrap().push(seen);
        }
    }

    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        if *event.metadata().level() == tracing::Level::WARN {
            let mut fields = HashMap::new();
            event.record(&mut Fields(&mut fields));
            self.warnings.lock().unwrap().push(fields);
        }
    }
}

fn spans(name: &str, cache: &str) -> Vec<SpanSeen> {
    let closed = telemetry().1.closed.lock().unwrap();
    closed
        .iter()
        .filter(|span| span.name == name && span.fields.get("cache").is_some_and(|c| c == cache))
        .cloned()
        .collect()
}

// ---- the tests ---------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_stampede_is_counted_as_one_load_shared_by_its_callers() {
    telemetry();
    #[cached(ttl = "60s", name = "obs::stampede")]
    async fn product(id: u64) -> String {
        tokio::time::sleep(Duration::from_millis(50)).await;
        format!("product {id}")
    }

    let calls: Vec<_> = (0..50).map(|_| tokio::spawn(product(1))).collect();
    for call in calls {
        within(call).await.unwrap();
    }
    for _ in 0..10 {
        within(product(1)).await;
    }

    let cache = [("cache", "obs::stampede"), ("backend", "memory")];
    assert_eq!(counter("cache_miss_total", &cache), 50);
    assert_eq!(counter("singleflight_shared_result_total", &cache), 49);
    assert_eq!(
        counter(
            "cache_refresh_total",
            &[("cache", "obs::stampede"), ("reason", "miss")]
        ),
        1
    );
    assert_eq!(counter("cache_load_total", &cache), 1);
    assert_eq!(counter("cache_hit_total", &cache), 10);
    assert_eq!(histogram("cache_refresh_duration_seconds", &cache), [0.05]);
    assert_eq!(gauge("singleflight_waiters", &cache), 0.0);
    assert_eq!(gauge("inflight_refresh_count", &cache), 0.0);
}

#[tokio::test(start_paused = true)]
async fn the_gauges_show_the_callers_waiting_and_the_loads_running() {
    telemetry();
    #[cached(ttl = "60s", name = "obs::gauges")]
    async fn slow(id: u64) -> u64 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        id
    }

    let cache = [("cache", "obs::gauges")];
    let calls: Vec<_> = (0..5).map(|_| tokio::spawn(slow(1))).collect();
    eventually("5 waiters", || gauge("singleflight_waiters", &cache) == 5.0).await;
    assert_eq!(gauge("inflight_refresh_count", &cache), 1.0);
    assert_eq!(stampede::stats("obs::gauges").unwrap().waiters, 5);

    calls[0].abort(); // a caller that gives up stops waiting at once
    eventually("4 waiters", || gauge("singleflight_waiters", &cache) == 4.0).await;
    for call in calls.into_iter().skip(1) {
        assert_eq!(within(call).await.unwrap(), 1);
    }
    assert_eq!(gauge("singleflight_waiters", &cache), 0.0);
    assert_eq!(gauge("inflight_refresh_count", &cache), 0.0);
}

#[tokio::test(start_paused = true)]
async fn refreshes_errors_and_timeouts_are_counted() {
    telemetry();
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(
        ttl = "10s",
        jitter = 0,
        stale = "60s",
        timeout = "100ms",
        name = "obs::failing"
    )]
    async fn rate(currency: &str) -> Result<u64, AppError> {
        match LOADS.fetch_add(1, SeqCst) {
            0 => Ok(1),
            1 => Err(AppError::Db(format!("{currency}: no quote"))),
            _ => {
                tokio::time::sleep(Duration::from_secs(1)).await;
                Ok(2)
            }
        }
    }

    let cache = [("cache", "obs::failing")];
    assert_eq!(within(rate("EUR")).await.unwrap(), 1);
    tokio::time::advance(Duration::from_secs(11)).await;
    assert_eq!(
        within(rate("EUR")).await.unwrap(),
        1,
        "stale, while a refresh fails"
    );
    eventually("the failed refresh", || {
        counter("cache_refresh_error_total", &cache) == 1
    })
    .await;
    assert_eq!(
        within(rate("EUR")).await.unwrap(),
        1,
        "stale, while a refresh times out"
    );
    eventually("the timed-out refresh", || {
        counter("cache_refresh_timeout_total", &cache) == 1
    })
    .await;

    assert_eq!(counter("cache_stale_served_total", &cache), 2);
    assert_eq!(
        counter(
            "cache_refresh_total",
            &[("cache", "obs::failing"), ("reason", "stale")]
        ),
        2
    );
    assert_eq!(
        counter("cache_refresh_error_total", &cache),
        2,
        "the error and the timeout"
    );
}

#[tokio::test]
async fn a_detached_load_has_a_span_that_follows_the_request_that_started_it() {
    telemetry();
    #[cached(ttl = "60s", name = "obs::spans")]
    async fn order(id: u64) -> String {
        format!("order {id}")
    }

    let request = tracing::info_span!("request");
    within(order(7).instrument(request)).await;
    within(order(7)).await;

    eventually("the refresh span to close", || {
        !spans("stampede.refresh", "obs::spans").is_empty()
    })
    .await;
    let refresh = &spans("stampede.refresh", "obs::spans")[0];
    assert_eq!(refresh.fields["reason"], "miss");
    assert_eq!(refresh.fields["outcome"], "ok");
    assert_eq!(refresh.fields["key"], "(7,)");
    assert!(refresh.fields.contains_key("duration_ms"), "{refresh:?}");
    assert_eq!(
        refresh.follows,
        ["request"],
        "linked to the request though it runs detached"
    );

    let lookups = spans("stampede.lookup", "obs::spans");
    let outcomes: Vec<&str> = lookups
        .iter()
        .map(|span| span.fields["outcome"].as_str())
        .collect();
    assert_eq!(outcomes, ["miss", "hit"]);
    assert_eq!(lookups[0].parent.as_deref(), Some("request"));
}

/// `#[tracing::instrument]` beneath `#[cached]` wraps the call's future, as it wraps an `async
/// fn`'s: the lookups of its calls, a miss and then a hit, are spans inside its span.
#[tokio::test]
async fn instrument_beneath_cached_spans_each_call() {
    telemetry();
    #[cached(ttl = "60s", name = "obs::instrumented")]
    #[tracing::instrument]
    async fn invoice(id: u64) -> String {
        format!("invoice {id}")
    }

    within(invoice(3)).await;
    within(invoice(3)).await;
    let lookups: Vec<(String, Option<String>)> = spans("stampede.lookup", "obs::instrumented")
        .into_iter()
        .map(|span| (span.fields["outcome"].clone(), span.parent))
        .collect();
    let inside = Some("invoice".to_owned());
    assert_eq!(
        lookups,
        [
            ("miss".to_owned(), inside.clone()),
            ("hit".to_owned(), inside)
        ]
    );
}

#[tokio::test]
async fn redis_locks_waits_and_failures_are_counted_and_warned_once() {
    telemetry();
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", lock = "redis", redis = "obs", name = "obs::redis")]
    async fn in_a(id: u64) -> u64 {
        LOADS.fetch_add(1, SeqCst);
        tokio::time::sleep(Duration::from_millis(200)).await;
        id
    }
    #[cached(ttl = "60s", lock = "redis", redis = "obs", name = "obs::redis")]
    async fn in_b(id: u64) -> u64 {
        LOADS.fetch_add(1, SeqCst);
        id
    }

    let mut server = RedisServer::start();
    RedisConfig::new(&server.url())
        .unwrap()
        .prefix("obs")
        .cooldown(Duration::from_secs(60), 2)
        .install_as("obs");
    let (a, b) = tokio::join!(tokio::spawn(in_a(1)), async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        in_b(1).await
    });
    assert_eq!((a.unwrap(), b), (1, 1));

    let cache = [("cache", "obs::redis"), ("backend", "tiered")];
    assert_eq!(counter("redis_lock_acquire_success_total", &cache), 1);
    assert_eq!(counter("redis_lock_acquire_fail_total", &cache), 1);
    let waited = histogram("redis_lock_wait_duration_seconds", &cache);
    assert_eq!(waited.len(), 1);
    assert!(waited[0] > 0.05 && waited[0] < 1.0, "waited {waited:?}");

    server.kill();
    for id in 2..32 {
        assert_eq!(within(in_a(id)).await, id, "calls go on without Redis");
    }
    let connection = [("redis", "obs")];
    assert!(counter("redis_error_total", &connection) >= 2);
    assert_eq!(gauge("cache_degraded", &connection), 1.0);
    assert_eq!(counter("cache_degraded_load_total", &cache), 30);
    let warnings = telemetry().1.warnings.lock().unwrap();
    let ours = warnings
        .iter()
        .filter(|fields| fields.get("redis").is_some_and(|r| r == "obs"))
        .count();
    assert_eq!(ours, 1, "one warning per interval, not one per call");
}

#[tokio::test(start_paused = true)]
async fn stats_name_the_hot_keys_and_serialize_for_a_debug_page() {
    telemetry();
    #[cached(ttl = "60s", name = "obs::hot")]
    async fn page(slug: &str) -> String {
        format!("page {slug}")
    }

    for slug in ["home", "pricing", "about"] {
        within(page(slug)).await;
    }
    tokio::time::advance(Duration::from_secs(5)).await;
    for _ in 0..1_000 {
        within(page("home")).await;
    }
    for _ in 0..200 {
        within(page("pricing")).await;
    }

    let stats = stampede::stats("obs::hot").unwrap();
    let hot: Vec<&str> = stats.hot_keys.iter().map(|hot| hot.key.as_str()).collect();
    assert_eq!(
        hot[..2],
        ["(\"home\",)", "(\"pricing\",)"],
        "most hit first: {:?}",
        stats.hot_keys
    );
    assert!(stats.hot_keys[0].hits >= 900, "{:?}", stats.hot_keys);
    assert_eq!(stats.hot_keys[0].age, Duration::from_secs(5));

    let listed = serde_json::to_value(stampede::caches()).unwrap();
    let ours = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|cache| cache["config"]["name"] == "obs::hot")
        .expect("caches() lists the cache");
    assert_eq!(ours["config"]["ttl_ms"], 60_000);
    assert_eq!(ours["config"]["lock"], "local");
    assert_eq!(ours["stats"]["hits"], 1_200);
    assert_eq!(ours["stats"]["hot_keys"][0]["age_ms"], 5_000);
}

#[tokio::test(start_paused = true)]
async fn the_breaker_gauge_reads_closed_once_the_cooldown_has_passed_on_a_cache_nobody_calls() {
    telemetry();

    #[cached(
        ttl = "60s",
        breaker = 1,
        breaker_cooldown = "30s",
        name = "obs::breaker_gauge"
    )]
    async fn account(id: u64) -> Result<u64, AppError> {
        Err(AppError::Db(format!("account {id}: down")))
    }

    let cache = [("cache", "obs::breaker_gauge")];
    assert!(within(account(1)).await.is_err());
    assert_eq!(
        gauge("cache_breaker_open", &cache),
        1.0,
        "open after one failed load"
    );
    tokio::time::sleep(Duration::from_secs(29)).await;
    assert_eq!(gauge("cache_breaker_open", &cache), 1.0, "cooling down");
    tokio::time::sleep(Duration::from_secs(2)).await; // nobody calls it meanwhile
    assert_eq!(
        gauge("cache_breaker_open", &cache),
        0.0,
        "the cool-down has passed"
    );
    assert!(!stampede::stats("obs::breaker_gauge").unwrap().breaker_open);
}

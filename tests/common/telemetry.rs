//! What the production-server tests (`redis_acl.rs`, `redis_tls.rs`, ...) read of a cache's
//! telemetry: one metrics recorder and one tracing layer for the whole test binary (both are
//! process-wide), from which each test reads only its own connection's counters and errors.
//! Installed only by the tests that call [`install`].

use std::collections::HashMap;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Mutex, OnceLock};

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use metrics_util::registry::{AtomicStorage, Registry};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// The recorder and the error events, installed by the first test that asks.
struct Installed {
    metrics: Arc<Registry<Key, AtomicStorage>>,
    errors: Arc<Mutex<Vec<HashMap<String, String>>>>,
}

fn installed() -> &'static Installed {
    static INSTALLED: OnceLock<Installed> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let metrics = Arc::new(Registry::atomic());
        metrics::set_global_recorder(Kept(metrics.clone()))
            .expect("a recorder was installed already");
        let errors = Arc::new(Mutex::new(Vec::new()));
        let subscriber = tracing_subscriber::registry().with(Errors(errors.clone()));
        tracing::subscriber::set_global_default(subscriber)
            .expect("a subscriber was installed already");
        Installed { metrics, errors }
    })
}

/// Installs the recorder and the layer; call it before the test's first cache call, so that
/// every counter of the test is registered with them.
pub fn install() {
    installed();
}

/// The sum of the counters named `name` with every one of `labels`.
pub fn counter(name: &str, labels: &[(&str, &str)]) -> u64 {
    installed()
        .metrics
        .get_counter_handles()
        .iter()
        .filter(|(key, _)| {
            key.name() == name
                && labels.iter().all(|(k, v)| {
                    key.labels()
                        .any(|label| label.key() == *k && label.value() == *v)
                })
        })
        .map(|(_, value)| value.load(SeqCst))
        .sum()
}

/// The fields of every error-level event logged so far whose `redis` field is `connection`.
pub fn errors_of(connection: &str) -> Vec<HashMap<String, String>> {
    errors_with("redis", connection)
}

/// The fields of every error-level event logged so far whose field `field` is `value`.
pub fn errors_with(field: &str, value: &str) -> Vec<HashMap<String, String>> {
    installed()
        .errors
        .lock()
        .unwrap()
        .iter()
        .filter(|fields| fields.get(field).is_some_and(|v| v == value))
        .cloned()
        .collect()
}

struct Kept(Arc<Registry<Key, AtomicStorage>>);

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

struct Errors(Arc<Mutex<Vec<HashMap<String, String>>>>);

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

impl<S: Subscriber> Layer<S> for Errors {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        if *event.metadata().level() == tracing::Level::ERROR {
            let mut fields = HashMap::new();
            event.record(&mut Fields(&mut fields));
            self.0.lock().unwrap().push(fields);
        }
    }
}

//! The shapes users write: methods on `&self`, borrowed arguments, `Option` and `Result`
//! returns, key templates, a renamed crate, and futures that can be spawned.

mod common;

extern crate stampede as renamed_stampede;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

use common::{AppError, within};
use stampede::cached;

/// A repository handle as services hold them: cheap to clone, shared state behind an `Arc`.
#[derive(Clone)]
struct Users {
    queries: Arc<AtomicUsize>,
    region: &'static str,
}

impl Users {
    #[cached(ttl = "60s", name = "shapes::users")]
    async fn name(&self, id: u64) -> String {
        self.queries.fetch_add(1, SeqCst);
        format!("user {id} from {}", self.region)
    }
}

#[tokio::test]
async fn a_method_on_self_is_cached_by_its_arguments_only() {
    let queries = Arc::new(AtomicUsize::new(0));
    let eu = Users {
        queries: queries.clone(),
        region: "eu",
    };
    let us = Users {
        queries: queries.clone(),
        region: "us",
    };

    assert_eq!(within(eu.name(1)).await, "user 1 from eu");
    assert_eq!(within(eu.name(1)).await, "user 1 from eu");
    // The receiver is not part of the key: another handle shares the cached value.
    assert_eq!(within(us.name(1)).await, "user 1 from eu");
    assert_eq!(within(us.name(2)).await, "user 2 from us");
    assert_eq!(queries.load(SeqCst), 2);
    assert!(
        stampede::caches()
            .iter()
            .any(|c| &*c.config.name == "shapes::users")
    );
}

#[derive(Clone)]
struct Catalog;

impl Catalog {
    #[cached(ttl = "60s")]
    async fn title(&self, id: u64) -> String {
        format!("title {id}")
    }
}

#[tokio::test]
async fn a_method_cache_is_named_after_its_type() {
    within(Catalog.title(1)).await;
    assert!(
        stampede::stats("shapes::Catalog::title").is_some(),
        "{:?}",
        stampede::caches()
    );
}

#[tokio::test]
async fn borrowed_arguments_are_keyed_by_their_contents() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s")]
    async fn greeting(name: &str, tags: &[u8], mut times: u32) -> String {
        LOADS.fetch_add(1, SeqCst);
        times += 1;
        format!("hello {name} {tags:?} x{times}")
    }

    let (owned_name, owned_tags) = (String::from("ann"), vec![1, 2]);
    assert_eq!(
        within(greeting("ann", &[1, 2], 1)).await,
        "hello ann [1, 2] x2"
    );
    assert_eq!(
        within(greeting(&owned_name, &owned_tags, 1)).await,
        "hello ann [1, 2] x2"
    );
    assert_eq!(LOADS.load(SeqCst), 1);
    assert_eq!(
        within(greeting("bob", &[1, 2], 1)).await,
        "hello bob [1, 2] x2"
    );
    assert_eq!(LOADS.load(SeqCst), 2);
}

#[tokio::test]
async fn none_is_cached_like_a_value() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s")]
    async fn find(email: String) -> Option<u64> {
        LOADS.fetch_add(1, SeqCst);
        (email == "ann@example.com").then_some(1)
    }

    assert_eq!(within(find("nobody@example.com".into())).await, None);
    assert_eq!(within(find("nobody@example.com".into())).await, None);
    assert_eq!(within(find("ann@example.com".into())).await, Some(1));
    assert_eq!(LOADS.load(SeqCst), 2);
}

#[tokio::test]
async fn only_ok_results_are_cached() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s")]
    async fn parse(text: &'static str) -> Result<u64, AppError> {
        LOADS.fetch_add(1, SeqCst);
        let number = text
            .parse()
            .map_err(|_| AppError::Db(format!("not a number: {text}")))?;
        Ok(number)
    }

    assert_eq!(within(parse("42")).await.unwrap(), 42);
    assert_eq!(within(parse("42")).await.unwrap(), 42);
    assert!(matches!(within(parse("x")).await, Err(AppError::Db(m)) if m == "not a number: x"));
    assert!(within(parse("x")).await.is_err());
    assert_eq!(
        LOADS.load(SeqCst),
        3,
        "one load for 42, one per failed call"
    );
}

#[tokio::test]
async fn a_key_template_picks_the_arguments_that_form_the_key() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", key = "order:{id}")]
    async fn order(request_id: &str, id: u64) -> String {
        LOADS.fetch_add(1, SeqCst);
        format!("order {id} (first asked by {request_id})")
    }

    assert_eq!(
        within(order("req-1", 7)).await,
        "order 7 (first asked by req-1)"
    );
    assert_eq!(
        within(order("req-2", 7)).await,
        "order 7 (first asked by req-1)"
    );
    assert_eq!(
        within(order("req-3", 8)).await,
        "order 8 (first asked by req-3)"
    );
    assert_eq!(LOADS.load(SeqCst), 2);
}

#[tokio::test]
async fn a_function_without_arguments_has_one_entry() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s")]
    async fn feature_flags() -> Vec<&'static str> {
        LOADS.fetch_add(1, SeqCst);
        vec!["dark-mode"]
    }

    assert_eq!(within(feature_flags()).await, ["dark-mode"]);
    assert_eq!(within(feature_flags()).await, ["dark-mode"]);
    assert_eq!(LOADS.load(SeqCst), 1);
}

#[cached(ttl = "60s", crate = "renamed_stampede")]
async fn through_a_renamed_crate(id: u64) -> u64 {
    id + 1
}

#[tokio::test]
async fn the_crate_option_names_a_renamed_dependency() {
    assert_eq!(within(through_a_renamed_crate(1)).await, 2);
}

#[tokio::test]
async fn a_call_with_owned_arguments_is_a_send_static_future() {
    #[cached(ttl = "60s")]
    async fn double(n: u64) -> u64 {
        n * 2
    }

    fn spawnable<F: std::future::Future + Send + 'static>(future: F) -> F {
        future
    }
    assert_eq!(
        within(tokio::spawn(spawnable(double(21)))).await.unwrap(),
        42
    );
}

#[tokio::test]
async fn the_longest_durations_the_attribute_accepts_work() {
    #[cached(ttl = "500years", stale = "500years", timeout = "500years")]
    async fn forever(id: u64) -> u64 {
        id
    }

    assert_eq!(within(forever(1)).await, 1);
    assert_eq!(within(forever(1)).await, 1);
}

/// Eight arguments, which clippy finds too many: the user's own `allow` on the function covers
/// its companion's operations (which take the same arguments), and the generated code carries
/// no `allow` of its own. A method's companion, of which only some operations are called, is
/// no dead code either: `cargo clippy --all-targets -- -D warnings` checks both.
#[allow(clippy::too_many_arguments)]
#[cached(ttl = "60s")]
async fn wide(a: u8, b: u8, c: u8, d: u8, e: u8, f: u8, g: u8, h: u8) -> u32 {
    [a, b, c, d, e, f, g, h].iter().map(|&x| u32::from(x)).sum()
}

#[derive(Clone)]
struct Ledger;

impl Ledger {
    #[cached(ttl = "60s", companion = true)]
    async fn balance(&self, account: u64) -> u64 {
        account * 10
    }
}

#[tokio::test]
async fn a_wide_function_and_a_partly_used_method_companion_build_without_warnings() {
    assert_eq!(within(wide(1, 2, 3, 4, 5, 6, 7, 8)).await, 36);
    assert_eq!(within(wide::uncached(1, 1, 1, 1, 1, 1, 1, 1)).await, 8);
    assert_eq!(within(Ledger.balance(4)).await, 40);
    assert_eq!(Ledger::balance_peek(4), Some(40));
}

/// A free function whose arguments are all owned, one of them `mut` and one left out of the
/// key: its calls, `refresh` and `read_through` reach the body with the arguments as written
/// (the expansion hands the body's future to the load as it is, and the three share one call
/// on the runtime), and it builds without warnings.
#[tokio::test]
async fn owned_arguments_reach_the_body_through_the_call_refresh_and_read_through() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", key = "{id}")]
    async fn scaled(id: u64, mut factor: u64) -> Result<u64, AppError> {
        LOADS.fetch_add(1, SeqCst);
        factor *= 10;
        Ok(id * factor)
    }

    assert_eq!(within(scaled(2, 3)).await.unwrap(), 60);
    assert_eq!(
        within(scaled(2, 5)).await.unwrap(),
        60,
        "the factor is not part of the key: a hit"
    );
    assert_eq!(within(scaled::refresh(2, 5)).await.unwrap(), 100);
    assert_eq!(
        within(scaled(2, 3)).await.unwrap(),
        100,
        "the refreshed value"
    );
    // Memory alone: `read_through` is the key's load, as if memory held nothing.
    assert_eq!(within(scaled::read_through(2, 7)).await.unwrap(), 140);
    assert_eq!(
        within(scaled(2, 3)).await.unwrap(),
        140,
        "the value read through"
    );
    assert_eq!(LOADS.load(SeqCst), 3);
}

/// A call does nothing until it is awaited, as an `async fn`'s call: a call made before a
/// `prime` and awaited after it gets the primed value, and a call dropped without being awaited
/// loads nothing.
#[tokio::test]
async fn a_call_looks_up_its_value_when_awaited_not_when_made() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s")]
    async fn label(id: u64) -> String {
        LOADS.fetch_add(1, SeqCst);
        format!("loaded {id}")
    }

    within(label::prime(1, "first".to_owned())).await.unwrap();
    let call = label(1);
    within(label::prime(1, "second".to_owned())).await.unwrap();
    assert_eq!(within(call).await, "second");

    drop(label(2));
    tokio::task::yield_now().await;
    assert_eq!(LOADS.load(SeqCst), 0, "nothing was loaded");
    assert_eq!(label::peek(2), None);
}

/// A handle whose clones are counted: the load's context copies it, a hit must not.
struct Counted {
    clones: Arc<AtomicUsize>,
    label: String,
}

impl Clone for Counted {
    fn clone(&self) -> Self {
        self.clones.fetch_add(1, SeqCst);
        Counted {
            clones: self.clones.clone(),
            label: self.label.clone(),
        }
    }
}

#[derive(Clone)]
struct Flaky {
    handle: Counted,
    attempts: Arc<AtomicUsize>,
}

impl Flaky {
    /// Fails its first attempt of each load, then answers from the receiver and from the
    /// arguments left out of the key (one borrowed, one owned).
    #[cached(ttl = "60s", key = "{id}", retries = 1, backoff = "1ms")]
    async fn label(&self, id: u64, note: &Counted, owned: Counted) -> Result<String, AppError> {
        if self.attempts.fetch_add(1, SeqCst) % 2 == 0 {
            return Err(AppError::Db("flaky".into()));
        }
        Ok(format!(
            "{id} {} {} {}",
            self.handle.label, note.label, owned.label
        ))
    }
}

#[tokio::test]
async fn a_hit_copies_nothing_and_each_attempt_gets_the_receiver_and_left_out_arguments() {
    let clones = Arc::new(AtomicUsize::new(0));
    let counted = |label: &str| Counted {
        clones: clones.clone(),
        label: label.to_owned(),
    };
    let repo = Flaky {
        handle: counted("repo"),
        attempts: Arc::new(AtomicUsize::new(0)),
    };
    let note = counted("note");

    // A miss: the first attempt fails, the retry sees every argument as it was given.
    let miss = within(repo.label(1, &note, counted("owned"))).await;
    assert_eq!(miss.unwrap(), "1 repo note owned");
    assert_eq!(repo.attempts.load(SeqCst), 2);
    let after_miss = clones.load(SeqCst);
    assert!(after_miss > 0, "the load works on copies");

    // A hit: the value, and not one copy of the receiver or of the other arguments.
    let hit = within(repo.label(1, &counted("other note"), counted("other"))).await;
    assert_eq!(hit.unwrap(), "1 repo note owned");
    assert_eq!(clones.load(SeqCst), after_miss, "a hit copies nothing");
    assert_eq!(repo.attempts.load(SeqCst), 2);
}

/// A free function whose owned argument is left out of the key: its call is deferred, and the
/// load's context owns that argument.
#[cached(ttl = "60s", key = "{id}")]
async fn priced(id: u64, currency: String) -> String {
    format!("{id} in {currency}")
}

#[tokio::test]
async fn an_owned_argument_left_out_of_the_key_reaches_the_load_of_a_deferred_call() {
    let call = priced(3, "EUR".to_owned());
    assert_eq!(within(call).await, "3 in EUR");
    // The key is the id alone: another currency is served the first call's value.
    assert_eq!(within(priced(3, "USD".to_owned())).await, "3 in EUR");
    // `refresh` loads again with the arguments it is given.
    assert_eq!(
        within(priced::refresh(3, "CHF".to_owned())).await,
        "3 in CHF"
    );
    assert_eq!(within(priced(3, "USD".to_owned())).await, "3 in CHF");
}

/// A store generic over its row type, whose associated functions have no receiver.
struct Rows<T>(std::marker::PhantomData<T>);

/// How many rows `Rows::fetch` read, of every row type.
static ROWS_READ: AtomicUsize = AtomicUsize::new(0);

impl<T: Default + Clone + Send + Sync + 'static> Rows<T> {
    fn fetch(id: u64) -> (u64, T) {
        ROWS_READ.fetch_add(1, SeqCst);
        (id * 10, T::default())
    }

    /// An associated function without a receiver: its attribute cannot tell it from a free
    /// function, so it goes without a companion, and its body names `Self` and the impl's `T`
    /// as any associated function's can.
    #[cached(ttl = "60s", name = "shapes::rows", companion = false)]
    async fn row(id: u64) -> (u64, T) {
        Self::fetch(id)
    }
}

#[tokio::test]
async fn an_associated_function_without_a_receiver_names_self_and_the_impls_parameters() {
    assert_eq!(within(Rows::<String>::row(4)).await, (40, String::new()));
    assert_eq!(within(Rows::<String>::row(4)).await, (40, String::new()));
    assert_eq!(ROWS_READ.load(SeqCst), 1, "the second call is a hit");
    assert_eq!(
        within(Rows::<u32>::row(4)).await,
        (40, 0),
        "another instantiation gets its own value"
    );
    assert_eq!(ROWS_READ.load(SeqCst), 2);

    // The instantiations share the cache's name: an invalidation by name reaches both.
    within(stampede::invalidate("shapes::rows", (4u64,)))
        .await
        .unwrap();
    assert_eq!(within(Rows::<String>::row(4)).await, (40, String::new()));
    assert_eq!(within(Rows::<u32>::row(4)).await, (40, 0));
    assert_eq!(ROWS_READ.load(SeqCst), 4, "both loaded again");
}

/// Where a store's prices come from: the impl's parameter, named in the body only.
trait Source: Send + Sync + 'static {
    fn price(id: u64) -> u64;
}

struct Tens;

impl Source for Tens {
    fn price(id: u64) -> u64 {
        id * 10
    }
}

struct Hundreds;

impl Source for Hundreds {
    fn price(id: u64) -> u64 {
        id * 100
    }
}

struct Prices<S>(std::marker::PhantomData<S>);

impl<S: Source> Prices<S> {
    /// Its key and value types are the same in every instantiation; its body is not.
    #[cached(ttl = "60s", companion = false)]
    async fn price(id: u64) -> u64 {
        S::price(id)
    }
}

#[tokio::test]
async fn instantiations_with_one_key_and_value_type_keep_their_own_values() {
    assert_eq!(within(Prices::<Tens>::price(3)).await, 30);
    assert_eq!(
        within(Prices::<Hundreds>::price(3)).await,
        300,
        "not the other instantiation's value"
    );
    assert_eq!(within(Prices::<Tens>::price(3)).await, 30);
    // Named as a method would be: its type's path, the instantiation included.
    let names: HashSet<_> = stampede::caches()
        .into_iter()
        .map(|cache| cache.config.name.to_string())
        .filter(|name| name.contains("Prices<"))
        .collect();
    assert_eq!(
        names,
        HashSet::from([
            "shapes::Prices<shapes::Tens>::price".to_owned(),
            "shapes::Prices<shapes::Hundreds>::price".to_owned(),
        ])
    );
}

//! Where the attribute goes: native async-fn-in-trait impls, `#[async_trait]` impls used through
//! `dyn Trait`, a trait's default method, functions in modules, impls of a generic type at one concrete type, and next to
//! the attributes users put on the same function (`#[doc]`, `#[must_use]`, `#[allow]`,
//! `#[tracing::instrument]` in either order), with `where` clauses and visibility.
//!
//! Methods on `&self` and borrowed arguments are in `shapes.rs`; what is refused is pinned in
//! `tests/ui`.

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

use async_trait::async_trait;
use common::{AppError, within};
use stampede::cached;

/// Counts the loads of one repository handle; cheap to clone, as a pool is.
#[derive(Clone, Default)]
struct Loads(Arc<AtomicUsize>);

impl Loads {
    fn record(&self) {
        self.0.fetch_add(1, SeqCst);
    }

    fn count(&self) -> usize {
        self.0.load(SeqCst)
    }
}

// ---- native async fn in a trait impl -------------------------------------------------------

trait Catalog {
    async fn title(&self, id: u32) -> String;
}

#[derive(Clone, Default)]
struct NativeCatalog {
    loads: Loads,
}

impl Catalog for NativeCatalog {
    #[cached(ttl = "60s", name = "placement::native")]
    async fn title(&self, id: u32) -> String {
        self.loads.record();
        format!("title {id}")
    }
}

#[tokio::test]
async fn a_native_async_trait_method_is_cached() {
    let catalog = NativeCatalog::default();
    assert_eq!(within(catalog.title(1)).await, "title 1");
    assert_eq!(within(catalog.title(1)).await, "title 1");
    assert_eq!(within(catalog.title(2)).await, "title 2");
    assert_eq!(catalog.loads.count(), 2);
}

// ---- #[async_trait] impls, used through dyn Trait -------------------------------------------

#[async_trait]
trait Users: Send + Sync {
    async fn name(&self, id: u32) -> Result<String, AppError>;
    async fn greeting(&self, name: &str, mut times: u32) -> String;
    async fn traced(&self, id: u32) -> u32;
    async fn traced_inside(&self, id: u32) -> u32;
}

#[derive(Clone, Default)]
struct DbUsers {
    loads: Loads,
}

#[async_trait]
impl Users for DbUsers {
    #[cached(ttl = "60s", name = "placement::dyn_name")]
    async fn name(&self, id: u32) -> Result<String, AppError> {
        self.loads.record();
        if id == 0 {
            return Err(AppError::Db("no user 0".into()));
        }
        Ok(format!("user {id}"))
    }

    /// A borrowed argument and a `mut` one, which `#[async_trait]` moves into its block.
    #[cached(ttl = "60s")]
    async fn greeting(&self, name: &str, mut times: u32) -> String {
        self.loads.record();
        times += 1;
        format!("hello {name} x{times}")
    }

    #[tracing::instrument(skip(self))]
    #[cached(ttl = "60s")]
    async fn traced(&self, id: u32) -> u32 {
        self.loads.record();
        id * 10
    }

    #[cached(ttl = "60s")]
    #[tracing::instrument(skip(self))]
    async fn traced_inside(&self, id: u32) -> u32 {
        self.loads.record();
        id * 100
    }
}

#[tokio::test]
async fn an_async_trait_method_is_cached_through_dyn_trait() {
    let users = DbUsers::default();
    let loads = users.loads.clone();
    let users: Arc<dyn Users> = Arc::new(users);

    // Concurrent callers of one cold key share one load, through the trait object.
    let calls: Vec<_> = (0..20)
        .map(|_| {
            let users = users.clone();
            tokio::spawn(async move { users.name(7).await })
        })
        .collect();
    for call in calls {
        assert_eq!(within(call).await.unwrap().unwrap(), "user 7");
    }
    assert_eq!(loads.count(), 1);

    // The error path of the boxed future: not cached, the original error comes back.
    assert!(matches!(within(users.name(0)).await, Err(AppError::Db(m)) if m == "no user 0"));
    assert!(within(users.name(0)).await.is_err());
    assert_eq!(loads.count(), 3);
    assert!(stampede::stats("placement::dyn_name").is_some());
}

#[tokio::test]
async fn an_async_trait_method_keeps_borrowed_and_mut_arguments() {
    let users = DbUsers::default();
    let users_dyn: &dyn Users = &users;
    let owned = String::from("ann");
    assert_eq!(within(users_dyn.greeting("ann", 1)).await, "hello ann x2");
    assert_eq!(within(users_dyn.greeting(&owned, 1)).await, "hello ann x2");
    assert_eq!(within(users_dyn.greeting("bob", 1)).await, "hello bob x2");
    assert_eq!(users.loads.count(), 2);
}

#[tokio::test]
async fn instrument_works_on_either_side_of_cached_in_an_async_trait_impl() {
    let users = DbUsers::default();
    let users_dyn: &dyn Users = &users;
    assert_eq!(within(users_dyn.traced(1)).await, 10);
    assert_eq!(within(users_dyn.traced(1)).await, 10);
    assert_eq!(within(users_dyn.traced_inside(1)).await, 100);
    assert_eq!(within(users_dyn.traced_inside(1)).await, 100);
    assert_eq!(users.loads.count(), 2);
}

// ---- a trait's default method ----------------------------------------------------------------

/// A default method is cached when the trait requires what the cache needs of `self`; without
/// those supertraits it is refused (tests/ui/default_method.rs).
trait Priced: Clone + Send + Sync + 'static {
    fn loads(&self) -> &Loads;
    fn base(&self) -> u32;

    #[cached(ttl = "60s")]
    async fn price(&self, id: u32) -> u32 {
        self.loads().record();
        self.base() + id
    }
}

#[derive(Clone, Default)]
struct Shop {
    loads: Loads,
}

impl Priced for Shop {
    fn loads(&self) -> &Loads {
        &self.loads
    }
    fn base(&self) -> u32 {
        100
    }
}

#[derive(Clone, Default)]
struct Market {
    loads: Loads,
}

impl Priced for Market {
    fn loads(&self) -> &Loads {
        &self.loads
    }
    fn base(&self) -> u32 {
        200
    }
}

#[tokio::test]
async fn a_default_method_is_cached_per_implementor() {
    let (shop, market) = (Shop::default(), Market::default());
    assert_eq!(within(shop.price(1)).await, 101);
    assert_eq!(within(shop.price(1)).await, 101);
    assert_eq!(within(market.price(1)).await, 201, "a cache of its own");
    assert_eq!(within(market.price(1)).await, 201);
    assert_eq!((shop.loads.count(), market.loads.count()), (1, 1));
    assert!(
        stampede::stats("placement::Shop::price").is_some(),
        "{:?}",
        stampede::caches()
    );
}

// ---- modules, and an impl of a generic type at one concrete type ----------------------------

mod inventory {
    pub mod stock {
        use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

        pub static LOADS: AtomicUsize = AtomicUsize::new(0);

        #[stampede::cached(ttl = "60s")]
        pub async fn level(sku: &str) -> u32 {
            LOADS.fetch_add(1, SeqCst);
            u32::try_from(sku.len()).unwrap_or(u32::MAX)
        }
    }
}

#[tokio::test]
async fn a_function_in_a_module_is_cached_under_its_module_path() {
    assert_eq!(within(inventory::stock::level("abc")).await, 3);
    assert_eq!(within(inventory::stock::level("abc")).await, 3);
    assert_eq!(inventory::stock::LOADS.load(SeqCst), 1);
    assert!(
        stampede::stats("placement::inventory::stock::level").is_some(),
        "{:?}",
        stampede::caches()
    );
}

#[derive(Clone)]
struct Postgres;
#[derive(Clone)]
struct Sqlite;

#[derive(Clone)]
struct Repo<Db> {
    db: Db,
    loads: Loads,
}

impl Repo<Postgres> {
    #[cached(ttl = "60s")]
    async fn find(&self, id: u32) -> String {
        let Postgres = self.db;
        self.loads.record();
        format!("pg {id}")
    }
}

impl Repo<Sqlite> {
    #[cached(ttl = "60s")]
    async fn find(&self, id: u32) -> String {
        let Sqlite = self.db;
        self.loads.record();
        format!("sqlite {id}")
    }
}

#[tokio::test]
async fn impls_of_a_generic_type_at_concrete_types_have_their_own_caches() {
    let loads = Loads::default();
    let pg = Repo {
        db: Postgres,
        loads: loads.clone(),
    };
    let lite = Repo {
        db: Sqlite,
        loads: loads.clone(),
    };
    assert_eq!(within(pg.find(1)).await, "pg 1");
    assert_eq!(within(pg.find(1)).await, "pg 1");
    assert_eq!(within(lite.find(1)).await, "sqlite 1");
    assert_eq!(within(lite.find(1)).await, "sqlite 1");
    assert_eq!(loads.count(), 2);
    let names: Vec<String> = stampede::caches()
        .iter()
        .map(|c| c.config.name.to_string())
        .collect();
    assert!(
        names
            .iter()
            .any(|n| n.ends_with("Repo<placement::Postgres>::find")),
        "{names:?}"
    );
    assert!(
        names
            .iter()
            .any(|n| n.ends_with("Repo<placement::Sqlite>::find")),
        "{names:?}"
    );
}

// ---- the attributes users put next to it ----------------------------------------------------

pub mod api {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

    pub static LOADS: AtomicUsize = AtomicUsize::new(0);

    /// The price of a product, in cents.
    #[must_use]
    #[allow(clippy::needless_pass_by_value)]
    #[stampede::cached(ttl = "60s")]
    pub async fn price(sku: String) -> u64 {
        LOADS.fetch_add(1, SeqCst);
        sku.len() as u64 * 100
    }

    #[stampede::cached(ttl = "60s")]
    #[tracing::instrument]
    pub(crate) async fn traced(id: u64) -> u64 {
        LOADS.fetch_add(1, SeqCst);
        id + 1
    }

    #[tracing::instrument(level = "debug")]
    #[stampede::cached(ttl = "60s")]
    pub(crate) async fn traced_outside(id: u64) -> u64 {
        LOADS.fetch_add(1, SeqCst);
        id + 2
    }
}

#[tokio::test]
async fn doc_must_use_allow_visibility_and_instrument_are_kept() {
    let before = api::LOADS.load(SeqCst);
    assert_eq!(within(api::price("ab".into())).await, 200);
    assert_eq!(within(api::price("ab".into())).await, 200);
    assert_eq!(within(api::traced(1)).await, 2);
    assert_eq!(within(api::traced(1)).await, 2);
    assert_eq!(within(api::traced_outside(1)).await, 3);
    assert_eq!(within(api::traced_outside(1)).await, 3);
    assert_eq!(api::LOADS.load(SeqCst) - before, 3);
}

trait Label {
    fn label(&self) -> String;
}

impl Label for u32 {
    fn label(&self) -> String {
        format!("#{self}")
    }
}

#[derive(Clone, Default)]
struct Labels<T> {
    loads: Loads,
    _of: std::marker::PhantomData<T>,
}

impl<T> Labels<T>
where
    T: Label + Clone + std::fmt::Debug + std::hash::Hash + Eq + Send + Sync + 'static,
{
    /// A `where` clause on the impl, and one on the method.
    #[cached(ttl = "60s")]
    async fn of(&self, item: T) -> String
    where
        Self: Clone + Send + Sync,
    {
        self.loads.record();
        item.label()
    }
}

#[tokio::test]
async fn where_clauses_are_kept() {
    let labels = Labels::<u32>::default();
    assert_eq!(within(labels.of(5)).await, "#5");
    assert_eq!(within(labels.of(5)).await, "#5");
    assert_eq!(labels.loads.count(), 1);
}

// ---- a written name, in impls and a trait's default method ----------------------------------

/// A default method given a name: each implementor's cache is the name followed by its type.
trait Rated: Clone + Send + Sync + 'static {
    fn base(&self) -> u32;

    #[cached(ttl = "60s", name = "placement::rate")]
    async fn rate(&self, id: u32) -> u32 {
        self.base() + id
    }
}

impl Rated for Shop {
    fn base(&self) -> u32 {
        10
    }
}

impl Rated for Market {
    fn base(&self) -> u32 {
        20
    }
}

impl Repo<Postgres> {
    /// A concrete impl of a generic type: the name as written.
    #[cached(ttl = "60s", name = "placement::count")]
    async fn count(&self, id: u32) -> u32 {
        id
    }
}

fn names_from(prefix: &str) -> HashSet<String> {
    stampede::caches()
        .into_iter()
        .map(|cache| cache.config.name.to_string())
        .filter(|name| name.starts_with(prefix))
        .collect()
}

#[tokio::test]
async fn a_written_name_tells_implementors_apart_and_stays_as_written_in_a_concrete_impl() {
    let (shop, market) = (Shop::default(), Market::default());
    assert_eq!(within(shop.rate(1)).await, 11);
    assert_eq!(within(market.rate(1)).await, 21);
    assert_eq!(
        names_from("placement::rate"),
        HashSet::from([
            "placement::rate<placement::Shop>".to_owned(),
            "placement::rate<placement::Market>".to_owned(),
        ])
    );
    let stats = stampede::stats("placement::rate").unwrap();
    assert_eq!(stats.loads, 2, "a lookup by the written name reaches both");

    let pg = Repo {
        db: Postgres,
        loads: Loads::default(),
    };
    assert_eq!(within(pg.count(4)).await, 4);
    assert_eq!(
        names_from("placement::count"),
        HashSet::from(["placement::count".to_owned()])
    );
}

/// A default method without a receiver: its body names `Self`, which each implementor's cache
/// follows, named or not.
trait Sourced: Send + Sync + 'static {
    const BASE: u32;

    #[cached(ttl = "60s", companion = false)]
    async fn sourced(id: u32) -> u32 {
        Self::BASE + id
    }

    #[cached(ttl = "60s", companion = false, name = "placement::named_source")]
    async fn named_source(id: u32) -> u32 {
        Self::BASE + id
    }
}

impl Sourced for Shop {
    const BASE: u32 = 1000;
}

impl Sourced for Market {
    const BASE: u32 = 2000;
}

#[tokio::test]
async fn a_default_method_without_a_receiver_is_cached_per_implementor() {
    assert_eq!(within(Shop::sourced(1)).await, 1001);
    assert_eq!(within(Market::sourced(1)).await, 2001, "a cache of its own");
    assert_eq!(within(Shop::named_source(1)).await, 1001);
    assert_eq!(
        within(Market::named_source(1)).await,
        2001,
        "a cache of its own"
    );
    let sourced: HashSet<_> = names_from("<placement::")
        .into_iter()
        .filter(|name| name.ends_with(">::sourced"))
        .collect();
    assert_eq!(
        sourced,
        HashSet::from([
            "<placement::Shop as placement::Sourced>::sourced".to_owned(),
            "<placement::Market as placement::Sourced>::sourced".to_owned(),
        ])
    );
    assert_eq!(
        names_from("placement::named_source"),
        HashSet::from([
            "placement::named_source<placement::Shop>".to_owned(),
            "placement::named_source<placement::Market>".to_owned(),
        ])
    );
}

// ---- a trait impl whose parameter only its trait has -----------------------------------------

trait Tagged: Send + Sync + 'static {
    const BASE: u32;
}

struct Euro;

impl Tagged for Euro {
    const BASE: u32 = 100;
}

struct Pound;

impl Tagged for Pound {
    const BASE: u32 = 200;
}

trait Book<U> {
    fn entry(&self, id: u32) -> impl std::future::Future<Output = u32> + Send;
    fn named_entry(&self, id: u32) -> impl std::future::Future<Output = u32> + Send;
}

#[derive(Clone)]
struct Ledger;

impl<U: Tagged> Book<U> for Ledger {
    /// One `Self` for every `U`, and one key and value type: only the trait tells them apart.
    #[cached(ttl = "60s")]
    async fn entry(&self, id: u32) -> u32 {
        U::BASE + id
    }

    #[cached(ttl = "60s", name = "placement::book")]
    async fn named_entry(&self, id: u32) -> u32 {
        U::BASE + id
    }
}

#[tokio::test]
async fn a_trait_impls_parameter_only_its_trait_has_gets_a_cache_per_instantiation() {
    let ledger = Ledger;
    assert_eq!(within(<Ledger as Book<Euro>>::entry(&ledger, 1)).await, 101);
    assert_eq!(
        within(<Ledger as Book<Pound>>::entry(&ledger, 1)).await,
        201,
        "not the other instantiation's value"
    );
    assert_eq!(
        within(<Ledger as Book<Euro>>::named_entry(&ledger, 1)).await,
        101
    );
    assert_eq!(
        within(<Ledger as Book<Pound>>::named_entry(&ledger, 1)).await,
        201
    );
    let entries: HashSet<_> = names_from("<placement::Ledger as ")
        .into_iter()
        .filter(|name| name.ends_with(">::entry"))
        .collect();
    assert_eq!(
        entries,
        HashSet::from([
            "<placement::Ledger as placement::Book<placement::Euro>>::entry".to_owned(),
            "<placement::Ledger as placement::Book<placement::Pound>>::entry".to_owned(),
        ])
    );
    assert_eq!(
        names_from("placement::book"),
        HashSet::from([
            "placement::book<placement::Euro>".to_owned(),
            "placement::book<placement::Pound>".to_owned(),
        ])
    );
}

/// The same under `#[async_trait]`, used through `dyn Journal<U>`.
#[async_trait]
trait Journal<U> {
    async fn line(&self, id: u32) -> u32;
}

#[async_trait]
impl<U: Tagged> Journal<U> for Ledger {
    #[cached(ttl = "60s")]
    async fn line(&self, id: u32) -> u32 {
        U::BASE + id
    }
}

#[tokio::test]
async fn an_async_trait_impls_parameter_only_its_trait_has_gets_a_cache_per_instantiation() {
    let (euros, pounds): (&dyn Journal<Euro>, &dyn Journal<Pound>) = (&Ledger, &Ledger);
    assert_eq!(within(euros.line(1)).await, 101);
    assert_eq!(within(pounds.line(1)).await, 201, "not the other's value");
    assert_eq!(within(euros.line(1)).await, 101);
}

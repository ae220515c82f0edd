//! A cached free function's companion: `product::invalidate`, `invalidate_found`, `refresh`,
//! `prime`, `peek` and `uncached`, on a memory cache and across two caches of one name over Redis
//! (two processes).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

use common::{AppError, within};
use stampede::cached;

#[tokio::test]
async fn each_operation_on_a_memory_cache() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", name = "handle::memory")]
    async fn product(id: u64, region: &str) -> Result<String, AppError> {
        let n = LOADS.fetch_add(1, SeqCst) + 1;
        Ok(format!("{id}@{region}#{n}"))
    }

    // Nothing held yet: `peek` does not load.
    assert_eq!(product::peek(1, "eu"), None);
    assert_eq!(LOADS.load(SeqCst), 0);

    assert_eq!(within(product(1, "eu")).await.unwrap(), "1@eu#1");
    assert_eq!(product::peek(1, "eu").as_deref(), Some("1@eu#1"));
    assert_eq!(product::peek(1, "us"), None, "another key");

    // `refresh` loads although the value is fresh, stores it and returns it.
    assert_eq!(within(product::refresh(1, "eu")).await.unwrap(), "1@eu#2");
    assert_eq!(within(product(1, "eu")).await.unwrap(), "1@eu#2");
    assert_eq!(LOADS.load(SeqCst), 2);

    // `invalidate` drops it: the next call loads.
    within(product::invalidate(1, "eu")).await.unwrap();
    assert_eq!(product::peek(1, "eu"), None);
    assert_eq!(within(product(1, "eu")).await.unwrap(), "1@eu#3");

    // `prime` stores a value as if loaded: calls get it without a load.
    within(product::prime(2, "eu", "primed".to_owned()))
        .await
        .unwrap();
    assert_eq!(product::peek(2, "eu").as_deref(), Some("primed"));
    assert_eq!(within(product(2, "eu")).await.unwrap(), "primed");
    assert_eq!(LOADS.load(SeqCst), 3);

    // `uncached` runs the body and touches no cache.
    assert_eq!(within(product::uncached(1, "eu")).await.unwrap(), "1@eu#4");
    assert_eq!(within(product(1, "eu")).await.unwrap(), "1@eu#3");
    let stats = stampede::stats("handle::memory").unwrap();
    assert_eq!(stats.loads, 3, "uncached is not a load of the cache");
}

#[tokio::test]
async fn an_operations_future_owns_its_key_and_can_be_spawned() {
    #[cached(ttl = "60s", name = "handle::owned")]
    async fn label(id: u64, region: &str) -> String {
        format!("{id}@{region}")
    }

    // Each operation copies the key when it is called: its future borrows none of the
    // arguments, so it outlives them and can be spawned.
    assert_eq!(within(label(1, "eu")).await, "1@eu");
    let region = String::from("eu");
    let found = label::invalidate_found(1, &region);
    let primed = label::prime(2, &region, "primed".to_owned());
    drop(region);
    assert!(
        within(tokio::spawn(found)).await.unwrap().unwrap(),
        "the value was held"
    );
    assert_eq!(label::peek(1, "eu"), None);
    within(tokio::spawn(primed)).await.unwrap().unwrap();
    assert_eq!(label::peek(2, "eu").as_deref(), Some("primed"));

    let region = String::from("eu");
    let (expired, invalidated) = (label::expire(2, &region), label::invalidate(2, &region));
    drop(region);
    within(tokio::spawn(expired)).await.unwrap().unwrap();
    within(tokio::spawn(invalidated)).await.unwrap().unwrap();
    assert_eq!(label::peek(2, "eu"), None);
    within(tokio::spawn(label::clear())).await.unwrap().unwrap();
}

#[tokio::test]
async fn refresh_joins_the_load_running_for_the_key() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);
    static GATE: tokio::sync::Notify = tokio::sync::Notify::const_new();

    #[cached(ttl = "60s", name = "handle::join")]
    async fn slow(id: u64) -> u64 {
        LOADS.fetch_add(1, SeqCst);
        GATE.notified().await;
        id * 10
    }

    let call = tokio::spawn(slow(7));
    common::eventually("the call's load started", || LOADS.load(SeqCst) == 1).await;
    let refresh = tokio::spawn(slow::refresh(7));
    common::eventually("the refresh joined the load", || {
        stampede::stats("handle::join").is_some_and(|s| s.shared == 1)
    })
    .await;
    GATE.notify_waiters();
    assert_eq!(within(call).await.unwrap(), 70);
    assert_eq!(within(refresh).await.unwrap(), 70);
    assert_eq!(LOADS.load(SeqCst), 1, "one load, shared");

    // With no load running, a refresh starts one and a call arriving meanwhile joins it.
    let refresh = tokio::spawn(slow::refresh(7));
    common::eventually("the refresh's load started", || LOADS.load(SeqCst) == 2).await;
    let call = tokio::spawn(slow(8));
    common::eventually("the other key's load started", || LOADS.load(SeqCst) == 3).await;
    GATE.notify_waiters();
    assert_eq!(within(refresh).await.unwrap(), 70);
    assert_eq!(within(call).await.unwrap(), 80);
}

#[tokio::test]
async fn the_function_keeps_its_errors_and_key_template() {
    #[cached(ttl = "60s", key = "{id}", name = "handle::template")]
    async fn user(id: u64, trace: &str) -> Result<String, AppError> {
        if id == 0 {
            return Err(AppError::Db(format!("no user {id}")));
        }
        Ok(format!("user {id} ({trace})"))
    }

    assert!(matches!(
        within(user::refresh(0, "t1")).await,
        Err(AppError::Db(message)) if message == "no user 0"
    ));
    within(user::prime(5, "five".to_owned())).await.unwrap();
    assert_eq!(within(user(5, "t2")).await.unwrap(), "five");
    assert_eq!(user::peek(5).as_deref(), Some("five"));
    within(user::invalidate(5)).await.unwrap();
    assert_eq!(within(user(5, "t3")).await.unwrap(), "user 5 (t3)");
}

mod listing {
    pub fn offset() -> u64 {
        1
    }
}

/// `listing` is a module here already: `companion = false` leaves the function without one.
#[cached(ttl = "60s", name = "handle::no_companion", companion = false)]
async fn listing(id: u64) -> u64 {
    id + listing::offset()
}

#[tokio::test]
async fn companion_false_leaves_the_name_to_the_module_beside_it() {
    assert_eq!(within(listing(1)).await, 2);
    // Its keys are dropped by name.
    within(stampede::invalidate("handle::no_companion", (1u64,)))
        .await
        .unwrap();
    assert_eq!(within(listing(1)).await, 2);
    assert_eq!(stampede::stats("handle::no_companion").unwrap().loads, 2);
}

#[derive(Clone)]
struct Repo {
    loads: std::sync::Arc<AtomicUsize>,
}

impl Repo {
    /// A method with companions: `Repo::user_invalidate`, `Repo::user_prime`, `Repo::user_peek`,
    /// `repo.user_refresh`, `repo.user_uncached`.
    #[cached(ttl = "60s", companion = true)]
    async fn user(&self, mut id: u64, region: &str) -> Result<String, AppError> {
        let n = self.loads.fetch_add(1, SeqCst) + 1;
        id += 0;
        Ok(format!("{id}@{region}#{n}"))
    }
}

#[tokio::test]
async fn a_method_with_companion_gets_the_operations_as_associated_functions() {
    let repo = Repo {
        loads: Default::default(),
    };
    assert_eq!(Repo::user_peek(1, "eu"), None);
    assert_eq!(within(repo.user(1, "eu")).await.unwrap(), "1@eu#1");
    assert_eq!(Repo::user_peek(1, "eu").as_deref(), Some("1@eu#1"));
    assert_eq!(within(repo.user_refresh(1, "eu")).await.unwrap(), "1@eu#2");
    assert_eq!(within(repo.user(1, "eu")).await.unwrap(), "1@eu#2");
    within(Repo::user_invalidate(1, "eu")).await.unwrap();
    assert_eq!(within(repo.user(1, "eu")).await.unwrap(), "1@eu#3");
    within(Repo::user_prime(2, "us", "primed".to_owned()))
        .await
        .unwrap();
    assert_eq!(within(repo.user(2, "us")).await.unwrap(), "primed");
    assert_eq!(within(repo.user_uncached(1, "eu")).await.unwrap(), "1@eu#4");
    assert_eq!(within(repo.user(1, "eu")).await.unwrap(), "1@eu#3");
    // The cache keeps the name a method's cache has.
    assert!(stampede::stats(&format!("{}::user", std::any::type_name::<Repo>())).is_some());
}

#[tokio::test]
async fn a_load_that_began_before_prime_does_not_overwrite_the_primed_value() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);
    static GATE: tokio::sync::Notify = tokio::sync::Notify::const_new();

    #[cached(ttl = "60s", name = "handle::prime_race")]
    async fn quote(id: u64) -> String {
        LOADS.fetch_add(1, SeqCst);
        GATE.notified().await;
        format!("loaded {id}")
    }

    let call = tokio::spawn(quote(1));
    common::eventually("the load started", || LOADS.load(SeqCst) == 1).await;
    within(quote::prime(1, "primed".to_owned())).await.unwrap();
    GATE.notify_waiters();
    assert_eq!(
        within(call).await.unwrap(),
        "loaded 1",
        "its caller gets its load"
    );
    assert_eq!(quote::peek(1).as_deref(), Some("primed"));
    assert_eq!(within(quote(1)).await, "primed");
    assert_eq!(LOADS.load(SeqCst), 1);
}

/// Never called anywhere: only `invalidate` by name reaches it.
#[cached(ttl = "60s", name = "handle::linked")]
async fn linked(id: u64, region: &str) -> u64 {
    id + region.len() as u64
}

#[tokio::test]
async fn invalidation_by_name_reaches_a_function_never_called() {
    assert!(stampede::stats("handle::linked").is_none(), "no cache yet");
    within(stampede::invalidate(
        "handle::linked",
        (5u64, "eu".to_owned()),
    ))
    .await
    .expect("the linked function's cache is built and the key dropped");
    assert!(stampede::stats("handle::linked").is_some());
    let wrong_type = within(stampede::invalidate("handle::linked", (5u64,))).await;
    assert!(
        matches!(wrong_type, Err(stampede::Error::InvalidConfig { .. })),
        "{wrong_type:?}"
    );
    let unknown = within(stampede::invalidate("handle::nothing", (5u64,))).await;
    assert!(matches!(
        unknown,
        Err(stampede::Error::InvalidConfig { .. })
    ));
}

#[cfg(feature = "redis")]
mod redis {
    use super::*;
    use common::redis_server::RedisServer;
    use stampede::RedisConfig;

    fn install(server: &RedisServer, name: &str) {
        RedisConfig::new(&server.url())
            .unwrap()
            .prefix("test")
            .install_as(name);
    }

    #[tokio::test]
    async fn a_value_primed_in_one_process_is_read_from_redis_by_another() {
        static LOADS: AtomicUsize = AtomicUsize::new(0);

        #[cached(
            ttl = "60s",
            lock = "redis",
            redis = "handle_prime",
            name = "handle::prime"
        )]
        async fn in_a(id: u64) -> String {
            LOADS.fetch_add(1, SeqCst);
            format!("loaded {id}")
        }
        #[cached(
            ttl = "60s",
            lock = "redis",
            redis = "handle_prime",
            name = "handle::prime"
        )]
        async fn in_b(id: u64) -> String {
            LOADS.fetch_add(1, SeqCst);
            format!("loaded {id} by b")
        }
        #[cached(
            ttl = "60s",
            lock = "redis",
            redis = "handle_prime",
            name = "handle::prime"
        )]
        async fn in_c(id: u64) -> String {
            LOADS.fetch_add(1, SeqCst);
            format!("loaded {id} by c")
        }

        let server = RedisServer::start();
        install(&server, "handle_prime");
        within(in_a::prime(1, "primed".to_owned())).await.unwrap();
        assert!(server.key("test:{handle::prime~*|1}:v").is_some());
        assert_eq!(in_b::peek(1), None, "b holds nothing in memory yet");
        assert_eq!(within(in_b(1)).await, "primed", "b read it from Redis");
        assert_eq!(in_b::peek(1).as_deref(), Some("primed"));
        assert_eq!(LOADS.load(SeqCst), 0);

        // A refresh in b loads although Redis holds a fresh value, and writes it to Redis, as a
        // load does: a process without a copy reads it; one with a copy keeps it until it
        // expires (invalidate to drop every copy).
        assert_eq!(within(in_b::refresh(1)).await, "loaded 1 by b");
        assert_eq!(LOADS.load(SeqCst), 1);
        assert_eq!(within(in_c(1)).await, "loaded 1 by b");
        assert_eq!(in_a::peek(1).as_deref(), Some("primed"));
        assert_eq!(LOADS.load(SeqCst), 1);
    }

    #[tokio::test]
    async fn an_invalidation_in_one_process_makes_the_other_reload() {
        static LOADS: AtomicUsize = AtomicUsize::new(0);

        #[cached(
            ttl = "60s",
            lock = "redis",
            redis = "handle_inval",
            name = "handle::inval"
        )]
        async fn in_a(id: u64, region: &str) -> Result<String, AppError> {
            let n = LOADS.fetch_add(1, SeqCst) + 1;
            Ok(format!("{id}@{region}#{n}"))
        }
        #[cached(
            ttl = "60s",
            lock = "redis",
            redis = "handle_inval",
            name = "handle::inval"
        )]
        async fn in_b(id: u64, region: &str) -> Result<String, AppError> {
            let n = LOADS.fetch_add(1, SeqCst) + 1;
            Ok(format!("{id}@{region}#{n}"))
        }

        let server = RedisServer::start();
        install(&server, "handle_inval");
        assert_eq!(within(in_a(3, "eu")).await.unwrap(), "3@eu#1");
        assert_eq!(within(in_b(3, "eu")).await.unwrap(), "3@eu#1");
        assert_eq!(in_a::peek(3, "eu").as_deref(), Some("3@eu#1"));

        within(in_b::invalidate(3, "eu")).await.unwrap();
        assert!(server.key("test:{handle::inval~*|*}:v").is_none());
        // The announcement reaches a's memory.
        common::eventually("a dropped its copy", || in_a::peek(3, "eu").is_none()).await;
        assert_eq!(within(in_a(3, "eu")).await.unwrap(), "3@eu#2");
    }

    #[tokio::test]
    async fn a_process_that_never_called_the_function_invalidates_it() {
        #[cached(
            ttl = "60s",
            lock = "redis",
            redis = "handle_never",
            name = "handle::never"
        )]
        async fn writer(id: u64) -> u64 {
            id + 1
        }
        #[cached(
            ttl = "60s",
            lock = "redis",
            redis = "handle_never",
            name = "handle::never"
        )]
        async fn never_called(id: u64) -> u64 {
            id + 2
        }

        let server = RedisServer::start();
        install(&server, "handle_never");
        assert_eq!(within(writer(9)).await, 10);
        assert!(server.key("test:{handle::never~*|9}:v").is_some());
        assert!(
            stampede::stats("handle::never").is_some_and(|s| s.loads == 1),
            "only the writer's cache exists so far"
        );

        // `never_called` was never called: its companion builds its cache to invalidate.
        within(never_called::invalidate(9)).await.unwrap();
        assert!(
            server.key("test:{handle::never~*|9}:v").is_none(),
            "the value the other cache wrote is gone from Redis"
        );
        common::eventually("the writer dropped its copy", || writer::peek(9).is_none()).await;
    }
}

#[tokio::test]
async fn invalidate_found_tells_whether_memory_held_a_value() {
    #[cached(ttl = "60s", name = "handle::found")]
    async fn price(id: u64) -> u64 {
        id * 10
    }

    assert!(
        !within(price::invalidate_found(1)).await.unwrap(),
        "never loaded"
    );
    assert_eq!(within(price(1)).await, 10);
    assert!(within(price::invalidate_found(1)).await.unwrap());
    assert!(
        !within(price::invalidate_found(1)).await.unwrap(),
        "gone already"
    );
}

// ---- companions of methods of trait impls: #[stampede::companions] on the impl -------------

/// The cache's name of a method of a trait impl, as `stampede::caches()` lists it.
fn trait_method_name<T>(trait_path: &str, method: &str) -> String {
    format!(
        "<{} as handle::{trait_path}>::{method}",
        std::any::type_name::<T>()
    )
}

trait Catalog {
    async fn count(&self, shop: u64, label: &str) -> Result<String, AppError>;
    async fn plain(&self, shop: u64) -> u64;
}

#[derive(Clone, Default)]
struct NativeRepo {
    loads: std::sync::Arc<AtomicUsize>,
}

#[stampede::companions]
impl Catalog for NativeRepo {
    /// A key template: the companion's key operations take `shop` only.
    #[cached(ttl = "60s", key = "{shop}", companion = true)]
    async fn count(&self, shop: u64, label: &str) -> Result<String, AppError> {
        let n = self.loads.fetch_add(1, SeqCst) + 1;
        Ok(format!("{label} {shop}#{n}"))
    }

    /// No companion asked: left as it is.
    #[cached(ttl = "60s")]
    async fn plain(&self, shop: u64) -> u64 {
        shop
    }
}

#[tokio::test]
async fn a_native_trait_impl_method_gets_its_companion_through_companions() {
    let repo = NativeRepo::default();
    let loads = || repo.loads.load(SeqCst);
    assert_eq!(NativeRepo::count_peek(1), None);
    assert_eq!(within(repo.count(1, "shop")).await.unwrap(), "shop 1#1");
    // `peek` sees what the method cached.
    assert_eq!(NativeRepo::count_peek(1).as_deref(), Some("shop 1#1"));

    // `invalidate` drops the method's value: its next call loads.
    within(NativeRepo::count_invalidate(1)).await.unwrap();
    assert_eq!(NativeRepo::count_peek(1), None);
    assert_eq!(within(repo.count(1, "shop")).await.unwrap(), "shop 1#2");
    assert!(within(NativeRepo::count_invalidate_found(1)).await.unwrap());
    assert!(!within(NativeRepo::count_invalidate_found(1)).await.unwrap());

    // `prime` stores a value the method then serves without a load.
    within(NativeRepo::count_prime(2, "primed".to_owned()))
        .await
        .unwrap();
    assert_eq!(
        within(repo.count(2, "other label")).await.unwrap(),
        "primed"
    );
    assert_eq!(loads(), 2);

    // `refresh` loads and stores; `uncached` runs the body and stores nothing.
    assert_eq!(within(repo.count_refresh(2, "r")).await.unwrap(), "r 2#3");
    assert_eq!(within(repo.count(2, "x")).await.unwrap(), "r 2#3");
    assert_eq!(within(repo.count_uncached(2, "u")).await.unwrap(), "u 2#4");
    assert_eq!(within(repo.count(2, "x")).await.unwrap(), "r 2#3");

    // The cache keeps the method's name, by which the dynamic form still reaches it.
    let name = trait_method_name::<NativeRepo>("Catalog", "count");
    assert_eq!(stampede::stats(&name).unwrap().loads, 3, "{name}");
    within(stampede::invalidate(&name, (2u64,))).await.unwrap();
    assert_eq!(NativeRepo::count_peek(2), None);
    assert_eq!(within(repo.plain(5)).await, 5);
}

/// A generic impl: each instantiation has its own cache, and its companion reaches that one.
#[derive(Default)]
struct Store<T> {
    loads: std::sync::Arc<AtomicUsize>,
    _of: std::marker::PhantomData<fn() -> T>,
}

impl<T> Clone for Store<T> {
    fn clone(&self) -> Self {
        Store {
            loads: self.loads.clone(),
            _of: std::marker::PhantomData,
        }
    }
}

trait Shelf {
    async fn stock(&self, item: u64) -> usize;
}

#[stampede::companions(pub(crate))]
impl<T: Send + Sync + 'static> Shelf for Store<T> {
    #[cached(ttl = "60s", companion = true)]
    async fn stock(&self, item: u64) -> usize {
        self.loads.fetch_add(1, SeqCst) + 1 + item as usize * 100
    }
}

#[tokio::test]
async fn a_generic_trait_impl_gets_a_companion_per_instantiation() {
    let bytes = Store::<u8>::default();
    let words = Store::<u16>::default();
    assert_eq!(within(bytes.stock(1)).await, 101);
    assert_eq!(within(words.stock(1)).await, 101);
    within(Store::<u8>::stock_prime(1, 7)).await.unwrap();
    assert_eq!(within(bytes.stock(1)).await, 7);
    assert_eq!(
        within(words.stock(1)).await,
        101,
        "another instantiation's cache"
    );
    within(Store::<u16>::stock_invalidate(1)).await.unwrap();
    assert_eq!(Store::<u16>::stock_peek(1), None);
    assert_eq!(Store::<u8>::stock_peek(1), Some(7));
    assert_eq!(within(words.stock(1)).await, 102);
}

#[async_trait::async_trait]
trait Users: Send + Sync {
    async fn name(&self, id: u64) -> String;
    async fn greeting(&self, name: &str, times: u32) -> String;
}

#[derive(Clone, Default)]
struct AsyncRepo {
    loads: std::sync::Arc<AtomicUsize>,
}

/// `#[stampede::companions]` above `#[async_trait]`: it reads the methods as written.
#[stampede::companions]
#[async_trait::async_trait]
impl Users for AsyncRepo {
    #[cached(ttl = "60s", companion = true)]
    async fn name(&self, id: u64) -> String {
        let n = self.loads.fetch_add(1, SeqCst) + 1;
        format!("user {id}#{n}")
    }

    #[cached(ttl = "60s", companion = true)]
    async fn greeting(&self, name: &str, times: u32) -> String {
        let n = self.loads.fetch_add(1, SeqCst) + 1;
        format!("hello {name} x{times}#{n}")
    }
}

#[derive(Clone, Default)]
struct AsyncRepoBelow {
    loads: std::sync::Arc<AtomicUsize>,
}

/// `#[stampede::companions]` below `#[async_trait]`: it reads the methods as `#[async_trait]`
/// rewrote them.
#[async_trait::async_trait]
#[stampede::companions]
impl Users for AsyncRepoBelow {
    #[cached(ttl = "60s", companion = true)]
    async fn name(&self, id: u64) -> String {
        let n = self.loads.fetch_add(1, SeqCst) + 1;
        format!("user {id}#{n}")
    }

    #[cached(ttl = "60s", companion = true)]
    async fn greeting(&self, name: &str, times: u32) -> String {
        let n = self.loads.fetch_add(1, SeqCst) + 1;
        format!("hello {name} x{times}#{n}")
    }
}

#[tokio::test]
async fn an_async_trait_impl_method_gets_its_companion_through_companions() {
    let repo = AsyncRepo::default();
    let users: std::sync::Arc<dyn Users> = std::sync::Arc::new(repo.clone());
    assert_eq!(within(users.name(1)).await, "user 1#1");
    assert_eq!(AsyncRepo::name_peek(1).as_deref(), Some("user 1#1"));
    within(AsyncRepo::name_invalidate(1)).await.unwrap();
    assert_eq!(AsyncRepo::name_peek(1), None);
    assert_eq!(within(users.name(1)).await, "user 1#2");
    within(AsyncRepo::name_prime(3, "primed".to_owned()))
        .await
        .unwrap();
    assert_eq!(within(users.name(3)).await, "primed");
    assert_eq!(within(repo.name_refresh(3)).await, "user 3#3");
    assert_eq!(within(users.name(3)).await, "user 3#3");

    // A borrowed argument: the companion takes it as the method does.
    assert_eq!(within(users.greeting("ann", 2)).await, "hello ann x2#4");
    assert_eq!(
        AsyncRepo::greeting_peek("ann", 2).as_deref(),
        Some("hello ann x2#4")
    );
    within(AsyncRepo::greeting_invalidate("ann", 2))
        .await
        .unwrap();
    assert_eq!(within(users.greeting("ann", 2)).await, "hello ann x2#5");
    let name = trait_method_name::<AsyncRepo>("Users", "name");
    assert_eq!(stampede::stats(&name).unwrap().loads, 3, "{name}");
}

#[tokio::test]
async fn companions_below_async_trait_works_the_same() {
    let repo = AsyncRepoBelow::default();
    let users: std::sync::Arc<dyn Users> = std::sync::Arc::new(repo.clone());
    assert_eq!(within(users.name(1)).await, "user 1#1");
    assert_eq!(AsyncRepoBelow::name_peek(1).as_deref(), Some("user 1#1"));
    within(AsyncRepoBelow::name_invalidate(1)).await.unwrap();
    assert_eq!(within(users.name(1)).await, "user 1#2");
    within(AsyncRepoBelow::name_prime(3, "primed".to_owned()))
        .await
        .unwrap();
    assert_eq!(within(users.name(3)).await, "primed");
    assert_eq!(within(users.greeting("bo", 1)).await, "hello bo x1#3");
    within(AsyncRepoBelow::greeting_invalidate("bo", 1))
        .await
        .unwrap();
    assert_eq!(AsyncRepoBelow::greeting_peek("bo", 1), None);
    assert_eq!(
        within(repo.greeting_uncached("bo", 1)).await,
        "hello bo x1#4"
    );
    let name = trait_method_name::<AsyncRepoBelow>("Users", "name");
    assert_eq!(stampede::stats(&name).unwrap().loads, 2, "{name}");
}

//! Tags through a real Redis: `stampede::invalidate_tag` drops a tag's values from the Redis of
//! every tagged cache. (A tagged cache whose connection is not configured makes it an error:
//! `redis_tier.rs`, whose caches have no tags.)
mod common;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

use common::redis_server::RedisServer;
use common::within;
use stampede::{RedisConfig, cached};

/// A tag's invalidation goes to every installed Redis: these tests take turns, each
/// installing its server under the one connection name their caches use.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn install(server: &RedisServer) {
    RedisConfig::new(&server.url())
        .unwrap()
        .prefix("tags")
        .install_as("tags");
}

#[tokio::test]
async fn a_tag_drops_its_values_from_redis_and_leaves_the_others() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", lock = "redis", redis = "tags", name = "tags::order", tags = ["customer:{customer}"])]
    async fn order(customer: u64, id: u64) -> String {
        let n = LOADS.fetch_add(1, SeqCst) + 1;
        format!("order {customer}/{id} #{n}")
    }
    #[cached(ttl = "60s", lock = "redis", redis = "tags", name = "tags::order", tags = ["customer:{customer}"])]
    async fn order_elsewhere(customer: u64, id: u64) -> String {
        let n = LOADS.fetch_add(1, SeqCst) + 1;
        format!("order {customer}/{id} #{n} elsewhere")
    }

    let _turn = TURN.lock().await;
    let server = RedisServer::start();
    install(&server);
    assert_eq!(within(order(1, 10)).await, "order 1/10 #1");
    assert_eq!(within(order(1, 11)).await, "order 1/11 #2");
    assert_eq!(within(order(2, 10)).await, "order 2/10 #3");
    assert!(server.key("tags:{tags::order~*|1:10}:v").is_some());
    assert!(
        server.key("tags:{tag|customer:1}:t").is_some(),
        "the tag's set"
    );
    // Another cache of the name reads Redis: no load.
    assert_eq!(within(order_elsewhere(1, 10)).await, "order 1/10 #1");

    within(stampede::invalidate_tag("customer:1"))
        .await
        .unwrap();
    assert!(
        server.key("tags:{tags::order~*|1:10}:v").is_none(),
        "dropped from Redis"
    );
    assert!(server.key("tags:{tags::order~*|1:11}:v").is_none());
    assert!(
        server.key("tags:{tags::order~*|2:10}:v").is_some(),
        "another tag: kept"
    );
    assert!(
        server.key("tags:{tag|customer:1}:p").is_none(),
        "nothing pending for the tag"
    );
    let set_ttl: i64 = server.command(&["PTTL", "tags:{tag|customer:1}:t"]);
    assert!(
        set_ttl > 0,
        "the tag's set keeps its members until it expires with their values"
    );
    assert_eq!(order::peek(1, 10), None);
    assert_eq!(order_elsewhere::peek(1, 10), None);
    assert_eq!(
        within(order_elsewhere(1, 10)).await,
        "order 1/10 #4 elsewhere"
    );
    assert_eq!(
        within(order(1, 10)).await,
        "order 1/10 #4 elsewhere",
        "from Redis"
    );
    assert_eq!(within(order(2, 10)).await, "order 2/10 #3");
    assert_eq!(LOADS.load(SeqCst), 4);
}

#[tokio::test]
async fn a_redis_no_tagged_cache_uses_is_left_alone() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", tags = ["tags-alone"])]
    async fn alone(id: u64) -> usize {
        let _ = id;
        LOADS.fetch_add(1, SeqCst) + 1
    }

    let _turn = TURN.lock().await;
    // The connection of this file's tagged caches, live.
    let live = RedisServer::start();
    install(&live);
    // Installed, then gone: no cache with tags keeps values there.
    let gone = RedisServer::start();
    RedisConfig::new(&gone.url())
        .unwrap()
        .install_as("tags_untagged_only");
    drop(gone);
    assert_eq!(within(alone(1)).await, 1);
    within(stampede::invalidate_tag("tags-alone"))
        .await
        .expect("only the stores of tagged caches are asked");
    assert_eq!(within(alone(1)).await, 2);
}

#[tokio::test]
async fn a_load_holding_the_lock_when_its_tag_is_invalidated_writes_nothing() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);
    static GATE: tokio::sync::Notify = tokio::sync::Notify::const_new();

    #[cached(ttl = "60s", lock = "redis", redis = "tags", name = "tags::fenced", tags = ["fenced:{id}"])]
    async fn fenced(id: u64) -> usize {
        let n = LOADS.fetch_add(1, SeqCst) + 1;
        if n == 1 {
            GATE.notified().await;
        }
        id as usize * 100 + n
    }
    #[cached(ttl = "60s", lock = "redis", redis = "tags", name = "tags::fenced", tags = ["fenced:{id}"])]
    async fn fenced_elsewhere(id: u64) -> usize {
        let n = LOADS.fetch_add(1, SeqCst) + 1;
        id as usize * 100 + n
    }

    let _turn = TURN.lock().await;
    let server = RedisServer::start();
    install(&server);
    let first = tokio::spawn(fenced(7));
    common::eventually("the first load started", || LOADS.load(SeqCst) == 1).await;
    within(stampede::invalidate_tag("fenced:7")).await.unwrap();
    GATE.notify_waiters();
    assert_eq!(
        within(first).await.unwrap(),
        701,
        "its caller gets its value"
    );
    assert!(
        server.key("tags:{tags::fenced~*|7}:v").is_none(),
        "the fence kept the older value out of Redis"
    );
    assert_eq!(within(fenced_elsewhere(7)).await, 702);
    assert_eq!(within(fenced(7)).await, 702);
}

/// A key tagged before its load read the source (here: queued for the one free load) while a
/// tag's invalidation took it from the tag's set: its value, read after the invalidation, is
/// good and written, and the key is in the tag's set again, so the tag's next invalidation still
/// drops it.
#[tokio::test]
async fn a_value_read_after_a_tag_invalidation_that_took_its_key_is_dropped_by_the_next() {
    static VERSION: AtomicUsize = AtomicUsize::new(1);
    static STARTED: AtomicUsize = AtomicUsize::new(0);
    static GATE: tokio::sync::Notify = tokio::sync::Notify::const_new();

    #[cached(ttl = "60s", timeout = "20s", lock = "redis", redis = "tags", max_loads = 1, name = "tags::queued", tags = ["shelf:{shelf}"])]
    async fn item(shelf: u64, id: u64) -> String {
        STARTED.fetch_add(1, SeqCst);
        if id == 0 {
            GATE.notified().await;
        }
        format!("item {shelf}/{id} v{}", VERSION.load(SeqCst))
    }

    let _turn = TURN.lock().await;
    let server = RedisServer::start();
    install(&server);
    let holding = tokio::spawn(item(1, 0));
    common::eventually("the first load holds the free load", || {
        STARTED.load(SeqCst) == 1
    })
    .await;
    let queued = tokio::spawn(item(1, 1));
    tagged_and_queued(
        &server,
        "tags:{tags::queued~*|1:1}:l",
        "tags:{tag|shelf:1}:t",
    )
    .await;
    VERSION.store(2, SeqCst);
    within(stampede::invalidate_tag("shelf:1")).await.unwrap();
    // The runtime knows when a source was read to the millisecond, from below: the queued load
    // reads it clearly after the invalidation.
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    GATE.notify_one();
    within(holding).await.unwrap();
    assert_eq!(within(queued).await.unwrap(), "item 1/1 v2");
    assert!(
        server.key("tags:{tags::queued~*|1:1}:v").is_some(),
        "read after the invalidation, it is written"
    );
    VERSION.store(3, SeqCst);
    within(stampede::invalidate_tag("shelf:1")).await.unwrap();
    assert!(
        server.key("tags:{tags::queued~*|1:1}:v").is_none(),
        "the next invalidation of the tag drops it"
    );
    assert_eq!(within(item(1, 1)).await, "item 1/1 v3");
}

/// A key tagged before a tag's invalidation whose load reads the source after it, then sees a
/// second invalidation of the tag before it fills: the second finds the key in the tag's set
/// (which keeps its members), so the value, read before it, is not written.
#[tokio::test]
async fn a_value_read_between_two_invalidations_of_its_tag_is_not_written() {
    static VERSION: AtomicUsize = AtomicUsize::new(1);
    static STARTED: AtomicUsize = AtomicUsize::new(0);
    static READ: AtomicUsize = AtomicUsize::new(0);
    static HOLD: tokio::sync::Notify = tokio::sync::Notify::const_new();
    static FILL: tokio::sync::Notify = tokio::sync::Notify::const_new();

    #[cached(ttl = "60s", timeout = "20s", lock = "redis", redis = "tags", max_loads = 1, name = "tags::twice", tags = ["aisle:{aisle}"])]
    async fn item(aisle: u64, id: u64) -> String {
        STARTED.fetch_add(1, SeqCst);
        if id == 0 {
            HOLD.notified().await;
        }
        let value = format!("item {aisle}/{id} v{}", VERSION.load(SeqCst));
        if id == 1 && READ.fetch_add(1, SeqCst) == 0 {
            FILL.notified().await;
        }
        value
    }

    let _turn = TURN.lock().await;
    let server = RedisServer::start();
    install(&server);
    let holding = tokio::spawn(item(2, 0));
    common::eventually("the first load holds the free load", || {
        STARTED.load(SeqCst) == 1
    })
    .await;
    let queued = tokio::spawn(item(2, 1));
    tagged_and_queued(
        &server,
        "tags:{tags::twice~*|2:1}:l",
        "tags:{tag|aisle:2}:t",
    )
    .await;
    VERSION.store(2, SeqCst);
    within(stampede::invalidate_tag("aisle:2")).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    HOLD.notify_one();
    within(holding).await.unwrap();
    common::eventually("the queued load read the source", || READ.load(SeqCst) == 1).await;
    VERSION.store(3, SeqCst);
    within(stampede::invalidate_tag("aisle:2")).await.unwrap();
    FILL.notify_one();
    assert_eq!(
        within(queued).await.unwrap(),
        "item 2/1 v2",
        "its caller, which overlapped both, gets what it loaded"
    );
    assert!(
        server.key("tags:{tags::twice~*|2:1}:v").is_none(),
        "read before the second invalidation, it is not written"
    );
    assert_eq!(within(item(2, 1)).await, "item 2/1 v3");
}

/// Waits until a second key is queued behind the one free load (`max_loads = 1`): its Redis
/// lock (`lock`) taken, and both keys in the tag's set (`set`).
async fn tagged_and_queued(server: &RedisServer, lock: &str, set: &str) {
    common::eventually("the second key is tagged and queued", || {
        server.key(lock).is_some() && server.command::<Vec<String>>(&["SMEMBERS", set]).len() == 2
    })
    .await;
}

/// `expire_tag` (issue 37): each tagged value stays in Redis, no longer fresh; every process
/// serves it stale while one refresh replaces it, and values of other tags stay fresh.
#[tokio::test]
async fn a_tags_expiry_keeps_its_values_in_redis_stale_while_one_refresh_replaces_each() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", stale = "1m", lock = "redis", redis = "tags", name = "tags::invoice", tags = ["payer:{payer}"])]
    async fn invoice(payer: u64, id: u64) -> String {
        let n = LOADS.fetch_add(1, SeqCst) + 1;
        format!("invoice {payer}/{id} #{n}")
    }
    #[cached(ttl = "60s", stale = "1m", lock = "redis", redis = "tags", name = "tags::invoice", tags = ["payer:{payer}"])]
    async fn invoice_elsewhere(payer: u64, id: u64) -> String {
        let n = LOADS.fetch_add(1, SeqCst) + 1;
        format!("invoice {payer}/{id} #{n} elsewhere")
    }
    #[cached(ttl = "60s", stale = "1m", lock = "redis", backend = "redis", redis = "tags", name = "tags::invoice", tags = ["payer:{payer}"])]
    async fn invoice_in_redis(payer: u64, id: u64) -> String {
        let n = LOADS.fetch_add(1, SeqCst) + 1;
        format!("invoice {payer}/{id} #{n} in redis")
    }

    let _turn = TURN.lock().await;
    let server = RedisServer::start();
    install(&server);
    assert_eq!(within(invoice(1, 10)).await, "invoice 1/10 #1");
    assert_eq!(within(invoice(2, 10)).await, "invoice 2/10 #2");
    // In the other process's memory too.
    assert_eq!(within(invoice_elsewhere(1, 10)).await, "invoice 1/10 #1");

    within(stampede::expire_tag("payer:1")).await.unwrap();
    let key = server
        .key("tags:{tags::invoice~*|1:10}:v")
        .expect("kept in Redis");
    let envelope: Vec<u8> = server.command(&["GET", &key]);
    let fresh_until: u64 = String::from_utf8_lossy(&envelope)
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let (seconds, micros): (u64, u64) = server.command(&["TIME"]);
    assert!(
        fresh_until <= seconds * 1_000 + micros / 1_000,
        "no longer fresh in Redis"
    );
    // A process that keeps nothing in memory reads it stale from Redis.
    assert_eq!(within(invoice_in_redis(1, 10)).await, "invoice 1/10 #1");
    // Stale in both processes: served at once, and one refresh replaces it.
    assert_eq!(within(invoice_elsewhere(1, 10)).await, "invoice 1/10 #1");
    assert_eq!(within(invoice(1, 10)).await, "invoice 1/10 #1");
    within(async {
        while within(invoice(1, 10)).await == "invoice 1/10 #1"
            || within(invoice_elsewhere(1, 10)).await == "invoice 1/10 #1"
        {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(LOADS.load(SeqCst), 3, "one refresh, across the processes");
    // Another tag's value stays fresh.
    assert_eq!(within(invoice(2, 10)).await, "invoice 2/10 #2");
    assert_eq!(LOADS.load(SeqCst), 3);
}

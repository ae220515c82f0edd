//! The previous value to the load (`stampede::previous`): a load is given the value the cache
//! holds for its key, and answers "unchanged" by returning it.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{AppError, within};
use stampede::cached;

/// A row of the source, with the version a conditional read compares (an ETag).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Page {
    id: u64,
    etag: u32,
    body: String,
}

#[tokio::test(start_paused = true)]
async fn a_refresh_is_given_the_value_it_replaces_and_unchanged_keeps_it_for_another_ttl() {
    static ETAG: AtomicUsize = AtomicUsize::new(1);
    static FULL_READS: AtomicUsize = AtomicUsize::new(0);
    static GIVEN: Mutex<Vec<Option<u32>>> = Mutex::new(Vec::new());

    #[cached(ttl = "10s", jitter = 0, stale = "10s", name = "previous::page")]
    async fn page(id: u64) -> Result<Page, AppError> {
        let previous = stampede::previous::<Page>();
        GIVEN
            .lock()
            .unwrap()
            .push(previous.as_ref().map(|page| page.etag));
        let etag = ETAG.load(SeqCst) as u32;
        // A conditional read: the source says "not modified" for the version held.
        if let Some(previous) = previous
            && previous.etag == etag
        {
            return Ok(previous);
        }
        FULL_READS.fetch_add(1, SeqCst);
        Ok(Page {
            id,
            etag,
            body: format!("page {id} at {etag}"),
        })
    }

    let first = within(page(7)).await.unwrap();
    assert_eq!(first.etag, 1);
    // Stale: served at once, and the refresh in the background is given the stale value.
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(within(page(7)).await.unwrap(), first);
    within(async {
        while GIVEN.lock().unwrap().len() < 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(*GIVEN.lock().unwrap(), vec![None, Some(1)]);
    assert_eq!(FULL_READS.load(SeqCst), 1, "unchanged: no full read");
    // "Unchanged" stored the value as loaded then: fresh for another ttl, no load.
    tokio::time::sleep(Duration::from_secs(9)).await;
    assert_eq!(within(page(7)).await.unwrap(), first);
    assert_eq!(GIVEN.lock().unwrap().len(), 2, "fresh again: no load");
    // The source changes: the next refresh reads it in full.
    ETAG.store(2, SeqCst);
    tokio::time::sleep(Duration::from_secs(2)).await;
    within(page(7)).await.unwrap(); // stale, and its refresh
    within(async {
        while within(page(7)).await.unwrap().etag != 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(FULL_READS.load(SeqCst), 2);
    assert_eq!(GIVEN.lock().unwrap()[2], Some(1));
}

#[tokio::test(start_paused = true)]
async fn the_companions_refresh_is_given_the_fresh_value_and_an_invalidation_leaves_nothing() {
    static GIVEN: Mutex<Vec<Option<String>>> = Mutex::new(Vec::new());
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", name = "previous::label")]
    async fn label(id: u64) -> String {
        GIVEN.lock().unwrap().push(stampede::previous::<String>());
        let n = LOADS.fetch_add(1, SeqCst) + 1;
        format!("{id} #{n}")
    }

    assert_eq!(within(label(1)).await, "1 #1");
    assert_eq!(within(label::refresh(1)).await, "1 #2");
    within(label::invalidate(1)).await.unwrap();
    assert_eq!(within(label(1)).await, "1 #3");
    // Another key's load is given that key's value, never this one's.
    assert_eq!(within(label(2)).await, "2 #4");
    assert_eq!(
        *GIVEN.lock().unwrap(),
        vec![None, Some("1 #1".to_owned()), None, None]
    );
}

#[tokio::test(start_paused = true)]
async fn asked_for_another_type_or_outside_a_load_previous_is_none() {
    static GIVEN: Mutex<Vec<Option<u64>>> = Mutex::new(Vec::new());

    #[cached(ttl = "1s", jitter = 0, stale = "10s", name = "previous::typed")]
    async fn typed(id: u64) -> String {
        // The value type is `String`: a `u64` is not what the cache holds.
        GIVEN.lock().unwrap().push(stampede::previous::<u64>());
        id.to_string()
    }

    within(typed(1)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    within(typed::refresh(1)).await;
    assert_eq!(*GIVEN.lock().unwrap(), vec![None, None]);
    assert_eq!(stampede::previous::<String>(), None, "outside a load");
}

/// A repository method: the load of a `&self` method is given its key's value too.
#[derive(Clone)]
struct Repo {
    loads: Arc<AtomicUsize>,
}

impl Repo {
    #[cached(ttl = "1s", jitter = 0, stale = "10s", name = "previous::Repo::name")]
    async fn name(&self, id: u64) -> Result<String, AppError> {
        let previous = stampede::previous::<String>();
        self.loads.fetch_add(1, SeqCst);
        Ok(match previous {
            Some(previous) => format!("{previous}+"),
            None => format!("n{id}"),
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_methods_load_is_given_its_keys_value() {
    let repo = Repo {
        loads: Arc::default(),
    };
    assert_eq!(within(repo.name(3)).await.unwrap(), "n3");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(within(repo.name(3)).await.unwrap(), "n3", "stale");
    within(async {
        while repo.loads.load(SeqCst) < 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(within(repo.name(3)).await.unwrap(), "n3+");
    stampede::invalidate("previous::Repo::name", (3u64,))
        .await
        .unwrap();
    assert_eq!(
        within(repo.name(3)).await.unwrap(),
        "n3",
        "nothing after an invalidation"
    );
}

#[tokio::test(start_paused = true)]
async fn a_batch_load_is_given_each_of_its_keys_values_by_key() {
    static GIVEN: Mutex<Vec<(u64, Option<Option<u64>>)>> = Mutex::new(Vec::new());
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "1s", jitter = 0, stale = "10s", batch = ids, name = "previous::versions")]
    async fn versions(ids: Vec<u64>) -> HashMap<u64, u64> {
        let n = LOADS.fetch_add(1, SeqCst) as u64 + 1;
        let mut given = GIVEN.lock().unwrap();
        ids.into_iter()
            .filter_map(|id| {
                let previous = stampede::previous_of::<(u64,), Option<u64>>(&(id,));
                given.push((id, previous));
                // Key 3 is absent from the source.
                (id != 3).then_some((id, id * 100 + n))
            })
            .collect()
    }

    let first = within(versions(vec![1, 2, 3])).await;
    assert_eq!(first, HashMap::from([(1, 101), (2, 201)]));
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Stale: served, and one refresh of the three keys is given each one's value (the absence
    // too), and a key never cached nothing.
    assert_eq!(within(versions(vec![1, 2, 3])).await, first);
    within(async {
        while LOADS.load(SeqCst) < 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    within(versions(vec![4])).await;
    let mut given = GIVEN.lock().unwrap().clone();
    given.sort();
    assert_eq!(
        given,
        vec![
            (1, None),
            (1, Some(Some(101))),
            (2, None),
            (2, Some(Some(201))),
            (3, None),
            (3, Some(None)),
            (4, None),
        ]
    );
}

#[async_trait::async_trait]
trait Catalog: Send + Sync {
    async fn title(&self, id: u64) -> String;
}

#[derive(Clone)]
struct Books;

#[async_trait::async_trait]
impl Catalog for Books {
    #[cached(ttl = "1s", jitter = 0, stale = "10s", name = "previous::Books::title")]
    async fn title(&self, id: u64) -> String {
        match stampede::previous::<String>() {
            Some(previous) => format!("{previous}'"),
            None => format!("t{id}"),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_trait_impls_load_through_dyn_is_given_its_keys_value() {
    let catalog: Box<dyn Catalog> = Box::new(Books);
    assert_eq!(within(catalog.title(1)).await, "t1");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(within(catalog.title(1)).await, "t1", "stale");
    within(async {
        while within(catalog.title(1)).await != "t1'" {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

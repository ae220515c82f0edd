//! Distinct functions never share a cache: two traits' methods of one name on one type, and one
//! method of a generic impl at two instantiations, each get their own cache and name.

mod common;

use std::any::type_name;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

use common::within;
use stampede::cached;

#[derive(Clone)]
struct Directory;

trait ByName {
    async fn get(&self, id: u64) -> String;
}

trait ByEmail {
    async fn get(&self, id: u64) -> String;
}

impl ByName for Directory {
    #[cached(ttl = "60s")]
    async fn get(&self, id: u64) -> String {
        format!("name of {id}")
    }
}

impl ByEmail for Directory {
    #[cached(ttl = "60s")]
    async fn get(&self, id: u64) -> String {
        format!("email of {id}")
    }
}

#[tokio::test]
async fn two_traits_methods_of_one_name_on_one_type_have_their_own_caches() {
    let directory = Directory;
    assert_eq!(within(ByName::get(&directory, 1)).await, "name of 1");
    assert_eq!(within(ByEmail::get(&directory, 1)).await, "email of 1");
    assert_eq!(within(ByName::get(&directory, 1)).await, "name of 1");
    let by_name = "<identity::Directory as identity::ByName>::get";
    let by_email = "<identity::Directory as identity::ByEmail>::get";
    assert_eq!(
        stampede::stats(by_name).map(|s| (s.misses, s.hits)),
        Some((1, 1))
    );
    assert_eq!(
        stampede::stats(by_email).map(|s| (s.misses, s.hits)),
        Some((1, 0))
    );
}

#[derive(Clone)]
struct Store<T>(PhantomData<T>);

static LABEL_LOADS: AtomicUsize = AtomicUsize::new(0);

impl<T: Clone + Send + Sync + 'static> Store<T> {
    #[cached(ttl = "60s")]
    async fn label(&self, id: u64) -> String {
        LABEL_LOADS.fetch_add(1, SeqCst);
        format!("{} #{id}", type_name::<T>())
    }
}

#[tokio::test]
async fn a_generic_impl_at_two_instantiations_has_a_cache_for_each() {
    let (bytes, words) = (Store::<u8>(PhantomData), Store::<u16>(PhantomData));
    assert_eq!(within(bytes.label(1)).await, "u8 #1");
    assert_eq!(within(words.label(1)).await, "u16 #1");
    assert_eq!(within(bytes.label(1)).await, "u8 #1");
    assert_eq!(within(words.label(1)).await, "u16 #1");
    assert_eq!(LABEL_LOADS.load(SeqCst), 2);
    assert!(stampede::stats("identity::Store<u8>::label").is_some());
    assert!(stampede::stats("identity::Store<u16>::label").is_some());
}

/// An error type that is `Clone`, whose `From` keeps the cache's error as it is.
#[derive(Clone, Debug)]
enum LookupError {
    NotFound(u64),
    Cache(stampede::Error),
}

impl std::fmt::Display for LookupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

impl From<stampede::Error> for LookupError {
    fn from(error: stampede::Error) -> Self {
        LookupError::Cache(error)
    }
}

#[tokio::test(start_paused = true)]
async fn every_caller_of_a_shared_load_gets_a_clone_errors_original() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", name = "identity::clone_error")]
    async fn lookup(id: u64) -> Result<String, LookupError> {
        LOADS.fetch_add(1, SeqCst);
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        Err(LookupError::NotFound(id))
    }

    let calls: Vec<_> = (0..10).map(|_| tokio::spawn(lookup(3))).collect();
    for call in calls {
        assert!(matches!(
            within(call).await.unwrap(),
            Err(LookupError::NotFound(3))
        ));
    }
    assert_eq!(LOADS.load(SeqCst), 1);
    // The cache's own errors still arrive through `From`.
    assert!(matches!(
        LookupError::from(stampede::Error::LoadAborted { cache: "c".into() }),
        LookupError::Cache(stampede::Error::LoadAborted { .. })
    ));
}

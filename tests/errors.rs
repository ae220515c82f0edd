//! A function's own error comes back as itself: to the only caller of a load, whatever the
//! error type; to every caller of a shared load, through `Error::upstream` when it is not
//! `Clone`.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use common::within;
use stampede::cached;

/// A repository's error as users write it: not `Clone` (it could hold a driver's error).
#[derive(Debug)]
enum RepoError {
    NotFound(u64),
    Db(std::io::Error),
    Cache(stampede::Error),
}

impl std::fmt::Display for RepoError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RepoError::NotFound(id) => write!(f, "no row {id}"),
            RepoError::Db(error) => write!(f, "database: {error}"),
            RepoError::Cache(error) => write!(f, "cache: {error}"),
        }
    }
}

impl From<stampede::Error> for RepoError {
    fn from(error: stampede::Error) -> Self {
        RepoError::Cache(error)
    }
}

#[tokio::test(start_paused = true)]
async fn the_only_caller_of_a_load_gets_the_functions_own_error() {
    #[cached(ttl = "60s", name = "errors::sole")]
    async fn user(id: u64) -> Result<String, RepoError> {
        if id == 999 {
            return Err(RepoError::NotFound(id));
        }
        Err(RepoError::Db(std::io::Error::other("connection reset")))
    }

    // What a handler matches on: the variant the body returned, not a wrapper.
    assert!(matches!(
        within(user(999)).await,
        Err(RepoError::NotFound(999))
    ));
    assert!(matches!(within(user(1)).await, Err(RepoError::Db(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_only_caller_gets_its_error_back_on_a_multi_threaded_runtime_every_time() {
    #[cached(ttl = "60s", name = "errors::sole_threads")]
    async fn user(id: u64) -> Result<String, RepoError> {
        tokio::task::yield_now().await;
        Err(RepoError::NotFound(id))
    }

    // Distinct keys, one caller each: whichever thread finishes the load first, the caller's
    // copy of the error is the only one once the load has let go of it.
    for id in 0..500 {
        let got = within(user(id)).await;
        assert!(
            matches!(got, Err(RepoError::NotFound(i)) if i == id),
            "{got:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn waiters_of_a_shared_load_reach_the_original_error() {
    static LOADS: AtomicUsize = AtomicUsize::new(0);

    #[cached(ttl = "60s", name = "errors::shared")]
    async fn user(id: u64) -> Result<String, RepoError> {
        LOADS.fetch_add(1, SeqCst);
        tokio::time::sleep(Duration::from_millis(100)).await;
        Err(RepoError::NotFound(id))
    }

    let calls: Vec<_> = (0..10).map(|_| tokio::spawn(user(7))).collect();
    for call in calls {
        match within(call).await.unwrap() {
            Err(RepoError::Cache(error)) => {
                assert!(
                    matches!(error.upstream::<RepoError>(), Some(RepoError::NotFound(7))),
                    "{error:?}"
                );
            }
            other => panic!("expected the shared failure, got {other:?}"),
        }
    }
    assert_eq!(LOADS.load(SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_stampede_error_still_arrives_through_from() {
    #[cached(ttl = "60s", timeout = "50ms", name = "errors::timeout")]
    async fn slow(id: u64) -> Result<u64, RepoError> {
        tokio::time::sleep(Duration::from_secs(1)).await;
        Ok(id)
    }

    assert!(matches!(
        within(slow(1)).await,
        Err(RepoError::Cache(stampede::Error::Timeout { .. }))
    ));
}

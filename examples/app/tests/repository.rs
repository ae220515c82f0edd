//! The repository example's scenario, asserted: concurrent calls on a cold cache run one SQL
//! query per key, through `#[cached]` methods of an `#[async_trait]` impl over SQLite.

mod common;

use common::within;
use stampede_examples::user_repository::{SqliteUsers, Step, UserRepository, scenario};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_run_one_query_per_key() {
    let store = within(SqliteUsers::in_memory()).await.unwrap();
    within(store.seed(50)).await.unwrap();

    let steps = within(scenario(&store)).await.unwrap();
    assert_eq!(
        steps,
        [
            Step {
                what: "get_user (10 users)",
                calls: 500,
                queries: 10
            },
            Step {
                what: "list_recent(5)",
                calls: 200,
                queries: 1
            },
            Step {
                what: "count (warm, no lock)",
                calls: 101,
                queries: 1
            },
        ]
    );

    // The cached values are the database's: a missing user is cached as `None`.
    let repo: &dyn UserRepository = &store;
    let ann = within(repo.get_user(3)).await.unwrap().unwrap();
    assert_eq!(ann.email, "user3@example.com");
    assert_eq!(within(repo.get_user(99)).await.unwrap(), None);
    assert_eq!(within(repo.get_user(99)).await.unwrap(), None);
    assert_eq!(within(repo.count()).await.unwrap(), 50);
    assert_eq!(store.queries(), 12 + 1, "one more query, for user 99");

    let recent = within(repo.list_recent(5)).await.unwrap();
    let ids: Vec<i64> = recent.iter().map(|u| u.id).collect();
    assert_eq!(ids, [50, 49, 48, 47, 46]);
}

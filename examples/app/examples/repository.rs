//! A user repository over SQLite (through sqlx) whose reads are cached with `#[cached]` on the
//! methods of an `#[async_trait]` impl, each with its own options. It seeds a small table, fires
//! concurrent requests at a cold cache, and prints how many SQL queries ran for how many calls.
//!
//! ```sh
//! cargo run -p stampede-examples --example repository
//! ```

use stampede_examples::sqlite::RepoError;
use stampede_examples::user_repository::{SqliteUsers, UserRepository, scenario};

#[tokio::main]
async fn main() -> Result<(), RepoError> {
    let store = SqliteUsers::in_memory().await?;
    store.seed(50).await?;
    println!("SQLite in memory, 50 users; every request below starts on a cold cache.\n");

    let steps = scenario(&store).await?;
    println!("{:<24} {:>6} {:>12}", "", "calls", "SQL queries");
    for step in &steps {
        println!("{:<24} {:>6} {:>12}", step.what, step.calls, step.queries);
    }
    let calls: usize = steps.iter().map(|s| s.calls).sum();
    println!("{:<24} {:>6} {:>12}", "total", calls, store.queries());

    let repo: &dyn UserRepository = &store;
    println!("\nuser 7: {:?}", repo.get_user(7).await?);
    println!("user 99: {:?}", repo.get_user(99).await?);
    for name in ["users::get_user", "users::list_recent", "users::count"] {
        let stats = stampede::stats(name).expect("the cache exists once called");
        println!(
            "{name}: {} hits, {} misses, {} loads, {} callers shared a load",
            stats.hits, stats.misses, stats.loads, stats.shared
        );
    }
    Ok(())
}

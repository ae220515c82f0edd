//! The plumbing the three binaries share (never their cached types, which each defines for
//! itself): the Redis connection from the environment, the "database" they load from, and the
//! loop that answers the test's commands on stdin, one line each.
//!
//! Commands: `get ID`, `set ID PRICE` (the database), `invalidate ID`, `tag TAG`, `quit`.
//! Each is answered on stdout by one line, `ok ...` or `error ...`.

use std::future::Future;
use std::pin::Pin;

use tokio::io::{AsyncBufReadExt, BufReader};

/// The variable that holds the Redis URL.
pub const REDIS_VAR: &str = "IDENTITY_REDIS";

/// What a binary does for a command; the reply's text after `ok `.
pub type Reply<'a> = Pin<Box<dyn Future<Output = Result<String, String>> + 'a>>;

/// A command of the test.
pub enum Command {
    Get(u64),
    Invalidate(u64),
    Tag(String),
}

/// Installs the default Redis connection from [`REDIS_VAR`], then answers commands until
/// `quit` or the end of stdin.
pub fn serve(mut answer: impl FnMut(Command) -> Reply<'static>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let url = std::env::var(REDIS_VAR).expect("IDENTITY_REDIS");
        stampede::RedisConfig::new(&url)
            .expect("a Redis URL")
            .prefix("ident")
            .install();
        stampede::require_redis(None).await.expect("Redis answers");
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let words: Vec<&str> = line.split_whitespace().collect();
            let reply = match words.as_slice() {
                ["quit"] => break,
                ["get", id] => answer(Command::Get(parse(id))).await,
                ["invalidate", id] => answer(Command::Invalidate(parse(id))).await,
                ["tag", tag] => answer(Command::Tag((*tag).to_owned())).await,
                ["set", id, price] => set_price(parse(id), parse(price)).await,
                _ => Err(format!("unknown command {line:?}")),
            };
            match reply {
                Ok(text) => println!("ok {text}"),
                Err(text) => println!("error {text}"),
            }
        }
    });
}

fn parse(word: &str) -> u64 {
    word.parse().expect("a number")
}

async fn connection() -> redis::aio::MultiplexedConnection {
    let url = std::env::var(REDIS_VAR).expect("IDENTITY_REDIS");
    redis::Client::open(url)
        .expect("a Redis URL")
        .get_multiplexed_async_connection()
        .await
        .expect("Redis answers")
}

/// The price the database holds for `id` (0 when none). Boxed: the Redis client's futures
/// nested in the cache's would pass rustc's default query depth when it lays out the load.
pub fn price(id: u64) -> Pin<Box<dyn Future<Output = u64> + Send>> {
    Box::pin(async move {
        let price: Option<u64> = redis::cmd("GET")
            .arg(format!("db:price:{id}"))
            .query_async(&mut connection().await)
            .await
            .expect("GET");
        price.unwrap_or(0)
    })
}

async fn set_price(id: u64, price: u64) -> Result<String, String> {
    let () = redis::cmd("SET")
        .arg(format!("db:price:{id}"))
        .arg(price)
        .query_async(&mut connection().await)
        .await
        .map_err(|e| e.to_string())?;
    Ok(format!("set {id} {price}"))
}

/// `loads=.. remote_hits=.. decode_errors=..` of the cache called `name`.
pub fn counters(name: &str) -> String {
    let stats = stampede::stats(name).unwrap_or_default();
    format!(
        "loads={} remote_hits={} decode_errors={}",
        stats.loads, stats.remote_hits, stats.decode_errors
    )
}

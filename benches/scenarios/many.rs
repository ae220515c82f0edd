//! Many processes, one Redis, one cold key: the processes are copies of this program run by
//! `stampede_examples::multi_instance` (`examples/app/src/multi_instance.rs`), and the Redis
//! round trip they are judged against is measured here, in the same run.

use std::time::Duration;

use hdrhistogram::Histogram;

/// A Redis round trip as the runtime's connections see it.
pub struct RoundTrip {
    pub pings: u64,
    pub p50: Duration,
    pub p99: Duration,
}

/// `pings` PINGs one after another on one multiplexed connection, on a 2-worker tokio runtime
/// (the kind of connection and runtime stampede's Redis calls go through).
pub fn round_trip(url: &str, pings: u64) -> Result<RoundTrip, String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let latency = runtime.block_on(async {
        let client = redis::Client::open(url).map_err(|e| e.to_string())?;
        let mut connection = tokio::time::timeout(
            Duration::from_secs(5),
            client.get_multiplexed_async_connection(),
        )
        .await
        .map_err(|_| "no connection to Redis within 5 s".to_owned())?
        .map_err(|e| e.to_string())?;
        let mut latency =
            Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).map_err(|e| e.to_string())?;
        // A few PINGs first: the connection's buffers and the server's first reply.
        for round in 0..pings + 10 {
            let started = tokio::time::Instant::now();
            let pong = tokio::time::timeout(
                Duration::from_secs(5),
                redis::cmd("PING").query_async::<String>(&mut connection),
            )
            .await
            .map_err(|_| "a PING got no answer within 5 s".to_owned())?
            .map_err(|e| e.to_string())?;
            let took = started.elapsed();
            if pong != "PONG" {
                return Err(format!("PING answered {pong}"));
            }
            if round >= 10 {
                latency.saturating_record(took.as_nanos() as u64);
            }
        }
        Ok::<_, String>(latency)
    })?;
    runtime.shutdown_timeout(Duration::from_secs(1));
    Ok(RoundTrip {
        pings: latency.len(),
        p50: Duration::from_nanos(latency.value_at_quantile(0.5)),
        p99: Duration::from_nanos(latency.value_at_quantile(0.99)),
    })
}

/// The server's version, for the header.
pub fn server_version(url: &str) -> Option<String> {
    let client = redis::Client::open(url).ok()?;
    let mut connection = client
        .get_connection_with_timeout(Duration::from_secs(2))
        .ok()?;
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(&mut connection)
        .ok()?;
    info.lines()
        .find_map(|line| line.strip_prefix("redis_version:"))
        .map(|version| version.trim().to_owned())
}

/// `messages` PUBLISHes, each made while the subscriber has been idle for 2 ms, timed from just
/// before the PUBLISH to the subscriber's stream handing over the message. The subscriber is a
/// plain `redis` pub/sub connection on a 2-worker runtime of its own: the least a publication
/// takes to reach a waiting process's code, without stampede's own steps.
pub fn publication_delay(url: &str, messages: u64) -> Result<RoundTrip, String> {
    use futures_util::StreamExt;
    use std::time::Instant;

    const CHANNEL: &str = "stampede-bench:publication-delay";
    let build = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| e.to_string())
    };
    let (subscriber_runtime, publisher_runtime) = (build()?, build()?);
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let limit = Duration::from_secs(5);
    let (received, mut receipts) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    let (ready, subscribed) = tokio::sync::oneshot::channel::<Result<(), String>>();
    let subscriber_client = client.clone();
    subscriber_runtime.spawn(async move {
        let subscription = async {
            let mut pubsub = subscriber_client.get_async_pubsub().await?;
            pubsub.subscribe(CHANNEL).await?;
            Ok::<_, redis::RedisError>(pubsub)
        };
        let mut stream = match tokio::time::timeout(limit, subscription).await {
            Ok(Ok(pubsub)) => {
                let _ = ready.send(Ok(()));
                pubsub.into_on_message()
            }
            Ok(Err(error)) => return drop(ready.send(Err(error.to_string()))),
            Err(_) => return drop(ready.send(Err("no subscription within 5 s".into()))),
        };
        while stream.next().await.is_some() {
            if received.send(Instant::now()).is_err() {
                break;
            }
        }
    });
    let latency = publisher_runtime.block_on(async {
        subscribed
            .await
            .map_err(|_| "the subscriber stopped".to_owned())??;
        let mut connection = tokio::time::timeout(limit, client.get_multiplexed_async_connection())
            .await
            .map_err(|_| "no connection to Redis within 5 s".to_owned())?
            .map_err(|e| e.to_string())?;
        let mut latency =
            Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).map_err(|e| e.to_string())?;
        for round in 0..messages + 5 {
            tokio::time::sleep(Duration::from_millis(2)).await;
            let sent = Instant::now();
            let mut publish = redis::cmd("PUBLISH");
            publish.arg(CHANNEL).arg("x");
            let published = publish.query_async::<i64>(&mut connection);
            let (published, receipt) =
                tokio::time::timeout(limit, async { tokio::join!(published, receipts.recv()) })
                    .await
                    .map_err(|_| "a publication did not arrive within 5 s".to_owned())?;
            published.map_err(|e| e.to_string())?;
            let receipt = receipt.ok_or("the subscriber stopped")?;
            if round >= 5 {
                latency.saturating_record(receipt.duration_since(sent).as_nanos() as u64);
            }
        }
        Ok::<_, String>(latency)
    })?;
    publisher_runtime.shutdown_timeout(Duration::from_secs(1));
    subscriber_runtime.shutdown_timeout(Duration::from_secs(1));
    Ok(RoundTrip {
        pings: latency.len(),
        p50: Duration::from_nanos(latency.value_at_quantile(0.5)),
        p99: Duration::from_nanos(latency.value_at_quantile(0.99)),
    })
}

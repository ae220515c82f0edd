//! The fill's ordering, Rust against Lua, on a real `redis-server`: whether a value Redis holds
//! may be newer than a refused load's is `order::may_be_newer` in both, and what the load's
//! callers are handed is what Redis keeps.

use std::time::Duration;

use proptest::prelude::*;
use stampede_test_support::redis_server::RedisServer;

use crate::config::Lifetime;
use crate::order;
use crate::redis::config::RedisConfig;
use crate::redis::endpoint::Endpoint;
use crate::redis::keys::RedisKeys;
use crate::redis::ops::Fill;

/// One refused fill: the fence moved since the load's read (another holder's fill), and the
/// value that holder wrote stays in Redis exactly when the callers of the refused load are
/// handed it.
fn refused_fill(endpoint: &Endpoint, server: &RedisServer, case: (u64, u64, u64, u64)) {
    let (written_off, read_off, stored_fence_off, moved_by) = case;
    let now: u64 = {
        let (seconds, micros): (u64, u64) = server.command(&["TIME"]);
        seconds * 1_000 + micros / 1_000
    };
    let keys = RedisKeys::of_base("order:{k}");
    let read_fence = 1_000_u64;
    let (written_at, read_from) = (now - 10 + written_off, now - 10 + read_off);
    let stored = format!(
        "S2 {} {} {written_at} {} 0 -\nstored",
        now + 60_000,
        now + 120_000,
        read_fence - 1 + stored_fence_off
    );
    let fence_now = (read_fence + moved_by).to_string();
    let _: () = server.command(&["SET", &keys.value, &stored]);
    let _: () = server.command(&["SET", &keys.fence, &fence_now]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let written = runtime
        .block_on(endpoint.fill(&Fill {
            keys: &keys,
            token: "",
            lifetime: Lifetime {
                fresh: Duration::from_secs(60),
                stale: Duration::ZERO,
                fail_safe: Duration::ZERO,
            },
            load: Duration::ZERO,
            fence: Some(read_fence),
            source_version: None,
            read_from,
            payload: b"loaded",
        }))
        .expect("redis-server answers");
    assert!(!written.written, "the fence moved: refused");
    let kept: Option<String> = server.command(&["GET", &keys.value]);
    let stored_fence = read_fence - 1 + stored_fence_off;
    assert_eq!(
        kept.is_some(),
        order::may_be_newer(written_at, read_from),
        "written at {written_at}, the source read at {read_from}, stored fence {stored_fence}: \
         Redis {} it, against the Rust ordering",
        if kept.is_some() { "keeps" } else { "deletes" },
    );
    // The flows hand a refused load's callers what `FILL` returns as stored.
    assert_eq!(
        written.stored.is_some(),
        kept.is_some(),
        "what the callers are handed is what Redis keeps"
    );
}

#[test]
fn a_refused_fill_hands_its_callers_what_redis_keeps() {
    let server = RedisServer::start();
    let endpoint = Endpoint::new(
        "order_unit",
        RedisConfig::new(&server.url()).unwrap().prefix("order"),
    );
    // Ties and near ties of the two times, and stored fences before, at and after the read's.
    proptest!(ProptestConfig::with_cases(200), |(
        written_off in 0_u64..4,
        read_off in 0_u64..4,
        stored_fence_off in 0_u64..3,
        moved_by in 1_u64..3,
    )| {
        refused_fill(&endpoint, &server, (written_off, read_off, stored_fence_off, moved_by));
    });
}

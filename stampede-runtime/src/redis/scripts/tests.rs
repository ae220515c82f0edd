//! The fill's ordering, Rust against Lua, on a real `redis-server`: whether a value Redis holds
//! may be newer than a load's is `order::may_be_newer` of the two source reads in both, a fill
//! lands only over a value that is older, and what a refused load's callers are handed is what
//! Redis keeps.

use std::time::Duration;

use proptest::prelude::*;
use stampede_test_support::redis_server::RedisServer;

use crate::config::Lifetime;
use crate::order;
use crate::redis::config::RedisConfig;
use crate::redis::endpoint::Endpoint;
use crate::redis::keys::RedisKeys;
use crate::redis::ops::Fill;

/// One fill over a value another load of the key wrote: the fence moved since this load's read
/// (`moved_by` > 0: another holder's fill) or did not (a load without the lock wrote under the
/// fence this one read). Either way the fill lands exactly when the stored value is older (its
/// source read before this load's), and otherwise the stored value stays and is what the
/// load's callers are handed; a fill that lands over a moved fence moves it on, so that the
/// load that moved it cannot write its older value after it. The stored value's source was read `written_off - stored_read_off`
/// ms (clamped at 0) before it was written: a slow load that writes after this one read may
/// still hold an older value.
fn refused_fill(endpoint: &Endpoint, server: &RedisServer, case: (u64, u64, u64, u64, u64)) {
    let (written_off, stored_read_off, read_off, stored_fence_off, moved_by) = case;
    let now: u64 = {
        let (seconds, micros): (u64, u64) = server.command(&["TIME"]);
        seconds * 1_000 + micros / 1_000
    };
    let keys = RedisKeys::of_base("order:{k}");
    let read_fence = 1_000_u64;
    let (written_at, read_from) = (now - 10 + written_off, now - 10 + read_off);
    let stored_read_at = now - 10 + stored_read_off.min(written_off);
    let stored = format!(
        "S3 {} {} {written_at} {stored_read_at} {} 0 -\nstored",
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
    let stored_fence = read_fence - 1 + stored_fence_off;
    let newer = order::may_be_newer(stored_read_at, read_from);
    assert_eq!(
        written.written, !newer,
        "stored (fence {stored_fence}, written at {written_at}) from a read at {stored_read_at}, \
         this load's at {read_from}, the fence moved by {moved_by}: a fill lands exactly over an \
         older value"
    );
    let held: String = server.command(&["GET", &keys.value]);
    assert_eq!(held.ends_with("stored"), newer, "Redis holds {held}");
    assert_eq!(
        written.stored.is_some(),
        !written.written,
        "a refused load's callers are handed what Redis keeps"
    );
    if written.written && moved_by > 0 {
        let fence: u64 = server.command(&["GET", &keys.fence]);
        assert!(
            fence > read_fence + moved_by,
            "a load that read the moved fence is fenced off by the newer value"
        );
    }
}

#[test]
fn a_refused_fill_hands_its_callers_what_redis_keeps() {
    let server = RedisServer::start();
    let endpoint = Endpoint::new(
        "order_unit",
        RedisConfig::new(&server.url()).unwrap().prefix("order"),
    );
    // Ties and near ties of the three times, stored fences before, at and after the read's, and
    // a fence that moved or did not.
    proptest!(ProptestConfig::with_cases(200), |(
        written_off in 0_u64..6,
        stored_read_off in 0_u64..6,
        read_off in 0_u64..6,
        stored_fence_off in 0_u64..3,
        moved_by in 0_u64..3,
    )| {
        refused_fill(
            &endpoint,
            &server,
            (written_off, stored_read_off, read_off, stored_fence_off, moved_by),
        );
    });
}

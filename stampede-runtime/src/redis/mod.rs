//! The Redis tier (feature `redis`): values shared by every process, a distributed lock so that
//! one process loads a key while the others wait for its publication, and a fall back to local
//! singleflight whenever Redis is down, slow or not configured.
//!
//! The protocol of one key, as a flight of this process runs it (`flow`):
//!
//! 1. `READ_OR_LOCK`: read the value; unless it is fresh, try `SET lock token NX PX lease`, in
//!    the same round trip.
//! 2. Holder: load (a watchdog renews the lease), then `FILL`: write the envelope, publish it
//!    on the key's channel and release the lock by compare-and-delete, in one round trip.
//! 3. Not the holder: subscribe to the key's channel, read again (a fill that happened before
//!    the subscription is not missed), then wait for the publication, which carries the value.
//!    If the holder dies, its lease runs out; the waiters read again then and one takes over.

pub(crate) mod config;
mod envelope;
pub(crate) mod flow;
pub(crate) mod invalidate;
mod keys;
mod lock;
mod pubsub;
mod scripts;
mod tier;

use serde::Serialize;
use serde::de::DeserializeOwned;

pub use config::{REDIS_URL_VAR, RedisConfig};

use crate::cache::{Key, Value};
use crate::shared::Shared;

/// How one cache writes its keys and values for Redis.
pub(crate) struct Codec<K, V> {
    pub(crate) args: fn(&K) -> Result<String, keys::KeyError>,
    pub(crate) encode: fn(&V) -> Result<Vec<u8>, String>,
    pub(crate) decode: fn(&[u8]) -> Result<V, String>,
}

/// Values are shared through Redis: keys written by serde as readable text, values as
/// MessagePack.
pub fn redis<K: Key + Serialize, V: Value + Serialize + DeserializeOwned>() -> Shared<K, V> {
    Shared::through(Codec {
        args: keys::args_text::<K>,
        encode: |value| envelope::encode(value).map_err(|e| e.to_string()),
        decode: |payload| envelope::decode(payload).map_err(|e| e.to_string()),
    })
}

//! A small sample of a cache's most-hit keys and the age of their values, for debug pages.
//!
//! One hit in [`SAMPLE_EVERY`] is looked at (the hit counter's value decides, so the others pay
//! nothing), and the sampled keys compete for [`KEEP`] places by the space-saving algorithm: a
//! new key takes the place of the least counted one and inherits its count, so a key that is hit
//! often always ends up in the sample. The hits reported leave the inherited count out and scale
//! the samples by the sampling rate, capped by the cache's own hit count: an estimate of the hits
//! while the key held its place, within [`SAMPLE_EVERY`] of the truth for a key hit steadily. A
//! sample that finds the list busy is skipped: the hit path never waits.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::clock::Nanos;
use crate::kv::Key;

/// One hit in this many is sampled (a power of two: the check is a mask).
pub(crate) const SAMPLE_EVERY: u64 = 64;
/// How many keys the sample keeps.
pub(crate) const KEEP: usize = 8;

/// One of a cache's most-hit keys, as [`Stats::hot_keys`](crate::Stats::hot_keys) lists them.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct HotKey {
    /// The key, as its `Debug` output writes it.
    pub key: String,
    /// An estimate of the key's hits while it was in the sample: its sampled hits times the
    /// sampling rate (1 hit in 64), never more than the cache's hits. After one hit it reads 1;
    /// for a key hit steadily it is within 64 of the truth.
    pub hits: u64,
    /// How old the key's value was when last sampled.
    #[serde(rename = "age_ms", serialize_with = "crate::config::millis")]
    pub age: Duration,
}

pub(crate) struct HotKeys<K> {
    keys: Mutex<Vec<Sampled<K>>>,
}

struct Sampled<K> {
    key: K,
    /// Samples counted for this place, including those inherited from the key it replaced.
    count: u64,
    /// The part of `count` inherited when the key took the place.
    inherited: u64,
    filled_at: Instant,
}

impl<K: Key> HotKeys<K> {
    pub(crate) fn new() -> Self {
        HotKeys {
            keys: Mutex::new(Vec::with_capacity(KEEP)),
        }
    }

    /// Counts hit number `hit` of `key`, if it is sampled; a sampled hit also records the age
    /// of its value, filled at `filled_at()` (asked only then), in `ages` (`cache_key_age_seconds`).
    #[inline]
    pub(crate) fn hit(
        &self,
        hit: u64,
        key: &K,
        filled_at: impl FnOnce() -> Nanos,
        ages: &metrics::Histogram,
    ) {
        if hit.is_multiple_of(SAMPLE_EVERY) {
            self.sample(key, filled_at().instant(), ages);
        }
    }

    #[cold]
    fn sample(&self, key: &K, filled_at: Instant, ages: &metrics::Histogram) {
        ages.record(Instant::now().saturating_duration_since(filled_at));
        let Ok(mut keys) = self.keys.try_lock() else {
            return;
        };
        if let Some(known) = keys.iter_mut().find(|known| known.key == *key) {
            known.count += 1;
            known.filled_at = filled_at;
        } else if keys.len() < KEEP {
            keys.push(Sampled {
                key: key.clone(),
                count: 1,
                inherited: 0,
                filled_at,
            });
        } else if let Some(least) = keys.iter_mut().min_by_key(|known| known.count) {
            *least = Sampled {
                key: key.clone(),
                count: least.count + 1,
                inherited: least.count,
                filled_at,
            };
        }
    }

    /// The sampled keys, most hit first; `hits` is the cache's hit count, which caps estimates.
    pub(crate) fn snapshot(&self, hits: u64) -> Vec<HotKey> {
        let now = Instant::now();
        let keys = self
            .keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut hot: Vec<HotKey> = keys
            .iter()
            .map(|known| HotKey {
                key: format!("{:?}", known.key),
                hits: ((known.count - known.inherited) * SAMPLE_EVERY).min(hits),
                age: now.saturating_duration_since(known.filled_at),
            })
            .collect();
        hot.sort_by(|a, b| b.hits.cmp(&a.hits).then_with(|| a.key.cmp(&b.key)));
        hot
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_most_hit_keys_stay_in_the_sample() {
        let hot = HotKeys::new();
        let now = Nanos::of(Instant::now());
        let mut hit = 0;
        // Key 1 gets half the hits; keys 100.. get one sampled hit each and come and go.
        for round in 0..2_000u64 {
            for key in [1, 100 + round] {
                hit += SAMPLE_EVERY;
                hot.hit(hit, &key, || now, &metrics::Histogram::noop());
            }
        }
        let sample = hot.snapshot(hit);
        assert_eq!(sample.len(), KEEP);
        assert_eq!(sample[0].key, "1");
        assert!(sample[0].hits >= 2_000 * SAMPLE_EVERY, "{sample:?}");
        // The passing keys were each sampled once: they report that, not the count they took
        // over from the key they replaced.
        assert!(
            sample[1..].iter().all(|hot| hot.hits == SAMPLE_EVERY),
            "{sample:?}"
        );
    }
}

//! Invalidations announced by any process drop the key from every process's memory.
//!
//! The message on `{prefix}:invalidations` is `{cache name}\n{argument text}`: each process
//! drops, from the caches of that name, the entries whose key writes as that text.

use std::sync::{PoisonError, RwLock};

use crate::cache::{Cache, Key, Value};

/// A cache whose in-memory copies can be dropped by their Redis text.
pub(crate) trait DropLocal: Send + Sync {
    fn name(&self) -> &str;
    fn drop_by_args(&self, args: &str);
}

static CACHES: RwLock<Vec<&'static dyn DropLocal>> = RwLock::new(Vec::new());

pub(crate) fn register(cache: &'static dyn DropLocal) {
    CACHES
        .write()
        .unwrap_or_else(PoisonError::into_inner)
        .push(cache);
}

pub(crate) fn message(name: &str, args: &str) -> Vec<u8> {
    format!("{name}\n{args}").into_bytes()
}

/// Handles one message of the invalidation channel.
pub(crate) fn on_message(payload: &[u8]) {
    let Some((name, args)) = std::str::from_utf8(payload)
        .ok()
        .and_then(|text| text.split_once('\n'))
    else {
        return;
    };
    let caches = CACHES.read().unwrap_or_else(PoisonError::into_inner);
    for cache in caches.iter().filter(|cache| cache.name() == name) {
        cache.drop_by_args(args);
    }
}

impl<K: Key, V: Value> DropLocal for Cache<K, V> {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn drop_by_args(&self, args: &str) {
        let Some(codec) = &self.shared.codec else {
            return;
        };
        let (text_of, args) = (codec.args, args.to_owned());
        self.invalidated();
        // Only caches with a codec are built with invalidation closures, so this cannot fail.
        let _ = self
            .store
            .invalidate_entries_if(move |key, _| text_of(key).is_ok_and(|text| text == args));
    }
}

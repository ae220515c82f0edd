//! Cache stampede protection for async Rust.
//!
//! See the [README](https://github.com/stampede-rs/stampede) for the full story; in short,
//! put [`cached`] on the async function that loads your data.

pub use stampede_macros::cached;
pub use stampede_runtime::{
    Backend, CacheInfo, Config, Error, LoadError, Lock, Stats, UpstreamError, caches, invalidate,
    stats,
};
#[cfg(feature = "redis")]
pub use stampede_runtime::{Busy, REDIS_URL_VAR, RedisConfig};

#[doc(hidden)]
pub mod __private {
    pub use stampede_runtime::__private::*;
}

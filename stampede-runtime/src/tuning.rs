//! Options set at run time (`stampede::configure`): overrides of a cache's numbers, by name,
//! kept for the caches built later and applied to those built already, for their new fills and
//! loads. What can change is what a fill, a load or a wait reads (`ttl`, `stale`, `jitter`,
//! `timeout`, `retries`, `backoff`, and where the attribute turns them on, the values of
//! `fail_safe`, `fail_safe_throttle`, `refresh_after`, `xfetch`, `memory_ttl`, `soft_timeout`,
//! `compress` and `batch_max`); what shapes the cache (its backend, lock, capacity, breaker,
//! `max_loads`, which options are on) is the attribute's.

use std::collections::HashMap;
use std::sync::{PoisonError, RwLock};
use std::time::Duration;

use crate::config::Config;
use crate::error::Error;

/// The run-time overrides of one cache name's options; `None`: the attribute's.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Overrides {
    pub(crate) ttl: Option<Duration>,
    pub(crate) stale: Option<Duration>,
    pub(crate) jitter: Option<u8>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) retries: Option<u32>,
    pub(crate) backoff: Option<Duration>,
    pub(crate) fail_safe: Option<Duration>,
    pub(crate) fail_safe_throttle: Option<Duration>,
    pub(crate) refresh_after: Option<Duration>,
    pub(crate) xfetch: Option<f64>,
    pub(crate) memory_ttl: Option<Duration>,
    pub(crate) soft_timeout: Option<Duration>,
    pub(crate) compress: Option<usize>,
    pub(crate) batch_max: Option<usize>,
}

/// The overrides set so far, by cache name.
static SET: RwLock<Option<HashMap<String, Overrides>>> = RwLock::new(None);

impl Overrides {
    /// These overrides on top of `earlier` (set before for the same name): the later value of
    /// each option wins.
    pub(crate) fn over(&self, earlier: &Overrides) -> Overrides {
        Overrides {
            ttl: self.ttl.or(earlier.ttl),
            stale: self.stale.or(earlier.stale),
            jitter: self.jitter.or(earlier.jitter),
            timeout: self.timeout.or(earlier.timeout),
            retries: self.retries.or(earlier.retries),
            backoff: self.backoff.or(earlier.backoff),
            fail_safe: self.fail_safe.or(earlier.fail_safe),
            fail_safe_throttle: self.fail_safe_throttle.or(earlier.fail_safe_throttle),
            refresh_after: self.refresh_after.or(earlier.refresh_after),
            xfetch: self.xfetch.or(earlier.xfetch),
            memory_ttl: self.memory_ttl.or(earlier.memory_ttl),
            soft_timeout: self.soft_timeout.or(earlier.soft_timeout),
            compress: self.compress.or(earlier.compress),
            batch_max: self.batch_max.or(earlier.batch_max),
        }
    }

    /// `built` (the options as the attribute gave them) with these overrides, or an error that
    /// names the cache, the option and why: the attribute's checks of a literal
    /// ([`Config::check`]), made of the values given here.
    pub(crate) fn applied_to(&self, built: &Config) -> Result<Config, Error> {
        let name = &built.name;
        let refuse = |option: &str, why: String| {
            Err(Error::invalid_config(format!(
                "cache `{name}`: `{option}` cannot be set so at run time: {why}"
            )))
        };
        let mut config = built.clone();
        config.ttl = self.ttl.unwrap_or(config.ttl);
        config.stale = self.stale.unwrap_or(config.stale);
        config.jitter = self.jitter.unwrap_or(config.jitter);
        config.timeout = self.timeout.unwrap_or(config.timeout);
        config.retries = self.retries.unwrap_or(config.retries);
        config.backoff = self.backoff.unwrap_or(config.backoff);
        config.fail_safe_throttle = self.fail_safe_throttle.unwrap_or(config.fail_safe_throttle);
        if self.fail_safe.is_some_and(|keep| keep.is_zero()) {
            return refuse("fail_safe", "it must be above zero".into());
        }
        // The options the attribute turns on or leaves off: run time sets a value, never
        // turns one on (`fail_safe_throttle` is `fail_safe`'s).
        let not_on = |option: &str| {
            format!("the attribute does not turn `{option}` on, which run time cannot")
        };
        if self.fail_safe_throttle.is_some() && built.fail_safe.is_none() {
            return refuse("fail_safe_throttle", not_on("fail_safe"));
        }
        let turned_on = [
            ("fail_safe", on(self.fail_safe, &mut config.fail_safe)),
            (
                "refresh_after",
                on(self.refresh_after, &mut config.refresh_after),
            ),
            ("xfetch", on(self.xfetch, &mut config.xfetch)),
            ("memory_ttl", on(self.memory_ttl, &mut config.memory_ttl)),
            (
                "soft_timeout",
                on(self.soft_timeout, &mut config.soft_timeout),
            ),
            ("compress", on(self.compress, &mut config.compress)),
            ("batch_max", on(self.batch_max, &mut config.batch_max)),
        ];
        if let Some((option, _)) = turned_on.iter().find(|(_, on)| !on) {
            return refuse(option, not_on(option));
        }
        match config.check() {
            Ok(()) => Ok(config),
            Err(refusal) => refuse(refusal.option, refusal.why),
        }
    }
}

/// Sets `option` to `given`, if given, where the attribute turned it on; whether that is so (or
/// nothing was given).
fn on<T>(given: Option<T>, option: &mut Option<T>) -> bool {
    match (given, option.is_some()) {
        (None, _) => true,
        (Some(_), false) => false,
        (Some(value), true) => {
            *option = Some(value);
            true
        }
    }
}

/// Records `overrides` for the caches named `name`, on top of those set before; returns them
/// all.
pub(crate) fn set(name: &str, overrides: &Overrides) -> Overrides {
    let mut set = SET.write().unwrap_or_else(PoisonError::into_inner);
    let all = set.get_or_insert_with(HashMap::new);
    let merged = overrides.over(all.get(name).unwrap_or(&Overrides::default()));
    all.insert(name.to_owned(), merged.clone());
    merged
}

/// Forgets what was set for the caches named `name` (the simulation's replay of a run).
#[cfg(feature = "simulation")]
pub(crate) fn forget(name: &str) {
    if let Some(all) = SET.write().unwrap_or_else(PoisonError::into_inner).as_mut() {
        all.remove(name);
    }
}

/// What has been set for the caches named `name`, on top of `earlier` (not yet recorded).
pub(crate) fn merged(name: &str, overrides: &Overrides) -> Overrides {
    let set = SET.read().unwrap_or_else(PoisonError::into_inner);
    let earlier = set.as_ref().and_then(|all| all.get(name)).cloned();
    overrides.over(&earlier.unwrap_or_default())
}

/// The options a cache built now runs with: `built` with the overrides set for the names it
/// answers to (its own on top of a generic function's written name), or `built` alone (with
/// an error logged) when they do not fit it (a method's cache of a name another cache
/// validated them against).
pub(crate) fn options_of(built: &Config) -> Config {
    let set = SET.read().unwrap_or_else(PoisonError::into_inner);
    // The stem's first: the cache's own name is the later, and wins.
    let Some(overrides) = crate::names::answered_by(&built.name)
        .filter_map(|name| set.as_ref()?.get(name).cloned())
        .reduce(|earlier, later| later.over(&earlier))
    else {
        return built.clone();
    };
    match overrides.applied_to(built) {
        Ok(config) => config,
        Err(error) => {
            tracing::error!(cache = %built.name, %error, "stampede: the options set at run time do not fit this cache; it runs with its attribute's");
            built.clone()
        }
    }
}

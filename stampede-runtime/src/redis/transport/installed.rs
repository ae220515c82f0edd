//! The connections installed in this process (`RedisConfig::install`, `install_as`, and the
//! default one from `STAMPEDE_REDIS_URL`), each an [`Endpoint`], looked up by name.
//!
//! Apart from `config` so that a configuration names no endpoint: the endpoint is built from it.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, PoisonError, RwLock};

use crate::redis::transport::config::{REDIS_URL_VAR, RedisConfig};
use crate::redis::transport::endpoint::Endpoint;

impl RedisConfig {
    /// Makes this the default connection, replacing any earlier one.
    pub fn install(self) {
        install(DEFAULT, self);
    }

    /// Registers this connection under `name`, replacing any earlier one of that name.
    pub fn install_as(self, name: &str) {
        install(name, self);
    }
}

/// The default connection's name.
pub(crate) const DEFAULT: &str = "";

static INSTALLED: RwLock<Option<HashMap<String, Arc<Endpoint>>>> = RwLock::new(None);
static FROM_ENV: OnceLock<Option<Arc<Endpoint>>> = OnceLock::new();

fn install(name: &str, config: RedisConfig) {
    let connection = Endpoint::new(name, config);
    INSTALLED
        .write()
        .unwrap_or_else(PoisonError::into_inner)
        .get_or_insert_with(HashMap::new)
        .insert(name.to_owned(), connection);
}

/// The connection named `name` (`None`: the default one), or `None` when it is not configured.
pub(crate) fn lookup(name: Option<&str>) -> Option<Arc<Endpoint>> {
    let key = name.unwrap_or(DEFAULT);
    let installed = INSTALLED.read().unwrap_or_else(PoisonError::into_inner);
    if let Some(tier) = installed.as_ref().and_then(|tiers| tiers.get(key)) {
        return Some(tier.clone());
    }
    drop(installed);
    if key != DEFAULT {
        return None;
    }
    FROM_ENV
        .get_or_init(|| {
            let url = std::env::var(REDIS_URL_VAR).ok()?;
            match RedisConfig::new(&url) {
                Ok(config) => Some(Endpoint::new(DEFAULT, config)),
                Err(error) => {
                    tracing::error!(%error, "stampede: {REDIS_URL_VAR} is set but unusable; caches run without Redis");
                    None
                }
            }
        })
        .clone()
}

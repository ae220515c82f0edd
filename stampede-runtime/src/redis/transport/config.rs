//! How a process tells stampede where its Redis is: a builder, installed once at start-up under
//! a name (or as the default), with `STAMPEDE_REDIS_URL` as the default's fallback.

use std::fmt;
use std::time::Duration;

use crate::error::Error;
use crate::redis::codec::envelope;
use crate::redis::transport::tls::{self, Tls};

/// The environment variable read for the default connection when none was installed in code.
pub const REDIS_URL_VAR: &str = "STAMPEDE_REDIS_URL";

/// Settings of one Redis connection, from [`RedisConfig::new`]; install them with
/// [`install`](RedisConfig::install) (the default connection) or
/// [`install_as`](RedisConfig::install_as) (a named one, picked with `#[cached(redis = "name")]`).
///
/// ```no_run
/// # fn main() -> Result<(), stampede::Error> {
/// use std::time::Duration;
/// use stampede::RedisConfig;
///
/// RedisConfig::new("redis://cache.internal:6379/0")?
///     .prefix("shop")
///     .op_timeout(Duration::from_millis(100))
///     .install();
/// RedisConfig::new("redis://:secret@sessions.internal/1")?.install_as("sessions");
/// # Ok(()) }
/// ```
///
/// A URL is accepted as the `redis` crate accepts it: `redis://[user][:password@]host[:port][/db]`,
/// `redis+unix:///path`; `user` is an ACL user (Redis 6 and later), and a URL with a password
/// only authenticates as `default`. Processes on two databases of one server share nothing, not
/// even with one prefix: the pub/sub channels of a database other than 0 are named with it. `rediss://` (TLS) needs stampede's `tls` feature: the
/// server's certificate is then checked against the webpki roots, or against the CA given with
/// `tls_root_ca`, and `tls_client_cert` presents a client certificate (mutual TLS); both exist
/// with the feature. Without the feature a `rediss://` URL is an [`Error::InvalidConfig`] naming
/// it.
#[derive(Clone)]
pub struct RedisConfig {
    /// Every node given, in order (one unless a comma-separated list was given): the whole
    /// server when standalone, the seeds of the slot map on a cluster.
    pub(crate) nodes: Vec<redis::Client>,
    url: String,
    pub(crate) prefix: String,
    pub(crate) op_timeout: Duration,
    pub(crate) lease: Duration,
    pub(crate) lock_wait: Duration,
    pub(crate) cooldown: Duration,
    pub(crate) failures_before_cooldown: u32,
    pub(crate) connect_timeout: Duration,
    pub(crate) heartbeat: Duration,
    /// How long memory is trusted while the feed is not live (`trust_while_deaf`); `None`: the
    /// staleness bound.
    pub(crate) deaf_trust: Option<Duration>,
    /// About how many invalidations the feed's log keeps (`invalidation_log`).
    pub(crate) log_len: usize,
    /// The largest value payload written to or read from Redis, in bytes.
    pub(crate) max_value_bytes: usize,
    /// The certificates for `rediss://` nodes (feature `tls`), see `tls`.
    pub(crate) tls: Tls,
}

/// How many invalidations the feed's log keeps by default.
const DEFAULT_LOG_LEN: usize = 10_000;

/// The longest any duration of a [`RedisConfig`] is taken to be (24h): longer ones are clamped
/// to it, so that `Duration::MAX` is accepted and never overflows a deadline.
pub(crate) const MAX_SETTING: Duration = Duration::from_secs(24 * 60 * 60);

impl RedisConfig {
    /// Settings for the Redis at `url` (one node's URL, or a comma-separated list of a Redis
    /// Cluster's nodes), with the defaults: prefix `stampede`, operation timeout
    /// 250ms, lock lease 5s, lock wait 10s, cool-down 1s after 3 failures in a row,
    /// connection setup 1s, heartbeat 1s.
    ///
    /// Whether the server is a Redis Cluster is asked of it when connecting (`HELLO`, else
    /// `INFO cluster`, else `CLUSTER INFO`):
    /// one node's URL is enough, and the same caches and attributes work on either. A list of
    /// several URLs is always a cluster; its nodes are the seeds of the slot map, so a cache can
    /// connect while some of them are down.
    ///
    /// Fails with [`Error::InvalidConfig`] when a URL does not parse; nothing is connected
    /// until a cache needs Redis.
    pub fn new(url: &str) -> Result<Self, Error> {
        let tls = Tls::default();
        Ok(RedisConfig {
            nodes: nodes(url, &tls)?,
            url: url.to_owned(),
            prefix: "stampede".to_owned(),
            op_timeout: Duration::from_millis(250),
            lease: Duration::from_secs(5),
            lock_wait: Duration::from_secs(10),
            cooldown: Duration::from_secs(1),
            failures_before_cooldown: 3,
            connect_timeout: Duration::from_secs(1),
            heartbeat: Duration::from_secs(1),
            deaf_trust: None,
            log_len: DEFAULT_LOG_LEN,
            max_value_bytes: envelope::DEFAULT_MAX_VALUE_BYTES,
            tls,
        })
    }

    /// Trusts only the CA certificate(s) in `pem` (PEM text, `-----BEGIN CERTIFICATE-----`) for
    /// the servers of `rediss://` URLs, instead of the webpki roots: for a private CA, or a
    /// managed service's own one. Every connection of this Redis uses it: commands, pub/sub and,
    /// on a cluster, every node's.
    ///
    /// Fails with [`Error::InvalidConfig`] when `pem` holds no usable certificate, or when a URL
    /// given to [`new`](RedisConfig::new) is not a TLS one (`rediss://`).
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let ca = std::fs::read("/etc/redis/tls/ca.crt")?;
    /// stampede::RedisConfig::new("rediss://cache.internal:6380/0")?
    ///     .tls_root_ca(ca)?
    ///     .install();
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_root_ca(mut self, pem: impl AsRef<[u8]>) -> Result<Self, Error> {
        self.tls = self.tls.with_root_ca(pem.as_ref())?;
        self.nodes = nodes(&self.url, &self.tls)?;
        Ok(self)
    }

    /// Presents the client certificate (chain) `cert_pem`, whose private key is `key_pem`
    /// (PKCS#8, PKCS#1 or SEC1 PEM), to servers that ask for one (`tls-auth-clients yes`, mutual
    /// TLS). The server's certificate is still checked, against the webpki roots or the CA of
    /// [`tls_root_ca`](RedisConfig::tls_root_ca).
    ///
    /// Fails with [`Error::InvalidConfig`] when either does not parse, when the key is not the
    /// certificate's, or when a URL is not a TLS one.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// stampede::RedisConfig::new("rediss://cache.internal:6380/0")?
    ///     .tls_root_ca(std::fs::read("ca.crt")?)?
    ///     .tls_client_cert(std::fs::read("client.crt")?, std::fs::read("client.key")?)?
    ///     .install();
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_client_cert(
        mut self,
        cert_pem: impl AsRef<[u8]>,
        key_pem: impl AsRef<[u8]>,
    ) -> Result<Self, Error> {
        self.tls = self
            .tls
            .with_client_cert(cert_pem.as_ref(), key_pem.as_ref())?;
        self.nodes = nodes(&self.url, &self.tls)?;
        Ok(self)
    }

    /// The namespace every key starts with, so that several applications can share a Redis.
    /// A prefix with `{` or `}` would break the keys' hash tags; those characters are dropped.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into().replace(['{', '}'], "");
        self
    }

    /// Settings for the Redis named by the `STAMPEDE_REDIS_URL` variable, with the defaults.
    ///
    /// Fails with [`Error::InvalidConfig`] when the variable is missing or not a usable URL: for a
    /// service that must not start without its shared cache (the caches' own fallback, when no
    /// Redis is configured, is to run on local singleflight and warn once).
    ///
    /// ```no_run
    /// # fn main() -> Result<(), stampede::Error> {
    /// stampede::RedisConfig::from_env()?.prefix("shop").install();
    /// # Ok(()) }
    /// ```
    pub fn from_env() -> Result<Self, Error> {
        let url = std::env::var(REDIS_URL_VAR).map_err(|_| {
            Error::invalid_config(format!(
                "{REDIS_URL_VAR} is not set: set it to the Redis URL, e.g. redis://127.0.0.1:6379/"
            ))
        })?;
        RedisConfig::new(&url)
    }

    /// Bound on each Redis call. Past it the call counts as a failure and the cache serves from
    /// this process instead; two timeouts in a row on one connection replace it (a half-open
    /// connection answers nothing, ever). Clamped to [1ms, 24h].
    pub fn op_timeout(mut self, timeout: Duration) -> Self {
        self.op_timeout = clamp(timeout, Duration::from_millis(1));
        self
    }

    /// How long a lock is held without renewal. A watchdog renews it every third of the lease
    /// while the holder's load runs, so a lease only runs out when its holder died. Clamped to
    /// [30ms, 24h].
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = clamp(lease, Duration::from_millis(30));
        self
    }

    /// How long a process waits for another's load before it loads the key itself. Clamped to
    /// at most 24h.
    pub fn lock_wait(mut self, wait: Duration) -> Self {
        self.lock_wait = clamp(wait, Duration::ZERO);
        self
    }

    /// How long Redis is skipped after `failures` failed calls in a row (at least 1). The
    /// cool-down is clamped to at most 24h.
    pub fn cooldown(mut self, cooldown: Duration, failures: u32) -> Self {
        self.cooldown = clamp(cooldown, Duration::ZERO);
        self.failures_before_cooldown = failures.max(1);
        self
    }

    /// Bound on making this process's connections to Redis (the command connection, and the
    /// pub/sub connection with its first subscriptions). A call waits for a connection being
    /// made at most its operation timeout; the connection goes on being made in the background,
    /// and concurrent calls share that one attempt. Clamped to [1ms, 24h].
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = clamp(timeout, Duration::from_millis(1));
        self
    }

    /// How often this process checks that its invalidation feed (the pub/sub connection) is
    /// live, by publishing a token on a channel of its own and hearing it back.
    ///
    /// A process serves a value from memory at most `2 × heartbeat + op_timeout` after an
    /// invalidation it missed (2.25s with the defaults): a feed that was cut or went half-open
    /// is noticed by then, and the memory of every Redis-backed cache of the process is taken
    /// out of service. Until the feed is back (it is resubscribed in the background, and what
    /// it missed read from the [invalidation log](Self::invalidation_log)), values read from
    /// Redis are kept in memory no longer than that bound. Clamped to [10ms, 24h].
    pub fn heartbeat(mut self, every: Duration) -> Self {
        self.heartbeat = clamp(every, Duration::from_millis(10));
        self
    }

    /// How long this process trusts its memory while its invalidation feed is not live (Redis
    /// down or paused, the subscription lost or quiet): what it held when the feed was lost, up
    /// to `trust` after the last heartbeat it heard, and what it loads or reads meanwhile, up to
    /// `trust` after the read. By default the staleness bound (`2 × heartbeat + op_timeout`, see
    /// [`heartbeat`](Self::heartbeat)), so that a missed invalidation is outlived by at most
    /// that, at the cost of a load per key and process every bound during an outage. A longer
    /// trust trades that bound for fewer loads: an invalidation missed while deaf may be
    /// outlived by up to `trust` (when the feed is back the invalidations missed are read from
    /// the [invalidation log](Self::invalidation_log), or memory is dropped when the log cannot
    /// tell, but for what is still within its trust). Clamped to at most 24h.
    pub fn trust_while_deaf(mut self, trust: Duration) -> Self {
        self.deaf_trust = Some(clamp(trust, Duration::ZERO));
        self
    }

    /// About how many invalidations the feed's log keeps (default 10,000; clamped to [16,
    /// 10,000,000]). Every invalidation announced through this Redis is also appended to a
    /// stream, `{prefix}:invalidations:log` (on a cluster, `{prefix}:{feed|{prefix}}:log`),
    /// trimmed to about this length. A process whose feed was lost (a lost connection, a pause,
    /// a quiet subscription) reads the invalidations it missed from there when it subscribes
    /// again, drops exactly those keys and tags, and serves the rest of its memory again; when
    /// the log no longer reaches back to its last position (trimmed past it, or the server
    /// restarted), it drops its memory instead, but for what it kept while deaf, bounded as it
    /// was. A longer log covers longer gaps at a busier writer's rate, for about 100 bytes an
    /// entry plus the message.
    pub fn invalidation_log(mut self, entries: usize) -> Self {
        self.log_len = entries.clamp(16, 10_000_000);
        self
    }

    /// How long memory is trusted while the feed is not live: `trust_while_deaf`, else the
    /// staleness bound.
    pub(crate) fn trusted_while_deaf(&self) -> Duration {
        self.deaf_trust.unwrap_or_else(|| self.staleness_bound())
    }

    /// The largest value, encoded, that a cache writes to or reads from this Redis (default
    /// 8 MiB; clamped to [1 KiB, 512 MiB], Redis's own limit). A larger value that a load
    /// returns is served and kept in this process's memory only, with a warning naming the
    /// cache (`prime` returns [`Error::InvalidConfig`] naming it). A larger value found in
    /// Redis, written by a process with a larger bound or by hand, is a miss counted as a
    /// decode error: the reads leave it on the server (a hit reads at most its first
    /// 16 KiB), so it never slows the connection that the other caches share, and the key's load overwrites it.
    pub fn max_value_size(mut self, bytes: usize) -> Self {
        self.max_value_bytes = bytes.clamp(1 << 10, 512 << 20);
        self
    }

    /// The database the connections select: the URL's (`redis://host/2`, `?db=2`), the first
    /// node's for a list of nodes, 0 when it names none. Pub/sub ignores it, so the channels'
    /// names carry it (see `keys::in_database`).
    pub(crate) fn db(&self) -> i64 {
        self.nodes
            .first()
            .map_or(0, |node| node.get_connection_info().redis_settings().db())
    }

    /// How long after an invalidation this process may still serve the old value from memory
    /// if it missed that invalidation: `2 × heartbeat + op_timeout`.
    pub(crate) fn staleness_bound(&self) -> Duration {
        self.heartbeat
            .saturating_mul(2)
            .saturating_add(self.op_timeout)
    }
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &redact(&self.url))
            .field("prefix", &self.prefix)
            .field("op_timeout", &self.op_timeout)
            .field("lease", &self.lease)
            .field("lock_wait", &self.lock_wait)
            .field("cooldown", &self.cooldown)
            .field("connect_timeout", &self.connect_timeout)
            .field("heartbeat", &self.heartbeat)
            .field("max_value_bytes", &self.max_value_bytes)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

fn clamp(duration: Duration, least: Duration) -> Duration {
    duration.clamp(least, MAX_SETTING)
}

/// The clients of the nodes of `url` (one URL, or a comma-separated list), with `tls`.
fn nodes(url: &str, tls: &Tls) -> Result<Vec<redis::Client>, Error> {
    let nodes = url
        .split(',')
        .map(str::trim)
        .filter(|node| !node.is_empty())
        .map(|node| open(node, tls))
        .collect::<Result<Vec<_>, _>>()?;
    if nodes.is_empty() {
        return Err(Error::invalid_config(format!(
            "`{}` names no Redis node",
            redact(url)
        )));
    }
    Ok(nodes)
}

/// The client of one node's URL.
fn open(url: &str, tls: &Tls) -> Result<redis::Client, Error> {
    tls::check_scheme(url, &redact(url), cfg!(feature = "tls"))?;
    #[cfg(feature = "tls")]
    if tls::is_tls_url(url) {
        tls::install_crypto_provider();
    }
    tls::client(url, tls).map_err(|e| {
        let wrong = explain(url).unwrap_or_else(|| e.to_string());
        Error::invalid_config(format!(
            "`{}` is not a usable Redis URL: {wrong}",
            redact(url)
        ))
    })
}

/// The schemes of a Redis reached over TCP, and over a Unix socket (the `redis` crate's).
const TCP_SCHEMES: &[&str] = &["redis", "rediss", "valkey", "valkeys"];
const UNIX_SCHEMES: &[&str] = &["redis+unix", "valkey+unix", "unix"];

/// A URL of the right form, for the messages.
const EXAMPLE: &str = "redis://host:6379/0";

/// What is wrong with a URL the `redis` crate refused, naming the part to fix (its scheme,
/// host, port, database number, a user name or password that needs escaping); `None` when no
/// part is found wrong, for the crate's own words. It never quotes the user name or password.
fn explain(url: &str) -> Option<String> {
    let url = url.trim();
    let checked = after_tcp_scheme(url).and_then(|rest| match rest {
        Some(rest) => check_after_scheme(url, rest),
        // The crate's words ("Missing path", "Invalid database number") say it for a socket.
        None => Ok(()),
    });
    checked.err()
}

/// What follows `scheme://` in a TCP URL; `None` for a Unix socket's.
fn after_tcp_scheme(url: &str) -> Result<Option<&str>, String> {
    let scheme = url
        .split_once(':')
        .map(|(scheme, _)| scheme)
        .filter(|scheme| is_scheme(scheme));
    let Some(scheme) = scheme else {
        return Err(format!(
            "it does not start with a scheme: write it as {EXAMPLE} (rediss:// for TLS, \
             redis+unix:///path for a Unix socket)"
        ));
    };
    let known = |schemes: &[&str]| schemes.iter().any(|s| s.eq_ignore_ascii_case(scheme));
    if known(UNIX_SCHEMES) {
        return Ok(None);
    }
    let after_scheme = &url[scheme.len() + 1..];
    if !known(TCP_SCHEMES) {
        return Err(match after_scheme.starts_with("//") {
            true => format!(
                "`{scheme}://` is not a Redis scheme: use redis:// (rediss:// for TLS, \
                 redis+unix:// for a Unix socket)"
            ),
            // `localhost:6379`, `user:password@host`: what precedes the `:` is no scheme.
            false => format!("it does not start with a scheme: write it as {EXAMPLE}"),
        });
    }
    match after_scheme.strip_prefix("//") {
        Some(rest) => Ok(Some(rest)),
        None => Err(format!("it needs `//` after `{scheme}:`, as in {EXAMPLE}")),
    }
}

/// Checks what follows `scheme://` in `url`: the user and password's escapes, the host, the
/// port, the database number, the query's protocol and the fragment.
fn check_after_scheme(url: &str, rest: &str) -> Result<(), String> {
    // The host part ends at the first `/`, `?` or `#`, even one inside a password.
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, after) = rest.split_at(end);
    let host_port = match authority.rfind('@') {
        Some(at) if !decodes(&authority[..at]) => {
            return Err(
                "its user name or password holds a %-escape that is not UTF-8 text: write a `%` \
                 in it as %25"
                    .to_owned(),
            );
        }
        Some(at) => &authority[at + 1..],
        None if after.contains('@') => {
            return Err(
                "its user name or password holds a `/`, `?` or `#`, which ends the host part of \
                 a URL: percent-encode it there (`/` as %2F, `?` as %3F, `#` as %23, `%` as %25)"
                    .to_owned(),
            );
        }
        None => authority,
    };
    let (host, port) = host_and_port(host_port)?;
    check_host(host)?;
    check_port(port)?;
    check_tail(url, after)
}

/// The host and the port (if any) of `host:port` or `[ipv6]:port`.
fn host_and_port(host_port: &str) -> Result<(&str, Option<&str>), String> {
    match host_port.strip_prefix('[') {
        Some(bracketed) => {
            let Some((address, port)) = bracketed.split_once(']') else {
                return Err(
                    "its IPv6 address has no closing `]`: write it as redis://[::1]:6379/0"
                        .to_owned(),
                );
            };
            if address.parse::<std::net::Ipv6Addr>().is_err() {
                return Err(format!("`[{address}]` is not an IPv6 address"));
            }
            match port.strip_prefix(':') {
                Some(port) => Ok((address, Some(port))),
                None if port.is_empty() => Ok((address, None)),
                None => Err(format!("`{port}` after its IPv6 address is not `:port`")),
            }
        }
        None if host_port.matches(':').count() > 1 => Err(
            "its host looks like an IPv6 address, which goes in brackets: redis://[::1]:6379/0"
                .to_owned(),
        ),
        None => Ok(match host_port.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (host_port, None),
        }),
    }
}

/// A host this process can connect to.
fn check_host(host: &str) -> Result<(), String> {
    if host.is_empty() {
        return Err(format!("it names no host: write it as {EXAMPLE}"));
    }
    let forbidden = |c: char| c.is_whitespace() || c.is_control() || "<>[]\\^|".contains(c);
    if let Some(c) = host.chars().find(|c| forbidden(*c)) {
        return Err(format!(
            "its host `{host}` holds {c:?}, which a host name cannot"
        ));
    }
    if host == "0.0.0.0" || host == "::" {
        return Err(format!(
            "`{host}` is the wildcard address a server listens on, not one to connect to: name the \
             server's host, e.g. 127.0.0.1"
        ));
    }
    Ok(())
}

/// A port from 0 to 65535, if any.
fn check_port(port: Option<&str>) -> Result<(), String> {
    match port.filter(|port| !port.is_empty()) {
        Some(port) if port.parse::<u16>().is_err() => {
            // Shown only when it is digits: in `redis://user:secret` (no `@host`), the "port"
            // is the password.
            Err(match port.bytes().all(|b| b.is_ascii_digit()) {
                true => format!("its port `{port}` is not a number from 0 to 65535"),
                false => "its port is not a number from 0 to 65535 (a password goes before an \
                          `@` and the host: redis://user:password@host:6379/0)"
                    .to_owned(),
            })
        }
        _ => Ok(()),
    }
}

/// The database number, the query's protocol and the fragment of what follows the host.
fn check_tail(url: &str, after: &str) -> Result<(), String> {
    let (path, query, fragment) = split_tail(after);
    let db = path.trim_matches('/');
    if !db.is_empty() && db.parse::<i64>().is_err() {
        return Err(format!(
            "its database number `{db}` is not a number: write it after the host, e.g. \
             redis://host:6379/2"
        ));
    }
    let protocol = query
        .split('&')
        .find_map(|pair| pair.strip_prefix("protocol="));
    if let Some(protocol) = protocol
        && !["2", "3", "resp2", "resp3"].contains(&protocol)
    {
        return Err(format!(
            "its `protocol={protocol}` is neither 2 (resp2) nor 3 (resp3)"
        ));
    }
    if let Some(fragment) = fragment
        && tls::is_tls_url(url)
        && fragment != "insecure"
    {
        return Err(format!(
            "`#{fragment}` cannot follow a rediss:// URL: only `#insecure` (no certificate check) can"
        ));
    }
    Ok(())
}

/// Whether `text` is a URL scheme: a letter, then letters, digits, `+`, `-` or `.`.
fn is_scheme(text: &str) -> bool {
    let mut chars = text.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
}

/// Whether the %-escapes of `text` decode to UTF-8 (a `%` without two hex digits is kept).
fn decodes(text: &str) -> bool {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let escaped = bytes.get(at + 1..at + 3).and_then(|hex| {
            std::str::from_utf8(hex)
                .ok()
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
        });
        match (bytes[at], escaped) {
            (b'%', Some(byte)) => {
                decoded.push(byte);
                at += 3;
            }
            (byte, _) => {
                decoded.push(byte);
                at += 1;
            }
        }
    }
    String::from_utf8(decoded).is_ok()
}

/// The path, the query and the fragment of what follows a URL's host part.
fn split_tail(after: &str) -> (&str, &str, Option<&str>) {
    let (before_fragment, fragment) = match after.split_once('#') {
        Some((before, fragment)) => (before, Some(fragment)),
        None => (after, None),
    };
    let (path, query) = before_fragment
        .split_once('?')
        .unwrap_or((before_fragment, ""));
    (path, query, fragment)
}

/// The URL (or comma-separated URLs) without passwords.
fn redact(url: &str) -> String {
    url.split(',').map(redact_one).collect::<Vec<_>>().join(",")
}

fn redact_one(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***{}", &url[..scheme], &url[at..])
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_url_is_an_error_with_a_message() {
        let error = RedisConfig::new("http://example.com").unwrap_err();
        assert!(
            error.to_string().contains("is not a usable Redis URL"),
            "{error}"
        );
        let error = RedisConfig::new("redis://user:hunter2@[::1:6379").unwrap_err();
        assert!(!error.to_string().contains("hunter2"), "{error}");
    }

    /// The message of `RedisConfig::new(url)`'s error.
    fn refusal(url: &str) -> String {
        RedisConfig::new(url).unwrap_err().to_string()
    }

    #[test]
    fn a_bad_url_says_which_part_is_wrong() {
        for (url, says) in [
            (
                "http://example.com",
                "`http://` is not a Redis scheme: use redis://",
            ),
            ("localhost:6379", "it does not start with a scheme"),
            ("redis//localhost", "it does not start with a scheme"),
            ("redis:/localhost", "it needs `//` after `redis:`"),
            ("redis://", "it names no host"),
            ("redis://:6379/0", "it names no host"),
            (
                "redis://cache:port",
                "its port is not a number from 0 to 65535",
            ),
            ("redis://cache:99999", "its port `99999` is not a number"),
            (
                "redis://cache:6379/abc",
                "its database number `abc` is not a number",
            ),
            (
                "redis://cache/0/1",
                "its database number `0/1` is not a number",
            ),
            ("redis://::1:6379", "goes in brackets: redis://[::1]:6379/0"),
            ("redis://[::1:6379", "its IPv6 address has no closing `]`"),
            ("redis://[::g]:6379", "`[::g]` is not an IPv6 address"),
            ("redis://cache host:6379", "its host `cache host` holds ' '"),
            ("redis://cache^:6379", "its host `cache^` holds '^'"),
            ("redis://0.0.0.0:6379", "`0.0.0.0` is the wildcard address"),
            (
                "redis://cache/?protocol=9",
                "its `protocol=9` is neither 2 (resp2) nor 3 (resp3)",
            ),
        ] {
            let message = refusal(url);
            assert!(
                message.contains("is not a usable Redis URL"),
                "{url}: {message}"
            );
            assert!(message.contains(says), "{url}: {message}");
        }
    }

    #[test]
    fn a_password_that_needs_escaping_is_named_but_never_shown() {
        for (url, says) in [
            ("redis://:hun/ter2@cache:6379", "holds a `/`, `?` or `#`"),
            (
                "redis://user:hun#ter2@cache:6379",
                "holds a `/`, `?` or `#`",
            ),
            (
                "redis://user:hun?ter2@cache:6379/0",
                "holds a `/`, `?` or `#`",
            ),
            (
                "redis://user:hun%fftr2@cache:6379",
                "a %-escape that is not UTF-8",
            ),
        ] {
            let message = refusal(url);
            assert!(message.contains(says), "{url}: {message}");
            for secret in ["hun", "ter2", "tr2"] {
                assert!(!message.contains(secret), "{url}: {message}");
            }
        }
        // A password without the `@host` that follows it reads as a port: it is not shown.
        let message = refusal("redis://default:hunter2");
        assert!(message.contains("its port is not a number"), "{message}");
        assert!(
            !message
                .replace("redis://default:hunter2", "")
                .contains("hunter2"),
            "{message}"
        );
        // An `@`, a `:` or a space in a password need no escaping: the URL is accepted.
        for url in [
            "redis://user:p@ss@cache",
            "redis://user:p:ss@cache",
            "redis://:p ss@cache",
        ] {
            assert!(RedisConfig::new(url).is_ok(), "{url}");
        }
    }

    #[test]
    fn a_url_the_crate_refuses_for_another_reason_keeps_its_words() {
        let message = refusal("redis+unix://");
        assert!(message.contains("Missing path"), "{message}");
        let message = refusal("redis+unix:///tmp/redis.sock?db=x");
        assert!(message.contains("Invalid database number"), "{message}");
    }

    #[test]
    fn a_comma_separated_list_names_every_node_and_hides_every_password() {
        let config =
            RedisConfig::new("redis://127.0.0.1:7000, redis://:pw1@127.0.0.1:7001,").unwrap();
        assert_eq!(config.nodes.len(), 2);
        let error = RedisConfig::new("redis://:pw1@a:1,http://:pw2@b:2").unwrap_err();
        assert!(!error.to_string().contains("pw2"), "{error}");
        assert!(RedisConfig::new(" , ").is_err());
    }

    #[test]
    fn every_duration_up_to_max_is_clamped_into_a_usable_range() {
        let config = RedisConfig::new("redis://localhost")
            .unwrap()
            .op_timeout(Duration::MAX)
            .lease(Duration::MAX)
            .lock_wait(Duration::MAX)
            .cooldown(Duration::MAX, 0)
            .connect_timeout(Duration::MAX)
            .heartbeat(Duration::MAX);
        assert_eq!(config.op_timeout, MAX_SETTING);
        assert_eq!(config.lease, MAX_SETTING);
        assert_eq!(config.lock_wait, MAX_SETTING);
        assert_eq!(config.cooldown, MAX_SETTING);
        assert_eq!(config.failures_before_cooldown, 1);
        assert_eq!(config.connect_timeout, MAX_SETTING);
        assert_eq!(config.heartbeat, MAX_SETTING);
        assert_eq!(config.staleness_bound(), MAX_SETTING * 3);

        let config = RedisConfig::new("redis://localhost")
            .unwrap()
            .op_timeout(Duration::ZERO)
            .lease(Duration::ZERO)
            .connect_timeout(Duration::ZERO)
            .heartbeat(Duration::ZERO);
        assert_eq!(config.op_timeout, Duration::from_millis(1));
        assert_eq!(config.lease, Duration::from_millis(30));
        assert_eq!(config.connect_timeout, Duration::from_millis(1));
        assert_eq!(config.heartbeat, Duration::from_millis(10));
    }

    #[test]
    fn the_staleness_bound_is_two_heartbeats_and_an_operation_timeout() {
        let config = RedisConfig::new("redis://localhost").unwrap();
        assert_eq!(config.staleness_bound(), Duration::from_millis(2_250));
    }

    #[test]
    fn passwords_are_kept_out_of_debug_output() {
        let config = RedisConfig::new("redis://:hunter2@localhost:6379/0").unwrap();
        let shown = format!("{config:?}");
        assert!(
            !shown.contains("hunter2") && shown.contains("localhost:6379"),
            "{shown}"
        );
    }
}

//! Why a Redis operation did not happen, and what an error reply says about the link it came
//! on: a reply about one key (`WRONGTYPE`, `OOM`) fails that call only, since the server
//! answered; IO errors and `READONLY` condemn the link; anything else counts as a failure.

use std::fmt;
use std::time::Duration;

/// Why a Redis operation did not happen.
#[derive(Clone, Debug)]
pub(crate) enum Failure {
    /// Redis is being skipped after repeated failures.
    CoolingDown,
    NoRuntime,
    Timeout(Duration),
    /// Redis refused the call because of the key it is about (`WRONGTYPE`, `OOM`).
    Refused(redis::RedisError),
    Redis(redis::RedisError),
    /// The pub/sub connection failed, or refused a subscription.
    Subscription,
    /// A subscription was not confirmed within this wait: the connection may be fine.
    Unconfirmed(Duration),
    /// No usable connection could be made.
    Unavailable,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::CoolingDown => {
                f.write_str("skipped during the cool-down after repeated failures")
            }
            Failure::NoRuntime => f.write_str("no tokio runtime to connect on"),
            Failure::Timeout(after) => write!(f, "no answer within {after:?}"),
            Failure::Refused(error) | Failure::Redis(error) => write!(f, "{error}"),
            Failure::Subscription => f.write_str("the pub/sub connection failed"),
            Failure::Unconfirmed(wait) => {
                write!(f, "a subscription was not confirmed within {wait:?}")
            }
            Failure::Unavailable => f.write_str("no usable connection could be made"),
        }
    }
}

/// What a Redis error reply says about the connection it came on.
#[derive(Debug, PartialEq, Eq)]
pub(in crate::redis) enum Scope {
    /// Only the key the call was about (`WRONGTYPE`, `OOM`): the connection is fine.
    Key,
    /// The connection must be replaced (IO, dropped, `READONLY`).
    Link,
    /// The server cannot serve now (`LOADING`, `BUSY`, `MASTERDOWN`, ...): a failure.
    Server,
}

pub(in crate::redis) fn scope(error: &redis::RedisError) -> Scope {
    if has_code(error, "READONLY")
        || error.is_io_error()
        || error.is_connection_dropped()
        || error.is_unrecoverable_error()
    {
        Scope::Link
    } else if has_code(error, "WRONGTYPE") || has_code(error, "OOM") {
        Scope::Key
    } else {
        Scope::Server
    }
}

/// Whether the reply's code is `code`, or (before Redis 7) a script's `ERR Error running
/// script` reply quotes it; for a pipeline, the reply of one of its commands.
fn has_code(error: &redis::RedisError, code: &str) -> bool {
    let is = |found: &str, detail: Option<&str>| match found {
        "ERR" => detail.is_some_and(|detail| {
            detail
                .split(|c: char| !c.is_ascii_alphanumeric())
                .any(|word| word == code)
        }),
        found => found == code,
    };
    match error.code() {
        Some(found) => is(found, error.detail()),
        // A pipeline's error, whose code is only known when it is one redis-rs names.
        None => error.clone().into_server_errors().is_some_and(|replies| {
            replies
                .iter()
                .any(|(_, reply)| is(reply.code(), reply.details()))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(code: &str, detail: &str) -> redis::RedisError {
        redis::make_extension_error(code.to_owned(), Some(detail.to_owned()))
    }

    #[test]
    fn a_subscription_not_confirmed_in_time_is_not_told_as_a_failed_connection() {
        let unconfirmed = Failure::Unconfirmed(Duration::from_millis(250)).to_string();
        assert_eq!(unconfirmed, "a subscription was not confirmed within 250ms");
        assert_eq!(
            Failure::Subscription.to_string(),
            "the pub/sub connection failed"
        );
    }

    #[test]
    fn an_error_about_one_key_does_not_condemn_the_connection() {
        let wrong_type = reply(
            "WRONGTYPE",
            "Operation against a key holding the wrong kind of value script: 1f, on @user_script:1.",
        );
        assert_eq!(scope(&wrong_type), Scope::Key);
        let oom = reply("OOM", "command not allowed when used memory > 'maxmemory'.");
        assert_eq!(scope(&oom), Scope::Key);
        // Redis 6 wraps a script's error in `ERR Error running script`.
        let wrapped = reply(
            "ERR",
            "Error running script (call to f_1f): @user_script:1: WRONGTYPE Operation against a key",
        );
        assert_eq!(scope(&wrapped), Scope::Key);
    }

    #[test]
    fn readonly_and_io_errors_replace_the_connection_and_others_count_as_failures() {
        let readonly = reply("READONLY", "You can't write against a read only replica.");
        assert_eq!(scope(&readonly), Scope::Link);
        let reset =
            redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert_eq!(scope(&reset), Scope::Link);
        let loading = reply("LOADING", "Redis is loading the dataset in memory");
        assert_eq!(scope(&loading), Scope::Server);
        let script = reply(
            "ERR",
            "Error running script: attempt to compare nil with number",
        );
        assert_eq!(scope(&script), Scope::Server);
    }
}

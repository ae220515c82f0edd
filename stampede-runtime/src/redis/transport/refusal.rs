//! Failures that are Redis refusing this process, not Redis being down: a wrong or missing
//! password (`WRONGPASS`, `NOAUTH`), a command, key or channel its ACL user may not use
//! (`NOPERM`), a certificate that does not verify (a wrong CA, a client certificate the server
//! refuses). Waiting does not fix them, so they are told apart: `require_redis` reports them as
//! [`Error::InvalidConfig`](crate::Error::InvalidConfig) with what to change, the connection's
//! health logs the first at error level and counts every one (`redis_auth_failures_total`,
//! labelled `redis` and `reason`), and the caches still serve from this process meanwhile.

use crate::redis::transport::failure::Failure;

/// What Redis refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The user or password (`WRONGPASS`, `NOAUTH`).
    Credentials,
    /// A command, key or channel the ACL user may not use (`NOPERM`).
    Permission,
    /// The TLS handshake: the server's certificate does not verify against the trusted CAs, or
    /// the server refused this client's certificate (or its absence).
    Certificate,
}

impl Refusal {
    /// The `reason` label of `redis_auth_failures_total` and of the log line.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            Refusal::Credentials => "credentials",
            Refusal::Permission => "permission",
            Refusal::Certificate => "certificate",
        }
    }

    /// What to change, for messages.
    pub(crate) fn fix(self, prefix: &str) -> String {
        match self {
            Refusal::Credentials => "Redis refused the credentials: check the user and password \
                 in the URL (`redis://user:password@host`; a password alone authenticates as \
                 `default`)"
                .to_owned(),
            Refusal::Permission => format!(
                "Redis refused a command of the cache tier (NOPERM): the ACL user needs the keys \
                 `~{prefix}:*`, the channels `&{prefix}:*` and the tier's commands (the guide's \
                 Redis page, stampede::guide::redis, gives the `ACL SETUSER` line)"
            ),
            Refusal::Certificate => "the TLS handshake failed on a certificate: check the CA \
                 given with RedisConfig::tls_root_ca (without it the webpki roots are trusted), \
                 that the server's certificate names the host of the URL, and the client \
                 certificate of RedisConfig::tls_client_cert when the server asks for one"
                .to_owned(),
        }
    }
}

/// What `failure` says Redis refused, if it is a refusal.
pub(crate) fn of(failure: &Failure) -> Option<Refusal> {
    match failure {
        Failure::Redis(error) | Failure::Refused(error) => of_error(error),
        _ => None,
    }
}

/// What a `redis` error says Redis refused, if it is a refusal.
pub(crate) fn of_error(error: &redis::RedisError) -> Option<Refusal> {
    if error.kind() == redis::ErrorKind::AuthenticationFailed {
        return Some(Refusal::Credentials);
    }
    match error.code() {
        Some("WRONGPASS" | "NOAUTH") => return Some(Refusal::Credentials),
        Some("NOPERM") => return Some(Refusal::Permission),
        _ => {}
    }
    // The cluster client and the TLS stack wrap what they met: read the text as a last resort.
    of_text(&error.to_string())
}

/// What an error's text says was refused.
fn of_text(text: &str) -> Option<Refusal> {
    const CERTIFICATE: [&str; 6] = [
        "invalid peer certificate",
        "fatal alert: BadCertificate",
        "fatal alert: UnknownCA",
        "fatal alert: CertificateRequired",
        "fatal alert: CertificateUnknown",
        "fatal alert: UnsupportedCertificate",
    ];
    if text.contains("WRONGPASS")
        || text.contains("NOAUTH")
        || text.contains("AuthenticationFailed")
        || text.contains("Password authentication failed")
    {
        Some(Refusal::Credentials)
    } else if text.contains("NOPERM") || text.contains("The user executing the script can't") {
        Some(Refusal::Permission)
    } else if CERTIFICATE.iter().any(|said| text.contains(said)) {
        Some(Refusal::Certificate)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(code: &str, detail: &str) -> redis::RedisError {
        redis::make_extension_error(code.to_owned(), Some(detail.to_owned()))
    }

    #[test]
    fn refusals_are_told_apart_from_outages() {
        let wrong = reply(
            "WRONGPASS",
            "invalid username-password pair or user is disabled.",
        );
        assert_eq!(of_error(&wrong), Some(Refusal::Credentials));
        let missing = reply("NOAUTH", "Authentication required.");
        assert_eq!(of_error(&missing), Some(Refusal::Credentials));
        let failed = redis::RedisError::from((
            redis::ErrorKind::AuthenticationFailed,
            "Password authentication failed",
        ));
        assert_eq!(of_error(&failed), Some(Refusal::Credentials));
        let denied = reply("NOPERM", "No permissions to access a key");
        assert_eq!(of_error(&denied), Some(Refusal::Permission));
        // An ACL refusal inside a script (Redis 7) is an ERR naming only the script's line.
        let in_script = reply(
            "ERR",
            "The user executing the script can't run this command or subcommand script: 99, on \
             @user_script:12.",
        );
        assert_eq!(of_error(&in_script), Some(Refusal::Permission));
        let tls = redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "invalid peer certificate: UnknownIssuer",
        ));
        assert_eq!(of_error(&tls), Some(Refusal::Certificate));

        let loading = reply("LOADING", "Redis is loading the dataset in memory");
        assert_eq!(of_error(&loading), None);
        let reset =
            redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert_eq!(of_error(&reset), None);
        assert_eq!(
            of(&Failure::Timeout(std::time::Duration::from_secs(1))),
            None
        );
    }

    #[test]
    fn each_refusal_says_what_to_change() {
        assert!(Refusal::Credentials.fix("shop").contains("password"));
        let permission = Refusal::Permission.fix("shop");
        assert!(permission.contains("~shop:*") && permission.contains("&shop:*"));
        assert!(Refusal::Certificate.fix("shop").contains("tls_root_ca"));
    }
}

//! TLS for `rediss://` (and `valkeys://`) URLs, with the `tls` feature: rustls under the
//! `redis` crate, the server's certificate checked against the webpki roots or a CA given with
//! `RedisConfig::tls_root_ca`, and a client certificate given with
//! `RedisConfig::tls_client_cert` (both with the `tls` feature).
//!
//! The certificates reach every connection of an endpoint: the command connection and the plain
//! subscriber through the node clients (`redis::Client::build_with_tls`), and the two cluster
//! clients (commands, sharded pub/sub) through [`cluster_builder`], which the `redis` crate needs
//! them given to again (it makes every node's connection from the builder's settings, not from
//! the seeds' clients). Certificates are parsed and checked when given, so a bad PEM or a key
//! that is not the certificate's is an [`Error::InvalidConfig`] at once, not a failed connection
//! later.
//!
//! Without the feature, a TLS URL is an [`Error::InvalidConfig`] naming the feature, whatever
//! features of the `redis` crate another dependency turns on: one way to get TLS, the tested one.

use std::fmt;

use crate::error::Error;

/// The schemes of TLS URLs.
const TLS_SCHEMES: [&str; 2] = ["rediss", "valkeys"];

/// Whether `url` asks for TLS (`rediss://`, `valkeys://`, in any case).
pub(crate) fn is_tls_url(url: &str) -> bool {
    url.split_once("://").is_some_and(|(scheme, _)| {
        TLS_SCHEMES
            .iter()
            .any(|tls| scheme.trim().eq_ignore_ascii_case(tls))
    })
}

/// What a TLS URL needs that a build may lack: without the `tls` feature, the error that names
/// it (`enabled` is whether the feature is on; a parameter so that both answers are tested).
pub(crate) fn check_scheme(url: &str, shown: &str, enabled: bool) -> Result<(), Error> {
    if is_tls_url(url) && !enabled {
        return Err(Error::invalid_config(format!(
            "`{shown}` is a TLS URL, and this build of stampede has no TLS: enable the `tls` \
             feature of stampede (`stampede = {{ ..., features = [\"tls\"] }}` in Cargo.toml)"
        )));
    }
    Ok(())
}

/// The TLS settings of one configured Redis: a CA to trust instead of the webpki roots, and a
/// client certificate with its key, both PEM. Without the feature it holds nothing.
#[derive(Clone, Default)]
pub(crate) struct Tls {
    #[cfg(feature = "tls")]
    root_ca: Option<Vec<u8>>,
    #[cfg(feature = "tls")]
    client: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        #[cfg(feature = "tls")]
        {
            // What is set, never the bytes (a key is a secret).
            f.debug_struct("Tls")
                .field("root_ca", &self.root_ca.as_ref().map(|_| "<custom CA>"))
                .field("client_cert", &self.client.as_ref().map(|_| "<set>"))
                .finish()
        }
        #[cfg(not(feature = "tls"))]
        {
            f.write_str("Tls(off)")
        }
    }
}

/// The client of one node's URL, with `tls`'s certificates when it has any.
pub(crate) fn client(url: &str, tls: &Tls) -> redis::RedisResult<redis::Client> {
    #[cfg(feature = "tls")]
    if let Some(certificates) = tls.certificates() {
        if !is_tls_url(url) {
            return Err(redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "TLS certificates were given (tls_root_ca, tls_client_cert), but this is not a \
                 TLS URL",
                "use rediss://".to_owned(),
            )));
        }
        return redis::Client::build_with_tls(url, certificates);
    }
    let _ = tls;
    redis::Client::open(url)
}

/// The builder of a cluster client seeded by `nodes`, with `tls`'s certificates when it has
/// any (a TLS URL without them verifies against the webpki roots).
pub(crate) fn cluster_builder(
    nodes: &[redis::Client],
    tls: &Tls,
) -> redis::cluster::ClusterClientBuilder {
    let builder = redis::cluster::ClusterClientBuilder::new(
        nodes.iter().map(|node| node.get_connection_info().clone()),
    );
    #[cfg(feature = "tls")]
    if let Some(certificates) = tls.certificates() {
        return builder.certs(certificates);
    }
    let _ = tls;
    builder
}

#[cfg(feature = "tls")]
mod enabled {
    use rustls::RootCertStore;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};

    use super::Tls;
    use crate::error::Error;

    /// Makes `ring` the process's rustls crypto provider unless one is installed already: the
    /// `redis` crate builds its TLS configurations with the process default, and rustls finds
    /// none by itself when a build enables both of its providers.
    pub(crate) fn install_crypto_provider() {
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            // Another thread may have installed one meanwhile: that one is kept.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
    }

    impl Tls {
        /// These settings with `pem` as the only CA trusted.
        pub(crate) fn with_root_ca(mut self, pem: &[u8]) -> Result<Tls, Error> {
            roots(pem)?;
            self.root_ca = Some(pem.to_vec());
            self.check()?;
            Ok(self)
        }

        /// These settings with a client certificate (chain) and its private key.
        pub(crate) fn with_client_cert(mut self, cert: &[u8], key: &[u8]) -> Result<Tls, Error> {
            self.client = Some((cert.to_vec(), key.to_vec()));
            self.check()?;
            Ok(self)
        }

        /// The certificates in the form the `redis` crate takes them, if any were given.
        pub(in crate::redis) fn certificates(&self) -> Option<redis::TlsCertificates> {
            if self.root_ca.is_none() && self.client.is_none() {
                return None;
            }
            Some(redis::TlsCertificates {
                client_tls: self
                    .client
                    .as_ref()
                    .map(|(cert, key)| redis::ClientTlsConfig {
                        client_cert: cert.clone(),
                        client_key: key.clone(),
                    }),
                root_cert: self.root_ca.clone(),
            })
        }

        /// Builds the rustls configuration these settings make, as a connection will: a client
        /// key that does not parse or is not the certificate's fails here.
        fn check(&self) -> Result<(), Error> {
            install_crypto_provider();
            let roots = match &self.root_ca {
                Some(pem) => roots(pem)?,
                None => RootCertStore::empty(),
            };
            let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
            if let Some((cert, key)) = &self.client {
                let chain = CertificateDer::pem_slice_iter(cert)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| {
                        invalid(format!(
                            "the client certificate is not a PEM certificate: {e}"
                        ))
                    })?;
                if chain.is_empty() {
                    return Err(invalid(
                        "the client certificate holds no PEM certificate (`-----BEGIN \
                         CERTIFICATE-----`)",
                    ));
                }
                let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| {
                    invalid(format!(
                        "the client key is not a PEM private key (PKCS#8, PKCS#1 or SEC1): {e}"
                    ))
                })?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| invalid(format!("the client certificate and key: {e}")))?;
            }
            Ok(())
        }
    }

    /// The CA certificates of `pem`: at least one.
    fn roots(pem: &[u8]) -> Result<RootCertStore, Error> {
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(pem) {
            let cert =
                cert.map_err(|e| invalid(format!("the root CA is not a PEM certificate: {e}")))?;
            roots
                .add(cert)
                .map_err(|e| invalid(format!("the root CA is not a usable CA certificate: {e}")))?;
        }
        if roots.is_empty() {
            return Err(invalid(
                "the root CA holds no PEM certificate (`-----BEGIN CERTIFICATE-----`)",
            ));
        }
        Ok(roots)
    }

    fn invalid(message: impl Into<String>) -> Error {
        Error::invalid_config(format!("RedisConfig TLS settings: {}", message.into()))
    }
}

#[cfg(feature = "tls")]
pub(crate) use enabled::install_crypto_provider;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_urls_are_told_by_their_scheme_in_any_case() {
        assert!(is_tls_url("rediss://cache:6380"));
        assert!(is_tls_url("REDISS://cache:6380"));
        assert!(is_tls_url("valkeys://cache"));
        assert!(!is_tls_url("redis://cache"));
        assert!(!is_tls_url("redis+unix:///run/redis.sock"));
        assert!(!is_tls_url("cache:6379"));
    }

    #[test]
    fn without_the_feature_a_tls_url_is_an_error_that_names_it() {
        let error = check_scheme("rediss://cache:6380", "rediss://cache:6380", false).unwrap_err();
        assert!(matches!(error, Error::InvalidConfig { .. }), "{error:?}");
        let message = error.to_string();
        assert!(
            message.contains("`tls` feature") && message.contains("features = [\"tls\"]"),
            "{message}"
        );
        assert!(check_scheme("rediss://cache:6380", "", true).is_ok());
        assert!(check_scheme("redis://cache", "", false).is_ok());
    }

    #[cfg(feature = "tls")]
    #[test]
    fn certificates_that_do_not_parse_are_errors_when_given() {
        let error = Tls::default()
            .with_root_ca(b"not a certificate")
            .unwrap_err();
        assert!(
            error.to_string().contains("root CA holds no PEM"),
            "{error}"
        );
        let error = Tls::default()
            .with_client_cert(
                b"",
                b"-----BEGIN PRIVATE KEY-----\n-----END PRIVATE KEY-----\n",
            )
            .unwrap_err();
        assert!(
            error
                .to_string()
                .contains("client certificate holds no PEM"),
            "{error}"
        );
        let shown = format!("{:?}", Tls::default());
        assert!(shown.contains("root_ca: None"), "{shown}");
    }
}

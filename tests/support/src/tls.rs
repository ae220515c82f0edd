//! Certificates for the TLS tests, made by the test with `rcgen` (nothing to install): a CA, a
//! server certificate for `127.0.0.1` and `localhost` signed by it, and a client certificate
//! signed by it, as PEM text and as files for `redis-server`'s `--tls-*-file` options.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType,
};

/// A CA with a server and a client certificate, written to a directory of their own that is
/// deleted on drop.
pub struct TestCerts {
    /// The CA's certificate (PEM): what a client trusts.
    pub ca_pem: String,
    /// The server's certificate (PEM), for `127.0.0.1` and `localhost`.
    pub server_cert_pem: String,
    /// The server's private key (PEM).
    pub server_key_pem: String,
    /// A client certificate (PEM), for servers that ask for one (`tls-auth-clients yes`).
    pub client_cert_pem: String,
    /// The client certificate's private key (PEM).
    pub client_key_pem: String,
    dir: PathBuf,
}

impl TestCerts {
    /// A new CA (named `name` in its subject) and the two certificates it signs.
    pub fn generate(name: &str) -> TestCerts {
        let ca_key = KeyPair::generate().expect("cannot generate the CA key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        ca.distinguished_name = subject(name);
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(ca, ca_key).expect("cannot sign the CA");

        let server_key = KeyPair::generate().expect("cannot generate the server key");
        let mut server =
            CertificateParams::new(vec!["localhost".to_owned()]).expect("server parameters");
        server.distinguished_name = subject("redis-server");
        server
            .subject_alt_names
            .push(SanType::IpAddress([127, 0, 0, 1].into()));
        // The cluster bus: a node presents this certificate to the others as a client too.
        server.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let server = server
            .signed_by(&server_key, &ca)
            .expect("cannot sign the server certificate");

        let client_key = KeyPair::generate().expect("cannot generate the client key");
        let mut client = CertificateParams::new(Vec::<String>::new()).expect("client parameters");
        client.distinguished_name = subject("stampede-test-client");
        client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let client = client
            .signed_by(&client_key, &ca)
            .expect("cannot sign the client certificate");

        let certs = TestCerts {
            ca_pem: ca.pem(),
            server_cert_pem: server.pem(),
            server_key_pem: server_key.serialize_pem(),
            client_cert_pem: client.pem(),
            client_key_pem: client_key.serialize_pem(),
            dir: crate::temp_dir("stampede-tls"),
        };
        for (file, pem) in [
            ("ca.crt", &certs.ca_pem),
            ("server.crt", &certs.server_cert_pem),
            ("server.key", &certs.server_key_pem),
            ("client.crt", &certs.client_cert_pem),
            ("client.key", &certs.client_key_pem),
        ] {
            std::fs::write(certs.dir.join(file), pem).expect("cannot write a certificate");
        }
        certs
    }

    /// The CA certificate's file.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// The server certificate's file.
    pub fn server_cert_file(&self) -> PathBuf {
        self.dir.join("server.crt")
    }

    /// The server key's file.
    pub fn server_key_file(&self) -> PathBuf {
        self.dir.join("server.key")
    }

    /// The directory the files are in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// What the tests' own connections present: this CA, and the client certificate.
    pub fn redis_certificates(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: Some(redis::ClientTlsConfig {
                client_cert: self.client_cert_pem.clone().into_bytes(),
                client_key: self.client_key_pem.clone().into_bytes(),
            }),
            root_cert: Some(self.ca_pem.clone().into_bytes()),
        }
    }

    /// `redis-server`'s TLS options for these certificates: clients must present a certificate
    /// signed by the CA when `clients_need_a_certificate`.
    pub fn server_args(&self, clients_need_a_certificate: bool) -> Vec<String> {
        let path = |path: PathBuf| path.display().to_string();
        vec![
            "--tls-cert-file".into(),
            path(self.server_cert_file()),
            "--tls-key-file".into(),
            path(self.server_key_file()),
            "--tls-ca-cert-file".into(),
            path(self.ca_file()),
            "--tls-auth-clients".into(),
            if clients_need_a_certificate {
                "yes"
            } else {
                "no"
            }
            .into(),
        ]
    }
}

impl Drop for TestCerts {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn subject(common_name: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    name
}

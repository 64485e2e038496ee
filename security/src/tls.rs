//! Transport security shared by the agent, the orchestrator and the CLI
//! (issue 8): the `[tls]` file triple, the client side of mutual TLS, and the
//! naming rule that ties an agent's certificate to its host.
//!
//! The agent proves who it is with a client certificate signed by the
//! pdwarden CA whose common name is `agent:HOST` ([`agent_identity`]); the
//! orchestrator refuses an `Attach` whose `Register.host` is not that HOST.
//! The rule lives here because both ends must agree on it.
//!
//! Plain text is never a default: a config must either name its `[tls]`
//! files or say `insecure_plaintext = true` ([`Transport::resolve`]).
//!
//! A CA file that holds no PEM certificate is refused in one line
//! ([`check_ca_file`], [`pem_certificates`]) instead of becoming an empty
//! trust store whose every handshake fails with "UnknownIssuer".

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

/// The PEM files of one end of a TLS link.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    /// The pdwarden CA certificate: the only issuer the peer is trusted from.
    pub ca: PathBuf,
    /// This end's certificate (for an agent: the one `pdwarden certs agent HOST` issued).
    pub cert: PathBuf,
    /// This end's private key.
    pub key: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read `{field}` file {}", path.display())]
    Read {
        field: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "field `tls`: no [tls] section (ca, cert, key); for local development only, set `insecure_plaintext = true` instead"
    )]
    Missing,
    #[error("field `insecure_plaintext`: set together with [tls]; choose one")]
    Both,
    #[error("field `{field}`: {url:?} does not match the transport: {expected}")]
    Scheme {
        field: &'static str,
        url: String,
        expected: &'static str,
    },
}

/// The common name an agent's certificate carries for `host`.
pub fn agent_identity(host: &str) -> String {
    format!("agent:{host}")
}

/// The host an agent certificate's common name names, if it is one.
pub fn host_of_identity(common_name: &str) -> Option<&str> {
    common_name.strip_prefix("agent:").filter(|h| !h.is_empty())
}

fn read(field: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        field,
        path: path.to_path_buf(),
        source,
    })
}

impl TlsFiles {
    /// The CA certificate, PEM.
    pub fn ca_pem(&self) -> Result<Vec<u8>, TlsError> {
        read("tls.ca", &self.ca)
    }

    /// This end's certificate and key.
    pub fn identity(&self) -> Result<Identity, TlsError> {
        Ok(Identity::from_pem(
            read("tls.cert", &self.cert)?,
            read("tls.key", &self.key)?,
        ))
    }

    /// Client side of mutual TLS: trust only the pdwarden CA, present our cert.
    pub fn client_config(&self) -> Result<ClientTlsConfig, TlsError> {
        Ok(ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(self.ca_pem()?))
            .identity(self.identity()?))
    }
}

/// How many X.509 certificates `pem` holds in PEM blocks (`-----BEGIN
/// CERTIFICATE-----`); anything else in the file (comments, keys) is skipped.
pub fn pem_certificates(pem: &[u8]) -> usize {
    x509_parser::pem::Pem::iter_from_buffer(pem)
        .filter_map(Result::ok)
        .filter(|p| p.label == "CERTIFICATE" && p.parse_x509().is_ok())
        .count()
}

/// Why a CA file given on the command line cannot be used; one line naming
/// the argument and the file.
#[derive(Debug, thiserror::Error)]
pub enum CaFileError {
    // The I/O error's text is in the line, so it is not also a `source`: the
    // CLI would print it twice.
    #[error("{what} {}: cannot read the file: {error}", path.display())]
    Read {
        what: String,
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{what} {}: no PEM certificate in the file", path.display())]
    NoCertificate { what: String, path: PathBuf },
}

/// Reads a CA file given as `what` (`--ca`, `tls.ca`), refusing in one line
/// a file with no PEM certificate: rustls would take it as an empty trust
/// store, and every handshake would fail later with "UnknownIssuer".
pub fn check_ca_file(what: &str, path: &Path) -> Result<Vec<u8>, CaFileError> {
    let pem = std::fs::read(path).map_err(|error| CaFileError::Read {
        what: what.to_string(),
        path: path.to_path_buf(),
        error,
    })?;
    if pem_certificates(&pem) == 0 {
        return Err(CaFileError::NoCertificate {
            what: what.to_string(),
            path: path.to_path_buf(),
        });
    }
    Ok(pem)
}

/// How one end talks to the other.
#[derive(Debug, Clone)]
pub enum Transport {
    Tls(TlsFiles),
    /// Explicitly asked for (`insecure_plaintext = true`); warned about at start.
    InsecurePlaintext,
}

impl Transport {
    /// `[tls]` xor `insecure_plaintext = true`; neither is an error, never a default.
    pub fn resolve(tls: Option<&TlsFiles>, insecure_plaintext: bool) -> Result<Self, TlsError> {
        match (tls, insecure_plaintext) {
            (Some(_), true) => Err(TlsError::Both),
            (Some(t), false) => Ok(Self::Tls(t.clone())),
            (None, true) => Ok(Self::InsecurePlaintext),
            (None, false) => Err(TlsError::Missing),
        }
    }

    /// Checks that a URL's scheme fits: `https://` with TLS, `http://` without.
    pub fn check_url(&self, field: &'static str, url: &str) -> Result<(), TlsError> {
        let (ok, expected) = match self {
            Self::Tls(_) => (url.starts_with("https://"), "an https:// URL with [tls]"),
            Self::InsecurePlaintext => (url.starts_with("http://"), "an http:// URL with insecure_plaintext"),
        };
        if ok {
            Ok(())
        } else {
            Err(TlsError::Scheme {
                field,
                url: url.to_string(),
                expected,
            })
        }
    }
}

/// The warning every process logs when it runs without TLS.
pub const PLAINTEXT_WARNING: &str = "INSECURE: insecure_plaintext = true: no TLS and no peer authentication on this link. Local development only; configure [tls] for anything else";

#[cfg(test)]
mod tests {
    use super::*;

    /// The identity rule round-trips and rejects other names.
    #[test]
    fn identity_names_the_host() {
        assert_eq!(host_of_identity(&agent_identity("gpu-1")), Some("gpu-1"));
        assert_eq!(host_of_identity("orchestrator"), None);
        assert_eq!(host_of_identity("agent:"), None);
    }

    /// Plain text only when asked for; a URL must fit the transport.
    #[test]
    fn plaintext_is_never_a_default() {
        assert!(matches!(Transport::resolve(None, false), Err(TlsError::Missing)));
        let files = TlsFiles {
            ca: "ca.pem".into(),
            cert: "c.pem".into(),
            key: "k.pem".into(),
        };
        assert!(matches!(Transport::resolve(Some(&files), true), Err(TlsError::Both)));
        let t = Transport::resolve(Some(&files), false).unwrap();
        assert!(t.check_url("orchestrator", "https://o:7070").is_ok());
        let e = t.check_url("orchestrator", "http://o:7070").unwrap_err().to_string();
        assert!(e.contains("`orchestrator`"), "{e}");
        assert!(
            Transport::InsecurePlaintext
                .check_url("orchestrator", "http://o:7070")
                .is_ok()
        );
    }

    /// Issue 32, finding 5: a CA file with no PEM certificate was taken as
    /// an empty trust store, and every handshake then failed with
    /// "UnknownIssuer". `--ca` is refused in one line naming it.
    #[test]
    fn a_ca_file_without_a_pem_certificate_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let certs = crate::certs::CertDir(dir.path().join("pki"));
        certs.init(&["localhost".into()]).unwrap();
        let files = certs.orchestrator();
        assert!(
            check_ca_file("--ca", &files.ca)
                .unwrap()
                .starts_with(b"-----BEGIN CERTIFICATE-----")
        );
        let passwd = dir.path().join("passwd");
        std::fs::write(&passwd, "root:x:0:0:root:/root:/bin/bash\n").unwrap();
        assert_eq!(
            check_ca_file("--ca", &passwd).unwrap_err().to_string(),
            format!("--ca {}: no PEM certificate in the file", passwd.display())
        );
        // A key is PEM, but no certificate.
        assert_eq!(
            check_ca_file("--ca", &certs.ca_key()).unwrap_err().to_string(),
            format!("--ca {}: no PEM certificate in the file", certs.ca_key().display())
        );
        let missing = dir.path().join("missing.pem");
        assert!(
            check_ca_file("--ca", &missing)
                .unwrap_err()
                .to_string()
                .starts_with(&format!("--ca {}: cannot read the file: ", missing.display()))
        );
    }
}

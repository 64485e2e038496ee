//! The certificates pdwarden's mutual TLS needs, issued with `rcgen`
//! (`pdwarden certs`, and the demo's throw-away set).
//!
//! One directory holds a small private CA: `ca.pem` / `ca-key.pem`, the
//! orchestrator's server certificate `orchestrator.pem` / `orchestrator-key.pem`
//! (its names and IPs are the subject alternative names agents and the CLI
//! connect to), and one `agent-HOST.pem` / `agent-HOST-key.pem` per host,
//! whose common name `agent:HOST` is the identity the orchestrator checks
//! against `Register.host`. Keys are ECDSA P-256, written mode 0600; an
//! existing file is never overwritten.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::tls::{TlsFiles, agent_identity};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};

#[derive(Debug, thiserror::Error)]
pub enum CertsError {
    #[error("certificate generation failed: {0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} already exists; remove it first or use another --dir", path.display())]
    Exists { path: PathBuf },
    #[error("invalid host name {0:?}: use letters, digits, '-', '_' and '.'")]
    Host(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CertsError + '_ {
    move |source| CertsError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes a new file (never replacing one); keys are private to the owner.
fn write_new(path: &Path, contents: &str, private: bool) -> Result<(), CertsError> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(if private { 0o600 } else { 0o644 })
        .open(path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => CertsError::Exists {
                path: path.to_path_buf(),
            },
            _ => CertsError::Io {
                path: path.to_path_buf(),
                source: e,
            },
        })?;
    f.write_all(contents.as_bytes()).map_err(io(path))
}

/// This year, for validity periods (rcgen's dates are whole days).
// Certificate validity is calendar time, read here, at issue.
#[allow(clippy::disallowed_methods)]
fn this_year() -> i32 {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    1970 + (secs / 31_556_952) as i32
}

fn validity(params: &mut CertificateParams, years: i32) {
    let y = this_year();
    params.not_before = rcgen::date_time_ymd(y - 1, 1, 1);
    params.not_after = rcgen::date_time_ymd(y + years, 1, 1);
}

/// The files of one certificate directory.
#[derive(Debug, Clone)]
pub struct CertDir(pub PathBuf);

impl CertDir {
    pub fn ca(&self) -> PathBuf {
        self.0.join("ca.pem")
    }
    pub fn ca_key(&self) -> PathBuf {
        self.0.join("ca-key.pem")
    }
    /// The orchestrator's `[tls]`.
    pub fn orchestrator(&self) -> TlsFiles {
        TlsFiles {
            ca: self.ca(),
            cert: self.0.join("orchestrator.pem"),
            key: self.0.join("orchestrator-key.pem"),
        }
    }
    /// The agent of `host`'s `[tls]`.
    pub fn agent(&self, host: &str) -> TlsFiles {
        TlsFiles {
            ca: self.ca(),
            cert: self.0.join(format!("agent-{host}.pem")),
            key: self.0.join(format!("agent-{host}-key.pem")),
        }
    }

    /// A new CA and the orchestrator's server certificate for `names`
    /// (DNS names or IP addresses).
    pub fn init(&self, names: &[String]) -> Result<(), CertsError> {
        std::fs::create_dir_all(&self.0).map_err(io(&self.0))?;
        let ca_key = KeyPair::generate()?;
        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.distinguished_name.push(DnType::CommonName, "pdwarden CA");
        ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        validity(&mut ca, 10);
        let ca_cert = ca.self_signed(&ca_key)?;
        write_new(&self.ca_key(), &ca_key.serialize_pem(), true)?;
        write_new(&self.ca(), &ca_cert.pem(), false)?;

        let issuer = Issuer::new(ca, ca_key);
        let files = self.orchestrator();
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(names.to_vec())?;
        params.distinguished_name.push(DnType::CommonName, "orchestrator");
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        validity(&mut params, 2);
        let cert = params.signed_by(&key, &issuer)?;
        write_new(&files.key, &key.serialize_pem(), true)?;
        write_new(&files.cert, &cert.pem(), false)
    }

    /// A client certificate for the agent of `host`, signed by this directory's CA.
    pub fn issue_agent(&self, host: &str) -> Result<TlsFiles, CertsError> {
        if host.is_empty()
            || !host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(CertsError::Host(host.to_string()));
        }
        let ca_pem = std::fs::read_to_string(self.ca()).map_err(io(&self.ca()))?;
        let ca_key_pem = std::fs::read_to_string(self.ca_key()).map_err(io(&self.ca_key()))?;
        let issuer = Issuer::from_ca_cert_pem(&ca_pem, KeyPair::from_pem(&ca_key_pem)?)?;
        let files = self.agent(host);
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, agent_identity(host));
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        validity(&mut params, 2);
        let cert = params.signed_by(&key, &issuer)?;
        write_new(&files.key, &key.serialize_pem(), true)?;
        write_new(&files.cert, &cert.pem(), false)?;
        Ok(files)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `init` then `issue_agent`: the agent certificate carries `agent:HOST`,
    /// and nothing is overwritten.
    #[test]
    fn issues_a_ca_server_and_agent_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let certs = CertDir(dir.path().join("pki"));
        certs.init(&["localhost".into(), "127.0.0.1".into()]).unwrap();
        let agent = certs.issue_agent("gpu-1").unwrap();
        let pem = std::fs::read_to_string(&agent.cert).unwrap();
        let (_, der) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
        let cert = der.parse_x509().unwrap();
        let common_name = cert.subject().iter_common_name().next().unwrap().as_str().unwrap();
        assert_eq!(common_name, "agent:gpu-1");
        assert!(matches!(certs.issue_agent("gpu-1"), Err(CertsError::Exists { .. })));
        assert!(matches!(certs.init(&[]), Err(CertsError::Exists { .. })));
        assert!(matches!(certs.issue_agent("a/b"), Err(CertsError::Host(_))));
        let mode = std::fs::metadata(&agent.key).unwrap().permissions();
        assert_eq!(std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777, 0o600);
    }
}

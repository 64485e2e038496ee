//! The server side of mutual TLS (issue 8).
//!
//! The orchestrator presents its certificate and asks every client for one
//! signed by the pdwarden CA; a certificate from any other issuer fails the
//! handshake. Client certificates are *optional* at the TLS layer because the
//! CLI authenticates with a bearer token instead (see [`crate::edge::auth`]); the
//! agent link is where a certificate is mandatory: [`agent_host`] reads the
//! `agent:HOST` identity from the verified chain, and `AgentLink.Attach`
//! refuses a stream without one, or whose `Register.host` is another host.

use std::time::Duration;

use pdwarden_security::tls::{TlsError, TlsFiles, host_of_identity, pem_certificates};
use tonic::Status;
use tonic::transport::{Certificate, ServerTlsConfig};

/// Why the server's TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ServerTlsError {
    #[error(transparent)]
    Files(#[from] TlsError),
    /// One line: the field, the file and what is wrong with it.
    #[error("{0}")]
    Pem(String),
}

/// TLS for the gRPC server: our identity, client certs checked against the
/// CA, and a handshake not finished within `handshake_timeout` dropped (a
/// half-open handshake holds a descriptor).
pub fn server_config(files: &TlsFiles, handshake_timeout: Duration) -> Result<ServerTlsConfig, ServerTlsError> {
    let ca = files.ca_pem()?;
    if pem_certificates(&ca) == 0 {
        return Err(ServerTlsError::Pem(format!(
            "tls.ca {}: no PEM certificate in the file",
            files.ca.display()
        )));
    }
    let cert = std::fs::read(&files.cert).map_err(|source| TlsError::Read {
        field: "tls.cert",
        path: files.cert.clone(),
        source,
    })?;
    if pem_certificates(&cert) == 0 {
        return Err(ServerTlsError::Pem(format!(
            "tls.cert {}: no PEM certificate in the file",
            files.cert.display()
        )));
    }
    Ok(ServerTlsConfig::new()
        .identity(files.identity()?)
        .client_ca_root(Certificate::from_pem(ca))
        .client_auth_optional(true)
        .timeout(handshake_timeout))
}

/// Whether agents must prove their host with a certificate (always, except
/// under `insecure_plaintext`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentAuth {
    Certificate,
    /// Plain text: `Register.host` is taken on trust.
    Insecure,
}

/// The host named by the peer's (CA-verified) client certificate.
pub fn agent_host<T>(request: &tonic::Request<T>) -> Result<String, Status> {
    let certs = request
        .peer_certs()
        .ok_or_else(|| Status::unauthenticated("agents must present a client certificate issued by the pdwarden CA"))?;
    let leaf = certs
        .first()
        .ok_or_else(|| Status::unauthenticated("empty client certificate chain"))?;
    let common_name = common_name(leaf.as_ref())
        .ok_or_else(|| Status::unauthenticated("the client certificate has no readable common name"))?;
    host_of_identity(&common_name).map(str::to_string).ok_or_else(|| {
        Status::permission_denied(format!(
            "certificate {common_name:?} is not an agent certificate (expected common name agent:HOST)"
        ))
    })
}

/// The subject's common name of a DER certificate.
pub fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert.subject().iter_common_name().next()?.as_str().ok()?.to_string();
    Some(cn)
}

/// Checks an attaching agent: under TLS its certificate must name the host it
/// registers as.
pub fn check_agent<T>(auth: AgentAuth, request: &tonic::Request<T>) -> Result<Option<String>, Status> {
    match auth {
        AgentAuth::Insecure => Ok(None),
        AgentAuth::Certificate => agent_host(request).map(Some),
    }
}

/// `Register.host` against the certificate's host.
pub fn check_register(certified: Option<&str>, registered: &str) -> Result<(), Status> {
    match certified {
        Some(host) if host != registered => Err(Status::permission_denied(format!(
            "agent certificate is for host {host:?} but Register.host is {registered:?}; refused"
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 32, finding 5: `ca = "/etc/passwd"` started, and every
    /// handshake then failed with "UnknownIssuer". A `tls.ca` with no PEM
    /// certificate is refused at start, in one line naming it (`--ca` on
    /// the command line: `pdwarden_security::tls::check_ca_file`).
    #[test]
    fn a_ca_file_without_a_pem_certificate_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let certs = pdwarden_security::certs::CertDir(dir.path().join("pki"));
        certs.init(&["localhost".into()]).unwrap();
        let mut files = certs.orchestrator();
        server_config(&files, std::time::Duration::from_secs(10)).unwrap();
        let passwd = dir.path().join("passwd");
        std::fs::write(&passwd, "root:x:0:0:root:/root:/bin/bash\n").unwrap();
        files.ca = passwd.clone();
        let e = server_config(&files, std::time::Duration::from_secs(10))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            format!("tls.ca {}: no PEM certificate in the file", passwd.display())
        );
    }
}

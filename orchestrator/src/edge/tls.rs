//! The server side of mutual TLS (issue 8).
//!
//! The orchestrator presents its certificate and asks every client for one
//! signed by the pdwarden CA; a certificate from any other issuer fails the
//! handshake. Client certificates are *optional* at the TLS layer because the
//! CLI authenticates with a bearer token instead (see [`crate::edge::auth`]); the
//! agent link is where a certificate is mandatory: [`agent_host`] reads the
//! `agent:HOST` identity from the verified chain, and `AgentLink.Attach`
//! refuses a stream without one, or whose `Register.host` is another host.

use pdwarden_security::tls::{TlsError, TlsFiles, host_of_identity};
use tonic::Status;
use tonic::transport::{Certificate, ServerTlsConfig};

/// TLS for the gRPC server: our identity, client certs checked against the CA.
pub fn server_config(files: &TlsFiles) -> Result<ServerTlsConfig, TlsError> {
    Ok(ServerTlsConfig::new()
        .identity(files.identity()?)
        .client_ca_root(Certificate::from_pem(files.ca_pem()?))
        .client_auth_optional(true))
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

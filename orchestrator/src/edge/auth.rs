//! Who may use the operator API, and for what (issue 8).
//!
//! Every `Control` request carries `authorization: Bearer TOKEN`. Tokens are
//! configured by their SHA-256 only (`[[operator]] token_sha256`), so the
//! config file never holds a credential; `pdwarden certs token NAME` mints
//! one. Three roles: `read` may call `Status` and `History`; `forensics`
//! may also read the contents of evidence captures; `operate` may call
//! everything. A method not named as read-only needs `operate`, so an RPC added
//! later is protected by default.
//!
//! A capture's contents (`History` with `evidence` set: the engines' full
//! argv, log tails, metrics documents and stacks) need [`CAPTURE_ROLE`]
//! (issue 48: a read-only operator could print all of it). The method is
//! the same as the history list's, so the path check cannot tell them
//! apart: the handler asks [`Actor::may_read_captures`] once it has read
//! the request, and refuses with [`capture_refused`]'s one line. A reader
//! still sees that a capture exists and its summary, which ride on the
//! operation's report in the list. The `[[operator]]` entries, their roles and
//! tokens are [`pdwarden_security::operators`] (the CLI mints them too).
//!
//! The check is one tower service wrapped around the generated
//! `ControlServer` ([`Authorized`]): it sees the gRPC method path before any
//! handler runs, answers `UNAUTHENTICATED`/`PERMISSION_DENIED` itself, and
//! hands the caller's [`Actor`] to the handler in the request extensions, so
//! operations are journaled with who asked for them.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use pdwarden_security::operators::{OperatorConfig, OperatorRole, hash_token};
use serde::Serialize;
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::{BoxFuture, Service, http};
use tonic::server::NamedService;

/// The caller of a `Control` request, as journaled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Actor {
    pub name: String,
    /// `read`, `forensics`, `operate`, or `insecure` (no authentication
    /// configured).
    pub role: &'static str,
}

/// The role that reads an evidence capture's contents (`operate` may too).
pub const CAPTURE_ROLE: OperatorRole = OperatorRole::Forensics;

impl Actor {
    /// Whether this caller may read evidence captures' contents: one with
    /// [`CAPTURE_ROLE`] or above, or anyone when no authentication is
    /// configured.
    pub fn may_read_captures(&self) -> bool {
        self.role == "insecure" || OperatorRole::from_name(self.role).is_some_and(|r| r >= CAPTURE_ROLE)
    }
}

/// The refusal of a capture's contents to `actor` (`None`: no caller
/// known, which is refused too): `PERMISSION_DENIED`, one line naming the
/// role needed.
pub fn capture_refused(actor: Option<&Actor>) -> Status {
    let who = actor.map_or_else(
        || "an unknown caller".to_string(),
        |a| format!("operator {} has role {}", a.name, a.role),
    );
    Status::permission_denied(format!(
        "{who}; an evidence capture's contents (history --evidence) need role {} or {}",
        CAPTURE_ROLE.as_str(),
        OperatorRole::Operate.as_str()
    ))
}

impl Actor {
    /// Whether this caller may see credentials written into URLs (a
    /// `base_url` of `http://user:pass@host`): one who may operate, or
    /// anyone when no authentication is configured. A `read` operator sees
    /// [`hide_url_credentials`]'s version (issue 32).
    pub fn sees_url_credentials(&self) -> bool {
        matches!(self.role, "operate" | "insecure")
    }
}

/// A JSON document's text (a `status` reply) with the userinfo of every
/// URL in it replaced: `https://user:pass@host/x` → `https://[redacted]@host/x`.
/// A URL's authority is what follows `://` up to `/`, `?`, `#` or the end of
/// its JSON string (an unescaped quote, or an escape other than `\"`); its
/// userinfo is everything before the authority's last `@`, whatever it holds
/// (spaces and quotes included: better an address hidden than a password
/// shown). An `@` in a path, query or fragment, or in text without `://`, is
/// left alone.
pub fn hide_url_credentials(json: &str) -> std::borrow::Cow<'_, str> {
    let b = json.as_bytes();
    let mut out = String::new();
    // `json[..copied]` is in `out` (or unchanged, while `out` is empty).
    let mut copied = 0;
    let mut from = 0;
    while let Some(found) = json[from..].find("://") {
        let start = from + found + 3;
        let (mut end, mut last_at) = (start, None);
        while end < b.len() {
            match b[end] {
                b'/' | b'?' | b'#' | b'"' => break,
                b'\\' if b.get(end + 1) == Some(&b'"') => end += 2,
                b'\\' => break,
                c if c.is_ascii_control() => break,
                c => {
                    if c == b'@' {
                        last_at = Some(end);
                    }
                    end += 1;
                }
            }
        }
        if let Some(at) = last_at.filter(|&at| at > start) {
            out.push_str(&json[copied..start]);
            out.push_str(pdwarden_security::redact::REDACTED);
            copied = at;
        }
        // The next URL may begin inside this one's authority
        // (`etcd:https://e1,https://u:p@e2`).
        from = start;
    }
    if copied == 0 {
        return std::borrow::Cow::Borrowed(json);
    }
    out.push_str(&json[copied..]);
    std::borrow::Cow::Owned(out)
}

/// The role a `Control` method needs.
pub fn required_role(path: &str) -> OperatorRole {
    match path {
        "/pdwarden.v1.Control/Status" | "/pdwarden.v1.Control/History" => OperatorRole::Read,
        _ => OperatorRole::Operate,
    }
}

/// The configured operators, or no authentication at all (only under
/// `insecure_plaintext` with no `[[operator]]`).
#[derive(Debug, Clone)]
pub struct Authenticator {
    operators: Arc<Vec<OperatorConfig>>,
    open: bool,
}

/// Constant-time equality of two hex digests of the same length.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Authenticator {
    pub fn new(operators: Vec<OperatorConfig>) -> Self {
        Self {
            operators: Arc::new(operators),
            open: false,
        }
    }

    /// Everyone may do everything (`insecure_plaintext` without operators).
    pub fn open() -> Self {
        Self {
            operators: Arc::default(),
            open: true,
        }
    }

    pub fn is_open(&self) -> bool {
        self.open
    }

    /// Who is calling `path` with this `authorization` header, if allowed.
    pub fn authorize(&self, path: &str, authorization: Option<&str>) -> Result<Actor, Status> {
        if self.open {
            return Ok(Actor {
                name: "anonymous".into(),
                role: "insecure",
            });
        }
        let token = authorization
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                Status::unauthenticated("the operator API needs a token: pass --token or set PDWARDEN_TOKEN")
            })?;
        let hash = hash_token(token);
        let op = self
            .operators
            .iter()
            .find(|o| same(&o.token_sha256, &hash))
            .ok_or_else(|| Status::unauthenticated("unknown token"))?;
        let needed = required_role(path);
        if op.role < needed {
            return Err(Status::permission_denied(format!(
                "operator {} has role {}; {} needs {}",
                op.name,
                op.role.as_str(),
                path.rsplit('/').next().unwrap_or(path),
                needed.as_str()
            )));
        }
        Ok(Actor {
            name: op.name.clone(),
            role: op.role.as_str(),
        })
    }
}

/// A gRPC service behind the token check.
#[derive(Clone)]
pub struct Authorized<S> {
    inner: S,
    auth: Authenticator,
}

impl<S> Authorized<S> {
    pub fn new(inner: S, auth: Authenticator) -> Self {
        Self { inner, auth }
    }
}

impl<S: NamedService> NamedService for Authorized<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> Service<http::Request<B>> for Authorized<S>
where
    S: Service<http::Request<B>, Response = http::Response<Body>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        let header = req
            .headers()
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        match self.auth.authorize(req.uri().path(), header) {
            Ok(actor) => {
                req.extensions_mut().insert(actor);
                Box::pin(self.inner.call(req))
            }
            Err(status) => {
                tracing::warn!(method = %req.uri().path(), peer = %peer(&req), reason = %status.message(), "operator request refused");
                Box::pin(async move { Ok(status.into_http()) })
            }
        }
    }
}

/// The client's address, from what tonic records about its connection.
pub fn peer<B>(req: &http::Request<B>) -> String {
    use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
    req.extensions()
        .get::<TcpConnectInfo>()
        .and_then(TcpConnectInfo::remote_addr)
        .or_else(|| {
            req.extensions()
                .get::<TlsConnectInfo<TcpConnectInfo>>()
                .and_then(|i| i.get_ref().remote_addr())
        })
        .map_or_else(|| "unknown".to_string(), |a| a.to_string())
}

#[cfg(test)]
mod tests {
    use pdwarden_security::operators::new_token;

    use super::*;

    fn auth() -> (Authenticator, String, String) {
        let (r, o) = (new_token(), new_token());
        let a = Authenticator::new(vec![
            OperatorConfig {
                name: "rita".into(),
                role: OperatorRole::Read,
                token_sha256: hash_token(&r),
            },
            OperatorConfig {
                name: "otto".into(),
                role: OperatorRole::Operate,
                token_sha256: hash_token(&o),
            },
        ]);
        (a, format!("Bearer {r}"), format!("Bearer {o}"))
    }

    /// Read tokens read, operate tokens do everything, anything else is refused
    /// with the right code; an unlisted method needs operate.
    #[test]
    fn roles_are_distinct() {
        let (a, read, operate) = auth();
        let status = "/pdwarden.v1.Control/Status";
        let restart = "/pdwarden.v1.Control/RestartPair";
        assert_eq!(a.authorize(status, Some(&read)).unwrap().name, "rita");
        assert_eq!(
            a.authorize(restart, Some(&read)).unwrap_err().code(),
            tonic::Code::PermissionDenied
        );
        assert_eq!(a.authorize(restart, Some(&operate)).unwrap().role, "operate");
        assert_eq!(
            a.authorize(status, None).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        assert_eq!(
            a.authorize(status, Some("Bearer nope")).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        assert_eq!(
            required_role("/pdwarden.v1.Control/SomethingNew"),
            OperatorRole::Operate
        );
    }

    /// Issue 48, item 3: a read-only operator could print an evidence
    /// capture's contents. They need `forensics` or `operate` (or no
    /// authentication at all); a forensics operator reads, but operates
    /// nothing.
    #[test]
    fn capture_contents_need_forensics_or_operate() {
        let actor = |role| Actor { name: "x".into(), role };
        assert!(!actor("read").may_read_captures());
        assert!(actor("forensics").may_read_captures());
        assert!(actor("operate").may_read_captures());
        assert!(actor("insecure").may_read_captures());
        assert!(!actor("").may_read_captures());
        let refusal = capture_refused(Some(&actor("read")));
        assert_eq!(refusal.code(), tonic::Code::PermissionDenied);
        assert_eq!(
            refusal.message(),
            "operator x has role read; an evidence capture's contents (history --evidence) need role forensics or operate"
        );
        assert_eq!(capture_refused(None).code(), tonic::Code::PermissionDenied);
        assert!(!actor("forensics").sees_url_credentials());
        let f = new_token();
        let a = Authenticator::new(vec![OperatorConfig {
            name: "fiona".into(),
            role: OperatorRole::Forensics,
            token_sha256: hash_token(&f),
        }]);
        let bearer = format!("Bearer {f}");
        assert_eq!(
            a.authorize("/pdwarden.v1.Control/History", Some(&bearer)).unwrap().role,
            "forensics"
        );
        assert_eq!(
            a.authorize("/pdwarden.v1.Control/RestartPair", Some(&bearer))
                .unwrap_err()
                .code(),
            tonic::Code::PermissionDenied
        );
    }

    /// Issue 16, finding 10: a refused token was logged without the
    /// client's address. The refusal's log line names the peer.
    #[test]
    fn a_refused_request_is_logged_with_the_clients_address() {
        #[derive(Clone, Default)]
        struct Lines(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Lines {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let (a, _, _) = auth();
        #[derive(Clone)]
        struct Never;
        impl Service<http::Request<()>> for Never {
            type Response = http::Response<Body>;
            type Error = Infallible;
            type Future = BoxFuture<Self::Response, Self::Error>;
            fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
                Poll::Ready(Ok(()))
            }
            fn call(&mut self, _: http::Request<()>) -> Self::Future {
                unreachable!("a refused request never reaches the service")
            }
        }
        let mut svc = Authorized::new(Never, a);
        let mut req = http::Request::builder()
            .uri("/pdwarden.v1.Control/RestartPair")
            .header("authorization", "Bearer nope")
            .body(())
            .unwrap();
        req.extensions_mut().insert(tonic::transport::server::TcpConnectInfo {
            local_addr: None,
            remote_addr: Some("10.1.2.3:45678".parse().unwrap()),
        });
        tracing::subscriber::with_default(subscriber, || {
            drop(svc.call(req));
        });
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        assert!(
            text.contains("operator request refused") && text.contains("peer=10.1.2.3:45678"),
            "{text}"
        );
    }

    /// Issue 32 (secrets): a `base_url` with `user:pass@` was shown to
    /// read-only operators. Only a caller who may operate (or anyone, with
    /// no authentication configured) sees the userinfo of a URL.
    #[test]
    fn url_credentials_are_hidden_from_read_only_operators() {
        let actor = |role| Actor { name: "x".into(), role };
        assert!(!actor("read").sees_url_credentials());
        assert!(actor("operate").sees_url_credentials());
        assert!(actor("insecure").sees_url_credentials());
        let cases = [
            (
                r#"{"base_url":"http://svc:s3cr%2Ft,x;y@10.0.0.1:30000/v1?q=a@b"}"#,
                r#"{"base_url":"http://[redacted]@10.0.0.1:30000/v1?q=a@b"}"#,
            ),
            ("https://tok@h", "https://[redacted]@h"),
            ("https://e1,http://u:p@e2", "https://e1,http://[redacted]@e2"),
            (
                r#"{"a":"http://u:p\"a ss'@h/","b":"http://h:1","c":"x@y"}"#,
                r#"{"a":"http://[redacted]@h/","b":"http://h:1","c":"x@y"}"#,
            ),
            ("x https://u:p@h#f@g y", "x https://[redacted]@h#f@g y"),
            (
                "etcd:https://root:pw@e1:2379,https://e2:2379,http://a:b@e3",
                "etcd:https://[redacted]@e1:2379,https://e2:2379,http://[redacted]@e3",
            ),
            (
                r#"["http://u:p@[::1]:8000","http://@h"]"#,
                r#"["http://[redacted]@[::1]:8000","http://@h"]"#,
            ),
            // No userinfo: nothing changes (an `@` in a path or an address
            // is not a credential).
            (
                "http://10.0.0.2:8000/x@y mail a@b.c",
                "http://10.0.0.2:8000/x@y mail a@b.c",
            ),
            ("", ""),
        ];
        for (text, want) in cases {
            assert_eq!(hide_url_credentials(text), want, "{text}");
        }
        assert!(matches!(
            hide_url_credentials("http://h:1"),
            std::borrow::Cow::Borrowed(_)
        ));
    }
}

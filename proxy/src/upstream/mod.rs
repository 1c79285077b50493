//! The upstream client: hyper-util's pooled client over rustls, behind the
//! destination guard (R-PX3, R-SF2).
//!
//! Upstream TLS is always verified — against the bundled web roots plus an
//! optional extra CA from the config — and there is no switch to turn that
//! off. HTTP/2 is used where the upstream offers it by ALPN. Errors are
//! classified into [`UpstreamKind`]s here, once, so the policy layers and
//! the edge function decide from data.

pub mod causes;
pub mod guard;
pub mod pool;

use std::future::Future;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use sluice_policy::attempt::Attempt;
use sluice_policy::classify::dialect::ERROR_BODY_MAX;
use sluice_policy::classify::ErrorBody;
use sluice_policy::error::{Cause, Upstream as UpstreamError, UpstreamKind};
use sluice_policy::BoxError;
use tower::Service;

use crate::config::ConfigError;
use crate::http::body::{ClientBodyError, ProxyBody, UpstreamBody};
use crate::upstream::guard::{Guard, GuardError, GuardedConnector};
use crate::upstream::pool::Pool;

/// A TLS config for upstream connections: web roots + the extra CA. An
/// extra CA that cannot be used is a config error naming
/// `upstream.extra_ca`.
pub fn tls_config(extra_ca: Option<&Path>) -> Result<rustls::ClientConfig, ConfigError> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = extra_ca {
        let bad = |reason: String| ConfigError {
            key: "upstream.extra_ca".into(),
            reason: format!("{}: {reason}", path.display()),
        };
        let pem = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
        let mut added = 0;
        for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
            let cert = cert.map_err(|e| bad(e.to_string()))?;
            roots.add(cert).map_err(|e| bad(e.to_string()))?;
            added += 1;
        }
        if added == 0 {
            return Err(bad("no PEM certificate found".into()));
        }
    }
    // ALPN (h2, http/1.1) is set by hyper-rustls from the enabled versions.
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| ConfigError {
        key: "upstream".into(),
        reason: format!("no usable TLS protocol versions: {e}"),
    })?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(config)
}

/// How long an idle upstream connection is kept.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// The pooled client, cheap to clone: one pointer. Every layer of a
/// provider's stack clones its inner service per attempt (tower's
/// `Oneshot`, the retry layer), so a client struct copied by value was
/// copied and dropped several times per request (issue 24's profile).
#[derive(Clone, Debug)]
pub struct Upstream(Arc<Clients>);

#[derive(Debug)]
struct Clients {
    /// sluice's own pool: idle connections bounded across destinations.
    pool: Arc<Pool<HttpsConnector<GuardedConnector>, ProxyBody>>,
    /// HTTP/1.1 only, for Upgrade requests: an upgrade cannot ride HTTP/2.
    http1: Client<HttpsConnector<GuardedConnector>, ProxyBody>,
}

impl Upstream {
    /// A client with this guard and TLS config, keeping at most
    /// `max_idle` open connections once their destinations are idle.
    pub fn new(
        guard: Guard,
        tls: rustls::ClientConfig,
        connect_timeout: Duration,
        max_idle: usize,
    ) -> Self {
        // One pooled client offering h2 and HTTP/1.1 by ALPN; one HTTP/1.1
        // only, for Upgrade requests (an upgraded connection leaves the
        // pool: nothing to bound).
        let https = || {
            hyper_rustls::HttpsConnectorBuilder::new()
                .with_tls_config(tls.clone())
                .https_or_http()
                .enable_http1()
        };
        let pooled = || {
            let mut b = Client::builder(TokioExecutor::new());
            b.pool_idle_timeout(IDLE_TIMEOUT);
            b
        };
        let connector = || GuardedConnector::new(guard.clone(), connect_timeout);
        let pool = Pool::new(
            https().enable_http2().wrap_connector(connector()),
            max_idle,
            IDLE_TIMEOUT,
        );
        let http1 = pooled().build(https().wrap_connector(connector()));
        Upstream(Arc::new(Clients { pool, http1 }))
    }

    /// Pooled connections open now, resting, and closed for the bound.
    pub fn connections(&self) -> pool::Connections {
        self.0.pool.connections()
    }
}

impl Service<Request<ProxyBody>> for Upstream {
    type Response = Response<UpstreamBody>;
    type Error = Cause;
    type Future = Pin<Box<dyn Future<Output = Result<Response<UpstreamBody>, Cause>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Cause>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<ProxyBody>) -> Self::Future {
        // The provider's dialect (the bulkhead names it) may classify
        // this answer by its body: its first bytes are read ahead, within
        // the attempt's timeout, and sent on first (R-PD3).
        let dialect = Attempt::of(&req).and_then(|a| a.dialect);
        let this = Arc::clone(&self.0);
        Box::pin(async move {
            let (resp, checkin) = if req.headers().contains_key(http::header::UPGRADE) {
                // Boxed, as the rare paths below: kilobytes of future
                // every plain request would otherwise carry (R-PF1).
                let resp = Box::pin(this.http1.request(req))
                    .await
                    .map_err(BoxError::from);
                (resp.map_err(|e| Cause::Upstream(classify(e)))?, None)
            } else {
                this.pool
                    .send(req)
                    .await
                    .map_err(|e| Cause::Upstream(classify(e)))?
            };
            let (mut parts, body) = resp.into_parts();
            let body = if dialect.is_some_and(|d| d.reads_body(parts.status, &parts.headers)) {
                let (read, body) = Box::pin(UpstreamBody::read_ahead(body, ERROR_BODY_MAX)).await;
                parts.extensions.insert(ErrorBody(read));
                body
            } else {
                UpstreamBody::stream(body)
            };
            Ok(Response::from_parts(parts, body.returning(checkin)))
        })
    }
}

/// Names an upstream failure by walking its cause chain.
pub fn classify(err: BoxError) -> UpstreamError {
    let kind = kind_of(&*err);
    UpstreamError { kind, source: err }
}

/// The kind of an upstream failure.
///
/// Walks the cause chain. An `io::Error` that wraps another error does not
/// expose it as its `source()` (it forwards the inner error's source), so
/// the walk also descends through `io::Error::get_ref` — that is where
/// tokio-rustls keeps the `rustls::Error` of a failed handshake.
pub fn kind_of(err: &(dyn std::error::Error + 'static)) -> UpstreamKind {
    let mut saw_connect = false;
    let mut io_kinds = Vec::new();
    for e in causes::chain(err) {
        if e.downcast_ref::<ClientBodyError>().is_some() {
            return UpstreamKind::ClientBody;
        }
        if let Some(g) = e.downcast_ref::<GuardError>() {
            return match g {
                GuardError::Prohibited { .. } => UpstreamKind::Prohibited,
                GuardError::Dns(_) => UpstreamKind::Dns,
            };
        }
        if let Some(t) = e.downcast_ref::<rustls::Error>() {
            return tls_kind(t);
        }
        if let Some(io) = e.downcast_ref::<io::Error>() {
            io_kinds.push(io.kind());
        }
        if let Some(h) = e.downcast_ref::<hyper::Error>() {
            if h.is_parse() || h.is_parse_status() {
                return UpstreamKind::Protocol;
            }
            if h.is_incomplete_message() || h.is_closed() || h.is_canceled() {
                return UpstreamKind::ConnectionClosed;
            }
        }
        if let Some(c) = e.downcast_ref::<hyper_util::client::legacy::Error>() {
            saw_connect |= c.is_connect();
        }
        saw_connect |= pool::is_connect(e);
    }
    // No TLS or guard cause: the innermost I/O error names it.
    if let Some(k) = io_kinds.iter().rev().find_map(|k| io_kind(*k)) {
        return k;
    }
    if saw_connect {
        UpstreamKind::ConnectionRefused
    } else {
        UpstreamKind::ConnectionClosed
    }
}

fn tls_kind(e: &rustls::Error) -> UpstreamKind {
    match e {
        rustls::Error::InvalidCertificate(_)
        | rustls::Error::NoCertificatesPresented
        | rustls::Error::UnsupportedNameType => UpstreamKind::TlsCertificate,
        _ => UpstreamKind::TlsProtocol,
    }
}

fn io_kind(k: io::ErrorKind) -> Option<UpstreamKind> {
    Some(match k {
        io::ErrorKind::ConnectionRefused => UpstreamKind::ConnectionRefused,
        io::ErrorKind::TimedOut => UpstreamKind::ConnectionTimeout,
        io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::UnexpectedEof
        | io::ErrorKind::NotConnected => UpstreamKind::ConnectionClosed,
        io::ErrorKind::InvalidData => UpstreamKind::Protocol,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_errors_inside_io_errors_are_found() {
        let rustls_err = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let inner = io::Error::new(io::ErrorKind::InvalidData, rustls_err);
        let outer = io::Error::other(inner);
        assert_eq!(kind_of(&outer), UpstreamKind::TlsCertificate);
        let handshake = io::Error::new(
            io::ErrorKind::InvalidData,
            rustls::Error::AlertReceived(rustls::AlertDescription::HandshakeFailure),
        );
        assert_eq!(kind_of(&handshake), UpstreamKind::TlsProtocol);
    }

    #[test]
    fn io_and_guard_errors() {
        let refused = io::Error::from(io::ErrorKind::ConnectionRefused);
        assert_eq!(
            kind_of(&io::Error::other(refused)),
            UpstreamKind::ConnectionRefused
        );
        assert_eq!(
            kind_of(&io::Error::from(io::ErrorKind::TimedOut)),
            UpstreamKind::ConnectionTimeout
        );
        assert_eq!(
            kind_of(&GuardError::Prohibited {
                ip: "127.0.0.1".parse().unwrap(),
                class: "loopback"
            }),
            UpstreamKind::Prohibited
        );
        assert_eq!(kind_of(&GuardError::Dns("x".into())), UpstreamKind::Dns);
    }
}

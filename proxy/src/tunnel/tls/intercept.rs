//! Terminating the client's TLS inside a CONNECT tunnel and serving the
//! requests in it through the provider's stack.

use std::sync::Arc;

use http::uri::{Authority, Scheme};
use http::Request;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use sluice_policy::clock::ReadOnce;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::app::App;
use crate::http::forward::{tunnelled, Target};
use crate::http::framing;
use crate::serve::identity::Identity;
use crate::tunnel::tls::ca::CertAuthority;

/// Picks the leaf for a handshake: the SNI name, or the CONNECT host when
/// the client sent none (IP targets).
#[derive(Debug)]
struct LeafResolver {
    ca: Arc<CertAuthority>,
    /// For a handshake without SNI; `None` in the shared config, which
    /// only serves handshakes that name their server.
    connect_host: Option<String>,
}

impl ResolvesServerCert for LeafResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let host = hello.server_name().or(self.connect_host.as_deref())?;
        match self.ca.leaf(host) {
            Ok(leaf) => Some(leaf),
            Err(e) => {
                tracing::warn!(error = %e, "could not mint a leaf certificate");
                None
            }
        }
    }
}

/// A server config for intercepted handshakes, offering h2 and HTTP/1.1.
/// With a ticketer, TLS 1.3 sessions resume from stateless tickets.
fn server_config(resolver: LeafResolver, tickets: bool) -> Option<rustls::ServerConfig> {
    let builder = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions();
    let mut config = match builder {
        Ok(b) => b
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(resolver)),
        Err(e) => {
            tracing::error!(error = %e, "TLS server config");
            return None;
        }
    };
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    if tickets {
        match rustls::crypto::ring::Ticketer::new() {
            Ok(t) => config.ticketer = t,
            Err(e) => tracing::warn!(error = %e, "no TLS session tickets"),
        }
    }
    Some(config)
}

/// The server config for a handshake: with SNI, the one shared by every
/// tunnel (sessions resume across tunnels); without, one of its own with
/// the CONNECT host's leaf.
fn config_for(
    app: &App,
    ca: &Arc<CertAuthority>,
    authority: &Authority,
    sni: bool,
) -> Option<Arc<rustls::ServerConfig>> {
    if sni {
        return app
            .intercept_tls
            .get_or_init(|| {
                let resolver = LeafResolver {
                    ca: ca.clone(),
                    connect_host: None,
                };
                server_config(resolver, true).map(Arc::new)
            })
            .clone();
    }
    let resolver = LeafResolver {
        ca: ca.clone(),
        connect_host: Some(authority.host().to_string()),
    };
    server_config(resolver, false).map(Arc::new)
}

/// Terminates TLS on `io` and serves HTTP/1.1 or HTTP/2 (by ALPN) to
/// `authority`, every request through the provider's stack.
///
/// A handshake that names its server (SNI, every client to a host name)
/// is served by one config shared by all tunnels, so its session resumes
/// on the client's next tunnel (issue 24) and no config is built per
/// connection; one without SNI (an IP target) gets its own, with the
/// CONNECT host's leaf.
pub async fn intercept<T>(
    app: Arc<App>,
    ca: Arc<CertAuthority>,
    io: T,
    authority: Authority,
    identity: Identity,
    provider: String,
) where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let handshake = async {
        let start =
            tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), io).await?;
        let sni = start.client_hello().server_name().is_some();
        let config = config_for(&app, &ca, &authority, sni)
            .ok_or_else(|| std::io::Error::other("no TLS server config"))?;
        start.into_stream(config).await
    };
    let tls = match tokio::time::timeout(app.config().limits.header_read_timeout, handshake).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            app.metrics
                .interception_failed(&app.metrics.label(&provider));
            // Typically a client that does not trust sluice's CA, or pins
            // the provider's certificate.
            tracing::warn!(
                %provider,
                error = %e,
                "TLS interception failed: the client rejected the handshake \
                 (does it trust sluice's CA? is it pinning?); set intercept = false for this provider to tunnel it"
            );
            return;
        }
        Err(_) => {
            tracing::info!(%provider, "TLS interception: client handshake timed out");
            return;
        }
    };
    let target = Target {
        scheme: Scheme::HTTPS,
        authority,
        absolute: false,
    };
    let mut tracker = app.shutdown.tracker();
    // HTTP/1.1 inside is watched for ambiguous framing; HTTP/2's preface
    // ends the watch at once.
    let (tls, verdicts) = framing::watch(tls);
    let service = service_fn(move |req: Request<Incoming>| {
        let (app, target, identity) = (app.clone(), target.clone(), identity.clone());
        let verdicts = verdicts.clone();
        ReadOnce::new(async move {
            Ok::<_, std::convert::Infallible>(
                tunnelled(app, req, target, identity, &verdicts).await,
            )
        })
    });
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(tls), service);
    tokio::pin!(conn);
    // On SIGTERM: finish what is in flight, then close (HTTP/2 GOAWAY,
    // HTTP/1.1 after the current response).
    let result = tracker
        .serve(conn.as_mut(), |c| c.graceful_shutdown())
        .await;
    if let Err(e) = result {
        tracing::debug!(error = %e, "intercepted connection ended with an error");
    }
}

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
use tokio::io::{AsyncRead, AsyncWrite};

use crate::app::App;
use crate::ca::CertAuthority;
use crate::forward::{tunnelled, Target};
use crate::framing;
use crate::identity::Identity;

/// Picks the leaf for a handshake: the SNI name, or the CONNECT host when
/// the client sent none (IP targets).
#[derive(Debug)]
struct LeafResolver {
    ca: Arc<CertAuthority>,
    connect_host: String,
}

impl ResolvesServerCert for LeafResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let host = hello.server_name().unwrap_or(&self.connect_host);
        match self.ca.leaf(host) {
            Ok(leaf) => Some(leaf),
            Err(e) => {
                tracing::warn!(error = %e, "could not mint a leaf certificate");
                None
            }
        }
    }
}

/// Terminates TLS on `io` and serves HTTP/1.1 or HTTP/2 (by ALPN) to
/// `authority`, every request through the provider's stack.
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
    let resolver = LeafResolver {
        ca,
        connect_host: authority.host().to_string(),
    };
    let mut config = match rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    {
        Ok(b) => b
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(resolver)),
        Err(e) => {
            tracing::error!(error = %e, "TLS server config");
            return;
        }
    };
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let tls = match tokio::time::timeout(
        app.config().limits.header_read_timeout,
        acceptor.accept(io),
    )
    .await
    {
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
        async move {
            Ok::<_, std::convert::Infallible>(
                tunnelled(app, req, target, identity, &verdicts).await,
            )
        }
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

//! The proxy listener's connections: proxy authentication, then dispatch —
//! CONNECT to the tunnel, absolute-form requests to forwarding.

pub mod accept;
pub mod admin;
pub mod auth;
pub mod bodies;
pub mod collectors;
mod evidence;
pub mod identity;

use std::net::SocketAddr;
use std::sync::Arc;

use http::{HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use sluice_policy::clock::ReadOnce;
use tokio::net::TcpStream;

use self::auth::Identity;
use crate::app::{App, Tracker};
use crate::http::body::ResBody;
use crate::http::edge::{ErrorType, Refusal};
use crate::http::forward::{ambiguous_length, forward, oversize_head, Target};
use crate::http::framing::{self, Verdicts};
use crate::tunnel;

/// Serves one client connection of the proxy listener.
///
/// Until its first byte arrives a connection holds only its socket and this
/// small task: hyper's buffers (8 KiB to read a head into, more to write)
/// are allocated when there is something to read. Collectors keep many
/// keep-alive connections open and idle; this is what each one costs
/// (`bench_idle`). A connection that stays silent longer than the header
/// read timeout is closed, as hyper would; SIGTERM closes it at once.
pub async fn serve_connection(app: Arc<App>, stream: TcpStream, peer: SocketAddr) {
    let mut tracker = app.shutdown.tracker();
    let timeout = app.config().limits.header_read_timeout;
    // `peek`, not `readable`: a fresh socket can report read readiness
    // with nothing to read, and hyper would then allocate for nothing.
    let mut first = [0u8; 1];
    tokio::select! {
        peeked = tokio::time::timeout(timeout, stream.peek(&mut first)) => {
            // Timed out, failed, or closed without a byte: nothing to serve.
            if !matches!(peeked, Ok(Ok(n)) if n > 0) {
                return;
            }
        }
        _ = tracker.stopping() => return,
    }
    Box::pin(serve_http(app, stream, peer, tracker)).await;
}

/// Serves HTTP/1 (with upgrades) on a connection that has bytes to read.
async fn serve_http(app: Arc<App>, stream: TcpStream, peer: SocketAddr, mut tracker: Tracker) {
    let limits = app.config().limits.clone();
    let handler = app.clone();
    let (stream, verdicts) = framing::watch(stream);
    // Only a client on this machine may reach the admin listener through
    // the proxy without a collector's token (see `forward`).
    let local = peer.ip().to_canonical().is_loopback();
    let service = service_fn(move |req: Request<Incoming>| {
        let (app, verdicts) = (handler.clone(), verdicts.clone());
        // One clock reading a poll for every layer the request passes.
        ReadOnce::new(async move {
            Ok::<_, std::convert::Infallible>(handle(app, req, local, &verdicts).await)
        })
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.max_header_bytes)
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    tokio::pin!(conn);
    let result = tracker
        .serve(conn.as_mut(), |c| c.graceful_shutdown())
        .await;
    if let Err(e) = result {
        tracing::debug!(%peer, error = %e, "client connection ended with an error");
    }
}

/// One request from a client: authenticate, then CONNECT or forward.
async fn handle(
    app: Arc<App>,
    req: Request<Incoming>,
    local: bool,
    verdicts: &Verdicts,
) -> Response<ResBody> {
    if verdicts.next_is_ambiguous() {
        return ambiguous_length(&app);
    }
    // One config snapshot for the whole request: a SIGHUP while it is
    // under way cannot mix two configs.
    let config = app.config();
    if let Some(resp) = oversize_head(req.headers(), config.limits.max_header_bytes) {
        return resp;
    }
    let identity: Identity = match auth::authenticate(req.headers(), &config.credentials) {
        Ok(id) => id,
        Err(why) => {
            let mut resp = Refusal::new(
                StatusCode::PROXY_AUTHENTICATION_REQUIRED,
                ErrorType::HttpRequestDenied,
                why.to_string(),
            )
            .into_response();
            resp.headers_mut().insert(
                http::header::PROXY_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"sluice\""),
            );
            return resp;
        }
    };
    if req.method() == Method::CONNECT {
        // Boxed: a tunnel's future (TLS, interception) is kilobytes that
        // every forwarded request would otherwise carry (R-PF1).
        return Box::pin(tunnel::connect(app, &config, req, identity)).await;
    }
    match Target::of(req.uri()) {
        Some(target) => forward(app, &config, req, target, identity, local).await,
        None => Refusal::new(
            StatusCode::BAD_REQUEST,
            ErrorType::HttpRequestError,
            "sluice is a forward proxy: send absolute-form requests (set HTTP_PROXY)",
        )
        .into_response(),
    }
}

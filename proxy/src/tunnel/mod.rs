//! `CONNECT` tunnels (R-PX2).
//!
//! What sluice does with a tunnel depends on the provider and on the first
//! bytes the client sends through it:
//!
//! * plain HTTP (Node's undici tunnels even `http://` targets): served as
//!   an HTTP connection, every request in it through the provider's stack
//!   exactly like an absolute-form request;
//! * TLS, for a provider with `intercept` on (the default once sluice has
//!   its CA): sluice terminates it ([`crate::tunnel::tls`]) and every request
//!   inside goes through the stack;
//! * TLS with interception off: a raw tunnel. It is paced once per CONNECT
//!   and connected before sluice answers `200`, so a refused or unreachable
//!   target gets a `502` with `Proxy-Status`; sluice cannot see the
//!   requests inside, and says so in the log and in
//!   `sluice_provider_request_visibility`.

pub mod tls;

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::uri::{Authority, Scheme};
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use sluice_policy::clock::ReadOnce;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use crate::app::App;
use crate::config::{normalise_host, Config};
use crate::http::body::{full, ResBody};
use crate::http::edge::{self, ErrorType, Refusal};
use crate::http::forward::{tunnelled, Target};
use crate::http::framing;
use crate::providers::Provider;
use crate::serve::identity::Identity;
use crate::tunnel::tls::intercept;
use crate::upstream;
use sluice_policy::error::{Cause, Upstream, UpstreamKind};

/// The first byte of a TLS record carrying a handshake.
const TLS_HANDSHAKE: u8 = 0x16;

/// What a tunnel's first bytes say it carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sniffed {
    /// A TLS handshake record: intercepted or relayed raw.
    Tls,
    /// Anything else: served as plaintext HTTP/1 through the stack, whose
    /// parser answers what is not HTTP with `400`.
    Plain,
}

/// Classifies a tunnel by the first bytes its client sent (at least one).
pub fn sniff(first: &[u8]) -> Sniffed {
    match first.first() {
        Some(&TLS_HANDSHAKE) => Sniffed::Tls,
        _ => Sniffed::Plain,
    }
}

/// Answers a CONNECT: checks the target, then tunnels after the upgrade.
///
/// With interception, sluice answers for each request inside, so it says
/// `200` at once. Without it (`intercept = false`, or no CA), sluice can
/// only answer for the connection: it takes the tunnel's pacing slot and
/// connects first, so an unreachable or refused target gets a real answer
/// (`502` with `Proxy-Status`) instead of a tunnel that closes.
pub async fn connect(
    app: Arc<App>,
    config: &Config,
    req: Request<Incoming>,
    identity: Identity,
) -> Response<ResBody> {
    let bad_target = || {
        Refusal::new(
            StatusCode::BAD_REQUEST,
            ErrorType::HttpRequestError,
            "CONNECT needs host:port",
        )
        .into_response()
    };
    let Some(authority) = req.uri().authority().cloned() else {
        return bad_target();
    };
    let Some(port) = authority.port_u16() else {
        return bad_target();
    };
    if !config.destinations.connect_ports.contains(&port) {
        app.metrics.destination_refused("connect_port");
        tracing::info!(
            host = authority.host(),
            port,
            "CONNECT refused: port not in destinations.connect_ports"
        );
        return Refusal::new(
            StatusCode::FORBIDDEN,
            ErrorType::HttpRequestDenied,
            format!(
                "CONNECT to port {port} is not allowed: list it in destinations.connect_ports (now {:?})",
                config.destinations.connect_ports
            ),
        )
        .into_response();
    }
    if let Err(e) = app.guard.check_literal(authority.host()) {
        return crate::http::forward::destination_refused(&app, authority.host(), &e)
            .into_response();
    }
    let host = normalise_host(authority.host());
    if let Some(refused) =
        crate::http::forward::outside_allowlist(config, identity.user.as_deref(), &host)
    {
        app.metrics.destination_refused("collector_allow");
        return refused.into_response();
    }
    let provider = app.providers.get(&host);
    let intercepting = app.ca.is_some() && provider.intercept();
    let upstream = if intercepting {
        None
    } else {
        match raw_attempt(&app, &provider, &host, port, config, &identity).await {
            Ok(stream) => Some(stream),
            Err(refused) => return refused,
        }
    };
    drop(provider);
    let tracker = app.shutdown.tracker();
    tokio::spawn(async move {
        let _tracked = tracker;
        match hyper::upgrade::on(req).await {
            Ok(upgraded) => {
                tunnel(app, TokioIo::new(upgraded), authority, identity, upstream).await
            }
            Err(e) => tracing::debug!(error = %e, "CONNECT upgrade failed"),
        }
    });
    Response::new(full(""))
}

/// A raw tunnel's connection, opened as one attempt: sluice cannot see
/// the requests inside, so for a collector's run the CONNECT itself is
/// the attempt — checked against the run, counted when it connects, given
/// back when it does not.
async fn raw_attempt(
    app: &App,
    provider: &Provider,
    host: &str,
    port: u16,
    config: &Config,
    identity: &Identity,
) -> Result<TcpStream, Response<ResBody>> {
    let user = identity.user.as_deref();
    let run = match user {
        Some(u) => app.runs.attach(u, identity.mode).await.map(|(run, _)| run),
        None => None,
    };
    if let Some(run) = &run {
        if let Err(stopped) = run.check_attempt(provider.name(), tokio::time::Instant::now()) {
            let stopped = Cause::RunStopped(stopped);
            if let Some(u) = user {
                app.runs
                    .after(u, run, None, crate::runs::Answer::Failed(&stopped));
            }
            return Err(edge::refusal(&stopped).into_response());
        }
    }
    match open_raw(app, provider, host, port, config.connect_timeout).await {
        Ok(stream) => {
            if let (Some(u), Some(run)) = (user, &run) {
                app.runs
                    .after(u, run, None, crate::runs::Answer::Status(200));
            }
            Ok(stream)
        }
        Err(refusal) => {
            if let Some(run) = &run {
                run.release_attempt(provider.name());
            }
            Err(refusal)
        }
    }
}

/// Takes one pacing slot for a raw tunnel and connects to its target.
async fn open_raw(
    app: &App,
    provider: &Provider,
    host: &str,
    port: u16,
    connect_timeout: Duration,
) -> Result<TcpStream, Response<ResBody>> {
    let refuse = |e: &Cause| {
        let r = edge::refusal(e);
        tracing::info!(provider = %provider.name(), error = r.error.label(), details = %r.details, "CONNECT refused");
        r.into_response()
    };
    let admission = provider
        .policy
        .admit_tunnel()
        .await
        .map_err(|e| refuse(&e))?;
    let addrs = match app.guard.resolve(host, port).await {
        Ok(a) => a,
        Err(e) => {
            // The guard's verdict or DNS: not the provider's doing.
            drop(admission);
            let kind = upstream::kind_of(&e);
            return Err(refuse(&Upstream::new(kind, e).into()));
        }
    };
    let connected = tokio::time::timeout(connect_timeout, TcpStream::connect(&addrs[..])).await;
    match connected {
        Ok(Ok(stream)) => {
            admission.connected(true);
            Ok(stream)
        }
        Ok(Err(e)) => {
            admission.connected(false);
            let kind = upstream::kind_of(&e);
            Err(refuse(&Upstream::new(kind, e).into()))
        }
        Err(_) => {
            admission.connected(false);
            Err(refuse(
                &Upstream::new(UpstreamKind::ConnectionTimeout, "connect timed out").into(),
            ))
        }
    }
}

async fn tunnel<T>(
    app: Arc<App>,
    mut io: T,
    authority: Authority,
    identity: Identity,
    upstream: Option<TcpStream>,
) where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut first = vec![0u8; 4096];
    let read =
        tokio::time::timeout(app.config().limits.header_read_timeout, io.read(&mut first)).await;
    let n = match read {
        Ok(Ok(n)) if n > 0 => n,
        _ => return,
    };
    first.truncate(n);
    let provider = app.providers.get(&normalise_host(authority.host()));
    match (sniff(&first), &app.ca, upstream) {
        // Plain HTTP inside the tunnel: served through the stack whatever
        // the provider's interception (a pre-opened connection is unused).
        (Sniffed::Plain, _, _) => {
            app.metrics.tunnel(provider.label(), "plain_http");
            drop(provider);
            serve_plain(app, Prefixed::new(first, io), authority, identity).await;
        }
        (Sniffed::Tls, _, Some(mut upstream)) => {
            app.metrics.tunnel(provider.label(), "raw");
            provider.saw_raw_tunnel();
            tracing::info!(
                provider = %provider.name(),
                "raw CONNECT tunnel: per-request visibility lost for this provider"
            );
            drop(provider);
            if upstream.write_all(&first).await.is_ok() {
                let _ = tokio::io::copy_bidirectional(&mut io, &mut upstream).await;
            }
        }
        (Sniffed::Tls, Some(ca), None) => {
            app.metrics.tunnel(provider.label(), "intercepted");
            let (ca, name) = (ca.clone(), provider.name().to_string());
            drop(provider);
            intercept(app, ca, Prefixed::new(first, io), authority, identity, name).await;
        }
        (Sniffed::Tls, None, None) => {}
    }
}

/// Serves HTTP/1 requests arriving inside a tunnel through the stack.
async fn serve_plain<T>(app: Arc<App>, io: T, authority: Authority, identity: Identity)
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let header_timeout = app.config().limits.header_read_timeout;
    let mut tracker = app.shutdown.tracker();
    let target = Target {
        scheme: Scheme::HTTP,
        authority,
        absolute: false,
    };
    let (io, verdicts) = framing::watch(io);
    let service = service_fn(move |req: Request<Incoming>| {
        let (app, target, identity) = (app.clone(), target.clone(), identity.clone());
        let verdicts = verdicts.clone();
        ReadOnce::new(async move {
            Ok::<_, std::convert::Infallible>(
                tunnelled(app, req, target, identity, &verdicts).await,
            )
        })
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades();
    tokio::pin!(conn);
    // On SIGTERM: finish the request in flight, then close — an idle
    // keep-alive tunnel must not hold the shutdown for the whole grace.
    let result = tracker
        .serve(conn.as_mut(), |c| c.graceful_shutdown())
        .await;
    if let Err(e) = result {
        tracing::debug!(error = %e, "tunnelled HTTP connection ended with an error");
    }
}

/// A stream that first yields bytes already read from it.
pub struct Prefixed<T> {
    prefix: Vec<u8>,
    pos: usize,
    inner: T,
}

impl<T> Prefixed<T> {
    /// `prefix` is returned by reads before `inner`'s bytes.
    pub fn new(prefix: Vec<u8>, inner: T) -> Self {
        Prefixed {
            prefix,
            pos: 0,
            inner,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Prefixed<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.pos < self.prefix.len() {
            let n = (self.prefix.len() - self.pos).min(buf.remaining());
            let start = self.pos;
            buf.put_slice(&self.prefix[start..start + n]);
            self.pos += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Prefixed<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Reads everything out of a reader with a buffer of `size` bytes.
    async fn drain(mut reader: impl AsyncRead + Unpin, size: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let mut space = vec![0u8; size];
        loop {
            let n = reader.read(&mut space).await.expect("a slice never fails");
            if n == 0 {
                return out;
            }
            out.extend_from_slice(&space[..n]);
        }
    }

    #[test]
    fn a_tunnel_is_tls_only_when_it_opens_with_a_handshake_record() {
        assert_eq!(sniff(&[0x16, 0x03, 0x01]), Sniffed::Tls);
        assert_eq!(sniff(b"GET / HTTP/1.1\r\n"), Sniffed::Plain);
        // An alert or application-data record is not a client hello.
        assert_eq!(sniff(&[0x15, 0x03, 0x03]), Sniffed::Plain);
        assert_eq!(sniff(&[]), Sniffed::Plain);
    }

    proptest! {
        // The CI stand-in for fuzz/fuzz_targets/connect_sniffer.rs.
        #[test]
        fn the_sniffed_bytes_are_replayed_exactly(
            bytes in proptest::collection::vec(any::<u8>(), 1..512),
            first_len in 1usize..64,
            buf_len in 1usize..32,
        ) {
            let first_len = first_len.min(bytes.len());
            let (first, tail) = bytes.split_at(first_len);
            prop_assert_eq!(sniff(first), sniff(&bytes[..1]));
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let out = rt.block_on(drain(Prefixed::new(first.to_vec(), tail), buf_len));
            prop_assert_eq!(out, bytes);
        }
    }
}

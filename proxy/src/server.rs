//! Listeners, connections and graceful shutdown (R-OP3).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::admin;
use crate::auth::{self, Identity};
use crate::body::ResBody;
use crate::config::Config;
use crate::connect;
use crate::edge::Refusal;
use crate::forward::{forward, oversize_head, Target};
use crate::guard::Guard;
use crate::providers::Providers;
use crate::tls::{CaPaths, CertAuthority};
use crate::upstream::{self, Upstream};

/// Everything a connection needs, shared.
#[derive(Debug)]
pub struct App {
    /// The config in force.
    pub config: Config,
    /// The provider table.
    pub providers: Providers,
    /// The destination guard.
    pub guard: Guard,
    /// Shutdown signalling and draining.
    pub shutdown: Shutdown,
    /// Listeners are bound and serving.
    pub ready: AtomicBool,
    /// The interception CA, if it could be loaded or created.
    pub ca: Option<Arc<CertAuthority>>,
}

/// Tells connections to finish, and knows when they have.
#[derive(Debug)]
pub struct Shutdown {
    tx: watch::Sender<bool>,
}

/// Held by each connection and tunnel while it runs.
#[derive(Debug)]
pub struct Tracker {
    rx: watch::Receiver<bool>,
}

impl Shutdown {
    fn new() -> Self {
        Shutdown {
            tx: watch::Sender::new(false),
        }
    }

    /// A tracker for one connection or tunnel.
    pub fn tracker(&self) -> Tracker {
        Tracker {
            rx: self.tx.subscribe(),
        }
    }

    fn begin(&self) {
        self.tx.send_replace(true);
    }

    /// Resolves once every tracker is dropped.
    async fn drained(&self) {
        self.tx.closed().await;
    }
}

impl Tracker {
    /// Resolves when shutdown begins.
    pub async fn stopping(&mut self) {
        let _ = self.rx.wait_for(|stop| *stop).await;
    }
}

/// Runs sluice until SIGTERM or SIGINT, then drains within the grace
/// period.
pub async fn run(config: Config) -> Result<(), String> {
    let tls = upstream::tls_config(config.extra_ca.as_deref())?;
    let guard = Guard::new(config.destinations.allow.clone());
    let upstream = Upstream::new(guard.clone(), tls, config.connect_timeout);
    let proxy = TcpListener::bind(config.listen)
        .await
        .map_err(|e| format!("listen {}: {e}", config.listen))?;
    let admin_listener = TcpListener::bind(config.admin)
        .await
        .map_err(|e| format!("admin {}: {e}", config.admin))?;
    let proxy_addr = proxy.local_addr().map_err(|e| e.to_string())?;
    let admin_addr = admin_listener.local_addr().map_err(|e| e.to_string())?;
    let ca = match CertAuthority::load_or_create(ca_paths(&config), config.tls.leaf_cache) {
        Ok(ca) => Some(Arc::new(ca)),
        Err(e) => {
            tracing::error!(
                error = %e,
                "no interception CA: HTTPS providers are tunnelled without per-request visibility"
            );
            None
        }
    };
    let app = Arc::new(App {
        ca,
        providers: Providers::new(&config, upstream),
        guard,
        config,
        shutdown: Shutdown::new(),
        ready: AtomicBool::new(false),
    });
    tokio::spawn(admin::serve(app.clone(), admin_listener));
    tokio::spawn(sweep(app.clone()));
    app.ready.store(true, Ordering::SeqCst);
    tracing::info!(proxy = %proxy_addr, admin = %admin_addr, "sluice listening");
    // A machine-readable line for supervisors and tests that bind port 0.
    println!("sluice listening proxy={proxy_addr} admin={admin_addr}");

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| e.to_string())?;
    loop {
        tokio::select! {
            accepted = proxy.accept() => match accepted {
                Ok((stream, peer)) => {
                    tokio::spawn(serve_connection(app.clone(), stream, peer));
                }
                Err(e) => {
                    // Out of file descriptors and the like: back off briefly.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    drop(proxy);
    app.ready.store(false, Ordering::SeqCst);
    let grace = app.config.limits.shutdown_grace;
    tracing::info!(
        grace_ms = grace.as_millis() as u64,
        "shutting down: no new connections, draining"
    );
    app.shutdown.begin();
    if tokio::time::timeout(grace, app.shutdown.drained())
        .await
        .is_err()
    {
        tracing::warn!("grace period over; closing what is left");
    }
    tracing::info!("stopped");
    Ok(())
}

/// The CA files: configured, or in the state directory.
pub fn ca_paths(config: &Config) -> CaPaths {
    match (&config.tls.ca_cert, &config.tls.ca_key) {
        (Some(cert), Some(key)) => CaPaths {
            cert: cert.clone(),
            key: key.clone(),
        },
        _ => CaPaths::in_state_dir(&config.state_dir),
    }
}

async fn sweep(app: Arc<App>) {
    let mut tick = tokio::time::interval(Duration::from_secs(30));
    loop {
        tick.tick().await;
        app.providers.sweep();
    }
}

async fn serve_connection(app: Arc<App>, stream: TcpStream, peer: SocketAddr) {
    let mut tracker = app.shutdown.tracker();
    let limits = app.config.limits.clone();
    let handler = app.clone();
    let service = service_fn(move |req| {
        let app = handler.clone();
        async move { Ok::<_, std::convert::Infallible>(handle(app, req).await) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.max_header_bytes)
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    tokio::pin!(conn);
    let result = tokio::select! {
        r = conn.as_mut() => r,
        _ = tracker.stopping() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        tracing::debug!(%peer, error = %e, "client connection ended with an error");
    }
}

/// One request from a client: authenticate, then CONNECT or forward.
async fn handle(app: Arc<App>, mut req: Request<Incoming>) -> Response<ResBody> {
    if let Some(resp) = oversize_head(req.headers(), app.config.limits.max_header_bytes) {
        return resp;
    }
    let identity: Identity = match auth::authenticate(req.headers(), &app.config.credentials) {
        Ok(id) => id,
        Err(()) => {
            let mut resp = Refusal::new(
                StatusCode::PROXY_AUTHENTICATION_REQUIRED,
                "http_request_denied",
                "proxy credentials required",
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
        return connect::connect(app, req, identity);
    }
    match Target::of(req.uri()) {
        Some(target) => {
            req.extensions_mut().insert(identity);
            forward(app, req, target).await
        }
        None => Refusal::new(
            StatusCode::BAD_REQUEST,
            "http_request_error",
            "sluice is a forward proxy: send absolute-form requests (set HTTP_PROXY)",
        )
        .into_response(),
    }
}

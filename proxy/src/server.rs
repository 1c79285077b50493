//! Listeners, connections and graceful shutdown (R-OP3).

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use http::{HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

use crate::admin;
use crate::auth::{self, Identity};
use crate::body::ResBody;
use crate::config::Config;
use crate::connect;
use crate::edge::Refusal;
use crate::forward::{forward, oversize_head, Target};
use crate::guard::Guard;
use crate::metrics::Metrics;
use crate::observe::Observe;
use crate::providers::Providers;
use crate::store::{LearnedRecord, Store};
use crate::tls::{CaPaths, CertAuthority};
use crate::upstream::{self, Upstream};

/// Everything a connection needs, shared.
#[derive(Debug)]
pub struct App {
    /// The config in force (replaced on reload).
    config: RwLock<Arc<Config>>,
    /// Where the config came from, for SIGHUP.
    config_path: Option<PathBuf>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// The store, if it could be opened.
    pub store: Option<Arc<Store>>,
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

impl App {
    /// The config in force.
    pub fn config(&self) -> Arc<Config> {
        self.config
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
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

    /// Drives a connection to its end; if shutdown begins first, asks it
    /// to close gracefully (`close`: the connection's `graceful_shutdown`)
    /// and lets what is in flight finish.
    pub async fn serve<F, O>(&mut self, mut conn: Pin<&mut F>, close: impl FnOnce(Pin<&mut F>)) -> O
    where
        F: Future<Output = O>,
    {
        tokio::select! {
            out = conn.as_mut() => out,
            _ = self.stopping() => {
                close(conn.as_mut());
                conn.await
            }
        }
    }
}

/// Runs sluice until SIGTERM or SIGINT, then drains within the grace
/// period and saves what it learned. SIGHUP reloads the config file.
pub async fn run(config: Config, config_path: Option<PathBuf>) -> Result<(), String> {
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
    let metrics = Arc::new(Metrics::new(config.limits.max_metric_providers));
    let store = Store::open(&config.state_dir, &metrics).map(Arc::new);
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
    let observer = Arc::new(Observe {
        metrics: metrics.clone(),
        store: store.clone(),
    });
    let providers = Providers::new(&config, upstream, Some(observer));
    if let Some(store) = &store {
        restore(&providers, store, &metrics, config.limits.state_max_age);
    }
    let app = Arc::new(App {
        ca,
        providers,
        guard,
        metrics,
        store,
        config: RwLock::new(Arc::new(config)),
        config_path,
        shutdown: Shutdown::new(),
        ready: AtomicBool::new(false),
    });
    tokio::spawn(admin::serve(app.clone(), admin_listener));
    tokio::spawn(sweep(app.clone()));
    tokio::spawn(save_periodically(app.clone()));
    app.ready.store(true, Ordering::SeqCst);
    tracing::info!(proxy = %proxy_addr, admin = %admin_addr, "sluice listening");
    // A machine-readable line for supervisors and tests that bind port 0.
    println!("sluice listening proxy={proxy_addr} admin={admin_addr}");

    let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let mut hup = signal(SignalKind::hangup()).map_err(|e| e.to_string())?;
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
            _ = hup.recv() => reload(&app),
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    drop(proxy);
    app.ready.store(false, Ordering::SeqCst);
    let grace = app.config().limits.shutdown_grace;
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
    save(&app);
    tracing::info!("stopped");
    Ok(())
}

/// Loads learned state from the store into the table (R-PS1): records
/// younger than `max_age` are restored when their provider is first used;
/// older ones are discarded and that provider starts cold.
fn restore(providers: &Providers, store: &Store, metrics: &Metrics, max_age: Duration) {
    for (name, record) in store.load_learned() {
        let age = record.age();
        if age < max_age {
            providers.keep(&name, record.state(), age);
            metrics.state_restored.inc();
            tracing::info!(provider = %name, age_ms = age.as_millis() as u64, rate_rps = record.rate_rps, "learned state restored");
        } else {
            tracing::info!(provider = %name, age_ms = age.as_millis() as u64, "learned state older than state_max_age: discarded, cold start");
        }
    }
}

/// Saves every provider's learned state and flushes the store.
fn save(app: &App) {
    let Some(store) = &app.store else { return };
    for (name, state, age) in app.providers.learned() {
        if let Err(e) = store.save_learned(&name, &LearnedRecord::of(&state, age)) {
            app.metrics.store_errors.inc();
            tracing::error!(provider = %name, error = %e, "learned state not saved");
        }
    }
    if let Err(e) = store.flush() {
        app.metrics.store_errors.inc();
        tracing::error!(error = %e, "store flush failed");
    }
}

async fn save_periodically(app: Arc<App>) {
    loop {
        tokio::time::sleep(app.config().limits.save_interval).await;
        let app = app.clone();
        // sled's flush blocks on the disk: keep it off the proxy's threads.
        let _ = tokio::task::spawn_blocking(move || save(&app)).await;
    }
}

/// SIGHUP: re-reads the config file. A bad file is rejected, naming the
/// key, and the running config stays (R-OP5). Learned state is kept.
fn reload(app: &App) {
    let Some(path) = &app.config_path else {
        tracing::warn!("SIGHUP: sluice was started without --config; nothing to reload");
        return;
    };
    let current = app.config();
    let loaded = Config::load(path).and_then(|mut c| {
        // Listeners and the state directory are fixed for the process.
        for (what, changed) in [
            ("listen", c.listen != current.listen && c.listen.port() != 0),
            ("admin", c.admin != current.admin && c.admin.port() != 0),
            ("state_dir", c.state_dir != current.state_dir),
            ("upstream.extra_ca", c.extra_ca != current.extra_ca),
        ] {
            if changed {
                tracing::warn!(
                    key = what,
                    "changed in the config file: takes effect on restart"
                );
            }
        }
        c.listen = current.listen;
        c.admin = current.admin;
        c.state_dir = current.state_dir.clone();
        c.check()?;
        Ok(c)
    });
    match loaded {
        Ok(new) => {
            app.guard.set_allow(new.destinations.allow.clone());
            app.providers.reload(&new);
            *app.config.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(new);
            app.metrics.reloads.with_label_values(&["ok"]).inc();
            tracing::info!("config reloaded; learned state kept");
        }
        Err(e) => {
            app.metrics.reloads.with_label_values(&["rejected"]).inc();
            tracing::warn!(error = %e, "config reload rejected; the running config stays");
        }
    }
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

/// Every 30 s: evicts idle providers and prunes stale learned state from
/// the store, so neither grows with every host ever seen.
async fn sweep(app: Arc<App>) {
    let mut tick = tokio::time::interval(Duration::from_secs(30));
    loop {
        tick.tick().await;
        app.providers.sweep();
        if let Some(store) = app.store.clone() {
            let max_age = app.config().limits.state_max_age;
            let metrics = app.metrics.clone();
            let _ = tokio::task::spawn_blocking(move || {
                if let Err(e) = store.prune_learned(max_age) {
                    metrics.store_errors.inc();
                    tracing::error!(error = %e, "pruning stale learned state failed");
                }
            })
            .await;
        }
    }
}

async fn serve_connection(app: Arc<App>, stream: TcpStream, peer: SocketAddr) {
    let mut tracker = app.shutdown.tracker();
    let limits = app.config().limits.clone();
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
    let result = tracker
        .serve(conn.as_mut(), |c| c.graceful_shutdown())
        .await;
    if let Err(e) = result {
        tracing::debug!(%peer, error = %e, "client connection ended with an error");
    }
}

/// One request from a client: authenticate, then CONNECT or forward.
async fn handle(app: Arc<App>, mut req: Request<Incoming>) -> Response<ResBody> {
    if let Some(resp) = oversize_head(req.headers(), app.config().limits.max_header_bytes) {
        return resp;
    }
    let identity: Identity = match auth::authenticate(req.headers(), &app.config().credentials) {
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
        return connect::connect(app, req, identity).await;
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

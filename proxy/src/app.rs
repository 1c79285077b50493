//! The shared handles every connection reads (R-OP3): the config in force
//! (one snapshot per request — a SIGHUP mid-request cannot mix two), the
//! provider table, metrics, store, guard, CA, and shutdown tracking.
//!
//! Every other module may read `App`; `app` itself imports only what it
//! holds, so no module imports the one that imports it.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, RwLock};
use std::task::Poll;

use tokio::sync::watch;

use crate::config::Config;
use crate::observe::metrics::Metrics;
use crate::providers::Providers;
use crate::runs::Runs;
use crate::store::{Store, StoreWriter};
use crate::tunnel::tls::ca::CertAuthority;
use crate::upstream::guard::Guard;

/// Everything a connection needs, shared.
#[derive(Debug)]
pub struct App {
    /// The config in force (replaced on reload).
    pub(crate) config: RwLock<Arc<Config>>,
    /// Where the config came from, for SIGHUP.
    pub(crate) config_path: Option<PathBuf>,
    /// What the command line set over the file, applied to each reload.
    pub(crate) overrides: crate::config::Overrides,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// The store, if it could be opened (reads).
    pub store: Option<Arc<Store>>,
    /// Its one writer, off the runtime (every write).
    pub writer: Option<StoreWriter>,
    /// The provider table.
    pub providers: Providers,
    /// Collectors' runs: leases, checkpoints, gap records.
    pub runs: Runs,
    /// The destination guard.
    pub guard: Guard,
    /// Shutdown signalling and draining.
    pub shutdown: Shutdown,
    /// Listeners are bound and serving.
    pub ready: AtomicBool,
    /// The interception CA, if it could be loaded or created.
    pub ca: Option<Arc<CertAuthority>>,
    /// The TLS server config every intercepted handshake that names its
    /// server shares (one session cache and ticketer: resumption).
    pub intercept_tls: std::sync::OnceLock<Option<Arc<rustls::ServerConfig>>>,
    /// The last minutes of each provider's pace (the admin page).
    pub history: crate::observe::history::History,
    /// The admin listener's address as bound (its port the system's
    /// choice where the config says 0): proxied requests to it go to it
    /// straight, never paced (see `http::forward`).
    pub admin: std::net::SocketAddr,
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

    /// Waits until what was queued for the store so far is readable —
    /// a readout right after a breaker transition shows its evidence — but
    /// at most a second: a stalled disk delays a readout, never hangs it.
    pub async fn store_applied(&self) {
        if let Some(w) = &self.writer {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(1), w.applied()).await;
        }
    }
}

impl Shutdown {
    pub(crate) fn new() -> Self {
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

    pub(crate) fn begin(&self) {
        self.tx.send_replace(true);
    }

    /// Resolves once every tracker is dropped.
    pub(crate) async fn drained(&self) {
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
    ///
    /// The connection is polled first, every time: it is what a wake-up is
    /// for. The shutdown watch is polled only when it may have news — its
    /// value changed, or this task's waker is not the one it holds — and
    /// otherwise looked at through a version number: a watch polled on
    /// every one of a connection's polls cost some 330 instructions a
    /// request (R-PF1, issue 38).
    pub async fn serve<F, O>(&mut self, mut conn: Pin<&mut F>, close: impl FnOnce(Pin<&mut F>)) -> O
    where
        F: Future<Output = O>,
    {
        let news = self.rx.clone();
        let stopping = self.stopping();
        tokio::pin!(stopping);
        // The waker the watch holds, since it was last polled.
        let mut told: Option<std::task::Waker> = None;
        let stopped = std::future::poll_fn(|cx| {
            if let Poll::Ready(out) = conn.as_mut().poll(cx) {
                return Poll::Ready(Some(out));
            }
            // `has_changed` fails once the sender is gone: shutdown too.
            let changed = news.has_changed().unwrap_or(true);
            if changed || !told.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                if stopping.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(None);
                }
                told = Some(cx.waker().clone());
            }
            Poll::Pending
        })
        .await;
        match stopped {
            Some(out) => out,
            None => {
                close(conn.as_mut());
                conn.await
            }
        }
    }
}

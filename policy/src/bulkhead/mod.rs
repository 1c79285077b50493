//! The bulkhead: a cap on one provider's attempts in flight (R-BH1).
//!
//! Pacing bounds how often we start requests; it does not bound how many
//! are open at once when a provider slows down. The bulkhead does, per
//! provider, so a provider that hangs can hold at most its own permits and
//! never the proxy's sockets or another provider's share (R-ST1). Its
//! waiting room is bounded like the pacer's: too many waiting, or a wait
//! past `max_queue_wait`, and the request is refused.
//!
//! It is tokio's `Semaphore` with a bounded, timed wait; tower's
//! `ConcurrencyLimit` waits in `poll_ready` without a bound, which would
//! let a hung provider queue requests forever.
//!
//! A permit is held for the whole attempt: until the response head for
//! errors and answers that are dropped, and — when the caller moves the
//! response's [`InFlight`] extension into the body it streams — until the
//! body is done, so a slow download counts as in flight.
//!
//! The bulkhead also stamps each response with its time-to-first-byte
//! ([`Ttfb`](crate::pacer::Ttfb)) measured from the moment the permit was
//! held, so that waiting inside sluice never reads as a slow provider.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};

use crate::error::BoxError;
use crate::pacer::Ttfb;
use crate::settings::ProviderSettings;

/// An attempt's bulkhead permit, carried in the response's extensions.
/// It is released when the last clone is dropped: move it into the
/// response body to keep the attempt in flight while the body streams.
#[derive(Debug, Clone)]
pub struct InFlight {
    _permit: Arc<tokio::sync::OwnedSemaphorePermit>,
}

/// The bulkhead refused: too many attempts in flight and waiting.
#[derive(Debug, Clone, thiserror::Error)]
#[error("too many requests in flight to this provider")]
pub struct BulkheadFull {
    /// A suggestion for when to come back.
    pub retry_after: Duration,
}

/// One provider's permits, shared by all its services.
#[derive(Debug)]
pub struct BulkheadShared {
    permits: Arc<Semaphore>,
    /// Permits the semaphore was built or resized to.
    size: Mutex<usize>,
    waiting: AtomicUsize,
    limits: Mutex<(usize, Duration)>,
}

impl BulkheadShared {
    /// Permits for `max_in_flight` attempts.
    pub fn new(settings: &ProviderSettings) -> Arc<Self> {
        Arc::new(BulkheadShared {
            permits: Arc::new(Semaphore::new(settings.max_in_flight)),
            size: Mutex::new(settings.max_in_flight),
            waiting: AtomicUsize::new(0),
            limits: Mutex::new((settings.max_queue_len, settings.max_queue_wait)),
        })
    }

    /// Applies new settings: permits are added or forgotten to match.
    pub fn update_settings(&self, settings: &ProviderSettings) {
        let mut size = self.size.lock().unwrap_or_else(|p| p.into_inner());
        let want = settings.max_in_flight;
        if want > *size {
            self.permits.add_permits(want - *size);
        } else {
            // Permits in use are forgotten as they come back.
            let gone = self.permits.forget_permits(*size - want);
            let owed = *size - want - gone;
            if owed > 0 {
                let permits = self.permits.clone();
                tokio::spawn(async move {
                    if let Ok(p) = permits.acquire_many_owned(owed as u32).await {
                        p.forget();
                    }
                });
            }
        }
        *size = want;
        *self.limits.lock().unwrap_or_else(|p| p.into_inner()) =
            (settings.max_queue_len, settings.max_queue_wait);
    }

    /// Attempts in flight now.
    pub fn in_flight(&self) -> usize {
        let size = *self.size.lock().unwrap_or_else(|p| p.into_inner());
        size.saturating_sub(self.permits.available_permits())
    }

    /// Requests waiting for a permit now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }
}

/// Applies a provider's bulkhead. Cloning shares the permits.
#[derive(Debug, Clone)]
pub struct BulkheadLayer {
    shared: Arc<BulkheadShared>,
}

impl BulkheadLayer {
    /// A layer over the given shared permits.
    pub fn new(shared: Arc<BulkheadShared>) -> Self {
        BulkheadLayer { shared }
    }
}

impl<S> Layer<S> for BulkheadLayer {
    type Service = Bulkhead<S>;

    fn layer(&self, inner: S) -> Bulkhead<S> {
        Bulkhead {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The service of [`BulkheadLayer`].
#[derive(Debug, Clone)]
pub struct Bulkhead<S> {
    inner: S,
    shared: Arc<BulkheadShared>,
}

struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl<S, B, R> Service<Request<B>> for Bulkhead<S>
where
    S: Service<Request<B>, Response = Response<R>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    B: Send + 'static,
    R: Send + 'static,
{
    type Response = Response<R>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<R>, BoxError>> + Send + 'static>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let inner = self.inner.clone();
        let shared = self.shared.clone();
        Box::pin(async move {
            let (max_waiting, max_wait) = *shared.limits.lock().unwrap_or_else(|p| p.into_inner());
            let permit = match shared.permits.clone().try_acquire_owned() {
                Ok(p) => p,
                Err(_) => {
                    if shared.waiting.fetch_add(1, Ordering::Relaxed) >= max_waiting {
                        shared.waiting.fetch_sub(1, Ordering::Relaxed);
                        return Err(BulkheadFull {
                            retry_after: Duration::from_secs(1),
                        }
                        .into());
                    }
                    let _waiting = Waiting(&shared.waiting);
                    match tokio::time::timeout(max_wait, shared.permits.clone().acquire_owned())
                        .await
                    {
                        Ok(Ok(p)) => p,
                        _ => {
                            return Err(BulkheadFull {
                                retry_after: Duration::from_secs(1),
                            }
                            .into())
                        }
                    }
                }
            };
            let start = Instant::now();
            let mut resp = inner.oneshot(req).await.map_err(Into::into)?;
            resp.extensions_mut().insert(Ttfb(start.elapsed()));
            crate::outcome::stamp(&mut resp, std::time::SystemTime::now());
            resp.extensions_mut().insert(InFlight {
                _permit: Arc::new(permit),
            });
            Ok(resp)
        })
    }
}

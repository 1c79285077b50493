use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use tokio::time::Instant;
use tower::{Service, ServiceExt};

use super::{BulkheadFull, BulkheadShared};
use crate::attempt::Attempt;
use crate::attempt::Report;
use crate::classify::Resource;
use crate::error::{BoxFuture, Cause};

/// An attempt's bulkhead permit, carried in the response's extensions.
/// It is released when the last clone is dropped: move it into the
/// response body to keep the attempt in flight while the body streams.
#[derive(Debug, Clone)]
pub struct InFlight {
    _permit: Arc<tokio::sync::OwnedSemaphorePermit>,
}

/// The service of [`BulkheadLayer`](super::BulkheadLayer).
#[derive(Debug, Clone)]
pub struct Bulkhead<S> {
    inner: S,
    shared: Arc<BulkheadShared>,
}

impl<S> Bulkhead<S> {
    /// Wraps `inner` with the shared permits.
    pub fn new(inner: S, shared: Arc<BulkheadShared>) -> Self {
        Bulkhead { inner, shared }
    }
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
    S::Error: Into<Cause>,
    S::Future: Send + 'static,
    B: Send + 'static,
    R: Send + 'static,
{
    type Response = Response<R>;
    type Error = Cause;
    type Future = BoxFuture<Response<R>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Cause>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
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
            if let Some(attempt) = Attempt::of(&req) {
                if let Some(departure) = &attempt.departure {
                    // A run's attempt leaves within its durable reservation.
                    departure.leave().await;
                }
                if let Some(clock) = &attempt.clock {
                    clock.attempt();
                }
            }
            // The upstream reads the first bytes of the answers the
            // dialect classifies by their body.
            let dialect = shared.dialect();
            Attempt::of_mut(&mut req).dialect = Some(dialect);
            let lane = req.extensions().get::<Resource>().cloned();
            let start = Instant::now();
            let mut resp = inner.oneshot(req).await.map_err(Into::into)?;
            Report::stamp(
                &mut resp,
                start.elapsed(),
                std::time::SystemTime::now(),
                dialect,
                lane.as_ref(),
            );
            resp.extensions_mut().insert(InFlight {
                _permit: Arc::new(permit),
            });
            Ok(resp)
        })
    }
}

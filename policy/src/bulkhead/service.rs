use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use tokio::time::Instant;
use tower::{Service, ServiceExt};

use super::{take, try_take, BulkheadFull, BulkheadShared, HasBulkhead, Permit};
use crate::attempt::{Attempt, CarriesAttempt, CarriesReport, Report};
use crate::classify::{Dialect, Resource};
use crate::error::Cause;
use crate::future::{take_readied, LayerFuture, OnAnswer};

/// The service of [`BulkheadLayer`](super::BulkheadLayer).
#[derive(Debug)]
pub struct Bulkhead<S, P> {
    inner: S,
    shared: Arc<P>,
}

impl<S: Clone, P> Clone for Bulkhead<S, P> {
    fn clone(&self) -> Self {
        Bulkhead {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S, P: HasBulkhead> Bulkhead<S, P> {
    /// Wraps `inner` with the permits of the bulkhead `shared` holds.
    pub fn new(inner: S, shared: Arc<P>) -> Self {
        Bulkhead { inner, shared }
    }
}

struct Waiting<'a>(&'a AtomicU32);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl<S, P, B, R> Service<Request<B>> for Bulkhead<S, P>
where
    P: HasBulkhead,
    S: Service<Request<B>, Response = Response<R>> + Clone + Send + 'static,
    S::Error: Into<Cause>,
    S::Future: Send + 'static,
    B: CarriesAttempt + Send + 'static,
    R: CarriesReport + Send + 'static,
{
    type Response = Response<R>;
    type Error = Cause;
    type Future = LayerFuture<S::Future, Stamp, R>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Cause>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let departs = Attempt::of(&req).is_some_and(|a| a.departure.is_some());
        let acquired = match try_take(&self.shared) {
            Some(permit) if !departs => {
                let then = Stamp::start(&mut req, self.shared.bulkhead(), permit);
                return LayerFuture::sent(self.inner.call(req), then);
            }
            acquired => acquired,
        };
        let inner = take_readied(&mut self.inner);
        let shared = self.shared.clone();
        LayerFuture::waits(async move {
            let holder = shared;
            let shared = holder.bulkhead();
            let (max_waiting, max_wait) = shared.limits();
            let permit = match acquired {
                Some(p) => p,
                None => {
                    if shared.waiting.fetch_add(1, Ordering::Relaxed) >= max_waiting {
                        shared.waiting.fetch_sub(1, Ordering::Relaxed);
                        return Err(BulkheadFull {
                            retry_after: Duration::from_secs(1),
                        }
                        .into());
                    }
                    let _waiting = Waiting(&shared.waiting);
                    match tokio::time::timeout(max_wait, take(&holder)).await {
                        Ok(Some(p)) => p,
                        _ => {
                            return Err(BulkheadFull {
                                retry_after: Duration::from_secs(1),
                            }
                            .into())
                        }
                    }
                }
            };
            if let Some(departure) = Attempt::of(&req).and_then(|a| a.departure.clone()) {
                // A run's attempt leaves within its durable reservation.
                departure.leave().await;
            }
            let then = Stamp::start(&mut req, shared, permit);
            then.on_answer(inner.oneshot(req).await.map_err(Into::into))
        })
    }
}

/// An attempt holding its permit: stamps its answer's [`Report`] (time to
/// first byte from the permit) and hands the permit to the response.
#[derive(Debug)]
pub struct Stamp {
    permit: Permit,
    start: Instant,
    dialect: Dialect,
    lane: Option<Resource>,
}

impl Stamp {
    /// The attempt starts: counted on its request's clock, told the
    /// provider's dialect (the upstream reads the first bytes of the
    /// answers the dialect classifies by their body).
    fn start<B: CarriesAttempt>(
        req: &mut Request<B>,
        shared: &BulkheadShared,
        permit: Permit,
    ) -> Stamp {
        let dialect = shared.dialect();
        let attempt = Attempt::of_mut(req);
        if let Some(clock) = &attempt.clock {
            clock.attempt();
        }
        attempt.dialect = Some(dialect);
        Stamp {
            permit,
            start: crate::clock::now(),
            dialect,
            lane: req.extensions().get::<Resource>().cloned(),
        }
    }
}

impl<R: CarriesReport> OnAnswer<R> for Stamp {
    fn on_answer(self, result: Result<Response<R>, Cause>) -> Result<Response<R>, Cause> {
        let mut resp = result?;
        Report::stamp(
            &mut resp,
            crate::clock::elapsed(self.start),
            std::time::SystemTime::now(),
            self.dialect,
            self.lane.as_ref(),
        );
        R::hold(&mut resp, self.permit);
        Ok(resp)
    }
}

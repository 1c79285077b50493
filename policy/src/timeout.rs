//! The timeouts: per attempt (R-TO1: connect plus response head) and per
//! request (issue 20: every attempt, pacing wait and retry of one request,
//! up to its response head).
//!
//! tower's `Timeout` fixes its duration when the stack is built; these
//! read the provider's current setting on every call, so a config reload
//! changes them without rebuilding the stack. A timed-out attempt fails
//! with [`Cause::AttemptTimeout`], which the breaker and the retry policy
//! count as a timeout; a request past its bound fails with
//! [`Cause::RequestTimeout`], which the client gets as a `504`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Request;
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};

use crate::attempt::{Attempt, RequestClock};
use crate::error::{BoxFuture, Cause, RequestTimeout};

/// A duration that can be changed while services read it.
#[derive(Debug, Default)]
pub struct SharedDuration(AtomicU64);

impl SharedDuration {
    /// Holds `d` (saturating at u64::MAX nanoseconds).
    pub fn new(d: Duration) -> Self {
        SharedDuration(AtomicU64::new(d.as_nanos().min(u64::MAX as u128) as u64))
    }

    /// The current value.
    pub fn get(&self) -> Duration {
        Duration::from_nanos(self.0.load(Ordering::Relaxed))
    }

    /// Changes it.
    pub fn set(&self, d: Duration) {
        self.0
            .store(d.as_nanos().min(u64::MAX as u128) as u64, Ordering::Relaxed);
    }
}

/// Applies the per-attempt timeout.
#[derive(Debug, Clone)]
pub struct AttemptTimeoutLayer {
    limit: Arc<SharedDuration>,
}

impl AttemptTimeoutLayer {
    /// A layer reading `limit` on each call.
    pub fn new(limit: Arc<SharedDuration>) -> Self {
        AttemptTimeoutLayer { limit }
    }
}

impl<S> Layer<S> for AttemptTimeoutLayer {
    type Service = AttemptTimeout<S>;

    fn layer(&self, inner: S) -> AttemptTimeout<S> {
        AttemptTimeout {
            inner,
            limit: self.limit.clone(),
        }
    }
}

/// The service of [`AttemptTimeoutLayer`].
#[derive(Debug, Clone)]
pub struct AttemptTimeout<S> {
    inner: S,
    limit: Arc<SharedDuration>,
}

impl<S, Req> Service<Req> for AttemptTimeout<S>
where
    S: Service<Req>,
    S::Error: Into<Cause>,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
{
    type Response = S::Response;
    type Error = Cause;
    type Future = BoxFuture<S::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Cause>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let fut = self.inner.call(req);
        let limit = self.limit.get();
        Box::pin(async move {
            match tokio::time::timeout(limit, fut).await {
                Ok(r) => r.map_err(Into::into),
                Err(_) => Err(Cause::AttemptTimeout),
            }
        })
    }
}

/// Bounds a request's whole way through the provider's stack — pacing
/// waits, attempts, retries and their back-off — up to its response head
/// (the body streams unbounded, as a long export must).
#[derive(Debug, Clone)]
pub struct RequestTimeoutLayer {
    limit: Arc<SharedDuration>,
}

impl RequestTimeoutLayer {
    /// A layer reading `limit` on each call.
    pub fn new(limit: Arc<SharedDuration>) -> Self {
        RequestTimeoutLayer { limit }
    }
}

impl<S> Layer<S> for RequestTimeoutLayer {
    type Service = RequestTimeoutService<S>;

    fn layer(&self, inner: S) -> RequestTimeoutService<S> {
        RequestTimeoutService {
            inner,
            limit: self.limit.clone(),
        }
    }
}

/// The service of [`RequestTimeoutLayer`].
#[derive(Debug, Clone)]
pub struct RequestTimeoutService<S> {
    inner: S,
    limit: Arc<SharedDuration>,
}

impl<S, B> Service<Request<B>> for RequestTimeoutService<S>
where
    S: Service<Request<B>> + Clone + Send + 'static,
    S::Error: Into<Cause>,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = Cause;
    type Future = BoxFuture<S::Response>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Cause>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let inner = self.inner.clone();
        let limit = self.limit.get();
        Box::pin(async move {
            let started = Instant::now();
            let clock = RequestClock::new(started + limit);
            Attempt::of_mut(&mut req).clock = Some(clock.clone());
            let call = inner.oneshot(req);
            tokio::pin!(call);
            loop {
                let deadline = clock.deadline();
                tokio::select! {
                    biased;
                    result = &mut call => return result.map_err(Into::into),
                    () = tokio::time::sleep_until(deadline) => {
                        // A run's wait may have moved the bound on meanwhile.
                        if clock.deadline() <= Instant::now() {
                            return Err(Cause::RequestTimeout(RequestTimeout {
                                after: started.elapsed(),
                                attempts: clock.attempts(),
                            }));
                        }
                    }
                }
            }
        })
    }
}

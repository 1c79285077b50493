//! The per-attempt timeout (R-TO1): connect plus response head.
//!
//! tower's `Timeout` fixes its duration when the stack is built; this one
//! reads the provider's current setting on every call, so a config reload
//! changes it without rebuilding the stack. A timed-out attempt fails with
//! tower's `Elapsed`, which the breaker and the retry policy count as a
//! timeout.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tower::{Layer, Service};

use crate::error::{BoxFuture, Cause};

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

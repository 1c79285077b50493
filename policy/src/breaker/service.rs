use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::SystemTime;

use http::{Request, Response};
use tokio::time::Instant;
use tower::{Service, ServiceExt};

use super::state::Permit;
use super::{BreakerShared, CircuitOpen};
use crate::error::BoxError;
use crate::outcome::{self, Outcome};

/// Fails fast while the provider's circuit is open; counts outcomes.
#[derive(Debug, Clone)]
pub struct Breaker<S> {
    pub(super) inner: S,
    pub(super) shared: Arc<BreakerShared>,
}

/// Gives a permit back if the call is dropped before it finished.
struct PermitGuard {
    shared: Arc<BreakerShared>,
    permit: Option<Permit>,
}

impl PermitGuard {
    fn finish(&mut self, outcome: Option<Outcome>) {
        let Some(permit) = self.permit.take() else {
            return;
        };
        let transition = {
            let mut b = self.shared.lock();
            match outcome {
                Some(o) => b.record(permit, o.is_breaker_failure(), Instant::now()),
                None => {
                    b.release(permit);
                    None
                }
            }
        };
        if let Some(t) = transition {
            self.shared.publish(t);
        }
    }
}

impl Drop for PermitGuard {
    fn drop(&mut self) {
        self.finish(None);
    }
}

fn acquire(shared: &BreakerShared) -> Result<Permit, std::time::Duration> {
    let (permit, transition) = shared.lock().try_acquire(Instant::now());
    if let Some(t) = transition {
        shared.publish(t);
    }
    permit
}

impl<S, B, R> Service<Request<B>> for Breaker<S>
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
            let permit = match acquire(&shared) {
                Ok(p) => p,
                Err(wait) => match shared.wait_for_probe() {
                    // Opted in: wait for the half-open probe, within the
                    // queue wait, then ask once more.
                    Some(max) if wait <= max => {
                        tokio::time::sleep(wait).await;
                        acquire(&shared).map_err(|retry_after| CircuitOpen { retry_after })?
                    }
                    _ => return Err(CircuitOpen { retry_after: wait }.into()),
                },
            };
            let mut guard = PermitGuard {
                shared: shared.clone(),
                permit: Some(permit),
            };
            let result = inner.oneshot(req).await.map_err(Into::into);
            let outcome = match &result {
                Ok(resp) => Some(outcome::of_response(resp, SystemTime::now())),
                Err(e) => Outcome::of_error(e),
            };
            guard.finish(outcome);
            result
        })
    }
}

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::SystemTime;

use http::{Request, Response};
use tower::{Service, ServiceExt};

use super::BreakerShared;
use crate::attempt::Attempt;
use crate::classify::Outcome;
use crate::error::{BoxFuture, Cause};

/// Fails fast while the provider's circuit is open; counts outcomes.
#[derive(Debug, Clone)]
pub struct Breaker<S> {
    pub(super) inner: S,
    pub(super) shared: Arc<BreakerShared>,
}

impl<S, B, R> Service<Request<B>> for Breaker<S>
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

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let inner = self.inner.clone();
        let shared = self.shared.clone();
        Box::pin(async move {
            let parked_probe = Attempt::of(&req).is_some_and(|a| a.parked_probe);
            let acquired = if parked_probe {
                Ok(shared.acquire_parked())
            } else {
                shared.acquire()
            };
            let permit = match acquired {
                Ok(p) => p,
                Err(open) => match shared.wait_for_probe() {
                    // Opted in: wait for the half-open probe, within the
                    // queue wait, then ask once more.
                    Some(max) if open.retry_after <= max => {
                        tokio::time::sleep(open.retry_after).await;
                        shared.acquire()?
                    }
                    _ => return Err(open.into()),
                },
            };
            let result = inner.oneshot(req).await.map_err(Into::into);
            let outcome = Outcome::of_result(&result, SystemTime::now());
            permit.finish_outcome(outcome);
            result
        })
    }
}

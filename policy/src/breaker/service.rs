use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower::{Service, ServiceExt};

use super::{BreakerShared, CallPermit, HasBreaker};
use crate::attempt::{Attempt, CarriesAttempt, CarriesReport};
use crate::classify::Outcome;
use crate::error::Cause;
use crate::future::{take_readied, LayerFuture, OnAnswer};

/// Fails fast while the provider's circuit is open; counts outcomes.
#[derive(Debug)]
pub struct Breaker<S, P> {
    pub(super) inner: S,
    pub(super) shared: Arc<P>,
}

impl<S: Clone, P> Clone for Breaker<S, P> {
    fn clone(&self) -> Self {
        Breaker {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S, P, B, R> Service<Request<B>> for Breaker<S, P>
where
    P: HasBreaker,
    S: Service<Request<B>, Response = Response<R>> + Clone + Send + 'static,
    S::Error: Into<Cause>,
    S::Future: Send + 'static,
    B: CarriesAttempt + Send + 'static,
    R: CarriesReport + Send + 'static,
{
    type Response = Response<R>;
    type Error = Cause;
    type Future = LayerFuture<S::Future, Finish, R>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Cause>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let parked_probe = Attempt::of(&req).is_some_and(|a| a.parked_probe);
        let acquired = if parked_probe {
            Ok(BreakerShared::acquire_parked(&self.shared))
        } else {
            BreakerShared::acquire(&self.shared)
        };
        let open = match acquired {
            Ok(permit) => return LayerFuture::sent(self.inner.call(req), Finish(permit)),
            Err(open) => open,
        };
        match self.shared.breaker().wait_for_probe() {
            // Opted in: wait for the half-open probe, within the queue
            // wait, then ask once more.
            Some(max) if open.retry_after <= max => {
                let inner = take_readied(&mut self.inner);
                let shared = self.shared.clone();
                LayerFuture::waits(async move {
                    tokio::time::sleep(open.retry_after).await;
                    let permit = BreakerShared::acquire(&shared)?;
                    Finish(permit).on_answer(inner.oneshot(req).await.map_err(Into::into))
                })
            }
            _ => LayerFuture::refused(open),
        }
    }
}

/// Records the attempt's outcome on the breaker.
#[derive(Debug)]
pub struct Finish(CallPermit);

impl<R: CarriesReport> OnAnswer<R> for Finish {
    fn on_answer(self, result: Result<Response<R>, Cause>) -> Result<Response<R>, Cause> {
        let outcome = Outcome::of_result_now(&result);
        self.0.finish_outcome(outcome);
        result
    }
}

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use http::{Request, Response};
use tower::{Service, ServiceExt};

use super::{PacerShared, RateLimited, Refusal};
use crate::attempt::{Attempt, Report};
use crate::classify::Outcome;
use crate::error::{BoxFuture, Cause};
use crate::quota;

/// The pacer's future.
pub type ResponseFuture<R> = BoxFuture<Response<R>>;

/// Waits for the provider's pacing slot, sends, and feeds what came back
/// into the provider's AIMD controller and hold.
#[derive(Debug, Clone)]
pub struct Pacer<S> {
    inner: S,
    shared: Arc<PacerShared>,
}

impl<S> Pacer<S> {
    /// Wraps `inner` with the shared pacer.
    pub fn new(inner: S, shared: Arc<PacerShared>) -> Self {
        Pacer { inner, shared }
    }
}

impl<S, B, R> Service<Request<B>> for Pacer<S>
where
    S: Service<Request<B>, Response = Response<R>> + Clone + Send + 'static,
    S::Error: Into<Cause>,
    S::Future: Send + 'static,
    B: Send + 'static,
    R: Send + 'static,
{
    type Response = Response<R>;
    type Error = Cause;
    type Future = ResponseFuture<R>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Cause>> {
        // Waiting happens in the response future, per request, in FIFO
        // order; the inner service is readied there too.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let inner = self.inner.clone();
        let shared = self.shared.clone();
        let attempt = Attempt::of(&req);
        let class = attempt.and_then(|a| a.class.clone()).unwrap_or_default();
        let (priced, stop_at) = attempt.map_or((None, None), |a| (a.units, a.deadline));
        let (units, cost_header) = {
            let core = shared.lock();
            (
                priced.unwrap_or_else(|| core.cost_of(req.method(), req.uri().path())),
                core.cost_header().cloned(),
            )
        };
        Box::pin(async move {
            // Not past the instant the request may not wait past (its run's
            // deadline): refused instead, and its run gate stops the run.
            let sent_at = shared.acquire_as(&class, units, stop_at).await?;
            if stop_at.is_some_and(|d| sent_at >= d) {
                return Err(RateLimited::new(Refusal::PastDeadline, Duration::ZERO).into());
            }
            let mut result = inner.oneshot(req).await.map_err(Into::into);
            let wall = SystemTime::now();
            let outcome = Outcome::of_result(&result, wall);
            let ttfb = result
                .as_ref()
                .ok()
                .and_then(|resp| Report::of(resp).map(|r| r.ttfb));
            let (mut extra, mut quota, mut tokens) = (0, None, None);
            if let Ok(resp) = &mut result {
                if let Some(charged) = cost_header
                    .as_ref()
                    .and_then(|h| crate::cost::charged(resp.headers(), h))
                {
                    extra = charged.saturating_sub(units);
                    if let Some(report) = resp.extensions_mut().get_mut::<Report>() {
                        report.charged = extra;
                    }
                }
                // As the dialect read it (none when the headers speak for
                // another of the provider's budgets, R-PD1).
                (quota, tokens) = match Report::of(resp) {
                    Some(report) => (report.quota, report.tokens),
                    None => (Some(quota::advertised(resp.headers(), wall)), None),
                };
            }
            // Outcome, charge, quota: one call, one lock.
            shared.answered(outcome, sent_at, ttfb, extra, quota, tokens);
            result
        })
    }
}

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use http::header::HeaderName;
use http::{Request, Response};
use tokio::time::Instant;
use tower::{Service, ServiceExt};

use super::{HasPacer, RateLimited, Refusal};
use crate::attempt::{Attempt, CarriesAttempt, CarriesReport, Report};
use crate::classify::Outcome;
use crate::error::Cause;
use crate::future::{take_readied, LayerFuture, OnAnswer};
use crate::quota;

/// The pacer's future.
pub type ResponseFuture<F, R, P> = LayerFuture<F, Answered<P>, R>;

/// Waits for the provider's pacing slot, sends, and feeds what came back
/// into the provider's AIMD controller and hold.
#[derive(Debug)]
pub struct Pacer<S, P> {
    inner: S,
    shared: Arc<P>,
}

impl<S: Clone, P> Clone for Pacer<S, P> {
    fn clone(&self) -> Self {
        Pacer {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S, P: HasPacer> Pacer<S, P> {
    /// Wraps `inner` with the pacer `shared` holds.
    pub fn new(inner: S, shared: Arc<P>) -> Self {
        Pacer { inner, shared }
    }
}

impl<S, P, B, R> Service<Request<B>> for Pacer<S, P>
where
    P: HasPacer,
    S: Service<Request<B>, Response = Response<R>> + Clone + Send + 'static,
    S::Error: Into<Cause>,
    S::Future: Send + 'static,
    B: CarriesAttempt + Send + 'static,
    R: CarriesReport + Send + 'static,
{
    type Response = Response<R>;
    type Error = Cause;
    type Future = ResponseFuture<S::Future, R, P>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Cause>> {
        // Waiting happens in the response future, per request, in FIFO
        // order.
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let attempt = Attempt::of(&req);
        let class = attempt.and_then(|a| a.class.clone()).unwrap_or_default();
        let (priced, stop_at) = attempt.map_or((None, None), |a| (a.units, a.deadline));
        let (units, cost_header) = {
            let core = self.shared.pacer().lock();
            (
                priced.unwrap_or_else(|| core.cost_of(req.method(), req.uri().path())),
                core.cost_header().cloned(),
            )
        };
        let shared = self.shared.clone();
        let then = move |sent_at| Answered {
            shared,
            sent_at,
            units,
            cost_header,
        };
        if let Some(sent_at) = self.shared.pacer().try_acquire_now(&class, units, stop_at) {
            return LayerFuture::sent(self.inner.call(req), then(sent_at));
        }
        let inner = take_readied(&mut self.inner);
        let shared = self.shared.clone();
        LayerFuture::waits(async move {
            // Not past the instant the request may not wait past (its run's
            // deadline): refused instead, and its run gate stops the run.
            let sent_at = shared.pacer().acquire_as(&class, units, stop_at).await?;
            if stop_at.is_some_and(|d| sent_at >= d) {
                return Err(RateLimited::new(Refusal::PastDeadline, Duration::ZERO).into());
            }
            then(sent_at).on_answer(inner.oneshot(req).await.map_err(Into::into))
        })
    }
}

/// Feeds the attempt's answer back to the pacer: outcome, the units the
/// provider charged beyond the price, the quota and tokens it advertised.
#[derive(Debug)]
pub struct Answered<P> {
    shared: Arc<P>,
    sent_at: Instant,
    units: u32,
    cost_header: Option<HeaderName>,
}

impl<R: CarriesReport, P: HasPacer> OnAnswer<R> for Answered<P> {
    fn on_answer(self, mut result: Result<Response<R>, Cause>) -> Result<Response<R>, Cause> {
        let outcome = Outcome::of_result_now(&result);
        let ttfb = result
            .as_ref()
            .ok()
            .and_then(|resp| Report::of(resp).map(|r| r.ttfb));
        let (mut extra, mut quota, mut tokens) = (0, None, None);
        if let Ok(resp) = &mut result {
            if let Some(charged) = self
                .cost_header
                .as_ref()
                .and_then(|h| crate::cost::charged(resp.headers(), h))
            {
                extra = charged.saturating_sub(self.units);
                if let Some(report) = Report::of_mut(resp) {
                    report.charged = extra;
                }
            }
            // As the dialect read it (none when the headers speak for
            // another of the provider's budgets, R-PD1).
            (quota, tokens) = match Report::of(resp) {
                Some(report) => (report.quota(), report.tokens()),
                None => (
                    Some(quota::advertised(resp.headers(), SystemTime::now())),
                    None,
                ),
            };
        }
        // Outcome, charge, quota: one call, one lock.
        self.shared
            .pacer()
            .answered(outcome, self.sent_at, ttfb, extra, quota, tokens);
        result
    }
}

use std::sync::Arc;

use http::{Request, Response};
use tokio::time::Sleep;

use super::HasRetry;
use crate::attempt::Attempt;
use crate::attempt::{clone_request, retryable_method, CarriesReport, ReplayBody};
use crate::classify::Outcome;
use crate::error::Cause;

/// tower's retry policy for one request to one provider: decides from the
/// classified outcome, the provider's ratio budget and the run's budget.
#[derive(Debug)]
pub struct RetryPolicy<P> {
    shared: Arc<P>,
    /// Attempts answered so far for this request.
    answered: u32,
}

impl<P> Clone for RetryPolicy<P> {
    fn clone(&self) -> Self {
        RetryPolicy {
            shared: self.shared.clone(),
            answered: self.answered,
        }
    }
}

impl<P: HasRetry> RetryPolicy<P> {
    /// A policy over the budget of the retry state `shared` holds.
    pub fn new(shared: Arc<P>) -> Self {
        RetryPolicy {
            shared,
            answered: 0,
        }
    }
}

impl<P, B, R> tower::retry::Policy<Request<B>, Response<R>, Cause> for RetryPolicy<P>
where
    P: HasRetry,
    B: ReplayBody,
    R: CarriesReport,
{
    type Future = Sleep;

    fn retry(
        &mut self,
        req: &mut Request<B>,
        result: &mut Result<Response<R>, Cause>,
    ) -> Option<Sleep> {
        let now = crate::clock::now();
        // What reached the provider, if anything did: sluice's own refusals
        // (breaker open, queue full, run stopped) did not, so they neither
        // deposit into nor draw from the provider's budget (R-RN3).
        let outcome = Outcome::of_result_now(result)?;
        let retryable = outcome.is_retryable();
        if self.answered == 0 {
            self.shared.retry().budget().deposit(now);
        }
        self.answered += 1;
        if !retryable {
            return None;
        }
        let settings = self.shared.retry().settings();
        if !retryable_method(req.method(), &settings.extra_methods) {
            return None;
        }
        if self.answered >= settings.max_attempts {
            return None;
        }
        let delay = match outcome.retry_after() {
            Some(wait) if wait > settings.max_retry_after_wait => return None,
            Some(wait) => wait,
            None => {
                self.shared
                    .retry()
                    .jitter()
                    .delay(settings.base, settings.cap, self.answered - 1)
            }
        };
        let run = Attempt::of(req).and_then(|a| a.run.clone());
        if run.as_ref().is_some_and(|r| !r.can_retry()) {
            if let Some(r) = &run {
                r.retry_budget_exhausted();
            }
            return None;
        }
        if !self.shared.retry().budget().withdraw(now) {
            return None;
        }
        if let Some(r) = &run {
            r.take_retry();
        }
        crate::events::emit(self.shared.observer(), crate::events::Event::Retry(outcome));
        Some(tokio::time::sleep(delay))
    }

    fn clone_request(&mut self, req: &Request<B>) -> Option<Request<B>> {
        clone_request(req)
    }
}

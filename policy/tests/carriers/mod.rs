//! What the allocation tests send through a provider's stack: bodies with
//! the places the proxy's have — a request's attempt, an answer's report
//! and permit (`CarriesAttempt`, `CarriesReport`) — and a provider that
//! answers at once, allocating nothing.

use std::future::Ready;
use std::task::{Context, Poll};

use http::{Request, Response, StatusCode};
use sluice_policy::attempt::{Attempt, CarriesAttempt, CarriesReport, Report};
use sluice_policy::bulkhead::Permit;
use sluice_policy::error::Cause;
use sluice_policy::retry::ReplayBody;

/// A request body with a place for its attempt, as the proxy's has.
#[derive(Debug, Default)]
pub struct Body {
    attempt: Attempt,
}

impl CarriesAttempt for Body {
    fn attempt(req: &Request<Self>) -> Option<&Attempt> {
        Some(&req.body().attempt)
    }

    fn attempt_mut(req: &mut Request<Self>) -> &mut Attempt {
        &mut req.body_mut().attempt
    }
}

impl ReplayBody for Body {
    fn try_clone(&self) -> Option<Self> {
        Some(Body {
            attempt: self.attempt.clone(),
        })
    }
}

/// An answer's body with a place for its report and permit, as the
/// proxy's upstream body has.
#[derive(Debug, Default)]
pub struct Answer {
    report: Option<Report>,
    _permit: Option<Permit>,
}

impl CarriesReport for Answer {
    fn report(resp: &Response<Self>) -> Option<&Report> {
        resp.body().report.as_ref()
    }

    fn report_mut(resp: &mut Response<Self>) -> Option<&mut Report> {
        resp.body_mut().report.as_mut()
    }

    fn set_report(resp: &mut Response<Self>, report: Report) {
        resp.body_mut().report = Some(report);
    }

    fn hold(resp: &mut Response<Self>, permit: Permit) {
        resp.body_mut()._permit = Some(permit);
    }
}

/// A provider that answers every request with its status at once,
/// allocating nothing.
#[derive(Debug, Clone)]
pub struct Answers(pub StatusCode);

impl tower::Service<Request<Body>> for Answers {
    type Response = Response<Answer>;
    type Error = Cause;
    type Future = Ready<Result<Response<Answer>, Cause>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Cause>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: Request<Body>) -> Self::Future {
        let mut resp = Response::new(Answer::default());
        *resp.status_mut() = self.0;
        std::future::ready(Ok(resp))
    }
}

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use http::{Request, Response};
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};

use super::{RunHandle, RunStopped, StopReason};
use crate::error::{BoxFuture, Cause};
use crate::outcome;
use crate::retry::policy::clone_request;
use crate::retry::ReplayBody;

/// What a run's request would meet at the provider at an instant, when it
/// is source pressure worth waiting out: how long, and the reason the run
/// stops with if it cannot wait ([`crate::ProviderPolicy::pressure`]).
pub type Pressure = Arc<dyn Fn(Instant) -> Option<(Duration, StopReason)> + Send + Sync>;

/// Checks the run envelope of each attempt (first or retry) before it
/// starts, and makes a run's request wait out source pressure (R-RN8).
#[derive(Clone, Default)]
pub struct RunLayer {
    pressure: Option<Pressure>,
}

impl RunLayer {
    /// A gate that waits out what `pressure` reports.
    pub fn new(pressure: Pressure) -> Self {
        RunLayer {
            pressure: Some(pressure),
        }
    }
}

impl std::fmt::Debug for RunLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunLayer").finish_non_exhaustive()
    }
}

impl<S> Layer<S> for RunLayer {
    type Service = RunGate<S>;

    fn layer(&self, inner: S) -> RunGate<S> {
        RunGate {
            inner,
            pressure: self.pressure.clone(),
        }
    }
}

/// The service of [`RunLayer`].
#[derive(Clone)]
pub struct RunGate<S> {
    inner: S,
    pressure: Option<Pressure>,
}

impl<S> std::fmt::Debug for RunGate<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunGate").finish_non_exhaustive()
    }
}

impl<S, B, R> Service<Request<B>> for RunGate<S>
where
    S: Service<Request<B>, Response = Response<R>> + Clone + Send + 'static,
    S::Error: Into<Cause>,
    S::Future: Send + 'static,
    B: ReplayBody + Send + 'static,
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
        let Some(run) = req.extensions().get::<RunHandle>().cloned() else {
            return Box::pin(async move { inner.oneshot(req).await.map_err(Into::into) });
        };
        let pressure = self.pressure.clone();
        Box::pin(async move {
            let mut req = req;
            loop {
                let now = Instant::now();
                run.check_attempt(now)
                    .map_err(|reason| RunStopped { reason })?;
                // Known source pressure: wait it out before sending.
                if let Some((wait, reason)) = pressure.as_ref().and_then(|p| p(now)) {
                    run.release_attempt();
                    wait_out(&run, wait, reason).await?;
                    continue;
                }
                let copy = clone_request(&req);
                let result = inner.clone().oneshot(req).await.map_err(Into::into);
                let cause = match &result {
                    Err(cause) if cause.info().outcome.is_none() => cause,
                    Ok(resp) => {
                        // Only an answer that is not a failure says the
                        // provider recovered: a probe that fails again does
                        // not restart the run's count of waits.
                        if !outcome::of_response(resp, SystemTime::now()).is_breaker_failure() {
                            run.reached();
                        }
                        return result;
                    }
                    Err(_) => return result,
                };
                // sluice refused it: it never reached the provider.
                run.release_attempt();
                match (cause, copy) {
                    // The breaker opened since the check: wait, then again.
                    (Cause::CircuitOpen(open), Some(copy)) => {
                        wait_out(&run, open.retry_after, StopReason::CircuitOpen).await?;
                        req = copy;
                    }
                    _ => return result,
                }
            }
        })
    }
}

/// Waits out `wait` of source pressure for a run's request — never past
/// the run's deadline (the next check then stops the run, planned) — or
/// stops the run with `reason` when it has waited as often in a row as it
/// may.
async fn wait_out(run: &RunHandle, wait: Duration, reason: StopReason) -> Result<(), Cause> {
    run.wait_for(reason)
        .map_err(|reason| RunStopped { reason })?;
    let until = Instant::now() + wait;
    let until = run.deadline().map_or(until, |d| until.min(d));
    tokio::time::sleep_until(until).await;
    Ok(())
}

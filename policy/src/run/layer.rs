use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};

use super::{Cooldown, RunHandle, RunStopped, StopReason};
use crate::attempt::{Attempt, CarriesReport, Departure, ReplayBody, Report, RequestClock};
use crate::classify::Outcome;
use crate::error::Cause;
use crate::future::{take_readied, LayerFuture, PassOn};

/// What a run's attempt meets at its provider, composed in by the
/// provider ([`crate::ProviderPolicy`], one reference to it, R-PF1): the
/// gate imports neither the pacer nor the breaker.
pub trait RunSignals: Send + Sync {
    /// Source pressure worth waiting out at `now`, if any: how long, the
    /// reason the provider's part of the run would stop with, and which
    /// cool-down cycle it is (R-RN8).
    fn pressure(&self, now: Instant) -> Option<Cooldown>;
    /// What a request of `method` to `path` costs, in the provider's units
    /// (R-FS2).
    fn price(&self, method: &http::Method, path: &str) -> u32;
}

/// Checks the run envelope of each attempt (first or retry) before it
/// starts, and makes a run's request wait out a long `Retry-After` hold
/// (R-RN8), counted per cool-down cycle of this provider. (An outage is
/// waited out by the parking layer, outside this one.)
#[derive(Clone, Default)]
pub struct RunLayer {
    provider: Arc<str>,
    signals: Option<Arc<dyn RunSignals>>,
}

impl RunLayer {
    /// The gate of `provider`, waiting out the pressure `signals` report
    /// and counting each attempt at the units they price it at (R-FS2).
    pub fn new(provider: impl Into<Arc<str>>, signals: Arc<dyn RunSignals>) -> Self {
        RunLayer {
            provider: provider.into(),
            signals: Some(signals),
        }
    }
}

impl std::fmt::Debug for RunLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunLayer").finish_non_exhaustive()
    }
}

impl RunLayer {
    /// [`Layer::layer`] taking the layer: its handles move into the
    /// service rather than being counted again (a provider's stack is
    /// composed for each request, R-PF1).
    pub fn wrap<S>(self, inner: S) -> RunGate<S> {
        RunGate {
            inner,
            provider: self.provider,
            signals: self.signals,
        }
    }
}

impl<S> Layer<S> for RunLayer {
    type Service = RunGate<S>;

    fn layer(&self, inner: S) -> RunGate<S> {
        RunGate {
            inner,
            provider: self.provider.clone(),
            signals: self.signals.clone(),
        }
    }
}

/// The service of [`RunLayer`].
#[derive(Clone)]
pub struct RunGate<S> {
    inner: S,
    provider: Arc<str>,
    signals: Option<Arc<dyn RunSignals>>,
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
    R: CarriesReport + Send + 'static,
{
    type Response = Response<R>;
    type Error = Cause;
    type Future = LayerFuture<S::Future, PassOn, R>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Cause>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let Some(run) = Attempt::of(&req).and_then(|a| a.run.clone()) else {
            return LayerFuture::sent(self.inner.call(req), PassOn);
        };
        let inner = take_readied(&mut self.inner);
        let signals = self.signals.clone();
        let provider = self.provider.clone();
        let clock = Attempt::of(&req).and_then(|a| a.clock.clone());
        let units = signals
            .as_ref()
            .map_or(1, |s| s.price(req.method(), req.uri().path()));
        LayerFuture::waits(async move {
            let mut req = req;
            {
                // Priced once here; the pacer below waits for as many
                // slots, and no longer than the run may wait.
                let attempt = Attempt::of_mut(&mut req);
                attempt.units = Some(units);
                attempt.deadline = run.deadline();
            }
            loop {
                let now = crate::clock::now();
                run.check_attempt_units(&provider, now, units)?;
                // The attempt's departure mark: the one the parking layer
                // set (it watches it too), else a new one; it leaves within
                // the run's durable reservation (R-RN10).
                let departure = Attempt::of_mut(&mut req).departure.take();
                let reserved = Reserved::new(&run, &provider, units, departure);
                let reserving = run.clone();
                reserved.departure.bind(Arc::new(move || {
                    let run = reserving.clone();
                    Box::pin(async move { run.departing(units).await })
                }));
                // Known source pressure: wait it out before sending.
                if let Some(cooldown) = signals.as_ref().and_then(|s| s.pressure(now)) {
                    reserved.give_back();
                    wait_out(&run, &provider, &cooldown, clock.as_ref()).await?;
                    continue;
                }
                Attempt::of_mut(&mut req).departure = Some(reserved.departure.clone());
                let result = inner.clone().oneshot(req).await.map_err(Into::into);
                return account(&run, &provider, reserved, result);
            }
        })
    }
}

/// What an attempt's end means for its run: the pacer meeting the run's
/// deadline before a slot is the run's planned stop (R-RN2); an attempt
/// that reached the provider keeps its reservation and is charged what
/// the provider charged beyond its price; one sluice refused (or that
/// could not be sent) gives what it met back.
fn account<R: CarriesReport>(
    run: &RunHandle,
    provider: &str,
    reserved: Reserved,
    result: Result<Response<R>, Cause>,
) -> Result<Response<R>, Cause> {
    let result = match result {
        Err(e) if e.is_past_deadline() => {
            run.stop(StopReason::Deadline);
            Err(RunStopped::run(StopReason::Deadline).into())
        }
        other => other,
    };
    match Outcome::of_result_now(&result) {
        // Only an answer that is not a failure says the provider
        // recovered: a probe that fails again does not restart the run's
        // count of cycles.
        Some(o) => {
            reserved.keep();
            if let Some(extra) = result
                .as_ref()
                .ok()
                .and_then(|r| Report::of(r))
                .map(|r| r.charged)
                .filter(|c| *c > 0)
            {
                run.charge(extra);
            }
            if !o.is_breaker_failure() {
                run.reached(provider);
            }
            result
        }
        // It never reached the provider, and what it met goes back. (An
        // open circuit is the parking layer's, outside this one: it parks
        // the request and sends it again, R-RN8.)
        None => {
            reserved.give_back();
            result
        }
    }
}

/// An attempt reserved against the run's cap. Given back when it ends
/// without reaching the provider — refused by sluice, or dropped (its
/// client went away) before the bulkhead let it leave; kept once the
/// provider answered or the attempt left.
struct Reserved {
    run: RunHandle,
    provider: Arc<str>,
    units: u32,
    departure: Departure,
    settled: bool,
}

impl Reserved {
    fn new(
        run: &RunHandle,
        provider: &Arc<str>,
        units: u32,
        departure: Option<Departure>,
    ) -> Reserved {
        Reserved {
            run: run.clone(),
            provider: provider.clone(),
            units,
            departure: departure.unwrap_or_default(),
            settled: false,
        }
    }

    fn keep(mut self) {
        self.settled = true;
    }

    fn give_back(mut self) {
        self.settled = true;
        self.run.release_attempt_units(&self.provider, self.units);
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        if !self.settled && !self.departure.departed() {
            self.run.release_attempt_units(&self.provider, self.units);
        }
    }
}

/// Waits out a cool-down of `provider` for a run's request — never past
/// the run's deadline (the next check then stops the run, planned) — or
/// stops the provider's part of the run when it has waited out as many
/// cycles in a row as it may. The request's `request_timeout` is moved on
/// by the wait.
async fn wait_out(
    run: &RunHandle,
    provider: &str,
    cooldown: &Cooldown,
    clock: Option<&RequestClock>,
) -> Result<(), Cause> {
    run.wait_for(provider, cooldown)?;
    let now = crate::clock::now();
    let until = now + cooldown.wait;
    let until = run.deadline().map_or(until, |d| until.min(d));
    // The request's own bound does not run while the run waits.
    if let Some(clock) = clock {
        clock.extend(until.saturating_duration_since(now));
    }
    tokio::time::sleep_until(until).await;
    Ok(())
}

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::SystemTime;

use http::{Request, Response};
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};

use super::{Cooldown, RunHandle, RunStopped, StopReason};
use crate::attempt::{Attempt, Departure, ReplayBody, Report, RequestClock};
use crate::classify::Outcome;
use crate::cost::Pricing;
use crate::error::{BoxFuture, Cause};

/// What a run's request would meet at the provider at an instant, when it
/// is source pressure worth waiting out
/// ([`crate::ProviderPolicy::pressure`]).
pub type Pressure = Arc<dyn Fn(Instant) -> Option<Cooldown> + Send + Sync>;

/// Checks the run envelope of each attempt (first or retry) before it
/// starts, and makes a run's request wait out a long `Retry-After` hold
/// (R-RN8), counted per cool-down cycle of this provider. (An outage is
/// waited out by the parking layer, outside this one.)
#[derive(Clone, Default)]
pub struct RunLayer {
    provider: Arc<str>,
    pressure: Option<Pressure>,
    pricing: Option<Pricing>,
}

impl RunLayer {
    /// The gate of `provider`, waiting out what `pressure` reports and
    /// counting each attempt at the units `pricing` gives it (R-FS2).
    pub fn new(provider: &str, pressure: Pressure, pricing: Pricing) -> Self {
        RunLayer {
            provider: provider.into(),
            pressure: Some(pressure),
            pricing: Some(pricing),
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
            provider: self.provider.clone(),
            pressure: self.pressure.clone(),
            pricing: self.pricing.clone(),
        }
    }
}

/// The service of [`RunLayer`].
#[derive(Clone)]
pub struct RunGate<S> {
    inner: S,
    provider: Arc<str>,
    pressure: Option<Pressure>,
    pricing: Option<Pricing>,
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
        let Some(run) = Attempt::of(&req).and_then(|a| a.run.clone()) else {
            return Box::pin(async move { inner.oneshot(req).await.map_err(Into::into) });
        };
        let pressure = self.pressure.clone();
        let provider = self.provider.clone();
        let clock = Attempt::of(&req).and_then(|a| a.clock.clone());
        let units = self
            .pricing
            .as_ref()
            .map_or(1, |price| price(req.method(), req.uri().path()));
        Box::pin(async move {
            let mut req = req;
            {
                // Priced once here; the pacer below waits for as many
                // slots, and no longer than the run may wait.
                let attempt = Attempt::of_mut(&mut req);
                attempt.units = Some(units);
                attempt.deadline = run.deadline();
            }
            loop {
                let now = Instant::now();
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
                if let Some(cooldown) = pressure.as_ref().and_then(|p| p(now)) {
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
fn account<R>(
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
    match Outcome::of_result(&result, SystemTime::now()) {
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
    let now = Instant::now();
    let until = now + cooldown.wait;
    let until = run.deadline().map_or(until, |d| until.min(d));
    // The request's own bound does not run while the run waits.
    if let Some(clock) = clock {
        clock.extend(until.saturating_duration_since(now));
    }
    tokio::time::sleep_until(until).await;
    Ok(())
}

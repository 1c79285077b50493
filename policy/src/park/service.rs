use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use tokio::sync::Notify;
use tokio::time::Instant;
use tower::{Service, ServiceExt};

use super::{HasPark, ProviderDown, Turn, Verdict};
use crate::attempt::{
    clone_request, retryable_method, Attempt, CarriesAttempt, CarriesReport, Departure, ReplayBody,
    RequestClock,
};
use crate::classify::Outcome;
use crate::error::{Cause, UpstreamKind};
use crate::future::{take_readied, LayerFuture, OnAnswer};

/// The service of [`ParkLayer`](super::ParkLayer): parks a provider's
/// requests while it is down, sends its probes, resumes them when it is
/// back.
#[derive(Debug)]
pub struct Park<S, P> {
    pub(super) inner: S,
    pub(super) provider: Arc<str>,
    pub(super) shared: Arc<P>,
}

impl<S: Clone, P> Clone for Park<S, P> {
    fn clone(&self) -> Self {
        Park {
            inner: self.inner.clone(),
            provider: self.provider.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S, P, B, R> Service<Request<B>> for Park<S, P>
where
    P: HasPark,
    S: Service<Request<B>, Response = Response<R>> + Clone + Send + 'static,
    S::Error: Into<Cause>,
    S::Future: Send + 'static,
    B: ReplayBody + Send + 'static,
    R: CarriesReport + Send + 'static,
{
    type Response = Response<R>;
    type Error = Cause;
    type Future = LayerFuture<S::Future, Watched<P>, R>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Cause>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    /// About 100 lines: one loop over a parked request's turns — wait for
    /// a turn while the provider is down, send (or be called back), judge
    /// the answer, park the copy again or return. The steps are named
    /// functions (`wait_turn`, `send_or_call_back`, `park_after_failure`);
    /// what stays is the state carried from turn to turn (the copy, the
    /// probe guard, the departure mark), which would otherwise be threaded
    /// through each.
    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let run = Attempt::of(&req).and_then(|a| a.run.clone());
        let (max_wait, cycle) = self.shared.park_bounds();
        // No run, and parking off or nothing amiss: the request goes at
        // once, with no copy to park (the loop below would do the same, in
        // a box); the answer still tells the watch what the provider is
        // doing.
        let parking = !max_wait.is_zero();
        if run.is_none()
            && !(parking && (self.shared.park().is_down() || self.shared.park().unsettled()))
        {
            let request = request_id(&req);
            let attempt = Attempt::of_mut(&mut req);
            attempt.parked_probe = false;
            attempt.departure = None;
            let then = Watched {
                shared: self.shared.clone(),
                on_the_way: parking.then(|| OnTheWay::new(&self.shared)),
                request,
                sent: crate::clock::now(),
            };
            return LayerFuture::sent(self.inner.call(req), then);
        }
        let inner = take_readied(&mut self.inner);
        let shared = self.shared.clone();
        let provider = self.provider.clone();
        LayerFuture::waits(async move {
            // A run that would refuse the attempt anyway (R-RN3: a budget
            // stop touches no provider state, not even a probe's turn).
            if run
                .as_ref()
                .is_some_and(|r| r.would_refuse(&provider, crate::clock::now()))
            {
                return inner.oneshot(req).await.map_err(Into::into);
            }
            let request = request_id(&req);
            let mut parking = Parking {
                clock: Attempt::of(&req).and_then(|a| a.clock.clone()),
                shared,
                provider,
                run,
                max_wait,
                cycle,
                ticket: None,
                parked_at: None,
            };
            let idempotent = retryable_method(req.method(), &[])
                || parking
                    .shared
                    .settings()
                    .retry_methods
                    .contains(req.method());
            let mut req = req;
            loop {
                let mut probe = false;
                if parking.shared.park().is_down() {
                    probe = parking.wait_turn().await? == Turn::Probe;
                }
                // A copy to park after the attempt, where one may be
                // needed: a run's request always (its collector must see
                // no failure), another only while something is amiss.
                let mut copy =
                    (parking.run.is_some() || probe || parking.shared.park().unsettled())
                        .then(|| clone_request(&req))
                        .flatten();
                let mut guard = probe.then(|| ProbeGuard {
                    shared: parking.shared.clone(),
                    armed: true,
                });
                // Only a request with a copy can be called back: it alone
                // has a departure mark to watch (a mark a retry's copy
                // carried from its last attempt is cleared).
                let departure = copy.is_some().then(Departure::default);
                {
                    let attempt = Attempt::of_mut(&mut req);
                    attempt.parked_probe = probe;
                    attempt.departure = departure.clone();
                }
                let downs = departure.as_ref().map(|_| parking.shared.park().downs());
                let sent = crate::clock::now();
                let sent_off = send_or_call_back(
                    inner.clone(),
                    req,
                    &mut copy,
                    departure,
                    downs.filter(|_| !probe),
                    &parking.shared,
                )
                .await;
                let result = match sent_off {
                    Ok(result) => result,
                    // Called back: `call` is dropped with this turn of the
                    // loop, and its reservations (slot, run attempt) go
                    // back; the copy is parked.
                    Err(c) => {
                        req = c;
                        continue;
                    }
                };
                let outcome = Outcome::of_result_now(&result);
                let shared = &*parking.shared;
                shared
                    .park()
                    .answered(shared, request, outcome, sent, probe);
                if let Some(g) = guard.as_mut() {
                    g.armed = false;
                }
                let refused_open = open_for_failures(&result);
                if refused_open {
                    shared.park().breaker_opened(shared, crate::clock::now());
                }
                let failed = outcome.is_some_and(|o| o.is_breaker_failure()) || refused_open;
                let Some(mut copy) = copy.filter(|_| failed && unprocessed(&result, idempotent))
                else {
                    return result;
                };
                if !parking.park_after_failure().await? {
                    return result;
                }
                // Parked: the failure goes nowhere; the copy waits its turn.
                Attempt::of_mut(&mut copy).parked_probe = false;
                drop(result);
                req = copy;
            }
        })
    }
}

/// An attempt sent at once — nothing amiss, or parking off (proxy users
/// of a provider with `max_outage_wait = 0`): tells the watch what the
/// provider answered.
#[derive(Debug)]
pub struct Watched<P: HasPark> {
    shared: Arc<P>,
    /// Counted on its way while parking is on.
    on_the_way: Option<OnTheWay<P>>,
    request: u64,
    sent: Instant,
}

impl<R: CarriesReport, P: HasPark> OnAnswer<R> for Watched<P> {
    fn on_answer(self, result: Result<Response<R>, Cause>) -> Result<Response<R>, Cause> {
        drop(self.on_the_way);
        let outcome = Outcome::of_result_now(&result);
        let shared = &*self.shared;
        shared
            .park()
            .answered(shared, self.request, outcome, self.sent, false);
        if open_for_failures(&result) {
            shared.park().breaker_opened(shared, crate::clock::now());
        }
        result
    }
}

/// Sends one attempt; `Err` with the copy when it is called back: the
/// provider went down (`downs` changed) while it waited for its slot and
/// it has not left, so it is parked instead of sent (only probes, which
/// watch no `downs`, go to a provider that is down). Dropping the call
/// gives its reservations (slot, run attempt) back.
async fn send_or_call_back<S, B, R, P: HasPark>(
    inner: S,
    req: Request<B>,
    copy: &mut Option<Request<B>>,
    departure: Option<Departure>,
    mut downs: Option<tokio::sync::watch::Receiver<u64>>,
    shared: &Arc<P>,
) -> Result<Result<Response<R>, Cause>, Request<B>>
where
    S: Service<Request<B>, Response = Response<R>>,
    S::Error: Into<Cause>,
{
    let call = inner.oneshot(req);
    tokio::pin!(call);
    let _on_the_way = OnTheWay::new(shared);
    loop {
        tokio::select! {
            r = &mut call => return Ok(r.map_err(Into::into)),
            Some(Ok(())) = async { match downs.as_mut() {
                Some(d) => Some(d.changed().await),
                None => None,
            } }, if downs.is_some() => {
                if departure.as_ref().is_some_and(|d| !d.departed()) {
                    if let Some(c) = copy.take() {
                        return Err(c);
                    }
                }
            }
        }
    }
}

/// Refused by a breaker the provider's failures opened: a sign it is down.
/// One its throttles opened is a provider asking to slow down — alive, and
/// answered as a throttle, not parked as an outage (R-PD3).
fn open_for_failures<R>(result: &Result<Response<R>, Cause>) -> bool {
    matches!(result, Err(Cause::CircuitOpen(open)) if !open.throttled)
}

/// Whether a failed attempt proves the provider did not act on the
/// request, so that sending it again cannot do anything twice: any failure
/// for an idempotent method (RFC 9110 §9.2.2, as retries); for others only
/// an answer that says so — `503`, `429`, no connection made, sluice's own
/// refusal.
fn unprocessed<R>(result: &Result<Response<R>, Cause>, idempotent: bool) -> bool {
    match result {
        Ok(resp) => match resp.status().as_u16() {
            429 | 503 => true,
            408 | 500..=599 => idempotent,
            _ => false,
        },
        Err(Cause::CircuitOpen(_)) => true,
        Err(Cause::AttemptTimeout) => idempotent,
        Err(Cause::Upstream(e)) => match e.kind {
            UpstreamKind::Dns
            | UpstreamKind::ConnectionRefused
            | UpstreamKind::ConnectionTimeout
            | UpstreamKind::TlsCertificate
            | UpstreamKind::TlsProtocol => true,
            // The request may have been read before the connection went.
            UpstreamKind::ConnectionClosed | UpstreamKind::Protocol => idempotent,
            UpstreamKind::Prohibited | UpstreamKind::ClientBody => false,
        },
        Err(_) => false,
    }
}

/// A number naming the client's request, the same for every attempt of
/// it: retries carry the request's clock, which has a number; a request
/// without one gets a number of its own.
fn request_id<B: CarriesAttempt>(req: &Request<B>) -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1 << 63);
    match Attempt::of(req).and_then(|a| a.clock.as_ref()) {
        Some(clock) => clock.id(),
        None => NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
    }
}

/// Counts an attempt as on its way while it lives.
#[derive(Debug)]
struct OnTheWay<P: HasPark>(Arc<P>);

impl<P: HasPark> OnTheWay<P> {
    fn new(shared: &Arc<P>) -> Self {
        shared.park().on_the_way(true);
        OnTheWay(shared.clone())
    }
}

impl<P: HasPark> Drop for OnTheWay<P> {
    fn drop(&mut self) {
        self.0.park().on_the_way(false);
    }
}

/// A probe whose attempt was dropped (its client went away) before it was
/// answered: the next parked request probes instead.
struct ProbeGuard<P: HasPark> {
    shared: Arc<P>,
    armed: bool,
}

impl<P: HasPark> Drop for ProbeGuard<P> {
    fn drop(&mut self) {
        if self.armed {
            let shared = &*self.shared;
            shared
                .park()
                .answered(shared, 0, None, crate::clock::now(), true);
        }
    }
}

/// One request's parking: its place, how long it has waited, and what
/// bounds the wait.
struct Parking<P: HasPark> {
    shared: Arc<P>,
    provider: Arc<str>,
    run: Option<crate::attempt::Run>,
    clock: Option<RequestClock>,
    max_wait: Duration,
    cycle: Duration,
    ticket: Option<u64>,
    /// When it was first parked: a proxy user's patience runs from there,
    /// probes it went as included.
    parked_at: Option<Instant>,
}

/// Leaves the parked when dropped (the request goes on, gives up, or its
/// client went away).
struct Place<P: HasPark> {
    shared: Arc<P>,
    ticket: u64,
    resumed: bool,
    gave_up: bool,
}

impl<P: HasPark> Drop for Place<P> {
    fn drop(&mut self) {
        self.shared
            .park()
            .leave(self.ticket, self.resumed, self.gave_up);
    }
}

/// How a wait ends short of the provider's return.
enum Bound {
    /// Wait on, until this instant at the latest.
    Until(Instant),
    /// Stop waiting and go on: the run's own gate refuses the request
    /// (its deadline passed, or it stopped).
    Go,
}

impl<P: HasPark> Parking<P> {
    fn place(&mut self) -> (Place<P>, Arc<Notify>) {
        let (ticket, notify) = self.shared.park().join(self.ticket);
        self.ticket = Some(ticket);
        let place = Place {
            shared: self.shared.clone(),
            ticket,
            resumed: false,
            gave_up: false,
        };
        (place, notify)
    }

    /// Waits parked until the provider is back or it is this request's
    /// turn to probe.
    async fn wait_turn(&mut self) -> Result<Turn, Cause> {
        let (mut place, notify) = self.place();
        loop {
            let now = crate::clock::now();
            let next = match self.shared.park().poll(now) {
                Turn::Wait(next) => next,
                turn => {
                    place.resumed = true;
                    return Ok(turn);
                }
            };
            let until = match self.bound(now) {
                Ok(Bound::Until(at)) => at,
                Ok(Bound::Go) => return Ok(Turn::Go),
                Err(e) => {
                    place.gave_up = true;
                    return Err(e);
                }
            };
            self.sleep(&notify, next.map_or(until, |n| n.min(until)))
                .await;
        }
    }

    /// A failed attempt whose request may be parked: waits for the verdict
    /// on the failures in progress. `true`: the provider is down, park the
    /// request; `false`: the failure goes back as it is.
    async fn park_after_failure(&mut self) -> Result<bool, Cause> {
        let (mut place, notify) = self.place();
        loop {
            let now = crate::clock::now();
            if self.shared.park().is_down() {
                return Ok(true);
            }
            let due = match self.shared.park().verdict(&*self.shared, now) {
                Verdict::Down => return Ok(true),
                Verdict::Clear => return Ok(false),
                Verdict::Due(at) => at,
            };
            let until = match self.bound(now) {
                Ok(Bound::Until(at)) => at,
                Ok(Bound::Go) => return Ok(false),
                Err(_) => {
                    // Out of patience before any verdict: the provider's
                    // own answer goes back.
                    place.gave_up = true;
                    return Ok(false);
                }
            };
            self.sleep(&notify, due.min(until)).await;
        }
    }

    /// What bounds the wait at `now`: for a run, its deadline and its
    /// cycle guard (each `breaker_open_for` of an outage is one cool-down
    /// cycle, R-RN8); otherwise `max_outage_wait` (R-RN13).
    fn bound(&mut self, now: Instant) -> Result<Bound, Cause> {
        let Some(run) = &self.run else {
            let since = *self.parked_at.get_or_insert(now);
            let waited = now.saturating_duration_since(since);
            if waited >= self.max_wait {
                let (retry_after, reason) = self.shared.park().retry_after(now);
                return Err(Cause::ProviderDown(ProviderDown {
                    waited,
                    retry_after,
                    reason,
                }));
            }
            return Ok(Bound::Until(since + self.max_wait));
        };
        if run.stopped().is_some() {
            return Ok(Bound::Go);
        }
        let deadline = run.deadline();
        if deadline.is_some_and(|d| now >= d) {
            return Ok(Bound::Go);
        }
        let cycle = self.cycle.max(Duration::from_millis(1));
        let mut until = now + cycle;
        if let Some((episode, since)) = self.shared.park().episode() {
            let into = now.saturating_duration_since(since);
            let period = u32::try_from(into.as_nanos() / cycle.as_nanos()).unwrap_or(u32::MAX);
            let ends = since + cycle * period.saturating_add(1);
            run.wait_out_outage(
                &self.provider,
                (episode, period),
                ends.saturating_duration_since(now),
                !self.shared.breaker_closed(),
            )?;
            until = ends;
        }
        Ok(Bound::Until(deadline.map_or(until, |d| until.min(d))))
    }

    /// Sleeps until `until` or a wake-up. A run's wait moves its request's
    /// `request_timeout` on by the time waited (R-RN8: the cycle is waited
    /// out; the client's own clock is its business).
    async fn sleep(&self, notify: &Notify, until: Instant) {
        let start = crate::clock::now();
        let planned = until.saturating_duration_since(start);
        let clock = self.run.as_ref().and(self.clock.as_ref());
        if let Some(c) = clock {
            c.extend(planned);
        }
        tokio::select! {
            () = notify.notified() => {}
            () = tokio::time::sleep_until(until) => {}
        }
        if let Some(c) = clock {
            c.give_back(planned.saturating_sub(crate::clock::elapsed(start)));
        }
    }
}

//! The values that cross layers (issue 33): what a request is, and what
//! its attempt learned.
//!
//! tower's layers know nothing of each other; ours must share a few facts
//! of each request — its price in units, its run, its departure — and of
//! each answer — its time to first byte, its outcome, what the provider
//! charged. Carried as a type per fact, each layer came to import the
//! layer that wrote it (the bulkhead imported the pacer for `Ttfb`, the
//! run gate the pacer for `Charged`). Here they are two values, owned by
//! no layer: every layer reads what it needs from them and imports no
//! other.
//!
//! * [`Attempt`] — what a request is, in its extensions: its clock (the
//!   request timeout), its run and class (set by the proxy), its price in
//!   units and the instant it may not wait past (set by the run gate), its
//!   departure mark (set for each attempt), whether it is a probe of
//!   parked requests, the provider's dialect (set by the bulkhead);
//! * [`Report`] — what one attempt learned, stamped on its response by the
//!   innermost measuring layer (the bulkhead: time to first byte from the
//!   permit, the outcome classified once); the pacer adds the units the
//!   provider said it charged beyond the price.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use http::{Method, Request};

use tokio::time::Instant;

use crate::classify::{Dialect, ErrorBody, Outcome, Resource};
use crate::quota::{Advertised, Malformed};
use crate::run::RunHandle;

/// A request's run, as the layers see it ([`Attempt::run`]).
pub type Run = RunHandle;

/// What a request is, for every layer: in its extensions, one value.
/// A retry's copy carries it (its clock, run and class are the
/// request's); each attempt gets a departure mark of its own.
#[derive(Debug, Clone, Default)]
pub struct Attempt {
    /// The whole request's clock (`request_timeout`), set by the request
    /// timeout layer.
    pub clock: Option<RequestClock>,
    /// The run the request belongs to, if any (set by the proxy).
    pub run: Option<RunHandle>,
    /// Who it is for the fair share (set by the proxy; the default class
    /// if not).
    pub class: Option<Class>,
    /// Its price in units, as the run gate priced it (the pacer prices a
    /// request that has none).
    pub units: Option<u32>,
    /// It may not wait for a slot past this instant (its run's deadline):
    /// the pacer refuses it instead (`Refusal::PastDeadline`).
    pub deadline: Option<Instant>,
    /// This attempt's departure mark.
    pub departure: Option<Departure>,
    /// It is the probe of requests parked through an outage: the breaker
    /// lets it through while open, and its success closes it.
    pub parked_probe: bool,
    /// The provider's dialect, named by the bulkhead for the upstream (it
    /// reads the first bytes of the answers the dialect classifies by
    /// their body). Here rather than an extension of its own: one
    /// allocation less per request, and one less in each retry's copy.
    pub dialect: Option<Dialect>,
}

impl Attempt {
    /// The attempt of `req`, if any layer or the proxy set one.
    pub fn of<B: CarriesAttempt>(req: &http::Request<B>) -> Option<&Attempt> {
        B::attempt(req)
    }

    /// The attempt of `req`, set to the default first if there is none.
    pub fn of_mut<B: CarriesAttempt>(req: &mut http::Request<B>) -> &mut Attempt {
        B::attempt_mut(req)
    }
}

/// Where a request's [`Attempt`] rides: in its extensions, unless its
/// body has a place for it. The proxy's body has one: setting the attempt
/// then allocates nothing, and the retry policy's copy of each request
/// clones no extension map — six allocations a request (issue 38).
pub trait CarriesAttempt: Sized {
    /// The attempt of `req`, if one was set.
    fn attempt(req: &http::Request<Self>) -> Option<&Attempt> {
        req.extensions().get::<Attempt>()
    }

    /// The attempt of `req`, set to the default first if there is none.
    fn attempt_mut(req: &mut http::Request<Self>) -> &mut Attempt {
        req.extensions_mut().get_or_insert_default::<Attempt>()
    }
}

impl CarriesAttempt for () {}

impl CarriesAttempt for String {}

/// What one attempt learned, in its response's extensions.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// From the moment the attempt held its permit (waiting inside sluice
    /// never reads as a slow provider) to the response head.
    pub ttfb: Duration,
    /// The answer, classified once for every layer (`crate::classify`).
    pub outcome: Outcome,
    /// Units the provider said it charged beyond the request's price (its
    /// cost header), for the run's count (R-FS2); 0 if none.
    pub charged: u32,
    /// Whether its headers speak for the budget its request drew on: not
    /// when they speak for another of the provider's budgets (R-PD1,
    /// [`Dialect::speaks_for_another`]), which is not its lane's to pace
    /// by.
    own: bool,
    /// What they advertise, where they advertise anything: boxed, so that
    /// an answer that advertises nothing — and every layer that moves it —
    /// carries 8 bytes, not 168 (R-PF1, issue 38).
    advertised: Option<Box<Advertising>>,
}

/// The quota and the tokens budget an answer's headers advertise.
#[derive(Debug, Clone, PartialEq)]
struct Advertising {
    quota: Result<Option<Advertised>, Malformed>,
    tokens: Option<Advertised>,
}

impl Report {
    /// The quota its headers advertise, read by the provider's dialect
    /// (R-SG1, R-PD2): `None` when they speak for another of the
    /// provider's budgets than the one its request drew on (R-PD1).
    pub fn quota(&self) -> Option<Result<Option<Advertised>, Malformed>> {
        self.own
            .then(|| self.advertised.as_ref().map_or(Ok(None), |a| a.quota))
    }

    /// The tokens budget an LLM provider tells beside the requests one
    /// (R-PD1), likewise read.
    pub fn tokens(&self) -> Option<Advertised> {
        self.advertised.as_ref().and_then(|a| a.tokens)
    }

    /// The report of `resp`, if a measuring layer stamped one.
    pub fn of<R: CarriesReport>(resp: &http::Response<R>) -> Option<&Report> {
        R::report(resp)
    }

    /// The report of `resp`, to add to, if a measuring layer stamped one.
    pub fn of_mut<R: CarriesReport>(resp: &mut http::Response<R>) -> Option<&mut Report> {
        R::report_mut(resp)
    }

    /// Stamps `resp` with its report: `ttfb`, and the outcome classified by
    /// the provider's `dialect` at `now_wall` (a `Retry-After` date needs
    /// it), from its head and the first bytes of its body where the dialect
    /// reads them ([`ErrorBody`], put there by whoever read them); `lane`
    /// is the budget its request drew on, when not the provider's main one.
    pub fn stamp<R: CarriesReport>(
        resp: &mut http::Response<R>,
        ttfb: Duration,
        now_wall: SystemTime,
        dialect: Dialect,
        lane: Option<&Resource>,
    ) -> Outcome {
        let body = resp.extensions().get::<ErrorBody>().map(|b| &b.0[..]);
        let outcome = dialect.classify(resp.status(), resp.headers(), body, now_wall);
        let own = !dialect.speaks_for_another(resp.headers(), lane);
        let advertised = own
            .then(|| Advertising {
                quota: crate::quota::advertised_by(dialect, resp.headers(), now_wall),
                tokens: crate::quota::tokens_by(dialect, resp.headers(), now_wall),
            })
            .filter(|a| {
                !matches!(
                    a,
                    Advertising {
                        quota: Ok(None),
                        tokens: None
                    }
                )
            })
            .map(Box::new);
        let report = Report {
            ttfb,
            outcome,
            charged: 0,
            own,
            advertised,
        };
        R::set_report(resp, report);
        outcome
    }
}

/// Where an attempt's bulkhead permit goes back: the bulkhead's holder
/// (`crate::bulkhead`).
pub trait GivesBack: Send + Sync {
    /// Takes one permit back.
    fn give_back(&self);
}

/// One attempt's bulkhead permit: given back when dropped.
pub struct Permit(Arc<dyn GivesBack>);

impl Permit {
    /// A permit `to` takes back when it is dropped.
    pub(crate) fn new(to: Arc<dyn GivesBack>) -> Self {
        Permit(to)
    }
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Permit")
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.0.give_back();
    }
}

/// An attempt's bulkhead permit, in its answer's extensions where its body
/// has no place for it ([`CarriesReport::hold`]). It is released when the
/// last clone is dropped: move it into the response body to keep the
/// attempt in flight while the body streams.
#[derive(Debug, Clone)]
pub struct InFlight {
    _permit: Arc<Permit>,
}

/// Where an answer's [`Report`] and its attempt's bulkhead permit ride: in
/// its extensions, unless its body has a place for them. The proxy's
/// upstream body has: stamping an answer then allocates nothing (the
/// extension map, its table, the report, the permit and its `Arc` were
/// five allocations an answer), and the permit lives as long as the body
/// (R-BH1).
pub trait CarriesReport: Sized {
    /// The report of `resp`, if one was stamped.
    fn report(resp: &http::Response<Self>) -> Option<&Report> {
        resp.extensions().get::<Report>()
    }

    /// The report of `resp`, to add to.
    fn report_mut(resp: &mut http::Response<Self>) -> Option<&mut Report> {
        resp.extensions_mut().get_mut::<Report>()
    }

    /// Stamps `resp` with `report`.
    fn set_report(resp: &mut http::Response<Self>, report: Report) {
        resp.extensions_mut().insert(report);
    }

    /// Holds the attempt's bulkhead permit with `resp`.
    fn hold(resp: &mut http::Response<Self>, permit: Permit) {
        resp.extensions_mut().insert(InFlight {
            _permit: Arc::new(permit),
        });
    }
}

impl CarriesReport for () {}

impl CarriesReport for String {}

/// One request's clock, shared by its attempts (a retry's copy of the
/// request carries the same clock): when its bound runs out, and how many
/// attempts left for the provider. A run's request waiting out a cool-down
/// moves the bound on by the wait — R-RN8 waits a cycle out; the client's
/// clock is its own business.
///
/// It also holds the bound of the attempt under way, if one told it: the
/// request's one timer wakes the request at the earlier of the two, and
/// the attempt, polled, finds itself past its bound — one timer a
/// request, not one more for each attempt (R-PF1, issue 38; see
/// [`crate::timeout`]).
#[derive(Debug, Clone)]
pub struct RequestClock(Arc<ClockState>);

#[derive(Debug)]
struct ClockState {
    bounds: Mutex<Bounds>,
    attempts: AtomicU32,
    /// A number of its own.
    id: u64,
}

/// When the request's bound runs out, and the attempt's under way.
#[derive(Debug, Clone, Copy)]
struct Bounds {
    request: Instant,
    attempt: Option<Instant>,
}

/// The next clock's number.
static NEXT_CLOCK: AtomicU64 = AtomicU64::new(1);

impl RequestClock {
    /// A clock whose bound runs out at `deadline`.
    pub fn new(deadline: Instant) -> RequestClock {
        RequestClock(Arc::new(ClockState {
            bounds: Mutex::new(Bounds {
                request: deadline,
                attempt: None,
            }),
            attempts: AtomicU32::new(0),
            id: NEXT_CLOCK.fetch_add(1, Ordering::Relaxed),
        }))
    }

    fn bounds(&self) -> std::sync::MutexGuard<'_, Bounds> {
        self.0.bounds.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// When the bound runs out.
    pub fn deadline(&self) -> Instant {
        self.bounds().request
    }

    /// Moves the bound on by `wait` (a run's cool-down wait).
    pub fn extend(&self, wait: Duration) {
        self.bounds().request += wait;
    }

    /// When the request's timer is to wake it: the earlier of the
    /// request's bound and the attempt's under way — and the request's.
    pub(crate) fn wake_at(&self) -> (Instant, Instant) {
        let b = *self.bounds();
        (b.attempt.map_or(b.request, |a| a.min(b.request)), b.request)
    }

    /// An attempt is under way until `bound`: the request's timer wakes
    /// the request then, if it is still waiting.
    pub(crate) fn attempt_until(&self, bound: Instant) {
        self.bounds().attempt = Some(bound);
    }

    /// The attempt under way until `bound` is over (answered, failed, or
    /// past it), or every attempt's bound up to `bound` has passed.
    pub(crate) fn attempt_over(&self, bound: Instant) {
        let mut b = self.bounds();
        if b.attempt.is_some_and(|a| a <= bound) {
            b.attempt = None;
        }
    }

    /// A number naming the request (its retries share the clock).
    pub fn id(&self) -> u64 {
        self.0.id
    }

    /// Takes back part of a move made by [`RequestClock::extend`] that
    /// was not used (the wait ended early).
    pub fn give_back(&self, unused: Duration) {
        let mut b = self.bounds();
        b.request = b.request.checked_sub(unused).unwrap_or(b.request);
    }

    /// An attempt leaves for the provider.
    pub fn attempt(&self) {
        self.0.attempts.fetch_add(1, Ordering::Relaxed);
    }

    /// Attempts that left so far.
    pub fn attempts(&self) -> u32 {
        self.0.attempts.load(Ordering::Relaxed)
    }
}

/// Marks an attempt as gone to the provider. The run layer reserves the
/// attempt before it waits for a pacing slot; the bulkhead marks it when it
/// lets the attempt through to the upstream ([`Departure::leave`]). An
/// attempt dropped before that — its client went away while it waited, or
/// the provider went down meanwhile and the parking layer called it back —
/// never left, and its reservation is given back to the run (an attempt
/// counts only when it leaves for the provider, R-RN2). A run's attempt
/// leaves only once the run's durable reservation covers it (R-RN10).
#[derive(Debug, Clone, Default)]
pub struct Departure(Arc<DepartureState>);

#[derive(Default)]
struct DepartureState {
    departed: AtomicBool,
    /// What the attempt waits for before it leaves: its run's durable
    /// reservation (set by the run gate).
    reserve: OnceLock<Reserve>,
}

impl std::fmt::Debug for DepartureState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DepartureState")
            .field("departed", &self.departed)
            .field("reserve", &self.reserve.get().is_some())
            .finish()
    }
}

/// What an attempt awaits before it leaves (see [`Departure::bind`]).
pub type Reserve = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

impl Departure {
    /// Before it leaves, the attempt awaits `reserve` (its run's durable
    /// reservation, R-RN10). Set once.
    pub fn bind(&self, reserve: Reserve) {
        let _ = self.0.reserve.set(reserve);
    }

    /// The attempt leaves for the provider now: waits, if need be, for
    /// what it is bound to, then marks it.
    pub async fn leave(&self) {
        if let Some(reserve) = self.0.reserve.get() {
            reserve().await;
        }
        self.mark();
    }

    /// Marks the attempt as left, without a reservation (no run).
    pub fn mark(&self) {
        self.0.departed.store(true, Ordering::Release);
    }

    /// Whether the attempt left.
    pub fn departed(&self) -> bool {
        self.0.departed.load(Ordering::Acquire)
    }
}

/// Which lane of its collector a request waits in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Lane {
    /// A steady run's, or a request outside any run.
    #[default]
    Steady,
    /// A catch-up run's.
    Catchup,
}

/// Who a request is for the fair share: its collector (the default class
/// for proxy users without one), the collector's weight and catch-up
/// floor, and its lane.
#[derive(Debug, Clone, PartialEq)]
pub struct Class {
    /// The collector's name; empty for the default class.
    pub name: Arc<str>,
    /// Its weight (> 0).
    pub weight: f64,
    /// The catch-up lane's least share of the collector's admissions while
    /// both lanes wait, in `[0, 1]`.
    pub catchup_floor: f64,
    /// This request's lane.
    pub lane: Lane,
}

/// The catch-up floor when none is set: 10 % of what the collector is
/// admitted.
pub const CATCHUP_FLOOR: f64 = 0.1;

impl Default for Class {
    fn default() -> Self {
        // One empty name for every default class: `Arc::from("")` would
        // allocate per request.
        static DEFAULT_NAME: std::sync::LazyLock<Arc<str>> =
            std::sync::LazyLock::new(|| Arc::from(""));
        Class {
            name: DEFAULT_NAME.clone(),
            weight: 1.0,
            catchup_floor: CATCHUP_FLOOR,
            lane: Lane::Steady,
        }
    }
}

/// A request body that can be copied for a replay. `try_clone` returns
/// `None` for a body that was too large to keep (or is still streaming),
/// and such a request is sent once.
pub trait ReplayBody: CarriesAttempt {
    /// A copy to resend, if one was kept.
    fn try_clone(&self) -> Option<Self>;
}

impl ReplayBody for () {
    fn try_clone(&self) -> Option<Self> {
        Some(())
    }
}

impl ReplayBody for String {
    fn try_clone(&self) -> Option<Self> {
        Some(self.clone())
    }
}

/// Whether requests with this method may be retried: the idempotent
/// methods of RFC 9110 §9.2.2, plus those the config opts in.
pub fn retryable_method(method: &Method, extra: &[Method]) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    ) || extra.contains(method)
}

/// A copy of `req` to send again, if its body was kept.
pub fn clone_request<B: ReplayBody>(req: &Request<B>) -> Option<Request<B>> {
    let body = req.body().try_clone()?;
    let mut copy = Request::new(body);
    *copy.method_mut() = req.method().clone();
    *copy.uri_mut() = req.uri().clone();
    *copy.version_mut() = req.version();
    *copy.headers_mut() = req.headers().clone();
    *copy.extensions_mut() = req.extensions().clone();
    Some(copy)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::Envelope;

    /// R-RN10: an attempt leaves only once the run's durable reservation
    /// covers it, and the reservation grows a block at a time — one unit
    /// for a cap of 20 (a restart charges nothing that did not leave), ten
    /// for a cap of 1,000.
    #[tokio::test(start_paused = true)]
    async fn attempts_leave_within_a_durable_reservation() {
        for (cap, departures, asked) in [
            (20u64, 5u64, vec![1u64, 2, 3, 4, 5]),
            (1000, 25, vec![10, 20, 30]),
        ] {
            let run = RunHandle::new(Envelope {
                request_cap: Some(cap),
                ..Envelope::default()
            });
            let writes: Arc<Mutex<Vec<(u64, Instant)>>> = Arc::default();
            let w = writes.clone();
            run.reserving(
                Arc::new(move |units| {
                    let w = w.clone();
                    Box::pin(async move {
                        // A flush takes 10 ms.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        w.lock().unwrap().push((units, Instant::now()));
                    })
                }),
                0,
            );
            let t0 = Instant::now();
            for _ in 0..departures {
                let d = Departure::default();
                let r = run.clone();
                d.bind(Arc::new(move || {
                    let r = r.clone();
                    Box::pin(async move { r.departing(1).await })
                }));
                d.leave().await;
                assert!(d.departed());
            }
            let writes = writes.lock().unwrap().clone();
            assert_eq!(
                writes.iter().map(|w| w.0).collect::<Vec<_>>(),
                asked,
                "cap {cap}"
            );
            // Each write was waited for by the attempt past it.
            assert_eq!(
                Instant::now() - t0,
                Duration::from_millis(10) * asked.len() as u32
            );
            assert_eq!(run.reserved(), asked.last().copied());
            assert_eq!(run.state().departed, departures);
        }
    }
}

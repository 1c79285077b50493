//! One provider's policy state: everything its stack shares, in one `Arc`
//! — one allocation, its parts inline, not an `Arc` each (R-PF1, issue 38:
//! jemalloc's 896-byte class, not six allocations summing 1,008 bytes).
//! The layers keep the policy and reach their part through it
//! ([`HasPacer`] and the like).
//!
//! The proxy's provider table owns one [`ProviderPolicy`] per provider; the
//! layers of that provider's stack borrow its parts; metrics, the admin API
//! and the store read [`ProviderSnapshot`]. There is no second copy of a
//! rate anywhere.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::breaker::{
    BreakerShared, BreakerSnapshot, CallPermit, HasBreaker, State, TransitionObserver,
};
use crate::bulkhead::{BulkheadShared, HasBulkhead};
use crate::classify::Dialect;
use crate::error::Cause;
use crate::events::{Observer, ObserverSink};
use crate::pacer::{HasPacer, PacerShared, PacerSnapshot};
use crate::park::{HasPark, Neighbours, ParkShared, ParkSnapshot};
use crate::retry::{HasRetry, Jitter, RetryShared};
use crate::run::{Cooldown, Cycle, RunSignals, StopReason};
use crate::settings::{ProviderSettings, ValidSettings};
use crate::timeout::{AttemptBound, RequestBound, SharedDuration};

/// What a provider's policy is built with besides its settings.
#[derive(Default)]
pub struct PolicyOptions {
    /// Where pacing, retry and attempt events and breaker transitions go
    /// (two closures: [`crate::events::Observers`]).
    pub observer: Option<ObserverSink>,
    /// The retry jitter; `None` = random, seeded by the OS.
    pub jitter: Option<Jitter>,
}

impl std::fmt::Debug for PolicyOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyOptions")
            .field("observer", &self.observer.is_some())
            .field("jitter", &self.jitter)
            .finish()
    }
}

/// The shared state of one provider's stack.
#[derive(Debug)]
pub struct ProviderPolicy {
    pub(crate) name: Arc<str>,
    /// GCRA + AIMD + hold + waiting room.
    pub pacer: PacerShared,
    /// The circuit breaker.
    pub breaker: BreakerShared,
    /// The retry budget and settings.
    pub retry: RetryShared,
    /// Permits for attempts in flight.
    pub bulkhead: BulkheadShared,
    /// The outage watch and the requests parked through an outage.
    pub park: ParkShared,
    /// The per-attempt timeout, read on every attempt.
    attempt_timeout: SharedDuration,
    /// The whole request's timeout, read on every request.
    request_timeout: SharedDuration,
}

/// What a provider has learned, in the shape the store keeps (R-PS1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LearnedState {
    /// The learned rate.
    pub rate_rps: f64,
    /// Where throttling began, if it ever did.
    pub limit_rps: Option<f64>,
    /// The time-to-first-byte baseline, once learned.
    pub baseline: Option<Duration>,
    /// The breaker's state.
    pub breaker: State,
    /// Time left open, if open.
    pub open_remaining: Option<Duration>,
    /// How far the allowance's period has got, if one is set and begun.
    pub allowance: Option<crate::pacer::AllowanceUse>,
    /// How the limit is known beyond its number.
    pub known: crate::pacer::LimitKnown,
}

/// Everything observable about a provider, read at one instant.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderSnapshot {
    /// The provider's name.
    pub name: String,
    /// Pacing.
    pub pacer: PacerSnapshot,
    /// The breaker.
    pub breaker: BreakerSnapshot,
    /// Whole retries left in the budget.
    pub retry_budget_left: u32,
    /// Attempts in flight.
    pub in_flight: usize,
    /// Requests waiting for a bulkhead permit.
    pub bulkhead_waiting: usize,
    /// The outage watch and the parked requests.
    pub park: ParkSnapshot,
}

impl ProviderPolicy {
    /// Cold state for a provider.
    pub fn new(
        name: impl Into<Arc<str>>,
        settings: impl Into<Arc<ValidSettings>>,
        options: PolicyOptions,
    ) -> Arc<Self> {
        // Shared, not copied: every provider of the defaults holds the same
        // settings (issue 24: 400 bytes and more of each).
        let settings = settings.into();
        // One observer, kept by the pacer: the breaker and the retry
        // budget reach it, and each other, through the policy.
        let policy = Arc::new(ProviderPolicy {
            name: name.into(),
            attempt_timeout: SharedDuration::new(settings.attempt_timeout),
            request_timeout: SharedDuration::new(settings.request_timeout),
            park: ParkShared::default(),
            pacer: PacerShared::with_observer(&settings, options.observer),
            breaker: BreakerShared::new(&settings),
            retry: RetryShared::new(&settings, options.jitter.unwrap_or_else(Jitter::random)),
            bulkhead: BulkheadShared::new(&settings),
        });
        policy
            .bulkhead
            .set_dialect(policy.dialect_of(&policy.settings()));
        policy
    }

    /// The dialect `settings` name, else the one the provider's name (its
    /// host, for a provider not configured) speaks (R-PD2).
    fn dialect_of(&self, settings: &ProviderSettings) -> Dialect {
        settings
            .dialect
            .unwrap_or_else(|| Dialect::for_host(&self.name))
    }

    /// The provider's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The provider's name, shared: the one copy its table, metrics and
    /// store keep too.
    pub fn shared_name(&self) -> &Arc<str> {
        &self.name
    }

    /// The settings in force: the breaker's copy, the one every part
    /// shares (no second one here: R-PF1, issue 38).
    pub fn settings(&self) -> Arc<ValidSettings> {
        self.breaker.lock().shared_settings().clone()
    }

    /// Applies new settings without losing what was learned (R-OP5).
    pub fn update_settings(self: &Arc<Self>, settings: impl Into<Arc<ValidSettings>>) {
        let settings = settings.into();
        self.pacer.lock().update_settings(&settings);
        self.pacer.notify();
        self.breaker.update_settings(&settings);
        self.retry.update_settings(&settings);
        BulkheadShared::update_settings(self, &settings);
        self.bulkhead.set_dialect(self.dialect_of(&settings));
        self.attempt_timeout.set(settings.attempt_timeout);
        self.request_timeout.set(settings.request_timeout);
    }

    /// What this provider has learned, for the store.
    pub fn learned(&self, now: Instant) -> LearnedState {
        let pacer = self.pacer.snapshot(now);
        let breaker = BreakerShared::snapshot(self, now);
        LearnedState {
            rate_rps: pacer.rate_rps,
            limit_rps: pacer.limit_rps,
            baseline: pacer.baseline_ttfb,
            breaker: breaker.state,
            open_remaining: breaker.open_remaining,
            allowance: self.pacer.lock().allowance_use(now),
            known: pacer.known,
        }
    }

    /// Whether what [`ProviderPolicy::learned`] holds at `now` is what a
    /// provider made anew holds (R-PF1): the start rate, no throttle point,
    /// baseline or allowance begun, the breaker closed. A host that only
    /// ever failed to answer — a refused connect, a broad crawl's dead link
    /// — learned failures in a row, which pass with the windows: a record
    /// of it would restore a cold start.
    pub fn learned_is_cold(&self, now: Instant) -> bool {
        let cold = LearnedState {
            rate_rps: self.settings().start_rate(),
            limit_rps: None,
            baseline: None,
            breaker: State::Closed,
            open_remaining: None,
            allowance: None,
            known: crate::pacer::LimitKnown::default(),
        };
        self.learned(now) == cold
    }

    /// Whether, at `now`, it holds nothing a provider made anew would not
    /// start from (R-PF1, issue 38): its pacer, breaker and outage watch
    /// untaught, nothing in flight or waiting for a permit. Once
    /// [`ProviderPolicy::quiet`] has passed since its last use — its
    /// windows' evidence gone — such a provider can be let go and made
    /// again on its next request, with no difference to that request.
    pub fn learned_nothing(&self, now: Instant) -> bool {
        self.bulkhead.in_flight() == 0
            && self.bulkhead.waiting() == 0
            && self.pacer.lock().untaught(now)
            && self.breaker.lock().untaught()
            && self.park.untaught()
    }

    /// Whether, at `now`, [`ProviderPolicy::learned`] holds all a
    /// provider made again from it would need (R-PF1, issue 38): nothing
    /// in flight, waiting or parked, no hold ahead, no quota or shared
    /// budget followed, no probe of the limit, of a half-open breaker or
    /// of an outage under way. Its windows' evidence — failures in a row
    /// among it — passes with [`ProviderPolicy::quiet`].
    pub fn settled(&self, now: Instant) -> bool {
        self.bulkhead.in_flight() == 0
            && self.bulkhead.waiting() == 0
            && BreakerShared::state(self) != State::HalfOpen
            && self.park.settled()
            && self.pacer.lock().settled(now)
    }

    /// How long after its last use every window's evidence has passed: the
    /// breaker's window, the retry budget's and the controller's.
    pub fn quiet(&self) -> Duration {
        let s = self.settings();
        s.breaker_window
            .max(s.retry_budget_ttl)
            .max(s.increase_window)
    }

    /// Restores learned state (R-PS1): the rate and limit are clamped to
    /// the ceiling; an open breaker stays open for the time it had left —
    /// unless it was learned under another config (`config_changed`): then
    /// it is cleared, with evidence, and whether it was is returned.
    pub fn restore(&self, learned: &LearnedState, config_changed: bool) -> bool {
        {
            let mut pacer = self.pacer.lock();
            pacer.restore(learned.rate_rps, learned.limit_rps, learned.baseline);
            pacer.restore_known(learned.known);
            if let Some(used) = learned.allowance {
                pacer.restore_allowance(Instant::now(), used);
            }
        }
        self.pacer.notify();
        self.breaker
            .lock()
            .restore(learned.breaker, learned.open_remaining, Instant::now());
        if config_changed && self.clear_breaker() {
            return true;
        }
        if learned.breaker != State::Closed {
            // Restored open: down until a probe is answered.
            self.park.breaker_opened(self, Instant::now());
        }
        false
    }

    /// Closes the breaker because the provider's config changed: what
    /// opened it was met under settings no longer in force. Whether it was
    /// not closed.
    pub fn clear_breaker(&self) -> bool {
        BreakerShared::clear(self, Instant::now())
    }

    /// Admits one unit of work the stack cannot see inside — a CONNECT
    /// tunnel sluice does not intercept (R-PX2): the breaker is asked and
    /// one pacing slot is taken. Report how the connection went with
    /// [`TunnelAdmission::connected`].
    pub async fn admit_tunnel(self: &Arc<Self>) -> Result<TunnelAdmission, Cause> {
        let permit = BreakerShared::acquire(self)?;
        // If pacing refuses, the permit is dropped: it counts for nothing.
        self.pacer.acquire().await?;
        Ok(TunnelAdmission { permit })
    }

    /// A readout at `now`.
    pub fn snapshot(&self, now: Instant) -> ProviderSnapshot {
        ProviderSnapshot {
            name: self.name.to_string(),
            pacer: self.pacer.snapshot(now),
            breaker: BreakerShared::snapshot(self, now),
            retry_budget_left: self.retry.budget_left(now),
            in_flight: self.bulkhead.in_flight(),
            bulkhead_waiting: self.bulkhead.waiting(),
            park: self.park.snapshot(now),
        }
    }
}

/// The per-attempt timeout, kept here: the layer reads the policy itself.
impl AttemptBound for ProviderPolicy {
    fn attempt_timeout(&self) -> Duration {
        self.attempt_timeout.get()
    }
}

/// The whole request's timeout, kept here too.
impl RequestBound for ProviderPolicy {
    fn request_timeout(&self) -> Duration {
        self.request_timeout.get()
    }
}

/// What a run's attempt meets here, for the run gate (R-RN8, R-FS2).
impl RunSignals for ProviderPolicy {
    /// A `Retry-After` hold longer than `max_retry_after_wait`, or a
    /// breaker this provider's throttles opened. (An outage — the breaker
    /// open among its signs — is waited out parked, [`crate::park`].)
    fn pressure(&self, now: Instant) -> Option<Cooldown> {
        // A breaker the provider's throttles opened is a hold of its
        // own: a run's request waits it out rather than be answered
        // `429` (R-RN8, R-PD3).
        if self.breaker.opened_for_throttles() {
            let snap = BreakerShared::snapshot(self, now);
            if let Some(left) = snap.open_remaining.filter(|l| !l.is_zero()) {
                return Some(Cooldown {
                    wait: left,
                    reason: StopReason::CircuitOpen,
                    cycle: Cycle::Breaker(self.breaker.cycle()),
                });
            }
        }
        let (hold, cycle) = self.pacer.lock().hold_left(now)?;
        (hold > self.retry.settings().max_retry_after_wait).then_some(Cooldown {
            wait: hold,
            reason: StopReason::RetryAfter,
            cycle: Cycle::Hold(cycle),
        })
    }

    /// The provider's cost table.
    fn price(&self, method: &http::Method, path: &str) -> u32 {
        self.pacer.lock().cost_of(method, path)
    }
}

/// What parking reads of the breaker and the pacer: composed here, so
/// that no layer imports another.
impl Neighbours for ProviderPolicy {
    fn breaker_closed(&self) -> bool {
        BreakerShared::state(self) == State::Closed || self.breaker.opened_for_throttles()
    }

    fn controller_outage(&self) -> bool {
        self.pacer.lock().in_outage()
    }

    fn outage_found(&self, now: Instant) {
        self.pacer.outage_found(now);
    }

    fn settings(&self) -> Arc<ValidSettings> {
        self.breaker.lock().shared_settings().clone()
    }

    fn park_bounds(&self) -> (Duration, Duration) {
        let b = self.breaker.lock();
        let s = b.settings();
        (s.max_outage_wait, s.breaker_open_for)
    }
}

/// The layers' ways to their parts of the policy.
impl HasPacer for ProviderPolicy {
    fn pacer(&self) -> &PacerShared {
        &self.pacer
    }
}

impl HasBreaker for ProviderPolicy {
    fn breaker(&self) -> &BreakerShared {
        &self.breaker
    }

    /// The evidence's retry budget: the provider's.
    fn retry_budget_left(&self, at: Instant) -> Option<u32> {
        Some(self.retry.budget_left(at))
    }

    fn transitions(&self) -> Option<&dyn TransitionObserver> {
        self.pacer.observer().map(|o| o as &dyn TransitionObserver)
    }
}

impl HasRetry for ProviderPolicy {
    fn retry(&self) -> &RetryShared {
        &self.retry
    }

    fn observer(&self) -> Option<&dyn Observer> {
        self.pacer.observer()
    }
}

impl HasBulkhead for ProviderPolicy {
    fn bulkhead(&self) -> &BulkheadShared {
        &self.bulkhead
    }
}

impl HasPark for ProviderPolicy {
    fn park(&self) -> &ParkShared {
        &self.park
    }
}

/// A tunnel let through by [`ProviderPolicy::admit_tunnel`]. Dropping it
/// without a verdict counts for nothing.
#[derive(Debug)]
pub struct TunnelAdmission {
    permit: CallPermit,
}

impl TunnelAdmission {
    /// The tunnel's upstream connection was made (`true`) or failed.
    pub fn connected(self, ok: bool) {
        self.permit.finish(Some(!ok));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::Outcome;

    /// R-PF1: a provider answered as asked has learned nothing a new one
    /// would not start from; one refused has.
    #[tokio::test(start_paused = true)]
    async fn a_provider_learns_nothing_until_something_pushes_back() {
        let settings = ValidSettings::default();
        let p = ProviderPolicy::new("a.test", settings, PolicyOptions::default());
        assert!(p.learned_nothing(Instant::now()), "new");
        assert_eq!(p.quiet(), Duration::from_secs(10), "the defaults' windows");
        let sent = Instant::now();
        tokio::time::advance(Duration::from_millis(80)).await;
        p.pacer.feedback(
            Some(Outcome::Success),
            sent,
            Some(Duration::from_millis(80)),
        );
        assert!(p.learned_nothing(Instant::now()), "answered");
        p.pacer.feedback(
            Some(Outcome::Throttled {
                status: 429,
                retry_after: None,
            }),
            Instant::now(),
            None,
        );
        assert!(!p.learned_nothing(Instant::now()), "refused: a cut");

        let q = ProviderPolicy::new("b.test", ValidSettings::default(), PolicyOptions::default());
        q.breaker
            .lock()
            .restore(State::Open, Some(Duration::from_secs(5)), Instant::now());
        assert!(!q.learned_nothing(Instant::now()), "its breaker open");
    }
}

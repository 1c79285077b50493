//! The breaker's state machine, pure: every method takes `now`.

use std::time::Duration;

use tokio::time::Instant;

use std::sync::Arc;

use super::RECENT_TRANSITIONS;
use crate::clock::Stamp;
use crate::settings::{ProviderSettings, ValidSettings};
use crate::window::Window;

/// Buckets in the sliding window.
const BUCKETS: usize = 10;

/// How long one bucket of the window `settings` give lasts.
fn bucket_len(settings: &ProviderSettings) -> Duration {
    settings.breaker_window / BUCKETS as u32
}

/// Failures in a row that open the breaker once they span half its window,
/// whatever the window's count: an outage at a rate the pacer has cut (or
/// at a provider's low rate) never fills `breaker_min_calls`, and the
/// window's older successes outweigh its failures (R-SG4). Half a window
/// of nothing but failures is not a blip; five of them are not a fluke.
pub const STREAK_MIN_FAILURES: u32 = 5;

/// The standard breaker states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// Calls flow; outcomes are counted.
    Closed,
    /// Calls fail fast until the reset timeout.
    Open,
    /// A bounded number of probes may go; their outcome decides.
    HalfOpen,
}

impl State {
    /// A bounded label for metrics, logs and evidence.
    pub fn label(self) -> &'static str {
        match self {
            State::Closed => "closed",
            State::Open => "open",
            State::HalfOpen => "half_open",
        }
    }

    /// A number for a gauge: 0 closed, 1 half-open, 2 open.
    pub fn gauge(self) -> i64 {
        match self {
            State::Closed => 0,
            State::HalfOpen => 1,
            State::Open => 2,
        }
    }
}

/// Why the breaker changed state: generic, never a URL or a body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Failures and throttles passed the threshold over the window.
    FailureRate,
    /// The open state's reset timeout elapsed.
    ResetTimeout,
    /// Enough half-open probes succeeded.
    ProbesSucceeded,
    /// A half-open probe failed.
    ProbeFailed,
    /// Every call failed for half the window (R-SG4): an outage, however
    /// few calls the rate let through.
    FailureStreak,
    /// The provider's config changed: what opened the breaker was met
    /// under settings no longer in force (a config being debugged), so the
    /// new ones start from a clean window.
    ConfigChanged,
}

impl Reason {
    /// A bounded label.
    pub fn label(self) -> &'static str {
        match self {
            Reason::FailureRate => "failure_rate",
            Reason::ResetTimeout => "reset_timeout",
            Reason::ProbesSucceeded => "probes_succeeded",
            Reason::ProbeFailed => "probe_failed",
            Reason::FailureStreak => "failure_streak",
            Reason::ConfigChanged => "config_changed",
        }
    }
}

/// One state change, as structured evidence (R-CB2). Bounded counters only.
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    /// The state before.
    pub from: State,
    /// The state after.
    pub to: State,
    /// Why.
    pub reason: Reason,
    /// When, on the monotonic clock.
    pub at: Instant,
    /// Milliseconds spent in `from`.
    pub elapsed_ms: u64,
    /// Calls counted in the window (Closed) or probes (HalfOpen).
    pub calls: u32,
    /// Failures among them.
    pub failures: u32,
    /// Retries left in the provider's budget, filled in by the layer.
    pub retry_budget_left: Option<u32>,
}

/// What the breaker lets a call do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permit {
    /// An ordinary call while closed.
    Normal,
    /// A half-open probe.
    Probe,
    /// A probe sent for requests parked through an outage
    /// ([`crate::park`]): let through while open, without waiting for the
    /// reset timeout. Its success closes the breaker at once — the parked
    /// requests resume behind it — and its failure leaves an open breaker
    /// open (a half-open one opens again).
    Parked,
}

/// One slot of time's counts.
#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    calls: u32,
    failures: u32,
    /// Throttles among the failures.
    throttles: u32,
}

/// A readout for metrics, the admin API and the store.
#[derive(Debug, Clone, PartialEq)]
pub struct BreakerSnapshot {
    /// The state.
    pub state: State,
    /// Time in this state.
    pub in_state: Duration,
    /// Calls in the window.
    pub calls: u32,
    /// Failures in the window.
    pub failures: u32,
    /// Time left until half-open, while open.
    pub open_remaining: Option<Duration>,
}

/// The breaker for one provider.
#[derive(Debug)]
pub struct Breaker {
    state: State,
    /// When the current state began.
    since: Stamp,
    /// Origin of the window's slots.
    epoch: Stamp,
    /// The window: the slots that counted answers (a host asked once
    /// keeps one, not an array of `BUCKETS`: R-PF1, issue 38).
    buckets: Window<Bucket, { BUCKETS as u32 }>,
    /// The provider's settings (window, ratio, minimum calls, open time,
    /// probes), shared, not copied: 40 bytes fewer a provider (R-PF1,
    /// issue 38).
    settings: Arc<ValidSettings>,
    /// Probes let through and not yet answered.
    probes_in_flight: u32,
    /// Probes answered with success in this half-open spell.
    probe_successes: u32,
    /// Failures in a row while closed: when the first came, how many, and
    /// how many of them were throttles. Boxed: most providers never fail
    /// twice in a row (R-PF1, issue 38).
    streak: Option<Box<(Stamp, u32, u32)>>,
    /// The last open was for throttles — most of the failures that opened
    /// it were the provider asking to slow down, not failing: its refusals
    /// answer as a throttle, not as an unavailable provider (R-PD3).
    for_throttles: bool,
    /// Times the breaker has opened: names an open period (with the
    /// half-open spell after it), so that many requests waiting out one
    /// period count as one wait (R-RN8).
    opens: u32,
    /// Recent transitions, oldest first, at most [`RECENT_TRANSITIONS`]:
    /// made with the first (most providers never have one, and 32 kept
    /// in advance were 1.5 KB of every tracked provider: issue 24; an
    /// empty vector is 24 bytes of each, a box 8: issue 38).
    #[allow(clippy::box_collection)] // Boxed on purpose: 8 bytes while none.
    recent: Option<Box<Vec<Transition>>>,
}

impl Breaker {
    /// A closed breaker.
    pub fn new(settings: Arc<ValidSettings>, now: Instant) -> Self {
        Breaker {
            state: State::Closed,
            since: now.into(),
            epoch: now.into(),
            buckets: Window::default(),
            settings,
            probes_in_flight: 0,
            probe_successes: 0,
            streak: None,
            for_throttles: false,
            opens: 0,
            recent: None,
        }
    }

    /// Keeps `t` among the recent transitions, the oldest dropped past
    /// [`RECENT_TRANSITIONS`].
    pub fn remember(&mut self, t: Transition) {
        let recent = self.recent.get_or_insert_with(Box::default);
        if recent.len() == RECENT_TRANSITIONS {
            recent.remove(0);
        }
        recent.push(t);
    }

    /// The recent transitions, oldest first.
    pub fn recent(&self) -> &[Transition] {
        self.recent.as_deref().map_or(&[], Vec::as_slice)
    }

    /// Whether it has never opened and has no failures in a row: what a
    /// new breaker is, once its window has passed (R-PF1).
    pub fn untaught(&self) -> bool {
        self.state == State::Closed && self.opens == 0 && self.streak.is_none()
    }

    /// Whether the breaker last opened for throttles (see
    /// [`Breaker::record`]).
    pub fn opened_for_throttles(&self) -> bool {
        self.for_throttles
    }

    /// The open period the breaker is in or last was in: a number that
    /// changes each time it opens.
    pub fn cycle(&self) -> u64 {
        u64::from(self.opens)
    }

    /// Applies new settings (config reload); state and window are kept.
    pub fn update_settings(&mut self, settings: &Arc<ValidSettings>) {
        if bucket_len(settings) != bucket_len(&self.settings) {
            self.forget_window();
        }
        self.settings = settings.clone();
    }

    /// The settings in force.
    pub(crate) fn settings(&self) -> &ProviderSettings {
        &self.settings
    }

    /// The settings in force, to share.
    pub(crate) fn shared_settings(&self) -> &Arc<ValidSettings> {
        &self.settings
    }

    fn open_for(&self) -> Duration {
        self.settings.breaker_open_for
    }

    /// Restores a saved state (R-PS1). An open breaker stays open for the
    /// time it had left.
    pub fn restore(&mut self, state: State, open_remaining: Option<Duration>, now: Instant) {
        if state == State::Open {
            self.opens = self.opens.wrapping_add(1);
        }
        self.state = state;
        self.probes_in_flight = 0;
        self.probe_successes = 0;
        self.since = Stamp::of(match (state, open_remaining) {
            (State::Open, Some(left)) => {
                let left = left.min(self.open_for());
                (now + left).checked_sub(self.open_for()).unwrap_or(now)
            }
            _ => now,
        });
    }

    /// Closes the breaker and forgets its window, because the provider's
    /// config changed: the transition, if it was not closed.
    pub fn clear(&mut self, now: Instant) -> Option<Transition> {
        if self.state == State::Closed {
            self.forget_window();
            self.streak = None;
            return None;
        }
        self.for_throttles = false;
        Some(self.go(State::Closed, Reason::ConfigChanged, now, 0, 0))
    }

    /// The current state (without advancing time).
    pub fn state(&self) -> State {
        self.state
    }

    fn slot(&self, now: Instant) -> u64 {
        let nanos = now.saturating_duration_since(self.epoch.at()).as_nanos();
        (nanos / bucket_len(&self.settings).as_nanos().max(1)) as u64
    }

    fn totals(&self, now: Instant) -> (u32, u32) {
        let (calls, failures, _) = self.totals_with_throttles(now);
        (calls, failures)
    }

    fn totals_with_throttles(&self, now: Instant) -> (u32, u32, u32) {
        self.buckets
            .live(self.slot(now))
            .fold((0, 0, 0), |(c, f, t), b| {
                (c + b.calls, f + b.failures, t + b.throttles)
            })
    }

    /// Empties every bucket (the window starts over).
    fn forget_window(&mut self) {
        self.buckets.clear();
    }

    fn count(&mut self, failure: bool, throttle: bool, now: Instant) {
        // A slot the window has passed (a clock read long before the last
        // count) is not counted.
        if let Some(b) = self.buckets.at(self.slot(now)) {
            b.calls += 1;
            b.failures += u32::from(failure);
            b.throttles += u32::from(failure && throttle);
        }
    }

    fn go(
        &mut self,
        to: State,
        reason: Reason,
        now: Instant,
        calls: u32,
        failures: u32,
    ) -> Transition {
        let t = Transition {
            from: self.state,
            to,
            reason,
            at: now,
            elapsed_ms: u64::try_from(now.saturating_duration_since(self.since.at()).as_millis())
                .unwrap_or(u64::MAX),
            calls,
            failures,
            retry_budget_left: None,
        };
        self.state = to;
        self.since = now.into();
        self.probes_in_flight = 0;
        self.probe_successes = 0;
        self.streak = None;
        if to == State::Open {
            self.opens = self.opens.wrapping_add(1);
        }
        if to == State::Closed {
            self.forget_window();
        }
        t
    }

    /// Moves Open → HalfOpen once the reset timeout has elapsed.
    pub fn tick(&mut self, now: Instant) -> Option<Transition> {
        (self.state == State::Open && now >= self.since.at() + self.open_for())
            .then(|| self.go(State::HalfOpen, Reason::ResetTimeout, now, 0, 0))
    }

    /// Asks to make a call at `now`. `Err` carries the time until half-open
    /// (at least a second while probes are out).
    pub fn try_acquire(&mut self, now: Instant) -> (Result<Permit, Duration>, Option<Transition>) {
        let transition = self.tick(now);
        let permit = match self.state {
            State::Closed => Ok(Permit::Normal),
            State::Open => Err((self.since.at() + self.open_for()).saturating_duration_since(now)),
            State::HalfOpen => {
                if self.probes_in_flight + self.probe_successes
                    < self.settings.breaker_half_open_probes
                {
                    self.probes_in_flight += 1;
                    Ok(Permit::Probe)
                } else {
                    Err(Duration::from_secs(1))
                }
            }
        };
        (permit, transition)
    }

    /// Asks to send the probe of parked requests at `now`: always let
    /// through ([`Permit::Parked`] while open or half-open, an ordinary
    /// call while closed). The parking layer sends one at a time.
    pub fn acquire_parked(&mut self, now: Instant) -> (Permit, Option<Transition>) {
        let transition = self.tick(now);
        let permit = match self.state {
            State::Closed => Permit::Normal,
            State::Open | State::HalfOpen => Permit::Parked,
        };
        (permit, transition)
    }

    /// Records a call's outcome: `failure` is a failure or throttle
    /// (R-CB1), `throttle` whether it was a throttle (the provider asking
    /// to slow down: a breaker opened mostly by throttles says so,
    /// [`Breaker::opened_for_throttles`]). Returns the transition it
    /// caused, if any.
    pub fn record(
        &mut self,
        permit: Permit,
        failure: bool,
        throttle: bool,
        now: Instant,
    ) -> Option<Transition> {
        match (permit, self.state) {
            (Permit::Parked, State::Open | State::HalfOpen) => match (failure, self.state) {
                (false, _) => Some(self.go(State::Closed, Reason::ProbesSucceeded, now, 1, 0)),
                (true, State::HalfOpen) => {
                    self.for_throttles = throttle;
                    Some(self.go(State::Open, Reason::ProbeFailed, now, 1, 1))
                }
                (true, _) => None,
            },
            (Permit::Normal | Permit::Parked, State::Closed) => {
                self.count(failure, throttle, now);
                let (calls, failures, throttles) = self.totals_with_throttles(now);
                if calls >= self.settings.breaker_min_calls
                    && f64::from(failures) >= self.settings.breaker_failure_ratio * f64::from(calls)
                {
                    self.for_throttles = 2 * throttles >= failures;
                    return Some(self.go(State::Open, Reason::FailureRate, now, calls, failures));
                }
                if !failure {
                    self.streak = None;
                    return None;
                }
                let (first, n, th) = &mut **self
                    .streak
                    .get_or_insert_with(|| Box::new((now.into(), 0, 0)));
                *n += 1;
                *th += u32::from(throttle);
                let (first, n, th) = (*first, *n, *th);
                let span = bucket_len(&self.settings) * BUCKETS as u32 / 2;
                (n >= STREAK_MIN_FAILURES && now.saturating_duration_since(first.at()) >= span)
                    .then(|| {
                        self.for_throttles = 2 * th >= n;
                        self.go(State::Open, Reason::FailureStreak, now, n, n)
                    })
            }
            (Permit::Probe, State::HalfOpen) => {
                self.probes_in_flight = self.probes_in_flight.saturating_sub(1);
                let answered = self.probe_successes + 1;
                if failure {
                    self.for_throttles = throttle;
                    Some(self.go(State::Open, Reason::ProbeFailed, now, answered, 1))
                } else {
                    self.probe_successes += 1;
                    (self.probe_successes >= self.settings.breaker_half_open_probes)
                        .then(|| self.go(State::Closed, Reason::ProbesSucceeded, now, answered, 0))
                }
            }
            // A late answer from a previous state says nothing about now.
            _ => None,
        }
    }

    /// A permitted call ended without reaching the provider (refused further
    /// down, or its client went away): it counts for nothing.
    pub fn release(&mut self, permit: Permit) {
        if permit == Permit::Probe && self.state == State::HalfOpen {
            self.probes_in_flight = self.probes_in_flight.saturating_sub(1);
        }
    }

    /// A readout.
    pub fn snapshot(&self, now: Instant) -> BreakerSnapshot {
        let (calls, failures) = self.totals(now);
        BreakerSnapshot {
            state: self.state,
            in_state: now.saturating_duration_since(self.since.at()),
            calls,
            failures,
            open_remaining: (self.state == State::Open)
                .then(|| (self.since.at() + self.open_for()).saturating_duration_since(now)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The window's totals, its buckets kept sparse (issue 38), are the
        /// answers counted in its last `BUCKETS` slots,
        /// as a list of every answer says — across gaps longer than the
        /// window, many in one slot, and clock reads a hair early (another
        /// thread's, read before this one's, within the newest slot).
        #[test]
        fn the_window_counts_its_last_slots(
            steps in proptest::collection::vec((0u64..2_500, any::<bool>(), any::<bool>()), 1..200)
        ) {
            let settings = Arc::new(ProviderSettings::default().validated().unwrap());
            let t0 = Instant::now();
            let mut b = Breaker::new(settings.clone(), t0);
            let len = bucket_len(&settings).as_millis() as u64;
            let mut now = t0;
            let mut seen: Vec<(u64, bool, bool)> = Vec::new();
            for (ms, failure, back) in steps {
                // Mostly forward; now and then a read a little earlier,
                // within the newest slot.
                now = if back {
                    let last = b.buckets.newest().unwrap_or(0);
                    let newest = t0 + Duration::from_millis(last * len);
                    now.checked_sub(Duration::from_millis(ms % len))
                        .unwrap_or(now)
                        .max(newest)
                } else {
                    now + Duration::from_millis(ms)
                };
                let slot = b.slot(now);
                seen.push((slot, failure, failure));
                b.count(failure, failure, now);
                let live = |s: &u64| *s <= slot && slot - *s < BUCKETS as u64;
                let calls = seen.iter().filter(|(s, ..)| live(s)).count() as u32;
                let failures = seen.iter().filter(|(s, f, _)| live(s) && *f).count() as u32;
                prop_assert_eq!(b.totals_with_throttles(now), (calls, failures, failures));
            }
        }
    }
}

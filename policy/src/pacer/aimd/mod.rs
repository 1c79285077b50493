//! Rate-based AIMD: learn how fast a provider lets us go.
//!
//! The rate starts low (R-AI3), grows while a window of saturated, clean
//! answers passes, and is cut multiplicatively when the provider pushes
//! back (R-AI1). It never crosses the owner's ceiling (R-AI2), and no error
//! ever raises it (R-AI4): growth happens only when a clean answer closes a
//! window.
//!
//! **Throttle or noise (R-SG3).** A 429, a 503 with `Retry-After` and a
//! sustained shift of latency are throttles and cut at once. A bare 503 or
//! a timeout is *ambiguous*: real providers answer a few percent of
//! requests that way whatever the load. Such an error cuts only when the
//! errors rise with the rate or are significantly above the provider's
//! learned error baseline ([`ErrorTally`]), and the cut is a trial: if the
//! errors go on at the lower rate about as often as before, the cut bought
//! nothing — the remembered limit is put back and the rate recovers at the
//! next clean window; if they stop, the cut stands, and the provider's next
//! few bare 503s are taken as it means them, like 429s. A cold provider's
//! first such error cuts without setting a limit (one error proves
//! nothing). Other 5xx and connect errors never cut; within the baseline
//! they do not even stop growth. A 404 is a clean answer.
//!
//! **Outage or throttle (R-SG4).** A throttle's failures fall when the rate
//! falls: a token bucket lets the next request through at once, a sliding
//! window within its length. An outage fails everything at any rate. So a
//! run of failures with no clean answer between them (a `Streak`, `outage.rs`) may
//! cut at most [`STREAK_MAX_CUTS`] times; past that the rate is held where
//! it is, and once every answer has gone on failing for
//! [`OUTAGE_PERSIST`] at a rate no cut has changed, the controller calls
//! it an outage: the breaker decides (it opens on a failure streak however
//! low the rate), and the first clean answer after it gives back the rate
//! and the throttle point from before the streak — no limit is learned
//! from an outage. Failures that come back within [`RELAPSE`] of that
//! were the restored rate's: they are judged as a throttle, without a
//! hold on the cuts, so a limiter that only looks like an outage (one
//! that counts its refusals over a long window) is not restored into
//! twice.
//!
//! **Settling.** A throttle costs more than the one 429: with a
//! `Retry-After` hold the provider's whole capacity for the hold is lost.
//! So the controller does not saw-tooth around the limit like plain AIMD.
//! It remembers the rate at which throttling began (`limit`) and:
//!
//! 1. before any throttle, grows by half per window (slow start);
//! 2. after a cut, recovers quickly to a settle point just under `limit`
//!    (95 %), closing half the gap per window;
//! 3. waits there [`PROBE_AFTER`] windows and [`PROBE_AFTER_ADMITTED`]
//!    requests — the second bound keeps a failed probe to one overshoot in
//!    a few hundred requests however slow the provider;
//! 4. probes: the step starts at [`PROBE_STEP`] of `limit` and doubles with
//!    every clean window, so a doubled limit is reached in about six
//!    windows, while a limit that has not moved stops the probe at its
//!    first throttle and the rate drops straight back to the settle point:
//!    one brief overshoot.
//!
//! A probe throttled further out moves the limit to what it proved clean
//! and delivered; a whole clean window at [`PROBE_FOUND`] × the limit drops
//! the limit altogether (slow start again). When the settle point itself
//! is throttled the remembered limit was too high; the new one is the
//! lower of 90 % of the rate and what the provider actually delivered over
//! the last window (the accepted rate of a drained token bucket is its
//! refill rate), never below the plain cut. Where the provider holds
//! after each refusal (`Retry-After`), what was delivered says nothing
//! (the holds thin it), and the step is one rate at a time — slow, as each
//! rate nearer the limit lasts longer before its refusal; the time each
//! rate lasted after a hold tells a token bucket's refill rate instead
//! (`Descent`), and a tight fit is settled under as closely as a sharp
//! limit. A failed probe there costs a hold, so probes wait
//! [`PROBE_HOLD_RATIO`] holds, twice and four times that after probes
//! that found nothing, and dwell: one step a tenth over the settle point
//! ([`PROBE_DWELL`]), held until a bucket that had not moved would have
//! spent its burst — a burst carries a doubling probe's windows past the
//! limit, so only a dwell tells a limit raised a tenth from one. A dwell
//! that passes moves the limit there and the next goes a doubling step
//! further — except after slow start's one refusal on
//! a small burst, whose limit is placed from a window sent at a lower rate
//! and may lie well under the rate met: that probe comes as soon as the
//! gap makes it pay ([`PROBE_GAP_COST`]) and is judged by the rate it went
//! clean at, the limit it finds settled under as closely as a fit's. A
//! fleet's first refusal places its limit at the rate its refused request
//! was sent at; every replica learns what the fleet's refusals and dwells
//! found as the replica the provider answered did (see [`Aimd::adopt`]),
//! and fits the bucket from the fleet's refusals as the shared store
//! counted them ([`Aimd::on_fleet_refusal`]); a rate the fleet held a
//! while, then had refused, is known as closely as a fit, and the wait
//! before a probe counts the fleet's admissions. Only one cut
//! is made per congestion epoch: answers to requests sent before the
//! last cut say nothing new (as TCP's fast recovery ignores losses from the
//! old window).
//!
//! Growth only happens when demand reached the pace (the window's
//! admissions were at least [`SATURATION`] of the rate): a collector that
//! sends one request a minute proves nothing about ten per second, so the
//! rate does not creep up to the ceiling while unused (RFC 7661's reasoning
//! for application-limited TCP).

mod fit;
mod limit;
mod outage;
mod readout;
mod settle;
#[cfg(test)]
mod testing;
mod trial;
mod window;

use super::signals::{
    poisson_below, poisson_tail, Attribution, ErrorTally, LatencyVerdict, LatencyWatch, Maybe,
    NOISE_MAX,
};
use crate::clock::Stamp;
use crate::settings::{ProviderSettings, ValidSettings};
use std::collections::VecDeque;
use std::sync::{Arc, LazyLock};
use std::time::Duration;
use tokio::time::Instant;

use self::fit::{Descent, FIT_TIGHT};
pub use self::limit::{PROBE_DECREASE, PROBE_HELD};
use self::outage::Streak;
pub use self::outage::{OUTAGE_MIN_FAILURES, OUTAGE_PERSIST, RELAPSE, STREAK_MAX_CUTS};
pub use self::readout::{Belief, Condition};
use self::settle::Probe;
pub use self::settle::{
    PROBE_AFTER, PROBE_AFTER_ADMITTED, PROBE_DWELL, PROBE_DWELL_FIRST, PROBE_DWELL_MAX,
    PROBE_FOUND, PROBE_GAP_COST, PROBE_HOLD_RATIO, PROBE_STEP, RECOVER_MIN_STEP, RECOVER_SHARE,
    SETTLE, SETTLE_SHARP, SLOW_START_GROWTH,
};
use self::trial::Trial;
pub use self::trial::{
    TRIAL_EXPECTED_ERRORS, TRIAL_MAX_AGE, TRIAL_MAX_ANSWERS, TRIAL_MIN_ANSWERS, TRIAL_NOISE_ERRORS,
    TRIAL_SIGNIFICANCE,
};
pub use self::window::SATURATION;

/// How a learned limit is known beyond its number, kept across restarts
/// (R-PS1): how long the provider holds after a refusal, and whether the
/// limit is known closely — where the settle point sits under it and how
/// its next refusal is read. Without it a restarted sluice settles under a
/// fitted limit with the plain margin and probes it as if the provider
/// did not hold (measured: 0.94 of the limit after a `kill -9`, against
/// 0.99 before it).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LimitKnown {
    /// The provider's hold after its last refusal (`Retry-After`), if it
    /// holds.
    pub hold: Option<Duration>,
    /// A token bucket's refill rate, fitted or found by a dwell.
    pub fitted: bool,
    /// Its refusals went on through a cut's echo: no burst hides it.
    pub sharp: bool,
    /// Told by bare 503s, and met twice at one place.
    pub steady: bool,
}

/// Why the rate was cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackoffReason {
    /// 429 Too Many Requests.
    Throttled,
    /// 503 with `Retry-After`: the provider named its pressure.
    UnavailableRetryAfter,
    /// A bare 503, significantly above the learned error baseline.
    Unavailable,
    /// The time-to-first-byte distribution shifted above its baseline.
    Latency,
    /// Attempts timed out (sluice's timeout or a 408), above the baseline.
    Timeout,
}

impl BackoffReason {
    /// Every reason, for metrics created at zero.
    pub const ALL: [BackoffReason; 5] = [
        BackoffReason::Throttled,
        BackoffReason::UnavailableRetryAfter,
        BackoffReason::Unavailable,
        BackoffReason::Latency,
        BackoffReason::Timeout,
    ];

    /// A bounded label for metrics and logs.
    pub fn label(self) -> &'static str {
        match self {
            BackoffReason::Throttled => "throttled",
            BackoffReason::UnavailableRetryAfter => "unavailable_retry_after",
            BackoffReason::Unavailable => "unavailable",
            BackoffReason::Latency => "latency",
            BackoffReason::Timeout => "timeout",
        }
    }

    /// Whether the signal may be noise (its cut goes on trial).
    pub fn ambiguous(self) -> bool {
        matches!(self, BackoffReason::Unavailable | BackoffReason::Timeout)
    }
}

/// A cut of the rate, kept for the operator's readout.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// When it happened.
    pub at: Instant,
    /// Why.
    pub reason: BackoffReason,
    /// The rate before.
    pub from_rps: f64,
    /// The rate after.
    pub to_rps: f64,
}

/// What one answer did to the rate.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Change {
    /// The rate grew.
    pub increased: bool,
    /// The rate was cut.
    pub backoff: Option<Backoff>,
}

/// The AIMD controller's state.
#[derive(Debug, Clone)]
pub struct Aimd {
    /// The current rate, requests per second; always in `[floor, ceiling]`.
    rate: f64,
    /// The provider's settings, shared (R-PF1, issue 38: 8 bytes, not
    /// copies of five of them): the owner's ceiling, the floor a cut may
    /// reach, the decrease far below the known limit, how long one window
    /// lasts, and the factor over the time-to-first-byte baseline that is a
    /// latency shift.
    settings: Arc<ValidSettings>,
    /// When the current window began (at its first event).
    window_start: Option<Stamp>,
    /// Admissions in the current window.
    window_admitted: u32,
    /// Clean answers in the current window.
    window_delivered: u32,
    /// Answers of any kind in the current window.
    window_answers: u32,
    /// Shared: every replica's admissions counted over `window_span_ns`
    /// (between the store's answers they were read from; spans that a
    /// hold cut into are left out, their rate is not the provider's).
    window_counted: u32,
    /// See `window_counted`: nanoseconds (a `Duration` exactly, in 8
    /// bytes: R-PF1, issue 38).
    window_span_ns: u64,
    /// Of the window's admissions, this replica's: all of them, unless a
    /// shared budget counts every replica's (then this replica's answers
    /// are its share of what the provider delivered).
    window_here: u32,
    /// The rate was cut during the current window.
    window_cut: bool,
    /// A shared budget made this replica wait during the current window:
    /// its demand saturated the shared pace, whatever share it admitted.
    window_pressed: bool,
    /// Clean answers per second over the last closed window.
    delivered: Maybe,
    /// A probe in progress.
    probe: Option<Box<Probe>>,
    /// Ambiguous errors and their baseline.
    errors: ErrorTally,
    /// Time-to-first-byte and its baseline.
    latency: LatencyWatch,
    /// A cut on ambiguous evidence awaiting its verdict.
    trial: Option<Box<Trial>>,
    /// Recent rate changes (when, the rate before), oldest first: an answer
    /// is evidence about the rate its request was *sent* at.
    changes: Changes,
    /// Failures in a row, if the last answers were failures.
    streak: Option<Box<Streak>>,
    /// The rate is a fleet's, shared through a budget (see `adopt`).
    shared: bool,
    /// The fleet's budget is unreachable and this replica paces at a
    /// fraction of the rate: its windows say nothing of whether the rate
    /// could grow (see `set_alone`).
    alone: bool,
    /// What pushback taught it — a limit and how it is known, holds,
    /// probes' bookkeeping, outages — made at its first use (R-PF1, issue
    /// 38): a provider that only ever met clean answers, as most of a
    /// broad crawl's hosts do, carries none of it (about 330 bytes).
    known: Option<Box<Known>>,
}

/// The part of [`Aimd`]'s state that pushback teaches (see `Aimd::known`):
/// read as its defaults until first written.
#[derive(Debug, Clone)]
struct Known {
    /// The rate at which the provider last throttled us.
    limit: Option<f64>,
    /// `limit` rests on one ambiguous signal only: probe it sooner.
    limit_weak: bool,
    /// In slow start, a first ambiguous error has cut (R-AI1) without
    /// setting a limit, since one error on a cold provider cannot tell a
    /// throttle from noise; later ones wait for evidence.
    cold_error_cut: bool,
    /// Clean, saturated windows spent at or above the settle point.
    plateau: u32,
    /// Requests admitted during those windows.
    plateau_admitted: u64,
    /// When the first of those windows began.
    plateau_since: Option<Stamp>,
    /// A rate to return to at the next clean window (a cut undone).
    recover_to: Maybe,
    /// When the rate was last cut; answers to earlier sends are ignored.
    last_decrease: Option<Stamp>,
    /// A trial confirmed that this provider's bare 503s are throttles
    /// (they stopped when the rate came down), and none found them to be
    /// noise: its next few 503s are taken as it means them, like 429s,
    /// without a trial each; this counts them down, and at zero the next
    /// cut is tried again, so that a wrong verdict cannot stick.
    unavailable_throttles: u8,
    /// When the last outage ended (its rate given back), and when the
    /// clean answer that ended it was sent: failures to requests sent
    /// before that are the outage's last echoes.
    outage_ended: Option<(Stamp, Stamp)>,
    /// Outages seen, for the metrics.
    outages: u64,
    /// When a throttle the provider named (429, 503 with `Retry-After`)
    /// last cut, for the readout.
    named_throttle: Option<Stamp>,
    /// How long the provider held every request off after its last
    /// throttle (`Retry-After`): what a failed probe costs.
    hold_cost: Duration,
    /// Slow start's one refusal placed the limit under the rate it met
    /// (this rate), from what a window sent at a lower rate delivered — or
    /// came before any window was measured — and the limit has not been
    /// met since: it may lie anywhere up to that rate, or beyond. Its first
    /// probe comes as soon as the gap makes it pay (at once where no gap is
    /// known), and is
    /// judged by the rate it went clean at; the limit it moves to is
    /// settled under as closely as a fit's.
    unconfirmed: Option<f64>,
    /// When the provider's last hold (`Retry-After`) ends.
    hold_end: Option<Stamp>,
    /// The limit is a token bucket's refill rate fitted to within
    /// [`FIT_TIGHT`] of itself: known as closely as a sharp one's.
    fitted: bool,
    /// Named refusals to requests sent after the last cut, within its
    /// echo (see `Aimd::fresh_pushback`).
    echo: u32,
    /// The provider's limit is sharp: its refusals went on after a cut
    /// (a window that counts over its length, refusals too) rather than
    /// stopping with the rate, as a token bucket's do. A probe's proven
    /// rate is then the limit's lower bound, with no burst to fool it.
    sharp: bool,
    /// A limit told by bare 503s alone was met twice at the same place: a
    /// probe above it was refused before it got clearly past (see
    /// `limit::held_probe`). Settled under as closely as a sharp one, and
    /// a refusal at the settle point moves it as a named one would.
    steady: bool,
    /// Windows the next probe's dwell lasts (see [`Dwell`](settle::Dwell)).
    dwell_windows: u32,
    /// Probes of a sharp limit held at the same place, in a row (the wait
    /// before the next doubles with each, up to 4×): each costs a window's
    /// refusals.
    probe_backoff: u32,
    /// The last cut, for the readout: made by pushback like the rest of
    /// this (kept here, not in a box of the pacer's own beside the box
    /// its rare parts hang from: 112 bytes fewer a taught host, R-PF1).
    last_backoff: Option<Backoff>,
    /// What probing a known limit keeps — its moves, brackets and
    /// bisections, the descent fitted after holds, a fleet's raise and
    /// refusal read — made at its first use: most taught providers never
    /// probe (R-PF1, issue 38: the taught part fits 208 bytes, not 384).
    probing: Option<Box<Probing>>,
}

/// The part of [`Known`] that probing a known limit keeps (see
/// `Known::probing`): read as its defaults until first written.
#[derive(Debug, Clone, Default)]
struct Probing {
    /// Refusals at the settle point after a hold: how long each rate lasted
    /// from the hold's end to its refusal (see [`Descent`]); shared, the
    /// fleet's, as the store counted them.
    descent: Descent,
    /// The fleet's last refusal read (see [`Aimd::on_fleet_refusal`]).
    fleet_refusal: Option<u64>,
    /// Shared: this replica's last raise (from, to), until the store's
    /// rate shows whether it was taken — a raise the store did not take
    /// (another replica raised within the window) is no cut.
    own_raise: Option<(f64, f64)>,
    /// The limit before a probe last moved it, and when: a throttle at the
    /// new settle point soon after undoes the move.
    moved_from: Option<(f64, Instant)>,
    /// When the settle point itself was last throttled.
    too_high_at: Option<Instant>,
    /// The lowest settle point a steady limit was throttled at: a held
    /// probe moves the limit no higher (see `limit::held_probe`).
    refused_settle: Option<f64>,
    /// A rate a probe was refused at while the limit held there: the limit
    /// lies under it, and the next probe goes no further than halfway to
    /// it (see [`settle::BRACKET_TIGHT`]).
    bracket: Option<f64>,
    /// A bisection's move proved a burst's doing: no more brackets.
    bisect_fooled: bool,
    /// When a bisection last moved the limit.
    bisect_at: Option<Instant>,
}

impl Default for Known {
    fn default() -> Self {
        Known {
            limit: None,
            limit_weak: false,
            cold_error_cut: false,
            plateau: 0,
            plateau_admitted: 0,
            plateau_since: None,
            recover_to: Maybe::NONE,
            last_decrease: None,
            unavailable_throttles: 0,
            outage_ended: None,
            outages: 0,
            named_throttle: None,
            hold_cost: Duration::ZERO,
            unconfirmed: None,
            hold_end: None,
            fitted: false,
            echo: 0,
            sharp: false,
            steady: false,
            dwell_windows: PROBE_DWELL_FIRST,
            probe_backoff: 0,
            last_backoff: None,
            probing: None,
        }
    }
}

/// What pushback teaches, as a provider untaught reads it.
static UNTAUGHT: LazyLock<Known> = LazyLock::new(Known::default);

/// What probing keeps, as a provider that never probed reads it.
static UNPROBED: LazyLock<Probing> = LazyLock::new(Probing::default);

impl Aimd {
    /// What pushback taught it, or the defaults.
    fn k(&self) -> &Known {
        self.known.as_deref().unwrap_or(&UNTAUGHT)
    }

    /// What pushback taught it, made on first write.
    fn k_mut(&mut self) -> &mut Known {
        self.known.get_or_insert_with(Box::default)
    }

    /// The last cut, for the readout.
    pub fn last_backoff(&self) -> Option<&Backoff> {
        self.known.as_ref()?.last_backoff.as_ref()
    }

    /// Remembers `backoff`, the cut an answer just made, for the readout.
    pub fn remember_backoff(&mut self, backoff: Backoff) {
        self.k_mut().last_backoff = Some(backoff);
    }

    /// Sets back what pushback taught, if it taught anything: an untaught
    /// one holds the defaults already, and makes nothing for them.
    fn reset(&mut self, back: impl FnOnce(&mut Known)) {
        if let Some(k) = self.known.as_deref_mut() {
            back(k);
        }
    }

    /// What probing the limit keeps, or the defaults.
    fn kp(&self) -> &Probing {
        self.k().probing.as_deref().unwrap_or(&UNPROBED)
    }

    /// What probing the limit keeps, made on first write.
    fn kp_mut(&mut self) -> &mut Probing {
        self.k_mut().probing.get_or_insert_with(Box::default)
    }

    /// Sets back what probing kept, if it kept anything.
    fn reset_p(&mut self, back: impl FnOnce(&mut Probing)) {
        if let Some(p) = self
            .known
            .as_deref_mut()
            .and_then(|k| k.probing.as_deref_mut())
        {
            back(p);
        }
    }
}

/// Two rates the same but for rounding (one come back through the store).
fn same_rate(a: f64, b: f64) -> bool {
    (a - b).abs() <= b * 1e-9
}

/// The longest a cut's echo is waited out (see `Aimd::fresh_pushback`).
const ECHO_MAX: Duration = Duration::from_secs(2);

/// Rate changes remembered to date answers by their send rate (a few
/// seconds' worth at one change per window).
const CHANGES_KEPT: usize = 16;

/// Recent rate changes (when, the rate before), oldest first, at most
/// [`CHANGES_KEPT`]: made at the first change — a host whose rate never
/// moved (most of a broad crawl's) keeps 8 bytes, not a deque's 32 (R-PF1,
/// issue 38).
#[derive(Debug, Clone, Default)]
// Boxed on purpose: the point is 8 bytes while empty.
#[allow(clippy::box_collection)]
struct Changes(Option<Box<VecDeque<(Stamp, f64)>>>);

/// No change yet.
static NO_CHANGES: VecDeque<(Stamp, f64)> = VecDeque::new();

impl Changes {
    fn deque(&self) -> &VecDeque<(Stamp, f64)> {
        self.0.as_deref().unwrap_or(&NO_CHANGES)
    }

    fn iter(&self) -> std::collections::vec_deque::Iter<'_, (Stamp, f64)> {
        self.deque().iter()
    }

    fn front(&self) -> Option<&(Stamp, f64)> {
        self.deque().front()
    }

    fn back(&self) -> Option<&(Stamp, f64)> {
        self.deque().back()
    }

    fn len(&self) -> usize {
        self.deque().len()
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Remembers a change at `at` from `before`, the oldest forgotten past
    /// [`CHANGES_KEPT`].
    fn push(&mut self, at: Instant, before: f64) {
        let changes = self.0.get_or_insert_with(Box::default);
        if changes.len() == CHANGES_KEPT {
            changes.pop_front();
        } else if changes.len() == changes.capacity() {
            // Grown one change at a time: a broad crawl's host changes rate
            // once or twice, and a first push's room for four was 96 bytes
            // of every one refused (R-PF1, issue 38).
            changes.reserve_exact(1);
        }
        changes.push_back((at.into(), before));
    }
}

impl Aimd {
    /// A controller starting at `start` (clamped into `[floor, ceiling]`),
    /// a latency shift at 3 × the baseline.
    pub fn new(start: f64, floor: f64, ceiling: f64, decrease: f64, window: Duration) -> Self {
        let settings = ProviderSettings {
            start_rps: Some(start.min(ceiling)),
            floor_rps: floor,
            ceiling_rps: ceiling,
            decrease_factor: decrease,
            increase_window: window,
            ..ProviderSettings::default()
        }
        .validated()
        .expect("an AIMD controller's bounds");
        Aimd::with_settings(start, Arc::new(settings))
    }

    /// A controller of a provider's `settings`, starting at `start`
    /// (clamped into `[floor, ceiling]`).
    pub fn with_settings(start: f64, settings: Arc<ValidSettings>) -> Self {
        Aimd {
            rate: start.clamp(
                settings.floor_rate().min(settings.ceiling_rps),
                settings.ceiling_rps,
            ),
            settings,
            window_start: None,
            window_admitted: 0,
            window_pressed: false,
            window_delivered: 0,
            window_here: 0,
            window_answers: 0,
            window_counted: 0,
            window_span_ns: 0,
            window_cut: false,
            delivered: Maybe::NONE,
            probe: None,
            errors: ErrorTally::default(),
            latency: LatencyWatch::default(),
            trial: None,
            changes: Changes::default(),
            streak: None,
            shared: false,
            alone: false,
            known: None,
        }
    }

    /// Whether it has learned nothing a cold controller would not start
    /// from: the rate never moved, no limit or baseline (of latency or of
    /// errors), no outage, throttle or failure streak met, nothing on
    /// trial or probe, no fleet's rate taken (R-PF1).
    pub fn untaught(&self) -> bool {
        self.changes.is_empty()
            && self.k().limit.is_none()
            && self.k().last_decrease.is_none()
            && self.latency.baseline().is_none()
            && !self.errors.established()
            && self.k().outages == 0
            && self.k().named_throttle.is_none()
            && self.k().hold_end.is_none()
            && self.trial.is_none()
            && self.probe.is_none()
            && self.streak.is_none()
            && self.k().unconfirmed.is_none()
            && !self.shared
    }

    /// Whether nothing is under way that its rate, limit and how the
    /// limit is known do not say: no probe, trial or recovery (R-PF1).
    pub fn settled(&self) -> bool {
        self.probe.is_none() && self.trial.is_none() && self.k().recover_to.get().is_none()
    }

    /// The rate that was in force at `sent_at`.
    /// (Scanned from the newest change: almost every answer is to a
    /// request sent after the last one, and stops at the first look.)
    pub(super) fn rate_at(&self, sent_at: Instant) -> f64 {
        let sent_at = Stamp::of(sent_at);
        self.changes
            .iter()
            .rev()
            .take_while(|(at, _)| *at > sent_at)
            .last()
            .map_or(self.rate, |(_, before)| *before)
    }

    /// Sets the rate at `now`, remembering the change.
    fn set_rate(&mut self, now: Instant, rate: f64) {
        if rate != self.rate {
            self.changes.push(now, self.rate);
            self.rate = rate;
        }
    }

    /// The current rate.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// The ceiling.
    pub fn ceiling(&self) -> f64 {
        self.settings.ceiling_rps
    }

    /// The increase window.
    pub fn window(&self) -> Duration {
        self.settings.increase_window
    }

    /// The floor: never above the ceiling.
    pub fn floor(&self) -> f64 {
        self.settings.floor_rate().min(self.settings.ceiling_rps)
    }

    /// The multiplicative decrease far below the known limit.
    fn decrease(&self) -> f64 {
        self.settings.decrease_factor
    }

    /// Time-to-first-byte over its baseline × this is a latency shift.
    fn latency_factor(&self) -> f64 {
        self.settings.soft_throttle_factor
    }

    /// The rate at which throttling last began, if it ever did.
    pub fn limit(&self) -> Option<f64> {
        self.k().limit
    }

    /// The learned share of errors unrelated to load.
    pub fn error_baseline(&self) -> Option<f64> {
        self.errors.baseline()
    }

    /// The learned time-to-first-byte baseline (lower quartile).
    pub fn latency_baseline(&self) -> Option<Duration> {
        self.latency.baseline()
    }

    /// Takes new settings (config reload); the rate is clamped to their
    /// bounds.
    pub fn set_settings(&mut self, settings: &Arc<ValidSettings>) {
        self.settings = settings.clone();
        self.rate = self.rate.clamp(self.floor(), self.ceiling());
    }

    /// The provider's settings.
    pub fn settings(&self) -> &Arc<ValidSettings> {
        &self.settings
    }

    /// Restores a learned rate, limit and latency baseline (clamped to the
    /// bounds, R-AI2).
    pub fn restore(&mut self, rate: f64, limit: Option<f64>, latency: Option<Duration>) {
        if rate.is_finite() && rate > 0.0 {
            self.rate = rate.clamp(self.floor(), self.ceiling());
        }
        match limit.filter(|l| l.is_finite() && *l > 0.0) {
            Some(l) => self.k_mut().limit = Some(l),
            None => self.reset(|k| k.limit = None),
        }
        self.reset(|k| k.fitted = false);
        if let Some(b) = latency {
            self.latency.restore(b);
        }
    }

    /// How the limit is known (see [`LimitKnown`]).
    pub fn known(&self) -> LimitKnown {
        LimitKnown {
            hold: (!self.k().hold_cost.is_zero()).then_some(self.k().hold_cost),
            fitted: self.k().fitted,
            sharp: self.k().sharp,
            steady: self.k().steady,
        }
    }

    /// Restores how the limit is known, after [`Aimd::restore`]: with no
    /// limit restored, nothing is known of it.
    pub fn restore_known(&mut self, known: LimitKnown) {
        if self.k().limit.is_none() {
            return;
        }
        self.k_mut().hold_cost = known.hold.unwrap_or_default();
        self.k_mut().fitted = known.fitted;
        self.k_mut().sharp = known.sharp;
        self.k_mut().steady = known.steady;
    }

    /// Takes the rate a provider advertised (its quota, spent evenly):
    /// the rate becomes it, within the bounds, and AIMD goes on from there —
    /// a cut on the next throttle starts from it. No probe or recovery in
    /// progress survives: the provider said where it stands.
    pub fn follow(&mut self, now: Instant, rate: f64) {
        if !(rate.is_finite() && rate > 0.0) {
            return;
        }
        self.probe = None;
        self.reset(|k| k.recover_to = Maybe::NONE);
        self.set_rate(now, rate.clamp(self.floor(), self.ceiling()));
    }

    /// Takes the rate and throttle point a shared budget holds (R-DS1):
    /// every replica's AIMD goes on from the one rate. A probe in progress
    /// survives a raise (another replica's step of the same probe) but not
    /// a cut.
    pub fn adopt(&mut self, now: Instant, rate: f64, limit: Option<f64>) {
        if !(rate.is_finite() && rate > 0.0) {
            return;
        }
        let rate = rate.clamp(self.floor(), self.ceiling());
        self.shared = true;
        // This replica's own raise, as the store took it or not.
        if let Some((from, to)) = self.kp().own_raise {
            if same_rate(rate, to) || (rate >= from && rate < to) {
                if !same_rate(rate, to) {
                    // Not taken (another replica raised within the window):
                    // the fleet's rate stands, and a probe the raise began
                    // did not begin.
                    if self
                        .probe
                        .as_deref()
                        .copied()
                        .is_some_and(|p| p.windows <= 1)
                    {
                        self.probe = None;
                    }
                } else {
                    self.reset_p(|k| k.own_raise = None);
                }
                self.set_rate(now, rate);
                self.adopt_limit(limit);
                return;
            }
            self.reset_p(|k| k.own_raise = None);
        }
        // The same rate, as it came back through the store: nothing new.
        if !same_rate(rate, self.rate) {
            if rate < self.rate && self.k().limit.is_none() && limit.is_some() {
                // The fleet's slow start refused before a window was
                // measured (its replicas' first requests at once): the
                // limit is a guess, here as at the refused replica, and
                // probed soon (measured: a fleet held 5 req/s on a 20 req/s
                // bucket for half a minute).
                if self.delivered.get().is_none() && !self.k().hold_cost.is_zero() {
                    self.k_mut().unconfirmed = Some(self.rate);
                }
                self.reset_plateau();
                self.reset(|k| k.recover_to = Maybe::NONE);
            } else if rate < self.rate {
                // Another replica's cut: the wait at the settle point
                // starts over here too (a replica that had waited its
                // share would probe again at the next window: measured,
                // the fleet refused every 3 s from its second minute),
                // as long as it would have had this replica been refused.
                self.fleet_refused(now);
                self.reset_plateau();
                self.reset(|k| k.recover_to = Maybe::NONE);
            } else if self
                .probe
                .as_deref()
                .copied()
                .is_some_and(|p| p.dwell.is_some())
            {
                // Another replica passed the dwell this one follows (or
                // leads): passed here too, and the next one followed.
                self.fleet_dwell_passed(now);
            } else if let Some(probe) = self.probe.as_mut() {
                // Another replica's step of the probe: it found a whole
                // window clean at the rate before it, as this one would.
                probe.window_clean(self.rate);
            } else if self.probe.is_none()
                && self.k().limit.is_some_and(|l| rate > l * SETTLE * 1.001)
            {
                // Raised past the settle point: another replica is probing,
                // and a throttle now is that probe's — judged as one. Where
                // the provider holds, it is that replica's dwell, which
                // this one follows (the replica that began it ends it).
                self.probe = Some(Box::new(if self.dwells() {
                    Probe::following(self.rate, now, self.k().dwell_windows)
                } else {
                    Probe::new(self.rate)
                }));
            }
            self.set_rate(now, rate);
        }
        self.adopt_limit(limit);
    }

    /// The throttle point the shared budget holds, if any.
    fn adopt_limit(&mut self, limit: Option<f64>) {
        if let Some(l) = limit.filter(|l| l.is_finite() && *l > 0.0) {
            if self.k().limit.is_none_or(|old| !same_rate(old, l)) {
                if self.k().limit.is_some() {
                    // Placed anew by another replica: slow start's guess is
                    // met, by the fleet — no replica judges the fleet's
                    // probes by a guess only it made (measured: the replica
                    // refused first judged a dwell it followed as its own
                    // clean windows, and moved the limit past the bucket's).
                    self.reset(|k| k.unconfirmed = None);
                }
                // Another replica placed it: known as closely as a fit
                // where this replica's fit of the fleet's refusals (the
                // same points) says as much.
                self.k_mut().fitted = self.kp().descent.limit().is_some_and(|(at, margin)| {
                    margin <= at * FIT_TIGHT && (l - at).abs() <= at * FIT_TIGHT
                });
            }
            self.k_mut().limit = Some(l);
        }
    }

    /// A shared budget holds every replica off for `hold` more: another
    /// replica's refusal held the provider, and a failed probe costs this
    /// replica that hold too (see [`Aimd::on_hold`]). What is left of a
    /// hold is at most its length, so the longer of the two is kept until
    /// this replica's own refusal says the length.
    pub fn on_shared_hold(&mut self, now: Instant, hold: Duration) {
        self.k_mut().hold_cost = self.k().hold_cost.max(hold);
        let end = Stamp::of(now + hold);
        self.k_mut().hold_end = Some(self.k().hold_end.map_or(end, |e| e.max(end)));
    }

    /// The provider's last throttle held every request off for `hold`
    /// (its `Retry-After`): the next probe waits [`PROBE_HOLD_RATIO`] times
    /// that, and dwells. A throttle without a hold sets it back to nothing.
    pub fn on_hold(&mut self, hold: Duration) {
        match hold.is_zero() {
            true => self.reset(|k| k.hold_cost = Duration::ZERO),
            false => self.k_mut().hold_cost = hold,
        }
    }

    fn new_epoch(&self, sent_at: Instant) -> bool {
        self.k().last_decrease.is_none_or(|cut| sent_at >= cut.at())
    }

    /// Whether pushback on a request sent at `sent_at` is news: sent at
    /// least one window after the last cut. A limiter that counts over a
    /// window (a sliding window, one that counts its refusals too) goes
    /// on refusing for up to its length after the rate came down — the
    /// overshoot's echo, not a sign that the cut was too small — and a
    /// drained token bucket refuses the odd request while it refills.
    /// Cutting again on those would take the rate far under the limit
    /// (one cut per round trip, as TCP makes).
    fn fresh_pushback(&self, sent_at: Instant) -> bool {
        self.k()
            .last_decrease
            .is_none_or(|cut| sent_at >= cut.at() + self.window().min(ECHO_MAX))
    }

    /// A clean answer — a success, or a client error such as a 404, which
    /// is the provider working normally — to a request sent at `sent_at`.
    /// It may close the window, and so grow the rate or, on a latency
    /// shift, cut it.
    pub fn on_clean(&mut self, sent_at: Instant, now: Instant, ttfb: Option<Duration>) -> Change {
        self.window_answers = self.window_answers.saturating_add(1);
        self.errors
            .record(false, Attribution::Noise, self.rate_at(sent_at));
        self.window_delivered = self.window_delivered.saturating_add(1);
        if self.new_epoch(sent_at) {
            if let Some(t) = ttfb {
                self.latency.observe(t);
            }
        }
        if self.end_streak(sent_at, now) {
            let mut change = self.close_window(now);
            change.increased = true;
            return change;
        }
        self.trial_answer(sent_at, false, now);
        self.close_window(now)
    }

    /// A server error other than a bare 503 (500, 502, 504…) or a failed
    /// connection: never a cut; counted against the error baseline.
    pub fn on_error(&mut self, sent_at: Instant, now: Instant) {
        self.window_answers = self.window_answers.saturating_add(1);
        if self.outage_echo(sent_at) {
            return;
        }
        self.streak_failure(sent_at, now);
        let kind = if !self.new_epoch(sent_at) {
            Attribution::Throttle
        } else if self.trial.is_none() && self.errors.evidence(self.rate).noise() {
            Attribution::Noise
        } else {
            Attribution::Unknown
        };
        self.errors.record(true, kind, self.rate_at(sent_at));
        self.trial_answer(sent_at, true, now);
    }

    /// The provider pushed back unambiguously (429, 503 with `Retry-After`)
    /// on a request sent at `sent_at`. Returns the cut if one was made (at
    /// most one per congestion epoch). The rate after is never above the
    /// rate before (R-AI4).
    pub fn on_throttle(
        &mut self,
        sent_at: Instant,
        now: Instant,
        reason: BackoffReason,
    ) -> Option<Backoff> {
        self.window_answers = self.window_answers.saturating_add(1);
        self.window_cut = true;
        let fresh = self.fresh_pushback(sent_at);
        self.errors
            .record(true, Attribution::Throttle, self.rate_at(sent_at));
        // The provider is there and says it is pushing back: no outage.
        self.streak = None;
        self.k_mut().named_throttle = Some(now.into());
        if !fresh {
            if self.new_epoch(sent_at) {
                self.k_mut().echo = self.k().echo.saturating_add(1);
            }
            self.extend_hold(now);
            return None;
        }
        // Whatever a trial was weighing, this is pressure.
        self.trial = None;
        self.time_to_refusal(sent_at, now, reason);
        let backoff = self.cut(now, reason, Some(sent_at));
        self.reset(|k| k.limit_weak = false);
        self.extend_hold(now);
        Some(backoff)
    }
}

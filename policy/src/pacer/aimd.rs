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
//! run of failures with no clean answer between them (a [`Streak`]) may
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
//! limit. Only one
//! cut is made per congestion epoch: answers to requests sent before the
//! last cut say nothing new (as TCP's fast recovery ignores losses from the
//! old window).
//!
//! Growth only happens when demand reached the pace (the window's
//! admissions were at least [`SATURATION`] of the rate): a collector that
//! sends one request a minute proves nothing about ten per second, so the
//! rate does not creep up to the ceiling while unused (RFC 7661's reasoning
//! for application-limited TCP).

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use super::signals::{
    poisson_below, poisson_tail, Attribution, ErrorTally, LatencyVerdict, LatencyWatch, NOISE_MAX,
};

/// Settle point as a share of the rate at which throttling began.
pub const SETTLE: f64 = 0.95;
/// Settle point under a sharp limit (see `Aimd::sharp`).
pub const SETTLE_SHARP: f64 = 0.98;
/// Refusals within a cut's echo that make a limit sharp.
const SHARP_ECHO: u32 = 3;
/// Clean, saturated windows at the settle point before probing upward.
pub const PROBE_AFTER: u32 = 8;
/// …and requests admitted there: a failed probe costs about one throttled
/// request, so this bounds its share (≈ 0.3 %) on slow providers too.
pub const PROBE_AFTER_ADMITTED: u64 = 300;
/// First probe step, as a share of the known limit; it doubles with every
/// clean probe window.
pub const PROBE_STEP: f64 = 0.02;
/// A provider that holds every request off for a while after a throttle
/// (`Retry-After`) makes each failed probe cost that whole while: the wait
/// at the settle point is at least this many times the last hold, so that
/// probing costs under 2 % of the time.
pub const PROBE_HOLD_RATIO: f64 = 60.0;
/// A probe throttled before its last clean rate passed this share of the
/// limit found the limit where it was.
pub const PROBE_HELD: f64 = 1.1;
/// A whole clean window at this multiple of the limit proves it moved:
/// the controller forgets it and grows as from a cold start. (A token
/// bucket whose burst is half a second of traffic cannot hide that much.)
pub const PROBE_FOUND: f64 = 1.5;
/// Cut applied to a throttle near the known limit.
pub const PROBE_DECREASE: f64 = 0.9;
/// Growth per window before the first throttle.
pub const SLOW_START_GROWTH: f64 = 0.5;
/// Share of the gap to the settle point closed per window when recovering.
pub const RECOVER_SHARE: f64 = 0.5;
/// Smallest recovery step, as a share of the known limit.
pub const RECOVER_MIN_STEP: f64 = 0.05;
/// Demand must reach this share of the pace for a window to count.
pub const SATURATION: f64 = 0.8;
/// Errors a trial needs at the lower rate to call the cut noise.
pub const TRIAL_NOISE_ERRORS: f64 = 3.0;
/// A trial expects this many errors, at the share seen before the cut,
/// before an absence of errors confirms the cut.
pub const TRIAL_EXPECTED_ERRORS: f64 = 6.0;
/// Bounds on the answers a trial waits for.
pub const TRIAL_MIN_ANSWERS: f64 = 50.0;
/// See [`TRIAL_MIN_ANSWERS`].
pub const TRIAL_MAX_ANSWERS: f64 = 3000.0;
/// A trial's verdicts are made at this significance: it has few errors to
/// go by, and a wrong verdict is corrected by the next trial or probe.
pub const TRIAL_SIGNIFICANCE: f64 = 0.01;
/// A trial still undecided after this long confirms its cut.
pub const TRIAL_MAX_AGE: Duration = Duration::from_secs(30);
/// Cuts a failure streak may make with no clean answer between its
/// failures: enough to leave a throttle's limit (two cuts take the rate
/// under half of where the streak began, and slow start overshoots by at
/// most half), few enough that an outage leaves the rate at half its
/// value, not at the floor where the provider's return would be seen once
/// every ten seconds.
pub const STREAK_MAX_CUTS: u32 = 2;
/// Failures in a row are an outage once they have gone on this long
/// (and for at least two increase windows) since the streak's last cut: a
/// throttle stops failing soon after the rate falls under its limit.
pub const OUTAGE_PERSIST: Duration = Duration::from_secs(2);
/// …and counted at least this many failures.
pub const OUTAGE_MIN_FAILURES: u32 = 10;
/// A failure streak that begins this soon after an outage gave the rate
/// back is that rate's doing: a throttle.
pub const RELAPSE: Duration = Duration::from_secs(5);

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

/// What the controller believes about a provider's failures (R-SG4): the
/// readout and metrics say it, with why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    /// Failures fall with the rate (or the provider said so: 429, 503
    /// with `Retry-After`): the rate is cut and the throttle point kept.
    Throttle,
    /// Every answer fails whatever the rate: the breaker decides, and the
    /// rate from before is given back when the provider answers again.
    Outage,
}

impl Condition {
    /// A bounded label for metrics and the readout.
    pub fn label(self) -> &'static str {
        match self {
            Condition::Throttle => "throttle",
            Condition::Outage => "outage",
        }
    }
}

/// What the controller makes of the provider's recent failures, with the
/// evidence, for the readout.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Belief {
    /// Outage or throttle.
    pub condition: Condition,
    /// Why, as a bounded label.
    pub why: &'static str,
    /// Failures in a row so far (0 for a throttle the provider named).
    pub failures: u32,
    /// Since when.
    pub since: Instant,
}

/// Failures in a row: no clean answer to a request sent since the first
/// of them.
#[derive(Debug, Clone, Copy)]
struct Streak {
    /// When the first failure's request was sent: a clean answer to a
    /// request sent earlier says nothing about now.
    first_sent: Instant,
    /// When the first failure came back.
    began: Instant,
    /// Failures counted.
    failures: u32,
    /// The rate, throttle point and its weakness before the streak's
    /// first cut: what an outage gives back.
    rate_before: f64,
    /// See `rate_before`.
    limit_before: Option<f64>,
    /// See `rate_before`.
    weak_before: bool,
    /// Cuts made during the streak.
    cuts: u32,
    /// The streak's last cut, or its beginning.
    last_cut: Instant,
    /// It began within [`RELAPSE`] of an outage's end: a throttle.
    relapse: bool,
    /// It was found to be an outage, at this instant.
    outage_at: Option<Instant>,
}

/// A cut made on ambiguous evidence, waiting for its verdict.
#[derive(Debug, Clone, Copy)]
struct Trial {
    /// The rate before the cut.
    from: f64,
    /// The remembered limit before the cut.
    prev_limit: Option<f64>,
    /// That limit rested on ambiguous evidence only.
    prev_weak: bool,
    /// When the cut was made; answers to earlier sends are not evidence.
    cut_at: Instant,
    /// The error share before the cut.
    pre_share: f64,
    /// `pre_share` was measured at the rate cut from (enough answers
    /// there); only then can the errors after be judged the same.
    pre_measured: bool,
    /// The error baseline (noise) when the cut was made, 0 if none.
    base_share: f64,
    /// Answers to requests sent since the cut.
    answers: f64,
    /// Ambiguous errors among them.
    errors: f64,
}

/// What a trial concluded.
enum Verdict {
    /// Not yet.
    Open,
    /// The errors stopped at the lower rate: the cut stands.
    Confirmed,
    /// The errors went on as before: the cut is undone.
    Noise,
    /// The errors fell with the rate but go on: the cut was right and not
    /// enough; cut again, judging the next cut against this share.
    StillThrottled(f64),
}

impl Trial {
    fn answers_needed(&self) -> f64 {
        (TRIAL_EXPECTED_ERRORS / self.pre_share.max(1e-9))
            .clamp(TRIAL_MIN_ANSWERS, TRIAL_MAX_ANSWERS)
    }

    /// The verdict after an answer; `error`: that answer was an error.
    fn verdict(&self, now: Instant, error: bool) -> Verdict {
        let share = self.errors / self.answers.max(1.0);
        if error && self.errors >= 2.0 {
            // More errors than noise can be, significantly more than before
            // the cut (the provider throttles harder), or significantly
            // fewer (the rate matters): either way it still pushes back.
            let expected = self.pre_share * self.answers;
            if poisson_tail(self.errors, NOISE_MAX * self.answers) < TRIAL_SIGNIFICANCE
                || poisson_tail(self.errors, expected) < TRIAL_SIGNIFICANCE
                || poisson_below(self.errors, expected) < TRIAL_SIGNIFICANCE
            {
                return Verdict::StillThrottled(share);
            }
            if self.errors >= TRIAL_NOISE_ERRORS && share <= NOISE_MAX {
                // Without a share measured at the old rate, errors going on
                // at the lower one are pressure, not proven noise.
                return if self.pre_measured {
                    Verdict::Noise
                } else {
                    Verdict::StillThrottled(share)
                };
            }
        }
        if self.answers >= self.answers_needed()
            || now.saturating_duration_since(self.cut_at) >= TRIAL_MAX_AGE
        {
            // The errors stopped (none beyond the baseline's): the cut
            // stands. Errors that went on, neither noise nor stopped: still
            // throttled.
            let quiet = self.errors <= 1.0
                || poisson_tail(self.errors, self.base_share * self.answers) >= TRIAL_SIGNIFICANCE;
            return if quiet {
                Verdict::Confirmed
            } else {
                Verdict::StillThrottled(share)
            };
        }
        Verdict::Open
    }
}

/// A probe above the settle point.
#[derive(Debug, Clone, Copy)]
struct Probe {
    /// Clean windows probed so far (the step is `PROBE_STEP · 2^k`).
    windows: u32,
    /// The highest rate a whole window went clean at.
    clean_rate: f64,
    /// The highest rate proven clean: a whole window went clean at it, and
    /// so did the next window, at a higher rate. (A provider's burst
    /// allowance can carry one window past its limit; the next one spends
    /// what the first left.) What a throttle the provider named is judged
    /// against; a bare 503 says less, and is judged as before against
    /// `clean_rate`.
    proven: f64,
}

impl Probe {
    fn new(rate: f64) -> Self {
        Probe {
            windows: 1,
            clean_rate: rate,
            proven: rate,
        }
    }

    /// What the probe found clean, judged by a throttle for `reason`.
    fn clean(&self, reason: BackoffReason) -> f64 {
        if reason.ambiguous() {
            self.clean_rate
        } else {
            self.proven
        }
    }
}

/// Refusals a [`Descent`] fits, the most recent.
const DESCENT_POINTS: usize = 4;
/// A refusal older than this was another limit's.
const DESCENT_MAX_AGE: Duration = Duration::from_secs(120);
/// The fitted points must lie this far apart in time, as a share of the
/// shortest, to tell a slope from noise.
const DESCENT_SPREAD: f64 = 0.25;
/// A fit whose bound lies within this share of its rate sets the limit
/// as closely as a sharp limit's: settled at [`SETTLE_SHARP`] of the bound,
/// the rate is under the bucket's.
const FIT_TIGHT: f64 = 0.02;

/// Where a token bucket's refill rate lies, read from how long each rate
/// lasted after a hold before it was refused (R-SG5).
///
/// A hold (`Retry-After`) lets the provider's bucket fill. Sent at a rate
/// `r` from the hold's end, its burst `B` lasts `t = B / (r − L)`: the
/// requests it let through, `r·t = B + L·t`, grow with `t` at exactly the
/// refill rate `L`. Two refusals at different rates give that slope, where
/// the plain descent — one step per refusal, each refusal later than the
/// one before as the rate nears `L` — takes half a minute to close in.
/// Each point is known to about a request (the refusal fell between two
/// sends), so the fit is read with that error on the high side: a noisy
/// fit leaves the plain descent to do the rest, and never puts the limit
/// under the provider's. A windowed quota fits no slope (every window
/// lets the same count through, whatever the rate) and is left alone.
#[derive(Debug, Clone, Default)]
struct Descent {
    /// When refused; seconds from the hold's end to the refused send;
    /// requests sent in them.
    points: VecDeque<(Instant, f64, f64)>,
}

impl Descent {
    fn push(&mut self, at: Instant, secs: f64, sent: f64) {
        self.points
            .retain(|(t, _, _)| at.saturating_duration_since(*t) < DESCENT_MAX_AGE);
        if self.points.len() == DESCENT_POINTS {
            self.points.pop_front();
        }
        self.points.push_back((at, secs, sent));
    }

    fn clear(&mut self) {
        self.points.clear();
    }

    /// The highest refill rate the points allow, if they tell one (at
    /// least two, far enough apart, with a burst and a rate both
    /// positive), and how far above the fitted rate that bound lies.
    fn limit(&self) -> Option<(f64, f64)> {
        let n = self.points.len() as f64;
        if n < 2.0 {
            return None;
        }
        let xs = self.points.iter().map(|p| p.1);
        let (lo, hi) = xs.fold((f64::INFINITY, 0.0f64), |(lo, hi), x| {
            (lo.min(x), hi.max(x))
        });
        if hi - lo < lo * DESCENT_SPREAD {
            return None;
        }
        let mx = self.points.iter().map(|p| p.1).sum::<f64>() / n;
        let my = self.points.iter().map(|p| p.2).sum::<f64>() / n;
        let sxx: f64 = self.points.iter().map(|p| (p.1 - mx).powi(2)).sum();
        let sxy: f64 = self.points.iter().map(|p| (p.1 - mx) * (p.2 - my)).sum();
        let slope = sxy / sxx;
        let burst = my - slope * mx;
        let margin = 2.0 / (hi - lo);
        (slope > 0.0 && burst > 0.0).then_some((slope + margin, margin))
    }
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
    /// The owner's ceiling.
    ceiling: f64,
    /// The lowest rate a cut may reach.
    floor: f64,
    /// Multiplicative decrease far below the known limit.
    decrease: f64,
    /// How long one window lasts.
    window: Duration,
    /// Time-to-first-byte over its baseline × this is a latency shift.
    latency_factor: f64,
    /// The rate at which the provider last throttled us.
    limit: Option<f64>,
    /// `limit` rests on one ambiguous signal only: probe it sooner.
    limit_weak: bool,
    /// In slow start, a first ambiguous error has cut (R-AI1) without
    /// setting a limit, since one error on a cold provider cannot tell a
    /// throttle from noise; later ones wait for evidence.
    cold_error_cut: bool,
    /// When the current window began (at its first event).
    window_start: Option<Instant>,
    /// Admissions in the current window.
    window_admitted: u32,
    /// Clean answers in the current window.
    window_delivered: u32,
    /// Answers of any kind in the current window.
    window_answers: u32,
    /// Shared: every replica's admissions counted over `window_span`
    /// (between the store's answers they were read from; spans that a
    /// hold cut into are left out, their rate is not the provider's).
    window_counted: u32,
    /// See `window_counted`.
    window_span: Duration,
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
    delivered: Option<f64>,
    /// Clean, saturated windows spent at or above the settle point.
    plateau: u32,
    /// Requests admitted during those windows.
    plateau_admitted: u64,
    /// A probe in progress.
    probe: Option<Probe>,
    /// A rate to return to at the next clean window (a cut undone).
    recover_to: Option<f64>,
    /// When the rate was last cut; answers to earlier sends are ignored.
    last_decrease: Option<Instant>,
    /// Ambiguous errors and their baseline.
    errors: ErrorTally,
    /// Time-to-first-byte and its baseline.
    latency: LatencyWatch,
    /// A cut on ambiguous evidence awaiting its verdict.
    trial: Option<Trial>,
    /// A trial confirmed that this provider's bare 503s are throttles
    /// (they stopped when the rate came down), and none found them to be
    /// noise: its next few 503s are taken as it means them, like 429s,
    /// without a trial each; this counts them down, and at zero the next
    /// cut is tried again, so that a wrong verdict cannot stick.
    unavailable_throttles: u8,
    /// Recent rate changes (when, the rate before), oldest first: an answer
    /// is evidence about the rate its request was *sent* at.
    changes: VecDeque<(Instant, f64)>,
    /// Failures in a row, if the last answers were failures.
    streak: Option<Streak>,
    /// When the last outage ended (its rate given back), and when the
    /// clean answer that ended it was sent: failures to requests sent
    /// before that are the outage's last echoes.
    outage_ended: Option<(Instant, Instant)>,
    /// Outages seen, for the metrics.
    outages: u64,
    /// When a throttle the provider named (429, 503 with `Retry-After`)
    /// last cut, for the readout.
    named_throttle: Option<Instant>,
    /// How long the provider held every request off after its last
    /// throttle (`Retry-After`): what a failed probe costs.
    hold_cost: Duration,
    /// When the provider's last hold (`Retry-After`) ends.
    hold_end: Option<Instant>,
    /// Refusals at the settle point after a hold: how long each rate lasted
    /// from the hold's end to its refusal (see [`Descent`]).
    descent: Descent,
    /// The limit is a token bucket's refill rate fitted to within
    /// [`FIT_TIGHT`] of itself: known as closely as a sharp one's.
    fitted: bool,
    /// The rate is a fleet's, shared through a budget (see `adopt`).
    shared: bool,
    /// The limit before a probe last moved it, and when: a throttle at the
    /// new settle point soon after undoes the move.
    moved_from: Option<(f64, Instant)>,
    /// When the settle point itself was last throttled.
    too_high_at: Option<Instant>,
    /// Named refusals to requests sent after the last cut, within its
    /// echo (see `Aimd::fresh_pushback`).
    echo: u32,
    /// The provider's limit is sharp: its refusals went on after a cut
    /// (a window that counts over its length, refusals too) rather than
    /// stopping with the rate, as a token bucket's do. A probe's proven
    /// rate is then the limit's lower bound, with no burst to fool it.
    sharp: bool,
    /// Probes of a sharp limit held at the same place, in a row (the wait
    /// before the next doubles with each, up to 4×): each costs a window's
    /// refusals.
    probe_backoff: u32,
}

/// Bare-503 cuts taken without a trial after one confirmed them.
const TRUSTED_THROTTLES: u8 = 4;

/// The longest a cut's echo is waited out (see `Aimd::fresh_pushback`).
const ECHO_MAX: Duration = Duration::from_secs(2);

/// Clean answers a window needs to measure what the provider delivered.
const DELIVERED_MIN_ANSWERS: u32 = 10;

/// Rate changes remembered to date answers by their send rate (a few
/// seconds' worth at one change per window).
const CHANGES_KEPT: usize = 16;

impl Aimd {
    /// A controller starting at `start` (clamped into `[floor, ceiling]`).
    pub fn new(start: f64, floor: f64, ceiling: f64, decrease: f64, window: Duration) -> Self {
        let floor = floor.min(ceiling);
        Aimd {
            rate: start.clamp(floor, ceiling),
            ceiling,
            floor,
            decrease,
            window,
            latency_factor: 3.0,
            limit: None,
            limit_weak: false,
            cold_error_cut: false,
            window_start: None,
            window_admitted: 0,
            window_pressed: false,
            window_delivered: 0,
            window_here: 0,
            window_answers: 0,
            window_counted: 0,
            window_span: Duration::ZERO,
            window_cut: false,
            delivered: None,
            plateau: 0,
            plateau_admitted: 0,
            probe: None,
            recover_to: None,
            last_decrease: None,
            errors: ErrorTally::default(),
            latency: LatencyWatch::default(),
            trial: None,
            changes: VecDeque::new(),
            unavailable_throttles: 0,
            streak: None,
            outage_ended: None,
            outages: 0,
            named_throttle: None,
            hold_cost: Duration::ZERO,
            hold_end: None,
            descent: Descent::default(),
            fitted: false,
            shared: false,
            moved_from: None,
            too_high_at: None,
            echo: 0,
            sharp: false,
            probe_backoff: 0,
        }
    }

    /// The rate that was in force at `sent_at`.
    /// (Scanned from the newest change: almost every answer is to a
    /// request sent after the last one, and stops at the first look.)
    fn rate_at(&self, sent_at: Instant) -> f64 {
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
            if self.changes.len() == CHANGES_KEPT {
                self.changes.pop_front();
            }
            self.changes.push_back((now, self.rate));
            self.rate = rate;
        }
    }

    /// The current rate.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// The ceiling.
    pub fn ceiling(&self) -> f64 {
        self.ceiling
    }

    /// The increase window.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// The floor.
    pub fn floor(&self) -> f64 {
        self.floor
    }

    /// The rate at which throttling last began, if it ever did.
    pub fn limit(&self) -> Option<f64> {
        self.limit
    }

    /// The learned share of errors unrelated to load.
    pub fn error_baseline(&self) -> Option<f64> {
        self.errors.baseline()
    }

    /// The learned time-to-first-byte baseline (lower quartile).
    pub fn latency_baseline(&self) -> Option<Duration> {
        self.latency.baseline()
    }

    /// Whether a cut on ambiguous evidence awaits its verdict.
    pub fn in_trial(&self) -> bool {
        self.trial.is_some()
    }

    /// Outages seen since start.
    pub fn outages(&self) -> u64 {
        self.outages
    }

    /// Whether the controller believes the provider is down.
    pub fn in_outage(&self) -> bool {
        self.streak.is_some_and(|s| s.outage_at.is_some())
    }

    /// The outage watch ([`crate::park`]) found the provider down before
    /// this controller did: the streak of failures in progress is an
    /// outage, judged at `now` — the rate is held, no trial or probe
    /// survives it, and its first clean answer gives back the rate and
    /// throttle point from before it (R-SG4). Returns whether this made
    /// it one (not when there is no streak, or it already is one, or the
    /// failures are a relapse judged as a throttle).
    pub fn declare_outage(&mut self, now: Instant) -> bool {
        let Some(streak) = self.streak.as_mut() else {
            return false;
        };
        if streak.outage_at.is_some() || streak.relapse {
            return false;
        }
        streak.outage_at = Some(now);
        self.outages += 1;
        self.trial = None;
        self.recover_to = None;
        self.reset_plateau();
        true
    }

    /// What the controller makes of the recent failures at `now`, if
    /// anything: an outage while one is believed; a throttle while a
    /// streak of failures is being cut on, a cut awaits its trial, or a
    /// throttle the provider named is less than [`TRIAL_MAX_AGE`] old.
    pub fn belief(&self, now: Instant) -> Option<Belief> {
        if let Some(s) = self.streak {
            if let Some(at) = s.outage_at {
                return Some(Belief {
                    condition: Condition::Outage,
                    why: if s.cuts > 0 {
                        "failures_went_on_at_a_lower_rate"
                    } else {
                        "every_answer_failed"
                    },
                    failures: s.failures,
                    since: at,
                });
            }
            if s.cuts > 0 {
                return Some(Belief {
                    condition: Condition::Throttle,
                    why: if s.relapse {
                        "failures_came_back_with_the_rate"
                    } else {
                        "failures_in_a_row_cut_on_trial"
                    },
                    failures: s.failures,
                    since: s.began,
                });
            }
        }
        if let Some(t) = self.trial {
            return Some(Belief {
                condition: Condition::Throttle,
                why: "errors_above_noise_cut_on_trial",
                failures: 0,
                since: t.cut_at,
            });
        }
        self.named_throttle
            .filter(|at| now.saturating_duration_since(*at) < TRIAL_MAX_AGE)
            .map(|at| Belief {
                condition: Condition::Throttle,
                why: "provider_named_it",
                failures: 0,
                since: at,
            })
    }

    /// Changes the bounds (config reload); the rate is clamped to them.
    pub fn set_bounds(&mut self, floor: f64, ceiling: f64, decrease: f64, window: Duration) {
        self.ceiling = ceiling;
        self.floor = floor.min(ceiling);
        self.decrease = decrease;
        self.window = window;
        self.rate = self.rate.clamp(self.floor, self.ceiling);
    }

    /// Sets the latency-shift factor.
    pub fn set_latency_factor(&mut self, factor: f64) {
        self.latency_factor = factor;
    }

    /// Restores a learned rate, limit and latency baseline (clamped to the
    /// bounds, R-AI2).
    pub fn restore(&mut self, rate: f64, limit: Option<f64>, latency: Option<Duration>) {
        if rate.is_finite() && rate > 0.0 {
            self.rate = rate.clamp(self.floor, self.ceiling);
        }
        self.limit = limit.filter(|l| l.is_finite() && *l > 0.0);
        self.fitted = false;
        if let Some(b) = latency {
            self.latency.restore(b);
        }
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
        self.recover_to = None;
        self.set_rate(now, rate.clamp(self.floor, self.ceiling));
    }

    /// Takes the rate and throttle point a shared budget holds (R-DS1):
    /// every replica's AIMD goes on from the one rate. A probe in progress
    /// survives a raise (another replica's step of the same probe) but not
    /// a cut.
    pub fn adopt(&mut self, now: Instant, rate: f64, limit: Option<f64>) {
        if !(rate.is_finite() && rate > 0.0) {
            return;
        }
        let rate = rate.clamp(self.floor, self.ceiling);
        // One replica's view of the fleet's refusals fits no bucket: the
        // shared hold's end and the fleet's rate are not its own.
        self.shared = true;
        self.fitted = false;
        self.descent.clear();
        // The same rate, as it came back through the store: nothing new.
        if (rate - self.rate).abs() > self.rate * 1e-9 {
            if rate < self.rate {
                self.probe = None;
                self.recover_to = None;
            } else if self.probe.is_none() && self.limit.is_some_and(|l| rate > l * SETTLE * 1.001)
            {
                // Raised past the settle point: another replica is probing,
                // and a throttle now is that probe's — judged as one.
                self.probe = Some(Probe::new(self.rate));
            }
            self.set_rate(now, rate);
        }
        if let Some(l) = limit.filter(|l| l.is_finite() && *l > 0.0) {
            self.limit = Some(l);
        }
    }

    /// The provider's last throttle held every request off for `hold`
    /// (its `Retry-After`): the next probe waits [`PROBE_HOLD_RATIO`] times
    /// that. A throttle without a hold sets it back to nothing.
    pub fn on_hold(&mut self, hold: Duration) {
        self.hold_cost = hold;
    }

    /// A shared budget made this replica wait: its demand saturates the
    /// shared pace.
    pub fn on_pressed(&mut self) {
        self.window_pressed = true;
    }

    /// A request was admitted at `now`.
    pub fn on_admit(&mut self, now: Instant) {
        self.on_admitted(now, 1);
        self.on_admitted_here();
    }

    /// `n` requests were admitted by `now` — by every replica, when the
    /// budget is shared: saturation and the wait before a probe are
    /// measured on the one schedule, as one sluice would.
    pub fn on_admitted(&mut self, now: Instant, n: u32) {
        self.window_start.get_or_insert(now);
        self.window_admitted = self.window_admitted.saturating_add(n);
    }

    /// A shared budget counted `n` admissions by every replica over `span`
    /// (between two of its answers to this replica; `None` when a hold cut
    /// into it).
    pub fn on_shared_admitted(&mut self, now: Instant, n: u32, span: Option<Duration>) {
        self.on_admitted(now, n);
        if let Some(span) = span {
            self.window_counted = self.window_counted.saturating_add(n);
            self.window_span += span;
        }
    }

    /// This replica took one of the admissions counted by
    /// [`Aimd::on_admitted`] (a shared budget's).
    pub fn on_admitted_here(&mut self) {
        self.window_here = self.window_here.saturating_add(1);
    }

    /// A request costing `units` was admitted at `now`: it counts as that
    /// many towards saturation and the wait before a probe (R-FS2).
    pub fn on_admit_units(&mut self, now: Instant, units: u32) {
        self.on_admitted(now, units);
        self.window_here = self.window_here.saturating_add(units);
    }

    fn new_epoch(&self, sent_at: Instant) -> bool {
        self.last_decrease.is_none_or(|cut| sent_at >= cut)
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
        self.last_decrease
            .is_none_or(|cut| sent_at >= cut + self.window.min(ECHO_MAX))
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

    /// Whether a failure to a request sent at `sent_at` is an echo of the
    /// outage that a clean answer to a later request already ended.
    fn outage_echo(&self, sent_at: Instant) -> bool {
        self.outage_ended.is_some_and(|(_, ended)| sent_at < ended)
    }

    /// A failure (a bare 503, a timeout, another 5xx, a failed connection)
    /// to a request sent at `sent_at`: counted in the streak, which may now
    /// be found an outage. Returns whether the rate is held (the streak
    /// has cut as often as it may, or it is an outage).
    fn streak_failure(&mut self, sent_at: Instant, now: Instant) -> bool {
        let relapse = self
            .outage_ended
            .is_some_and(|(at, _)| now.saturating_duration_since(at) < RELAPSE);
        let persist = OUTAGE_PERSIST.max(self.window * 2);
        let streak = self.streak.get_or_insert(Streak {
            first_sent: sent_at,
            began: now,
            failures: 0,
            rate_before: self.rate,
            limit_before: self.limit,
            weak_before: self.limit_weak,
            cuts: 0,
            last_cut: now,
            relapse,
            outage_at: None,
        });
        streak.failures = streak.failures.saturating_add(1);
        if streak.relapse {
            return false;
        }
        let held = streak.outage_at.is_some() || streak.cuts >= STREAK_MAX_CUTS;
        if streak.outage_at.is_none()
            && streak.failures >= OUTAGE_MIN_FAILURES
            && now.saturating_duration_since(streak.last_cut) >= persist
        {
            // Every answer failed, at a rate no cut has changed for a
            // while: not the rate's doing. No trial or probe survives it.
            streak.outage_at = Some(now);
            self.outages += 1;
            self.trial = None;
            self.recover_to = None;
            self.reset_plateau();
            return true;
        }
        held
    }

    /// A clean answer to a request sent at `sent_at` ends a streak of
    /// failures sent after it. An outage's end gives back the rate and
    /// the throttle point from before it (a clean answer: R-AI4 holds).
    /// Returns whether it did.
    fn end_streak(&mut self, sent_at: Instant, now: Instant) -> bool {
        let Some(streak) = self.streak.filter(|s| sent_at >= s.first_sent) else {
            return false;
        };
        self.streak = None;
        if streak.outage_at.is_none() {
            return false;
        }
        self.limit = streak.limit_before;
        self.limit_weak = streak.weak_before;
        self.trial = None;
        self.recover_to = None;
        self.reset_plateau();
        // The outage's failures are neither noise nor a throttle's: the
        // rate evidence they left would mislead the next judgement.
        self.errors.forget_episode();
        self.latency.clear();
        self.outage_ended = Some((now, sent_at));
        let back = streak.rate_before.clamp(self.floor, self.ceiling);
        if back > self.rate {
            self.set_rate(now, back);
            true
        } else {
            false
        }
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

    /// An ambiguous pressure signal (a bare 503, a timeout) for a request
    /// sent at `sent_at`. In order:
    ///
    /// 1. an echo of a cut already made (sent before it) changes nothing;
    /// 2. a provider whose bare 503s a trial confirmed as throttles gets
    ///    its next few cut on like 429s;
    /// 3. in slow start, only errors that rise with the rate or exceed any
    ///    noise set a limit; the first other one cuts without setting one;
    /// 4. during a trial the error is evidence for its verdict — a verdict
    ///    of "still throttled" cuts again;
    /// 5. otherwise an error significantly above what noise explains cuts,
    ///    and that cut goes on trial.
    pub fn on_ambiguous(
        &mut self,
        sent_at: Instant,
        now: Instant,
        reason: BackoffReason,
    ) -> Option<Backoff> {
        self.window_answers = self.window_answers.saturating_add(1);
        if self.outage_echo(sent_at) {
            return None;
        }
        let held = self.streak_failure(sent_at, now);
        if !self.new_epoch(sent_at) {
            // An echo of the throttle already acted on.
            self.errors
                .record(true, Attribution::Throttle, self.rate_at(sent_at));
            return None;
        }
        if held {
            // Failures in a row that two cuts did not stop, or an outage:
            // the rate stays; the breaker decides (R-SG4).
            self.errors
                .record(true, Attribution::Unknown, self.rate_at(sent_at));
            return None;
        }
        if self.unavailable_throttles > 0
            && self.trial.is_none()
            && self.limit.is_some()
            && self.errors.baseline().is_none()
        {
            self.unavailable_throttles -= 1;
            self.errors
                .record(true, Attribution::Throttle, self.rate_at(sent_at));
            let backoff = self.cut(now, reason);
            self.limit_weak = false;
            return Some(backoff);
        }
        if self.limit.is_none() && self.trial.is_none() {
            // Slow start: few answers yet, at rates that change every
            // window. Only errors that clearly rise with the rate, or are
            // more than any noise, set a limit; otherwise the first such
            // error cuts (R-AI1) and growth goes on, and later ones wait
            // for evidence.
            let evidence = self.errors.evidence(self.rate);
            let throttle = evidence.rises == Some(true) || self.errors.beyond_noise();
            if !throttle {
                if evidence.noise() {
                    self.errors
                        .record(true, Attribution::Noise, self.rate_at(sent_at));
                    return None;
                }
                self.errors
                    .record(true, Attribution::Unknown, self.rate_at(sent_at));
                if self.cold_error_cut {
                    return None;
                }
                let backoff = self.cut(now, reason);
                self.limit = None;
                self.fitted = false;
                self.cold_error_cut = true;
                return Some(backoff);
            }
        }
        let (pre_share, pre_measured) = match self.trial.as_mut() {
            Some(trial) => {
                trial.answers += 1.0;
                trial.errors += 1.0;
                // Held out of the baseline until the verdict.
                self.errors
                    .record(true, Attribution::Unknown, self.rate_at(sent_at));
                match self.settle_trial(now, true) {
                    Some(share) => (share, true),
                    None => return None,
                }
            }
            None => {
                if !self.errors.significant(self.rate) {
                    self.errors
                        .record(true, Attribution::Noise, self.rate_at(sent_at));
                    return None;
                }
                // Kept out of the baseline until a trial says it was noise.
                self.errors
                    .record(true, Attribution::Unknown, self.rate_at(sent_at));
                let near = self.errors.share_near(self.rate);
                let base = self.errors.baseline().unwrap_or(0.0);
                (
                    near.unwrap_or_else(|| self.errors.share_recent()).max(base),
                    near.is_some(),
                )
            }
        };
        let prev_limit = self.limit;
        let prev_weak = self.limit_weak;
        let from = self.rate;
        let backoff = self.cut(now, reason);
        if self.limit != prev_limit {
            // A limit moved on ambiguous evidence alone.
            self.limit_weak = true;
        }
        self.trial = Some(Trial {
            from,
            prev_limit,
            prev_weak,
            cut_at: now,
            pre_share,
            pre_measured,
            base_share: self.errors.baseline().unwrap_or(0.0),
            answers: 0.0,
            errors: 0.0,
        });
        Some(backoff)
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
        self.named_throttle = Some(now);
        if !fresh {
            if self.new_epoch(sent_at) {
                self.echo = self.echo.saturating_add(1);
            }
            self.extend_hold(now);
            return None;
        }
        // Whatever a trial was weighing, this is pressure.
        self.trial = None;
        self.time_to_refusal(sent_at, now, reason);
        let backoff = self.cut(now, reason);
        self.limit_weak = false;
        self.extend_hold(now);
        Some(backoff)
    }

    /// A refusal at the settle point after a hold, sent at the rate in
    /// force since the hold's end: a point of the [`Descent`].
    fn time_to_refusal(&mut self, sent_at: Instant, now: Instant, reason: BackoffReason) {
        let Some(end) = self.hold_end else { return };
        let steady = self.changes.back().is_none_or(|(at, _)| *at <= end);
        if reason.ambiguous() || self.hold_cost.is_zero() || sent_at <= end || !steady {
            return;
        }
        if self.limit.is_none() || self.probe.is_some() || self.shared {
            return;
        }
        let secs = (sent_at - end).as_secs_f64();
        self.descent.push(now, secs, self.rate * secs);
    }

    /// The provider holds every request off until `now` + its `Retry-After`.
    fn extend_hold(&mut self, now: Instant) {
        if !self.hold_cost.is_zero() {
            let end = now + self.hold_cost;
            self.hold_end = Some(self.hold_end.map_or(end, |e| e.max(end)));
        }
    }

    /// Counts an answer towards an open trial and acts on a verdict other
    /// than a cut.
    fn trial_answer(&mut self, sent_at: Instant, error: bool, now: Instant) {
        let Some(trial) = self.trial.as_mut() else {
            return;
        };
        if sent_at < trial.cut_at {
            return;
        }
        trial.answers += 1.0;
        if error {
            trial.errors += 1.0;
        }
        // Plain 5xx are evidence for the trial, but only an ambiguous
        // pressure signal cuts: a verdict to cut again waits for one.
        if !error {
            let _ = self.settle_trial(now, false);
        }
    }

    /// Applies a trial's verdict. Returns `Some(share)` when the provider
    /// still throttles and the caller should cut again.
    fn settle_trial(&mut self, now: Instant, error: bool) -> Option<f64> {
        let trial = self.trial?;
        match trial.verdict(now, error) {
            Verdict::Open => None,
            Verdict::Confirmed => {
                // The errors stopped at the lower rate: as good as a 429.
                self.trial = None;
                self.limit_weak = false;
                self.unavailable_throttles = TRUSTED_THROTTLES;
                None
            }
            Verdict::StillThrottled(share) => {
                self.trial = None;
                Some(share)
            }
            Verdict::Noise => {
                // The cut bought nothing: put the limit back and return to
                // the old rate at the next clean window (never on this
                // error — R-AI4).
                self.trial = None;
                self.unavailable_throttles = 0;
                // A limit that rested on ambiguous errors alone goes too:
                // they now look like this noise.
                self.limit = trial.prev_limit.filter(|_| !trial.prev_weak);
                self.limit_weak = false;
                self.recover_to = Some(self.recover_to.unwrap_or(0.0).max(trial.from));
                self.reset_plateau();
                // The trigger and the errors held out were noise after all.
                self.errors
                    .add_noise(trial.errors + 1.0, trial.answers + 1.0);
                None
            }
        }
    }

    /// Closes the window if it has run its length: judges latency, grows.
    fn close_window(&mut self, now: Instant) -> Change {
        let start = *self.window_start.get_or_insert(now);
        let elapsed = now.saturating_duration_since(start);
        if elapsed < self.window {
            return Change::default();
        }
        let secs = elapsed.as_secs_f64();
        let saturated =
            self.window_pressed || f64::from(self.window_admitted) >= SATURATION * self.rate * secs;
        let clean = !self.window_cut && !self.errors.window_spoiled();
        // The wait before a probe counts this replica's own admissions.
        // Shared, a failed probe holds every replica (the hold is shared)
        // and costs the whole fleet a `Retry-After`: the replicas probe
        // together as rarely as each would alone.
        let admitted = self.window_here;
        // A window of a few answers is too coarse a measure of delivery.
        self.delivered = if self.window_answers > 0 && !self.window_span.is_zero() {
            // Shared: every replica's admissions over the time they were
            // counted in, times the share of this replica's answers that
            // were clean (a sample of the provider's).
            let clean = f64::from(self.window_delivered) / f64::from(self.window_answers);
            (self.window_counted >= DELIVERED_MIN_ANSWERS)
                .then(|| f64::from(self.window_counted) / self.window_span.as_secs_f64() * clean)
        } else {
            (self.window_delivered >= DELIVERED_MIN_ANSWERS)
                .then(|| f64::from(self.window_delivered) / secs)
        };
        self.errors.roll();
        self.window_start = Some(now);
        self.window_admitted = 0;
        self.window_pressed = false;
        self.window_delivered = 0;
        self.window_here = 0;
        self.window_answers = 0;
        self.window_counted = 0;
        self.window_span = Duration::ZERO;
        self.window_cut = false;
        let draining = match self.latency.judge(self.latency_factor) {
            LatencyVerdict::Shift(_) => {
                let backoff = self.cut(now, BackoffReason::Latency);
                self.trial = None;
                self.limit_weak = false;
                return Change {
                    increased: false,
                    backoff: Some(backoff),
                };
            }
            LatencyVerdict::Draining => true,
            LatencyVerdict::Normal | LatencyVerdict::Unjudged => false,
        };
        Change {
            increased: clean && saturated && !draining && self.increase(admitted, now),
            backoff: None,
        }
    }

    fn increase(&mut self, admitted: u32, now: Instant) -> bool {
        let before = self.rate;
        if let Some(to) = self.recover_to.take() {
            if to > self.rate {
                self.set_rate(now, to.min(self.ceiling));
                return true;
            }
        }
        let next = match self.limit {
            None => self.rate * (1.0 + SLOW_START_GROWTH),
            Some(limit) => {
                let settle = limit * self.settle_share();
                if self.rate > limit * PROBE_FOUND {
                    // A whole clean window clearly past the limit: it has
                    // moved. Find the new one as from a cold start.
                    self.limit = None;
                    self.fitted = false;
                    self.descent.clear();
                    self.reset_plateau();
                    self.rate * (1.0 + SLOW_START_GROWTH)
                } else if let Some(probe) = self.probe.as_mut() {
                    probe.proven = probe.proven.max(probe.clean_rate);
                    probe.clean_rate = probe.clean_rate.max(self.rate);
                    let k = probe.windows.min(16);
                    probe.windows += 1;
                    self.rate + limit * PROBE_STEP * f64::from(1u32 << k)
                } else if self.rate < settle {
                    self.reset_plateau();
                    let step = ((settle - self.rate) * RECOVER_SHARE).max(limit * RECOVER_MIN_STEP);
                    (self.rate + step).min(settle)
                } else {
                    self.plateau += 1;
                    self.plateau_admitted += u64::from(admitted);
                    let held_for = self.window * self.plateau;
                    let k = 1 << self.probe_backoff;
                    if self.trial.is_some()
                        || self.plateau < PROBE_AFTER * k
                        || (!self.limit_weak
                            && self.plateau_admitted < PROBE_AFTER_ADMITTED * u64::from(k))
                        || held_for < self.hold_cost.mul_f64(PROBE_HOLD_RATIO)
                    {
                        self.rate
                    } else {
                        self.probe = Some(Probe::new(self.rate));
                        self.rate + limit * PROBE_STEP
                    }
                }
            }
        };
        self.set_rate(now, next.min(self.ceiling).max(self.rate));
        self.rate > before
    }

    /// The settle point's share of the limit: closer under a sharp limit,
    /// whose probe proved the rate clean.
    fn settle_share(&self) -> f64 {
        if self.sharp || self.fitted {
            SETTLE_SHARP
        } else {
            SETTLE
        }
    }

    fn reset_plateau(&mut self) {
        self.plateau = 0;
        self.plateau_admitted = 0;
        self.probe = None;
    }

    /// Cuts the rate now and moves the remembered limit.
    fn cut(&mut self, now: Instant, reason: BackoffReason) -> Backoff {
        if self.last_decrease.is_some() && !reason.ambiguous() {
            // The last cut's echo is over: was its limit sharp?
            self.sharp = self.echo >= SHARP_ECHO;
        }
        self.echo = 0;
        let settle = self.settle_share();
        let from = self.rate;
        let delivered = self.delivered.unwrap_or(f64::INFINITY);
        // The new limit is a tight fit of a token bucket's refill rate.
        let mut tight = false;
        let (limit, to) = match (self.limit, self.probe) {
            // Slow start: throttling began at this rate, or at what the
            // provider delivered if that was less.
            (None, _) => (
                delivered.min(from).max(from * self.decrease),
                from * self.decrease,
            ),
            // A probe that was throttled before it got clearly past the
            // limit: the limit held; straight back to the settle point.
            (Some(limit), Some(probe)) if probe.clean(reason) <= limit * PROBE_HELD => {
                // Met twice near the same rate: no longer a guess. What
                // the probe proved clean (two windows) is under it.
                self.limit_weak = false;
                let l = if reason.ambiguous() {
                    limit
                } else if self.fitted {
                    // The fit said where it is; the probe agrees.
                    tight = true;
                    limit
                } else if self.sharp {
                    // No burst to fool it: the proven rate is clean.
                    self.probe_backoff = (self.probe_backoff + 1).min(2);
                    limit.max(probe.clean_rate)
                } else {
                    limit.max(probe.clean(reason).min(limit * (1.0 + PROBE_STEP)))
                };
                (l, l * settle)
            }
            // A probe that went clean well past the limit before it was
            // throttled: the limit lies past the old one, though no higher
            // than the last clean rate nor than what the provider delivered
            // (a burst allowance can make a window look clean).
            (Some(limit), Some(probe)) => {
                // Without a delivery measure, no further than a held probe.
                let delivered = self.delivered.unwrap_or(limit * PROBE_HELD);
                let l = probe.clean(reason).min(delivered).max(limit);
                self.moved_from = Some((limit, now));
                self.probe_backoff = 0;
                self.descent.clear();
                (l, (l * settle).min(from * PROBE_DECREASE))
            }
            // Throttled at the settle point: the limit was too high.
            // A throttle the provider named says throttling began at this
            // rate; others (latency, bare 503s) say less, and step further.
            (Some(limit), None) if from >= limit * PROBE_DECREASE => {
                let named = matches!(
                    reason,
                    BackoffReason::Throttled | BackoffReason::UnavailableRetryAfter
                );
                let l = match self.moved_from {
                    // Soon after a probe moved the limit: what it found was
                    // a burst allowance's doing. Back to the limit before.
                    Some((before, at))
                        if now.saturating_duration_since(at) < self.window * PROBE_AFTER =>
                    {
                        before.min(from)
                    }
                    // Named: throttling began at this rate. Unnamed
                    // (latency, bare 503s say less): step further.
                    // Again soon after, with too few answers a window to
                    // measure delivery: the gentle steps are too slow.
                    _ => {
                        let again = self.delivered.is_none()
                            && self.too_high_at.is_some_and(|at| {
                                now.saturating_duration_since(at) < self.window * PROBE_AFTER
                            });
                        // What was delivered says less where the provider
                        // holds after each refusal (`Retry-After`): the
                        // holds, not the limit, thin the windows around
                        // them (measured in a shared fleet: a limit set
                        // 4 % under the real one, then no probe for a
                        // minute of holds).
                        // A token bucket's refill rate, where the refusals
                        // after the holds tell it, says more.
                        let held = named && !self.hold_cost.is_zero();
                        let (delivered, fit) = if held {
                            (f64::INFINITY, self.descent.limit())
                        } else {
                            (delivered, None)
                        };
                        // At most one plain cut's worth below the rate:
                        // a fit is a measure, and a poor one (a bucket
                        // whose rate moved among the points) must not
                        // cost more than a cut.
                        let fitted =
                            fit.map_or(f64::INFINITY, |(at, _)| at.max(from * PROBE_DECREASE));
                        let l = (match (named, again) {
                            (true, false) => from,
                            (true, true) => from * SETTLE,
                            (false, _) => from * PROBE_DECREASE,
                        })
                        .min(delivered)
                        .min(fitted)
                        .max(from * self.decrease);
                        tight = fit.is_some_and(|(at, margin)| l == at && margin <= at * FIT_TIGHT);
                        l
                    }
                };
                self.too_high_at = Some(now);
                self.probe_backoff = 0;
                (l, l * settle)
            }
            // Far below it: the limit has dropped.
            (Some(_), None) => (from, from * self.decrease),
        };
        if self.limit != Some(limit) && self.moved_from.is_none_or(|(_, at)| at != now) {
            self.moved_from = None;
        }
        self.fitted = tight;
        // Known that closely, the limit is settled under as a sharp one is.
        let to = if tight { limit * SETTLE_SHARP } else { to };
        self.limit = Some(limit);
        if let Some(streak) = self.streak.as_mut() {
            streak.cuts += 1;
            streak.last_cut = now;
        }
        self.reset_plateau();
        self.recover_to = None;
        self.last_decrease = Some(now);
        self.window_cut = true;
        self.latency.clear();
        self.set_rate(now, to.max(self.floor).min(from));
        Backoff {
            at: now,
            reason,
            from_rps: from,
            to_rps: self.rate,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Duration = Duration::from_secs(1);

    /// Runs `secs` saturated windows whose answers are clean, except every
    /// `error_every`-th, which is a bare 503 (0 = none).
    fn run(a: &mut Aimd, t: &mut Instant, secs: u32, error_every: u32) -> u32 {
        let mut cuts = 0;
        let mut i = 0u32;
        for _ in 0..secs {
            let n = a.rate().ceil() as u32 + 1;
            for j in 0..n {
                let at = *t + W * j / n;
                a.on_admit(at);
                i += 1;
                if error_every > 0 && i % error_every == 0 {
                    cuts += u32::from(a.on_ambiguous(at, at, BackoffReason::Unavailable).is_some());
                } else {
                    a.on_clean(at, at, Some(Duration::from_millis(40)));
                }
            }
            *t += W;
            a.on_clean(*t, *t, Some(Duration::from_millis(40)));
        }
        cuts
    }

    fn saturate(a: &mut Aimd, t: &mut Instant, secs: u32) {
        run(a, t, secs, 0);
    }

    #[test]
    fn slow_start_then_cut_then_settle_under_the_limit() {
        let mut t = Instant::now();
        let mut a = Aimd::new(2.0, 0.1, 100.0, 0.7, W);
        saturate(&mut a, &mut t, 4);
        assert!(a.rate() > 5.0, "grew: {}", a.rate());
        let before = a.rate();
        let cut = a.on_throttle(t, t, BackoffReason::Throttled).unwrap();
        assert_eq!(cut.from_rps, before);
        assert!((a.rate() - before * 0.7).abs() < 1e-9);
        let limit = a.limit().unwrap();
        assert!(limit <= before && limit >= before * 0.7, "{limit}");
        // a second throttle from the same epoch changes nothing
        assert!(a
            .on_throttle(t - Duration::from_millis(1), t, BackoffReason::Throttled)
            .is_none());
        let settle = limit * SETTLE;
        let mut windows = 0;
        while a.rate() < settle - 1e-9 {
            saturate(&mut a, &mut t, 1);
            windows += 1;
        }
        assert!(windows <= 5, "recovers fast: {windows} windows");
        assert!((a.rate() - settle).abs() < 1e-9, "{}", a.rate());
        // It waits at the settle point for PROBE_AFTER windows and
        // PROBE_AFTER_ADMITTED requests, then probes.
        let mut windows = 0;
        let mut admitted = 0.0;
        while a.rate() <= settle + 1e-9 && windows < 1000 {
            admitted += a.rate().ceil() + 1.0;
            saturate(&mut a, &mut t, 1);
            windows += 1;
        }
        assert!(a.rate() > settle, "then probes");
        assert!(windows >= PROBE_AFTER, "waited {windows} windows");
        assert!(
            admitted >= PROBE_AFTER_ADMITTED as f64,
            "waited for {admitted} requests"
        );
        // A probe throttled near the limit goes straight back to settle.
        saturate(&mut a, &mut t, 1);
        a.on_throttle(t, t, BackoffReason::Throttled).unwrap();
        assert!((a.rate() - settle).abs() < 1e-9, "{}", a.rate());
        assert_eq!(a.limit(), Some(limit), "the limit held");
    }

    #[test]
    fn a_probe_doubles_its_step_and_finds_a_doubled_limit() {
        let mut t = Instant::now();
        let mut a = Aimd::new(5.0, 0.1, 1000.0, 0.7, W);
        a.restore(19.0, Some(20.0), None);
        // Wait, then probe: within 8 probing windows the rate passes 40.
        let mut windows = 0;
        while a.rate() < 40.0 && windows < 100 {
            saturate(&mut a, &mut t, 1);
            windows += 1;
        }
        assert!(a.rate() >= 40.0);
        let waited = PROBE_AFTER.max((PROBE_AFTER_ADMITTED / 20) as u32);
        assert!(windows <= waited + 8, "{windows} windows");
    }

    #[test]
    fn unused_rate_does_not_grow() {
        let mut t = Instant::now();
        let mut a = Aimd::new(2.0, 0.1, 100.0, 0.7, W);
        for _ in 0..30 {
            a.on_admit(t);
            t += W;
            a.on_clean(t, t, None);
        }
        assert_eq!(a.rate(), 2.0);
    }

    #[test]
    fn never_above_ceiling_never_below_floor() {
        let mut t = Instant::now();
        let mut a = Aimd::new(2.0, 0.5, 10.0, 0.7, W);
        saturate(&mut a, &mut t, 50);
        assert_eq!(a.rate(), 10.0);
        for _ in 0..50 {
            t += W;
            a.on_throttle(t, t, BackoffReason::Throttled);
        }
        assert_eq!(a.rate(), 0.5);
    }

    /// R-SG3: random 503s at a steady share are noise: after the first
    /// one's cut, the rate grows to the ceiling and no limit is set.
    #[test]
    fn random_503s_do_not_hold_the_rate_down() {
        let mut t = Instant::now();
        let mut a = Aimd::new(5.0, 0.1, 500.0, 0.7, W);
        let cuts = run(&mut a, &mut t, 60, 33);
        assert_eq!(a.rate(), 500.0, "after {cuts} cuts");
        assert!(cuts <= 2, "{cuts} cuts");
        assert!(a.limit().is_none(), "noise is not a throttle point");
    }

    /// R-SG3 (the seeds' scenario): a cold provider's first 503 cuts;
    /// 503s that go on at a share no noise has set a limit and are tried.
    #[test]
    fn a_first_503_cuts_and_a_503_throttle_sets_a_limit() {
        let mut t = Instant::now();
        let mut a = Aimd::new(5.0, 0.1, 50.0, 0.7, W);
        saturate(&mut a, &mut t, 2);
        let before = a.rate();
        let cut = a.on_ambiguous(t, t, BackoffReason::Unavailable).unwrap();
        assert!(cut.to_rps < before);
        assert!(
            a.limit().is_none(),
            "one error on a cold provider proves nothing"
        );
        // Every other answer a 503: more than any noise.
        let cuts = run(&mut a, &mut t, 3, 2);
        assert!(cuts >= 1);
        assert!(a.limit().is_some());
        assert!(a.in_trial() || a.rate() < before);
    }

    /// Sends at the rate for `ms` milliseconds, each answer given by
    /// `answer`.
    fn fail_for(a: &mut Aimd, t: &mut Instant, ms: u64, answer: impl Fn(&mut Aimd, Instant)) {
        let end = *t + Duration::from_millis(ms);
        while *t < end {
            let step = Duration::from_secs_f64(1.0 / a.rate());
            a.on_admit(*t);
            answer(a, *t);
            *t += step;
        }
    }

    fn bare_503(a: &mut Aimd, at: Instant) {
        a.on_ambiguous(at, at, BackoffReason::Unavailable);
    }

    /// R-SG4: a provider paced at its ceiling answers every request with a
    /// bare 503 for 3 s (a deploy). The streak cuts twice at most, is found
    /// an outage, and the first clean answer after it gives the rate back:
    /// no throttle point is learned from it.
    #[test]
    fn a_short_outage_of_bare_503s_gives_the_rate_back() {
        let mut t = Instant::now();
        let mut a = Aimd::new(5.0, 0.1, 50.0, 0.7, W);
        saturate(&mut a, &mut t, 12);
        assert_eq!(a.rate(), 50.0);
        assert_eq!(a.limit(), None);
        fail_for(&mut a, &mut t, 3000, bare_503);
        assert!(a.rate() >= 50.0 * 0.7 * 0.7 - 1e-9, "held: {}", a.rate());
        assert!(a.in_outage(), "{:?}", a.belief(t));
        assert_eq!(a.belief(t).unwrap().condition, Condition::Outage);
        assert_eq!(a.outages(), 1);
        let change = a.on_clean(t, t, Some(Duration::from_millis(40)));
        assert!(change.increased);
        assert_eq!(a.rate(), 50.0, "the rate from before the outage");
        assert_eq!(a.limit(), None, "no throttle point from an outage");
        assert!(!a.in_outage());
        assert_eq!(a.belief(t), None);
        // And it stays there: the outage left no evidence behind.
        let cuts = run(&mut a, &mut t, 30, 0);
        assert_eq!((cuts, a.rate()), (0, 50.0));
    }

    /// R-SG4 with a throttle point already learned: an outage neither
    /// moves it nor leaves the rate below the settle point.
    #[test]
    fn an_outage_keeps_the_learned_throttle_point() {
        let mut t = Instant::now();
        let mut a = Aimd::new(5.0, 0.1, 200.0, 0.7, W);
        a.restore(19.0, Some(20.0), None);
        saturate(&mut a, &mut t, 3);
        let (rate, limit) = (a.rate(), a.limit());
        fail_for(&mut a, &mut t, 10_000, bare_503);
        assert!(a.in_outage());
        a.on_clean(t, t, None);
        assert_eq!((a.rate(), a.limit()), (rate, limit));
    }

    /// R-SG4: refused or reset connections never cut, but a streak of them
    /// is an outage all the same (the readout says so), and nothing is cut.
    #[test]
    fn refused_connections_are_an_outage_without_a_cut() {
        let mut t = Instant::now();
        let mut a = Aimd::new(5.0, 0.1, 50.0, 0.7, W);
        saturate(&mut a, &mut t, 12);
        fail_for(&mut a, &mut t, 3000, |a, at| a.on_error(at, at));
        assert_eq!(a.rate(), 50.0);
        assert_eq!(a.belief(t).unwrap().condition, Condition::Outage);
        assert_eq!(a.belief(t).unwrap().why, "every_answer_failed");
        a.on_clean(t, t, None);
        assert_eq!((a.rate(), a.limit(), a.belief(t)), (50.0, None, None));
    }

    /// R-SG3 stays: a limiter that refuses everything while it is pushed
    /// past its limit and nothing once the rate is under it (a sliding
    /// window counting its refusals, answering bare 503s) is a throttle:
    /// its failures stop within a second of the cuts, so they are never
    /// an outage, the cuts stand and a throttle point is kept.
    #[test]
    fn failures_that_stop_after_the_cuts_are_a_throttle() {
        let mut t = Instant::now();
        let mut a = Aimd::new(5.0, 0.1, 200.0, 0.7, W);
        // Slow start to 30 req/s against a limit of 20.
        while a.rate() < 30.0 {
            saturate(&mut a, &mut t, 1);
        }
        let before = a.rate();
        // The window: what was sent over the last second, refusals too.
        let mut sent: VecDeque<Instant> = VecDeque::new();
        let mut statuses = Vec::new();
        let end = t + Duration::from_secs(30);
        while t < end {
            a.on_admit(t);
            while sent.front().is_some_and(|s| *s + W <= t) {
                sent.pop_front();
            }
            sent.push_back(t);
            if sent.len() > 20 {
                bare_503(&mut a, t);
                statuses.push(503);
            } else {
                a.on_clean(t, t, Some(Duration::from_millis(40)));
                statuses.push(200);
            }
            assert!(!a.in_outage(), "at {:?}", t);
            t += Duration::from_secs_f64(1.0 / a.rate());
        }
        assert!(a.rate() < before && a.rate() <= 20.5, "{}", a.rate());
        assert!(a.limit().is_some_and(|l| l < before), "{:?}", a.limit());
        assert_eq!(a.outages(), 0);
    }

    /// R-SG4: failures that come back as soon as an outage gave the rate
    /// back were that rate's doing: judged as a throttle, cut on without a
    /// hold, and never restored into a second time.
    #[test]
    fn failures_right_after_an_outage_are_a_throttle() {
        let mut t = Instant::now();
        let mut a = Aimd::new(5.0, 0.1, 50.0, 0.7, W);
        saturate(&mut a, &mut t, 12);
        fail_for(&mut a, &mut t, 3000, bare_503);
        a.on_clean(t, t, None);
        assert_eq!(a.rate(), 50.0);
        t += Duration::from_millis(100);
        fail_for(&mut a, &mut t, 6000, bare_503);
        assert!(!a.in_outage());
        assert_eq!(a.outages(), 1);
        assert!(a.rate() < 50.0 * 0.7 * 0.7, "cut on: {}", a.rate());
        assert_eq!(a.belief(t).unwrap().condition, Condition::Throttle);
        assert_eq!(a.belief(t).unwrap().why, "failures_came_back_with_the_rate");
    }

    /// R-AI4 through an outage: no error ever raises the rate; only the
    /// clean answer after it does.
    #[test]
    fn an_outage_never_raises_the_rate_on_an_error() {
        let mut t = Instant::now();
        let mut a = Aimd::new(5.0, 0.1, 50.0, 0.7, W);
        saturate(&mut a, &mut t, 12);
        let mut last = a.rate();
        fail_for(&mut a, &mut t, 5000, |a, at| {
            a.on_ambiguous(at, at, BackoffReason::Timeout);
        });
        for _ in 0..50 {
            t += Duration::from_millis(50);
            a.on_ambiguous(t, t, BackoffReason::Unavailable);
            a.on_error(t, t);
            assert!(a.rate() <= last);
            last = a.rate();
        }
    }

    /// R-SG5: a limiter that counts over a window (a sliding window that
    /// counts its refusals) goes on refusing for a while after the cut.
    /// Refusals to requests sent within a window of the cut are its echo:
    /// one cut, not one per refusal.
    #[test]
    fn refusals_within_a_window_of_a_cut_are_its_echo() {
        let mut t = Instant::now();
        let mut a = Aimd::new(5.0, 0.1, 100.0, 0.7, W);
        a.restore(19.0, Some(20.0), None);
        saturate(&mut a, &mut t, 2);
        let cut = a.on_throttle(t, t, BackoffReason::Throttled).unwrap();
        let after = a.rate();
        assert!(after < cut.from_rps);
        // Sent after the cut, refused within its window: no new cut.
        for ms in [50, 200, 500, 900] {
            let at = t + Duration::from_millis(ms);
            assert!(a.on_throttle(at, at, BackoffReason::Throttled).is_none());
        }
        assert_eq!(a.rate(), after);
        // A refusal to a request sent a window later is news.
        let later = t + W + Duration::from_millis(10);
        assert!(a
            .on_throttle(later, later, BackoffReason::Throttled)
            .is_some());
    }

    /// A provider that holds every request off after a throttle
    /// (`Retry-After`) makes a failed probe cost the whole hold: the next
    /// probe waits at least PROBE_HOLD_RATIO holds at the settle point.
    #[test]
    fn a_probe_waits_longer_where_a_failed_one_costs_a_hold() {
        let windows_to_probe = |hold: Duration| {
            let mut t = Instant::now();
            let mut a = Aimd::new(5.0, 0.1, 1000.0, 0.7, W);
            a.restore(19.0, Some(20.0), None);
            a.on_hold(hold);
            let settle = a.rate();
            let mut windows = 0;
            while a.rate() <= settle + 1e-9 && windows < 1000 {
                saturate(&mut a, &mut t, 1);
                windows += 1;
            }
            windows
        };
        let plain = windows_to_probe(Duration::ZERO);
        let held = windows_to_probe(Duration::from_secs(1));
        assert!(plain < 30, "{plain}");
        assert!(
            f64::from(held) >= PROBE_HOLD_RATIO,
            "probed after {held} windows with a 1 s hold"
        );
    }

    /// A probe carried one window past the limit by the provider's burst
    /// allowance, then refused: a named throttle judges it by the rates
    /// proven by the next window, so the limit stays where it was (moved
    /// by at most one probe step) instead of jumping to the burst's rate.
    #[test]
    fn a_burst_carried_probe_window_does_not_move_the_limit() {
        let mut t = Instant::now();
        let mut a = Aimd::new(5.0, 0.1, 1000.0, 0.7, W);
        a.restore(19.0, Some(20.0), None);
        // Wait at the settle point, then probe until the rate is clearly
        // past the limit (one clean window there: the burst's doing).
        let mut windows = 0;
        while a.rate() < 20.0 * PROBE_HELD && windows < 1000 {
            saturate(&mut a, &mut t, 1);
            windows += 1;
        }
        saturate(&mut a, &mut t, 1);
        a.on_throttle(t, t, BackoffReason::Throttled).unwrap();
        let limit = a.limit().unwrap();
        assert!(
            limit <= 20.0 * (1.0 + PROBE_STEP) + 1e-9,
            "the limit moved to {limit}"
        );
        assert!(a.rate() <= limit * SETTLE + 1e-9, "{}", a.rate());
    }

    /// R-SG5: a limiter whose refusals go on after the cut (a sliding
    /// window counting its refusals) is sharp: no burst carries a probe
    /// past it, so what a probe proved clean becomes the limit, and the
    /// rate settles at SETTLE_SHARP of it; a held probe there doubles the
    /// wait before the next (each costs a window of refusals).
    #[test]
    fn a_sharp_limit_is_taken_at_what_the_probe_proved() {
        let mut t = Instant::now();
        let mut a = Aimd::new(5.0, 0.1, 1000.0, 0.7, W);
        a.restore(18.0, Some(18.0), None);
        saturate(&mut a, &mut t, 1);
        a.on_throttle(t, t, BackoffReason::Throttled).unwrap();
        // The cut's echo: refusals to requests sent after it.
        for ms in [100, 200, 300] {
            let at = t + Duration::from_millis(ms);
            assert!(a.on_throttle(at, at, BackoffReason::Throttled).is_none());
        }
        t += W;
        // Settle, wait, probe past 18 (the true limit is higher).
        let mut windows = 0;
        while a.rate() < 18.0 * 1.04 && windows < 1000 {
            saturate(&mut a, &mut t, 1);
            windows += 1;
        }
        let proved = a.rate();
        saturate(&mut a, &mut t, 1);
        let refused_at = a.rate();
        assert!(refused_at > proved);
        a.on_throttle(t, t, BackoffReason::Throttled).unwrap();
        let limit = a.limit().unwrap();
        assert!(
            (limit - proved).abs() < 1e-9,
            "the limit is what the probe proved: {limit} vs {proved}"
        );
        assert!(
            (a.rate() - limit * SETTLE_SHARP).abs() < 1e-9,
            "{}",
            a.rate()
        );
    }

    /// A token bucket (20/s, burst 10) answering `429` with
    /// `Retry-After: 1` to saturated demand from `a`, for `secs`: when it
    /// refused.
    fn bucket_refusals(a: &mut Aimd, secs: u64) -> Vec<f64> {
        let (limit, burst) = (20.0, 10.0);
        let start = Instant::now();
        let (mut t, mut filled, mut held_until) = (start, start, start);
        let mut tokens: f64 = burst;
        let mut refusals = Vec::new();
        while t < start + Duration::from_secs(secs) {
            t = (t + Duration::from_secs_f64(1.0 / a.rate())).max(held_until);
            tokens = (tokens + (t - filled).as_secs_f64() * limit).min(burst);
            filled = t;
            a.on_admit(t);
            if tokens >= 1.0 {
                tokens -= 1.0;
                a.on_clean(t, t, Some(Duration::from_millis(20)));
            } else {
                a.on_hold(Duration::from_secs(1));
                a.on_throttle(t, t, BackoffReason::Throttled);
                held_until = t + Duration::from_secs(1);
                refusals.push((t - start).as_secs_f64());
            }
        }
        refusals
    }

    /// R-SG5: a limit learned a third too high (slow start's cut measured
    /// a burst) on a token bucket that holds with `Retry-After`: the time
    /// each rate lasted after a hold tells the bucket's refill rate, and
    /// the rate is under it after four refusals, the last at 19 s — where
    /// one 5 % step per refusal, each refusal later than the last, took
    /// five, the last at 31 s.
    #[test]
    fn the_time_to_each_refusal_tells_a_token_buckets_rate() {
        let mut a = Aimd::new(4.0, 0.1, 1000.0, 0.7, W);
        a.restore(25.3, Some(26.6), None);
        let refusals = bucket_refusals(&mut a, 60);
        assert!(refusals.len() <= 4, "{refusals:?}");
        assert!(refusals.last().is_some_and(|at| *at < 25.0), "{refusals:?}");
        assert!(a.limit().is_some_and(|l| l <= 21.0), "{:?}", a.limit());
        assert!(a.rate() >= 0.93 * 20.0 && a.rate() <= 20.0, "{}", a.rate());
        // From a cold start too, the rate ends under the bucket's.
        let mut cold = Aimd::new(4.0, 0.1, 1000.0, 0.7, W);
        let refusals = bucket_refusals(&mut cold, 120);
        assert!(refusals.len() <= 4, "{refusals:?}");
        assert!(
            cold.rate() >= 0.93 * 20.0 && cold.rate() <= 20.0,
            "{}",
            cold.rate()
        );
    }
}

//! Rate-based AIMD: learn how fast a provider lets us go.
//!
//! The rate starts low (R-AI3), grows while a window of saturated successes
//! passes with no sign of pressure, and is cut multiplicatively on a 429, a
//! 503, a timeout or a soft throttle (R-AI1). It never crosses the owner's
//! ceiling (R-AI2), and no error ever raises it (R-AI4).
//!
//! A throttle costs more than the one 429: with a `Retry-After` hold the
//! provider's whole capacity for the hold is lost. So the controller does
//! not saw-tooth around the limit like plain AIMD does. It remembers the
//! rate at which throttling began (`limit`) and:
//!
//! 1. before any throttle, grows by half per window (slow start);
//! 2. after a cut, recovers quickly to a settle point just under `limit`
//!    (95 %), closing half the gap per window;
//! 3. stays at the settle point for a long stable stretch
//!    ([`PROBE_AFTER`] windows and [`PROBE_AFTER_ADMITTED`] requests)
//!    before it probes upward;
//! 4. probes gently (1 % of `limit` per window), doubling the step every
//!    [`PROBE_DOUBLING`] windows without a throttle, so that a raised limit
//!    is found within a minute or so, while a limit that has not moved
//!    costs only the few 429s of one brief overshoot.
//!
//! A throttle seen near the known limit (a probe that went too far) is cut
//! by [`PROBE_DECREASE`] only; one far below it (the limit has dropped) by
//! the full `decrease_factor` (AWS's β = 0.7). Only one cut is made per
//! congestion epoch: responses to requests sent before the last cut say
//! nothing new (as TCP's fast recovery ignores losses from the old window).
//!
//! Growth only happens when demand reached the pace (the window's
//! admissions were at least [`SATURATION`] of the rate): a collector that
//! sends one request a minute proves nothing about ten per second, so the
//! rate does not creep up to the ceiling while unused (RFC 7661's reasoning
//! for application-limited TCP).

use std::time::Duration;

use tokio::time::Instant;

/// Settle point as a share of the rate at which throttling began.
pub const SETTLE: f64 = 0.95;
/// Windows at the settle point before probing upward.
pub const PROBE_AFTER: u32 = 20;
/// …and requests admitted there: a slow provider (a few requests a
/// second) waits longer, so that one probe's overshoot stays a small share
/// of what it sent.
pub const PROBE_AFTER_ADMITTED: u64 = 200;
/// First probe step, as a share of the known limit per window.
pub const PROBE_STEP: f64 = 0.01;
/// The probe step doubles after this many windows without a throttle.
pub const PROBE_DOUBLING: u32 = 5;
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

/// Why the rate was cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackoffReason {
    /// 429 or 503.
    Throttled,
    /// Time-to-first-byte well above the learned baseline, or a timeout.
    SoftThrottle,
}

impl BackoffReason {
    /// A bounded label for metrics and logs.
    pub fn label(self) -> &'static str {
        match self {
            BackoffReason::Throttled => "throttled",
            BackoffReason::SoftThrottle => "soft_throttle",
        }
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
    /// How long one success window lasts.
    window: Duration,
    /// The rate at which the provider last throttled us.
    limit: Option<f64>,
    /// When the current window began (at its first event).
    window_start: Option<Instant>,
    /// Admissions in the current window.
    window_admitted: u32,
    /// No failure or throttle in the current window.
    window_clean: bool,
    /// Clean, saturated windows spent at or above the settle point.
    plateau: u32,
    /// Requests admitted during those windows.
    plateau_admitted: u64,
    /// Windows spent probing above the settle point.
    probing: u32,
    /// When the rate was last cut; responses to earlier sends are ignored.
    last_decrease: Option<Instant>,
}

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
            limit: None,
            window_start: None,
            window_admitted: 0,
            window_clean: true,
            plateau: 0,
            plateau_admitted: 0,
            probing: 0,
            last_decrease: None,
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

    /// The floor.
    pub fn floor(&self) -> f64 {
        self.floor
    }

    /// The rate at which throttling last began, if it ever did.
    pub fn limit(&self) -> Option<f64> {
        self.limit
    }

    /// Changes the bounds (config reload); the rate and the remembered
    /// limit are clamped to them.
    pub fn set_bounds(&mut self, floor: f64, ceiling: f64, decrease: f64, window: Duration) {
        self.ceiling = ceiling;
        self.floor = floor.min(ceiling);
        self.decrease = decrease;
        self.window = window;
        self.rate = self.rate.clamp(self.floor, self.ceiling);
    }

    /// Restores a learned rate and limit (clamped to the bounds, R-AI2).
    pub fn restore(&mut self, rate: f64, limit: Option<f64>) {
        if rate.is_finite() && rate > 0.0 {
            self.rate = rate.clamp(self.floor, self.ceiling);
        }
        self.limit = limit.filter(|l| l.is_finite() && *l > 0.0);
    }

    /// A request was admitted at `now`.
    pub fn on_admit(&mut self, now: Instant) {
        self.window_start.get_or_insert(now);
        self.window_admitted = self.window_admitted.saturating_add(1);
    }

    /// A response that is not a success, a throttle or a client error
    /// (5xx, connect error): no cut, but the window does not count.
    pub fn on_failure(&mut self) {
        self.window_clean = false;
    }

    /// A success arrived at `now`. Returns true if the rate grew.
    pub fn on_success(&mut self, now: Instant) -> bool {
        let start = *self.window_start.get_or_insert(now);
        let elapsed = now.saturating_duration_since(start);
        if elapsed < self.window {
            return false;
        }
        let saturated =
            f64::from(self.window_admitted) >= SATURATION * self.rate * elapsed.as_secs_f64();
        let grow = self.window_clean && saturated;
        let admitted = self.window_admitted;
        self.window_start = Some(now);
        self.window_admitted = 0;
        self.window_clean = true;
        if grow {
            self.increase(admitted)
        } else {
            false
        }
    }

    fn increase(&mut self, admitted: u32) -> bool {
        let before = self.rate;
        let next = match self.limit {
            None => self.rate * (1.0 + SLOW_START_GROWTH),
            Some(limit) => {
                let settle = limit * SETTLE;
                if self.rate < settle {
                    self.reset_plateau();
                    let step = ((settle - self.rate) * RECOVER_SHARE).max(limit * RECOVER_MIN_STEP);
                    (self.rate + step).min(settle)
                } else {
                    self.plateau += 1;
                    self.plateau_admitted += u64::from(admitted);
                    if self.plateau <= PROBE_AFTER || self.plateau_admitted < PROBE_AFTER_ADMITTED {
                        self.rate
                    } else {
                        let k = self.probing / PROBE_DOUBLING;
                        self.probing += 1;
                        let step = limit * PROBE_STEP * f64::from(1u32 << k.min(16));
                        self.rate + step
                    }
                }
            }
        };
        self.rate = next.min(self.ceiling).max(self.rate);
        self.rate > before
    }

    fn reset_plateau(&mut self) {
        self.plateau = 0;
        self.plateau_admitted = 0;
        self.probing = 0;
    }

    /// The provider pushed back on a request sent at `sent_at`. Returns the
    /// cut if one was made (at most one per congestion epoch).
    ///
    /// The rate after is never above the rate before (R-AI4).
    pub fn on_throttle(
        &mut self,
        sent_at: Instant,
        now: Instant,
        reason: BackoffReason,
    ) -> Option<Backoff> {
        self.window_clean = false;
        if self.last_decrease.is_some_and(|cut| sent_at < cut) {
            return None;
        }
        let from = self.rate;
        let near_limit = self.limit.is_some_and(|limit| from >= limit * 0.9);
        let factor = if near_limit {
            PROBE_DECREASE.max(self.decrease)
        } else {
            self.decrease
        };
        self.limit = Some(from);
        self.reset_plateau();
        self.last_decrease = Some(now);
        self.rate = (from * factor).max(self.floor).min(from);
        Some(Backoff {
            at: now,
            reason,
            from_rps: from,
            to_rps: self.rate,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Duration = Duration::from_secs(1);

    /// Runs `secs` saturated, clean windows.
    fn saturate(a: &mut Aimd, t: &mut Instant, secs: u32) {
        for _ in 0..secs {
            let n = (a.rate() * 1.0).ceil() as u32 + 1;
            for i in 0..n {
                a.on_admit(*t + W * i / n);
            }
            *t += W;
            a.on_success(*t);
        }
    }

    #[test]
    fn slow_start_then_cut_then_settle_under_the_limit() {
        let mut t = Instant::now();
        let mut a = Aimd::new(2.0, 0.1, 100.0, 0.7, W);
        a.on_admit(t);
        a.on_success(t);
        saturate(&mut a, &mut t, 3);
        assert!(a.rate() > 5.0, "grew: {}", a.rate());
        let before = a.rate();
        let cut = a.on_throttle(t, t, BackoffReason::Throttled).unwrap();
        assert_eq!(cut.from_rps, before);
        assert!((a.rate() - before * 0.7).abs() < 1e-9);
        assert_eq!(a.limit(), Some(before));
        // a second throttle from the same epoch changes nothing
        assert!(a
            .on_throttle(t - Duration::from_millis(1), t, BackoffReason::Throttled)
            .is_none());
        let settle = before * SETTLE;
        let mut windows = 0;
        while a.rate() < settle {
            saturate(&mut a, &mut t, 1);
            windows += 1;
        }
        // one window spoiled by the throttle, then four to recover
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
        assert!(windows > PROBE_AFTER, "waited {windows} windows");
        assert!(
            admitted >= PROBE_AFTER_ADMITTED as f64,
            "waited for {admitted} requests"
        );
    }

    #[test]
    fn unused_rate_does_not_grow() {
        let mut t = Instant::now();
        let mut a = Aimd::new(2.0, 0.1, 100.0, 0.7, W);
        for _ in 0..30 {
            a.on_admit(t);
            t += W;
            a.on_success(t);
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
}

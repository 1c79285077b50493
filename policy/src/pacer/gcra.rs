//! GCRA, the Generic Cell Rate Algorithm (ITU-T I.371), as a pure state
//! machine.
//!
//! GCRA(I, L) keeps one number, the theoretical arrival time (TAT). A
//! request at `t` conforms if `t ≥ TAT − L`; admitting it sets
//! `TAT = max(TAT, t) + I`. After an idle gap `TAT` is in the past, so
//! `max` resets it to `t + I`: credit never accumulates beyond the burst,
//! which is the property a collector resuming after a pause needs (R-GC1).
//! governor's `gcra.rs` is the model; here the emission interval changes
//! while running, because AIMD moves the rate.

use std::time::Duration;

use tokio::time::Instant;

use crate::clock::{nanos, Stamp};

/// Lateness below this is the timer's rounding, not idle time.
pub const TIMER_SLACK: Duration = Duration::from_millis(1);

/// A queued request's wake-up lateness up to this is not charged to the
/// schedule ([`Gcra::admit_waited`]).
pub const WAKE_SLACK: Duration = Duration::from_millis(5);

/// GCRA state: theoretical arrival time, emission interval, tolerance.
#[derive(Debug, Clone)]
pub struct Gcra {
    /// When the next request would be due at exactly the rate; `None`
    /// before the first admission (one word: R-PF1, issue 38).
    tat: Option<Stamp>,
    /// Emission interval I = 1 / rate, nanoseconds (a `Duration` exactly,
    /// in 8 bytes, not 16: R-PF1, issue 38; [`interval_of`] is at most
    /// 10⁶ s).
    interval_ns: u64,
    /// Burst size; the tolerance is L = (burst − 1) · I.
    burst: u32,
}

impl Gcra {
    /// When the next request would be due at exactly the rate, if one was
    /// admitted.
    fn tat(&self) -> Option<Instant> {
        self.tat.map(Stamp::at)
    }

    /// A fresh cell stream with the given interval and burst (≥ 1).
    pub fn new(interval: Duration, burst: u32) -> Self {
        Gcra {
            tat: None,
            interval_ns: nanos(interval),
            burst: burst.max(1),
        }
    }

    /// The emission interval.
    pub fn interval(&self) -> Duration {
        Duration::from_nanos(self.interval_ns)
    }

    /// The tolerance L = (burst − 1) · I.
    pub fn tolerance(&self) -> Duration {
        self.interval() * (self.burst - 1)
    }

    /// The earliest instant, not before `now`, at which the request `ahead`
    /// places behind the next one would conform, if those ahead were
    /// admitted as early as they could be.
    pub fn earliest(&self, now: Instant, ahead: u32) -> Instant {
        match self.tat() {
            None => {
                // The first `burst` requests conform at once.
                let extra = ahead.saturating_sub(self.burst - 1);
                now + self.interval() * extra
            }
            Some(tat) => {
                let due = tat.max(now) + self.interval() * ahead;
                due.checked_sub(self.tolerance()).unwrap_or(now).max(now)
            }
        }
    }

    /// Whether a request at `now` conforms.
    pub fn conforms(&self, now: Instant) -> bool {
        self.earliest(now, 0) <= now
    }

    /// Admits a request at `now` (the caller checked [`conforms`]).
    ///
    /// [`conforms`]: Gcra::conforms
    ///
    /// A request admitted less than [`TIMER_SLACK`] after its due time is
    /// counted as on time: tokio's timer fires on millisecond ticks, and
    /// without this each wake-up's rounding would lengthen every interval
    /// and the paced rate would drift below the set one.
    pub fn admit(&mut self, now: Instant) {
        let base = match self.tat() {
            None => now,
            Some(tat) if now <= tat + TIMER_SLACK => tat,
            Some(_) => now,
        };
        self.tat = Some(Stamp::of(base + self.interval()));
    }

    /// Admits a request that waited in the queue for its slot: its lateness
    /// is the time it took to wake up, never idle time, so up to
    /// [`WAKE_SLACK`] (and half an interval) of it is not charged to the
    /// schedule. Without this, a ~1 ms wake-up on every slot paces a queue
    /// at 20 req/s at 19.6 (measured) — and a provider's per-second quota
    /// is never fully used.
    pub fn admit_waited(&mut self, now: Instant) {
        let slack = WAKE_SLACK.min(self.interval() / 2).max(TIMER_SLACK);
        let base = match self.tat() {
            Some(tat) if now <= tat + slack => tat,
            _ => now,
        };
        self.tat = Some(Stamp::of(base + self.interval()));
    }

    /// Changes the emission interval. The last admission keeps its place and
    /// the next one is due one *new* interval after it, so a rate change
    /// applies to requests already waiting (R-GC2).
    ///
    /// A longer interval also lengthens the tolerance `(burst − 1) · I`;
    /// the TAT moves by at least as much, so that a slower rate never makes
    /// the next conforming instant earlier (R-AI4).
    pub fn set_interval(&mut self, interval: Duration) {
        if let Some(tat) = self.tat() {
            let old = self.interval();
            let last = tat.checked_sub(old).unwrap_or(tat);
            let mut next = last + interval;
            if interval > old {
                let grown = (interval - old) * (self.burst - 1);
                next = next.max(tat + grown);
            }
            self.tat = Some(Stamp::of(next));
        }
        self.interval_ns = nanos(interval);
    }

    /// Lets the next request go by `at` at the latest: a quota whole again
    /// at its reset owes nothing to the spacing of the window before it.
    pub fn due_by(&mut self, at: Instant) {
        if self.tat().is_some_and(|tat| tat > at) {
            self.tat = Some(Stamp::of(at));
        }
    }

    /// Charges `units` more intervals to the last admission: a request that
    /// costs several units takes as many slots (R-FS2), paid after it goes,
    /// so that the next request waits for them.
    pub fn charge(&mut self, units: u32) {
        if let Some(tat) = self.tat() {
            self.tat = Some(Stamp::of(tat + self.interval() * units));
        }
    }

    /// Starts the schedule afresh with the next request due at `at` and
    /// no burst credit before it: a replica that begins pacing alone joins
    /// the others' schedules at its own phase instead of all at once.
    pub fn restart_at(&mut self, at: Instant) {
        self.tat = Some(Stamp::of(at + self.tolerance()));
    }

    /// Changes the burst size (≥ 1).
    pub fn set_burst(&mut self, burst: u32) {
        self.burst = burst.max(1);
    }
}

/// The interval for a rate in requests per second.
pub fn interval_of(rate_rps: f64) -> Duration {
    Duration::from_secs_f64(1.0 / rate_rps.max(1e-6))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn strict_spacing_without_burst() {
        let t0 = Instant::now();
        let mut g = Gcra::new(ms(100), 1);
        assert!(g.conforms(t0));
        g.admit(t0);
        assert!(!g.conforms(t0 + ms(99)));
        assert_eq!(g.earliest(t0, 0), t0 + ms(100));
        assert_eq!(g.earliest(t0, 2), t0 + ms(300));
        g.admit(t0 + ms(100));
        assert_eq!(g.earliest(t0 + ms(100), 0), t0 + ms(200));
    }

    #[test]
    fn rate_change_moves_the_next_slot() {
        let t0 = Instant::now();
        let mut g = Gcra::new(ms(100), 1);
        g.admit(t0);
        g.set_interval(ms(250));
        assert_eq!(g.earliest(t0, 0), t0 + ms(250));
        g.set_interval(ms(50));
        assert_eq!(g.earliest(t0, 0), t0 + ms(50));
    }

    /// Admits every request as soon as it conforms, starting at `start`,
    /// and counts how many go within `window` of the first.
    fn greedy_in_window(g: &mut Gcra, start: Instant, window: Duration, max: u32) -> u32 {
        let mut n = 0;
        let mut t = start;
        while n < max {
            t = g.earliest(t, 0);
            if t >= start + window {
                break;
            }
            g.admit(t);
            n += 1;
        }
        n
    }

    proptest! {
        /// R-GC1: whatever happened before and however long the pause, a
        /// resumed stream gets at most `burst` requests at once, and at most
        /// `burst + k` within k intervals: idle time buys no extra credit.
        #[test]
        fn no_burst_beyond_tolerance_after_any_idle(
            interval_ms in 1u64..2_000,
            burst in 1u32..20,
            history in proptest::collection::vec(0u64..5_000, 0..50),
            idle_ms in 0u64..10_000_000,
            k in 0u32..10,
        ) {
            let t0 = Instant::now();
            let mut g = Gcra::new(ms(interval_ms), burst);
            let mut t = t0;
            for gap in history {
                t += ms(gap);
                if g.conforms(t) { g.admit(t); }
            }
            let resume = t + ms(idle_ms);
            let at_once = greedy_in_window(&mut g.clone(), resume, Duration::from_nanos(1), 10_000);
            prop_assert!(at_once <= burst, "{at_once} at once > burst {burst}");
            let window = ms(interval_ms) * k + Duration::from_nanos(1);
            let within = greedy_in_window(&mut g, resume, window, 10_000);
            prop_assert!(within <= burst + k, "{within} in {k} intervals > {burst} + {k}");
        }
    }
}

//! Allowances over long horizons (R-FS2): `units` per period — a daily or
//! monthly quota — paced so that it lasts the period.
//!
//! A daily quota spent at the learned rate is gone by mid-morning, and the
//! collector then stands still until midnight. Instead the allowance's
//! rate is what is left spread over what remains of the period: at its
//! start `units / per`, higher after an idle stretch, lower after a busy
//! one — never a burst (the GCRA still spaces every request) and never
//! above the learned rate or the ceiling, which stay on top. A period
//! begins at the first request and the next one right where it ends. What
//! was spent is learned state: it survives restarts (the proxy stores it
//! with the rest).

use std::time::Duration;

use tokio::time::Instant;

/// An allowance: `units` per `per`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Allowance {
    /// Units the period allows.
    pub units: u64,
    /// The period.
    pub per: Duration,
}

/// How far a period has got, for the store: time since it began, units
/// spent in it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AllowanceUse {
    /// Since the period began.
    pub elapsed: Duration,
    /// Units spent in it.
    pub spent: f64,
}

/// A readout of an allowance.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AllowanceSnapshot {
    /// The allowance.
    pub allowance: Allowance,
    /// Units spent this period.
    pub spent: f64,
    /// Until the period ends (the whole period before it began).
    pub resets_in: Duration,
    /// The rate that spreads what is left over what remains.
    pub rate_rps: f64,
}

/// The slowest an allowance paces: spent, it holds requests off until its
/// period ends (a request's wait is then refused by the queue's bound).
const SPENT_RATE: f64 = 1e-6;

/// An allowance in force.
#[derive(Debug, Clone)]
pub(crate) struct AllowanceState {
    allowance: Allowance,
    /// When the current period began; `None` before the first request.
    began: Option<Instant>,
    spent: f64,
    /// [`AllowanceState::rate`] as of the last [`AllowanceState::refresh`]:
    /// what the pacer paces at, read without a clock.
    pace: f64,
}

impl AllowanceState {
    pub(crate) fn new(allowance: Allowance) -> Self {
        AllowanceState {
            allowance,
            began: None,
            spent: 0.0,
            pace: allowance.units as f64 / allowance.per.as_secs_f64().max(f64::MIN_POSITIVE),
        }
    }

    /// The allowance changed (a reload): what was spent counts against it
    /// (the pace follows at the next request).
    pub(crate) fn set(&mut self, allowance: Allowance) {
        self.allowance = allowance;
    }

    /// Brings [`AllowanceState::pace`] to `now`: what is left over what
    /// remains moves with time as well as with spending, and a spent
    /// period gives way to the next.
    pub(crate) fn refresh(&mut self, now: Instant) {
        self.roll(now);
        self.pace = self.rate(now);
    }

    /// The rate as of the last refresh.
    pub(crate) fn pace(&self) -> f64 {
        self.pace
    }

    /// The allowance in force.
    pub(crate) fn allowance(&self) -> Allowance {
        self.allowance
    }

    /// Moves to the period `now` falls in.
    fn roll(&mut self, now: Instant) {
        let per = self.allowance.per;
        if let Some(began) = self.began {
            if now >= began + per {
                let n = (now - began).as_secs_f64() / per.as_secs_f64();
                self.began = Some(began + per.mul_f64(n.floor()));
                self.spent = 0.0;
            }
        }
    }

    /// Spends `units` at `now`.
    pub(crate) fn spend(&mut self, now: Instant, units: f64) {
        self.roll(now);
        self.began.get_or_insert(now);
        self.spent += units;
        self.pace = self.rate(now);
    }

    /// What is left spread over what remains of the period.
    pub(crate) fn rate(&self, now: Instant) -> f64 {
        let per = self.allowance.per;
        let units = self.allowance.units as f64;
        let (spent, remaining) = match self.began {
            Some(b) if now < b + per => (self.spent, b + per - now),
            // Not begun, or over: a fresh period.
            _ => (0.0, per),
        };
        let left = (units - spent).max(0.0);
        if left <= 0.0 {
            return SPENT_RATE;
        }
        // Within the last second, the rest may go at the period's even
        // rate rather than all at once.
        let secs = remaining.as_secs_f64().max(per.as_secs_f64().min(1.0));
        (left / secs).max(SPENT_RATE)
    }

    /// When a period whose units are all spent ends: nothing goes before
    /// it, not even a first request's burst (`None` while units are left).
    pub(crate) fn spent_until(&self, now: Instant) -> Option<Instant> {
        let end = self.began? + self.allowance.per;
        (now < end && self.spent >= self.allowance.units as f64).then_some(end)
    }

    pub(crate) fn usage(&self, now: Instant) -> Option<AllowanceUse> {
        let began = self.began?;
        (now < began + self.allowance.per).then(|| AllowanceUse {
            elapsed: now - began,
            spent: self.spent,
        })
    }

    /// Takes up a period restored from the store.
    pub(crate) fn restore(&mut self, now: Instant, used: AllowanceUse) {
        if used.elapsed < self.allowance.per && used.spent.is_finite() && used.spent >= 0.0 {
            self.began = Some(now.checked_sub(used.elapsed).unwrap_or(now));
            self.spent = used.spent;
        }
        self.refresh(now);
    }

    pub(crate) fn snapshot(&self, now: Instant) -> AllowanceSnapshot {
        let per = self.allowance.per;
        let (spent, resets_in) = match self.began {
            Some(b) if now < b + per => (self.spent, b + per - now),
            _ => (0.0, per),
        };
        AllowanceSnapshot {
            allowance: self.allowance,
            spent,
            resets_in,
            rate_rps: self.rate(now),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    /// 3,600 per hour is 1 per second at its start; after half an hour
    /// idle, what is left goes at 2 per second; spent, it holds; the next
    /// period starts fresh where the last one ended.
    #[test]
    fn what_is_left_is_spread_over_what_remains() {
        let t = Instant::now();
        let mut a = AllowanceState::new(Allowance {
            units: 3600,
            per: HOUR,
        });
        assert!((a.rate(t) - 1.0).abs() < 1e-9);
        a.spend(t, 1.0);
        let half = t + HOUR / 2;
        assert!(
            (a.rate(half) - 3599.0 / 1800.0).abs() < 1e-6,
            "{}",
            a.rate(half)
        );
        a.spend(half, 3599.0);
        assert_eq!(a.rate(half), SPENT_RATE);
        let next = t + HOUR + Duration::from_secs(10);
        assert!((a.rate(next) - 1.0).abs() < 1e-9);
        a.spend(next, 5.0);
        let used = a.usage(next).unwrap();
        assert_eq!(used.spent, 5.0);
        assert_eq!(used.elapsed, Duration::from_secs(10));
        // Restored after a restart, the period goes on where it was.
        let later = next + Duration::from_secs(60);
        let mut b = AllowanceState::new(Allowance {
            units: 3600,
            per: HOUR,
        });
        b.restore(
            later,
            AllowanceUse {
                elapsed: Duration::from_secs(70),
                spent: 5.0,
            },
        );
        assert_eq!(b.snapshot(later).spent, 5.0);
        assert_eq!(b.snapshot(later).resets_in, HOUR - Duration::from_secs(70));
    }
}

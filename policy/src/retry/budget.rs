//! A ratio retry budget whose balance can be read.
//!
//! The algorithm is Linkerd's and tower's `TpsBudget`: every request
//! deposits, every retry withdraws, deposits expire after a TTL, and a
//! small reserve (`min_per_sec × ttl`) lets a quiet provider still retry.
//! It is written again here for two reasons: `TpsBudget` reads the
//! standard library's monotonic clock itself (so tokio's paused time cannot
//! drive it), and it has no accessor for its balance, which metrics and
//! breaker evidence need.

use std::time::Duration;

use tokio::time::Instant;

use crate::clock::Stamp;
use crate::window::Window;

const SLOTS: usize = 10;

/// One slot of time's requests and retries.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    deposits: u32,
    withdrawals: u32,
}

/// Retries allowed as a share of recent requests.
#[derive(Debug, Clone)]
pub struct RatioBudget {
    epoch: Stamp,
    /// The slots that counted something (a host asked once keeps one, not
    /// an array of `SLOTS`: R-PF1, issue 38).
    slots: Window<Slot, { SLOTS as u32 }>,
    /// A slot's length, milliseconds (at least one).
    slot_ms: u32,
    /// Retries a request earns.
    ratio: f64,
    /// Retries always allowed (`min_per_sec × ttl`, a count): a 32-bit
    /// float, and the slot's length in milliseconds, so that the budget
    /// and the rest of a provider's retry state fit jemalloc's 224-byte
    /// class, not 256 (R-PF1, issue 38).
    reserve: f32,
}

impl RatioBudget {
    /// `ratio` retries per request over `ttl`, plus `min_per_sec × ttl`.
    pub fn new(ratio: f64, min_per_sec: u32, ttl: Duration, now: Instant) -> Self {
        let slot_ms = (ttl / SLOTS as u32)
            .as_millis()
            .clamp(1, u128::from(u32::MAX));
        RatioBudget {
            epoch: now.into(),
            slots: Window::default(),
            slot_ms: slot_ms as u32,
            ratio,
            reserve: (f64::from(min_per_sec) * ttl.as_secs_f64()) as f32,
        }
    }

    /// The slot of time `now` falls in, counted from `epoch`.
    fn index(&self, now: Instant) -> u64 {
        (now.saturating_duration_since(self.epoch.at()).as_millis() / u128::from(self.slot_ms))
            as u64
    }

    /// A request was made.
    pub fn deposit(&mut self, now: Instant) {
        // A slot the window has passed (a clock read long before the last
        // count) earns nothing.
        if let Some(slot) = self.slots.at(self.index(now)) {
            slot.deposits = slot.deposits.saturating_add(1);
        }
    }

    /// Retries that may be made now.
    pub fn balance(&self, now: Instant) -> f64 {
        let live = self.slots.live(self.index(now));
        let (deposits, withdrawals) = live.fold((0u64, 0u64), |(d, w), s| {
            (d + u64::from(s.deposits), w + u64::from(s.withdrawals))
        });
        (f64::from(self.reserve) + self.ratio * deposits as f64 - withdrawals as f64).max(0.0)
    }

    /// Takes one retry from the budget, if there is one.
    pub fn withdraw(&mut self, now: Instant) -> bool {
        if self.balance(now) < 1.0 {
            return false;
        }
        match self.slots.at(self.index(now)) {
            Some(slot) => {
                slot.withdrawals = slot.withdrawals.saturating_add(1);
                true
            }
            // Not counted, not made.
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn twenty_percent_of_requests() {
        let t = Instant::now();
        let mut b = RatioBudget::new(0.2, 0, Duration::from_secs(10), t);
        assert!(!b.withdraw(t), "nothing deposited, no reserve");
        for _ in 0..10 {
            b.deposit(t);
        }
        assert_eq!(b.balance(t), 2.0);
        assert!(b.withdraw(t));
        assert!(b.withdraw(t));
        assert!(!b.withdraw(t));
    }

    #[test]
    fn deposits_expire_and_reserve_stays() {
        let t = Instant::now();
        let mut b = RatioBudget::new(0.2, 1, Duration::from_secs(10), t);
        for _ in 0..100 {
            b.deposit(t);
        }
        assert_eq!(b.balance(t), 30.0);
        assert_eq!(b.balance(t + Duration::from_secs(11)), 10.0);
    }
}

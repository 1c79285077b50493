//! Full-jitter backoff: `random(0, min(cap, base · 2^attempt))`.
//!
//! Without jitter, clients that failed together retry together, and the
//! retry wave is as sharp as the failure (AWS Architecture Blog,
//! "Exponential Backoff and Jitter": full jitter does the least work and
//! finishes soonest). The randomness is injectable so tests are exact.

use std::sync::Mutex;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

/// Where the jitter comes from.
#[derive(Debug)]
pub enum Jitter {
    /// The thread's generator, seeded from the operating system: nothing
    /// kept per provider (R-PF1, issue 38).
    Thread,
    /// A pseudo-random generator with a fixed seed (tests, simulations).
    Random(Box<Mutex<SmallRng>>),
    /// Always this share of the bound (0 = no wait, 1 = the whole bound).
    Fixed(f64),
}

impl Jitter {
    /// Random jitter seeded from the operating system.
    pub fn random() -> Self {
        Jitter::Thread
    }

    /// Random jitter with a fixed seed: repeatable.
    pub fn seeded(seed: u64) -> Self {
        Jitter::Random(Box::new(Mutex::new(SmallRng::seed_from_u64(seed))))
    }

    /// A share in `[0, 1)`.
    fn share(&self) -> f64 {
        match self {
            Jitter::Thread => rand::rng().random_range(0.0..1.0),
            Jitter::Random(rng) => rng
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .random_range(0.0..1.0),
            Jitter::Fixed(f) => f.clamp(0.0, 1.0),
        }
    }

    /// The delay before retry number `attempt` (0 = the first retry).
    pub fn delay(&self, base: Duration, cap: Duration, attempt: u32) -> Duration {
        let bound = base.saturating_mul(1u32 << attempt.min(20)).min(cap);
        bound.mul_f64(self.share())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: Duration = Duration::from_millis(100);
    const CAP: Duration = Duration::from_secs(1);

    #[test]
    fn bound_doubles_up_to_the_cap() {
        let j = Jitter::Fixed(1.0);
        assert_eq!(j.delay(BASE, CAP, 0), BASE);
        assert_eq!(j.delay(BASE, CAP, 1), BASE * 2);
        assert_eq!(j.delay(BASE, CAP, 3), BASE * 8);
        assert_eq!(j.delay(BASE, CAP, 4), CAP);
        assert_eq!(j.delay(BASE, CAP, 60), CAP);
        assert_eq!(Jitter::Fixed(0.0).delay(BASE, CAP, 3), Duration::ZERO);
    }

    #[test]
    fn random_stays_within_the_bound_and_spreads() {
        let j = Jitter::seeded(7);
        let delays: Vec<_> = (0..200).map(|_| j.delay(BASE, CAP, 2)).collect();
        assert!(delays.iter().all(|d| *d < BASE * 4));
        let low = delays.iter().filter(|d| **d < BASE * 2).count();
        assert!((60..140).contains(&low), "spread over the range: {low}");
    }
}

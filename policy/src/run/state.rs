//! A run's counters: attempts and units against the cap, retries against
//! the retry budget, and the cool-downs it waited out per provider
//! (R-RN1–R-RN3, R-RN8). Plain data behind the [`RunHandle`](super::RunHandle)'s lock.

use tokio::time::Instant;

use super::{Envelope, RunStopped, StopReason};

/// One cool-down of a provider that a run's requests wait out: a period
/// of an outage they are parked through, or one `Retry-After` hold.
/// However many of the run's requests wait it out, it counts as one wait
/// (R-RN8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cycle {
    /// One `breaker_open_for` of an outage its requests are parked
    /// through ([`crate::park`]): the outage's number, and which period of
    /// it.
    Outage {
        /// The outage's number.
        episode: u64,
        /// The period of it, from 0.
        period: u32,
    },
    /// The pacer's hold of this number.
    Hold(u64),
    /// The breaker's open period of this number, opened by the provider's
    /// throttles ([`crate::breaker::Breaker::opened_for_throttles`]).
    Breaker(u64),
}

/// What a run's request would meet at a provider: source pressure worth
/// waiting out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cooldown {
    /// How long until it ends.
    pub wait: std::time::Duration,
    /// The reason the provider's part of the run stops with if it cannot
    /// be waited out.
    pub reason: StopReason,
    /// Which cool-down it is.
    pub cycle: Cycle,
}

/// A run at one provider: its attempts there and its waits (R-RN8).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProviderWaits {
    /// Attempts of the run that left for this provider.
    pub attempts: u64,
    /// Cool-down cycles of this provider the run waited out, in all.
    pub waits: u64,
    /// Cool-down cycles waited out since the provider last answered
    /// soundly.
    pub cycles: u32,
    /// The cycle last counted: the run's other requests waiting out the
    /// same one do not count again.
    pub last: Option<Cycle>,
    /// This provider's part of the run stopped (source pressure), and why.
    pub stopped: Option<StopReason>,
}

/// A run's counters.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunState {
    /// The budgets.
    pub envelope: Envelope,
    /// Attempts that reached (or are on their way to) the provider.
    pub attempts: u64,
    /// The units those attempts cost (R-FS2): what the request cap counts.
    /// As many as attempts while every request costs 1.
    pub units: u64,
    /// Retries taken.
    pub retries: u64,
    /// Per provider: the cool-downs waited out and whether its part of the
    /// run stopped. A sound answer from one provider says nothing about
    /// another.
    pub providers: std::collections::BTreeMap<String, ProviderWaits>,
    /// Source-pressure cool-downs waited out in all (each counted once).
    pub waits_total: u64,
    /// Why the whole run stopped, once it has (a budget).
    pub stopped: Option<StopReason>,
    /// Units that left for the provider (see [`Departure::leave`](crate::attempt::Departure::leave)).
    pub departed: u64,
}

impl RunState {
    /// A run with these budgets.
    pub fn new(envelope: Envelope) -> Self {
        RunState {
            envelope,
            ..RunState::default()
        }
    }

    /// Checks the envelope before an attempt to `provider` starts at
    /// `now`, and counts it if it may go. A budget past its end stops the
    /// whole run; a provider whose part stopped refuses only its own
    /// attempts.
    pub fn check_attempt(&mut self, provider: &str, now: Instant) -> Result<(), RunStopped> {
        self.check_attempt_units(provider, now, 1)
    }

    /// Whether an attempt of one unit to `provider` at `now` would be
    /// refused, without counting anything.
    pub fn would_refuse(&self, provider: &str, now: Instant) -> bool {
        self.stopped.is_some()
            || self
                .providers
                .get(provider)
                .is_some_and(|p| p.stopped.is_some())
            || self.envelope.deadline.is_some_and(|d| now >= d)
            || self
                .envelope
                .request_cap
                .is_some_and(|cap| self.units >= cap)
    }

    /// [`RunState::check_attempt`] for an attempt costing `units` (R-FS2):
    /// the request cap counts units, and an attempt that would take the
    /// run past it is not made — the run stops at its cap.
    pub fn check_attempt_units(
        &mut self,
        provider: &str,
        now: Instant,
        units: u32,
    ) -> Result<(), RunStopped> {
        if let Some(reason) = self.stopped {
            return Err(RunStopped::run(reason));
        }
        if let Some(reason) = self.providers.get(provider).and_then(|p| p.stopped) {
            return Err(RunStopped::provider(reason, provider));
        }
        let reason = if self.envelope.deadline.is_some_and(|d| now >= d) {
            Some(StopReason::Deadline)
        } else if self
            .envelope
            .request_cap
            .is_some_and(|cap| self.units + u64::from(units.max(1)) > cap)
        {
            Some(StopReason::RequestCap)
        } else {
            None
        };
        if let Some(reason) = reason {
            self.stopped.get_or_insert(reason);
            return Err(RunStopped::run(reason));
        }
        self.attempts += 1;
        self.units += u64::from(units.max(1));
        self.providers
            .entry(provider.to_string())
            .or_default()
            .attempts += 1;
        Ok(())
    }

    /// The provider said an attempt cost `extra` units beyond its price
    /// (R-FS2): the run counts them; a cap they pass stops the next
    /// attempt.
    pub fn charge(&mut self, extra: u32) {
        self.units += u64::from(extra);
    }

    /// Whether the run may take one more retry.
    pub fn can_retry(&self) -> bool {
        let firsts = self.attempts.saturating_sub(self.retries);
        self.envelope
            .retry_budget
            .is_none_or(|budget| self.retries < budget)
            && self
                .envelope
                .retry_ratio
                .is_none_or(|r| (self.retries as f64) < (r * firsts as f64).ceil())
    }

    /// An attempt counted by [`check_attempt`](Self::check_attempt) never
    /// reached `provider` (sluice's own refusal): it does not count.
    pub fn release_attempt(&mut self, provider: &str) {
        self.release_attempt_units(provider, 1);
    }

    /// [`RunState::release_attempt`] for an attempt priced at `units`.
    pub fn release_attempt_units(&mut self, provider: &str, units: u32) {
        self.units = self.units.saturating_sub(u64::from(units.max(1)));
        self.attempts = self.attempts.saturating_sub(1);
        if let Some(p) = self.providers.get_mut(provider) {
            p.attempts = p.attempts.saturating_sub(1);
        }
    }

    /// `provider` answered without a failure: its cool-down cycles start
    /// over.
    pub fn reached(&mut self, provider: &str) {
        if let Some(p) = self.providers.get_mut(provider) {
            p.cycles = 0;
            p.last = None;
        }
    }

    /// A request is about to wait out `cooldown` at `provider`. The first
    /// request to wait out a cycle counts it; the others wait with it for
    /// free. `Err` once that would be more cycles in a row than the
    /// envelope allows: the provider's part of the run stops with the
    /// cool-down's reason (R-RN8's cycle guard); the rest of the run goes
    /// on.
    pub fn wait_for(&mut self, provider: &str, cooldown: &Cooldown) -> Result<(), RunStopped> {
        if let Some(r) = self.stopped {
            return Err(RunStopped::run(r));
        }
        let max = self.envelope.max_cooldown_waits;
        let p = self.providers.entry(provider.to_string()).or_default();
        if let Some(r) = p.stopped {
            return Err(RunStopped::provider(r, provider));
        }
        if p.last == Some(cooldown.cycle) {
            return Ok(());
        }
        if p.cycles >= max {
            p.stopped = Some(cooldown.reason);
            return Err(RunStopped::provider(cooldown.reason, provider));
        }
        p.cycles += 1;
        p.waits += 1;
        p.last = Some(cooldown.cycle);
        self.waits_total += 1;
        Ok(())
    }

    /// Stops `provider`'s part of the run with `reason` (source pressure
    /// seen from outside the stack: a command that failed because of
    /// it); the first reason is kept.
    pub fn stop_provider(&mut self, provider: &str, reason: StopReason) {
        self.providers
            .entry(provider.to_string())
            .or_default()
            .stopped
            .get_or_insert(reason);
    }

    /// Providers whose part of the run stopped, with why.
    pub fn stopped_providers(&self) -> impl Iterator<Item = (&str, StopReason)> {
        self.providers
            .iter()
            .filter_map(|(name, p)| p.stopped.map(|r| (name.as_str(), r)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn unbounded_by_default() {
        let t = Instant::now();
        let mut s = RunState::default();
        for i in 0..10_000 {
            assert!(s.check_attempt("p", t + Duration::from_secs(i)).is_ok());
        }
        assert!(s.can_retry());
    }

    #[test]
    fn retry_ratio_counts_first_attempts() {
        let t = Instant::now();
        let mut s = RunState::new(Envelope {
            retry_ratio: Some(0.2),
            ..Envelope::default()
        });
        assert!(!s.can_retry(), "nothing to retry yet");
        s.check_attempt("p", t).unwrap();
        assert!(s.can_retry(), "at least one retry once there is a first");
        s.check_attempt("p", t).unwrap();
        s.retries += 1;
        for _ in 0..9 {
            s.check_attempt("p", t).unwrap();
        }
        // 10 firsts, 1 retry: a second is within 0.2 × 10.
        assert!(s.can_retry());
        s.check_attempt("p", t).unwrap();
        s.retries += 1;
        assert!(!s.can_retry(), "2 retries of 10 firsts");
    }

    fn open(n: u64) -> Cooldown {
        Cooldown {
            wait: Duration::from_secs(5),
            reason: StopReason::CircuitOpen,
            cycle: Cycle::Outage {
                episode: 1,
                period: u32::try_from(n).unwrap(),
            },
        }
    }

    /// R-RN8: many requests waiting out one open period are one wait; a
    /// sound answer from another provider does not reset the count; the
    /// cycle guard stops only that provider's part of the run.
    #[test]
    fn waits_count_cycles_per_provider() {
        let mut s = RunState::new(Envelope {
            max_cooldown_waits: 2,
            ..Envelope::default()
        });
        for _ in 0..8 {
            assert!(
                s.wait_for("a", &open(1)).is_ok(),
                "one cycle, eight waiters"
            );
        }
        assert_eq!(s.providers["a"].cycles, 1);
        s.reached("b");
        assert!(s.wait_for("a", &open(2)).is_ok());
        assert_eq!(s.providers["a"].cycles, 2, "b's answer is not a's");
        s.reached("a");
        assert!(s.wait_for("a", &open(3)).is_ok());
        let hold = Cooldown {
            reason: StopReason::RetryAfter,
            cycle: Cycle::Hold(1),
            ..open(0)
        };
        assert!(s.wait_for("a", &hold).is_ok());
        let err = s.wait_for("a", &open(4)).unwrap_err();
        assert_eq!(err.reason, StopReason::CircuitOpen);
        assert_eq!(err.provider.as_deref(), Some("a"));
        assert!(err.reason.is_source_pressure());
        assert_eq!(s.stopped, None, "the run goes on");
        let now = Instant::now();
        assert_eq!(
            s.check_attempt("a", now).unwrap_err().provider.as_deref(),
            Some("a")
        );
        assert!(s.check_attempt("b", now).is_ok(), "other providers go on");
        assert_eq!(s.waits_total, 4);
        assert_eq!(
            s.stopped_providers().collect::<Vec<_>>(),
            [("a", StopReason::CircuitOpen)]
        );
    }

    /// R-FS2: the request cap counts units. A 10-unit attempt that would
    /// pass the cap is not made; one given back frees its units; what the
    /// provider says it charged beyond the price counts too.
    #[test]
    fn the_cap_counts_units() {
        let t = Instant::now();
        let mut s = RunState::new(Envelope {
            request_cap: Some(25),
            ..Envelope::default()
        });
        s.check_attempt_units("p", t, 10).unwrap();
        s.check_attempt_units("p", t, 10).unwrap();
        s.release_attempt_units("p", 10);
        assert_eq!((s.attempts, s.units), (1, 10));
        s.check_attempt_units("p", t, 10).unwrap();
        s.charge(4);
        assert_eq!(s.units, 24);
        s.check_attempt("p", t).unwrap();
        assert_eq!(
            s.check_attempt_units("p", t, 1).unwrap_err().reason,
            StopReason::RequestCap
        );
        assert_eq!((s.attempts, s.units), (3, 25));
    }

    #[test]
    fn cap_and_deadline() {
        let t = Instant::now();
        let mut s = RunState::new(Envelope {
            request_cap: Some(2),
            deadline: Some(t + Duration::from_secs(5)),
            ..Envelope::default()
        });
        assert!(s.check_attempt("p", t).is_ok());
        assert!(s.check_attempt("p", t).is_ok());
        assert_eq!(
            s.check_attempt("p", t).unwrap_err().reason,
            StopReason::RequestCap
        );
        assert_eq!(s.stopped, Some(StopReason::RequestCap));
        let mut s = RunState::new(Envelope {
            deadline: Some(t + Duration::from_secs(5)),
            ..Envelope::default()
        });
        assert!(s
            .check_attempt("p", t + Duration::from_millis(4999))
            .is_ok());
        assert_eq!(
            s.check_attempt("p", t + Duration::from_secs(5))
                .unwrap_err()
                .reason,
            StopReason::Deadline
        );
    }
}

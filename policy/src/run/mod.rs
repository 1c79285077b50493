//! A run's envelope: request cap, deadline and retry budget (R-RN1–R-RN3).
//!
//! A collector's run may carry budgets — "at most 10 000 requests", "stop
//! by 06:00", "at most 200 retries". Running out of one is a *planned*
//! stop: the collector hands the rest to its next run. It must never look
//! like provider pressure, or a scheduler would back off a healthy provider
//! and the learned rate would shrink for no reason. So:
//!
//! * stop reasons come in two disjoint sets, budget and source pressure
//!   ([`StopReason::is_source_pressure`]);
//! * the envelope is checked *before* an attempt starts, never during one:
//!   an attempt in flight completes (R-RN2);
//! * the check sits outside the breaker and pacer in the stack, so a budget
//!   refusal never touches their state (R-RN3).
//!
//! With nothing configured, the envelope is unbounded and behaviour is
//! unchanged. A run travels with each request as a [`RunHandle`] in the
//! request's extensions.

mod error;
mod layer;

use std::sync::{Arc, Mutex, MutexGuard};

use tokio::time::Instant;

pub use self::error::RunStopped;
pub use self::layer::{Pressure, RunGate, RunLayer};

/// Why a run stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StopReason {
    /// Budget: the request cap was reached.
    RequestCap,
    /// Budget: the wall-clock deadline passed.
    Deadline,
    /// Budget: the run's retry budget is spent.
    RetryBudget,
    /// Source pressure: the provider throttled.
    Throttled,
    /// Source pressure: the provider's circuit is open.
    CircuitOpen,
    /// Source pressure: the provider asked for a wait too long to absorb.
    RetryAfter,
    /// Source pressure: the provider failed.
    UpstreamError,
}

impl StopReason {
    /// Every reason, budget ones first.
    pub const ALL: [StopReason; 7] = [
        StopReason::RequestCap,
        StopReason::Deadline,
        StopReason::RetryBudget,
        StopReason::Throttled,
        StopReason::CircuitOpen,
        StopReason::RetryAfter,
        StopReason::UpstreamError,
    ];

    /// Whether the provider caused it (as opposed to a planned budget).
    pub fn is_source_pressure(self) -> bool {
        !self.is_budget()
    }

    /// Whether a budget ran out: a planned stop.
    pub fn is_budget(self) -> bool {
        matches!(
            self,
            StopReason::RequestCap | StopReason::Deadline | StopReason::RetryBudget
        )
    }

    /// The label used in `Proxy-Status` details, metrics and the store.
    pub fn label(self) -> &'static str {
        match self {
            StopReason::RequestCap => "request_cap",
            StopReason::Deadline => "deadline",
            StopReason::RetryBudget => "retry_budget",
            StopReason::Throttled => "throttled",
            StopReason::CircuitOpen => "circuit_open",
            StopReason::RetryAfter => "retry_after",
            StopReason::UpstreamError => "upstream_error",
        }
    }
}

/// The budgets of a run; `None` means unbounded.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Envelope {
    /// Attempts allowed, retries included.
    pub request_cap: Option<u64>,
    /// No attempt starts at or after this instant.
    pub deadline: Option<Instant>,
    /// Retries allowed in the run.
    pub retry_budget: Option<u64>,
    /// Retries allowed as a share of the run's first attempts (at least
    /// one retry once there is a first attempt).
    pub retry_ratio: Option<f64>,
    /// Consecutive waits for source pressure (an open circuit, a long
    /// `Retry-After` hold) a request may make before the run stops with a
    /// source-pressure reason (R-RN8). 0: no waiting.
    pub max_cooldown_waits: u32,
}

/// A run's counters.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunState {
    /// The budgets.
    pub envelope: Envelope,
    /// Attempts that reached (or are on their way to) the provider.
    pub attempts: u64,
    /// Retries taken.
    pub retries: u64,
    /// Source-pressure waits since the provider last answered without a
    /// failure.
    pub cooldown_waits: u32,
    /// Source-pressure waits in all.
    pub waits_total: u64,
    /// Why the run stopped, once it has.
    pub stopped: Option<StopReason>,
}

impl RunState {
    /// A run with these budgets.
    pub fn new(envelope: Envelope) -> Self {
        RunState {
            envelope,
            ..RunState::default()
        }
    }

    /// Checks the envelope before an attempt starts at `now`, and counts it
    /// if it may go.
    pub fn check_attempt(&mut self, now: Instant) -> Result<(), StopReason> {
        if let Some(reason) = self.stopped {
            return Err(reason);
        }
        let reason = if self.envelope.deadline.is_some_and(|d| now >= d) {
            Some(StopReason::Deadline)
        } else if self
            .envelope
            .request_cap
            .is_some_and(|cap| self.attempts >= cap)
        {
            Some(StopReason::RequestCap)
        } else {
            None
        };
        if let Some(reason) = reason {
            self.stopped.get_or_insert(reason);
            return Err(reason);
        }
        self.attempts += 1;
        Ok(())
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
    /// reached the provider (sluice's own refusal): it does not count.
    pub fn release_attempt(&mut self) {
        self.attempts = self.attempts.saturating_sub(1);
    }

    /// The provider answered without a failure: the source-pressure waits
    /// start over.
    pub fn reached(&mut self) {
        self.cooldown_waits = 0;
    }

    /// A request is about to wait out source pressure. `Err` with the
    /// reason once that would be more consecutive waits than the envelope
    /// allows: the run stops (R-RN8's cycle guard).
    pub fn wait_for(&mut self, reason: StopReason) -> Result<(), StopReason> {
        if let Some(r) = self.stopped {
            return Err(r);
        }
        if self.cooldown_waits >= self.envelope.max_cooldown_waits {
            self.stopped = Some(reason);
            return Err(reason);
        }
        self.cooldown_waits += 1;
        self.waits_total += 1;
        Ok(())
    }
}

/// A shared handle on a run, carried in request extensions.
#[derive(Debug, Clone)]
pub struct RunHandle(Arc<Mutex<RunState>>);

impl RunHandle {
    /// A new run with these budgets.
    pub fn new(envelope: Envelope) -> Self {
        RunHandle(Arc::new(Mutex::new(RunState::new(envelope))))
    }

    fn lock(&self) -> MutexGuard<'_, RunState> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `other` is a handle on the same run.
    pub fn same(&self, other: &RunHandle) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// A copy of the counters.
    pub fn state(&self) -> RunState {
        self.lock().clone()
    }

    /// See [`RunState::check_attempt`].
    pub fn check_attempt(&self, now: Instant) -> Result<(), StopReason> {
        self.lock().check_attempt(now)
    }

    /// See [`RunState::can_retry`].
    pub fn can_retry(&self) -> bool {
        self.lock().can_retry()
    }

    /// See [`RunState::release_attempt`].
    pub fn release_attempt(&self) {
        self.lock().release_attempt();
    }

    /// See [`RunState::reached`].
    pub fn reached(&self) {
        self.lock().reached();
    }

    /// See [`RunState::wait_for`].
    pub fn wait_for(&self, reason: StopReason) -> Result<(), StopReason> {
        self.lock().wait_for(reason)
    }

    /// The run's deadline, if any.
    pub fn deadline(&self) -> Option<Instant> {
        self.lock().envelope.deadline
    }

    pub(crate) fn take_retry(&self) {
        self.lock().retries += 1;
    }

    /// The run's retry budget ran out: the run stops, planned.
    pub(crate) fn retry_budget_exhausted(&self) {
        self.lock().stopped.get_or_insert(StopReason::RetryBudget);
    }

    /// Stops the run (a deadline passed with no request to see it, or the
    /// proxy saw source pressure). The first reason is kept; every later
    /// attempt is refused with it.
    pub fn stop(&self, reason: StopReason) {
        self.lock().stopped.get_or_insert(reason);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_two_sets_are_disjoint_and_cover_all() {
        for r in StopReason::ALL {
            assert_ne!(r.is_budget(), r.is_source_pressure(), "{r:?}");
        }
        let budget: Vec<_> = StopReason::ALL.iter().filter(|r| r.is_budget()).collect();
        assert_eq!(budget.len(), 3);
    }

    #[test]
    fn unbounded_by_default() {
        let t = Instant::now();
        let mut s = RunState::default();
        for i in 0..10_000 {
            assert!(s.check_attempt(t + Duration::from_secs(i)).is_ok());
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
        s.check_attempt(t).unwrap();
        assert!(s.can_retry(), "at least one retry once there is a first");
        s.check_attempt(t).unwrap();
        s.retries += 1;
        for _ in 0..9 {
            s.check_attempt(t).unwrap();
        }
        // 10 firsts, 1 retry: a second is within 0.2 × 10.
        assert!(s.can_retry());
        s.check_attempt(t).unwrap();
        s.retries += 1;
        assert!(!s.can_retry(), "2 retries of 10 firsts");
    }

    #[test]
    fn waits_are_bounded_in_a_row_and_reset_by_an_attempt() {
        let mut s = RunState::new(Envelope {
            max_cooldown_waits: 2,
            ..Envelope::default()
        });
        assert!(s.wait_for(StopReason::CircuitOpen).is_ok());
        assert!(s.wait_for(StopReason::CircuitOpen).is_ok());
        s.reached();
        assert!(s.wait_for(StopReason::CircuitOpen).is_ok());
        assert!(s.wait_for(StopReason::RetryAfter).is_ok());
        assert_eq!(
            s.wait_for(StopReason::RetryAfter),
            Err(StopReason::RetryAfter)
        );
        assert_eq!(s.stopped, Some(StopReason::RetryAfter));
        assert!(s.stopped.unwrap().is_source_pressure());
        assert_eq!(s.check_attempt(Instant::now()), Err(StopReason::RetryAfter));
        assert_eq!(s.waits_total, 4);
    }

    #[test]
    fn cap_and_deadline() {
        let t = Instant::now();
        let mut s = RunState::new(Envelope {
            request_cap: Some(2),
            deadline: Some(t + Duration::from_secs(5)),
            ..Envelope::default()
        });
        assert!(s.check_attempt(t).is_ok());
        assert!(s.check_attempt(t).is_ok());
        assert_eq!(s.check_attempt(t), Err(StopReason::RequestCap));
        assert_eq!(s.stopped, Some(StopReason::RequestCap));
        let mut s = RunState::new(Envelope {
            deadline: Some(t + Duration::from_secs(5)),
            ..Envelope::default()
        });
        assert!(s.check_attempt(t + Duration::from_millis(4999)).is_ok());
        assert_eq!(
            s.check_attempt(t + Duration::from_secs(5)),
            Err(StopReason::Deadline)
        );
    }
}

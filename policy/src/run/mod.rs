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
//! * source pressure is waited out per cool-down cycle and per provider
//!   (R-RN8): every request of the run that waits out the same open
//!   period or hold counts as one wait, and a provider that keeps
//!   re-opening stops only its own part of the run.
//!
//! With nothing configured, the envelope is unbounded and behaviour is
//! unchanged. A run travels with each request as a [`RunHandle`] in its
//! [`Attempt`](crate::attempt::Attempt). The deadline is the gate's: the
//! pacer below only refuses a slot at or past the instant the request may
//! not wait past, and the gate turns that into the run's stop.

mod error;
mod layer;

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use tokio::time::Instant;

pub use self::error::RunStopped;
pub use self::layer::{Pressure, RunGate, RunLayer};

/// Makes a run's reservation durable up to this many units (the proxy
/// writes the run's record and flushes it). What a restart charges the run
/// is its reservation (R-RN10): never less than what left, at most a block
/// more.
pub type Reserve =
    Arc<dyn Fn(u64) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// A run's durable reservation: attempts leave only within it, and it
/// grows a block at a time.
struct Reservation {
    reserve: Reserve,
    /// Units reserved per write: `max(1, cap / 100)`, at most 16 — a
    /// restart over-counts by less than a block (R-RN10: at most
    /// `max(1, 5 % of the cap)`), and a write (a flush) is made once a
    /// block.
    block: u64,
    /// The reservation asked for so far.
    asked: Mutex<u64>,
    /// The reservation known durable.
    durable: tokio::sync::watch::Sender<u64>,
}

impl std::fmt::Debug for Reservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservation")
            .field("block", &self.block)
            .field("durable", &*self.durable.borrow())
            .finish_non_exhaustive()
    }
}

/// Units reserved per durable write for a run with this cap (see
/// [`RunHandle::reserving`]).
pub fn reservation_block(cap: Option<u64>) -> u64 {
    cap.map_or(32, |c| (c / 100).clamp(1, 16))
}

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
    /// Cool-down cycles of one provider (`breaker_open_for` of an outage,
    /// a long `Retry-After` hold) the run may wait out in a row before that
    /// provider's part of it stops with a source-pressure reason (R-RN8).
    /// 0: no waiting.
    pub max_cooldown_waits: u32,
}

/// One cool-down of a provider that a run's requests wait out: a period
/// of an outage they are parked through, or one `Retry-After` hold. However many of the run's requests wait it out, it
/// counts as one wait (R-RN8).
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
    /// Units that left for the provider (see [`Departure::leave`]).
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

/// A shared handle on a run, carried by its requests' [`Attempt`](crate::attempt::Attempt).
#[derive(Debug, Clone)]
pub struct RunHandle(Arc<RunShared>);

#[derive(Debug)]
struct RunShared {
    state: Mutex<RunState>,
    reservation: OnceLock<Reservation>,
}

impl RunHandle {
    /// A new run with these budgets.
    pub fn new(envelope: Envelope) -> Self {
        RunHandle::resume(RunState::new(envelope))
    }

    /// A run that goes on from these counters (restored after a restart,
    /// R-RN10).
    pub fn resume(state: RunState) -> Self {
        RunHandle(Arc::new(RunShared {
            state: Mutex::new(state),
            reservation: OnceLock::new(),
        }))
    }

    /// From now on, attempts leave only within a durable reservation of
    /// units, made by `reserve` a block at a time
    /// ([`reservation_block`] of the cap); `durable` is what is reserved
    /// on disk already.
    pub fn reserving(&self, reserve: Reserve, durable: u64) {
        let block = reservation_block(self.lock().envelope.request_cap);
        let _ = self.0.reservation.set(Reservation {
            reserve,
            block,
            asked: Mutex::new(durable),
            durable: tokio::sync::watch::Sender::new(durable),
        });
    }

    /// The reservation asked for (at least what is durable), if the run
    /// keeps one: what its record says was reserved.
    pub fn reserved(&self) -> Option<u64> {
        let r = self.0.reservation.get()?;
        Some(*r.asked.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// An attempt of `units` leaves: counted as departed, and, past the
    /// reservation, the next block is reserved and waited for.
    pub(crate) async fn departing(&self, units: u32) {
        let need = {
            let mut s = self.lock();
            s.departed += u64::from(units.max(1));
            s.departed
        };
        let Some(r) = self.0.reservation.get() else {
            return;
        };
        let ask = {
            let mut asked = r.asked.lock().unwrap_or_else(|p| p.into_inner());
            (need > *asked).then(|| {
                *asked = need + r.block - 1;
                *asked
            })
        };
        if let Some(target) = ask {
            // Spawned: a client that goes away meanwhile must not leave
            // the others waiting on a write nobody makes.
            let (reserve, durable) = (r.reserve.clone(), r.durable.clone());
            tokio::spawn(async move {
                reserve(target).await;
                durable.send_if_modified(|d| {
                    let moved = target > *d;
                    *d = (*d).max(target);
                    moved
                });
            });
        }
        let mut durable = r.durable.subscribe();
        let _ = durable.wait_for(|d| *d >= need).await;
    }

    fn lock(&self) -> MutexGuard<'_, RunState> {
        self.0.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `other` is a handle on the same run.
    pub fn same(&self, other: &RunHandle) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// A copy of the counters.
    pub fn state(&self) -> RunState {
        self.lock().clone()
    }

    /// Attempts counted so far (without copying the whole state: asked on
    /// every request).
    pub fn attempts(&self) -> u64 {
        self.lock().attempts
    }

    /// Units counted so far (R-FS2): what the request cap counts.
    pub fn units(&self) -> u64 {
        self.lock().units
    }

    /// Why the whole run stopped, if it has.
    pub fn stopped(&self) -> Option<StopReason> {
        self.lock().stopped
    }

    /// What the run has left at `now`: units under its cap and time
    /// before its deadline (`None` where it has no such budget), and why
    /// it stopped, if it has.
    pub fn remaining(
        &self,
        now: Instant,
    ) -> (Option<u64>, Option<std::time::Duration>, Option<StopReason>) {
        let s = self.lock();
        (
            s.envelope
                .request_cap
                .map(|cap| cap.saturating_sub(s.units)),
            s.envelope
                .deadline
                .map(|d| d.saturating_duration_since(now)),
            s.stopped,
        )
    }

    /// See [`RunState::check_attempt`].
    pub fn check_attempt(&self, provider: &str, now: Instant) -> Result<(), RunStopped> {
        self.lock().check_attempt(provider, now)
    }

    /// See [`RunState::would_refuse`].
    pub fn would_refuse(&self, provider: &str, now: Instant) -> bool {
        self.lock().would_refuse(provider, now)
    }

    /// See [`RunState::can_retry`].
    pub fn can_retry(&self) -> bool {
        self.lock().can_retry()
    }

    /// See [`RunState::check_attempt_units`].
    pub fn check_attempt_units(
        &self,
        provider: &str,
        now: Instant,
        units: u32,
    ) -> Result<(), RunStopped> {
        self.lock().check_attempt_units(provider, now, units)
    }

    /// See [`RunState::release_attempt`].
    pub fn release_attempt(&self, provider: &str) {
        self.lock().release_attempt(provider);
    }

    /// See [`RunState::release_attempt_units`].
    pub fn release_attempt_units(&self, provider: &str, units: u32) {
        self.lock().release_attempt_units(provider, units);
    }

    /// See [`RunState::charge`].
    pub fn charge(&self, extra: u32) {
        self.lock().charge(extra);
    }

    /// See [`RunState::reached`].
    pub fn reached(&self, provider: &str) {
        self.lock().reached(provider);
    }

    /// See [`RunState::stop_provider`].
    pub fn stop_provider(&self, provider: &str, reason: StopReason) {
        self.lock().stop_provider(provider, reason);
    }

    /// A request of the run is parked through `provider`'s outage number
    /// `episode`, in its period `period` (one `breaker_open_for` each),
    /// which ends in `wait`: one cool-down cycle of R-RN8's guard, counted
    /// once however many wait it out. `Err` once the guard trips: the
    /// provider's part stops with `circuit_open` if its breaker is open,
    /// else `upstream_error`.
    pub fn wait_out_outage(
        &self,
        provider: &str,
        (episode, period): (u64, u32),
        wait: std::time::Duration,
        breaker_open: bool,
    ) -> Result<(), RunStopped> {
        let reason = if breaker_open {
            StopReason::CircuitOpen
        } else {
            StopReason::UpstreamError
        };
        self.wait_for(
            provider,
            &Cooldown {
                wait,
                reason,
                cycle: Cycle::Outage { episode, period },
            },
        )
    }

    /// See [`RunState::wait_for`].
    pub fn wait_for(&self, provider: &str, cooldown: &Cooldown) -> Result<(), RunStopped> {
        self.lock().wait_for(provider, cooldown)
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

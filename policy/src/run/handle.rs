//! The handle a run's requests share, and the durable reservation its
//! attempts leave within (R-RN10).

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use tokio::time::Instant;

use super::{Cooldown, Cycle, Envelope, RunState, RunStopped, StopReason};

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

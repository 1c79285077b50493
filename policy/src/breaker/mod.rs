//! The circuit breaker: stop sending to a provider that is failing, and
//! find out cheaply when it has recovered.
//!
//! Pacing protects a provider from us; the breaker protects everyone from a
//! provider that is down. Over a sliding window it counts failures and
//! throttles; past a share of them — and only once a minimum number of
//! calls was seen, so a cold start cannot trip it on two bad answers — it
//! opens, and calls fail at once with the time until it will try again.
//! After the reset timeout a bounded number of probes go through: enough
//! successes close it, one failure opens it again (R-CB1).
//!
//! Every transition is returned as a [`Transition`] value and handed to
//! the provider's evidence sink, which the proxy sends to metrics, the log,
//! the admin API and the store (R-CB2). Evidence carries only states,
//! reasons and counters — never a URL, header, body or credential.
//!
//! One [`BreakerShared`] per provider in an `Arc`; clones of the service
//! share it.

mod error;
mod layer;
mod service;
pub mod state;

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::time::Instant;

pub use self::error::CircuitOpen;
pub use self::layer::BreakerLayer;
pub use self::service::Breaker as BreakerService;
pub use self::state::{Breaker, BreakerSnapshot, Permit, Reason, State, Transition};
use crate::classify::{Outcome, Signal};
use crate::settings::{ProviderSettings, ValidSettings};

/// What holds a breaker: a provider's policy, whose one allocation holds
/// every part of it (R-PF1, issue 38). The layer and its permits keep the
/// holder; each call that publishes a transition is handed it, for the
/// evidence's retry budget and for where transitions go — read through
/// the holder, not pointed to from the breaker (32 bytes a provider).
pub trait HasBreaker: Send + Sync + 'static {
    /// The breaker.
    fn breaker(&self) -> &BreakerShared;
    /// Whole retries left in the provider's budget at `at`, for the
    /// evidence (R-CB2).
    fn retry_budget_left(&self, at: Instant) -> Option<u32>;
    /// Where transitions are published (metrics, log, admin API, store),
    /// if anywhere.
    fn transitions(&self) -> Option<&dyn TransitionObserver>;
}

/// What takes a breaker's transitions: a closure, or a value that takes
/// the provider's events too ([`crate::events::EventObserver`]).
pub trait TransitionObserver: Send + Sync {
    /// Takes one transition.
    fn transition(&self, transition: &Transition);
}

impl<F: Fn(&Transition) + Send + Sync> TransitionObserver for F {
    fn transition(&self, transition: &Transition) {
        self(transition);
    }
}

/// Where transitions are published (metrics, log, admin API, store).
pub type TransitionSink = Arc<dyn TransitionObserver>;

/// How many recent transitions are kept in memory for the readout.
pub const RECENT_TRANSITIONS: usize = 32;

/// The breaker of one provider, shared by all its services.
pub struct BreakerShared {
    breaker: Mutex<Breaker>,
}

/// How long a refused request may wait for the half-open probe's verdict,
/// if `settings` let it wait at all.
fn wait_for_probe(settings: &ProviderSettings) -> Option<std::time::Duration> {
    settings
        .breaker_wait_for_probe
        .then_some(settings.max_queue_wait)
}

impl fmt::Debug for BreakerShared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BreakerShared")
            .field("breaker", &self.breaker)
            .finish()
    }
}

impl BreakerShared {
    /// A closed breaker: a part of the provider's one allocation
    /// ([`crate::provider`]), which is its [`HasBreaker`].
    pub fn new(settings: &Arc<ValidSettings>) -> Self {
        BreakerShared {
            breaker: Mutex::new(Breaker::new(settings.clone(), crate::clock::now())),
        }
    }

    /// Locks the state machine (a poisoned lock is recovered: plain data).
    pub fn lock(&self) -> MutexGuard<'_, Breaker> {
        self.breaker.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies new settings; state is kept.
    pub fn update_settings(&self, settings: &Arc<ValidSettings>) {
        self.lock().update_settings(settings);
    }

    /// How long a refused request may wait for the half-open probe (read
    /// only once the breaker refused one: off the hot path).
    pub(crate) fn wait_for_probe(&self) -> Option<std::time::Duration> {
        wait_for_probe(self.lock().settings())
    }

    /// Closes `holder`'s breaker because the provider's config changed
    /// (see [`Breaker::clear`]), publishing the transition: whether it was
    /// not closed.
    pub fn clear(holder: &dyn HasBreaker, now: Instant) -> bool {
        let t = holder.breaker().lock().clear(now);
        let cleared = t.is_some();
        if let Some(t) = t {
            Self::publish(holder, t);
        }
        cleared
    }

    /// Completes a transition of `holder`'s breaker's evidence and
    /// publishes it.
    pub fn publish(holder: &dyn HasBreaker, mut t: Transition) {
        t.retry_budget_left = holder.retry_budget_left(t.at);
        if let Some(sink) = holder.transitions() {
            sink.transition(&t);
        }
        // Taken after the sink, never while the state is locked (every
        // caller has let it go): the transitions kept are the state's.
        holder.breaker().lock().remember(t);
    }

    /// The most recent transitions, oldest first.
    pub fn recent(&self) -> Vec<Transition> {
        self.lock().recent().to_vec()
    }

    /// Asks `holder`'s breaker for a permit now, publishing the Open →
    /// HalfOpen transition if the reset timeout has passed. `Err` says how
    /// long until a probe may go, and which open period this is.
    pub fn acquire<P: HasBreaker>(holder: &Arc<P>) -> Result<CallPermit, CircuitOpen> {
        let (permit, transition, cycle, throttled) = {
            let mut b = holder.breaker().lock();
            let (permit, transition) = b.try_acquire(crate::clock::now());
            (permit, transition, b.cycle(), b.opened_for_throttles())
        };
        if let Some(t) = transition {
            Self::publish(&**holder, t);
        }
        match permit {
            Ok(permit) => Ok(CallPermit {
                shared: holder.clone(),
                permit: Some(permit),
            }),
            Err(retry_after) => Err(CircuitOpen {
                retry_after,
                cycle,
                throttled,
            }),
        }
    }

    /// A permit from `holder`'s breaker for the probe of parked requests
    /// ([`Permit::Parked`]): never refused.
    pub fn acquire_parked<P: HasBreaker>(holder: &Arc<P>) -> CallPermit {
        let (permit, transition) = holder.breaker().lock().acquire_parked(crate::clock::now());
        if let Some(t) = transition {
            Self::publish(&**holder, t);
        }
        CallPermit {
            shared: holder.clone(),
            permit: Some(permit),
        }
    }

    /// The state of `holder`'s breaker now (moving Open → HalfOpen if
    /// due, and publishing that).
    pub fn state(holder: &dyn HasBreaker) -> State {
        let (state, t) = {
            let mut b = holder.breaker().lock();
            let t = b.tick(crate::clock::now());
            (b.state(), t)
        };
        if let Some(t) = t {
            Self::publish(holder, t);
        }
        state
    }

    /// Whether it last opened for the provider's throttles, not its
    /// failures (see [`Breaker::opened_for_throttles`]).
    pub fn opened_for_throttles(&self) -> bool {
        self.lock().opened_for_throttles()
    }

    /// The open period the breaker is in or last was in (see
    /// [`Breaker::cycle`]).
    pub fn cycle(&self) -> u64 {
        self.lock().cycle()
    }

    /// A readout of `holder`'s breaker at `now` (moving Open → HalfOpen
    /// if due, and publishing that).
    pub fn snapshot(holder: &dyn HasBreaker, now: Instant) -> BreakerSnapshot {
        let (snap, t) = {
            let mut b = holder.breaker().lock();
            let t = b.tick(now);
            (b.snapshot(now), t)
        };
        if let Some(t) = t {
            Self::publish(holder, t);
        }
        snap
    }
}

/// A call the breaker let through. [`CallPermit::finish`] records how it
/// went; dropped without a verdict (refused further down, or its client
/// went away) it counts for nothing and gives a half-open probe slot back.
pub struct CallPermit {
    /// What holds the breaker.
    shared: Arc<dyn HasBreaker>,
    permit: Option<Permit>,
}

impl fmt::Debug for CallPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallPermit")
            .field("permit", &self.permit)
            .finish()
    }
}

impl CallPermit {
    /// Records the call: `Some(true)` a failure or throttle, `Some(false)`
    /// a success, `None` nothing (it never reached the provider).
    pub fn finish(mut self, failure: Option<bool>) {
        self.complete(failure.map(|f| (f, false)));
    }

    /// Records the call by its outcome (`None`: it never reached the
    /// provider): a failure, and whether it was a throttle.
    pub fn finish_outcome(mut self, outcome: Option<Outcome>) {
        self.complete(outcome.map(|o| {
            (
                o.is_breaker_failure(),
                matches!(o.signal(), Signal::Throttle { .. }),
            )
        }));
    }

    fn complete(&mut self, failure: Option<(bool, bool)>) {
        let Some(permit) = self.permit.take() else {
            return;
        };
        let transition = {
            let mut b = self.shared.breaker().lock();
            match failure {
                Some((f, throttle)) => b.record(permit, f, throttle, crate::clock::now()),
                None => {
                    b.release(permit);
                    None
                }
            }
        };
        if let Some(t) = transition {
            BreakerShared::publish(&*self.shared, t);
        }
    }
}

impl Drop for CallPermit {
    fn drop(&mut self) {
        self.complete(None);
    }
}

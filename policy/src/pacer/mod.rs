//! Pacing: GCRA at a rate learned by AIMD, a `Retry-After` hold, and a FIFO
//! waiting room with a bounded wait.
//!
//! Why a pacer and not a retry loop: a collector that only backs off after
//! a 429 has already spent the provider's patience. The pacer spaces
//! requests *before* they are sent, at a rate it learns from the provider's
//! answers ([`aimd`], which tells a throttle from noise with [`signals`]),
//! with GCRA's exact spacing ([`gcra`]). A provider's
//! `Retry-After` holds every request — queued ones included — until the
//! instant it named, and nothing later (R-RA1). A request that could not be
//! sent within `max_queue_wait` is refused at once with the wait it would
//! have had, rather than held until its client gives up (R-GC2).
//!
//! One [`PacerShared`] per provider, in an `Arc`: every clone of the
//! [`Pacer`] service, and every layer built from one [`PacerLayer`], shares
//! it. Cloning does not create a new rate.

pub mod aimd;
pub mod allowance;
pub mod core;
mod error;
pub mod fair;
pub mod gcra;
mod layer;
mod service;
pub mod shared;
pub mod signals;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use std::time::Duration;

use once_cell::race::OnceBox;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use tokio::sync::Notify;
use tokio::time::Instant;

pub use self::aimd::{Backoff, BackoffReason, Belief, Condition, LimitKnown};
pub use self::allowance::{Allowance, AllowanceSnapshot, AllowanceUse};
pub use self::core::{
    Admission, AloneStart, Feedback, HoldCause, PacerCore, PacerSnapshot, QuotaSnapshot, Refusal,
};
pub use self::error::RateLimited;
pub use self::fair::{Class, Lane, Ticket};
pub use self::layer::PacerLayer;
pub use self::service::{Pacer, ResponseFuture};
pub use self::shared::{Proposal, Seat, SharedAdmit, SharedBudget, SharedChange, SharedView};
use crate::classify::Outcome;
use crate::error::Cause;
use crate::events::{emit, Event, Observer, ObserverSink};
use crate::quota::{Advertised, Malformed};
use crate::settings::{ProviderSettings, ValidSettings};

/// How late a replica may take a shared slot without the schedule losing
/// it (and never more than half an interval): the next slot is spaced from
/// the one due, not from when it was taken (the store's GCRA, like
/// [`gcra::Gcra::admit_waited`]). Wider than one process's wake-up slack:
/// a shared slot is taken after a sleep, a Redis round trip and the race
/// with the other replicas, each late by a few milliseconds on a busy host.
pub const SHARED_SLACK: Duration = Duration::from_millis(25);

/// The random spread of replicas' wake-ups for one shared slot, within
/// [`SHARED_SLACK`].
const SHARED_SPREAD: Duration = Duration::from_millis(2);

/// The pacer state of one provider, shared by all its services.
pub struct PacerShared {
    /// The decision state; held only for short, non-blocking sections.
    core: Mutex<PacerCore>,
    /// Where waiting requests are woken from. Made by the first request
    /// that has to wait (most providers' never do: issues 24 and 38).
    room: OnceBox<Room>,
    /// Where the provider's events go — and its breaker's transitions:
    /// the provider's one observer, read by its other parts through the
    /// policy ([`crate::provider`]).
    observer: Option<ObserverSink>,
    /// What a shared budget needs (the budget, the turn its requests
    /// take, the spread of their wake-ups), made when one is first set or
    /// seeded (R-DS1; most providers never have one: issue 38).
    fleet: OnceBox<Fleet>,
}

/// Where a provider's waiting requests are woken from. It stays once made:
/// 88 bytes and, while anyone waits, the waiters' table (a `watch` channel
/// in its place held 336 bytes more, and the emptied table 84, for the
/// provider's life — a crawl's host whose one request was retried after a
/// `429` kept them all: R-PF1, issue 38).
struct Room {
    /// Notified when a hold or a rate change may move every waiter's slot:
    /// each waiter makes its `notified()` before it reads its slot, so a
    /// change after the read still wakes it.
    changed: Notify,
    /// One wake-up per waiter: when the head leaves, only the new head is
    /// woken (not the whole queue — no thundering herd on each admission).
    /// Its table is let go when the last waiter leaves.
    waiters: Mutex<HashMap<Ticket, Arc<Notify>>>,
}

impl Room {
    fn waiters(&self) -> MutexGuard<'_, HashMap<Ticket, Arc<Notify>>> {
        self.waiters.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What holds a pacer: a provider's policy, whose one allocation holds
/// every part of it (R-PF1, issue 38). The layer keeps the holder, as the
/// timeouts keep theirs ([`crate::timeout`]).
pub trait HasPacer: Send + Sync + 'static {
    /// The pacer.
    fn pacer(&self) -> &PacerShared;
}

impl PacerShared {
    /// A cold pacer for these settings, on its own.
    pub fn new(settings: &ProviderSettings) -> Arc<Self> {
        Arc::new(PacerShared::with_observer(
            &ValidSettings::as_given(settings),
            None,
        ))
    }

    /// A cold pacer for a provider's settings, reporting to `observer`: a
    /// part of the provider's one allocation ([`crate::provider`]).
    pub fn with_observer(settings: &Arc<ValidSettings>, observer: Option<ObserverSink>) -> Self {
        PacerShared {
            core: Mutex::new(PacerCore::with_settings(settings.clone())),
            room: OnceBox::new(),
            observer,
            fleet: OnceBox::new(),
        }
    }

    /// Where the provider's events and transitions go, if anywhere.
    pub fn observer(&self) -> Option<&dyn Observer> {
        self.observer.as_deref()
    }

    /// Draws the spread of this replica's shared wake-ups from `seed` on,
    /// not from the operating system: a simulated fleet then gives the
    /// same figures on every run.
    pub fn seed_spread(&self, seed: u64) {
        self.fleet()
            .spread_seed
            .store(seed.max(1), Ordering::Relaxed);
    }

    /// A share in `[0, 1)` of [`SHARED_SPREAD`].
    fn spread_share(&self) -> f64 {
        let Some(fleet) = self
            .fleet
            .get()
            .filter(|f| f.spread_seed.load(Ordering::Relaxed) != 0)
        else {
            return rand::rng().random_range(0.0..1.0);
        };
        let seed = fleet.spread_seed.fetch_add(1, Ordering::Relaxed);
        SmallRng::seed_from_u64(seed).random_range(0.0..1.0)
    }

    /// Feeds back an attempt's outcome (see [`PacerCore::on_outcome`]),
    /// wakes waiters if their slots moved, and reports what happened: an
    /// answer without quota headers or extra charge.
    pub fn feedback(&self, outcome: Option<Outcome>, sent_at: Instant, ttfb: Option<Duration>) {
        self.answered(outcome, sent_at, ttfb, 0, None, None);
    }

    /// Shares the budget with other replicas through `budget` (R-DS1), or
    /// stops sharing it (`None`).
    pub fn set_budget(&self, budget: Option<Arc<dyn SharedBudget>>) {
        if budget.is_none() && self.fleet.get().is_none() {
            return;
        }
        *self
            .fleet()
            .budget
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = budget;
    }

    fn budget(&self) -> Option<Arc<dyn SharedBudget>> {
        self.fleet
            .get()?
            .budget
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Feeds back an answered attempt in one call: its outcome (see
    /// [`PacerCore::on_outcome`]), then the units the provider charged
    /// beyond the price (R-FS2), then the quota its headers advertise
    /// (R-SG1; malformed headers are counted and ignored), then the tokens
    /// budget an LLM provider tells beside it (R-PD1) — under one lock,
    /// with one clock reading; wakes waiters if their slots moved and
    /// reports what happened.
    pub fn answered(
        &self,
        outcome: Option<Outcome>,
        sent_at: Instant,
        ttfb: Option<Duration>,
        extra: u32,
        quota: Option<Result<Option<Advertised>, Malformed>>,
        tokens: Option<Advertised>,
    ) {
        emit(self.observer(), Event::Attempt { outcome, ttfb });
        let advertised = match quota {
            None => None,
            Some(Ok(a)) => Some(a),
            Some(Err(Malformed(family))) => {
                emit(self.observer(), Event::QuotaMalformed(family));
                Some(None)
            }
        };
        let now = crate::clock::now();
        let (on_outcome, on_quota, on_tokens) = {
            let mut core = self.lock();
            let o = outcome.map(|o| core.on_outcome(&o, sent_at, ttfb, now));
            if extra > 0 {
                core.charge(now, extra);
            }
            let q = advertised.map(|a| core.on_quota(a, sent_at, now));
            let t = tokens.map(|t| core.on_tokens(t, now));
            (o, q, t)
        };
        for fb in [on_outcome, on_quota, on_tokens].into_iter().flatten() {
            self.share(&fb, sent_at);
            self.announce(fb, now);
        }
    }

    /// Reports what this replica learned to the shared budget: a cut (once
    /// per congestion epoch there), a raise, a hold.
    fn share(&self, fb: &Feedback, sent_at: Instant) {
        let Some(budget) = self.budget() else {
            return;
        };
        let (rate, raise, limit, every, alone) = {
            let core = self.lock();
            let (rate, limit) = core.learned();
            (
                rate,
                core.fleet_raise(),
                limit,
                core.increase_window(),
                core.alone(),
            )
        };
        // A quota's refill hold is this replica's own pacing; the others
        // are every replica's, and only a refusal's counts as one.
        match (fb.hold_until, fb.hold_cause) {
            (Some(_), HoldCause::Refill) | (None, _) => {}
            (Some(until), cause) => budget.report(SharedChange::Hold {
                until,
                refused: cause == HoldCause::Refused,
            }),
        }
        if fb.backoff.is_some() {
            budget.report(SharedChange::Cut {
                sent_at,
                rate,
                limit,
            });
        } else if fb.increased && !alone {
            // Pacing alone, a replica's windows say nothing of the fleet's
            // rate: it never raises it (R-DS2).
            budget.report(SharedChange::Raise {
                rate: raise,
                limit,
                every,
            });
        }
    }

    /// Wakes waiters if their slots moved and reports a hold or a cut.
    fn announce(&self, fb: Feedback, now: Instant) {
        if fb.changed() {
            self.notify();
        }
        if let Some(until) = fb.hold_until {
            emit(
                self.observer(),
                Event::Hold(until.saturating_duration_since(now)),
            );
        }
        if let Some(b) = fb.backoff {
            emit(self.observer(), Event::Backoff(b));
        }
        if let Some(began) = fb.outage {
            emit(self.observer(), Event::Outage(began));
        }
    }

    /// The outage watch found the provider down ([`crate::park`]): the
    /// controller takes the failures in progress for an outage too, and
    /// says so.
    pub fn outage_found(&self, now: Instant) {
        if self.lock().declare_outage(now) {
            emit(self.observer(), Event::Outage(true));
        }
    }

    /// What a shared budget needs, made on first use.
    fn fleet(&self) -> &Fleet {
        self.fleet.get_or_init(Box::default)
    }

    /// The turn a shared budget's requests take, one at a time.
    fn turn(&self) -> &Turn {
        &self.fleet().turn
    }

    /// Locks the decision state. A poisoned lock is recovered: the state is
    /// plain numbers, valid after any panic.
    pub fn lock(&self) -> MutexGuard<'_, PacerCore> {
        self.core.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wakes every waiter so that it re-checks its slot (a hold or a rate
    /// change).
    pub fn notify(&self) {
        // No room: nobody has ever waited, so nobody is waiting now; one
        // who starts to reads the state after making its `notified()`.
        if let Some(room) = self.room.get() {
            room.changed.notify_waiters();
        }
    }

    /// The waiting room, made on first use.
    fn room(&self) -> &Room {
        self.room.get_or_init(|| {
            Box::new(Room {
                changed: Notify::new(),
                waiters: Mutex::new(HashMap::new()),
            })
        })
    }

    /// `ticket` left the queue: forget its wake-up and wake the new head.
    fn left(&self, ticket: Ticket) {
        let head = self.lock().head();
        let mut waiters = self.room().waiters();
        waiters.remove(&ticket);
        if waiters.is_empty() {
            // Nobody waits: the table goes (a provider that queued once
            // does not keep it).
            *waiters = HashMap::new();
        }
        if let Some(n) = head.and_then(|h| waiters.get(&h)) {
            // Stored if the head is not waiting right now: never lost.
            n.notify_one();
        }
    }

    /// Reports a request of `class` admitted after `wait`.
    fn admitted(&self, class: &Class, units: u32, wait: Duration) {
        emit(self.observer(), Event::PacingWait(wait));
        emit(
            self.observer(),
            Event::Admitted {
                class: class.name.clone(),
                units,
                wait,
            },
        );
    }

    /// A readout at `now`.
    pub fn snapshot(&self, now: Instant) -> PacerSnapshot {
        self.lock().snapshot(now)
    }

    /// Waits for a pacing slot for one request, FIFO among this provider's
    /// requests — and, when the budget is shared, for the provider's next
    /// slot in the shared schedule. Returns the instant it was admitted, or
    /// [`RateLimited`].
    pub async fn acquire(&self) -> Result<Instant, Cause> {
        self.acquire_before(None).await
    }

    /// [`PacerShared::acquire`] for a request that may not wait past
    /// `stop_at` (its run's deadline): a request whose slot would come at
    /// or after it does not wait for it nor take it, and is refused with
    /// [`Refusal::PastDeadline`] (its run gate stops the run there,
    /// planned, R-RN2).
    pub async fn acquire_before(&self, stop_at: Option<Instant>) -> Result<Instant, Cause> {
        self.acquire_as(&Class::default(), 1, stop_at).await
    }

    /// [`PacerShared::acquire_before`] for a request of `class`: waiting
    /// requests go in the fair order (R-FS1) — weighted between
    /// collectors, steady before catch-up within one — and a request
    /// costing `units` takes as many slots (R-FS2), here and in a budget
    /// shared through Redis.
    pub async fn acquire_as(
        &self,
        class: &Class,
        units: u32,
        stop_at: Option<Instant>,
    ) -> Result<Instant, Cause> {
        let arrived = crate::clock::now();
        let Some(budget) = self.budget() else {
            return self.acquire_here(arrived, class, units, stop_at).await;
        };
        let alone = self.lock().alone();
        if alone {
            // The store did not answer lately (or just answered again):
            // this replica's share, paced here; the store is asked again
            // below (and rejoined if it answers).
            self.acquire_here(arrived, class, units, stop_at).await?;
        }
        match self.acquire_shared(&*budget, arrived, units).await? {
            Some(at) => Ok(at),
            None if alone => Ok(crate::clock::now()),
            // The store stopped answering just now: this request too
            // waits for this replica's share, not sent on top of the
            // slots the shared schedule gave.
            None => self.acquire_here(arrived, class, units, stop_at).await,
        }
    }

    /// A slot now, when one is free and no request waits before this one
    /// (and the budget is this replica's own): the pacer's fast path, with
    /// no future to wait in. `None`: wait for it with
    /// [`PacerShared::acquire_as`], which also refuses what must be
    /// refused.
    pub fn try_acquire_now(
        &self,
        class: &Class,
        units: u32,
        stop_at: Option<Instant>,
    ) -> Option<Instant> {
        let now = crate::clock::now();
        if stop_at.is_some_and(|d| now >= d) || self.budget().is_some() {
            return None;
        }
        if !self.lock().try_admit_units(now, units) {
            return None;
        }
        self.admitted(class, units, Duration::ZERO);
        Some(now)
    }

    /// The shared slot (R-DS1): this replica's requests ask in turn (FIFO,
    /// the waiting room's bounds), each until its slot is taken; a wait the
    /// store names is slept here, within the request's patience. `None`:
    /// the store cannot answer, and from then on this replica paces alone
    /// at its share until the store answers again.
    async fn acquire_shared(
        &self,
        budget: &dyn SharedBudget,
        arrived: Instant,
        units: u32,
    ) -> Result<Option<Instant>, Cause> {
        let (max_len, patience) = {
            let core = self.lock();
            (core.max_queue_len(), core.patience(arrived))
        };
        let turn = self.turn();
        let queued = TurnCount::enter(&turn.waiting);
        if queued.ahead >= max_len {
            emit(self.observer(), Event::Shed(Refusal::QueueFull));
            return Err(RateLimited::new(Refusal::QueueFull, patience).into());
        }
        let Ok(_turn) = tokio::time::timeout_at(arrived + patience, turn.mutex.lock()).await else {
            emit(self.observer(), Event::Shed(Refusal::WaitTooLong));
            return Err(RateLimited::new(Refusal::WaitTooLong, patience).into());
        };
        drop(queued);
        let mut rechecked = false;
        loop {
            let proposal = Proposal {
                units: units.max(1),
                ..self.lock().proposal(crate::clock::now())
            };
            let answer = budget.admit(proposal).await;
            let now = crate::clock::now();
            let Some(answer) = answer else {
                // A first miss while the shared schedule paces this
                // replica: asked once more before going alone, the request
                // held meanwhile (a miss of this replica's own would
                // otherwise put its share on top of the other replicas'
                // slots, R-DS2).
                let recheck = budget.recheck_after();
                if !rechecked
                    && !recheck.is_zero()
                    && !self.lock().alone()
                    && now + recheck <= arrived + patience
                {
                    rechecked = true;
                    tokio::time::sleep(recheck).await;
                    continue;
                }
                let start = match budget.seat() {
                    Some(seat) => AloneStart::Seat(seat),
                    None => AloneStart::Phase(self.spread_share()),
                };
                let fb = self.lock().pace_alone(budget.replicas(), now, start);
                self.announce(fb, now);
                return Ok(None);
            };
            let (fb, patience) = {
                let mut core = self.lock();
                let fb = core.adopt_shared(&answer.view, now, budget.retry_every());
                if answer.admitted {
                    core.admitted_here();
                } else {
                    core.pressed();
                }
                (fb, core.patience(now))
            };
            self.announce(fb, now);
            if answer.admitted {
                emit(
                    self.observer(),
                    Event::PacingWait(now.saturating_duration_since(arrived)),
                );
                return Ok(Some(now));
            }
            if now + answer.wait > arrived + patience {
                emit(self.observer(), Event::Shed(Refusal::WaitTooLong));
                return Err(RateLimited::new(Refusal::WaitTooLong, answer.wait).into());
            }
            // Replicas told of the same slot wake a little apart, so the
            // slot goes to a random one of them, not always the same (the
            // store forgives a late sender `SHARED_SLACK`).
            let spread = SHARED_SPREAD.mul_f64(self.spread_share());
            tokio::time::sleep(answer.wait + spread).await;
        }
    }

    /// A slot now (`None`), or a place in the queue with the patience it
    /// starts with, or a refusal when the queue will not take it.
    fn admit_or_enqueue(
        &self,
        now: Instant,
        class: &Class,
        units: u32,
    ) -> Result<Option<(Ticket, Duration)>, Cause> {
        let mut core = self.lock();
        if core.try_admit_units(now, units) {
            drop(core);
            self.admitted(class, units, Duration::ZERO);
            return Ok(None);
        }
        match core.enqueue_as(now, class, f64::from(units.max(1))) {
            Ok(t) => Ok(Some((t, core.patience(now)))),
            Err((refusal, wait)) => {
                emit(self.observer(), Event::Shed(refusal));
                Err(RateLimited::new(refusal, wait).into())
            }
        }
    }

    /// Waits for this replica's own pacing slot — not past `stop_at`.
    async fn acquire_here(
        &self,
        arrived: Instant,
        class: &Class,
        units: u32,
        stop_at: Option<Instant>,
    ) -> Result<Instant, Cause> {
        let now = arrived;
        if stop_at.is_some_and(|d| now >= d) {
            return Err(RateLimited::new(Refusal::PastDeadline, Duration::ZERO).into());
        }
        let Some((ticket, mut patience)) = self.admit_or_enqueue(now, class, units)? else {
            return Ok(now);
        };
        let wake = Arc::new(Notify::new());
        let room = self.room();
        room.waiters().insert(ticket, wake.clone());
        // If this future is dropped while waiting, leave the queue so that
        // those behind are not stuck behind a ghost.
        let mut guard = TicketGuard {
            shared: self,
            ticket: Some(ticket),
        };
        loop {
            // Made before the slot is read: a hold or a rate change after
            // the read wakes it (`notify_waiters` reaches every `Notified`
            // made before it, polled or not).
            let changed = room.changed.notified();
            let now = crate::clock::now();
            // A hold that came while this request waited lets it wait
            // through the hold; one that ended does not shorten its wait.
            // A run's deadline bounds the wait like the patience does (a
            // slot at the deadline is too late: no attempt starts at it).
            let stop = stop_at.filter(|d| *d <= arrived + patience);
            let admission = {
                let mut core = self.lock();
                patience = patience.max(core.patience(now));
                let until = stop.map_or(arrived + patience, |d| {
                    d.checked_sub(Duration::from_nanos(1)).unwrap_or(d)
                });
                core.poll(ticket, until, now)
            };
            match admission {
                Admission::Go => {
                    guard.ticket = None;
                    self.left(ticket);
                    self.admitted(class, units, now.saturating_duration_since(arrived));
                    return Ok(now);
                }
                Admission::Refuse(wait) => {
                    guard.ticket = None;
                    self.left(ticket);
                    if stop.is_some() {
                        // The slot comes after the run's deadline: the run
                        // stops, planned, and the slot stays free.
                        return Err(RateLimited::new(Refusal::PastDeadline, Duration::ZERO).into());
                    }
                    emit(self.observer(), Event::Shed(Refusal::WaitTooLong));
                    return Err(RateLimited::new(Refusal::WaitTooLong, wait).into());
                }
                Admission::WaitUntil(at) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(at) => {}
                        _ = wake.notified() => {}
                        _ = changed => {}
                    }
                }
            }
        }
    }
}

impl std::fmt::Debug for PacerShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PacerShared")
            .field("core", &self.core)
            .field("observer", &self.observer.is_some())
            .finish()
    }
}

/// One request counted among those waiting for their turn, until dropped.
/// What a pacer keeps for a shared budget.
#[derive(Default)]
struct Fleet {
    /// The budget shared with other replicas, while the provider's is
    /// (R-DS1).
    budget: Mutex<Option<Arc<dyn SharedBudget>>>,
    /// This replica's requests ask the store one at a time, in arrival
    /// order.
    turn: Turn,
    /// Where the spread of shared wake-ups comes from: the operating
    /// system's generator (0), or a counter each draw seeds from, for a
    /// repeatable run ([`PacerShared::seed_spread`]).
    spread_seed: AtomicU64,
}

/// A shared budget's requests' turn (see [`PacerShared::turn`]).
#[derive(Debug, Default)]
struct Turn {
    mutex: tokio::sync::Mutex<()>,
    /// Requests waiting for it.
    waiting: AtomicUsize,
}

struct TurnCount<'a> {
    count: &'a AtomicUsize,
    /// How many were waiting before it.
    ahead: usize,
}

impl<'a> TurnCount<'a> {
    fn enter(count: &'a AtomicUsize) -> Self {
        let ahead = count.fetch_add(1, Ordering::Relaxed);
        TurnCount { count, ahead }
    }
}

impl Drop for TurnCount<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::Relaxed);
    }
}

struct TicketGuard<'a> {
    shared: &'a PacerShared,
    ticket: Option<Ticket>,
}

impl Drop for TicketGuard<'_> {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            self.shared.lock().cancel(ticket);
            self.shared.left(ticket);
        }
    }
}

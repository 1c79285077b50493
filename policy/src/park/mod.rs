//! Parking: a provider's short outage reaches its clients as latency, not
//! as failures (R-RN8, R-RN13).
//!
//! The most common event in a collector's life is a provider that fails
//! everything for a few seconds — a deploy, a load balancer swap. Retries
//! do not help: a ratio budget is spent within a second (R-RB2), and a
//! collector that gives up on its first 5xx fails its whole job. The
//! breaker does not help either: its window still holds the successes from
//! before, so a five-second outage never opens it, and while it is open it
//! fails requests fast.
//!
//! So sluice watches for the outage itself ([`Watch`]): failures in a row,
//! more than the provider's own noise explains — three at a clean
//! provider, a streak of a second at a quiet one — or the breaker open, or
//! the rate controller's outage verdict, whichever comes first. While the
//! provider is down:
//!
//! * requests are **parked** instead of sent: those that arrive, and those
//!   whose attempt just failed in a way that proves the provider did not
//!   process them (any failure for idempotent methods; a connection
//!   refused, a `503` or `429` for the others) — never a request the
//!   provider may have acted on;
//! * only **probes** reach the provider, one at a time, half a second and
//!   then a second apart — the oldest parked request goes as the probe;
//! * when a probe gets an answer from a live provider, the parked requests
//!   resume in the order they came, at the rate from before the outage
//!   (the controller is told the failures were an outage, and gives back
//!   the cuts they caused, R-SG4).
//!
//! A parked re-send is not a retry: it spends no retry budget (it adds no
//! load — it waits for the provider to be back), though it counts as an
//! attempt of its run when it leaves. A parked request waits at most:
//!
//! * in a run, what is left of the run's deadline, and as many cool-down
//!   cycles (`breaker_open_for` each) as the run's cycle guard allows —
//!   then the provider's part of the run stops, planned, with gap records
//!   (R-RN8); the run's wait does not count against `request_timeout`;
//! * outside a run, `max_outage_wait` in all (R-RN13), then `503` with
//!   `Proxy-Status` naming the outage and `Retry-After`. `0` turns parking
//!   off for such requests: failures pass at once.
//!
//! The layer sits inside retry and outside the run gate: every parked
//! re-send passes the run's envelope, and a failure that is parked never
//! reaches the retry policy.

mod error;
mod layer;
mod service;
pub mod watch;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

pub use self::error::ProviderDown;
pub use self::layer::ParkLayer;
pub use self::service::Park;
pub use self::watch::{Answer, Change, DownReason, Watch, WatchSnapshot};
use crate::classify::Outcome;
use crate::settings::ValidSettings;

/// What parking asks of the provider's other parts, composed in by the
/// provider (`crate::provider`): parking imports neither the breaker nor
/// the pacer.
pub trait Neighbours: Send + Sync + std::fmt::Debug {
    /// Whether the breaker is closed now, as an outage goes: open, it is an
    /// outage's — unless the provider's throttles opened it (a provider
    /// asking to slow down is alive, R-PD3).
    fn breaker_closed(&self) -> bool;
    /// Whether the rate controller takes the recent failures for an
    /// outage (R-SG4).
    fn controller_outage(&self) -> bool;
    /// Tells the rate controller that the failures in progress are an
    /// outage (it gives back their cuts at the return).
    fn outage_found(&self, now: Instant);
    /// The provider's settings, as its other parts hold them.
    fn settings(&self) -> Arc<ValidSettings>;
    /// The longest a request outside a run waits parked
    /// (`max_outage_wait`), and one cool-down cycle for a run's cycle
    /// guard (`breaker_open_for`): read for every request, so without a
    /// count taken on the settings every provider of the defaults shares.
    fn park_bounds(&self) -> (Duration, Duration);
}

/// [`ParkShared::flags`]: the provider is down.
const DOWN: u8 = 1;
/// [`ParkShared::flags`]: down, or failures in a row so far.
const UNSETTLED: u8 = 2;

/// A readout of a provider's parking.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ParkSnapshot {
    /// The outage watch.
    pub watch: WatchSnapshot,
    /// Requests parked right now.
    pub parked: usize,
    /// Requests that were parked and then sent, since start.
    pub resumed: u64,
    /// Parked requests whose wait ended without the provider's return
    /// (`max_outage_wait`, a run's deadline or cycle guard), since start.
    pub gave_up: u64,
}

/// What a parked request may do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Turn {
    /// The provider is up: go.
    Go,
    /// Go as the probe.
    Probe,
    /// Wait, until the given instant at the latest (or until woken).
    Wait(Option<Instant>),
}

/// What a failed attempt's request should do while the verdict on a
/// streak of failures is out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The provider is down: park the request.
    Down,
    /// No outage: the failure goes back as it is.
    Clear,
    /// Not yet known; wait, until the given instant at the latest.
    Due(Instant),
}

#[derive(Debug, Default)]
struct ParkState {
    watch: Watch,
    /// Parked (and held) requests by arrival, woken in that order: made
    /// by the first to park and let go with the last (a map is 24 bytes
    /// of every provider, and most are never down: R-PF1, issue 38).
    #[allow(clippy::box_collection)] // Boxed on purpose: 8 bytes while none.
    waiters: Option<Box<BTreeMap<u64, Arc<Notify>>>>,
    next_ticket: u64,
    /// Counted in 32 bits (saturating): with `next_ticket` and the
    /// watch, the state fits a smaller size class (R-PF1, issue 38).
    resumed: u32,
    gave_up: u32,
}

/// One provider's parking, shared by all its services: the outage watch
/// and who is parked. A part of the provider's one allocation
/// ([`crate::provider`]), made as the default; the calls that read the
/// provider's other parts are handed them ([`Neighbours`]).
#[derive(Debug, Default)]
pub struct ParkShared {
    state: Mutex<ParkState>,
    /// Bumped each time the provider goes down: requests already on their
    /// way — waiting for a pacing slot or a permit — are called back and
    /// parked if they have not left. Made by the first request that
    /// watches (a few hundred bytes most providers never need: issue 38).
    downs: std::sync::OnceLock<tokio::sync::watch::Sender<u64>>,
    /// Attempts sent and not yet answered: their answers may still tell
    /// whether the provider is down.
    on_the_way: std::sync::atomic::AtomicU32,
    /// The watch's verdict as last written ([`DOWN`], [`UNSETTLED`]): what
    /// every request asks first, read without the lock.
    flags: AtomicU8,
}

/// What holds a provider's parking: its policy, whose one allocation holds
/// every part of it (R-PF1, issue 38), and which is parking's
/// [`Neighbours`]: handed to each call that reads them, not pointed back
/// to. The layer keeps the holder.
pub trait HasPark: Neighbours + Send + Sync + 'static {
    /// The parking.
    fn park(&self) -> &ParkShared;
}

impl ParkShared {
    fn lock(&self) -> MutexGuard<'_, ParkState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes the watch's verdict where requests read it without the lock
    /// (called with the lock held, after any change to the watch).
    fn sync(&self, s: &ParkState) {
        let mut f = 0;
        if s.watch.is_down() {
            f |= DOWN;
        }
        if s.watch.unsettled() {
            f |= UNSETTLED;
        }
        self.flags.store(f, Ordering::Release);
    }

    /// Whether anything is amiss (down, or failures in a row): a request
    /// sent now keeps a copy, in case it must be parked after its attempt.
    pub(crate) fn unsettled(&self) -> bool {
        self.flags.load(Ordering::Acquire) & UNSETTLED != 0
    }

    /// Whether the provider is down. (The breaker opening is seen with
    /// the answer that opened it, [`ParkShared::answered`], or with the
    /// refusal it made, [`ParkShared::breaker_opened`].)
    pub(crate) fn is_down(&self) -> bool {
        self.flags.load(Ordering::Acquire) & DOWN != 0
    }

    /// The breaker is open (it refused a call, or was restored open): the
    /// provider is down.
    pub fn breaker_opened(&self, n: &dyn Neighbours, now: Instant) {
        let change = {
            let mut s = self.lock();
            let change = s.watch.force_down(now, DownReason::Breaker);
            self.sync(&s);
            change
        };
        self.changed(n, change, now);
    }

    /// Takes a place among the parked: a ticket (kept across re-parks, so
    /// a request keeps its place) and its wake-up.
    pub(crate) fn join(&self, ticket: Option<u64>) -> (u64, Arc<Notify>) {
        let mut s = self.lock();
        let ticket = ticket.unwrap_or_else(|| {
            s.next_ticket += 1;
            s.next_ticket
        });
        let notify = s
            .waiters
            .get_or_insert_with(Box::default)
            .entry(ticket)
            .or_default()
            .clone();
        (ticket, notify)
    }

    /// Leaves the parked; `resumed` when it goes on to the provider,
    /// `gave_up` when its wait ended without the provider's return.
    pub(crate) fn leave(&self, ticket: u64, resumed: bool, gave_up: bool) {
        let mut s = self.lock();
        if let Some(waiters) = s.waiters.as_mut() {
            waiters.remove(&ticket);
            if waiters.is_empty() {
                s.waiters = None;
            }
        }
        s.resumed = s.resumed.saturating_add(u32::from(resumed));
        s.gave_up = s.gave_up.saturating_add(u32::from(gave_up));
    }

    /// What a parked request may do at `now`.
    pub(crate) fn poll(&self, now: Instant) -> Turn {
        let mut s = self.lock();
        if !s.watch.is_down() {
            return Turn::Go;
        }
        match s.watch.take_probe(now) {
            Ok(()) => Turn::Probe,
            Err(next) => Turn::Wait(next),
        }
    }

    /// The verdict on the streak of failures, for a request whose attempt
    /// just failed: waited for while it can still come — other requests
    /// are on their way, or failed in the streak too — and not when only
    /// this request's own attempts failed and nothing else is sent (it
    /// goes back as it always did, and the retry policy deals with it).
    pub(crate) fn verdict(&self, n: &dyn Neighbours, now: Instant) -> Verdict {
        let others = self.on_the_way.load(std::sync::atomic::Ordering::Relaxed) > 0;
        let (verdict, change) = {
            let mut s = self.lock();
            let change = s.watch.tick(now);
            self.sync(&s);
            let verdict = if s.watch.is_down() {
                Verdict::Down
            } else if !others && !s.watch.streak_of_many() {
                Verdict::Clear
            } else {
                // Due and still not an outage: what the streak has is not
                // enough, and nothing more came.
                s.watch
                    .verdict_due()
                    .filter(|due| *due > now)
                    .map_or(Verdict::Clear, Verdict::Due)
            };
            (verdict, change)
        };
        self.changed(n, change, now);
        verdict
    }

    /// A request's attempt is on its way (`true`) or back (`false`).
    pub(crate) fn on_the_way(&self, going: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        if going {
            self.on_the_way.fetch_add(1, Relaxed);
        } else {
            self.on_the_way.fetch_sub(1, Relaxed);
        }
    }

    /// The outage in progress: its number and when it began.
    pub(crate) fn episode(&self) -> Option<(u64, Instant)> {
        self.lock().watch.episode()
    }

    /// Records what an attempt of `request` (see [`Watch::on_answer`])
    /// sent at `sent` came back with (`None`: it never reached the
    /// provider), and, for a probe, that it ended.
    pub(crate) fn answered(
        &self,
        n: &dyn Neighbours,
        request: u64,
        outcome: Option<Outcome>,
        sent: Instant,
        probe: bool,
    ) {
        let now = crate::clock::now();
        let answer = outcome.as_ref().map(Answer::of);
        // Read before the watch's lock: the breaker and the pacer never
        // take it, so no two locks are ever held the other way round. The
        // breaker is asked only where it can matter: an answer that may
        // have opened it, or anything while the provider is unsettled.
        let may_open = outcome.is_some_and(|o| o.is_breaker_failure()) || self.unsettled();
        let breaker_open = answer.is_some() && may_open && !n.breaker_closed();
        let controller = answer == Some(Answer::Failed) && n.controller_outage();
        let (change, wake) = {
            let mut s = self.lock();
            let unsettled = s.watch.unsettled();
            let mut change = match answer {
                // Alive, but the breaker is still open (a throttle counts
                // against it): not back until a probe closes it.
                Some(Answer::Alive) if breaker_open => {
                    s.watch.alive_but_held(sent);
                    None
                }
                Some(a) => s.watch.on_answer(request, sent, a, now),
                None => None,
            };
            if probe {
                let ended = match answer {
                    Some(Answer::Alive) if breaker_open => Some(Answer::Failed),
                    a => a,
                };
                s.watch.probe_ended(ended, now);
            }
            if breaker_open {
                change = change.or(s.watch.force_down(now, DownReason::Breaker));
            }
            if controller {
                change = change.or(s.watch.force_down(now, DownReason::Controller));
            }
            self.sync(&s);
            // Waiters re-check after anything they wait on: the verdict,
            // the return, a probe's end, a streak that ended.
            let wake = change.is_some() || probe || (unsettled && !s.watch.unsettled());
            (change, wake)
        };
        if wake {
            self.wake_all();
        }
        self.went(n, change, now);
    }

    /// After a change: a provider gone down calls back the requests on
    /// their way, and tells the rate controller (unless it told us).
    fn went(&self, n: &dyn Neighbours, change: Option<Change>, now: Instant) {
        if let Some(Change::Down(reason)) = change {
            // Nobody watching yet: nobody to call back.
            if let Some(downs) = self.downs.get() {
                downs.send_modify(|n| *n += 1);
            }
            if reason != DownReason::Controller {
                n.outage_found(now);
            }
        }
    }

    /// When a request that gave up waiting should come back (the next
    /// probe, or a second), and why the provider is down.
    pub(crate) fn retry_after(&self, now: Instant) -> (Duration, DownReason) {
        let s = self.lock();
        let wait = s
            .watch
            .next_probe()
            .map_or(watch::PROBE_MAX_WAIT, |at| {
                at.saturating_duration_since(now)
            })
            .max(Duration::from_secs(1));
        let reason = s
            .watch
            .snapshot(now)
            .down
            .map_or(DownReason::Failures, |(_, r)| r);
        (wait, reason)
    }

    fn changed(&self, n: &dyn Neighbours, change: Option<Change>, now: Instant) {
        if change.is_some() {
            self.wake_all();
        }
        self.went(n, change, now);
    }

    /// A receiver that sees the provider's next going down.
    pub(crate) fn downs(&self) -> tokio::sync::watch::Receiver<u64> {
        self.downs
            .get_or_init(|| tokio::sync::watch::Sender::new(0))
            .subscribe()
    }

    /// Wakes every parked request, oldest first.
    fn wake_all(&self) {
        let waiters: Vec<Arc<Notify>> = self
            .lock()
            .waiters
            .iter()
            .flat_map(|w| w.values().cloned())
            .collect();
        for w in waiters {
            // Stored if the waiter is not waiting right now: never lost.
            w.notify_one();
        }
    }

    /// Whether it has seen nothing a new one would not start from: no
    /// outage or failure met, no one parked or on the way (R-PF1).
    pub fn untaught(&self) -> bool {
        let s = self.lock();
        s.watch.untaught()
            && s.waiters.is_none()
            && s.resumed == 0
            && s.gave_up == 0
            && self.on_the_way.load(std::sync::atomic::Ordering::Relaxed) == 0
    }

    /// Whether nothing is under way: not down, no one parked or on the
    /// way (R-PF1). A failure streak is not under way: it is evidence,
    /// which passes with the windows.
    pub fn settled(&self) -> bool {
        let s = self.lock();
        !s.watch.is_down()
            && s.waiters.is_none()
            && self.on_the_way.load(std::sync::atomic::Ordering::Relaxed) == 0
    }

    /// A readout at `now`.
    pub fn snapshot(&self, now: Instant) -> ParkSnapshot {
        let s = self.lock();
        ParkSnapshot {
            watch: s.watch.snapshot(now),
            parked: s.waiters.as_ref().map_or(0, |w| w.len()),
            resumed: u64::from(s.resumed),
            gave_up: u64::from(s.gave_up),
        }
    }
}

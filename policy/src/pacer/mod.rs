//! Pacing: GCRA at a rate learned by AIMD, a `Retry-After` hold, and a FIFO
//! waiting room with a bounded wait.
//!
//! Why a pacer and not a retry loop: a collector that only backs off after
//! a 429 has already spent the provider's patience. The pacer spaces
//! requests *before* they are sent, at a rate it learns from the provider's
//! answers ([`aimd`]), with GCRA's exact spacing ([`gcra`]). A provider's
//! `Retry-After` holds every request — queued ones included — until the
//! instant it named, and nothing later (R-RA1). A request that could not be
//! sent within `max_queue_wait` is refused at once with the wait it would
//! have had, rather than held until its client gives up (R-GC2).
//!
//! One [`PacerShared`] per provider, in an `Arc`: every clone of the
//! [`Pacer`] service, and every layer built from one [`PacerLayer`], shares
//! it. Cloning does not create a new rate.

pub mod aimd;
pub mod core;
mod error;
pub mod gcra;
mod layer;
mod service;

use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;
use tokio::time::Instant;

pub use self::aimd::{Backoff, BackoffReason};
pub use self::core::{Admission, Feedback, PacerCore, PacerSnapshot, Refusal, Ticket};
pub use self::error::RateLimited;
pub use self::layer::PacerLayer;
pub use self::service::{Pacer, ResponseFuture, Ttfb};
use crate::error::BoxError;
use crate::settings::ProviderSettings;

/// The pacer state of one provider, shared by all its services.
#[derive(Debug)]
pub struct PacerShared {
    /// The decision state; held only for short, non-blocking sections.
    core: Mutex<PacerCore>,
    /// Bumped whenever a hold or rate change may move waiters' slots, or
    /// the head of the queue left.
    changed: watch::Sender<()>,
}

impl PacerShared {
    /// A cold pacer for these settings.
    pub fn new(settings: &ProviderSettings) -> Arc<Self> {
        Arc::new(PacerShared {
            core: Mutex::new(PacerCore::new(settings)),
            changed: watch::Sender::new(()),
        })
    }

    /// Locks the decision state. A poisoned lock is recovered: the state is
    /// plain numbers, valid after any panic.
    pub fn lock(&self) -> MutexGuard<'_, PacerCore> {
        self.core.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wakes waiters so that they re-check their slot.
    pub fn notify(&self) {
        self.changed.send_replace(());
    }

    /// A readout at `now`.
    pub fn snapshot(&self, now: Instant) -> PacerSnapshot {
        self.lock().snapshot(now)
    }

    /// Waits for a pacing slot for one request, FIFO among this provider's
    /// requests. Returns the instant it was admitted, or [`RateLimited`].
    pub async fn acquire(&self) -> Result<Instant, BoxError> {
        let now = Instant::now();
        let (ticket, deadline) = {
            let mut core = self.lock();
            match core.enqueue(now) {
                Ok(t) => (t, core.deadline(now)),
                Err((refusal, wait)) => {
                    return Err(RateLimited::new(refusal, wait).into());
                }
            }
        };
        // If this future is dropped while waiting, leave the queue so that
        // those behind are not stuck behind a ghost.
        let mut guard = TicketGuard {
            shared: self,
            ticket: Some(ticket),
        };
        let mut changed = self.changed.subscribe();
        loop {
            changed.borrow_and_update();
            let now = Instant::now();
            let admission = self.lock().poll(ticket, deadline, now);
            match admission {
                Admission::Go => {
                    guard.ticket = None;
                    // The next waiter is now at the head.
                    self.notify();
                    return Ok(now);
                }
                Admission::Refuse(wait) => {
                    guard.ticket = None;
                    self.notify();
                    return Err(RateLimited::new(Refusal::WaitTooLong, wait).into());
                }
                Admission::WaitUntil(at) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(at) => {}
                        _ = changed.changed() => {}
                    }
                }
            }
        }
    }
}

struct TicketGuard<'a> {
    shared: &'a PacerShared,
    ticket: Option<Ticket>,
}

impl Drop for TicketGuard<'_> {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            if self.shared.lock().cancel(ticket) {
                self.shared.notify();
            }
        }
    }
}

//! The bulkhead: a cap on one provider's attempts in flight (R-BH1).
//!
//! Pacing bounds how often we start requests; it does not bound how many
//! are open at once when a provider slows down. The bulkhead does, per
//! provider, so a provider that hangs can hold at most its own permits and
//! never the proxy's sockets or another provider's share (R-ST1). Its
//! waiting room is bounded like the pacer's: too many waiting, or a wait
//! past `max_queue_wait`, and the request is refused.
//!
//! It is tokio's `Semaphore` with a bounded, timed wait; tower's
//! `ConcurrencyLimit` waits in `poll_ready` without a bound, which would
//! let a hung provider queue requests forever.
//!
//! A permit is held for the whole attempt: until the response head for
//! errors and answers that are dropped, and — held by the body where it
//! has a place for it ([`CarriesReport`](crate::attempt::CarriesReport)),
//! or when the caller moves the response's [`InFlight`] extension into the
//! body it streams — until the body is done, so a slow download counts as
//! in flight.
//!
//! The bulkhead also stamps each response with its time-to-first-byte
//! ([`Report::ttfb`](crate::attempt::Report)) measured from the moment the permit was
//! held, so that waiting inside sluice never reads as a slow provider.

mod error;
mod layer;
mod service;

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

pub use self::error::BulkheadFull;
pub use self::layer::BulkheadLayer;
pub use self::service::Bulkhead;
use crate::attempt::GivesBack;
pub use crate::attempt::{InFlight, Permit};
use crate::classify::Dialect;
use crate::clock::nanos;
use crate::settings::ProviderSettings;

/// One provider's permits, shared by all its services.
#[derive(Debug)]
pub struct BulkheadShared {
    /// In this allocation, not an `Arc` of its own: a [`Permit`] holds
    /// the bulkhead (32 bytes fewer a provider: R-PF1, issue 38).
    pub(crate) permits: Semaphore,
    /// Permits the semaphore was built or resized to. The counts are 32
    /// bits (settings allow a million: `crate::settings::MAX_COUNT`), 16
    /// bytes fewer a provider (R-PF1, issue 38).
    size: AtomicU32,
    pub(crate) waiting: AtomicU32,
    /// How many may wait for a permit, and how long (nanoseconds): atomics,
    /// not a lock, 16 bytes fewer a provider (R-PF1, issue 38).
    max_waiting: AtomicU32,
    max_wait: AtomicU64,
    /// The provider's dialect, as an index of [`Dialect::ALL`]: the
    /// bulkhead classifies each answer by it when it stamps the report.
    dialect: AtomicU8,
}

impl BulkheadShared {
    /// Permits for `max_in_flight` attempts: a part of the provider's one
    /// allocation ([`crate::provider`]).
    pub fn new(settings: &ProviderSettings) -> Self {
        BulkheadShared {
            permits: Semaphore::new(settings.max_in_flight),
            size: AtomicU32::new(count(settings.max_in_flight)),
            waiting: AtomicU32::new(0),
            max_waiting: AtomicU32::new(count(settings.max_queue_len)),
            max_wait: AtomicU64::new(nanos(settings.max_queue_wait)),
            dialect: AtomicU8::new(0),
        }
    }

    /// The dialect answers are classified by.
    pub fn dialect(&self) -> Dialect {
        Dialect::ALL
            .get(usize::from(self.dialect.load(Ordering::Relaxed)))
            .map_or(Dialect::Generic, |(_, d)| *d)
    }

    /// Classifies answers by `dialect` from now on.
    pub fn set_dialect(&self, dialect: Dialect) {
        let i = Dialect::ALL
            .iter()
            .position(|(_, d)| *d == dialect)
            .unwrap_or(0);
        self.dialect.store(i as u8, Ordering::Relaxed);
    }

    /// Applies new settings: permits are added or forgotten to match.
    pub fn update_settings<P: HasBulkhead>(holder: &Arc<P>, settings: &ProviderSettings) {
        let this = holder.bulkhead();
        let want = count(settings.max_in_flight);
        let size = this.size.swap(want, Ordering::Relaxed);
        if want > size {
            this.permits.add_permits((want - size) as usize);
        } else {
            // Permits in use are forgotten as they come back.
            let gone = this.permits.forget_permits((size - want) as usize);
            let owed = (size - want) as usize - gone;
            if owed > 0 {
                let holder = holder.clone();
                tokio::spawn(async move {
                    let permits = &holder.bulkhead().permits;
                    if let Ok(p) = permits.acquire_many(owed as u32).await {
                        p.forget();
                    }
                });
            }
        }
        this.max_waiting
            .store(count(settings.max_queue_len), Ordering::Relaxed);
        this.max_wait
            .store(nanos(settings.max_queue_wait), Ordering::Relaxed);
    }

    /// How many may wait for a permit, and how long.
    pub(crate) fn limits(&self) -> (u32, Duration) {
        (
            self.max_waiting.load(Ordering::Relaxed),
            Duration::from_nanos(self.max_wait.load(Ordering::Relaxed)),
        )
    }

    /// Attempts in flight now.
    pub fn in_flight(&self) -> usize {
        let size = self.size.load(Ordering::Relaxed) as usize;
        size.saturating_sub(self.permits.available_permits())
    }

    /// Requests waiting for a permit now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed) as usize
    }
}

/// A count of the settings in 32 bits (validated to a million at most).
fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// What holds a bulkhead: a provider's policy, whose one allocation holds
/// every part of it (R-PF1, issue 38). The layer and its permits keep the
/// holder.
pub trait HasBulkhead: Send + Sync + 'static {
    /// The bulkhead.
    fn bulkhead(&self) -> &BulkheadShared;
}

/// A bulkhead's holder takes its permits back.
impl<P: HasBulkhead> GivesBack for P {
    fn give_back(&self) {
        self.bulkhead().permits.add_permits(1);
    }
}

/// A permit from `holder`'s bulkhead now, if one is free.
pub(crate) fn try_take<P: HasBulkhead>(holder: &Arc<P>) -> Option<Permit> {
    let permit = holder.bulkhead().permits.try_acquire().ok()?;
    permit.forget();
    Some(Permit::new(holder.clone()))
}

/// A permit from `holder`'s bulkhead once one is free (`None`: the
/// semaphore was closed).
pub(crate) async fn take<P: HasBulkhead>(holder: &Arc<P>) -> Option<Permit> {
    holder.bulkhead().permits.acquire().await.ok()?.forget();
    Some(Permit::new(holder.clone()))
}

//! One provider's policy state: everything its stack shares, in one `Arc`.
//!
//! The proxy's provider table owns one [`ProviderPolicy`] per provider; the
//! layers of that provider's stack borrow its parts; metrics, the admin API
//! and the store read [`ProviderSnapshot`]. There is no second copy of a
//! rate anywhere.

use std::sync::{Arc, Mutex};

use tokio::time::Instant;

use crate::breaker::{BreakerShared, BreakerSnapshot, TransitionSink};
use crate::bulkhead::BulkheadShared;
use crate::pacer::{PacerShared, PacerSnapshot};
use crate::retry::{Jitter, RetryShared};
use crate::settings::{ProviderSettings, SettingsError};

/// What a provider's policy is built with besides its settings.
#[derive(Default)]
pub struct PolicyOptions {
    /// Where breaker transitions are published.
    pub sink: Option<TransitionSink>,
    /// The retry jitter; `None` = random, seeded by the OS.
    pub jitter: Option<Jitter>,
}

impl std::fmt::Debug for PolicyOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyOptions")
            .field("sink", &self.sink.is_some())
            .field("jitter", &self.jitter)
            .finish()
    }
}

/// The shared state of one provider's stack.
#[derive(Debug)]
pub struct ProviderPolicy {
    name: String,
    settings: Mutex<ProviderSettings>,
    /// GCRA + AIMD + hold + waiting room.
    pub pacer: Arc<PacerShared>,
    /// The circuit breaker.
    pub breaker: Arc<BreakerShared>,
    /// The retry budget and settings.
    pub retry: Arc<RetryShared>,
    /// Permits for attempts in flight.
    pub bulkhead: Arc<BulkheadShared>,
}

/// Everything observable about a provider, read at one instant.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderSnapshot {
    /// The provider's name.
    pub name: String,
    /// Pacing.
    pub pacer: PacerSnapshot,
    /// The breaker.
    pub breaker: BreakerSnapshot,
    /// Whole retries left in the budget.
    pub retry_budget_left: u32,
    /// Attempts in flight.
    pub in_flight: usize,
    /// Requests waiting for a bulkhead permit.
    pub bulkhead_waiting: usize,
}

impl ProviderPolicy {
    /// Cold state for a provider; the settings are validated first.
    pub fn new(
        name: impl Into<String>,
        settings: ProviderSettings,
        options: PolicyOptions,
    ) -> Result<Arc<Self>, SettingsError> {
        settings.validate()?;
        let retry = Arc::new(RetryShared::new(
            &settings,
            options.jitter.unwrap_or_else(Jitter::random),
        ));
        Ok(Arc::new(ProviderPolicy {
            name: name.into(),
            pacer: PacerShared::new(&settings),
            breaker: BreakerShared::new(&settings, retry.clone(), options.sink),
            retry,
            bulkhead: BulkheadShared::new(&settings),
            settings: Mutex::new(settings),
        }))
    }

    /// The provider's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The settings in force.
    pub fn settings(&self) -> ProviderSettings {
        self.settings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Applies new settings without losing what was learned (R-OP5).
    pub fn update_settings(&self, settings: ProviderSettings) -> Result<(), SettingsError> {
        settings.validate()?;
        self.pacer.lock().update_settings(&settings);
        self.pacer.notify();
        self.breaker.update_settings(&settings);
        self.retry.update_settings(&settings);
        self.bulkhead.update_settings(&settings);
        *self.settings.lock().unwrap_or_else(|p| p.into_inner()) = settings;
        Ok(())
    }

    /// A readout at `now`.
    pub fn snapshot(&self, now: Instant) -> ProviderSnapshot {
        ProviderSnapshot {
            name: self.name.clone(),
            pacer: self.pacer.snapshot(now),
            breaker: self.breaker.snapshot(now),
            retry_budget_left: self.retry.budget_left(now),
            in_flight: self.bulkhead.in_flight(),
            bulkhead_waiting: self.bulkhead.waiting(),
        }
    }
}

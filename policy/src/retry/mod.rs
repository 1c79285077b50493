//! Budgeted retries.
//!
//! A per-request retry count does not bound retry *volume*: when a
//! provider fails, every request retries, and a count of 3 quadruples the
//! load on a provider that is already struggling. A ratio budget bounds
//! retries to a share of recent requests (≈ 20 %, Linkerd's default), so an
//! outage costs at most a fifth more traffic (R-RB2). When the budget is
//! empty the last upstream response goes back to the client.
//!
//! What is retried (R-RB1): 429, 408, 5xx, connect errors and timeouts, for
//! idempotent methods and those the config opts in, when the body could be
//! kept for replay. A client error is never retried and costs nothing; a
//! refusal by sluice itself (breaker open, queue full, run stopped) is
//! never retried either — it did not reach the provider.
//!
//! The delay is full jitter (R-RB3), except when the provider said
//! `Retry-After`: then the retry waits exactly that long (R-RA1) — unless
//! it is longer than `max_retry_after_wait`, in which case the response
//! goes back to the client and the pacer's hold protects the provider.

pub mod backoff;
pub mod budget;
pub(crate) mod policy;

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

pub use self::backoff::Jitter;
pub use self::budget::RatioBudget;
pub use self::policy::RetryPolicy;
pub use crate::attempt::retryable_method;
use crate::events::Observer;
use crate::settings::{ProviderSettings, ValidSettings};

pub use crate::attempt::ReplayBody;

impl std::fmt::Debug for RetryShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetryShared")
            .field("budget", &self.budget)
            .field("jitter", &self.jitter)
            .finish_non_exhaustive()
    }
}

/// The retry settings and budget of one provider, shared by all its
/// requests.
pub struct RetryShared {
    budget: Mutex<RatioBudget>,
    /// The provider's settings, shared, not copied (R-PF1, issue 38).
    settings: Mutex<std::sync::Arc<ValidSettings>>,
    jitter: Jitter,
}

#[derive(Debug, Clone)]
pub(crate) struct RetrySettings {
    pub(crate) max_attempts: u32,
    pub(crate) base: Duration,
    pub(crate) cap: Duration,
    pub(crate) max_retry_after_wait: Duration,
    pub(crate) extra_methods: Vec<http::Method>,
}

impl RetrySettings {
    fn of(s: &ProviderSettings) -> Self {
        RetrySettings {
            max_attempts: s.retry_max_attempts,
            base: s.retry_base,
            cap: s.retry_cap,
            max_retry_after_wait: s.max_retry_after_wait,
            extra_methods: s.retry_methods.clone(),
        }
    }
}

/// What holds a provider's retry state: its policy, whose one allocation
/// holds every part of it (R-PF1, issue 38).
pub trait HasRetry: Send + Sync + 'static {
    /// The retry state.
    fn retry(&self) -> &RetryShared;
    /// Where a retry is reported: the provider's observer, if any.
    fn observer(&self) -> Option<&dyn Observer>;
}

impl RetryShared {
    /// A fresh budget for these settings, with the given jitter source.
    /// Retries are reported to the holder's observer ([`HasRetry`]).
    pub fn new(settings: &std::sync::Arc<ValidSettings>, jitter: Jitter) -> Self {
        RetryShared {
            budget: Mutex::new(RatioBudget::new(
                settings.retry_ratio,
                settings.retry_min_per_sec,
                settings.retry_budget_ttl,
                crate::clock::now(),
            )),
            settings: Mutex::new(settings.clone()),
            jitter,
        }
    }

    /// Applies new settings. The budget restarts with the new ratio (its
    /// deposits are only seconds old).
    pub fn update_settings(&self, settings: &std::sync::Arc<ValidSettings>) {
        *self.budget() = RatioBudget::new(
            settings.retry_ratio,
            settings.retry_min_per_sec,
            settings.retry_budget_ttl,
            crate::clock::now(),
        );
        *self.settings.lock().unwrap_or_else(|p| p.into_inner()) = settings.clone();
    }

    pub(crate) fn budget(&self) -> MutexGuard<'_, RatioBudget> {
        self.budget.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn settings(&self) -> RetrySettings {
        RetrySettings::of(&self.settings.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub(crate) fn jitter(&self) -> &Jitter {
        &self.jitter
    }

    /// Whole retries left in the budget at `now`.
    pub fn budget_left(&self, now: Instant) -> u32 {
        self.budget().balance(now).floor().min(f64::from(u32::MAX)) as u32
    }
}

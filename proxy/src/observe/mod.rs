//! Where a provider's events and breaker transitions go: metrics, one log
//! line per back-off and per transition, and the store's evidence log
//! (R-CB2). Derived from the same events, so they cannot disagree.

pub mod allocator;
pub mod format;
pub mod history;
pub mod metrics;

use std::sync::Arc;
use std::time::Duration;

use sluice_policy::breaker::{Transition, TransitionSink};
use sluice_policy::events::{Event, EventSink};
use tokio::time::Instant;

use crate::observe::metrics::Metrics;
use crate::providers::Observer;
use crate::store::{EvidenceRecord, StoreWriter};

/// The proxy's observer.
#[derive(Debug)]
pub struct Observe {
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// The store's writer, if the store is open.
    pub writer: Option<StoreWriter>,
}

impl Observer for Observe {
    fn label(&self, name: &str) -> String {
        self.metrics.label(name)
    }

    fn sinks(&self, name: &str) -> (EventSink, TransitionSink) {
        let label = self.metrics.label(name);
        self.metrics.init_provider(&label);
        let (metrics, provider) = (self.metrics.clone(), name.to_string());
        let handles = metrics::Handles::default();
        let events: EventSink = Arc::new(move |e: &Event| {
            metrics.event_with(&label, &handles, e);
            match e {
                Event::Backoff(b) => tracing::info!(
                    provider = %provider,
                    reason = b.reason.label(),
                    from_rps = b.from_rps,
                    to_rps = b.to_rps,
                    "rate cut"
                ),
                Event::Outage(true) => tracing::warn!(
                    provider = %provider,
                    "every answer fails whatever the rate: an outage, not a throttle; the breaker decides"
                ),
                Event::Outage(false) => tracing::info!(
                    provider = %provider,
                    "outage over: the rate from before it is back"
                ),
                // A hold of a second or more is news; shorter ones (a
                // rolling quota's next refill, a shared hold adopted on
                // each admission) come at the provider's rate and would
                // flood the log at INFO (707 lines in 65 s, measured).
                Event::Hold(d) if *d >= Duration::from_secs(1) => tracing::info!(
                    provider = %provider,
                    hold_ms = d.as_millis() as u64,
                    "provider asked to wait (Retry-After or a spent quota): holding"
                ),
                Event::Hold(d) => tracing::debug!(
                    provider = %provider,
                    hold_ms = d.as_millis() as u64,
                    "provider asked to wait (Retry-After or a spent quota): holding"
                ),
                _ => {}
            }
        });
        let label = self.metrics.label(name);
        let (metrics, writer, provider) =
            (self.metrics.clone(), self.writer.clone(), name.to_string());
        let transitions: TransitionSink = Arc::new(move |t: &Transition| {
            metrics.transition(&label, t);
            tracing::warn!(
                provider = %provider,
                from = t.from.label(),
                to = t.to.label(),
                reason = t.reason.label(),
                elapsed_ms = t.elapsed_ms,
                calls = t.calls,
                failures = t.failures,
                retry_budget_left = t.retry_budget_left,
                "breaker transition"
            );
            // Queued to the store's writer thread, flushed there: a failing
            // provider's transitions never wait for the disk here.
            if let Some(writer) = &writer {
                let ago = Instant::now().saturating_duration_since(t.at);
                writer.append_evidence(&provider, EvidenceRecord::of(t, ago));
            }
        });
        (events, transitions)
    }
}

//! Where a provider's events and breaker transitions go: metrics, one log
//! line per back-off and per transition, and the store's evidence log
//! (R-CB2). Derived from the same events, so they cannot disagree.

pub mod metrics;

use std::sync::Arc;

use sluice_policy::breaker::{Transition, TransitionSink};
use sluice_policy::events::{Event, EventSink};
use tokio::time::Instant;

use crate::observe::metrics::Metrics;
use crate::providers::Observer;
use crate::store::{EvidenceRecord, Store};

/// The proxy's observer.
#[derive(Debug)]
pub struct Observe {
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// The store, if open.
    pub store: Option<Arc<Store>>,
}

impl Observer for Observe {
    fn label(&self, name: &str) -> String {
        self.metrics.label(name)
    }

    fn sinks(&self, name: &str) -> (EventSink, TransitionSink) {
        let label = self.metrics.label(name);
        self.metrics.init_provider(&label);
        let (metrics, provider) = (self.metrics.clone(), name.to_string());
        let events: EventSink = Arc::new(move |e: &Event| {
            metrics.event(&label, e);
            match e {
                Event::Backoff(b) => tracing::info!(
                    provider = %provider,
                    reason = b.reason.label(),
                    from_rps = b.from_rps,
                    to_rps = b.to_rps,
                    "rate cut"
                ),
                Event::Hold(d) => tracing::info!(
                    provider = %provider,
                    hold_ms = d.as_millis() as u64,
                    "provider asked to wait (Retry-After): holding"
                ),
                _ => {}
            }
        });
        let label = self.metrics.label(name);
        let (metrics, store, provider) =
            (self.metrics.clone(), self.store.clone(), name.to_string());
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
            if let Some(store) = &store {
                let ago = Instant::now().saturating_duration_since(t.at);
                if let Err(e) = store.append_evidence(&provider, &EvidenceRecord::of(t, ago)) {
                    metrics.store_errors.inc();
                    tracing::error!(provider = %provider, error = %e, "breaker evidence not stored");
                }
            }
        });
        (events, transitions)
    }
}

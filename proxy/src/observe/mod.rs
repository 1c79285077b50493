//! Where a provider's events and breaker transitions go: metrics, one log
//! line per back-off and per transition, and the store's evidence log
//! (R-CB2). Derived from the same events, so they cannot disagree.

pub mod allocator;
pub mod format;
pub mod history;
pub mod metrics;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sluice_policy::breaker::{Transition, TransitionObserver};
use sluice_policy::events::{Event, EventObserver};
use tokio::time::Instant;

use crate::observe::metrics::Metrics;
use crate::providers::{Observer, Sinks};
use crate::store::{EvidenceRecord, StoreWriter};

/// The proxy's observer.
#[derive(Debug)]
pub struct Observe {
    /// Where every provider's sink writes, shared by them all.
    outlets: Arc<Outlets>,
    /// The series every provider beyond the label cap shares (`_other`),
    /// made when the first of them is.
    other: OnceLock<Arc<Series>>,
}

/// Where every provider's sink writes: metrics, and the store's evidence
/// log when the store is open.
#[derive(Debug)]
struct Outlets {
    metrics: Arc<Metrics>,
    writer: Option<StoreWriter>,
}

impl Observe {
    /// An observer feeding `metrics` and, when the store is open, its
    /// evidence log through `writer`.
    pub fn new(metrics: Arc<Metrics>, writer: Option<StoreWriter>) -> Self {
        Observe {
            outlets: Arc::new(Outlets { metrics, writer }),
            other: OnceLock::new(),
        }
    }
}

impl Observer for Observe {
    /// One value takes both (R-PF1, issue 38): a provider of a broad
    /// crawl's table costs one allocation here, its series shared with
    /// every provider beyond the label cap — two closures took about 300
    /// bytes each time, with four copies of its names.
    fn sinks(&self, name: &Arc<str>) -> Sinks {
        let metrics = &self.outlets.metrics;
        let series = if metrics.label(name) == metrics::OTHER {
            self.other_series().clone()
        } else {
            Arc::new(Series::of(metrics, name.clone()))
        };
        let label = series.label.clone();
        let sink = Arc::new(ProviderSink {
            outlets: self.outlets.clone(),
            provider: name.clone(),
            series,
        });
        Sinks {
            observer: sink,
            label,
        }
    }

    fn gone(&self, labels: &[Arc<str>]) {
        self.outlets.metrics.forget(labels.iter().map(|l| &**l));
    }
}

impl Observe {
    /// The series every provider beyond the label cap shares.
    fn other_series(&self) -> &Arc<Series> {
        self.other
            .get_or_init(|| Arc::new(Series::of(&self.outlets.metrics, metrics::OTHER.into())))
    }
}

/// A provider's label in metrics and the series found under it once.
#[derive(Debug)]
struct Series {
    label: Arc<str>,
    handles: metrics::Handles,
}

impl Series {
    /// The series of `label`, every one a provider has created at zero.
    fn of(metrics: &Metrics, label: Arc<str>) -> Self {
        metrics.init_provider(&label);
        Series {
            label,
            handles: metrics::Handles::default(),
        }
    }
}

/// Where one provider's events and breaker transitions go: its series,
/// one log line per back-off and per transition, the store's evidence log
/// (R-CB2).
struct ProviderSink {
    outlets: Arc<Outlets>,
    provider: Arc<str>,
    series: Arc<Series>,
}

impl EventObserver for ProviderSink {
    fn event(&self, e: &Event) {
        let provider = &*self.provider;
        self.outlets
            .metrics
            .event_with(&self.series.label, &self.series.handles, e);
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
    }
}

impl TransitionObserver for ProviderSink {
    fn transition(&self, t: &Transition) {
        let provider = &*self.provider;
        self.outlets.metrics.transition(&self.series.label, t);
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
        if let Some(writer) = &self.outlets.writer {
            let ago = Instant::now().saturating_duration_since(t.at);
            writer.append_evidence(provider, EvidenceRecord::of(t, ago));
        }
    }
}

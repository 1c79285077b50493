//! Prometheus metrics (R-OP1): what the control loop is doing, per
//! provider.
//!
//! Gauges (rate, interval, ceiling, queue, in flight, breaker state,
//! budget, hold) are read from each provider's snapshot at scrape time, so
//! they can never disagree with `/v1/providers`. Counters and histograms
//! are fed by the policy's events and breaker transitions as they happen.
//!
//! Cardinality is bounded: the provider table holds at most
//! `limits.max_providers` (unknown hosts beyond that share `_overflow`), and
//! at most `limits.max_metric_providers` distinct provider labels are ever
//! exported — later ones fold into `provider="_other"`. Labels never carry
//! a path, a query, a header value or a body (R-SF4).

mod catalogue;
pub use catalogue::Family;
mod feed;
mod lean;
mod scrape;

use lean::LeanVec;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};

use prometheus::{
    Encoder, Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry,
    TextEncoder,
};

/// One provider's series that every answered request touches, each
/// looked up on first use and kept (issue 24: a look-up by label hashes
/// the values and takes the family's lock). Its series are removed only
/// once the provider has left the table ([`Metrics::forget`]), its handles
/// with it: a kept handle stays the exported one.
#[derive(Debug, Default)]
pub struct Handles {
    attempt_success: OnceLock<Arc<lean::Counter>>,
    ttfb: OnceLock<Arc<lean::Histogram>>,
    pacing_wait: OnceLock<Arc<lean::Histogram>>,
    unclassed_units: OnceLock<Arc<lean::Counter>>,
    unclassed_wait: OnceLock<Histogram>,
}

/// A provider's `sluice_requests_total{outcome="success"}`, found once:
/// every answered request counts there (see [`Handles`]).
#[derive(Debug, Default)]
pub struct RequestHandle(OnceLock<Arc<lean::Counter>>);

/// The label every provider beyond the label cap shares.
pub const OTHER: &str = "_other";

/// All of sluice's metrics.
pub struct Metrics {
    registry: Registry,
    /// What the catalogue registered, for the reference.
    families: Vec<catalogue::Family>,
    labels: Mutex<HashSet<String>>,
    /// Providers whose zeroed series show (see [`lean::Zeros`]).
    zeroed: lean::Zeroed,
    max_labels: usize,
    /// Each family labelled by provider, as it removes one provider's
    /// series.
    forgets: Vec<catalogue::Forget>,
    rate: LeanVec<lean::Gauge>,
    interval: LeanVec<lean::Gauge>,
    ceiling: LeanVec<lean::Gauge>,
    start: LeanVec<lean::Gauge>,
    limit: LeanVec<lean::Gauge>,
    error_baseline: LeanVec<lean::Gauge>,
    latency_baseline: LeanVec<lean::Gauge>,
    on_trial: LeanVec<lean::IntGauge>,
    provider_down: LeanVec<lean::IntGauge>,
    parked: LeanVec<lean::IntGauge>,
    condition: LeanVec<lean::IntGauge>,
    outages: LeanVec<lean::Counter>,
    queue: LeanVec<lean::IntGauge>,
    in_flight: LeanVec<lean::IntGauge>,
    breaker_state: LeanVec<lean::IntGauge>,
    budget: LeanVec<lean::IntGauge>,
    hold: LeanVec<lean::Gauge>,
    requests: LeanVec<lean::Counter>,
    attempts: LeanVec<lean::Counter>,
    retries: LeanVec<lean::Counter>,
    pacing_wait: LeanVec<lean::Histogram>,
    collector_units: LeanVec<lean::Counter>,
    collector_wait: HistogramVec,
    collector_waiting: LeanVec<lean::IntGauge>,
    allowance_units: LeanVec<lean::Gauge>,
    allowance_spent: LeanVec<lean::Gauge>,
    allowance_reset: LeanVec<lean::Gauge>,
    ttfb: LeanVec<lean::Histogram>,
    holds: LeanVec<lean::Counter>,
    hold_seconds: LeanVec<lean::FloatCounter>,
    backoffs: LeanVec<lean::Counter>,
    transitions: LeanVec<lean::Counter>,
    tunnels: LeanVec<lean::Counter>,
    upgrades: LeanVec<lean::Counter>,
    upgraded_open: IntGauge,
    interception_failures: LeanVec<lean::Counter>,
    visibility: LeanVec<lean::IntGauge>,
    quota_limit: LeanVec<lean::Gauge>,
    quota_remaining: LeanVec<lean::Gauge>,
    quota_reset: LeanVec<lean::Gauge>,
    quota_advertised: LeanVec<lean::IntGauge>,
    shared_state: LeanVec<lean::IntGauge>,
    shared_node: LeanVec<lean::IntGauge>,
    shared_rate: LeanVec<lean::Gauge>,
    shared_share: LeanVec<lean::Gauge>,
    quota_malformed: LeanVec<lean::Counter>,
    /// Providers in the table.
    pub providers_tracked: IntGauge,
    /// Pooled upstream connections open, idle or in use.
    pub upstream_connections: IntGauge,
    /// Idle HTTP/1.1 upstream connections resting (their socket alone).
    pub upstream_connections_resting: IntGauge,
    /// Idle upstream connections closed for `upstream.max_idle_connections`.
    pub upstream_idle_closed: IntCounter,
    /// Tasks alive in the runtime (connections, tunnels, writers…): flat
    /// at rest, back to it after load — a stuck waiter shows here.
    pub tasks_alive: IntGauge,
    /// Allocation requests since start (see [`crate::observe::allocator`]).
    pub allocations: IntCounter,
    /// Bytes allocated now.
    pub allocated: IntGauge,
    /// Stores that could not be opened and were moved aside, by reason.
    pub store_cold_starts: IntCounterVec,
    /// Store reads or writes that failed.
    pub store_errors: IntCounter,
    /// Failed accepts, by listener (`proxy`, `admin`): out of file
    /// descriptors and the like.
    pub accept_errors: IntCounterVec,
    /// Requests refused as malformed before reaching any provider, by a
    /// bounded reason.
    bad_requests: IntCounterVec,
    /// Requests refused for their destination before any provider saw
    /// them, by a bounded reason (see [`DESTINATION_REFUSAL_REASONS`]).
    destination_refusals: IntCounterVec,
    /// Providers whose learned state was restored.
    pub state_restored: IntCounter,
    /// Config reloads, by result.
    pub reloads: IntCounterVec,
    /// Runs ended, by collector and stop reason (`none`: not stopped).
    pub runs: IntCounterVec,
    /// 1 while a collector has an active run.
    pub runs_active: IntGaugeVec,
    /// Attempts of runs that reached the provider, by collector.
    pub run_attempts: IntCounterVec,
    /// Pending gap records, by collector.
    pub gaps_pending: IntGaugeVec,
    /// Checkpoints committed (flushed), by collector.
    pub checkpoint_commits: IntCounterVec,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// One upgraded connection in the open gauge while it lives.
#[derive(Debug)]
pub struct UpgradedGuard(IntGauge);

impl Drop for UpgradedGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The reasons `sluice_destination_refusals_total` counts besides the
/// guard's address classes: a `CONNECT` port not in
/// `destinations.connect_ports`, a host outside a collector's allowlist.
pub const DESTINATION_REFUSAL_REASONS: [&str; 2] = ["connect_port", "collector_allow"];

/// The breaker transitions (from, to, reason) each provider's series show
/// from the start.
pub const TRANSITIONS: [[&str; 3]; 5] = [
    ["closed", "open", "failure_rate"],
    ["open", "half_open", "reset_timeout"],
    ["half_open", "closed", "probes_succeeded"],
    ["half_open", "open", "probe_failed"],
    ["closed", "open", "failure_streak"],
];

/// The tunnel modes each provider's series show from the start.
pub const TUNNEL_MODES: [&str; 3] = ["intercepted", "raw", "plain_http"];

/// The reasons `sluice_bad_requests_total` counts.
pub const BAD_REQUEST_REASONS: [&str; 2] = ["invalid_port", "ambiguous_length"];

impl Metrics {
    /// Shows a provider's counters at zero, so that `rate()` and
    /// `increase()` see them from the start rather than from the first
    /// event (the label combinations are fixed and few: [`TRANSITIONS`],
    /// [`TUNNEL_MODES`], every back-off reason). Kept as the provider's
    /// name only: the families write the zeroes at each scrape.
    pub fn init_provider(&self, label: &str) {
        self.zeroed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(label.into());
    }

    /// The label for a provider: its name, or `_other` beyond the cap.
    pub fn label(&self, provider: &str) -> String {
        let mut labels = self.labels.lock().unwrap_or_else(|p| p.into_inner());
        if labels.contains(provider) {
            return provider.to_string();
        }
        if labels.len() < self.max_labels {
            labels.insert(provider.to_string());
            return provider.to_string();
        }
        OTHER.to_string()
    }

    /// Providers with labels of their own left the table (R-OP1, R-PF1):
    /// their series leave `/metrics` and their labels are free for the
    /// next providers. Labels went to the first providers ever seen and
    /// stayed theirs, so a broad crawl's later hosts — the live ones — all
    /// counted under `_other`, and the first 256 hosts' series stayed for
    /// good. A provider that comes back counts from
    /// zero, as Prometheus reads a restarted counter.
    pub fn forget<'a>(&self, gone: impl IntoIterator<Item = &'a str>) {
        let mut labels = self.labels.lock().unwrap_or_else(|p| p.into_inner());
        let gone: HashSet<&str> = gone
            .into_iter()
            .filter(|l| *l != OTHER && labels.remove(*l))
            .collect();
        if gone.is_empty() {
            return;
        }
        // Removed under the labels' lock: a provider given one of these
        // labels again meanwhile would have its new series removed too.
        self.zeroed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|l| !gone.contains(&**l));
        for forget in &self.forgets {
            forget(&gone);
        }
    }

    /// Counts one client request's final outcome.
    pub fn request(&self, label: &str, outcome: &str) {
        self.requests.with_label_values(&[label, outcome]).inc();
    }

    /// [`Metrics::request`] through a provider's [`RequestHandle`]: a success,
    /// the usual outcome, finds its series without a look-up.
    pub fn request_with(&self, label: &str, h: &RequestHandle, outcome: &str) {
        if outcome == "success" {
            h.0.get_or_init(|| self.requests.with_label_values(&[label, "success"]))
                .inc();
        } else {
            self.request(label, outcome);
        }
    }

    /// Counts an upgrade switched for a provider, and returns a guard that
    /// keeps it in the open gauge until dropped.
    pub fn upgraded(&self, label: &str) -> UpgradedGuard {
        self.upgrades.with_label_values(&[label]).inc();
        self.upgraded_open.inc();
        UpgradedGuard(self.upgraded_open.clone())
    }

    /// Counts a tunnel.
    pub fn tunnel(&self, label: &str, mode: &str) {
        self.tunnels.with_label_values(&[label, mode]).inc();
    }

    /// Counts a request refused as malformed (`reason` is one of
    /// [`BAD_REQUEST_REASONS`]).
    pub fn bad_request(&self, reason: &'static str) {
        self.bad_requests.with_label_values(&[reason]).inc();
    }

    /// Counts a request refused for its destination (a guard class or one
    /// of [`DESTINATION_REFUSAL_REASONS`]).
    pub fn destination_refused(&self, reason: &'static str) {
        self.destination_refusals.with_label_values(&[reason]).inc();
    }

    /// Counts a client rejecting the interception.
    pub fn interception_failed(&self, label: &str) {
        self.interception_failures.with_label_values(&[label]).inc();
    }

    /// Attempts so far per provider label: (sent, refused as throttled),
    /// for the history (read from the counters, creating no series).
    pub fn attempt_counts(&self) -> HashMap<String, (u64, u64)> {
        use prometheus::core::Collector;
        let mut counts: HashMap<String, (u64, u64)> = HashMap::new();
        for family in self.attempts.collect() {
            for m in family.get_metric() {
                let (mut provider, mut outcome) = ("", "");
                for l in m.get_label() {
                    match l.name() {
                        "provider" => provider = l.value(),
                        "outcome" => outcome = l.value(),
                        _ => {}
                    }
                }
                let n = m.get_counter().get_value() as u64;
                let c = counts.entry(provider.to_string()).or_default();
                c.0 += n;
                if outcome == "throttled" {
                    c.1 += n;
                }
            }
        }
        counts
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}

//! The catalogue: every family sluice exports, registered once at start.

use std::collections::HashSet;
use std::sync::Mutex;

use prometheus::{
    exponential_buckets, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry,
};

use prometheus::core::Collector;
use prometheus::proto::MetricType;

use super::lean::{self, Cell, LeanVec, Zeroed, Zeros};
use super::{Metrics, BAD_REQUEST_REASONS, DESTINATION_REFUSAL_REASONS, TRANSITIONS, TUNNEL_MODES};

/// One family of the catalogue, as the reference lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Family {
    /// Its full name (`sluice_…`).
    pub name: String,
    /// Its type: `counter`, `gauge`, `histogram`.
    pub kind: &'static str,
    /// Its labels.
    pub labels: Vec<String>,
    /// Its help text.
    pub help: String,
}

/// Removes a family's series of one provider label (see
/// [`Metrics::forget`]).
pub(super) type Forget = Box<dyn Fn(&HashSet<&str>) + Send + Sync>;

/// The registry, noting each family as it is registered: the reference
/// is made from the same registrations `/metrics` serves, and a provider
/// leaving the table leaves every family labelled by provider.
struct Recorder {
    registry: Registry,
    families: Mutex<Vec<Family>>,
    forgets: Mutex<Vec<Forget>>,
}

impl Recorder {
    fn new() -> Self {
        Recorder {
            registry: Registry::new_custom(Some("sluice".into()), None).expect("registry"),
            families: Mutex::new(Vec::new()),
            forgets: Mutex::new(Vec::new()),
        }
    }

    fn register(&self, c: Box<dyn Collector>) -> prometheus::Result<()> {
        let kinds: Vec<MetricType> = c.collect().iter().map(|f| f.get_field_type()).collect();
        let mut families = self.families.lock().unwrap_or_else(|p| p.into_inner());
        for (desc, kind) in c.desc().iter().zip(kinds) {
            families.push(Family {
                name: format!("sluice_{}", desc.fq_name),
                kind: match kind {
                    MetricType::COUNTER => "counter",
                    MetricType::GAUGE => "gauge",
                    MetricType::HISTOGRAM => "histogram",
                    MetricType::SUMMARY => "summary",
                    MetricType::UNTYPED => "untyped",
                },
                labels: desc.variable_labels.clone(),
                help: desc.help.clone(),
            });
        }
        drop(families);
        self.registry.register(c)
    }
}

/// A family labelled by provider, kept lean (see [`lean`]), its
/// series removed with their provider.
fn lean<C: Cell>(r: &Recorder, vec: LeanVec<C>) -> LeanVec<C> {
    r.register(Box::new(vec.clone())).expect("unique metric");
    let forget = vec.clone();
    r.forgets
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(Box::new(move |gone| forget.forget(gone)));
    vec
}

fn gauge(r: &Recorder, name: &str, help: &str, labels: &[&str]) -> LeanVec<lean::Gauge> {
    lean(r, LeanVec::new(name, help, labels))
}

fn int_gauge(r: &Recorder, name: &str, help: &str, labels: &[&str]) -> LeanVec<lean::IntGauge> {
    lean(r, LeanVec::new(name, help, labels))
}

/// A counter family labelled by provider whose series show at zero
/// from each provider's first request (see [`Zeros`]).
fn zeroed_counter(
    r: &Recorder,
    name: &str,
    help: &str,
    labels: &[&str],
    zeros: Zeros,
) -> LeanVec<lean::Counter> {
    lean(r, LeanVec::with_zeros(name, help, labels, zeros))
}

fn provider_counter(
    r: &Recorder,
    name: &str,
    help: &str,
    labels: &[&str],
) -> LeanVec<lean::Counter> {
    lean(r, LeanVec::new(name, help, labels))
}

/// A family not labelled by provider (runs, listeners, reasons): the
/// `prometheus` crate's own, its few series never forgotten.
fn plain_int_gauge(r: &Recorder, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
    r.register(Box::new(g.clone())).expect("unique metric");
    g
}

fn counter(r: &Recorder, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    r.register(Box::new(c.clone())).expect("unique metric");
    c
}

/// An unlabelled metric, registered: a count or a level of the whole
/// process, with no provider series to forget.
fn scalar<M: Collector + Clone + 'static>(r: &Recorder, metric: M) -> M {
    r.register(Box::new(metric.clone())).expect("unique metric");
    metric
}

fn plain_counter(r: &Recorder, name: &str, help: &str) -> IntCounter {
    scalar(r, IntCounter::new(name, help).expect("valid metric"))
}

fn plain_gauge(r: &Recorder, name: &str, help: &str) -> IntGauge {
    scalar(r, IntGauge::new(name, help).expect("valid metric"))
}

fn histogram(r: &Recorder, name: &str, help: &str, buckets: Vec<f64>) -> LeanVec<lean::Histogram> {
    lean(r, LeanVec::with_buckets(name, help, &["provider"], buckets))
}

impl Metrics {
    /// Registers every metric; at most `max_labels` provider labels.
    ///
    /// Long (~380 lines) on purpose: it is the catalogue, one registration
    /// per family with its name and help text, read top to bottom as
    /// `/metrics` lists them. Split by concern it would be the same list
    /// scattered, and a family's name further from its field.
    pub fn new(max_labels: usize) -> Metrics {
        let r = Recorder::new();
        let p = &["provider"];
        let seconds = exponential_buckets(0.001, 2.0, 16).expect("buckets"); // 1 ms … 33 s
                                                                             // What every provider's series show from its first request on.
        let zeroed = Zeroed::default();
        let one = || Zeros {
            providers: zeroed.clone(),
            combos: vec![vec![]],
        };
        let each = |values: &[&'static str]| Zeros {
            providers: zeroed.clone(),
            combos: values.iter().map(|v| vec![*v]).collect(),
        };
        let backoff_reasons: Vec<&'static str> = sluice_policy::pacer::BackoffReason::ALL
            .iter()
            .map(|r| r.label())
            .collect();
        let hold_seconds = lean(
            &r,
            LeanVec::with_zeros(
                "retry_after_hold_seconds_total",
                "Seconds of Retry-After holds set",
                p,
                one(),
            ),
        );
        let tasks_alive = plain_gauge(
            &r,
            "runtime_tasks_alive",
            "Tasks alive in the async runtime (connections, tunnels, background work)",
        );
        let allocations = plain_counter(
            &r,
            "allocations_total",
            "Allocation requests since start (the allocator's count; read at each scrape)",
        );
        let allocated = plain_gauge(
            &r,
            "allocated_bytes",
            "Bytes the allocator holds allocated now (the heap, beside the resident set)",
        );
        let providers_tracked = plain_gauge(&r, "providers_tracked", "Providers in the table");
        let upstream_connections = plain_gauge(
            &r,
            "upstream_connections",
            "Pooled upstream connections open, idle or in use",
        );
        let upstream_connections_resting = plain_gauge(
            &r,
            "upstream_connections_resting",
            "Idle HTTP/1.1 upstream connections resting: the socket kept, hyper's buffers and task let go (all but the most recently used few)",
        );
        let upstream_idle_closed = plain_counter(
            &r,
            "upstream_idle_closed_total",
            "Idle upstream connections closed for upstream.max_idle_connections (and HTTP/2 ones past the 32 kept ready), since start",
        );
        let mut m = Metrics {
            rate: gauge(
                &r,
                "provider_rate_rps",
                "Current paced rate, requests per second",
                p,
            ),
            interval: gauge(
                &r,
                "provider_interval_seconds",
                "Current emission interval (1/rate)",
                p,
            ),
            ceiling: gauge(
                &r,
                "provider_ceiling_rps",
                "The owner's ceiling, requests per second",
                p,
            ),
            start: gauge(
                &r,
                "provider_start_rps",
                "The cold-start rate, requests per second",
                p,
            ),
            limit: gauge(
                &r,
                "provider_throttle_point_rps",
                "Rate at which throttling last began (absent until it has)",
                p,
            ),
            error_baseline: gauge(
                &r,
                "provider_error_baseline_ratio",
                "Learned share of answers that are errors whatever the rate (noise; absent until learned)",
                p,
            ),
            latency_baseline: gauge(
                &r,
                "provider_latency_baseline_seconds",
                "Learned time-to-first-byte baseline, lower quartile (absent until learned)",
                p,
            ),
            provider_down: int_gauge(
                &r,
                "provider_down",
                "1 while the provider is taken to be down (every request failing, or its breaker open): its requests are parked and only probes go",
                p,
            ),
            parked: int_gauge(
                &r,
                "parked_requests",
                "Requests parked through the provider's outage, waiting for its return",
                p,
            ),
            on_trial: int_gauge(
                &r,
                "provider_cut_on_trial",
                "1 while a cut made on a bare 503 or a timeout awaits its verdict (noise or throttle)",
                p,
            ),
            queue: int_gauge(
                &r,
                "provider_queue_length",
                "Requests waiting for a pacing slot",
                p,
            ),
            in_flight: int_gauge(&r, "provider_in_flight", "Attempts in flight upstream", p),
            breaker_state: int_gauge(
                &r,
                "provider_breaker_state",
                "Breaker state: 0 closed, 1 half-open, 2 open",
                p,
            ),
            budget: int_gauge(
                &r,
                "provider_retry_budget_available",
                "Whole retries left in the ratio budget",
                p,
            ),
            hold: gauge(
                &r,
                "provider_hold_remaining_seconds",
                "Time left on a Retry-After hold (0 = none)",
                p,
            ),
            requests: provider_counter(
                &r,
                "requests_total",
                "Client requests by final outcome",
                &["provider", "outcome"],
            ),
            attempts: provider_counter(
                &r,
                "upstream_attempts_total",
                "Attempts sent upstream, by outcome",
                &["provider", "outcome"],
            ),
            retries: provider_counter(
                &r,
                "retries_total",
                "Retries scheduled, by the outcome that caused them",
                &["provider", "reason"],
            ),
            pacing_wait: histogram(
                &r,
                "pacing_wait_seconds",
                "Time a request waited for its pacing slot",
                seconds.clone(),
            ),
            collector_units: provider_counter(
                &r,
                "collector_admitted_units_total",
                "Units admitted to a provider per collector (\"-\": proxy users without one): the fair shares",
                &["provider", "collector"],
            ),
            collector_wait: {
                let h = HistogramVec::new(
                    HistogramOpts::new(
                        "collector_pacing_wait_seconds",
                        "Time a collector's requests waited for their pacing slot, any provider",
                    )
                    .buckets(seconds.clone()),
                    &["collector"],
                )
                .expect("valid metric");
                r.register(Box::new(h.clone())).expect("unique metric");
                h
            },
            collector_waiting: int_gauge(
                &r,
                "collector_waiting",
                "Requests waiting for a provider's pacing slot per collector (\"-\": proxy users without one; absent: none)",
                &["provider", "collector"],
            ),
            allowance_units: gauge(
                &r,
                "provider_allowance_units",
                "Units the provider's long-horizon allowance grants per period (absent without one)",
                p,
            ),
            allowance_spent: gauge(
                &r,
                "provider_allowance_spent_units",
                "Units spent in the allowance's current period",
                p,
            ),
            allowance_reset: gauge(
                &r,
                "provider_allowance_reset_seconds",
                "Until the allowance's period ends",
                p,
            ),
            ttfb: histogram(
                &r,
                "upstream_ttfb_seconds",
                "Upstream time to the response head",
                seconds,
            ),
            holds: zeroed_counter(
                &r,
                "retry_after_holds_total",
                "Retry-After holds set or lengthened",
                p,
                one(),
            ),
            hold_seconds,
            backoffs: zeroed_counter(
                &r,
                "backoffs_total",
                "Rate cuts, by reason",
                &["provider", "reason"],
                each(&backoff_reasons),
            ),
            transitions: zeroed_counter(
                &r,
                "breaker_transitions_total",
                "Breaker transitions",
                &["provider", "from", "to", "reason"],
                Zeros {
                    providers: zeroed.clone(),
                    combos: TRANSITIONS.iter().map(|t| t.to_vec()).collect(),
                },
            ),
            tunnels: zeroed_counter(
                &r,
                "tunnels_total",
                "CONNECT tunnels by mode (intercepted, raw, plain_http)",
                &["provider", "mode"],
                each(&TUNNEL_MODES),
            ),
            upgrades: zeroed_counter(
                &r,
                "upgrades_total",
                "HTTP/1.1 Upgrades (WebSocket) switched through the provider's stack",
                p,
                one(),
            ),
            upgraded_open: plain_gauge(
                &r,
                "upgraded_connections",
                "Upgraded connections (WebSocket) whose bytes sluice is carrying now",
            ),
            interception_failures: zeroed_counter(
                &r,
                "interception_failures_total",
                "Clients that rejected sluice's certificate",
                p,
                one(),
            ),
            visibility: int_gauge(
                &r,
                "provider_request_visibility",
                "1: sluice sees each request; 0: raw tunnels only (visibility lost)",
                p,
            ),
            quota_limit: gauge(
                &r,
                "provider_quota_limit",
                "Requests per window the provider advertises (absent when it advertises none)",
                p,
            ),
            quota_remaining: gauge(
                &r,
                "provider_quota_remaining",
                "Requests left in the provider's advertised window",
                p,
            ),
            quota_reset: gauge(
                &r,
                "provider_quota_reset_seconds",
                "Seconds until the provider's advertised window resets",
                p,
            ),
            quota_advertised: int_gauge(
                &r,
                "provider_pace_advertised",
                "1 while the pace follows the provider's advertised quota, 0 while it is learned",
                p,
            ),
            shared_state: int_gauge(
                &r,
                "shared_budget_state",
                "1 for the state of a shared provider's budget on this replica: shared (paced by Redis), degraded (Redis unreachable: pacing alone at 0.9 × rate / replicas) or joining",
                &["provider", "state"],
            ),
            shared_node: int_gauge(
                &r,
                "shared_budget_node",
                "1 for the Redis node (host:port) a shared provider's budget is kept on, as this replica last knew it: the server, the Cluster primary of the provider's slot, or the primary Sentinel named",
                &["provider", "node"],
            ),
            shared_rate: gauge(
                &r,
                "shared_rate_rps",
                "The rate all replicas pace a shared provider by, as last seen in Redis",
                p,
            ),
            shared_share: gauge(
                &r,
                "shared_admission_share",
                "This replica's share of a shared provider's admissions lately (0-1)",
                p,
            ),
            condition: int_gauge(
                &r,
                "provider_condition",
                "1 for what the controller takes the provider's recent failures for: outage (every answer fails whatever the rate) or throttle (failures fall with the rate); both 0 when nothing fails",
                &["provider", "condition"],
            ),
            outages: zeroed_counter(
                &r,
                "provider_outages_total",
                "Outages found: failures in a row that went on at a rate no cut changed",
                p,
                one(),
            ),
            quota_malformed: provider_counter(
                &r,
                "quota_headers_malformed_total",
                "Answers whose quota headers could not be read (ignored), by header family",
                &["provider", "family"],
            ),
            providers_tracked,
            upstream_connections,
            upstream_connections_resting,
            upstream_idle_closed,
            tasks_alive,
            allocations,
            allocated,
            store_cold_starts: counter(
                &r,
                "store_cold_starts_total",
                "Stores moved aside at start, by reason",
                &["reason"],
            ),
            store_errors: plain_counter(&r, "store_errors_total", "Store reads or writes that failed"),
            accept_errors: counter(
                &r,
                "accept_errors_total",
                "Connections a listener failed to accept (out of file descriptors and the like), by listener",
                &["listener"],
            ),
            bad_requests: counter(
                &r,
                "bad_requests_total",
                "Requests refused as malformed before any provider saw them, by reason",
                &["reason"],
            ),
            destination_refusals: counter(
                &r,
                "destination_refusals_total",
                "Requests refused for their destination before any connection or pacing slot, by reason (the address's class, connect_port, collector_allow)",
                &["reason"],
            ),
            state_restored: plain_counter(
                &r,
                "state_restored_total",
                "Providers whose learned state was restored",
            ),
            reloads: counter(
                &r,
                "config_reloads_total",
                "Config reloads, by result",
                &["result"],
            ),
            runs: counter(
                &r,
                "runs_total",
                "Runs ended, by collector and stop reason (none: finished without a stop)",
                &["collector", "stop_reason"],
            ),
            runs_active: plain_int_gauge(
                &r,
                "runs_active",
                "The collector's active runs (at most one per mode: steady, catchup)",
                &["collector"],
            ),
            run_attempts: counter(
                &r,
                "run_attempts_total",
                "Attempts of runs that reached the provider, retries included",
                &["collector"],
            ),
            gaps_pending: plain_int_gauge(
                &r,
                "gaps_pending",
                "Pending gap records (deferred work)",
                &["collector"],
            ),
            checkpoint_commits: counter(
                &r,
                "checkpoint_commits_total",
                "Checkpoints committed and flushed",
                &["collector"],
            ),
            labels: Mutex::new(HashSet::new()),
            zeroed,
            max_labels,
            registry: r.registry.clone(),
            families: Vec::new(),
            forgets: Vec::new(),
        };
        for result in ["ok", "rejected"] {
            m.reloads.with_label_values(&[result]);
        }
        let build = IntGaugeVec::new(
            Opts::new("build_info", "sluice's version (always 1)"),
            &["version"],
        )
        .expect("valid metric");
        build.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        r.register(Box::new(build)).expect("unique metric");
        m.store_cold_starts.with_label_values(&["unreadable"]);
        for listener in ["proxy", "admin"] {
            m.accept_errors.with_label_values(&[listener]);
        }
        for reason in BAD_REQUEST_REASONS {
            m.bad_requests.with_label_values(&[reason]);
        }
        for reason in crate::upstream::guard::CLASSES
            .iter()
            .chain(&DESTINATION_REFUSAL_REASONS)
        {
            m.destination_refusals.with_label_values(&[reason]);
        }
        m.families = r.families.into_inner().unwrap_or_else(|p| p.into_inner());
        m.forgets = r.forgets.into_inner().unwrap_or_else(|p| p.into_inner());
        m
    }

    /// Every family sluice exports, in the order of registration.
    pub fn families(&self) -> &[Family] {
        &self.families
    }
}

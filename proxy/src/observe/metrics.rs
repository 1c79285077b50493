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

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, OnceLock};

use crate::shared::{BudgetMode, BudgetReadout};
use prometheus::{
    exponential_buckets, CounterVec, Encoder, GaugeVec, Histogram, HistogramOpts, HistogramVec,
    IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};
use sluice_policy::breaker::Transition;
use sluice_policy::events::Event;
use sluice_policy::pacer::Condition;
use sluice_policy::provider::ProviderSnapshot;

/// One provider's series that every answered request touches, each
/// looked up on first use and kept (issue 24: a look-up by label hashes
/// the values and takes the family's lock; series are never removed, so a
/// kept handle stays the exported one).
#[derive(Debug, Default)]
pub struct Handles {
    attempt_success: OnceLock<IntCounter>,
    ttfb: OnceLock<Histogram>,
    pacing_wait: OnceLock<Histogram>,
    unclassed_units: OnceLock<IntCounter>,
    unclassed_wait: OnceLock<Histogram>,
}

/// A provider's `sluice_requests_total{outcome="success"}`, found once:
/// every answered request counts there (see [`Handles`]).
#[derive(Debug, Default)]
pub struct RequestHandle(OnceLock<IntCounter>);

/// The label every provider beyond the label cap shares.
pub const OTHER: &str = "_other";

/// All of sluice's metrics.
pub struct Metrics {
    registry: Registry,
    labels: Mutex<HashSet<String>>,
    max_labels: usize,
    rate: GaugeVec,
    interval: GaugeVec,
    ceiling: GaugeVec,
    start: GaugeVec,
    limit: GaugeVec,
    error_baseline: GaugeVec,
    latency_baseline: GaugeVec,
    on_trial: IntGaugeVec,
    provider_down: IntGaugeVec,
    parked: IntGaugeVec,
    condition: IntGaugeVec,
    outages: IntCounterVec,
    queue: IntGaugeVec,
    in_flight: IntGaugeVec,
    breaker_state: IntGaugeVec,
    budget: IntGaugeVec,
    hold: GaugeVec,
    requests: IntCounterVec,
    attempts: IntCounterVec,
    retries: IntCounterVec,
    pacing_wait: HistogramVec,
    collector_units: IntCounterVec,
    collector_wait: HistogramVec,
    collector_waiting: IntGaugeVec,
    allowance_units: GaugeVec,
    allowance_spent: GaugeVec,
    allowance_reset: GaugeVec,
    ttfb: HistogramVec,
    holds: IntCounterVec,
    hold_seconds: CounterVec,
    backoffs: IntCounterVec,
    transitions: IntCounterVec,
    tunnels: IntCounterVec,
    upgrades: IntCounterVec,
    upgraded_open: IntGauge,
    interception_failures: IntCounterVec,
    visibility: IntGaugeVec,
    quota_limit: GaugeVec,
    quota_remaining: GaugeVec,
    quota_reset: GaugeVec,
    quota_advertised: IntGaugeVec,
    shared_state: IntGaugeVec,
    shared_rate: GaugeVec,
    shared_share: GaugeVec,
    quota_malformed: IntCounterVec,
    /// Providers in the table.
    pub providers_tracked: IntGauge,
    /// Tasks alive in the runtime (connections, tunnels, writers…): flat
    /// at rest, back to it after load — a stuck waiter shows here.
    pub tasks_alive: IntGauge,
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

fn gauge(r: &Registry, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    let g = GaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
    r.register(Box::new(g.clone())).expect("unique metric");
    g
}

fn int_gauge(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
    r.register(Box::new(g.clone())).expect("unique metric");
    g
}

fn counter(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    r.register(Box::new(c.clone())).expect("unique metric");
    c
}

fn histogram(r: &Registry, name: &str, help: &str, buckets: Vec<f64>) -> HistogramVec {
    let h = HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets),
        &["provider"],
    )
    .expect("valid metric");
    r.register(Box::new(h.clone())).expect("unique metric");
    h
}

/// One upgraded connection in the open gauge while it lives.
#[derive(Debug)]
pub struct UpgradedGuard(IntGauge);

impl Drop for UpgradedGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The reasons `sluice_bad_requests_total` counts.
pub const BAD_REQUEST_REASONS: [&str; 2] = ["invalid_port", "ambiguous_length"];

impl Metrics {
    /// Registers every metric; at most `max_labels` provider labels.
    pub fn new(max_labels: usize) -> Metrics {
        let r = Registry::new_custom(Some("sluice".into()), None).expect("registry");
        let p = &["provider"];
        let seconds = exponential_buckets(0.001, 2.0, 16).expect("buckets"); // 1 ms … 33 s
        let plain_counter = |name: &str, help: &str| {
            let c = IntCounter::new(name, help).expect("valid metric");
            r.register(Box::new(c.clone())).expect("unique metric");
            c
        };
        let hold_seconds = CounterVec::new(
            Opts::new(
                "retry_after_hold_seconds_total",
                "Seconds of Retry-After holds set",
            ),
            p,
        )
        .expect("valid metric");
        r.register(Box::new(hold_seconds.clone()))
            .expect("unique metric");
        let tasks_alive = IntGauge::new(
            "runtime_tasks_alive",
            "Tasks alive in the async runtime (connections, tunnels, background work)",
        )
        .expect("valid metric");
        r.register(Box::new(tasks_alive.clone()))
            .expect("unique metric");
        let providers_tracked =
            IntGauge::new("providers_tracked", "Providers in the table").expect("valid metric");
        r.register(Box::new(providers_tracked.clone()))
            .expect("unique metric");
        let m = Metrics {
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
            requests: counter(
                &r,
                "requests_total",
                "Client requests by final outcome",
                &["provider", "outcome"],
            ),
            attempts: counter(
                &r,
                "upstream_attempts_total",
                "Attempts sent upstream, by outcome",
                &["provider", "outcome"],
            ),
            retries: counter(
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
            collector_units: counter(
                &r,
                "collector_admitted_units_total",
                "Units admitted to a provider per collector (\"-\": proxy users without one): the fair shares (R-FS1)",
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
            holds: counter(
                &r,
                "retry_after_holds_total",
                "Retry-After holds set or lengthened",
                p,
            ),
            hold_seconds,
            backoffs: counter(
                &r,
                "backoffs_total",
                "Rate cuts, by reason",
                &["provider", "reason"],
            ),
            transitions: counter(
                &r,
                "breaker_transitions_total",
                "Breaker transitions",
                &["provider", "from", "to", "reason"],
            ),
            tunnels: counter(
                &r,
                "tunnels_total",
                "CONNECT tunnels by mode (intercepted, raw, plain_http)",
                &["provider", "mode"],
            ),
            upgrades: counter(
                &r,
                "upgrades_total",
                "HTTP/1.1 Upgrades (WebSocket) switched through the provider's stack",
                p,
            ),
            upgraded_open: {
                let g = IntGauge::new(
                    "upgraded_connections",
                    "Upgraded connections (WebSocket) whose bytes sluice is carrying now",
                )
                .expect("valid metric");
                r.register(Box::new(g.clone())).expect("unique metric");
                g
            },
            interception_failures: counter(
                &r,
                "interception_failures_total",
                "Clients that rejected sluice's certificate",
                p,
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
                "1 for the state of a shared provider's budget on this replica: shared (paced by Redis), degraded (Redis unreachable: pacing alone at rate / replicas) or joining",
                &["provider", "state"],
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
            outages: counter(
                &r,
                "provider_outages_total",
                "Outages found: failures in a row that went on at a rate no cut changed (R-SG4)",
                p,
            ),
            quota_malformed: counter(
                &r,
                "quota_headers_malformed_total",
                "Answers whose quota headers could not be read (ignored), by header family",
                &["provider", "family"],
            ),
            providers_tracked,
            tasks_alive,
            store_cold_starts: counter(
                &r,
                "store_cold_starts_total",
                "Stores moved aside at start, by reason",
                &["reason"],
            ),
            store_errors: plain_counter("store_errors_total", "Store reads or writes that failed"),
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
            state_restored: plain_counter(
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
            runs_active: int_gauge(
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
            gaps_pending: int_gauge(
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
            max_labels,
            registry: r,
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
        m.registry.register(Box::new(build)).expect("unique metric");
        m.store_cold_starts.with_label_values(&["unreadable"]);
        for listener in ["proxy", "admin"] {
            m.accept_errors.with_label_values(&[listener]);
        }
        for reason in BAD_REQUEST_REASONS {
            m.bad_requests.with_label_values(&[reason]);
        }
        m
    }

    /// Creates a provider's counters at zero, so that `rate()` and
    /// `increase()` see them from the start rather than from the first
    /// event (the label combinations are fixed and few).
    pub fn init_provider(&self, label: &str) {
        self.outages.with_label_values(&[label]);
        for reason in sluice_policy::pacer::BackoffReason::ALL {
            self.backoffs.with_label_values(&[label, reason.label()]);
        }
        self.holds.with_label_values(&[label]);
        self.hold_seconds.with_label_values(&[label]);
        self.interception_failures.with_label_values(&[label]);
        self.upgrades.with_label_values(&[label]);
        for mode in ["intercepted", "raw", "plain_http"] {
            self.tunnels.with_label_values(&[label, mode]);
        }
        for (from, to, reason) in [
            ("closed", "open", "failure_rate"),
            ("open", "half_open", "reset_timeout"),
            ("half_open", "closed", "probes_succeeded"),
            ("half_open", "open", "probe_failed"),
            ("closed", "open", "failure_streak"),
        ] {
            self.transitions
                .with_label_values(&[label, from, to, reason]);
        }
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

    /// Counts a client rejecting the interception.
    pub fn interception_failed(&self, label: &str) {
        self.interception_failures.with_label_values(&[label]).inc();
    }

    /// Records one policy event.
    pub fn event(&self, label: &str, event: &Event) {
        match event {
            Event::Attempt { outcome, ttfb } => {
                let o = outcome.map_or("no_answer", |o| o.label());
                self.attempts.with_label_values(&[label, o]).inc();
                if let Some(t) = ttfb {
                    self.ttfb
                        .with_label_values(&[label])
                        .observe(t.as_secs_f64());
                }
            }
            Event::PacingWait(w) => self
                .pacing_wait
                .with_label_values(&[label])
                .observe(w.as_secs_f64()),
            Event::Admitted { class, units, wait } => {
                let collector = if class.is_empty() { "-" } else { class };
                self.collector_units
                    .with_label_values(&[label, collector])
                    .inc_by(u64::from(*units));
                self.collector_wait
                    .with_label_values(&[collector])
                    .observe(wait.as_secs_f64());
            }
            Event::Shed(_) => {}
            Event::Hold(d) => {
                self.holds.with_label_values(&[label]).inc();
                self.hold_seconds
                    .with_label_values(&[label])
                    .inc_by(d.as_secs_f64());
            }
            Event::Backoff(b) => self
                .backoffs
                .with_label_values(&[label, b.reason.label()])
                .inc(),
            Event::Retry(o) => self.retries.with_label_values(&[label, o.label()]).inc(),
            Event::Outage(true) => self.outages.with_label_values(&[label]).inc(),
            Event::Outage(false) => {}
            Event::QuotaMalformed(family) => self
                .quota_malformed
                .with_label_values(&[label, family.label()])
                .inc(),
        }
    }

    /// Records a provider's event through its [`Handles`]: the series every
    /// answered request touches are looked up once per provider, the rest
    /// as [`Metrics::event`] does.
    pub fn event_with(&self, label: &str, h: &Handles, event: &Event) {
        match event {
            Event::Attempt {
                outcome: Some(sluice_policy::classify::Outcome::Success),
                ttfb,
            } => {
                h.attempt_success
                    .get_or_init(|| self.attempts.with_label_values(&[label, "success"]))
                    .inc();
                if let Some(t) = ttfb {
                    h.ttfb
                        .get_or_init(|| self.ttfb.with_label_values(&[label]))
                        .observe(t.as_secs_f64());
                }
            }
            Event::PacingWait(w) => h
                .pacing_wait
                .get_or_init(|| self.pacing_wait.with_label_values(&[label]))
                .observe(w.as_secs_f64()),
            Event::Admitted { class, units, wait } if class.is_empty() => {
                h.unclassed_units
                    .get_or_init(|| self.collector_units.with_label_values(&[label, "-"]))
                    .inc_by(u64::from(*units));
                h.unclassed_wait
                    .get_or_init(|| self.collector_wait.with_label_values(&["-"]))
                    .observe(wait.as_secs_f64());
            }
            other => self.event(label, other),
        }
    }

    /// Records a breaker transition.
    pub fn transition(&self, label: &str, t: &Transition) {
        self.transitions
            .with_label_values(&[label, t.from.label(), t.to.label(), t.reason.label()])
            .inc();
    }

    /// Sets the per-provider gauges from snapshots; providers no longer in
    /// the table disappear from them.
    pub fn refresh<'a>(
        &self,
        snapshots: impl Iterator<Item = (&'a ProviderSnapshot, bool, Option<BudgetReadout>)>,
    ) {
        for g in [
            &self.shared_rate,
            &self.shared_share,
            &self.rate,
            &self.interval,
            &self.ceiling,
            &self.start,
            &self.limit,
            &self.hold,
            &self.error_baseline,
            &self.latency_baseline,
            &self.quota_limit,
            &self.quota_remaining,
            &self.quota_reset,
            &self.allowance_units,
            &self.allowance_spent,
            &self.allowance_reset,
        ] {
            g.reset();
        }
        for g in [
            &self.provider_down,
            &self.parked,
            &self.on_trial,
            &self.condition,
            &self.queue,
            &self.collector_waiting,
            &self.in_flight,
            &self.breaker_state,
            &self.budget,
            &self.visibility,
            &self.quota_advertised,
            &self.shared_state,
        ] {
            g.reset();
        }
        let mut n = 0;
        for (s, visible, budget) in snapshots {
            n += 1;
            let l = self.label(&s.name);
            let l = [l.as_str()];
            if let Some(b) = budget {
                for mode in [
                    BudgetMode::Shared,
                    BudgetMode::Degraded,
                    BudgetMode::Joining,
                ] {
                    self.shared_state
                        .with_label_values(&[l[0], mode.label()])
                        .set(i64::from(b.mode == mode));
                }
                if let Some(r) = b.rate_rps {
                    self.shared_rate.with_label_values(&l).set(r);
                }
                if let Some(share) = b.share {
                    self.shared_share.with_label_values(&l).set(share);
                }
            }
            self.rate.with_label_values(&l).set(s.pacer.rate_rps);
            self.interval
                .with_label_values(&l)
                .set(s.pacer.interval.as_secs_f64());
            self.ceiling.with_label_values(&l).set(s.pacer.ceiling_rps);
            self.start.with_label_values(&l).set(s.pacer.start_rps);
            self.quota_advertised
                .with_label_values(&l)
                .set(i64::from(s.pacer.authority == "advertised"));
            if let Some(q) = &s.pacer.quota {
                if let Some(limit) = q.advertised.limit {
                    self.quota_limit.with_label_values(&l).set(limit as f64);
                }
                self.quota_remaining
                    .with_label_values(&l)
                    .set(q.advertised.remaining as f64);
                self.quota_reset
                    .with_label_values(&l)
                    .set(q.reset_in.as_secs_f64());
            }
            if let Some(a) = &s.pacer.allowance {
                self.allowance_units
                    .with_label_values(&l)
                    .set(a.allowance.units as f64);
                self.allowance_spent.with_label_values(&l).set(a.spent);
                self.allowance_reset
                    .with_label_values(&l)
                    .set(a.resets_in.as_secs_f64());
            }
            if let Some(limit) = s.pacer.limit_rps {
                self.limit.with_label_values(&l).set(limit);
            }
            if let Some(e) = s.pacer.error_baseline {
                self.error_baseline.with_label_values(&l).set(e);
            }
            if let Some(b) = s.pacer.baseline_ttfb {
                self.latency_baseline
                    .with_label_values(&l)
                    .set(b.as_secs_f64());
            }
            self.on_trial
                .with_label_values(&l)
                .set(i64::from(s.pacer.on_trial));
            self.provider_down
                .with_label_values(&l)
                .set(i64::from(s.park.watch.down.is_some()));
            self.parked.with_label_values(&l).set(s.park.parked as i64);
            for c in [Condition::Outage, Condition::Throttle] {
                self.condition
                    .with_label_values(&[l[0], c.label()])
                    .set(i64::from(s.pacer.belief.is_some_and(|b| b.condition == c)));
            }
            self.hold
                .with_label_values(&l)
                .set(s.pacer.hold_remaining.map_or(0.0, |h| h.as_secs_f64()));
            self.queue
                .with_label_values(&l)
                .set(s.pacer.queue_len as i64);
            for (collector, waiting) in &s.pacer.waiting_by_collector {
                let collector = if collector.is_empty() { "-" } else { collector };
                self.collector_waiting
                    .with_label_values(&[l[0], collector])
                    .set(*waiting as i64);
            }
            self.in_flight.with_label_values(&l).set(s.in_flight as i64);
            self.breaker_state
                .with_label_values(&l)
                .set(s.breaker.state.gauge());
            self.budget
                .with_label_values(&l)
                .set(i64::from(s.retry_budget_left));
            self.visibility
                .with_label_values(&l)
                .set(i64::from(visible));
        }
        self.providers_tracked.set(n);
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

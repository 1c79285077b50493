//! Gauges read at scrape time from each provider's snapshot, so that they
//! never disagree with `/v1/providers`.

use crate::shared::{BudgetMode, BudgetReadout};
use sluice_policy::pacer::Condition;
use sluice_policy::provider::ProviderSnapshot;

use super::Metrics;

impl Metrics {
    /// Sets the per-provider gauges from snapshots; providers no longer in
    /// the table disappear from them. The snapshots are taken one at a
    /// time as the iterator goes (R-PF1, issue 38): all of a crawl's
    /// 100,000 providers' snapshots held at once were some 30 MiB more
    /// resident for each scrape.
    pub fn refresh(
        &self,
        snapshots: impl Iterator<Item = (ProviderSnapshot, bool, Option<BudgetReadout>)>,
    ) {
        self.reset_provider_gauges();
        let mut n = 0;
        for (s, visible, budget) in snapshots {
            n += 1;
            let l = self.label(&s.name);
            let l = [l.as_str()];
            if let Some(b) = &budget {
                self.set_shared(l, b);
            }
            self.set_pacer(l, &s);
            self.set_layers(l, &s, visible);
        }
        self.providers_tracked.set(n);
    }

    /// Empties every per-provider gauge, so that a provider gone from the
    /// table leaves no series behind.
    fn reset_provider_gauges(&self) {
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
            &self.shared_node,
        ] {
            g.reset();
        }
    }

    /// The shared budget's gauges: its mode, the fleet's rate and this
    /// replica's share.
    fn set_shared(&self, l: [&str; 1], b: &BudgetReadout) {
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
        if let Some(node) = &b.node {
            self.shared_node.with_label_values(&[l[0], node]).set(1);
        }
    }

    /// The controller's gauges: the pace, its bounds, what it has learned
    /// and what it believes.
    fn set_pacer(&self, l: [&str; 1], s: &ProviderSnapshot) {
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
    }

    /// The gauges of the layers around the pacer: the bulkhead, the breaker,
    /// the retry budget, parking, and whether the provider's answers are
    /// seen.
    fn set_layers(&self, l: [&str; 1], s: &ProviderSnapshot, visible: bool) {
        self.provider_down
            .with_label_values(&l)
            .set(i64::from(s.park.watch.down.is_some()));
        self.parked.with_label_values(&l).set(s.park.parked as i64);
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
}

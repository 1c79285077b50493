//! Counters and histograms fed as things happen: the policy's events and
//! the breaker's transitions.

use sluice_policy::breaker::Transition;
use sluice_policy::events::Event;

use super::{Handles, Metrics};

impl Metrics {
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
}

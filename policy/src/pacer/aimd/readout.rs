//! What the controller makes of the recent failures, for the readout.

use super::*;

/// What the controller believes about a provider's failures (R-SG4): the
/// readout and metrics say it, with why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    /// Failures fall with the rate (or the provider said so: 429, 503
    /// with `Retry-After`): the rate is cut and the throttle point kept.
    Throttle,
    /// Every answer fails whatever the rate: the breaker decides, and the
    /// rate from before is given back when the provider answers again.
    Outage,
}

impl Condition {
    /// A bounded label for metrics and the readout.
    pub fn label(self) -> &'static str {
        match self {
            Condition::Throttle => "throttle",
            Condition::Outage => "outage",
        }
    }
}

/// What the controller makes of the provider's recent failures, with the
/// evidence, for the readout.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Belief {
    /// Outage or throttle.
    pub condition: Condition,
    /// Why, as a bounded label.
    pub why: &'static str,
    /// Failures in a row so far (0 for a throttle the provider named).
    pub failures: u32,
    /// Since when.
    pub since: Instant,
}

impl Aimd {
    /// What the controller makes of the recent failures at `now`, if
    /// anything: an outage while one is believed; a throttle while a
    /// streak of failures is being cut on, a cut awaits its trial, or a
    /// throttle the provider named is less than [`TRIAL_MAX_AGE`] old.
    pub fn belief(&self, now: Instant) -> Option<Belief> {
        if let Some(s) = self.streak.as_deref().copied() {
            if let Some(at) = s.outage_at {
                return Some(Belief {
                    condition: Condition::Outage,
                    why: if s.cuts > 0 {
                        "failures_went_on_at_a_lower_rate"
                    } else {
                        "every_answer_failed"
                    },
                    failures: s.failures,
                    since: at,
                });
            }
            if s.cuts > 0 {
                return Some(Belief {
                    condition: Condition::Throttle,
                    why: if s.relapse {
                        "failures_came_back_with_the_rate"
                    } else {
                        "failures_in_a_row_cut_on_trial"
                    },
                    failures: s.failures,
                    since: s.began,
                });
            }
        }
        if let Some(t) = self.trial.as_deref().copied() {
            return Some(Belief {
                condition: Condition::Throttle,
                why: "errors_above_noise_cut_on_trial",
                failures: 0,
                since: t.cut_at,
            });
        }
        self.k()
            .named_throttle
            .map(Stamp::at)
            .filter(|at| now.saturating_duration_since(*at) < TRIAL_MAX_AGE)
            .map(|at| Belief {
                condition: Condition::Throttle,
                why: "provider_named_it",
                failures: 0,
                since: at,
            })
    }
}

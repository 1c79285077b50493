//! What an answer does to the pace: the controller's feedback, and the
//! hold a `Retry-After` puts on every request (R-RA1).

use super::quota::EDGE_ANSWERS;
use super::*;

impl PacerCore {
    /// Feeds back what an attempt admitted at `sent_at` came back with.
    /// `ttfb` is the time from dispatch to the response head, when there was
    /// one.
    pub fn on_outcome(
        &mut self,
        outcome: &Outcome,
        sent_at: Instant,
        ttfb: Option<Duration>,
        now: Instant,
    ) -> Feedback {
        let mut fb = Feedback::default();
        let (outages, in_outage) = (self.aimd.outages(), self.aimd.in_outage());
        // What the answer says is decided once, in `classify`.
        match outcome.signal() {
            // A client error (404 for a deleted record, 400 for a bad id)
            // is the provider working normally: a clean answer for the rate,
            // like a success (but never retried, never a breaker failure).
            Signal::Clean => {
                if let Some(learner) = self.rare.window_mut() {
                    if learner.boundary.is_some_and(|b| sent_at >= b) {
                        learner.since += 1;
                    }
                    if let Some((_, w, start, used)) = learner.learned.as_mut() {
                        while now >= *start + *w {
                            *start += *w;
                            *used = 0;
                        }
                        *used += 1;
                    }
                }
                let change = self.aimd.on_clean(sent_at, now, ttfb);
                fb.increased = change.increased;
                fb.backoff = change.backoff;
            }
            // A bare 503 may be noise: weighed against the error baseline.
            Signal::Ambiguous { timeout: false } => {
                fb.backoff = self
                    .aimd
                    .on_ambiguous(sent_at, now, BackoffReason::Unavailable);
            }
            Signal::Throttle {
                status,
                retry_after,
            } => {
                if let Some(wait) = retry_after {
                    let until = now + wait;
                    fb.hold_until = self.hold(now, until, HoldCause::Refused);
                    if status == 429 {
                        self.learn_window(until, wait);
                    }
                }
                self.aimd.on_hold(retry_after.unwrap_or_default());
                let reason = if status == 503 {
                    BackoffReason::UnavailableRetryAfter
                } else {
                    BackoffReason::Throttled
                };
                // Throttled while following its word: the provider allows
                // less than it advertises; AIMD learns the rest — except a
                // rolling quota's refusal that none came shortly before, the
                // network's jitter at a window's edge (it is paced under its
                // rate already; see `EDGE_ANSWERS`). Nor
                // was it delivered: its quota headers, read next, are not
                // counted as a delivery (see `Quota::delivery`).
                if let Some(q) = self.rare.quota_mut() {
                    let jitter = q
                        .edge_refused
                        .is_none_or(|at| q.answers >= at + EDGE_ANSWERS);
                    if q.rolling() && q.trusted && jitter {
                        q.edge_refused = Some(q.answers);
                    } else {
                        q.trusted = false;
                    }
                    q.delivery.served = q.delivery.served.saturating_sub(1);
                }
                fb.backoff = self.aimd.on_throttle(sent_at, now, reason);
            }
            Signal::Ambiguous { timeout: true } => {
                fb.backoff = self.aimd.on_ambiguous(sent_at, now, BackoffReason::Timeout);
            }
            Signal::Failure => {
                self.aimd.on_error(sent_at, now);
            }
        }
        if let Some(backoff) = fb.backoff {
            self.aimd.remember_backoff(backoff);
        }
        if self.aimd.outages() > outages {
            fb.outage = Some(true);
        } else if in_outage && !self.aimd.in_outage() {
            fb.outage = Some(false);
        }
        self.sync_interval();
        fb
    }

    /// Holds every request until `until` unless a longer hold is in force;
    /// returns the new end if it moved. A refusal's hold is also what this
    /// replica tells a shared budget that lost it (a quota's is read again
    /// from the next answer).
    pub(super) fn hold(
        &mut self,
        now: Instant,
        until: Instant,
        cause: HoldCause,
    ) -> Option<Instant> {
        if let Some(fleet) = self
            .rare
            .fleet_mut()
            .filter(|_| cause == HoldCause::Refused)
        {
            if fleet.hold.is_none_or(|h| h < until) {
                fleet.hold = Some(until);
            }
        }
        if self.hold_until().is_some_and(|h| h >= until) {
            return None;
        }
        if self.hold_until().is_none_or(|h| h <= now) {
            self.holds += 1;
        }
        self.hold_until = Some(until.into());
        Some(until)
    }

    /// The hold in force at `now`: time left, and which hold it is.
    pub fn hold_left(&self, now: Instant) -> Option<(Duration, u64)> {
        self.hold_until()
            .filter(|h| *h > now)
            .map(|h| (h - now, self.holds))
    }
}

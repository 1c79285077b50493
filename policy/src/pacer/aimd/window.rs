//! Window accounting: what each increase window admitted, delivered and
//! answered, closed once a window has run its length — the latency verdict
//! and the growth it allows are judged there.

use super::*;

/// Demand must reach this share of the pace for a window to count.
pub const SATURATION: f64 = 0.8;

/// Clean answers a window needs to measure what the provider delivered.
pub(super) const DELIVERED_MIN_ANSWERS: u32 = 10;

impl Aimd {
    /// A shared budget made this replica wait: its demand saturates the
    /// shared pace.
    pub fn on_pressed(&mut self) {
        self.window_pressed = true;
    }

    /// Pacing alone at a share of a fleet's rate (R-DS2), or not: while
    /// alone no window is saturated — demand pressing on a fraction of the
    /// rate is no evidence the whole rate could grow, and a replica that
    /// grew it would raise the fleet's on rejoining. Going alone also
    /// starts the wait before a probe over (a probe under way ends): a
    /// probe due during the spell would otherwise go at the first window
    /// after the rejoin — measured, in 3 Cluster failovers of 5, the
    /// fleet's rate 10 % over the limit seconds after it was back.
    pub fn set_alone(&mut self, alone: bool) {
        if alone && !self.alone {
            self.reset_plateau();
        }
        self.alone = alone;
    }

    /// A request was admitted at `now`.
    pub fn on_admit(&mut self, now: Instant) {
        self.on_admitted(now, 1);
        self.on_admitted_here();
    }

    /// `n` requests were admitted by `now` — by every replica, when the
    /// budget is shared: saturation and the wait before a probe are
    /// measured on the one schedule, as one sluice would.
    pub fn on_admitted(&mut self, now: Instant, n: u32) {
        self.window_start.get_or_insert(now.into());
        self.window_admitted = self.window_admitted.saturating_add(n);
    }

    /// A shared budget counted `n` admissions by every replica over `span`
    /// (between two of its answers to this replica; `None` when a hold cut
    /// into it).
    pub fn on_shared_admitted(&mut self, now: Instant, n: u32, span: Option<Duration>) {
        self.on_admitted(now, n);
        if let Some(span) = span {
            self.window_counted = self.window_counted.saturating_add(n);
            self.window_span_ns = self
                .window_span_ns
                .saturating_add(crate::clock::nanos(span));
        }
    }

    /// This replica took one of the admissions counted by
    /// [`Aimd::on_admitted`] (a shared budget's).
    pub fn on_admitted_here(&mut self) {
        self.window_here = self.window_here.saturating_add(1);
    }

    /// A request costing `units` was admitted at `now`: it counts as that
    /// many towards saturation and the wait before a probe (R-FS2).
    pub fn on_admit_units(&mut self, now: Instant, units: u32) {
        self.on_admitted(now, units);
        self.window_here = self.window_here.saturating_add(units);
    }

    /// Closes the window if it has run its length: judges latency, grows.
    pub(super) fn close_window(&mut self, now: Instant) -> Change {
        let start = self.window_start.get_or_insert(now.into()).at();
        let elapsed = now.saturating_duration_since(start);
        if elapsed < self.window() {
            return Change::default();
        }
        let secs = elapsed.as_secs_f64();
        let saturated = !self.alone
            && (self.window_pressed
                || f64::from(self.window_admitted) >= SATURATION * self.rate * secs);
        let clean = !self.window_cut && !self.errors.window_spoiled();
        // The wait before a probe counts the provider's admissions: every
        // replica's, when the budget is shared (a failed probe costs the
        // whole fleet one `Retry-After`, as it costs one sluice). Counting
        // each replica's own, a fleet of 8 found a limit raised a tenth
        // not in a minute; the fleet's, in 10–28 s, now that a fleet
        // refused after a long hold settles as closely as one sluice.
        let admitted = self.window_admitted;
        // A window of a few answers is too coarse a measure of delivery.
        let delivered = if self.window_answers > 0 && self.window_span_ns != 0 {
            // Shared: every replica's admissions over the time they were
            // counted in, times the share of this replica's answers that
            // were clean (a sample of the provider's).
            let clean = f64::from(self.window_delivered) / f64::from(self.window_answers);
            (self.window_counted >= DELIVERED_MIN_ANSWERS).then(|| {
                f64::from(self.window_counted)
                    / Duration::from_nanos(self.window_span_ns).as_secs_f64()
                    * clean
            })
        } else {
            (self.window_delivered >= DELIVERED_MIN_ANSWERS)
                .then(|| f64::from(self.window_delivered) / secs)
        };
        self.delivered = Maybe::from(delivered);
        self.errors.roll();
        self.window_start = Some(now.into());
        self.window_admitted = 0;
        self.window_pressed = false;
        self.window_delivered = 0;
        self.window_here = 0;
        self.window_answers = 0;
        self.window_counted = 0;
        self.window_span_ns = 0;
        self.window_cut = false;
        let draining = match self.latency.judge(self.latency_factor()) {
            LatencyVerdict::Shift(_) => {
                let backoff = self.cut(now, BackoffReason::Latency, None);
                self.trial = None;
                self.reset(|k| k.limit_weak = false);
                return Change {
                    increased: false,
                    backoff: Some(backoff),
                };
            }
            LatencyVerdict::Draining => true,
            LatencyVerdict::Normal | LatencyVerdict::Unjudged => false,
        };
        let before = self.rate;
        let increased = clean && saturated && !draining && self.increase(admitted, now);
        if increased && self.shared {
            self.kp_mut().own_raise = Some((before, self.rate));
        }
        Change {
            increased,
            backoff: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    /// R-PF1 (issue 38): what pushback teaches is made on the first
    /// pushback. Slow start's growth, clean answers, a latency baseline
    /// and a server error or two (a crawl's host meets no more) leave it
    /// unmade; a throttle makes it, and a restore without a limit does not.
    #[test]
    fn what_pushback_teaches_is_made_by_the_first_pushback() {
        let mut t = Instant::now();
        let mut a = Aimd::new(2.0, 0.1, 100.0, 0.7, W);
        saturate(&mut a, &mut t, 6);
        assert!(a.rate() > 5.0, "grew: {}", a.rate());
        a.on_error(t, t);
        saturate(&mut a, &mut t, 2);
        a.on_hold(Duration::ZERO);
        a.restore(a.rate(), None, None);
        assert!(a.known.is_none(), "made without pushback: {:?}", a.known);
        assert_eq!(a.limit(), None);

        a.on_throttle(t, t, BackoffReason::Throttled)
            .expect("a cut");
        assert!(a.known.is_some());
        assert!(a.limit().is_some(), "the throttle placed a limit");
    }
}

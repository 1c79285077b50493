//! The token-bucket fit (R-SG5): how long each rate lasted after a hold
//! before it was refused tells a bucket's refill rate.

use super::*;
use crate::pacer::shared::FleetRefusal;

/// Refusals a [`Descent`] fits, the most recent.
pub(super) const DESCENT_POINTS: usize = 4;

/// A refusal older than this was another limit's.
pub(super) const DESCENT_MAX_AGE: Duration = Duration::from_secs(120);

/// The fitted points must lie this far apart in time, as a share of the
/// shortest, to tell a slope from noise.
pub(super) const DESCENT_SPREAD: f64 = 0.25;

/// A fleet's refusal read from the shared store within this of one this
/// replica was answered itself is that one, better counted: it replaces it.
pub(super) const SAME_REFUSAL: Duration = Duration::from_millis(250);

/// A fit whose bound lies within this share of its rate sets the limit
/// as closely as a sharp limit's: settled at [`SETTLE_SHARP`] of the bound,
/// the rate is under the bucket's.
pub(super) const FIT_TIGHT: f64 = 0.02;

/// Where a token bucket's refill rate lies, read from how long each rate
/// lasted after a hold before it was refused (R-SG5).
///
/// A hold (`Retry-After`) lets the provider's bucket fill. Sent at a rate
/// `r` from the hold's end, its burst `B` lasts `t = B / (r − L)`: the
/// requests it let through, `r·t = B + L·t`, grow with `t` at exactly the
/// refill rate `L`. Two refusals at different rates give that slope, where
/// the plain descent — one step per refusal, each refusal later than the
/// one before as the rate nears `L` — takes half a minute to close in.
/// Each point is known to about a request (the refusal fell between two
/// sends), so the fit is read with that error on the high side: a noisy
/// fit leaves the plain descent to do the rest, and never puts the limit
/// under the provider's. A windowed quota fits no slope (every window
/// lets the same count through, whatever the rate) and is left alone.
#[derive(Debug, Clone, Default)]
pub(super) struct Descent {
    /// When refused; seconds from the hold's end to the refused send;
    /// requests sent in them.
    pub(super) points: VecDeque<(Instant, f64, f64)>,
}

impl Descent {
    pub(super) fn push(&mut self, at: Instant, secs: f64, sent: f64) {
        self.points.retain(|(t, _, _)| {
            at.saturating_duration_since(*t) < DESCENT_MAX_AGE
                // The same refusal, as the fleet's store counted it.
                && at.max(*t) - at.min(*t) > SAME_REFUSAL
        });
        if self.points.len() == DESCENT_POINTS {
            self.points.pop_front();
        }
        self.points.push_back((at, secs, sent));
    }

    pub(super) fn clear(&mut self) {
        self.points.clear();
    }

    /// The highest refill rate the points allow, if they tell one (at
    /// least two, far enough apart, with a burst and a rate both
    /// positive), and how far above the fitted rate that bound lies.
    pub(super) fn limit(&self) -> Option<(f64, f64)> {
        let n = self.points.len() as f64;
        if n < 2.0 {
            return None;
        }
        let xs = self.points.iter().map(|p| p.1);
        let (lo, hi) = xs.fold((f64::INFINITY, 0.0f64), |(lo, hi), x| {
            (lo.min(x), hi.max(x))
        });
        if hi - lo < lo * DESCENT_SPREAD {
            return None;
        }
        let mx = self.points.iter().map(|p| p.1).sum::<f64>() / n;
        let my = self.points.iter().map(|p| p.2).sum::<f64>() / n;
        let sxx: f64 = self.points.iter().map(|p| (p.1 - mx).powi(2)).sum();
        let sxy: f64 = self.points.iter().map(|p| (p.1 - mx) * (p.2 - my)).sum();
        let slope = sxy / sxx;
        let burst = my - slope * mx;
        let margin = 2.0 / (hi - lo);
        (slope > 0.0 && burst > 0.0).then_some((slope + margin, margin))
    }
}

impl Aimd {
    /// A refusal at the settle point after a hold, sent at the rate in
    /// force since the hold's end: a point of the [`Descent`].
    pub(super) fn time_to_refusal(
        &mut self,
        sent_at: Instant,
        now: Instant,
        reason: BackoffReason,
    ) {
        let Some(end_stamp) = self.k().hold_end else {
            return;
        };
        let steady = self.changes.back().is_none_or(|(at, _)| *at <= end_stamp);
        let end = end_stamp.at();
        if reason.ambiguous() || self.k().hold_cost.is_zero() || sent_at <= end || !steady {
            return;
        }
        if self.k().limit.is_none() || self.probe.is_some() {
            return;
        }
        // Shared, the hold's end is the fleet's and the rate too: the
        // fleet's sends are counted as one sluice's until the store's
        // count of them comes (see `Aimd::on_fleet_refusal`).
        let secs = (sent_at - end).as_secs_f64();
        let sent = self.rate * secs;
        self.kp_mut().descent.push(now, secs, sent);
    }

    /// The fleet's last refusal after a hold, as the shared store counted
    /// it (R-DS1, R-SG5): a point of the token-bucket fit, on the same terms as
    /// one sluice's — a limit known, and the rate steady since the hold's
    /// end. Every replica reads the same points, so every replica's fit
    /// says what the refused replica's did.
    pub fn on_fleet_refusal(&mut self, now: Instant, refusal: FleetRefusal) {
        if self.kp().fleet_refusal == Some(refusal.id) {
            return;
        }
        self.kp_mut().fleet_refusal = Some(refusal.id);
        let Some(at) = now.checked_sub(refusal.ago) else {
            return;
        };
        let Some(start) = at.checked_sub(refusal.after) else {
            return;
        };
        // Changes remembered back to the hold's end, and none since.
        let (from, to) = (Stamp::of(start), Stamp::of(at));
        let known = self.changes.len() < CHANGES_KEPT
            || self.changes.front().is_some_and(|(t, _)| *t <= from);
        let steady = !self.changes.iter().any(|(t, _)| *t > from && *t < to);
        let old = refusal.after >= DESCENT_MAX_AGE;
        if self.k().hold_cost.is_zero() || self.k().limit.is_none() || !known || !steady || old {
            return;
        }
        self.kp_mut()
            .descent
            .push(at, refusal.after.as_secs_f64(), refusal.sent as f64);
    }

    /// The provider holds every request off until `now` + its `Retry-After`.
    pub(super) fn extend_hold(&mut self, now: Instant) {
        if !self.k().hold_cost.is_zero() {
            let end = Stamp::of(now + self.k().hold_cost);
            self.k_mut().hold_end = Some(self.k().hold_end.map_or(end, |e| e.max(end)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    /// R-SG5: a limit learned a third too high (slow start's cut measured
    /// a burst) on a token bucket that holds with `Retry-After`: the time
    /// each rate lasted after a hold tells the bucket's refill rate, and
    /// the rate is under it after four refusals, the last at 19 s — where
    /// one 5 % step per refusal, each refusal later than the last, took
    /// five, the last at 31 s. Past those, a refusal is a probe's (one in
    /// [`PROBE_HOLD_RATIO`] holds at most, R-SG2).
    #[test]
    fn the_time_to_each_refusal_tells_a_token_buckets_rate() {
        let mut a = Aimd::new(4.0, 0.1, 1000.0, 0.7, W);
        a.restore(25.3, Some(26.6), None);
        let refusals = bucket_refusals(&mut a, 60);
        let (fit, probes): (Vec<f64>, Vec<f64>) = refusals.iter().partition(|at| **at < 25.0);
        assert!(fit.len() <= 4, "{refusals:?}");
        assert!(probes.len() <= 1, "{refusals:?}");
        assert!(
            probes.iter().all(|at| *at >= 19.0 + PROBE_HOLD_RATIO),
            "{refusals:?}"
        );
        assert!(a.limit().is_some_and(|l| l <= 21.0), "{:?}", a.limit());
        assert!(a.rate() >= 0.93 * 20.0 && a.rate() <= 20.0, "{}", a.rate());
        // From a cold start too, the limit ends where the settle point is
        // under the bucket's (the rate may be a probe's).
        let mut cold = Aimd::new(4.0, 0.1, 1000.0, 0.7, W);
        let refusals = bucket_refusals(&mut cold, 120);
        assert!(refusals.len() <= 4, "cold {refusals:?}");
        let settle = cold.limit().map_or(0.0, |l| l * SETTLE_SHARP);
        assert!((0.93 * 20.0..=20.0).contains(&settle), "{settle}");
    }

    /// R-DS1, R-SG5: a replica the provider never refused fits the bucket
    /// from the fleet's refusals as the shared store counted them (a
    /// 20/s bucket of burst 10: 24/s lasted 2.5 s after a hold, 21/s ten),
    /// each read once, and only where the rate held steady since the
    /// hold's end; the limit another replica placed at the fit is known
    /// as a fit here too (settled under as closely).
    #[test]
    fn a_replica_fits_the_fleets_refusals() {
        let second = Duration::from_secs(1);
        let mut t = Instant::now();
        let mut a = Aimd::new(5.0, 0.1, 1000.0, 0.7, W);
        a.restore(24.0, Some(25.0), None);
        a.adopt(t, 24.0, Some(25.0));
        a.on_shared_hold(t, second);
        t += second + Duration::from_millis(2500);
        let first = FleetRefusal {
            id: 1,
            ago: Duration::ZERO,
            after: Duration::from_millis(2500),
            sent: 60,
        };
        a.on_fleet_refusal(t, first);
        a.on_fleet_refusal(t, first);
        assert_eq!(a.kp().descent.points.len(), 1, "read once");
        a.adopt(t, 21.0, Some(21.5));
        a.on_shared_hold(t, second);
        t += second * 11;
        a.on_fleet_refusal(
            t,
            FleetRefusal {
                id: 2,
                ago: Duration::ZERO,
                after: second * 10,
                sent: 210,
            },
        );
        let (fit, margin) = a.kp().descent.limit().expect("two points fit");
        assert!((20.0..=20.0 * (1.0 + FIT_TIGHT)).contains(&fit), "{fit}");
        assert!(margin <= fit * FIT_TIGHT, "{margin}");
        a.adopt(t, fit * SETTLE_SHARP, Some(fit));
        assert!(a.known().fitted);
        assert_eq!(a.settle_share(), SETTLE_SHARP);
        // A span the rate changed in says nothing of the bucket.
        a.on_shared_hold(t, second);
        t += second * 2;
        a.adopt(t, fit * SETTLE_SHARP * 1.01, Some(fit));
        t += second * 3;
        a.on_fleet_refusal(
            t,
            FleetRefusal {
                id: 3,
                ago: Duration::ZERO,
                after: second * 4,
                sent: 80,
            },
        );
        assert_eq!(
            a.kp().descent.points.len(),
            2,
            "{:?}",
            a.kp().descent.points
        );
    }
}

//! Where a cut takes the rate and the remembered limit (R-AI1): one cut
//! per congestion epoch, the limit placed from what was sent, delivered,
//! proved clean or fitted.

use super::*;

/// Refusals within a cut's echo that make a limit sharp.
pub(super) const SHARP_ECHO: u32 = 3;

/// A probe throttled before its last clean rate passed this share of the
/// limit found the limit where it was.
pub const PROBE_HELD: f64 = 1.1;

/// Cut applied to a throttle near the known limit.
pub const PROBE_DECREASE: f64 = 0.9;

/// What a cut is placed from: the controller's evidence at the instant
/// of the throttle.
#[derive(Debug, Clone, Copy)]
pub(super) struct Evidence {
    /// What pushed back.
    pub(super) reason: BackoffReason,
    /// The rate the throttle met.
    pub(super) from: f64,
    /// The multiplicative decrease.
    pub(super) decrease: f64,
    /// The remembered limit, if any.
    pub(super) limit: Option<f64>,
    /// A probe above the settle point, if one was under way.
    pub(super) probe: Option<Probe>,
    /// What the provider delivered over the last window, if measured.
    pub(super) delivered: Option<f64>,
    /// The settle point's share of the limit now.
    pub(super) settle: f64,
    /// The limit is a token bucket's fitted refill rate.
    pub(super) fitted: bool,
    /// The limit is sharp (its refusals went on after a cut).
    pub(super) sharp: bool,
    /// The limit before a probe last moved it, and when.
    pub(super) moved_from: Option<(f64, Instant)>,
    /// When the settle point itself was last throttled.
    pub(super) too_high_at: Option<Instant>,
    /// The provider holds after its refusals (`Retry-After`).
    pub(super) holds: bool,
    /// The token-bucket fit of the refusals after holds, if it tells one
    /// (the bound, and its margin).
    pub(super) fit: Option<(f64, f64)>,
    /// The increase window.
    pub(super) window: Duration,
    /// Now.
    pub(super) now: Instant,
}

/// What a probe's wait at the settle point becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ProbeWait {
    /// As it was.
    Keep,
    /// Back to the shortest.
    Reset,
    /// Doubled (a sharp limit's probe held at the same place), at most 4×.
    Longer,
}

/// Where a cut puts the limit and the rate, and what else it learned.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Placement {
    /// The remembered limit: where throttling began.
    pub(super) limit: f64,
    /// The rate to cut to (before the floor).
    pub(super) to: f64,
    /// The limit is a tight fit of a token bucket's refill rate: settled
    /// under as closely as a sharp one.
    pub(super) tight: bool,
    /// Met twice near the same rate: the limit is no longer a guess.
    pub(super) confirmed: bool,
    /// The probe's wait at the settle point.
    pub(super) probe_wait: ProbeWait,
    /// A probe moved the limit past the old one, from this one.
    pub(super) moved_from: Option<f64>,
    /// The refusals after holds describe another limit now: start over.
    pub(super) clear_descent: bool,
    /// The settle point itself was throttled: the limit was too high.
    pub(super) too_high: bool,
}

/// Where a throttle puts the remembered limit and the rate, from the
/// evidence (a pure function: the controller applies what it returns).
///
/// * Slow start: throttling began at this rate, or at what the provider
///   delivered if that was less.
/// * A probe throttled before it got clearly past the limit: the limit
///   held; straight back to the settle point.
/// * A probe that went clean well past the limit: the limit lies past the
///   old one, no higher than the last clean rate nor than what was
///   delivered.
/// * Throttled at the settle point: the limit was too high — a throttle
///   the provider named says throttling began here; others step further;
///   a token bucket's fitted refill rate, where the holds tell it, says
///   more.
/// * Far below it: the limit has dropped.
pub(super) fn place(e: &Evidence) -> Placement {
    let (from, reason, settle) = (e.from, e.reason, e.settle);
    let delivered = e.delivered.unwrap_or(f64::INFINITY);
    let mut p = Placement {
        limit: from,
        to: from * e.decrease,
        tight: false,
        confirmed: false,
        probe_wait: ProbeWait::Keep,
        moved_from: None,
        clear_descent: false,
        too_high: false,
    };
    match (e.limit, e.probe) {
        // Slow start: throttling began at this rate, or at what the
        // provider delivered if that was less.
        (None, _) => {
            p.limit = delivered.min(from).max(from * e.decrease);
            p.to = from * e.decrease;
        }
        (Some(limit), Some(probe)) if probe.clean(reason) <= limit * PROBE_HELD => {
            held_probe(e, limit, probe, &mut p);
        }
        (Some(limit), Some(probe)) => {
            moved_probe(e, limit, probe, &mut p);
        }
        // Throttled at the settle point: the limit was too high.
        (Some(limit), None) if from >= limit * PROBE_DECREASE => {
            (p.limit, p.tight) = too_high(e, limit);
            p.too_high = true;
            p.probe_wait = ProbeWait::Reset;
            p.to = p.limit * settle;
        }
        // Far below it: the limit has dropped.
        (Some(_), None) => {
            p.limit = from;
            p.to = from * e.decrease;
        }
    }
    p
}

/// A probe throttled before it got clearly past the limit: the limit held;
/// straight back to the settle point.
fn held_probe(e: &Evidence, limit: f64, probe: Probe, p: &mut Placement) {
    // Met twice near the same rate: no longer a guess. What
    // the probe proved clean (two windows) is under it.
    p.confirmed = true;
    let l = if e.reason.ambiguous() {
        limit
    } else if e.fitted {
        // The fit said where it is; the probe agrees.
        p.tight = true;
        limit
    } else if e.sharp {
        // No burst to fool it: the proven rate is clean.
        p.probe_wait = ProbeWait::Longer;
        limit.max(probe.clean_rate)
    } else {
        limit.max(probe.clean(e.reason).min(limit * (1.0 + PROBE_STEP)))
    };
    p.limit = l;
    p.to = l * e.settle;
}

/// A probe that went clean well past the limit before it was throttled:
/// the limit lies past the old one, though no higher than the last clean
/// rate nor than what the provider delivered (a burst allowance can make a
/// window look clean).
fn moved_probe(e: &Evidence, limit: f64, probe: Probe, p: &mut Placement) {
    // Without a delivery measure, no further than a held probe.
    let delivered = e.delivered.unwrap_or(limit * PROBE_HELD);
    let l = probe.clean(e.reason).min(delivered).max(limit);
    p.moved_from = Some(limit);
    p.probe_wait = ProbeWait::Reset;
    p.clear_descent = true;
    p.limit = l;
    p.to = (l * e.settle).min(e.from * PROBE_DECREASE);
}

/// Throttled at the settle point: the limit was too high. Where it goes,
/// and whether it is a tight fit of a token bucket's refill rate.
fn too_high(e: &Evidence, limit: f64) -> (f64, bool) {
    let (from, reason, delivered) = (e.from, e.reason, e.delivered.unwrap_or(f64::INFINITY));
    debug_assert!(from >= limit * PROBE_DECREASE);
    // A throttle the provider named says throttling began at this rate;
    // others (latency, bare 503s) say less, and step further.
    let named = matches!(
        reason,
        BackoffReason::Throttled | BackoffReason::UnavailableRetryAfter
    );
    match e.moved_from {
        // Soon after a probe moved the limit: what it found was
        // a burst allowance's doing. Back to the limit before.
        Some((before, at)) if e.now.saturating_duration_since(at) < e.window * PROBE_AFTER => {
            (before.min(from), false)
        }
        // Named: throttling began at this rate. Unnamed
        // (latency, bare 503s say less): step further.
        // Again soon after, with too few answers a window to
        // measure delivery: the gentle steps are too slow.
        _ => {
            let again = e.delivered.is_none()
                && e.too_high_at
                    .is_some_and(|at| e.now.saturating_duration_since(at) < e.window * PROBE_AFTER);
            // What was delivered says less where the provider
            // holds after each refusal (`Retry-After`): the
            // holds, not the limit, thin the windows around
            // them (measured in a shared fleet: a limit set
            // 4 % under the real one, then no probe for a
            // minute of holds).
            // A token bucket's refill rate, where the refusals
            // after the holds tell it, says more.
            let held = named && e.holds;
            let (delivered, fit) = if held {
                (f64::INFINITY, e.fit)
            } else {
                (delivered, None)
            };
            // At most one plain cut's worth below the rate:
            // a fit is a measure, and a poor one (a bucket
            // whose rate moved among the points) must not
            // cost more than a cut.
            let fitted = fit.map_or(f64::INFINITY, |(at, _)| at.max(from * PROBE_DECREASE));
            let l = (match (named, again) {
                (true, false) => from,
                (true, true) => from * SETTLE,
                (false, _) => from * PROBE_DECREASE,
            })
            .min(delivered)
            .min(fitted)
            .max(from * e.decrease);
            let tight = fit.is_some_and(|(at, margin)| l == at && margin <= at * FIT_TIGHT);
            (l, tight)
        }
    }
}

impl Aimd {
    /// Cuts the rate now and moves the remembered limit (see [`place`]).
    pub(super) fn cut(&mut self, now: Instant, reason: BackoffReason) -> Backoff {
        if self.last_decrease.is_some() && !reason.ambiguous() {
            // The last cut's echo is over: was its limit sharp?
            self.sharp = self.echo >= SHARP_ECHO;
        }
        self.echo = 0;
        let from = self.rate;
        let p = place(&Evidence {
            reason,
            from,
            decrease: self.decrease,
            limit: self.limit,
            probe: self.probe,
            delivered: self.delivered,
            settle: self.settle_share(),
            fitted: self.fitted,
            sharp: self.sharp,
            moved_from: self.moved_from,
            too_high_at: self.too_high_at,
            holds: !self.hold_cost.is_zero(),
            fit: self.descent.limit(),
            window: self.window,
            now,
        });
        if p.confirmed {
            self.limit_weak = false;
        }
        match p.probe_wait {
            ProbeWait::Keep => {}
            ProbeWait::Reset => self.probe_backoff = 0,
            ProbeWait::Longer => self.probe_backoff = (self.probe_backoff + 1).min(2),
        }
        if let Some(before) = p.moved_from {
            self.moved_from = Some((before, now));
        }
        if p.clear_descent {
            self.descent.clear();
        }
        if p.too_high {
            self.too_high_at = Some(now);
        }
        let (limit, tight) = (p.limit, p.tight);
        if self.limit != Some(limit) && self.moved_from.is_none_or(|(_, at)| at != now) {
            self.moved_from = None;
        }
        self.fitted = tight;
        // Known that closely, the limit is settled under as a sharp one is.
        let to = if tight { limit * SETTLE_SHARP } else { p.to };
        self.limit = Some(limit);
        if let Some(streak) = self.streak.as_mut() {
            streak.cuts += 1;
            streak.last_cut = now;
        }
        self.reset_plateau();
        self.recover_to = None;
        self.last_decrease = Some(now);
        self.window_cut = true;
        self.latency.clear();
        self.set_rate(now, to.max(self.floor).min(from));
        Backoff {
            at: now,
            reason,
            from_rps: from,
            to_rps: self.rate,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    fn evidence(reason: BackoffReason, from: f64, limit: Option<f64>) -> Evidence {
        Evidence {
            reason,
            from,
            decrease: 0.7,
            limit,
            probe: None,
            delivered: None,
            settle: SETTLE,
            fitted: false,
            sharp: false,
            moved_from: None,
            too_high_at: None,
            holds: false,
            fit: None,
            window: Duration::from_secs(1),
            now: Instant::now(),
        }
    }

    /// Where each kind of throttle puts the limit, as a pure function of
    /// the evidence.
    #[test]
    fn the_limit_is_placed_from_the_evidence() {
        // Slow start: at the rate met, or at what was delivered if less;
        // the rate cut by the decrease.
        let p = place(&evidence(BackoffReason::Throttled, 20.0, None));
        assert_eq!((p.limit, p.to), (20.0, 14.0));
        let p = place(&Evidence {
            delivered: Some(16.0),
            ..evidence(BackoffReason::Throttled, 20.0, None)
        });
        assert_eq!(p.limit, 16.0);
        // At the settle point, named: throttling began here.
        let p = place(&evidence(BackoffReason::Throttled, 9.5, Some(10.0)));
        assert_eq!((p.limit, p.to, p.too_high), (9.5, 9.5 * SETTLE, true));
        // Unnamed (a bare 503 on trial): a step further.
        let p = place(&evidence(BackoffReason::Unavailable, 9.5, Some(10.0)));
        assert!((p.limit - 9.5 * PROBE_DECREASE).abs() < 1e-12);
        // A probe held near the limit: the limit confirmed, back to settle.
        let held = Evidence {
            probe: Some(Probe::new(10.3)),
            ..evidence(BackoffReason::Throttled, 10.5, Some(10.0))
        };
        let p = place(&held);
        assert!(p.confirmed && p.limit >= 10.0 && p.limit <= 10.0 * (1.0 + PROBE_STEP));
        // A probe clean well past it: the limit moved, from the old one.
        let moved = Evidence {
            probe: Some(Probe::new(14.0)),
            delivered: Some(13.0),
            ..evidence(BackoffReason::Throttled, 15.0, Some(10.0))
        };
        let p = place(&moved);
        assert_eq!(
            (p.limit, p.moved_from, p.clear_descent),
            (13.0, Some(10.0), true)
        );
        // Far below it: the limit dropped.
        let p = place(&evidence(BackoffReason::Throttled, 5.0, Some(10.0)));
        assert_eq!((p.limit, p.to), (5.0, 3.5));
    }

    /// R-SG5: a limiter that counts over a window (a sliding window that
    /// counts its refusals) goes on refusing for a while after the cut.
    /// Refusals to requests sent within a window of the cut are its echo:
    /// one cut, not one per refusal.
    #[test]
    fn refusals_within_a_window_of_a_cut_are_its_echo() {
        let mut t = Instant::now();
        let mut a = Aimd::new(5.0, 0.1, 100.0, 0.7, W);
        a.restore(19.0, Some(20.0), None);
        saturate(&mut a, &mut t, 2);
        let cut = a.on_throttle(t, t, BackoffReason::Throttled).unwrap();
        let after = a.rate();
        assert!(after < cut.from_rps);
        // Sent after the cut, refused within its window: no new cut.
        for ms in [50, 200, 500, 900] {
            let at = t + Duration::from_millis(ms);
            assert!(a.on_throttle(at, at, BackoffReason::Throttled).is_none());
        }
        assert_eq!(a.rate(), after);
        // A refusal to a request sent a window later is news.
        let later = t + W + Duration::from_millis(10);
        assert!(a
            .on_throttle(later, later, BackoffReason::Throttled)
            .is_some());
    }
}

//! Growth and settling: slow start before any throttle, recovery to the
//! settle point under the remembered limit, the wait there and the probe
//! above it (R-AI1, R-SG2).

use super::*;

/// Settle point as a share of the rate at which throttling began.
pub const SETTLE: f64 = 0.95;

/// Settle point under a sharp, fitted or steady limit (see `Aimd::sharp`,
/// `Aimd::fitted`, `Aimd::steady`).
pub const SETTLE_SHARP: f64 = 0.98;

/// Clean, saturated windows at the settle point before probing upward.
pub const PROBE_AFTER: u32 = 8;

/// …and requests admitted there: a failed probe costs about one throttled
/// request, so this bounds its share (≈ 0.3 %) on slow providers too.
pub const PROBE_AFTER_ADMITTED: u64 = 300;

/// First probe step, as a share of the known limit; it doubles with every
/// clean probe window.
pub const PROBE_STEP: f64 = 0.02;

/// A provider that holds every request off for a while after a throttle
/// (`Retry-After`) makes each failed probe cost that whole while: the wait
/// at the settle point is at least this many times the last hold, so that
/// a failed probe's hold costs at most 4 % of the time, and twice and four
/// times that after probes that found nothing. (A hold of a second brings
/// the first probe about 25 s after the limit was met: at most one brief
/// overshoot per ~30 s, as R-SG2 allows, and a limit raised a tenth found
/// within 30 s; a minute and a half later, one in 100 s.)
pub const PROBE_HOLD_RATIO: f64 = 25.0;

/// Where a provider holds after its refusals, a probe steps at once to
/// this multiple of the settle point and dwells there until a bucket that
/// had not moved would have spent its burst.
pub const PROBE_DWELL: f64 = 1.1;

/// Windows the first dwell lasts; later ones last twice as long as the
/// longest one took to be refused, and twice as long again after a dwell
/// that passed proved a burst's doing, up to [`PROBE_DWELL_MAX`].
pub const PROBE_DWELL_FIRST: u32 = 6;

/// The longest dwell, in windows.
pub const PROBE_DWELL_MAX: u32 = 16;

/// …unless slow start's limit may lie well under the rate its refusal met
/// (`Aimd::unconfirmed`): then the wait, in holds, is this over the gap
/// between the two (a probe's hold costs a hold; staying a gap under the
/// limit costs the gap all along). A limit a tenth under waits 30 holds,
/// one 40 % under 7.
pub const PROBE_GAP_COST: f64 = 3.0;

/// A bracket (a rate a probe was refused at, above a limit that held) this
/// close over the limit knows the limit as closely as a fit: settled under
/// as a sharp one, and the bracket let go — the next probe doubles its
/// steps again, and finds the limit should it have moved. Until then each
/// probe goes halfway to the bracket: [`BRACKET_DWELL`] clean windows
/// there move the limit, a refusal there is the new bracket. (Doubling
/// steps of 2, 4 and 8 % overshoot a sharp limit — a moving window's —
/// from a limit well under it, and fall back to the last clean step: 20 a
/// second were held at 0.87.)
pub(super) const BRACKET_TIGHT: f64 = 0.02;

/// Clean windows at the settle point before a probe bisects a bracket
/// where the provider does not hold after its refusals: it goes halfway at
/// most, and costs one refusal if that is too far.
pub(super) const BRACKET_AFTER: u32 = 3;

/// …and requests admitted there: a bisecting probe costs at most one
/// refusal, so this bounds their share on slow providers (≈ 1 %, and only
/// while the bracket closes).
pub(super) const BRACKET_AFTER_ADMITTED: u64 = 100;

/// Clean windows at a bracket's midpoint that move the limit there: a
/// small burst (5 on a 20 a second bucket) carries a rate a tenth over the
/// refill rate clean for two or three windows.
pub(super) const BRACKET_DWELL: u32 = 4;

/// A whole clean window at this multiple of the limit proves it moved:
/// the controller forgets it and grows as from a cold start. (A token
/// bucket whose burst is half a second of traffic cannot hide that much.)
pub const PROBE_FOUND: f64 = 1.5;

/// Growth per window before the first throttle.
pub const SLOW_START_GROWTH: f64 = 0.5;

/// Share of the gap to the settle point closed per window when recovering.
pub const RECOVER_SHARE: f64 = 0.5;

/// Smallest recovery step, as a share of the known limit.
pub const RECOVER_MIN_STEP: f64 = 0.05;

/// A probe above the settle point.
#[derive(Debug, Clone, Copy)]
pub(super) struct Probe {
    /// Clean windows probed so far (the step is `PROBE_STEP · 2^k`).
    pub(super) windows: u32,
    /// The highest rate a whole window went clean at.
    pub(super) clean_rate: f64,
    /// The highest rate proven clean: a whole window went clean at it, and
    /// so did the next window, at a higher rate. (A provider's burst
    /// allowance can carry one window past its limit; the next one spends
    /// what the first left.) What a throttle the provider named is judged
    /// against; a bare 503 says less, and is judged as before against
    /// `clean_rate`.
    pub(super) proven: f64,
    /// The dwell under way, if the probe dwells.
    pub(super) dwell: Option<Dwell>,
    /// The rate a whole dwell went clean at: the limit has moved at least
    /// that far.
    pub(super) dwelt: Option<f64>,
    /// Clean windows at the midpoint of a bracket (see [`BRACKET_DWELL`]).
    pub(super) at_half: u32,
}

/// A probe of a limit the provider holds after (`Retry-After`): one step
/// to [`PROBE_DWELL`] × the settle point, held until the provider's burst
/// allowance would have drained had the limit not moved.
///
/// A token bucket's burst carries a probe window or two past its refill
/// rate, so a probe that doubles its step each window cannot tell a limit
/// raised by a tenth from a burst (it is refused a few steps further out,
/// with only the burst proven). Held a tenth over the limit, a bucket
/// that has not moved refuses once its burst is spent, `B / (0.1·L)` in:
/// one overshoot, one hold. A dwell that outlasts that is clean because
/// the limit moved: the limit is at least the dwell's rate, and the next
/// dwell goes a doubling step further. How long the burst lasted is
/// learned from each refused dwell.
#[derive(Debug, Clone, Copy)]
pub(super) struct Dwell {
    /// Clean windows still to pass.
    pub(super) left: u32,
    /// When the dwell began.
    pub(super) since: Instant,
}

impl Probe {
    pub(super) fn new(rate: f64) -> Self {
        Probe {
            windows: 1,
            clean_rate: rate,
            proven: rate,
            dwell: None,
            dwelt: None,
            at_half: 0,
        }
    }

    /// Another replica's dwell from `rate`, followed for `windows`: a
    /// refusal is judged as the dwell's. The replica that began it passes
    /// it first and raises the shared rate; should it not (the raise was
    /// not a dwell, or that replica is gone), this one passes it a window
    /// later — a follower that never ran out would hold the fleet's rate
    /// where the raise left it (measured: 0.385 of the limit).
    pub(super) fn following(rate: f64, now: Instant, windows: u32) -> Self {
        Probe {
            dwell: Some(Dwell {
                left: windows + 1,
                since: now,
            }),
            ..Probe::new(rate)
        }
    }

    /// A whole window went clean at `rate`: the rate before it is proven.
    pub(super) fn window_clean(&mut self, rate: f64) {
        self.proven = self.proven.max(self.clean_rate);
        self.clean_rate = self.clean_rate.max(rate);
    }

    /// The dwell at `rate` passed: the next dwell begins at `now` and
    /// lasts `left` windows. Returns how many dwells passed before this
    /// one (the next step doubles with each, up to 2^16).
    pub(super) fn pass_dwell(&mut self, rate: f64, now: Instant, left: u32) -> u32 {
        self.dwelt = Some(rate);
        let k = self.windows.min(16);
        self.windows += 1;
        self.dwell = Some(Dwell { left, since: now });
        k
    }

    /// What the probe found clean, judged by a throttle for `reason`.
    pub(super) fn clean(&self, reason: BackoffReason) -> f64 {
        if reason.ambiguous() {
            self.clean_rate
        } else {
            self.proven
        }
    }
}

impl Aimd {
    pub(super) fn increase(&mut self, admitted: u32, now: Instant) -> bool {
        let before = self.rate;
        let dwell_windows = self.k().dwell_windows;
        if let Some(to) = self.k().recover_to.get() {
            self.reset(|k| k.recover_to = Maybe::NONE);
            if to > self.rate {
                self.set_rate(now, to.min(self.ceiling()));
                return true;
            }
        }
        if self.kp().bracket.is_some() && self.refusals_go_on() {
            // Refusals went on after the cut: a window that counts them too
            // (HAProxy's), where each probe over the limit costs a window of
            // refusals — not one. No bisecting such a limit.
            self.reset_p(|k| k.bracket = None);
            self.kp_mut().bisect_fooled = true;
        }
        let next = match self.k().limit {
            None => self.rate * (1.0 + SLOW_START_GROWTH),
            Some(limit) => {
                let settle = limit * self.settle_share();
                if self.rate > limit * PROBE_FOUND {
                    // A whole clean window clearly past the limit: it has
                    // moved. Find the new one as from a cold start.
                    self.reset(|k| k.limit = None);
                    self.reset(|k| k.fitted = false);
                    self.reset(|k| k.steady = false);
                    self.reset_p(|k| k.descent.clear());
                    self.reset_plateau();
                    self.rate * (1.0 + SLOW_START_GROWTH)
                } else if let Some(probe) = self.probe.as_mut() {
                    let bracket = self
                        .known
                        .as_ref()
                        .and_then(|k| k.probing.as_ref())
                        .and_then(|p| p.bracket);
                    if let Some(dwell) = probe.dwell.as_mut() {
                        if dwell.left > 1 {
                            dwell.left -= 1;
                            return false;
                        }
                        // The burst would be spent by now: the limit moved
                        // at least this far. Dwell again a step further,
                        // the step doubling with each dwell passed.
                        let k = probe.pass_dwell(self.rate, now, dwell_windows);
                        self.dwell_passed(limit, now);
                        let step = (PROBE_DWELL - 1.0) * f64::from(1u32 << k);
                        let next = self.rate * (1.0 + step);
                        self.set_rate(now, next.min(self.ceiling()).max(self.rate));
                        return self.rate > before;
                    }
                    probe.window_clean(self.rate);
                    let k = probe.windows.min(16);
                    probe.windows += 1;
                    let next = self.rate + limit * PROBE_STEP * f64::from(1u32 << k);
                    match bracket {
                        Some(bracket) => {
                            let half = (limit + bracket) / 2.0;
                            if self.rate >= half * (1.0 - 1e-9) {
                                probe.at_half += 1;
                            }
                            if probe.at_half >= BRACKET_DWELL {
                                // Clean halfway for long enough: the limit
                                // is there.
                                return self.bisected(half, bracket, now);
                            }
                            next.min(half)
                        }
                        None => next,
                    }
                } else if self.rate < settle {
                    self.reset_plateau();
                    let step = ((settle - self.rate) * RECOVER_SHARE).max(limit * RECOVER_MIN_STEP);
                    (self.rate + step).min(settle)
                } else {
                    self.k_mut().plateau += 1;
                    self.k_mut().plateau_admitted += u64::from(admitted);
                    // Measured in time: a replica of a fleet closes its
                    // windows on its own few answers, later than the clock.
                    let start = now - self.window();
                    let since = self.k_mut().plateau_since.get_or_insert(start.into()).at();
                    let held_for = now.saturating_duration_since(since);
                    let k = 1 << self.k().probe_backoff;
                    let bisect = self.kp().bracket.is_some() && self.k().hold_cost.is_zero();
                    let (after, admitted) = if bisect {
                        (BRACKET_AFTER, BRACKET_AFTER_ADMITTED)
                    } else {
                        (PROBE_AFTER * k, PROBE_AFTER_ADMITTED * u64::from(k))
                    };
                    if self.trial.is_some()
                        || self.k().plateau < after
                        || (!self.k().limit_weak
                            && self.k().unconfirmed.is_none()
                            && self.k().plateau_admitted < admitted)
                        || held_for
                            < self
                                .k()
                                .hold_cost
                                .mul_f64(self.holds_before_probe(limit) * f64::from(k))
                    {
                        self.rate
                    } else if self.dwells() {
                        let rate = self.rate * PROBE_DWELL;
                        self.probe = Some(Box::new(Probe {
                            dwell: Some(Dwell {
                                left: dwell_windows,
                                since: now,
                            }),
                            ..Probe::new(self.rate)
                        }));
                        rate
                    } else {
                        self.probe = Some(Box::new(Probe::new(self.rate)));
                        self.rate + limit * PROBE_STEP
                    }
                }
            }
        };
        self.set_rate(now, next.min(self.ceiling()).max(self.rate));
        self.rate > before
    }

    /// A probe bisecting `(limit, bracket)` proved `half` clean: the limit
    /// moves there, and the rate settles close under it until the next
    /// probe.
    fn bisected(&mut self, half: f64, bracket: f64, now: Instant) -> bool {
        let before = self.rate;
        // A burst can carry a probe clean past a bucket's refill rate: a
        // refusal at the new settle point soon after places the limit as
        // any settle point's refusal does, and ends the bisection.
        self.k_mut().limit = Some(half);
        self.kp_mut().bisect_at = Some(now);
        if bracket <= half * (1.0 + BRACKET_TIGHT) {
            self.k_mut().fitted = true;
            self.reset_p(|k| k.bracket = None);
        }
        self.reset_plateau();
        // Whole windows clean at `half` proved the limit at least there:
        // settled as closely under it as under a sharp one until the next
        // probe. (At the loose margin, each step of the bisection gave back
        // 5 % for the dozen seconds to the next: a moving window's limit,
        // bisected in four steps over 20–50 s, was used at 0.95–0.96.)
        let settle = half * SETTLE_SHARP;
        self.set_rate(now, settle.min(self.ceiling()));
        self.rate > before
    }

    /// Whether a probe dwells (see [`Dwell`]): the provider holds after its
    /// refusals, and the limit is not slow start's guess (whose probe is
    /// judged by the rate it went clean at).
    pub(super) fn dwells(&self) -> bool {
        !self.k().hold_cost.is_zero() && self.k().unconfirmed.is_none()
    }

    /// A dwell refused at `now`: the burst lasted that long, and the next
    /// dwell lasts at least twice as long. (Never shorter than the last: a
    /// bucket the dwell found part-spent ran out sooner than its burst.)
    pub(super) fn dwell_refused(&mut self, now: Instant) {
        if let Some(dwell) = self.probe.as_deref().copied().and_then(|p| p.dwell) {
            let lasted = now.saturating_duration_since(dwell.since).as_secs_f64();
            let windows = (2.0 * lasted / self.window().as_secs_f64()).ceil() as u32;
            self.k_mut().dwell_windows = self.k().dwell_windows.max(windows).min(PROBE_DWELL_MAX);
        }
    }

    /// Another replica's cut reached this one (see [`Aimd::adopt`]): the
    /// fleet's dwell, if this replica was in one, was refused, and its
    /// next waits as long as the refused replica's; a settle point refused
    /// soon after a dwell moved the limit proved the dwell too short.
    /// Whichever replica the provider refused, every replica learns alike,
    /// or the next probe would come at the least patient one's time.
    pub(super) fn fleet_refused(&mut self, now: Instant) {
        match self.probe.as_deref().copied() {
            Some(probe) if probe.dwell.is_some() => {
                self.dwell_refused(now);
                self.k_mut().probe_backoff = if probe.dwelt.is_some() {
                    0
                } else {
                    (self.k().probe_backoff + 1).min(2)
                };
            }
            Some(_) => {}
            None => {
                if self.kp().moved_from.is_some_and(|(_, at)| {
                    now.saturating_duration_since(at) < self.window() * PROBE_AFTER
                }) {
                    self.reset_p(|k| k.moved_from = None);
                    self.dwell_fooled();
                }
            }
        }
    }

    /// Another replica passed the dwell this one is in, and raised the
    /// shared rate past it: the limit moved to the dwell's rate (the
    /// current one), and the next dwell — the raise — is followed.
    pub(super) fn fleet_dwell_passed(&mut self, now: Instant) {
        let Some(limit) = self.k().limit else {
            return;
        };
        let dwell_windows = self.k().dwell_windows;
        if let Some(probe) = self.probe.as_mut() {
            probe.pass_dwell(self.rate, now, dwell_windows + 1);
        }
        self.dwell_passed(limit, now);
    }

    /// A whole dwell went clean at the rate: the limit moved from `limit`
    /// to it, known as closely as a fit (a refusal at the next dwell
    /// settles under it; one at the settle point soon after undoes it).
    fn dwell_passed(&mut self, limit: f64, now: Instant) {
        self.kp_mut().moved_from = Some((limit, now));
        self.k_mut().limit = Some(self.rate);
        self.k_mut().fitted = true;
        self.reset(|k| k.steady = false);
        self.reset_p(|k| k.descent.clear());
    }

    /// The settle point refused soon after a probe moved the limit: the
    /// move was a burst's doing, and a dwell that passed was too short.
    pub(super) fn dwell_fooled(&mut self) {
        self.k_mut().dwell_windows = (self.k().dwell_windows * 2).min(PROBE_DWELL_MAX);
    }

    /// How many holds (`Retry-After`) the rate waits at the settle point
    /// before probing above `limit` (see [`PROBE_GAP_COST`]).
    fn holds_before_probe(&self, limit: f64) -> f64 {
        match self.k().unconfirmed {
            Some(met) if met > limit => {
                (PROBE_GAP_COST / (met / limit - 1.0)).min(PROBE_HOLD_RATIO)
            }
            // Refused before a window was measured: how far off the limit
            // is, nothing tells; the probe (or a clean window far past it)
            // does.
            Some(_) => 0.0,
            None => PROBE_HOLD_RATIO,
        }
    }

    /// The settle point's share of the limit: closer under a sharp limit,
    /// whose probe proved the rate clean.
    pub(super) fn settle_share(&self) -> f64 {
        if self.k().sharp || self.k().fitted || self.k().steady {
            SETTLE_SHARP
        } else {
            SETTLE
        }
    }

    pub(super) fn reset_plateau(&mut self) {
        self.reset(|k| k.plateau = 0);
        self.reset(|k| k.plateau_admitted = 0);
        self.reset(|k| k.plateau_since = None);
        self.probe = None;
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    #[test]
    fn slow_start_then_cut_then_settle_under_the_limit() {
        let mut t = Instant::now();
        let mut a = Aimd::new(2.0, 0.1, 100.0, 0.7, W);
        saturate(&mut a, &mut t, 4);
        assert!(a.rate() > 5.0, "grew: {}", a.rate());
        let before = a.rate();
        let cut = a.on_throttle(t, t, BackoffReason::Throttled).unwrap();
        assert_eq!(cut.from_rps, before);
        assert!((a.rate() - before * 0.7).abs() < 1e-9);
        let limit = a.limit().unwrap();
        assert!(limit <= before && limit >= before * 0.7, "{limit}");
        // a second throttle from the same epoch changes nothing
        assert!(a
            .on_throttle(t - Duration::from_millis(1), t, BackoffReason::Throttled)
            .is_none());
        let settle = limit * SETTLE;
        let mut windows = 0;
        while a.rate() < settle - 1e-9 {
            saturate(&mut a, &mut t, 1);
            windows += 1;
        }
        assert!(windows <= 5, "recovers fast: {windows} windows");
        assert!((a.rate() - settle).abs() < 1e-9, "{}", a.rate());
        // It waits at the settle point for PROBE_AFTER windows and
        // PROBE_AFTER_ADMITTED requests, then probes.
        let mut windows = 0;
        let mut admitted = 0.0;
        while a.rate() <= settle + 1e-9 && windows < 1000 {
            admitted += a.rate().ceil() + 1.0;
            saturate(&mut a, &mut t, 1);
            windows += 1;
        }
        assert!(a.rate() > settle, "then probes");
        assert!(windows >= PROBE_AFTER, "waited {windows} windows");
        assert!(
            admitted >= PROBE_AFTER_ADMITTED as f64,
            "waited for {admitted} requests"
        );
        // A probe throttled within a hair over the limit (which its clean
        // windows did not raise) goes straight back under it, as closely as
        // under a sharp one: the limit is known that well.
        saturate(&mut a, &mut t, 1);
        let refused_at = a.rate();
        assert!(refused_at <= limit * (1.0 + BRACKET_TIGHT), "{refused_at}");
        a.on_throttle(t, t, BackoffReason::Throttled).unwrap();
        assert!(
            (a.rate() - limit * SETTLE_SHARP).abs() < 1e-9,
            "{} vs {settle}",
            a.rate()
        );
        assert_eq!(a.limit(), Some(limit), "the limit held");
    }

    #[test]
    fn a_probe_doubles_its_step_and_finds_a_doubled_limit() {
        let mut t = Instant::now();
        let mut a = Aimd::new(5.0, 0.1, 1000.0, 0.7, W);
        a.restore(19.0, Some(20.0), None);
        // Wait, then probe: within 8 probing windows the rate passes 40.
        let mut windows = 0;
        while a.rate() < 40.0 && windows < 100 {
            saturate(&mut a, &mut t, 1);
            windows += 1;
        }
        assert!(a.rate() >= 40.0);
        let waited = PROBE_AFTER.max((PROBE_AFTER_ADMITTED / 20) as u32);
        assert!(windows <= waited + 8, "{windows} windows");
    }

    #[test]
    fn unused_rate_does_not_grow() {
        let mut t = Instant::now();
        let mut a = Aimd::new(2.0, 0.1, 100.0, 0.7, W);
        for _ in 0..30 {
            a.on_admit(t);
            t += W;
            a.on_clean(t, t, None);
        }
        assert_eq!(a.rate(), 2.0);
    }

    #[test]
    fn never_above_ceiling_never_below_floor() {
        let mut t = Instant::now();
        let mut a = Aimd::new(2.0, 0.5, 10.0, 0.7, W);
        saturate(&mut a, &mut t, 50);
        assert_eq!(a.rate(), 10.0);
        for _ in 0..50 {
            t += W;
            a.on_throttle(t, t, BackoffReason::Throttled);
        }
        assert_eq!(a.rate(), 0.5);
    }

    /// A provider that holds every request off after a throttle
    /// (`Retry-After`) makes a failed probe cost the whole hold: the next
    /// probe waits at least PROBE_HOLD_RATIO holds at the settle point.
    #[test]
    fn a_probe_waits_longer_where_a_failed_one_costs_a_hold() {
        let windows_to_probe = |hold: Duration| {
            let mut t = Instant::now();
            let mut a = Aimd::new(5.0, 0.1, 1000.0, 0.7, W);
            a.restore(19.0, Some(20.0), None);
            a.on_hold(hold);
            let settle = a.rate();
            let mut windows = 0;
            while a.rate() <= settle + 1e-9 && windows < 1000 {
                saturate(&mut a, &mut t, 1);
                windows += 1;
            }
            windows
        };
        let plain = windows_to_probe(Duration::ZERO);
        let held = windows_to_probe(Duration::from_secs(1));
        assert!(plain < 30, "{plain}");
        assert!(
            f64::from(held) >= PROBE_HOLD_RATIO,
            "probed after {held} windows with a 1 s hold"
        );
    }

    /// Issue 34 (R-AI1, R-SG2): a token bucket with a small burst answering
    /// `429` with `Retry-After: 1` refuses slow start's overshoot once, and
    /// the limit placed from the last window (sent at a lower rate) lands
    /// well under the rate met. The first probe then comes as soon as that
    /// gap makes it pay and is judged by the rate it went clean at, which
    /// then holds the limit as closely as a fit: over 30–60 s from a cold
    /// start, ≥ 95 % of the limit with at most one refusal (the dwell R-SG2
    /// asks for, which costs a hold: about the limit less the burst in
    /// requests, 3 % of the half minute on a burst of 2), on bursts of 2,
    /// 5 and 10.
    #[test]
    fn one_refusal_after_slow_start_is_probed_soon() {
        for burst in [2.0, 5.0, 10.0] {
            // From sluice's default start: 5 → 7.5 → 11.3 → 16.9 → 25.3.
            let mut a = Aimd::new(5.0, 0.1, 80.0, 0.7, W);
            let (accepted, refused) = bucket(&mut a, 60, burst);
            let ok = accepted.iter().filter(|t| **t >= 30.0).count() as f64;
            let no = refused.iter().filter(|t| **t >= 30.0).count();
            assert!(
                ok >= 0.95 * 20.0 * 30.0,
                "burst {burst}: {:.1} % of the limit, refused at {refused:?}",
                ok / 6.0
            );
            assert!(no <= 1, "burst {burst}: refused at {refused:?}");
        }
    }

    /// A probe carried one window past the limit by the provider's burst
    /// allowance, then refused: a named throttle judges it by the rates
    /// proven by the next window, so the limit stays where it was (moved
    /// by at most one probe step) instead of jumping to the burst's rate.
    #[test]
    fn a_burst_carried_probe_window_does_not_move_the_limit() {
        let mut t = Instant::now();
        let mut a = Aimd::new(5.0, 0.1, 1000.0, 0.7, W);
        a.restore(19.0, Some(20.0), None);
        // Wait at the settle point, then probe until the rate is clearly
        // past the limit (one clean window there: the burst's doing).
        let mut windows = 0;
        while a.rate() < 20.0 * PROBE_HELD && windows < 1000 {
            saturate(&mut a, &mut t, 1);
            windows += 1;
        }
        saturate(&mut a, &mut t, 1);
        a.on_throttle(t, t, BackoffReason::Throttled).unwrap();
        let limit = a.limit().unwrap();
        assert!(
            limit <= 20.0 * (1.0 + PROBE_STEP) + 1e-9,
            "the limit moved to {limit}"
        );
        assert!(a.rate() <= limit * SETTLE + 1e-9, "{}", a.rate());
    }

    /// R-SG5: a limiter whose refusals go on after the cut (a sliding
    /// window counting its refusals) is sharp: no burst carries a probe
    /// past it, so what a probe proved clean becomes the limit, and the
    /// rate settles at SETTLE_SHARP of it; a held probe there doubles the
    /// wait before the next (each costs a window of refusals).
    /// A moving window's limit is sharp and has no burst: the doubling
    /// probe steps (2, 4, 8 % of the limit) overshoot it from a limit well
    /// under it. Each refusal above a limit that held brackets the limit,
    /// and the next probe goes halfway: within a minute the limit is
    /// known to within `BRACKET_TIGHT` and settled under as a sharp one's.
    #[test]
    fn a_sharp_limit_is_bisected_between_what_held_and_what_was_refused() {
        let mut a = Aimd::new(5.0, 0.1, 80.0, 0.7, W);
        let (accepted, refused) = moving_window(&mut a, 90);
        let over =
            |from: f64, to: f64, v: &[f64]| v.iter().filter(|t| **t >= from && **t < to).count();
        let used = over(30.0, 90.0, &accepted) as f64 / 60.0 / 20.0;
        let refusals = over(30.0, 90.0, &refused);
        assert!(used >= 0.96, "{used:.3} of the limit used over 30–90 s");
        assert!(refusals <= 12, "{refusals} refused over 30–90 s");
        let limit = a.limit().unwrap();
        assert!((19.5..=20.5).contains(&limit), "{limit}");
    }

    #[test]
    fn a_sharp_limit_is_taken_at_what_the_probe_proved() {
        let mut t = Instant::now();
        let mut a = Aimd::new(5.0, 0.1, 1000.0, 0.7, W);
        a.restore(18.0, Some(18.0), None);
        saturate(&mut a, &mut t, 1);
        a.on_throttle(t, t, BackoffReason::Throttled).unwrap();
        // The cut's echo: refusals to requests sent after it.
        for ms in [100, 200, 300] {
            let at = t + Duration::from_millis(ms);
            assert!(a.on_throttle(at, at, BackoffReason::Throttled).is_none());
        }
        t += W;
        // Settle, wait, probe past 18 (the true limit is higher).
        let mut windows = 0;
        while a.rate() < 18.0 * 1.04 && windows < 1000 {
            saturate(&mut a, &mut t, 1);
            windows += 1;
        }
        let proved = a.rate();
        saturate(&mut a, &mut t, 1);
        let refused_at = a.rate();
        assert!(refused_at > proved);
        a.on_throttle(t, t, BackoffReason::Throttled).unwrap();
        let limit = a.limit().unwrap();
        assert!(
            (limit - proved).abs() < 1e-9,
            "the limit is what the probe proved: {limit} vs {proved}"
        );
        assert!(
            (a.rate() - limit * SETTLE_SHARP).abs() < 1e-9,
            "{}",
            a.rate()
        );
    }

    /// Issue 34 (R-SG2): the same bucket (`Retry-After: 1`) raised from 20
    /// to 22 req/s at 30 s is found by a dwell a tenth over the settle
    /// point: by 60 s the limit is settled under at 95 % of 22 or more, on
    /// bursts of 2, 5 and 10 — where a probe that doubles its step each
    /// window was refused past the raised limit with only the burst proven
    /// and left the limit where it was. Unmoved, the limit costs at most
    /// one refusal per 30 s over 30–150 s.
    #[test]
    fn a_dwell_finds_a_limit_raised_a_tenth() {
        for burst in [2.0, 5.0, 10.0] {
            let mut a = Aimd::new(5.0, 0.1, 80.0, 0.7, W);
            let raised = |t: f64| if t < 30.0 { 20.0 } else { 22.0 };
            let (_, refused) = bucket_moving(&mut a, 60, burst, raised);
            let settle = a.limit().map_or(0.0, |l| l * a.settle_share());
            assert!(
                (0.95 * 22.0..=22.0).contains(&settle),
                "burst {burst}: settles at {settle:.2} by 60 s, refused at {refused:?}"
            );
            let mut a = Aimd::new(5.0, 0.1, 80.0, 0.7, W);
            let (_, refused) = bucket(&mut a, 150, burst);
            let later = refused.iter().filter(|t| **t >= 30.0).count();
            assert!(later <= 4, "burst {burst}: refused at {refused:?}");
        }
    }

    /// R-DS1, R-SG2: replicas share one rate. A shared hold is what a
    /// failed probe costs a replica that was not refused itself: it waits
    /// [`PROBE_HOLD_RATIO`] holds and dwells. Another replica's cut starts
    /// its wait at the settle point over — where a replica that had waited
    /// its share probed again at its next window (measured: the fleet
    /// refused every 3 s from its second minute).
    #[test]
    fn a_replica_waits_out_the_fleets_holds_and_cuts() {
        let mut t = Instant::now();
        let mut a = Aimd::new(5.0, 0.1, 1000.0, 0.7, W);
        a.restore(19.0, Some(20.0), None);
        a.adopt(t, 19.0, Some(20.0));
        a.on_shared_hold(t, Duration::from_secs(1));
        let first = replica_windows_to_probe(&mut a, &mut t, true);
        assert!(f64::from(first) >= PROBE_HOLD_RATIO, "probed after {first}");
        assert!(
            (a.rate() - 19.0 * PROBE_DWELL).abs() < 1e-9,
            "dwells: {}",
            a.rate()
        );
        // Another replica's refusal: the shared rate back to the settle
        // point, and the wait starts over.
        a.adopt(t, 19.0, Some(20.0));
        let second = replica_windows_to_probe(&mut a, &mut t, true);
        assert!(
            f64::from(second) >= PROBE_HOLD_RATIO,
            "probed again after {second}"
        );
    }

    /// R-DS1, R-SG2: the wait before a fleet's probe counts the fleet's
    /// admissions, as one sluice counts its own: a replica taking an
    /// eighth of a slow provider's slots probes when one sluice would, not
    /// after eight times [`PROBE_AFTER_ADMITTED`] of its own (measured: a
    /// limit raised a tenth went unfound for a minute).
    #[test]
    fn a_fleets_probe_waits_for_the_fleets_admissions() {
        let mut t = Instant::now();
        let mut a = Aimd::new(5.0, 0.1, 1000.0, 0.7, W);
        a.restore(9.5, Some(10.0), None);
        a.adopt(t, 9.5, Some(10.0));
        let mut windows = 0u64;
        while a.rate() <= 9.5 + 1e-9 && windows < 1000 {
            // Ten slots a second, every replica's; one in eight is here.
            for j in 0..10u32 {
                let at = t + W * j / 10;
                a.on_shared_admitted(at, 1, Some(W / 10));
                if j % 8 == 0 {
                    a.on_admitted_here();
                    a.on_clean(at, at, Some(Duration::from_millis(40)));
                }
            }
            t += W;
            a.on_clean(t, t, Some(Duration::from_millis(40)));
            windows += 1;
        }
        let one_sluice = PROBE_AFTER_ADMITTED / 10 + 1;
        assert!(
            windows <= one_sluice + 1,
            "probed after {windows} windows (one sluice: {one_sluice})"
        );
        assert!(windows >= one_sluice - 1, "{windows}");
    }

    /// R-DS1, R-AI1: a fleet's replicas' first requests at once, refused
    /// before a window was measured: the limit the fleet's slow start
    /// placed is a guess at every replica, as at the refused one, and is
    /// probed soon — not after the wait at a known limit (measured: a fleet
    /// held 5 req/s on a 20 req/s bucket for half a minute). Once another
    /// replica places the limit anew, it is no guess.
    #[test]
    fn a_fleets_guess_at_a_cold_start_is_probed_soon() {
        let mut t = Instant::now();
        let mut a = Aimd::new(5.0, 0.1, 1000.0, 0.7, W);
        a.adopt(t, 5.0, None);
        a.on_hold(Duration::from_secs(1));
        a.adopt(t, 3.5, Some(5.0));
        let mut windows = 0;
        while a.rate() <= 5.0 && windows < 100 {
            saturate(&mut a, &mut t, 1);
            a.adopt(t, a.rate(), a.limit());
            windows += 1;
        }
        assert!(
            f64::from(windows) < PROBE_HOLD_RATIO,
            "probed after {windows} windows"
        );
        assert!(a.k().unconfirmed.is_some());
        a.adopt(t, a.rate() * 0.9, Some(6.0));
        assert!(a.k().unconfirmed.is_none(), "placed anew: no guess");
    }

    /// R-DS1, R-SG2: the wait at the settle point is measured in time: a
    /// replica of a fleet whose windows close on its own few answers (here
    /// every 2 s) probes [`PROBE_HOLD_RATIO`] holds after the fleet's last
    /// cut, as one sluice would, not twice that.
    #[test]
    fn the_wait_before_a_probe_is_measured_in_time() {
        let mut t = Instant::now();
        let start = t;
        let mut a = Aimd::new(5.0, 0.1, 1000.0, 0.7, W);
        a.restore(19.0, Some(20.0), None);
        a.adopt(t, 19.0, Some(20.0));
        a.on_shared_hold(t, Duration::from_secs(1));
        let slow = 2 * W;
        let mut windows = 0;
        while a.rate() <= 19.0 + 1e-9 && windows < 1000 {
            for j in 0..40u32 {
                let at = t + slow * j / 40;
                a.on_shared_admitted(at, 1, Some(slow / 40));
                a.on_admitted_here();
                if j % 8 == 0 {
                    a.on_clean(at, at, Some(Duration::from_millis(40)));
                }
            }
            t += slow;
            a.on_clean(t, t, Some(Duration::from_millis(40)));
            windows += 1;
        }
        let waited = (t - start).as_secs_f64();
        assert!(
            (PROBE_HOLD_RATIO..PROBE_HOLD_RATIO + 4.0).contains(&waited),
            "probed after {waited} s ({windows} windows)"
        );
    }

    /// R-DS1: a replica's raise the store did not take (another replica
    /// raised within the window) is no cut: the fleet's rate stands and
    /// nothing is learned from it. Once the store showed the raise taken,
    /// the same lower rate is another replica's cut (measured: a replica
    /// read its own untaken recovery step as the fleet's refusal and
    /// started its wait over, and the fleet's probes came late).
    #[test]
    fn a_raise_the_store_did_not_take_is_no_cut() {
        let mut t = Instant::now();
        let mut a = Aimd::new(5.0, 0.1, 1000.0, 0.7, W);
        a.restore(19.0, Some(20.0), None);
        a.adopt(t, 19.0, Some(20.0));
        a.on_shared_hold(t, Duration::from_secs(1));
        let first = replica_windows_to_probe(&mut a, &mut t, false);
        assert!(f64::from(first) >= PROBE_HOLD_RATIO, "probed after {first}");
        // Not taken: the fleet's rate stands, and the wait is not over
        // again — the next window probes.
        a.adopt(t, 19.0, Some(20.0));
        assert_eq!(a.rate(), 19.0, "the fleet's rate stands");
        let again = replica_windows_to_probe(&mut a, &mut t, false);
        assert_eq!(again, 1, "probed again after {again}");
        // Taken, then another replica's cut: the wait starts over.
        a.adopt(t, a.rate(), Some(20.0));
        a.adopt(t, 19.0, Some(20.0));
        let after_cut = replica_windows_to_probe(&mut a, &mut t, false);
        assert!(
            f64::from(after_cut) >= PROBE_HOLD_RATIO,
            "probed after {after_cut}"
        );
    }

    /// R-DS1, R-SG2: a replica learns the fleet's dwell as the replica the
    /// provider answered did. Another replica's raise past the dwell it
    /// follows passes it here too (the limit moves to the dwell's rate, the
    /// raise is the next dwell, followed); another's cut during a dwell
    /// makes the next wait twice as long here too — or the fleet's next
    /// probe would come at the least patient replica's time.
    #[test]
    fn a_replica_learns_the_fleets_dwells() {
        let mut t = Instant::now();
        let mut a = Aimd::new(5.0, 0.1, 1000.0, 0.7, W);
        a.restore(19.0, Some(20.0), None);
        a.adopt(t, 19.0, Some(20.0));
        a.on_shared_hold(t, Duration::from_secs(1));
        // Another replica's dwell, followed; then its raise past it.
        let dwell = 19.0 * PROBE_DWELL;
        a.adopt(t, dwell, Some(20.0));
        saturate(&mut a, &mut t, 2);
        let next = dwell * (1.0 + (PROBE_DWELL - 1.0) * 2.0);
        a.adopt(t, next, Some(dwell));
        assert_eq!(a.limit(), Some(dwell));
        assert!(a.known().fitted, "passed: known as a fit");
        // That dwell refused at another replica: the settle point under
        // the dwell that passed, and the probe's wait starts over as it
        // would have where the refusal came.
        a.adopt(t, dwell * SETTLE_SHARP, Some(dwell));
        let after_passed = replica_windows_to_probe(&mut a, &mut t, true);
        assert!(
            f64::from(after_passed) >= PROBE_HOLD_RATIO,
            "probed after {after_passed}"
        );
        // A dwell that finds nothing, refused at another replica: the next
        // waits twice as long.
        let settle = a.rate();
        a.adopt(t, settle * 0.98, Some(a.limit().unwrap()));
        let unrefused = replica_windows_to_probe(&mut a, &mut t, true);
        let settle = a.rate() / PROBE_DWELL;
        a.adopt(t, settle, a.limit());
        let refused = replica_windows_to_probe(&mut a, &mut t, true);
        assert!(
            f64::from(refused) >= 2.0 * PROBE_HOLD_RATIO,
            "after the fleet's refused dwell, probed after {refused} (before: {unrefused})"
        );
    }

    /// R-PS1: how a limit is known, restored with it, settles and probes
    /// as before the restart: close under a fitted limit, and with the
    /// provider's hold, [`PROBE_HOLD_RATIO`] holds before a dwell. Without
    /// a limit nothing of it is restored.
    #[test]
    fn a_restored_limit_is_known_as_before() {
        let known = LimitKnown {
            hold: Some(Duration::from_secs(1)),
            fitted: true,
            sharp: false,
            steady: false,
        };
        let mut t = Instant::now();
        let mut a = Aimd::new(5.0, 0.1, 1000.0, 0.7, W);
        a.restore(19.6, Some(20.0), None);
        a.restore_known(known);
        assert_eq!(a.known(), known);
        assert_eq!(a.settle_share(), SETTLE_SHARP);
        let mut windows = 0;
        while a.rate() <= 19.6 + 1e-9 && windows < 1000 {
            saturate(&mut a, &mut t, 1);
            windows += 1;
        }
        assert!(
            f64::from(windows) >= PROBE_HOLD_RATIO,
            "probed after {windows}"
        );
        assert!((a.rate() - 19.6 * PROBE_DWELL).abs() < 1e-9, "{}", a.rate());
        let mut cold = Aimd::new(5.0, 0.1, 1000.0, 0.7, W);
        cold.restore(5.0, None, None);
        cold.restore_known(known);
        assert_eq!(cold.known(), LimitKnown::default());
    }
}

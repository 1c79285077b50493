//! Where a cut takes the rate and the remembered limit (R-AI1): one cut
//! per congestion epoch, the limit placed from what was sent, delivered,
//! proved clean or fitted.

use super::*;

/// Refusals within a cut's echo that make a limit sharp.
pub(super) const SHARP_ECHO: u32 = 3;

/// Refusals within a cut's echo, as a share of a window's requests at the
/// rate after it, that say the provider's window counts its refusals too
/// (HAProxy's `http_req_rate`: 12–15 at 17.7 a second in the model), so
/// that each probe over its limit costs a window of refusals. A fixed
/// window's end with it: those sent after the cut before it ends (3 in the
/// model, at most a third of a window after slow start's overshoot by
/// half). Counted against `SHARP_ECHO`, a fixed window that restarts at
/// its first request (Flask-Limiter's) was taken for such a window and
/// never bisected: left at 0.92 of its limit (issue 35).
pub(super) const ECHO_GOES_ON: f64 = 0.5;

/// A steady limit's bare 503 (or queueing) at the settle point puts the
/// limit this share under the rate it met: the limit is known to within
/// the settle point's margin, and a plain unnamed step (×0.9) would cost a
/// tenth of the budget for a refusal the settle point was a hair too high
/// for.
pub(super) const STEADY_STEP: f64 = SETTLE_SHARP;

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
    /// How long the rate had been in force.
    pub(super) held_for: Duration,
    /// The rate the refused request was sent at, where a throttle told it
    /// (the rate may have changed since: a fleet's slow start raises it a
    /// window before the refusal comes back).
    pub(super) sent: f64,
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
    /// A limit told by bare 503s alone was met twice at the same place.
    pub(super) steady: bool,
    /// The lowest settle point a steady limit was throttled at.
    pub(super) refused_settle: Option<f64>,
    /// The limit before a probe last moved it, and when.
    pub(super) moved_from: Option<(f64, Instant)>,
    /// When the settle point itself was last throttled.
    pub(super) too_high_at: Option<Instant>,
    /// The provider holds after its refusals (`Retry-After`).
    pub(super) holds: bool,
    /// The limit was placed by slow start and not met since (see
    /// `Aimd::unconfirmed`).
    pub(super) unconfirmed: bool,
    /// The rate is a fleet's, shared through a budget.
    pub(super) shared: bool,
    /// A bracket is open: the probe went halfway to it at most, and its
    /// refusal narrows the bracket (a bucket's burst kept it clean for a
    /// while; what it delivered meanwhile moves nothing).
    pub(super) bisecting: bool,
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
    /// Whether the limit is steady now (see `Aimd::steady`).
    pub(super) steady: bool,
    /// A probe's move was undone: what it found was a burst's doing.
    pub(super) undid_move: bool,
    /// A plain probe refused while the limit held: the rate it was refused
    /// at bounds the limit from above (see `Aimd::bracket`).
    pub(super) bracket: Option<f64>,
}

/// Where a throttle puts the remembered limit and the rate, from the
/// evidence (a pure function: the controller applies what it returns).
///
/// * Slow start: throttling began at this rate, or at what the provider
///   delivered if that was less (a fleet held by the provider: at this
///   rate).
/// * A probe throttled before it got clearly past the limit: the limit
///   held; straight back to the settle point.
/// * A probe that went clean well past the limit: the limit lies past the
///   old one, no higher than the last clean rate nor than what was
///   delivered.
/// * Throttled at the settle point, or — where the provider holds after
///   its refusals — on the way back under slow start's guess however far
///   under it: the limit was too high — a throttle the provider named
///   says throttling began here; others step further, unless the limit is
///   steady; a token bucket's fitted refill rate, where the holds tell it,
///   says more.
/// * Far below a limit met, or a guess where the provider does not hold:
///   the limit has dropped.
///
/// Bare 503s say little once, so a limit they tell is judged over several
/// cuts (R-SG5): a probe above it refused before it got clearly past makes
/// it steady — met twice at one place. A steady limit is settled under as
/// closely as a sharp one, nudged up by what its probes proved clean
/// (never past a settle point refused since), and stepped down by a hair,
/// not a tenth, when its settle point is refused.
pub(super) fn place(e: &Evidence) -> Placement {
    let (from, settle) = (e.from, e.settle);
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
        steady: false,
        undid_move: false,
        bracket: None,
    };
    match (e.limit, e.probe) {
        // Slow start: throttling began at this rate, or at what the
        // provider delivered if that was less. A fleet's delivery, summed
        // over replicas that each took the shared rate up at their own
        // time, mixes the rates before it: where the provider holds, the
        // fleet's first refusal says throttling began at the rate it met.
        (None, _) if e.shared && e.holds => {
            p.limit = e.sent.min(from);
            p.to = p.limit * e.decrease;
        }
        (None, _) => {
            p.limit = delivered.min(from).max(from * e.decrease);
            p.to = from * e.decrease;
            if !e.reason.ambiguous() && !e.holds && p.limit < from {
                // Placed under the rate met: the limit lies between.
                p.bracket = Some(from);
            }
        }
        (Some(limit), Some(probe))
            if probe.dwell.is_some()
                || e.bisecting
                || probe_clean(e, probe) <= limit * PROBE_HELD =>
        {
            held_probe(e, limit, probe, &mut p);
        }
        (Some(limit), Some(probe)) => {
            moved_probe(e, limit, probe, &mut p);
        }
        // Throttled at the settle point: the limit was too high. So too
        // on the way to it under slow start's guess (`Aimd::unconfirmed`),
        // however far under, where the provider holds after its refusals
        // (`Retry-After`): the guess was too high, the provider's limit did
        // not drop. (Measured: a fleet whose guess sat a tenth over the
        // rate its recovery was refused at cut 30 % and climbed back for
        // four windows — a rate that moved since the hold, no point for the
        // fit at its next refusal — and met the limit only 31 s in; settled
        // under the rate met at once, it meets it some 2.5 s sooner, its
        // rate steady since the hold. Where the provider does not hold — a
        // moving window's refusals — a refusal far under a guess may be far
        // over the window's limit too, and the 30 % cut drains it at once.)
        (Some(limit), None) if from >= limit * PROBE_DECREASE || (e.unconfirmed && e.holds) => {
            (p.limit, p.tight, p.steady) = too_high(e, limit);
            p.too_high = true;
            p.undid_move = moved_soon_before(e).is_some();
            p.probe_wait = ProbeWait::Reset;
            p.to = p.limit * settle;
        }
        // Far below it: the limit has dropped.
        (Some(_), None) => {
            p.limit = from;
            p.to = from * e.decrease;
        }
    }
    if p.steady {
        // Known to within a step: settled under as closely as a sharp one.
        p.to = p.limit * SETTLE_SHARP;
    }
    p
}

/// What a probe found clean, judged by the throttle that ended it: a
/// steady limit's bare 503 is judged as a named throttle is.
fn probe_clean(e: &Evidence, probe: Probe) -> f64 {
    if e.steady && e.reason == BackoffReason::Unavailable {
        probe.proven
    } else {
        went_clean(e, probe)
    }
}

/// What a probe went clean at, by the throttle that ended it; above slow
/// start's limit, placed under the rate met, the rate it went clean at.
fn went_clean(e: &Evidence, probe: Probe) -> f64 {
    if e.unconfirmed {
        probe.clean_rate
    } else {
        probe.clean(e.reason)
    }
}

/// A probe throttled before it got clearly past the limit: the limit held;
/// straight back to the settle point.
fn held_probe(e: &Evidence, limit: f64, probe: Probe, p: &mut Placement) {
    // Met twice near the same rate: no longer a guess. What
    // the probe proved clean (two windows) is under it.
    p.confirmed = true;
    let l = if e.reason == BackoffReason::Unavailable {
        // Bare 503s met twice near one place: the limit is steady, and
        // what the probe proved clean over two windows is under it (or
        // a burst's doing: a step at most).
        p.steady = true;
        p.probe_wait = ProbeWait::Longer;
        // No higher than a settle point refused since (one under the limit
        // is another limit's: the limit has moved past it).
        let refused = e
            .refused_settle
            .filter(|r| *r > limit)
            .unwrap_or(f64::INFINITY);
        limit.max(probe.proven.min(limit * (1.0 + PROBE_STEP)).min(refused))
    } else if e.reason.ambiguous() {
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
    if probe.dwell.is_none()
        && !e.reason.ambiguous()
        && !e.holds
        && l == limit
        && e.from <= l * (1.0 + super::settle::BRACKET_TIGHT)
    {
        // Refused within a hair over a limit the probe's clean windows
        // did not raise: the limit is known that closely (a moving
        // window's, met again where it was).
        p.tight = true;
        p.to = l * SETTLE_SHARP;
    }
    if probe.dwell.is_none() && !e.reason.ambiguous() && !e.holds && e.from > l {
        // Between the two lies the limit: a bisection under way narrows
        // (see `Aimd::cut` for when a bracket may open).
        p.bracket = Some(e.from);
    }
    if probe.dwell.is_some() {
        // Refused within its dwell: the limit has not moved past the last
        // dwell passed, if any (the limit already moved there). A dwell
        // that found nothing costs a hold, so the next waits longer.
        p.probe_wait = if probe.dwelt.is_some() {
            ProbeWait::Reset
        } else {
            ProbeWait::Longer
        };
        if !e.reason.ambiguous() {
            // Refused a tenth over the settle point, once a burst was
            // spent: the settle point it started from was under the limit.
            // Back to it (never past a sharp margin), not lower.
            p.to = p.to.max(probe.proven.min(l * SETTLE_SHARP));
        }
    }
}

/// A probe that went clean well past the limit before it was throttled:
/// the limit lies past the old one, though no higher than the last clean
/// rate nor than what the provider delivered (a burst allowance can make a
/// window look clean).
fn moved_probe(e: &Evidence, limit: f64, probe: Probe, p: &mut Placement) {
    // Without a delivery measure, no further than a held probe. A
    // window's delivery is counted in whole answers: known to about one
    // (a clean window at 20.2 req/s counts 19 to 21 of them), so it bounds
    // the limit with that much slack, or its noise alone would place the
    // limit under the rate just proven clean (measured: 19.5 on a 20 req/s
    // bucket, settled 2.5 % under it, in 1 seed in 3).
    let slack = 1.0 / e.window.as_secs_f64();
    let delivered = e.delivered.map_or(limit * PROBE_HELD, |d| d + slack);
    let l = went_clean(e, probe).min(delivered).max(limit);
    // Slow start's limit was a guess under the rate met: should the move
    // prove a burst's doing, what the probe proved clean stands.
    p.moved_from = Some(if e.unconfirmed {
        probe.proven.max(limit)
    } else {
        limit
    });
    p.probe_wait = ProbeWait::Reset;
    p.clear_descent = true;
    p.limit = l;
    if !e.reason.ambiguous() && !e.holds && e.from > l {
        p.bracket = Some(e.from);
    }
    // Slow start's limit bracketed between a whole clean window and the
    // refusal one step above it: settled under as closely as a fit.
    p.tight = e.unconfirmed;
    p.to = (l * e.settle).min(e.from * PROBE_DECREASE);
}

/// The limit before a probe moved it, if that was within the last
/// [`PROBE_AFTER`] windows.
fn moved_soon_before(e: &Evidence) -> Option<f64> {
    e.moved_from
        .filter(|(_, at)| e.now.saturating_duration_since(*at) < e.window * PROBE_AFTER)
        .map(|(before, _)| before)
}

/// Throttled at the settle point: the limit was too high. Where it goes,
/// whether it is a tight fit of a token bucket's refill rate, and whether
/// it is steady.
fn too_high(e: &Evidence, limit: f64) -> (f64, bool, bool) {
    let (from, reason, delivered) = (e.from, e.reason, e.delivered.unwrap_or(f64::INFINITY));
    debug_assert!(from >= limit * PROBE_DECREASE || (e.unconfirmed && e.holds));
    // A throttle the provider named says throttling began at this rate;
    // others (latency, bare 503s) say less, and step further.
    let named = matches!(
        reason,
        BackoffReason::Throttled | BackoffReason::UnavailableRetryAfter
    );
    // A steady limit's bare 503 or queueing at the settle point: the
    // limit is known to within a small step.
    let steady = e.steady && matches!(reason, BackoffReason::Unavailable | BackoffReason::Latency);
    match moved_soon_before(e) {
        // Soon after a probe moved the limit: what it found was
        // a burst allowance's doing. Back to the limit before.
        // Bare 503s: the limit before held twice, steady.
        Some(before) => (
            before.min(from),
            false,
            e.steady || reason == BackoffReason::Unavailable,
        ),
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
                (false, _) if steady => from * STEADY_STEP,
                (false, _) => from * PROBE_DECREASE,
            })
            .min(delivered)
            .min(fitted)
            .max(from * e.decrease);
            // A fleet's rate refused once it had held a while: the
            // bucket's burst spent over that long, throttling began
            // within a hair of it (a fleet's windows are too coarse to
            // tell more: settled under as one sluice's fit would be,
            // not a twentieth under, where a rate a few hundredths over
            // a small burst's refill is refused again and again).
            // Where the fit put it under that rate, the fit is the
            // closer of the two, and as tight.
            let long = e.shared
                && held
                && (l == from || fit.is_some_and(|(at, _)| l == at))
                && e.held_for >= e.window * PROBE_AFTER;
            let tight = long || fit.is_some_and(|(at, margin)| l == at && margin <= at * FIT_TIGHT);
            (l, tight, steady)
        }
    }
}

impl Aimd {
    /// Whether the provider's refusals go on after the last cut: a window
    /// that counts its refusals too, whose echo lasts most of a window
    /// (see [`ECHO_GOES_ON`]).
    pub(super) fn refusals_go_on(&self) -> bool {
        f64::from(self.k().echo) >= ECHO_GOES_ON * self.rate * self.window().as_secs_f64()
    }

    /// Cuts the rate now and moves the remembered limit (see [`place`]).
    pub(super) fn cut(
        &mut self,
        now: Instant,
        reason: BackoffReason,
        sent_at: Option<Instant>,
    ) -> Backoff {
        if self.k().last_decrease.is_some() && !reason.ambiguous() {
            // The last cut's echo is over: was its limit sharp?
            self.k_mut().sharp = self.k().echo >= SHARP_ECHO;
        }
        if self.refusals_go_on() {
            // No bisecting such a limit (see `Aimd::increase`).
            self.kp_mut().bisect_fooled = true;
        }
        self.reset(|k| k.echo = 0);
        self.dwell_refused(now);
        let from = self.rate;
        let p = place(&Evidence {
            reason,
            from,
            sent: sent_at.map_or(from, |at| self.rate_at(at)),
            held_for: self.changes.back().map_or(Duration::MAX, |(at, _)| {
                now.saturating_duration_since(at.at())
            }),
            decrease: self.decrease(),
            limit: self.k().limit,
            probe: self.probe.as_deref().copied(),
            delivered: self.delivered.get(),
            settle: self.settle_share(),
            fitted: self.k().fitted,
            sharp: self.k().sharp,
            steady: self.k().steady,
            refused_settle: self.kp().refused_settle,
            moved_from: self.kp().moved_from,
            too_high_at: self.kp().too_high_at,
            holds: !self.k().hold_cost.is_zero(),
            unconfirmed: self.k().unconfirmed.is_some(),
            shared: self.shared,
            fit: self.kp().descent.limit(),
            bisecting: self.kp().bracket.is_some(),
            window: self.window(),
            now,
        });
        if p.confirmed {
            self.reset(|k| k.limit_weak = false);
        }
        // Slow start's one refusal is a guess at the limit where it landed
        // under the rate met, or came before any window was measured (a
        // cold start's first requests at once). A fleet's is placed at the
        // rate met (see `place`): a guess only where no window was
        // measured (its replicas' first requests at once; measured, a
        // fleet held 5 req/s on a 20 req/s bucket for a minute). Another
        // replica's cut confirms it (see `Aimd::fleet_refused`).
        let guess = (p.limit < from && !self.shared) || self.delivered.get().is_none();
        self.k_mut().unconfirmed =
            (self.k().limit.is_none() && !self.k().hold_cost.is_zero() && guess).then_some(from);
        self.k_mut().steady = p.steady;
        if p.too_high && p.steady {
            // The lowest since the limit last moved past one.
            self.kp_mut().refused_settle = Some(match self.kp().refused_settle {
                Some(r) if r > p.limit => r.min(from),
                _ => from,
            });
        }
        match p.probe_wait {
            ProbeWait::Keep => {}
            ProbeWait::Reset => self.k_mut().probe_backoff = 0,
            ProbeWait::Longer => self.k_mut().probe_backoff = (self.k().probe_backoff + 1).min(2),
        }
        if let Some(before) = p.moved_from {
            self.kp_mut().moved_from = Some((before, now));
        }
        if p.clear_descent {
            self.reset_p(|k| k.descent.clear());
        }
        if p.undid_move {
            self.dwell_fooled();
        }
        if p.too_high {
            self.kp_mut().too_high_at = Some(now);
        }
        // A bracket stands while probes are refused under it; any other
        // placement moved the limit past what it bounded. A bisection's
        // move undone was a burst's doing: the provider is no sharp limit
        // to bisect.
        let soon = |at: Instant| now.saturating_duration_since(at) < self.window() * PROBE_AFTER;
        if p.too_high && self.kp().bisect_at.is_some_and(soon) {
            self.kp_mut().bisect_fooled = true;
        }
        // Brackets begin at slow start's refusal only: once closed or let
        // go, a probe refused above the limit is the one overshoot a probe
        // costs, not the start of another bisection (whose probes would
        // each cost one, and cap the probe that finds a raised limit).
        let opens = self.k().limit.is_none() || self.kp().bracket.is_some();
        let (old_bracket, fooled) = (self.kp().bracket, self.kp().bisect_fooled);
        let bracket = p.bracket.filter(|_| opens && !fooled).map(|b| {
            old_bracket
                .filter(|old| *old > p.limit)
                .map_or(b, |old| old.min(b))
        });
        // (No bracket to keep makes nothing for it.)
        match bracket {
            Some(_) => self.kp_mut().bracket = bracket,
            None => self.reset_p(|k| k.bracket = None),
        }
        // One that close over the limit knows it as closely as a fit.
        let closed = self
            .kp()
            .bracket
            .is_some_and(|b| b <= p.limit * (1.0 + super::settle::BRACKET_TIGHT));
        if closed {
            self.reset_p(|k| k.bracket = None);
        }
        let (limit, tight) = (p.limit, p.tight || closed);
        if self.k().limit != Some(limit) && self.kp().moved_from.is_none_or(|(_, at)| at != now) {
            self.reset_p(|k| k.moved_from = None);
        }
        self.k_mut().fitted = tight;
        // Known that closely, the limit is settled under as a sharp one is.
        let to = if tight { limit * SETTLE_SHARP } else { p.to };
        self.k_mut().limit = Some(limit);
        if let Some(streak) = self.streak.as_mut() {
            streak.cuts += 1;
            streak.last_cut = now;
        }
        self.reset_plateau();
        self.reset(|k| k.recover_to = Maybe::NONE);
        self.k_mut().last_decrease = Some(now.into());
        self.window_cut = true;
        self.latency.clear();
        self.set_rate(now, to.max(self.floor()).min(from));
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
            sent: from,
            held_for: Duration::MAX,
            decrease: 0.7,
            limit,
            probe: None,
            delivered: None,
            settle: SETTLE,
            fitted: false,
            sharp: false,
            steady: false,
            refused_settle: None,
            moved_from: None,
            too_high_at: None,
            holds: false,
            unconfirmed: false,
            shared: false,
            fit: None,
            bisecting: false,
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
        // A fleet held by the provider (issue 34): its delivery mixes the
        // rates each replica took up at its own time; throttling began at
        // the rate met.
        let p = place(&Evidence {
            delivered: Some(16.0),
            shared: true,
            holds: true,
            ..evidence(BackoffReason::Throttled, 20.0, None)
        });
        assert_eq!((p.limit, p.to), (20.0, 14.0));
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
        // A probe clean well past it: the limit moved, from the old one, no
        // further than what was delivered — counted in whole answers, so
        // known to about one (a second's window: 1 req/s).
        let moved = Evidence {
            probe: Some(Probe::new(14.0)),
            delivered: Some(12.0),
            ..evidence(BackoffReason::Throttled, 15.0, Some(10.0))
        };
        let p = place(&moved);
        assert_eq!(
            (p.limit, p.moved_from, p.clear_descent),
            (13.0, Some(10.0), true)
        );
        // Delivered within an answer of the rate proven clean: the count's
        // noise, not a bound.
        let p = place(&Evidence {
            delivered: Some(13.5),
            ..moved
        });
        assert_eq!(p.limit, 14.0);
        // Far below it: the limit dropped.
        let p = place(&evidence(BackoffReason::Throttled, 5.0, Some(10.0)));
        assert_eq!((p.limit, p.to), (5.0, 3.5));
        // Far below slow start's guess (a fleet's, its replicas' first
        // requests at once, 25.3 on a 20 req/s bucket that holds), on the
        // way back to it: the guess was too high — settled under the rate
        // met, as at a settle point, not cut 30 % to climb back for windows.
        let guess = Evidence {
            unconfirmed: true,
            shared: true,
            holds: true,
            ..evidence(BackoffReason::Throttled, 22.465, Some(25.3125))
        };
        let p = place(&guess);
        assert_eq!((p.limit, p.to, p.too_high), (22.465, 22.465 * SETTLE, true));
        // …but where the provider does not hold (a moving window's
        // refusals), the limit may lie far under: cut as a limit that dropped.
        let p = place(&Evidence {
            holds: false,
            ..guess
        });
        assert_eq!((p.limit, p.too_high), (22.465, false));
        assert!((p.to - 22.465 * 0.7).abs() < 1e-9, "{}", p.to);
    }

    /// Bare 503s met twice at one place (a probe refused before it got
    /// clearly past): the limit is steady, nudged up to what the probe
    /// proved clean (a step at most, never past a settle point refused
    /// since) and settled under as closely as a sharp one; its settle
    /// point refused, it steps down by a hair.
    #[test]
    fn a_bare_503_limit_met_twice_is_steady() {
        let probe = Probe {
            windows: 3,
            clean_rate: 21.6,
            proven: 20.0,
            ..Probe::new(20.0)
        };
        let held = Evidence {
            probe: Some(probe),
            ..evidence(BackoffReason::Unavailable, 24.8, Some(19.8))
        };
        let p = place(&held);
        assert!(p.confirmed && p.steady);
        assert_eq!(p.probe_wait, ProbeWait::Longer);
        assert_eq!(p.limit, 20.0);
        assert!((p.to - 20.0 * SETTLE_SHARP).abs() < 1e-12);
        // A step at most past the limit it had.
        let far = Evidence {
            probe: Some(Probe {
                proven: 21.0,
                ..probe
            }),
            ..held
        };
        assert!((place(&far).limit - 19.8 * (1.0 + PROBE_STEP)).abs() < 1e-12);
        // Never past a settle point refused since.
        let capped = Evidence {
            refused_settle: Some(19.9),
            ..far
        };
        assert_eq!(place(&capped).limit, 19.9);
        // Not steady yet: the same probe leaves the limit where it was.
        let timeout = Evidence {
            reason: BackoffReason::Timeout,
            ..held
        };
        let p = place(&timeout);
        assert!(!p.steady && p.limit == 19.8);
        // The settle point of a steady limit refused: a hair under it.
        let at_settle = Evidence {
            steady: true,
            ..evidence(BackoffReason::Unavailable, 20.3, Some(20.7))
        };
        let p = place(&at_settle);
        assert!(p.too_high && p.steady);
        assert!((p.limit - 20.3 * STEADY_STEP).abs() < 1e-12);
        assert!((p.to - p.limit * SETTLE_SHARP).abs() < 1e-12);
        // Not steady: a tenth under, and settled with the plain margin.
        let p = place(&Evidence {
            steady: false,
            ..at_settle
        });
        assert!(!p.steady && (p.limit - 20.3 * PROBE_DECREASE).abs() < 1e-12);
        // A named throttle is judged as before, and ends the steadiness.
        let p = place(&Evidence {
            reason: BackoffReason::Throttled,
            ..at_settle
        });
        assert!(!p.steady && p.limit == 20.3, "{p:?}");
    }

    /// The settle point judged on something steady (issue 33): nginx's
    /// `limit_req` at 20 r/s with `burst=5 nodelay` answers a bare 503,
    /// and its burst lets one window's delivery read anywhere from 19.8 to
    /// 21 r/s. Once a probe has met the limit twice, the second half of a
    /// minute and a half is at least 97 % of the limit with under 1 %
    /// refused, whatever the first reading was.
    #[test]
    fn nginx_nodelay_is_settled_under_closely_once_met_twice() {
        for first in [19.8, 20.2, 20.9] {
            let mut a = Aimd::new(5.0, 0.1, 80.0, 0.7, W);
            // Where the first too-high cut's one-window reading put it.
            a.restore(first * SETTLE, Some(first), None);
            let (accepted, refused) = limit_req(&mut a, 90);
            let ok = accepted.iter().filter(|t| **t >= 45.0).count() as f64;
            let no = refused.iter().filter(|t| **t >= 45.0).count() as f64;
            let goodput = ok / (45.0 * 20.0);
            assert!(a.k().steady, "from {first}: a probe met the limit twice");
            assert!(
                goodput >= 0.97,
                "from {first}: goodput {:.1} %",
                goodput * 100.0
            );
            assert!(
                no / (ok + no) < 0.01,
                "from {first}: {no} refused of {}",
                ok + no
            );
        }
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

    /// R-DS1, R-SG5: a fleet's evidence. Slow start's refusal places the
    /// limit at the rate the refused request was sent at, not at a raise
    /// another replica made before the refusal came back. A refusal of
    /// a rate the fleet held a while (the burst spent over that long) says
    /// throttling began within a hair of it: settled under as closely as
    /// one sluice's fit (measured: a fleet at 0.95 of a rate refused after
    /// a recovery step sat a few hundredths over a burst-2 bucket's refill
    /// and was refused again and again), or as closely under the fleet's
    /// fit where that is lower; refused soon after a step, as before.
    #[test]
    fn a_fleets_refusals_are_placed_from_the_fleets_evidence() {
        let fleet = |from: f64, limit: Option<f64>| Evidence {
            shared: true,
            holds: true,
            ..evidence(BackoffReason::Throttled, from, limit)
        };
        let p = place(&Evidence {
            sent: 25.0,
            ..fleet(37.5, None)
        });
        assert_eq!((p.limit, p.to), (25.0, 25.0 * 0.7));
        let long = place(&Evidence {
            held_for: Duration::from_secs(30),
            ..fleet(20.0, Some(21.0))
        });
        assert!(long.too_high && long.tight, "{long:?}");
        assert_eq!(long.limit, 20.0);
        // The fleet's refusals fitted under that rate, loosely: the limit
        // goes to the fit, as tight (settled at 0.95 of a fit 1.3 % over
        // a 20 req/s bucket, a fleet fell to 0.94 of it over 30–60 s).
        let fitted = place(&Evidence {
            held_for: Duration::from_secs(30),
            fit: Some((19.5, 0.5)),
            ..fleet(20.0, Some(21.0))
        });
        assert!(fitted.too_high && fitted.tight, "{fitted:?}");
        assert_eq!(fitted.limit, 19.5);
        let fitted_brief = place(&Evidence {
            held_for: Duration::from_secs(2),
            fit: Some((19.5, 0.5)),
            ..fleet(20.0, Some(21.0))
        });
        assert!(!fitted_brief.tight, "{fitted_brief:?}");
        let brief = place(&Evidence {
            held_for: Duration::from_secs(2),
            ..fleet(20.0, Some(21.0))
        });
        assert!(brief.too_high && !brief.tight, "{brief:?}");
        // One sluice's long-held rate refused: as before (its own fit, not
        // the fleet's coarse windows, says how close).
        let one = place(&Evidence {
            held_for: Duration::from_secs(30),
            shared: false,
            ..fleet(20.0, Some(21.0))
        });
        assert!(!one.tight, "{one:?}");
    }
}

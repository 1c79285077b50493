//! Outage or throttle (R-SG4): failures in a row that no cut changes are
//! an outage — the rate is held, no limit is learned, and the first clean
//! answer gives back what the streak took.

use super::*;

/// Cuts a failure streak may make with no clean answer between its
/// failures: enough to leave a throttle's limit (two cuts take the rate
/// under half of where the streak began, and slow start overshoots by at
/// most half), few enough that an outage leaves the rate at half its
/// value, not at the floor where the provider's return would be seen once
/// every ten seconds.
pub const STREAK_MAX_CUTS: u32 = 2;

/// Failures in a row are an outage once they have gone on this long
/// (and for at least two increase windows) since the streak's last cut: a
/// throttle stops failing soon after the rate falls under its limit.
pub const OUTAGE_PERSIST: Duration = Duration::from_secs(2);

/// …and counted at least this many failures.
pub const OUTAGE_MIN_FAILURES: u32 = 10;

/// A failure streak that begins this soon after an outage gave the rate
/// back is that rate's doing: a throttle.
pub const RELAPSE: Duration = Duration::from_secs(5);

/// Failures in a row: no clean answer to a request sent since the first
/// of them.
#[derive(Debug, Clone, Copy)]
pub(super) struct Streak {
    /// When the first failure's request was sent: a clean answer to a
    /// request sent earlier says nothing about now.
    pub(super) first_sent: Instant,
    /// When the first failure came back.
    pub(super) began: Instant,
    /// Failures counted.
    pub(super) failures: u32,
    /// The rate, throttle point and its weakness before the streak's
    /// first cut: what an outage gives back.
    pub(super) rate_before: f64,
    /// See `rate_before`.
    pub(super) limit_before: Option<f64>,
    /// See `rate_before`.
    pub(super) weak_before: bool,
    /// Cuts made during the streak.
    pub(super) cuts: u32,
    /// The streak's last cut, or its beginning.
    pub(super) last_cut: Instant,
    /// It began within [`RELAPSE`] of an outage's end: a throttle.
    pub(super) relapse: bool,
    /// It was found to be an outage, at this instant.
    pub(super) outage_at: Option<Instant>,
}

impl Aimd {
    /// Outages seen since start.
    pub fn outages(&self) -> u64 {
        self.k().outages
    }

    /// Whether the controller believes the provider is down.
    pub fn in_outage(&self) -> bool {
        self.streak
            .as_deref()
            .copied()
            .is_some_and(|s| s.outage_at.is_some())
    }

    /// The outage watch ([`crate::park`]) found the provider down before
    /// this controller did: the streak of failures in progress is an
    /// outage, judged at `now` — the rate is held, no trial or probe
    /// survives it, and its first clean answer gives back the rate and
    /// throttle point from before it (R-SG4). Returns whether this made
    /// it one (not when there is no streak, or it already is one, or the
    /// failures are a relapse judged as a throttle).
    pub fn declare_outage(&mut self, now: Instant) -> bool {
        let Some(streak) = self.streak.as_mut() else {
            return false;
        };
        if streak.outage_at.is_some() || streak.relapse {
            return false;
        }
        streak.outage_at = Some(now);
        self.k_mut().outages += 1;
        self.trial = None;
        self.reset(|k| k.recover_to = Maybe::NONE);
        self.reset_plateau();
        true
    }

    /// Whether a failure to a request sent at `sent_at` is an echo of the
    /// outage that a clean answer to a later request already ended.
    pub(super) fn outage_echo(&self, sent_at: Instant) -> bool {
        self.k()
            .outage_ended
            .is_some_and(|(_, ended)| sent_at < ended.at())
    }

    /// A failure (a bare 503, a timeout, another 5xx, a failed connection)
    /// to a request sent at `sent_at`: counted in the streak, which may now
    /// be found an outage. Returns whether the rate is held (the streak
    /// has cut as often as it may, or it is an outage).
    pub(super) fn streak_failure(&mut self, sent_at: Instant, now: Instant) -> bool {
        let relapse = self
            .k()
            .outage_ended
            .is_some_and(|(at, _)| now.saturating_duration_since(at.at()) < RELAPSE);
        let persist = OUTAGE_PERSIST.max(self.window() * 2);
        let (rate_before, limit_before, weak_before) =
            (self.rate, self.k().limit, self.k().limit_weak);
        let streak = self.streak.get_or_insert_with(|| {
            Box::new(Streak {
                first_sent: sent_at,
                began: now,
                failures: 0,
                rate_before,
                limit_before,
                weak_before,
                cuts: 0,
                last_cut: now,
                relapse,
                outage_at: None,
            })
        });
        streak.failures = streak.failures.saturating_add(1);
        if streak.relapse {
            return false;
        }
        let held = streak.outage_at.is_some() || streak.cuts >= STREAK_MAX_CUTS;
        if streak.outage_at.is_none()
            && streak.failures >= OUTAGE_MIN_FAILURES
            && now.saturating_duration_since(streak.last_cut) >= persist
        {
            // Every answer failed, at a rate no cut has changed for a
            // while: not the rate's doing. No trial or probe survives it.
            streak.outage_at = Some(now);
            self.k_mut().outages += 1;
            self.trial = None;
            self.reset(|k| k.recover_to = Maybe::NONE);
            self.reset_plateau();
            return true;
        }
        held
    }

    /// A clean answer to a request sent at `sent_at` ends a streak of
    /// failures sent after it. An outage's end gives back the rate and
    /// the throttle point from before it (a clean answer: R-AI4 holds).
    /// Returns whether it did.
    pub(super) fn end_streak(&mut self, sent_at: Instant, now: Instant) -> bool {
        let Some(streak) = self
            .streak
            .as_deref()
            .copied()
            .filter(|s| sent_at >= s.first_sent)
        else {
            return false;
        };
        self.streak = None;
        if streak.outage_at.is_none() {
            return false;
        }
        self.k_mut().limit = streak.limit_before;
        self.k_mut().limit_weak = streak.weak_before;
        self.trial = None;
        self.reset(|k| k.recover_to = Maybe::NONE);
        self.reset_plateau();
        // The outage's failures are neither noise nor a throttle's: the
        // rate evidence they left would mislead the next judgement.
        self.errors.forget_episode();
        self.latency.clear();
        self.k_mut().outage_ended = Some((now.into(), sent_at.into()));
        let back = streak.rate_before.clamp(self.floor(), self.ceiling());
        if back > self.rate {
            self.set_rate(now, back);
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    /// R-SG4: a provider paced at its ceiling answers every request with a
    /// bare 503 for 3 s (a deploy). The streak cuts twice at most, is found
    /// an outage, and the first clean answer after it gives the rate back:
    /// no throttle point is learned from it.
    #[test]
    fn a_short_outage_of_bare_503s_gives_the_rate_back() {
        let mut t = Instant::now();
        let mut a = Aimd::new(5.0, 0.1, 50.0, 0.7, W);
        saturate(&mut a, &mut t, 12);
        assert_eq!(a.rate(), 50.0);
        assert_eq!(a.limit(), None);
        fail_for(&mut a, &mut t, 3000, bare_503);
        assert!(a.rate() >= 50.0 * 0.7 * 0.7 - 1e-9, "held: {}", a.rate());
        assert!(a.in_outage(), "{:?}", a.belief(t));
        assert_eq!(a.belief(t).unwrap().condition, Condition::Outage);
        assert_eq!(a.outages(), 1);
        let change = a.on_clean(t, t, Some(Duration::from_millis(40)));
        assert!(change.increased);
        assert_eq!(a.rate(), 50.0, "the rate from before the outage");
        assert_eq!(a.limit(), None, "no throttle point from an outage");
        assert!(!a.in_outage());
        assert_eq!(a.belief(t), None);
        // And it stays there: the outage left no evidence behind.
        let cuts = run(&mut a, &mut t, 30, 0);
        assert_eq!((cuts, a.rate()), (0, 50.0));
    }

    /// R-SG4 with a throttle point already learned: an outage neither
    /// moves it nor leaves the rate below the settle point.
    #[test]
    fn an_outage_keeps_the_learned_throttle_point() {
        let mut t = Instant::now();
        let mut a = Aimd::new(5.0, 0.1, 200.0, 0.7, W);
        a.restore(19.0, Some(20.0), None);
        saturate(&mut a, &mut t, 3);
        let (rate, limit) = (a.rate(), a.limit());
        fail_for(&mut a, &mut t, 10_000, bare_503);
        assert!(a.in_outage());
        a.on_clean(t, t, None);
        assert_eq!((a.rate(), a.limit()), (rate, limit));
    }

    /// R-SG4: refused or reset connections never cut, but a streak of them
    /// is an outage all the same (the readout says so), and nothing is cut.
    #[test]
    fn refused_connections_are_an_outage_without_a_cut() {
        let mut t = Instant::now();
        let mut a = Aimd::new(5.0, 0.1, 50.0, 0.7, W);
        saturate(&mut a, &mut t, 12);
        fail_for(&mut a, &mut t, 3000, |a, at| a.on_error(at, at));
        assert_eq!(a.rate(), 50.0);
        assert_eq!(a.belief(t).unwrap().condition, Condition::Outage);
        assert_eq!(a.belief(t).unwrap().why, "every_answer_failed");
        a.on_clean(t, t, None);
        assert_eq!((a.rate(), a.limit(), a.belief(t)), (50.0, None, None));
    }

    /// R-SG3 stays: a limiter that refuses everything while it is pushed
    /// past its limit and nothing once the rate is under it (a sliding
    /// window counting its refusals, answering bare 503s) is a throttle:
    /// its failures stop within a second of the cuts, so they are never
    /// an outage, the cuts stand and a throttle point is kept.
    #[test]
    fn failures_that_stop_after_the_cuts_are_a_throttle() {
        let mut t = Instant::now();
        let mut a = Aimd::new(5.0, 0.1, 200.0, 0.7, W);
        // Slow start to 30 req/s against a limit of 20.
        while a.rate() < 30.0 {
            saturate(&mut a, &mut t, 1);
        }
        let before = a.rate();
        // The window: what was sent over the last second, refusals too.
        let mut sent: VecDeque<Instant> = VecDeque::new();
        let mut statuses = Vec::new();
        let end = t + Duration::from_secs(30);
        while t < end {
            a.on_admit(t);
            while sent.front().is_some_and(|s| *s + W <= t) {
                sent.pop_front();
            }
            sent.push_back(t);
            if sent.len() > 20 {
                bare_503(&mut a, t);
                statuses.push(503);
            } else {
                a.on_clean(t, t, Some(Duration::from_millis(40)));
                statuses.push(200);
            }
            assert!(!a.in_outage(), "at {:?}", t);
            t += Duration::from_secs_f64(1.0 / a.rate());
        }
        assert!(a.rate() < before && a.rate() <= 20.5, "{}", a.rate());
        assert!(a.limit().is_some_and(|l| l < before), "{:?}", a.limit());
        assert_eq!(a.outages(), 0);
    }

    /// R-SG4: failures that come back as soon as an outage gave the rate
    /// back were that rate's doing: judged as a throttle, cut on without a
    /// hold, and never restored into a second time.
    #[test]
    fn failures_right_after_an_outage_are_a_throttle() {
        let mut t = Instant::now();
        let mut a = Aimd::new(5.0, 0.1, 50.0, 0.7, W);
        saturate(&mut a, &mut t, 12);
        fail_for(&mut a, &mut t, 3000, bare_503);
        a.on_clean(t, t, None);
        assert_eq!(a.rate(), 50.0);
        t += Duration::from_millis(100);
        fail_for(&mut a, &mut t, 6000, bare_503);
        assert!(!a.in_outage());
        assert_eq!(a.outages(), 1);
        assert!(a.rate() < 50.0 * 0.7 * 0.7, "cut on: {}", a.rate());
        assert_eq!(a.belief(t).unwrap().condition, Condition::Throttle);
        assert_eq!(a.belief(t).unwrap().why, "failures_came_back_with_the_rate");
    }

    /// R-AI4 through an outage: no error ever raises the rate; only the
    /// clean answer after it does.
    #[test]
    fn an_outage_never_raises_the_rate_on_an_error() {
        let mut t = Instant::now();
        let mut a = Aimd::new(5.0, 0.1, 50.0, 0.7, W);
        saturate(&mut a, &mut t, 12);
        let mut last = a.rate();
        fail_for(&mut a, &mut t, 5000, |a, at| {
            a.on_ambiguous(at, at, BackoffReason::Timeout);
        });
        for _ in 0..50 {
            t += Duration::from_millis(50);
            a.on_ambiguous(t, t, BackoffReason::Unavailable);
            a.on_error(t, t);
            assert!(a.rate() <= last);
            last = a.rate();
        }
    }
}

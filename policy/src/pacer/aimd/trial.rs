//! Trials of cuts made on ambiguous evidence (R-SG3): a bare 503 or a
//! timeout cuts on trial; the errors after the cut say whether it was a
//! throttle (it stands) or noise (it is undone).

use super::*;

/// Errors a trial needs at the lower rate to call the cut noise.
pub const TRIAL_NOISE_ERRORS: f64 = 3.0;

/// A trial expects this many errors, at the share seen before the cut,
/// before an absence of errors confirms the cut.
pub const TRIAL_EXPECTED_ERRORS: f64 = 6.0;

/// Bounds on the answers a trial waits for.
pub const TRIAL_MIN_ANSWERS: f64 = 50.0;

/// See [`TRIAL_MIN_ANSWERS`].
pub const TRIAL_MAX_ANSWERS: f64 = 3000.0;

/// A trial's verdicts are made at this significance: it has few errors to
/// go by, and a wrong verdict is corrected by the next trial or probe.
pub const TRIAL_SIGNIFICANCE: f64 = 0.01;

/// A trial still undecided after this long confirms its cut.
pub const TRIAL_MAX_AGE: Duration = Duration::from_secs(30);

/// Bare-503 cuts taken without a trial after one confirmed them.
pub(super) const TRUSTED_THROTTLES: u8 = 4;

/// A cut made on ambiguous evidence, waiting for its verdict.
#[derive(Debug, Clone, Copy)]
pub(super) struct Trial {
    /// The rate before the cut.
    pub(super) from: f64,
    /// The remembered limit before the cut.
    pub(super) prev_limit: Option<f64>,
    /// That limit rested on ambiguous evidence only.
    pub(super) prev_weak: bool,
    /// When the cut was made; answers to earlier sends are not evidence.
    pub(super) cut_at: Instant,
    /// The error share before the cut.
    pub(super) pre_share: f64,
    /// `pre_share` was measured at the rate cut from (enough answers
    /// there); only then can the errors after be judged the same.
    pub(super) pre_measured: bool,
    /// The error baseline (noise) when the cut was made, 0 if none.
    pub(super) base_share: f64,
    /// Answers to requests sent since the cut.
    pub(super) answers: f64,
    /// Ambiguous errors among them.
    pub(super) errors: f64,
}

impl Trial {
    pub(super) fn answers_needed(&self) -> f64 {
        (TRIAL_EXPECTED_ERRORS / self.pre_share.max(1e-9))
            .clamp(TRIAL_MIN_ANSWERS, TRIAL_MAX_ANSWERS)
    }

    /// The verdict after an answer; `error`: that answer was an error.
    pub(super) fn verdict(&self, now: Instant, error: bool) -> Verdict {
        let share = self.errors / self.answers.max(1.0);
        if error && self.errors >= 2.0 {
            // More errors than noise can be, significantly more than before
            // the cut (the provider throttles harder), or significantly
            // fewer (the rate matters): either way it still pushes back.
            let expected = self.pre_share * self.answers;
            if poisson_tail(self.errors, NOISE_MAX * self.answers) < TRIAL_SIGNIFICANCE
                || poisson_tail(self.errors, expected) < TRIAL_SIGNIFICANCE
                || poisson_below(self.errors, expected) < TRIAL_SIGNIFICANCE
            {
                return Verdict::StillThrottled(share);
            }
            if self.errors >= TRIAL_NOISE_ERRORS && share <= NOISE_MAX {
                // Without a share measured at the old rate, errors going on
                // at the lower one are pressure, not proven noise.
                return if self.pre_measured {
                    Verdict::Noise
                } else {
                    Verdict::StillThrottled(share)
                };
            }
        }
        if self.answers >= self.answers_needed()
            || now.saturating_duration_since(self.cut_at) >= TRIAL_MAX_AGE
        {
            // The errors stopped (none beyond the baseline's): the cut
            // stands. Errors that went on, neither noise nor stopped: still
            // throttled.
            let quiet = self.errors <= 1.0
                || poisson_tail(self.errors, self.base_share * self.answers) >= TRIAL_SIGNIFICANCE;
            return if quiet {
                Verdict::Confirmed
            } else {
                Verdict::StillThrottled(share)
            };
        }
        Verdict::Open
    }
}

/// What a trial concluded.
pub(super) enum Verdict {
    /// Not yet.
    Open,
    /// The errors stopped at the lower rate: the cut stands.
    Confirmed,
    /// The errors went on as before: the cut is undone.
    Noise,
    /// The errors fell with the rate but go on: the cut was right and not
    /// enough; cut again, judging the next cut against this share.
    StillThrottled(f64),
}

impl Aimd {
    /// Whether a cut on ambiguous evidence awaits its verdict.
    pub fn in_trial(&self) -> bool {
        self.trial.is_some()
    }

    /// Counts an answer towards an open trial and acts on a verdict other
    /// than a cut.
    pub(super) fn trial_answer(&mut self, sent_at: Instant, error: bool, now: Instant) {
        let Some(trial) = self.trial.as_mut() else {
            return;
        };
        if sent_at < trial.cut_at {
            return;
        }
        trial.answers += 1.0;
        if error {
            trial.errors += 1.0;
        }
        // Plain 5xx are evidence for the trial, but only an ambiguous
        // pressure signal cuts: a verdict to cut again waits for one.
        if !error {
            let _ = self.settle_trial(now, false);
        }
    }

    /// Applies a trial's verdict. Returns `Some(share)` when the provider
    /// still throttles and the caller should cut again.
    pub(super) fn settle_trial(&mut self, now: Instant, error: bool) -> Option<f64> {
        let trial = self.trial.as_deref().copied()?;
        match trial.verdict(now, error) {
            Verdict::Open => None,
            Verdict::Confirmed => {
                // The errors stopped at the lower rate: as good as a 429.
                self.trial = None;
                self.reset(|k| k.limit_weak = false);
                self.k_mut().unavailable_throttles = TRUSTED_THROTTLES;
                None
            }
            Verdict::StillThrottled(share) => {
                self.trial = None;
                Some(share)
            }
            // Errors going on under a steady limit, at a rate it met twice:
            // the settle point is over it, not noise.
            Verdict::Noise if self.k().steady => {
                self.trial = None;
                Some(trial.errors / trial.answers.max(1.0))
            }
            Verdict::Noise => {
                // The cut bought nothing: put the limit back and return to
                // the old rate at the next clean window (never on this
                // error — R-AI4).
                self.trial = None;
                self.reset(|k| k.unavailable_throttles = 0);
                // A limit that rested on ambiguous errors alone goes too:
                // they now look like this noise.
                self.k_mut().limit = trial.prev_limit.filter(|_| !trial.prev_weak);
                self.reset(|k| k.limit_weak = false);
                self.reset(|k| k.steady = false);
                self.k_mut().recover_to =
                    Some(self.k().recover_to.get().unwrap_or(0.0).max(trial.from)).into();
                self.reset_plateau();
                // The trigger and the errors held out were noise after all.
                self.errors
                    .add_noise(trial.errors + 1.0, trial.answers + 1.0);
                None
            }
        }
    }

    /// An ambiguous pressure signal (a bare 503, a timeout) for a request
    /// sent at `sent_at`. In order:
    ///
    /// 1. an echo of a cut already made (sent before it) changes nothing;
    /// 2. a provider whose bare 503s a trial confirmed as throttles gets
    ///    its next few cut on like 429s;
    /// 3. in slow start, only errors that rise with the rate or exceed any
    ///    noise set a limit; the first other one cuts without setting one;
    /// 4. during a trial the error is evidence for its verdict — a verdict
    ///    of "still throttled" cuts again;
    /// 5. otherwise an error significantly above what noise explains cuts,
    ///    and that cut goes on trial.
    pub fn on_ambiguous(
        &mut self,
        sent_at: Instant,
        now: Instant,
        reason: BackoffReason,
    ) -> Option<Backoff> {
        self.window_answers = self.window_answers.saturating_add(1);
        if self.outage_echo(sent_at) {
            return None;
        }
        let held = self.streak_failure(sent_at, now);
        if !self.new_epoch(sent_at) {
            // An echo of the throttle already acted on.
            self.errors
                .record(true, Attribution::Throttle, self.rate_at(sent_at));
            return None;
        }
        if held {
            // Failures in a row that two cuts did not stop, or an outage:
            // the rate stays; the breaker decides (R-SG4).
            self.errors
                .record(true, Attribution::Unknown, self.rate_at(sent_at));
            return None;
        }
        if self.k().unavailable_throttles > 0
            && self.trial.is_none()
            && self.k().limit.is_some()
            && self.errors.baseline().is_none()
        {
            self.k_mut().unavailable_throttles -= 1;
            self.errors
                .record(true, Attribution::Throttle, self.rate_at(sent_at));
            let backoff = self.cut(now, reason, None);
            self.reset(|k| k.limit_weak = false);
            return Some(backoff);
        }
        if self.k().limit.is_none() && self.trial.is_none() {
            if let Some(decided) = self.slow_start_error(sent_at, now, reason) {
                return decided;
            }
        }
        let (pre_share, pre_measured) = self.error_share_before(sent_at, now)?;
        Some(self.cut_on_trial(now, reason, pre_share, pre_measured))
    }

    /// Slow start: few answers yet, at rates that change every window.
    /// Only errors that clearly rise with the rate, or are more than any
    /// noise, set a limit (`None`: go on to the trial); otherwise the first
    /// such error cuts (R-AI1) and growth goes on, and later ones wait for
    /// evidence (`Some`: decided here).
    fn slow_start_error(
        &mut self,
        sent_at: Instant,
        now: Instant,
        reason: BackoffReason,
    ) -> Option<Option<Backoff>> {
        let evidence = self.errors.evidence(self.rate);
        if evidence.rises == Some(true) || self.errors.beyond_noise() {
            return None;
        }
        if evidence.noise() {
            self.errors
                .record(true, Attribution::Noise, self.rate_at(sent_at));
            return Some(None);
        }
        self.errors
            .record(true, Attribution::Unknown, self.rate_at(sent_at));
        if self.k().cold_error_cut {
            return Some(None);
        }
        let backoff = self.cut(now, reason, None);
        self.reset(|k| k.limit = None);
        self.reset(|k| k.fitted = false);
        self.reset(|k| k.steady = false);
        self.k_mut().cold_error_cut = true;
        Some(Some(backoff))
    }

    /// The error share a cut now is judged against (and whether it was
    /// measured near this rate), or `None` for no cut: during a trial the
    /// error is evidence for its verdict, and only "still throttled" cuts
    /// again; otherwise only an error significantly above what noise
    /// explains cuts.
    fn error_share_before(&mut self, sent_at: Instant, now: Instant) -> Option<(f64, bool)> {
        match self.trial.as_mut() {
            Some(trial) => {
                trial.answers += 1.0;
                trial.errors += 1.0;
                // Held out of the baseline until the verdict.
                self.errors
                    .record(true, Attribution::Unknown, self.rate_at(sent_at));
                self.settle_trial(now, true).map(|share| (share, true))
            }
            None => {
                if !self.errors.significant(self.rate) {
                    self.errors
                        .record(true, Attribution::Noise, self.rate_at(sent_at));
                    return None;
                }
                // Kept out of the baseline until a trial says it was noise.
                self.errors
                    .record(true, Attribution::Unknown, self.rate_at(sent_at));
                let near = self.errors.share_near(self.rate);
                let base = self.errors.baseline().unwrap_or(0.0);
                Some((
                    near.unwrap_or_else(|| self.errors.share_recent()).max(base),
                    near.is_some(),
                ))
            }
        }
    }

    /// Cuts on ambiguous evidence and puts the cut on trial: a cut that
    /// buys no fewer errors at the lower rate is undone.
    fn cut_on_trial(
        &mut self,
        now: Instant,
        reason: BackoffReason,
        pre_share: f64,
        pre_measured: bool,
    ) -> Backoff {
        let prev_limit = self.k().limit;
        let prev_weak = self.k().limit_weak;
        let from = self.rate;
        let backoff = self.cut(now, reason, None);
        if self.k().limit != prev_limit {
            // A limit moved on ambiguous evidence alone.
            self.k_mut().limit_weak = true;
        }
        self.trial = Some(Box::new(Trial {
            from,
            prev_limit,
            prev_weak,
            cut_at: now,
            pre_share,
            pre_measured,
            base_share: self.errors.baseline().unwrap_or(0.0),
            answers: 0.0,
            errors: 0.0,
        }));
        backoff
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    /// R-SG3: random 503s at a steady share are noise: after the first
    /// one's cut, the rate grows to the ceiling and no limit is set.
    #[test]
    fn random_503s_do_not_hold_the_rate_down() {
        let mut t = Instant::now();
        let mut a = Aimd::new(5.0, 0.1, 500.0, 0.7, W);
        let cuts = run(&mut a, &mut t, 60, 33);
        assert_eq!(a.rate(), 500.0, "after {cuts} cuts");
        assert!(cuts <= 2, "{cuts} cuts");
        assert!(a.limit().is_none(), "noise is not a throttle point");
    }

    /// R-SG3 (the seeds' scenario): a cold provider's first 503 cuts;
    /// 503s that go on at a share no noise has set a limit and are tried.
    #[test]
    fn a_first_503_cuts_and_a_503_throttle_sets_a_limit() {
        let mut t = Instant::now();
        let mut a = Aimd::new(5.0, 0.1, 50.0, 0.7, W);
        saturate(&mut a, &mut t, 2);
        let before = a.rate();
        let cut = a.on_ambiguous(t, t, BackoffReason::Unavailable).unwrap();
        assert!(cut.to_rps < before);
        assert!(
            a.limit().is_none(),
            "one error on a cold provider proves nothing"
        );
        // Every other answer a 503: more than any noise.
        let cuts = run(&mut a, &mut t, 3, 2);
        assert!(cuts >= 1);
        assert!(a.limit().is_some());
        assert!(a.in_trial() || a.rate() < before);
    }
}

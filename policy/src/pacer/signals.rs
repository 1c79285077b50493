//! Telling a throttle from noise (R-SG3): the evidence the AIMD controller
//! weighs before it cuts.
//!
//! Real providers answer a percent or two of requests with a bare `503` or
//! another 5xx whatever the load, and some requests cost more than others.
//! A controller that cuts on every such answer throttles itself to a crawl
//! (measured: a 1,000 req/s provider with 2 % random 503s got 3 % of the
//! clean throughput). Two pieces of evidence keep it honest:
//!
//! * [`ErrorTally`] asks whether ambiguous errors (bare 503, other 5xx,
//!   connect errors, timeouts) *rise with the rate*. It keeps a decaying
//!   count of answers and errors per rate band; an error at the current
//!   rate weighs as pressure only when the errors near that rate are
//!   significantly more frequent than at the rates below it (a Poisson tail
//!   test). Noise is as frequent at every rate; a throttle makes none below
//!   the limit and many above it. Where no lower rate has been seen (a long
//!   stretch at one rate) the errors of the last two windows are judged
//!   against the provider's learned *baseline* share instead; errors at or
//!   below it neither cut the rate nor spoil a window's growth. With
//!   neither yet, every error is significant, so a cold provider's first
//!   `503` still cuts (the seeds' scenario).
//! * [`LatencyWatch`] judges latency by the lower quartile of recent
//!   time-to-first-byte samples against a learned baseline of the same
//!   statistic. Up to three in four requests may be slow without moving it,
//!   so heavy requests mixed in at random never look like a provider
//!   slowing down; a provider that queues because it is pushed past its
//!   limit delays every request, and the quartile moves.
//!
//! Whether a cut on ambiguous evidence was right is settled afterwards by a
//! trial (see `aimd`): a cut that bought no fewer errors at the lower
//! rate is undone.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

/// Windows of memory of the error baseline (a decaying average).
pub const ERROR_MEMORY_WINDOWS: f64 = 30.0;
/// Answers the baseline must have seen before it is used.
pub const ERROR_BASELINE_MIN_ANSWERS: f64 = 30.0;
/// The most errors the baseline may explain: a provider failing more
/// often than this is not noisy but in trouble (the breaker's business),
/// and errors beyond it always weigh as pressure.
pub const NOISE_MAX: f64 = 0.1;
/// Rate bands are this wide (each is 10 % above the one below).
pub const RATE_BAND: f64 = 1.1;
/// Rates below this share of the current rate are "below" it.
pub const RATE_BELOW: f64 = 0.85;
/// Answers the rates below must hold before they are compared with.
pub const RATE_BELOW_MIN_ANSWERS: f64 = 30.0;
/// Answers at the current rate needed before it is compared with those
/// below (errors cluster; a handful of answers proves nothing).
pub const RATE_AT_MIN_ANSWERS: f64 = 20.0;
/// A count of errors is significant when a baseline this likely or less
/// would have produced it (one-sided Poisson tail). Small, because the
/// question is asked at every error: at 1 % a noisy provider at 200 req/s
/// would see a false alarm every minute or so.
pub const SIGNIFICANCE: f64 = 0.001;
/// Time-to-first-byte samples kept for the latency judgement.
pub const LATENCY_SAMPLES: usize = 32;
/// Samples needed before the quartile is judged.
pub const LATENCY_MIN_SAMPLES: usize = 16;
/// Samples needed before the latency baseline is used.
pub const LATENCY_BASELINE_MIN_SAMPLES: u32 = 20;
/// A latency shift also needs this much absolute slowdown, so that a 1 ms
/// baseline does not make every 4 ms response a throttle.
pub const LATENCY_SLACK: Duration = Duration::from_millis(100);
/// How fast the latency baseline follows a faster quartile…
pub const LATENCY_ALPHA_DOWN: f64 = 0.2;
/// …and a slower one: slowly, so that a provider creeping towards overload
/// does not teach the baseline its own slowdown.
pub const LATENCY_ALPHA_UP: f64 = 0.02;

/// Answers and errors over some span.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Count {
    /// Answers of any kind.
    pub answers: f64,
    /// Ambiguous errors among them.
    pub errors: f64,
}

impl Count {
    fn add(&mut self, error: bool) {
        self.answers += 1.0;
        if error {
            self.errors += 1.0;
        }
    }

    /// The error share, if anything was seen.
    pub fn share(&self) -> Option<f64> {
        (self.answers > 0.0).then(|| self.errors / self.answers)
    }
}

/// The provider's error baseline and the recent errors judged against it.
#[derive(Debug, Clone, Default)]
pub struct ErrorTally {
    /// The current window.
    cur: Count,
    /// The window before.
    prev: Count,
    /// Decaying sums of every window that counts towards the baseline.
    long: Count,
    /// The baseline has been established by a trial that found the errors
    /// to be noise (or restored); before that no error is taken for noise
    /// on the strength of a baseline.
    established: bool,
    /// Decaying sums of every answer and error, throttles included: the
    /// share before a cut, for a trial to compare against.
    all: Count,
    /// Every answer and error of this window and the last, whatever they
    /// are attributed to.
    recent: [Count; 2],
    /// Decaying answers and errors per rate band (the rate in force when
    /// the answer came), baseline answers only.
    by_rate: BTreeMap<i32, Count>,
}

fn band(rate: f64) -> i32 {
    // Bounded: rates are in [floor, ceiling] ⊂ (0, 1e6].
    (rate.max(1e-6).ln() / RATE_BAND.ln()).floor() as i32
}

impl ErrorTally {
    /// Counts one answer, at the rate in force.
    pub fn record(&mut self, error: bool, kind: Attribution, rate: f64) {
        self.all.add(error);
        self.recent[1].add(error);
        let by_rate = self.by_rate.entry(band(rate)).or_default();
        match kind {
            Attribution::Noise => {
                self.cur.add(error);
                by_rate.add(error);
            }
            Attribution::Unknown => {
                self.cur.answers += 1.0;
                by_rate.add(error);
            }
            Attribution::Throttle => {
                self.cur.answers += 1.0;
                by_rate.add(error);
            }
        }
    }

    /// A trial found its errors to be noise: `errors` of `answers` at the
    /// lower rate (plus the one that prompted the cut). They join the
    /// baseline (they are in the per-rate counts already); the first such
    /// verdict establishes it.
    pub fn add_noise(&mut self, errors: f64, answers: f64) {
        if self.established {
            self.cur.errors += errors;
        } else {
            self.established = true;
            self.long = Count { answers, errors };
            self.prev = Count::default();
        }
    }

    /// Forgets an outage's failures (R-SG4): they are neither noise nor
    /// a throttle's, and left in the per-rate counts they would read as
    /// errors at every rate. The established baseline stays.
    pub fn forget_episode(&mut self) {
        self.cur = Count::default();
        self.prev = Count::default();
        self.all = Count::default();
        self.recent = [Count::default(); 2];
        self.by_rate.clear();
    }

    /// Closes the window: it joins the long memory.
    pub fn roll(&mut self) {
        let keep = 1.0 - 1.0 / ERROR_MEMORY_WINDOWS;
        self.long.answers = self.long.answers * keep + self.cur.answers;
        self.long.errors = self.long.errors * keep + self.cur.errors;
        self.all.answers *= keep;
        self.all.errors *= keep;
        self.by_rate.retain(|_, c| {
            c.answers *= keep;
            c.errors *= keep;
            c.answers >= 0.5
        });
        self.prev = std::mem::take(&mut self.cur);
        self.recent = [self.recent[1], Count::default()];
    }

    /// The learned share of errors unrelated to load, once enough answers
    /// were seen.
    pub fn baseline(&self) -> Option<f64> {
        let n = self.long.answers + self.prev.answers;
        (self.established && n >= ERROR_BASELINE_MIN_ANSWERS)
            .then(|| ((self.long.errors + self.prev.errors) / n).min(NOISE_MAX))
    }

    /// The error share over the recent memory, throttles included, not
    /// counting the error that prompted the question.
    pub fn share_recent(&self) -> f64 {
        ((self.all.errors - 1.0).max(0.0) + 0.5) / (self.all.answers + 1.0)
    }

    /// The error share at rates near `rate`, throttles included, not
    /// counting the one error that prompted the question (an estimate
    /// that included it would be biased up: the question is only asked at
    /// an error).
    /// `None` when too few answers came near `rate` to say.
    pub fn share_near(&self, rate: f64) -> Option<f64> {
        let (lo, hi) = (band(rate * RATE_BELOW), band(rate / RATE_BELOW));
        let mut near = Count::default();
        for (_, c) in self.by_rate.range(lo..=hi) {
            near.answers += c.answers;
            near.errors += c.errors;
        }
        (near.answers >= RATE_AT_MIN_ANSWERS)
            .then(|| ((near.errors - 1.0).max(0.0) + 0.5) / (near.answers + 1.0))
    }

    /// What the answers say about one more error at `rate`: whether the
    /// errors at `rate` and above are significantly more frequent than at
    /// the rates well below it, and whether the errors of this window and
    /// the last are significantly above the baseline.
    pub fn evidence(&self, rate: f64) -> Evidence {
        let (at, below) = (band(rate), band(rate * RATE_BELOW));
        let mut low = Count::default();
        let mut high = Count {
            answers: 1.0,
            errors: 1.0,
        };
        for (b, c) in &self.by_rate {
            let side = if *b < below {
                &mut low
            } else if *b >= at {
                &mut high
            } else {
                continue;
            };
            side.answers += c.answers;
            side.errors += c.errors;
        }
        let rises = (low.answers >= RATE_BELOW_MIN_ANSWERS && high.answers >= RATE_AT_MIN_ANSWERS)
            .then(|| rate_test(low, high) < SIGNIFICANCE);
        let above_baseline = self.baseline().map(|p| {
            let n = self.cur.answers + self.prev.answers + 1.0;
            let k = self.cur.errors + self.prev.errors + 1.0;
            poisson_tail(k, p * n) < SIGNIFICANCE
        });
        Evidence {
            rises,
            above_baseline,
        }
    }

    /// Whether the errors of this window and the last, one more included,
    /// are significantly more than any noise (more than [`NOISE_MAX`]).
    pub fn beyond_noise(&self) -> bool {
        let n = self.recent[0].answers + self.recent[1].answers + 1.0;
        let k = self.recent[0].errors + self.recent[1].errors + 1.0;
        poisson_tail(k, NOISE_MAX * n) < SIGNIFICANCE
    }

    /// Whether one more error at `rate` weighs as pressure (see
    /// [`Evidence::significant`]).
    pub fn significant(&self, rate: f64) -> bool {
        self.evidence(rate).significant()
    }

    /// Whether this window's errors alone are more than the baseline
    /// explains: such a window does not count towards growth.
    pub fn window_spoiled(&self) -> bool {
        if self.cur.errors == 0.0 {
            return false;
        }
        match self.baseline() {
            None => true,
            Some(p) => poisson_tail(self.cur.errors, p * self.cur.answers) < SIGNIFICANCE,
        }
    }
}

/// What an answer is taken to be evidence of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attribution {
    /// An ordinary answer: a success, or an error judged to be noise.
    Noise,
    /// An error not yet judged: it shows where errors happen (per rate)
    /// but stays out of the baseline.
    Unknown,
    /// An error that belongs to a throttle (an echo of one acted on, or
    /// the evidence for a cut): it says nothing about noise.
    Throttle,
}

/// What the answers say about one more ambiguous error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Evidence {
    /// Whether errors rise with the rate (`None`: no lower rates seen).
    pub rises: Option<bool>,
    /// Whether the recent errors are above the baseline (`None`: no
    /// baseline yet).
    pub above_baseline: Option<bool>,
}

impl Evidence {
    /// Pressure: errors rise with the rate, or there is no established
    /// baseline they are within.
    pub fn significant(&self) -> bool {
        self.rises == Some(true) || self.above_baseline != Some(false)
    }

    /// Noise: within an established baseline, and not rising with the rate.
    pub fn noise(&self) -> bool {
        !self.significant()
    }
}

/// The p-value of "errors are more frequent in `high` than in `low`":
/// the conditional test for two Poisson rates — given all the errors seen,
/// how likely are at least this many to have fallen on the high side if
/// both sides shared one rate? Neither side's rate is taken as known, so a
/// few lucky error-free answers at a low rate prove nothing.
pub fn rate_test(low: Count, high: Count) -> f64 {
    let k = (low.errors + high.errors).round();
    let x = high.errors.round();
    let n = low.answers + high.answers;
    if x <= 0.0 || n <= 0.0 {
        return 1.0;
    }
    binomial_tail(x as u64, k as u64, high.answers / n)
}

/// P(X ≥ x) for X ~ Binomial(n, q).
pub fn binomial_tail(x: u64, n: u64, q: f64) -> f64 {
    if x == 0 {
        return 1.0;
    }
    if x > n || q <= 0.0 {
        return 0.0;
    }
    if q >= 1.0 {
        return 1.0;
    }
    if n > 200 {
        let mu = n as f64 * q;
        let z = (x as f64 - 0.5 - mu) / (mu * (1.0 - q)).sqrt();
        return 0.5 * erfc(z / std::f64::consts::SQRT_2);
    }
    // Sum the pmf from x up, in log space for the binomial coefficient.
    let (lq, lp) = (q.ln(), (1.0 - q).ln());
    let mut total = 0.0;
    let mut log_choose: f64 = (0..x).map(|i| ((n - i) as f64 / (i + 1) as f64).ln()).sum();
    for i in x..=n {
        total += (log_choose + i as f64 * lq + (n - i) as f64 * lp).exp();
        log_choose += ((n - i) as f64 / (i + 1) as f64).ln();
    }
    total.min(1.0)
}

/// P(K ≤ k) for K ~ Poisson(mu).
pub fn poisson_below(k: f64, mu: f64) -> f64 {
    1.0 - poisson_tail(k.floor() + 1.0, mu)
}

/// P(K ≥ k) for K ~ Poisson(mu).
pub fn poisson_tail(k: f64, mu: f64) -> f64 {
    if k <= 0.0 {
        return 1.0;
    }
    if mu <= 0.0 {
        return 0.0;
    }
    if mu > 50.0 {
        // Normal approximation with continuity correction.
        let z = (k - 0.5 - mu) / mu.sqrt();
        return 0.5 * erfc(z / std::f64::consts::SQRT_2);
    }
    let k = k.ceil() as u64;
    let mut term = (-mu).exp();
    let mut below = 0.0;
    for i in 0..k {
        below += term;
        term *= mu / (i + 1) as f64;
    }
    (1.0 - below).max(0.0)
}

/// The complementary error function (Numerical Recipes' `erfcc`, relative
/// error below 1.2e-7 — plenty for a significance test).
fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t
        * (-z * z - 1.265_512_23
            + t * (1.000_023_68
                + t * (0.374_091_96
                    + t * (0.096_784_18
                        + t * (-0.186_288_06
                            + t * (0.278_868_07
                                + t * (-1.135_203_98
                                    + t * (1.488_515_87
                                        + t * (-0.822_152_23 + t * 0.170_872_77)))))))))
            .exp();
    if x >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

/// Recent time-to-first-byte and its learned baseline (R-SG3: a soft
/// throttle is a sustained shift, never one slow request).
#[derive(Debug, Clone, Default)]
pub struct LatencyWatch {
    /// Seconds, newest last; only answers to requests sent since the last
    /// cut (older ones describe the old rate).
    samples: VecDeque<f64>,
    /// Samples added since the quartile was last judged.
    fresh: usize,
    /// The baseline lower quartile, seconds.
    baseline: Option<f64>,
    /// Samples behind the baseline (saturating).
    baseline_samples: u32,
    /// The quartile a backlog is draining from (infinite until the first
    /// window after a cut is judged), and windows judged since: a provider
    /// that queues keeps answering slowly for a while after the rate was
    /// cut — for latency or for anything else (its backlog drains first,
    /// slowly when the new rate is just under its limit) — so a shift
    /// after a cut counts only if it grows worse, or has lasted
    /// [`LATENCY_PATIENCE`] windows. Until then it is a drain.
    last_shift: Option<(f64, u32)>,
}

/// Windows a shift must persist after a cut before it cuts again (unless
/// it grows worse).
pub const LATENCY_PATIENCE: u32 = 5;

/// How much worse than the first window after a cut a later shift must be
/// to cut again before [`LATENCY_PATIENCE`] runs out.
pub const LATENCY_WORSE: f64 = 1.25;

/// What the recent samples say at the end of a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LatencyVerdict {
    /// Too few new samples to say; or no baseline yet.
    Unjudged,
    /// At the baseline (which learns from them).
    Normal,
    /// Shifted, but no worse than at the last cut and not for long: a
    /// backlog draining. Hold the rate: neither cut nor grow.
    Draining,
    /// A shift (R-SG3): the lower quartile.
    Shift(Duration),
}

impl LatencyWatch {
    /// Records one answer's time-to-first-byte.
    pub fn observe(&mut self, ttfb: Duration) {
        if self.samples.len() == LATENCY_SAMPLES {
            self.samples.pop_front();
        }
        self.samples.push_back(ttfb.as_secs_f64());
        self.fresh += 1;
    }

    /// Forgets the samples (the rate was cut: a new epoch). A backlog the
    /// old rate left drains from whatever the first window after the cut
    /// shows: that window's shift, if any, is a drain and the reference a
    /// later one must get worse than.
    pub fn clear(&mut self) {
        self.samples.clear();
        self.fresh = 0;
        self.last_shift = Some((f64::INFINITY, 0));
    }

    /// The learned baseline, once enough samples were seen.
    pub fn baseline(&self) -> Option<Duration> {
        (self.baseline_samples >= LATENCY_BASELINE_MIN_SAMPLES)
            .then(|| self.baseline.map(Duration::from_secs_f64))
            .flatten()
    }

    /// Restores a saved baseline.
    pub fn restore(&mut self, baseline: Duration) {
        self.baseline = Some(baseline.as_secs_f64());
        self.baseline_samples = LATENCY_BASELINE_MIN_SAMPLES;
    }

    /// The lower quartile of the recent samples, once there are enough.
    pub fn quartile(&self) -> Option<f64> {
        if self.samples.len() < LATENCY_MIN_SAMPLES {
            return None;
        }
        let mut v: Vec<f64> = self.samples.iter().copied().collect();
        let i = v.len() / 4;
        let (_, q, _) = v.select_nth_unstable_by(i, f64::total_cmp);
        Some(*q)
    }

    /// Judges the recent samples at the end of a window. A shift is the
    /// quartile above `factor` × the baseline (and the slack); after a cut
    /// it must also be worse than at the cut, or last (see `last_shift`).
    /// Otherwise the baseline learns from them.
    pub fn judge(&mut self, factor: f64) -> LatencyVerdict {
        if self.fresh * 2 < LATENCY_MIN_SAMPLES {
            return LatencyVerdict::Unjudged;
        }
        let Some(q) = self.quartile() else {
            return LatencyVerdict::Unjudged;
        };
        let fresh = u32::try_from(self.fresh).unwrap_or(u32::MAX);
        self.fresh = 0;
        if let Some(base) = self.baseline().map(|b| b.as_secs_f64()) {
            if q > base * factor && q > base + LATENCY_SLACK.as_secs_f64() {
                let shift = match self.last_shift.as_mut() {
                    // The first window after a cut: where the drain starts.
                    Some((q0, windows)) if q0.is_infinite() => {
                        *q0 = q;
                        *windows += 1;
                        false
                    }
                    Some((q0, windows)) => {
                        *windows += 1;
                        q > *q0 * LATENCY_WORSE || *windows >= LATENCY_PATIENCE
                    }
                    None => true,
                };
                if shift {
                    self.last_shift = Some((q, 0));
                    return LatencyVerdict::Shift(Duration::from_secs_f64(q));
                }
                return LatencyVerdict::Draining;
            }
        }
        self.last_shift = None;
        self.baseline = Some(match self.baseline {
            None => q,
            Some(b) if q < b => b + LATENCY_ALPHA_DOWN * (q - b),
            Some(b) => b + LATENCY_ALPHA_UP * (q - b),
        });
        self.baseline_samples = self.baseline_samples.saturating_add(fresh);
        if self.baseline().is_some() {
            LatencyVerdict::Normal
        } else {
            LatencyVerdict::Unjudged
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poisson_tail_matches_known_values() {
        assert_eq!(poisson_tail(0.0, 3.0), 1.0);
        assert_eq!(poisson_tail(1.0, 0.0), 0.0);
        assert!((poisson_tail(1.0, 1.0) - (1.0 - (-1.0f64).exp())).abs() < 1e-12);
        // P(K >= 2 | mu = 0.5) = 1 - e^-0.5 (1 + 0.5)
        assert!((poisson_tail(2.0, 0.5) - (1.0 - (-0.5f64).exp() * 1.5)).abs() < 1e-12);
        // The normal branch is close to the exact sum near the switch.
        let exact = {
            let mut term = (-50.0f64).exp();
            let mut below = 0.0;
            for i in 0..70 {
                below += term;
                term *= 50.0 / (i + 1) as f64;
            }
            1.0 - below
        };
        assert!((poisson_tail(70.0, 50.000_001) - exact).abs() < 0.005);
    }

    #[test]
    fn errors_at_the_baseline_are_not_significant() {
        let mut t = ErrorTally::default();
        assert!(t.significant(100.0), "no baseline: the first error counts");
        t.add_noise(3.0, 100.0);
        // 3 % noise for 40 windows of 100 answers, all at one rate.
        for _ in 0..40 {
            for i in 0..100 {
                t.record(i % 33 == 0, Attribution::Noise, 100.0);
            }
            t.roll();
        }
        let p = t.baseline().unwrap();
        assert!((p - 0.03).abs() < 0.01, "{p}");
        for i in 0..100 {
            t.record(i % 33 == 0, Attribution::Noise, 100.0);
        }
        assert!(!t.significant(100.0), "noise at the baseline");
        assert!(!t.window_spoiled());
        for _ in 0..20 {
            t.record(true, Attribution::Noise, 100.0);
        }
        assert!(t.significant(100.0), "20 % errors over a 3 % baseline");
        assert!(t.window_spoiled());
    }

    #[test]
    fn binomial_tail_matches_known_values() {
        assert_eq!(binomial_tail(0, 5, 0.5), 1.0);
        assert!((binomial_tail(5, 5, 0.5) - 1.0 / 32.0).abs() < 1e-12);
        assert!((binomial_tail(4, 5, 0.5) - 6.0 / 32.0).abs() < 1e-12);
        let exact = binomial_tail(120, 200, 0.5);
        let approx = binomial_tail(120, 201, 0.5);
        assert!((exact - approx).abs() < 0.01, "{exact} {approx}");
        // Four errors in 29 answers against none in 50: not proof.
        let low = Count {
            answers: 50.0,
            errors: 0.0,
        };
        let high = Count {
            answers: 29.0,
            errors: 4.0,
        };
        assert!(rate_test(low, high) > SIGNIFICANCE);
        // Five in 30 against none in 300: proof.
        let low = Count {
            answers: 300.0,
            errors: 0.0,
        };
        let high = Count {
            answers: 30.0,
            errors: 5.0,
        };
        assert!(rate_test(low, high) < SIGNIFICANCE);
    }

    #[test]
    fn errors_that_rise_with_the_rate_are_significant() {
        // Noise: 3 % at 50 and at 100 req/s.
        let mut noise = ErrorTally::default();
        // A throttle: none at 50, 10 % at 100.
        let mut throttle = ErrorTally::default();
        for rate in [50.0, 100.0] {
            for i in 0..200 {
                noise.record(i % 33 == 0, Attribution::Noise, rate);
                throttle.record(rate > 60.0 && i % 10 == 0, Attribution::Noise, rate);
            }
            noise.roll();
            throttle.roll();
        }
        assert_eq!(noise.evidence(100.0).rises, Some(false));
        assert_eq!(throttle.evidence(100.0).rises, Some(true));
        assert!(throttle.significant(100.0));
    }

    #[test]
    fn heavy_requests_do_not_move_the_quartile_but_a_slowdown_does() {
        let mut w = LatencyWatch::default();
        let fast = Duration::from_millis(40);
        let heavy = Duration::from_millis(440);
        for i in 0..200 {
            // 30 % heavy, at random-looking positions.
            w.observe(if (i * 7) % 10 < 3 { heavy } else { fast });
            if i % 20 == 19 {
                assert!(
                    !matches!(w.judge(3.0), LatencyVerdict::Shift(_)),
                    "heavy requests are not a shift"
                );
            }
        }
        let base = w.baseline().unwrap();
        assert!(base < Duration::from_millis(60), "{base:?}");
        // A shift must hold for three in four of the recent samples.
        for _ in 0..60 {
            w.observe(Duration::from_millis(400));
        }
        assert!(
            matches!(w.judge(3.0), LatencyVerdict::Shift(_)),
            "every request slower: a shift"
        );
    }

    /// A backlog left by the rate before a cut drains: a shift in the
    /// first window after a cut, and one no worse after it, is a drain
    /// (hold) for up to `LATENCY_PATIENCE` windows; one that grows worse
    /// than that first window is a shift at once.
    #[test]
    fn after_a_cut_a_shift_that_does_not_grow_is_a_drain() {
        let judged = |w: &mut LatencyWatch, ms: u64| {
            for _ in 0..LATENCY_SAMPLES {
                w.observe(Duration::from_millis(ms));
            }
            w.judge(3.0)
        };
        let mut w = LatencyWatch::default();
        for _ in 0..4 {
            assert!(!matches!(judged(&mut w, 10), LatencyVerdict::Shift(_)));
        }
        assert!(matches!(judged(&mut w, 300), LatencyVerdict::Shift(_)));
        w.clear();
        for ms in [300, 280, 250, 250] {
            assert_eq!(judged(&mut w, ms), LatencyVerdict::Draining, "{ms} ms");
        }
        assert!(matches!(judged(&mut w, 250), LatencyVerdict::Shift(_)));
        // A cut for another reason: the first window sets where a drain
        // starts; a backlog that builds instead is a shift.
        let mut w = LatencyWatch::default();
        for _ in 0..4 {
            judged(&mut w, 10);
        }
        w.clear();
        assert_eq!(judged(&mut w, 200), LatencyVerdict::Draining);
        assert_eq!(judged(&mut w, 240), LatencyVerdict::Draining);
        assert!(matches!(judged(&mut w, 260), LatencyVerdict::Shift(_)));
        assert_eq!(judged(&mut w, 10), LatencyVerdict::Normal);
    }
}

//! The error evidence: answers and errors per rate band, and whether the
//! errors at a rate rise above those at the rates below it or above the
//! learned baseline (see the module above).

use super::stats::{poisson_tail, rate_test, Count, Wide, SIGNIFICANCE};

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
    by_rate: Bands,
}

/// Counts per rate band, in band order: a sorted vector, grown by one band
/// at a time — a provider meets a handful of bands, and a `BTreeMap`'s
/// first node was 232 bytes of every provider that was ever answered
/// (issue 38, R-PF1).
#[derive(Debug, Clone, Default)]
struct Bands(Box<[(i32, Count)]>);

impl Bands {
    /// The count of `band`, made at zero if new.
    fn entry(&mut self, band: i32) -> &mut Count {
        let i = match self.0.binary_search_by_key(&band, |(b, _)| *b) {
            Ok(i) => i,
            Err(i) => {
                // A slice exactly as long as the bands (16 bytes, not a
                // vector's 24), one more each time (R-PF1, issue 38).
                let mut bands = std::mem::take(&mut self.0).into_vec();
                bands.reserve_exact(1);
                bands.insert(i, (band, Count::default()));
                self.0 = bands.into_boxed_slice();
                i
            }
        };
        &mut self.0[i].1
    }

    /// The counts of the bands from `lo` to `hi`.
    fn range(&self, lo: i32, hi: i32) -> impl Iterator<Item = &Count> {
        self.0
            .iter()
            .filter(move |(b, _)| (lo..=hi).contains(b))
            .map(|(_, c)| c)
    }

    fn iter(&self) -> impl Iterator<Item = &(i32, Count)> {
        self.0.iter()
    }

    fn retain(&mut self, mut keep: impl FnMut(&mut Count) -> bool) {
        let mut bands = std::mem::take(&mut self.0).into_vec();
        bands.retain_mut(|(_, c)| keep(c));
        self.0 = bands.into_boxed_slice();
    }

    fn clear(&mut self) {
        self.0 = Box::default();
    }
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
        let by_rate = self.by_rate.entry(band(rate));
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
            self.cur.errors += errors as f32;
        } else {
            self.established = true;
            self.long = Count {
                answers: answers as f32,
                errors: errors as f32,
            };
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
        let keep = (1.0 - 1.0 / ERROR_MEMORY_WINDOWS) as f32;
        self.long.answers = self.long.answers * keep + self.cur.answers;
        self.long.errors = self.long.errors * keep + self.cur.errors;
        self.all.answers *= keep;
        self.all.errors *= keep;
        self.by_rate.retain(|c| {
            c.answers *= keep;
            c.errors *= keep;
            c.answers >= 0.5
        });
        self.prev = std::mem::take(&mut self.cur);
        self.recent = [self.recent[1], Count::default()];
    }

    /// Whether a trial (or a restore) established the baseline.
    pub fn established(&self) -> bool {
        self.established
    }

    /// The learned share of errors unrelated to load, once enough answers
    /// were seen.
    pub fn baseline(&self) -> Option<f64> {
        let (long, prev) = (self.long.wide(), self.prev.wide());
        let n = long.answers + prev.answers;
        (self.established && n >= ERROR_BASELINE_MIN_ANSWERS)
            .then(|| ((long.errors + prev.errors) / n).min(NOISE_MAX))
    }

    /// The error share over the recent memory, throttles included, not
    /// counting the error that prompted the question.
    pub fn share_recent(&self) -> f64 {
        let all = self.all.wide();
        ((all.errors - 1.0).max(0.0) + 0.5) / (all.answers + 1.0)
    }

    /// The error share at rates near `rate`, throttles included, not
    /// counting the one error that prompted the question (an estimate
    /// that included it would be biased up: the question is only asked at
    /// an error).
    /// `None` when too few answers came near `rate` to say.
    pub fn share_near(&self, rate: f64) -> Option<f64> {
        let (lo, hi) = (band(rate * RATE_BELOW), band(rate / RATE_BELOW));
        let mut near = Wide::default();
        for c in self.by_rate.range(lo, hi) {
            near.add(c);
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
        let mut low = Wide::default();
        let mut high = Wide {
            answers: 1.0,
            errors: 1.0,
        };
        for (b, c) in self.by_rate.iter() {
            let side = if *b < below {
                &mut low
            } else if *b >= at {
                &mut high
            } else {
                continue;
            };
            side.add(c);
        }
        let rises = (low.answers >= RATE_BELOW_MIN_ANSWERS && high.answers >= RATE_AT_MIN_ANSWERS)
            .then(|| rate_test(low, high) < SIGNIFICANCE);
        let above_baseline = self.baseline().map(|p| {
            let (cur, prev) = (self.cur.wide(), self.prev.wide());
            let n = cur.answers + prev.answers + 1.0;
            let k = cur.errors + prev.errors + 1.0;
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
        let (a, b) = (self.recent[0].wide(), self.recent[1].wide());
        let n = a.answers + b.answers + 1.0;
        let k = a.errors + b.errors + 1.0;
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
            Some(p) => {
                let cur = self.cur.wide();
                poisson_tail(cur.errors, p * cur.answers) < SIGNIFICANCE
            }
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

#[cfg(test)]
mod tests {
    use super::*;

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
}

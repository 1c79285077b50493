//! The latency evidence: the lower quartile of recent time-to-first-byte
//! against its learned baseline (see the module above).

use std::collections::VecDeque;
use std::num::NonZeroU32;
use std::time::Duration;

use super::Maybe;

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

/// Recent time-to-first-byte and its learned baseline (R-SG3: a soft
/// throttle is a sustained shift, never one slow request).
#[derive(Debug, Clone, Default)]
pub struct LatencyWatch {
    /// Seconds, newest last; only answers to requests sent since the last
    /// cut (older ones describe the old rate). 32-bit floats (a tenth of
    /// a microsecond at a second): a host answered once keeps 16 bytes
    /// here, not 32 (R-PF1, issue 38).
    samples: VecDeque<f32>,
    /// Samples added since the quartile was last judged (32 bits, beside
    /// `baseline_samples`: R-PF1, issue 38).
    fresh: u32,
    /// The baseline lower quartile, seconds, once first learned (one
    /// word, not an `Option`'s two: R-PF1, issue 38).
    baseline: Maybe,
    /// Samples behind the baseline (saturating).
    baseline_samples: u32,
    /// The quartile a backlog is draining from (infinite until the first
    /// window after a cut is judged), and windows judged since: a provider
    /// that queues keeps answering slowly for a while after the rate was
    /// cut — for latency or for anything else (its backlog drains first,
    /// slowly when the new rate is just under its limit) — so a shift
    /// after a cut counts only if it grows worse, or has lasted
    /// [`LATENCY_PATIENCE`] windows. Until then it is a drain. (The
    /// windows are counted from one, so that the pair has a niche, and the
    /// quartile is a 32-bit float: 8 bytes, not 24 — R-PF1, issue 38.)
    last_shift: Option<(f32, NonZeroU32)>,
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
        self.samples.push_back(ttfb.as_secs_f32());
        self.fresh = self.fresh.saturating_add(1);
    }

    /// Forgets the samples (the rate was cut: a new epoch). A backlog the
    /// old rate left drains from whatever the first window after the cut
    /// shows: that window's shift, if any, is a drain and the reference a
    /// later one must get worse than.
    pub fn clear(&mut self) {
        self.samples.clear();
        self.fresh = 0;
        self.last_shift = Some((f32::INFINITY, NonZeroU32::MIN));
    }

    /// The baseline as learned so far, seconds, however few its samples.
    fn learned(&self) -> Option<f64> {
        self.baseline.get()
    }

    /// The learned baseline, once enough samples were seen.
    pub fn baseline(&self) -> Option<Duration> {
        (self.baseline_samples >= LATENCY_BASELINE_MIN_SAMPLES)
            .then(|| self.learned().map(Duration::from_secs_f64))
            .flatten()
    }

    /// Restores a saved baseline.
    pub fn restore(&mut self, baseline: Duration) {
        self.baseline = Some(baseline.as_secs_f64()).into();
        self.baseline_samples = LATENCY_BASELINE_MIN_SAMPLES;
    }

    /// The lower quartile of the recent samples, once there are enough.
    pub fn quartile(&self) -> Option<f64> {
        if self.samples.len() < LATENCY_MIN_SAMPLES {
            return None;
        }
        let mut v: Vec<f64> = self.samples.iter().copied().map(f64::from).collect();
        let i = v.len() / 4;
        let (_, q, _) = v.select_nth_unstable_by(i, f64::total_cmp);
        Some(*q)
    }

    /// Judges the recent samples at the end of a window. A shift is the
    /// quartile above `factor` × the baseline (and the slack); after a cut
    /// it must also be worse than at the cut, or last (see `last_shift`).
    /// Otherwise the baseline learns from them.
    pub fn judge(&mut self, factor: f64) -> LatencyVerdict {
        if (self.fresh as usize) * 2 < LATENCY_MIN_SAMPLES {
            return LatencyVerdict::Unjudged;
        }
        let Some(q) = self.quartile() else {
            return LatencyVerdict::Unjudged;
        };
        let fresh = self.fresh;
        self.fresh = 0;
        if let Some(base) = self.baseline().map(|b| b.as_secs_f64()) {
            if q > base * factor && q > base + LATENCY_SLACK.as_secs_f64() {
                let shift = match self.last_shift.as_mut() {
                    // The first window after a cut: where the drain starts.
                    Some((q0, windows)) if q0.is_infinite() => {
                        *q0 = q as f32;
                        *windows = windows.saturating_add(1);
                        false
                    }
                    Some((q0, windows)) => {
                        *windows = windows.saturating_add(1);
                        // Counted from one: `LATENCY_PATIENCE` windows or more.
                        q > f64::from(*q0) * LATENCY_WORSE || windows.get() > LATENCY_PATIENCE
                    }
                    None => true,
                };
                if shift {
                    self.last_shift = Some((q as f32, NonZeroU32::MIN));
                    return LatencyVerdict::Shift(Duration::from_secs_f64(q));
                }
                return LatencyVerdict::Draining;
            }
        }
        self.last_shift = None;
        self.baseline = Some(match self.learned() {
            None => q,
            Some(b) if q < b => b + LATENCY_ALPHA_DOWN * (q - b),
            Some(b) => b + LATENCY_ALPHA_UP * (q - b),
        })
        .into();
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

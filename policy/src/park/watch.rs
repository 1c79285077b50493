//! The outage watch, pure: every method takes `now`.
//!
//! It reads the answers of one provider in the order they come back and
//! says when the provider is *down* — failing every request, whatever the
//! rate — and when it is back. While it is down it hands out probes, one
//! at a time, with a back-off between failed ones.

use std::time::Duration;

use tokio::time::Instant;

use crate::classify::Outcome;

/// A streak of failures this long (and at least two failures) is an
/// outage even where too few requests were sent to reach the count: a
/// provider called once a second is recognised in about a second too.
/// Either way the failures must come from more than one request: a
/// request whose retries all fail may be one the provider cannot serve.
pub const RECOGNISE: Duration = Duration::from_secs(1);

/// The first probe goes this long after the outage is recognised; each
/// failed probe doubles the wait, up to [`PROBE_MAX_WAIT`].
pub const PROBE_FIRST_WAIT: Duration = Duration::from_millis(500);

/// The longest wait between probes: a provider that comes back is seen
/// within a second, and a dead one costs at most one request a second.
pub const PROBE_MAX_WAIT: Duration = Duration::from_secs(1);

/// The chance that noise alone makes a streak this long, below which a
/// streak is an outage: with the provider's own share of failures `p`, a
/// streak of `n` is an outage once `p^n` falls under this. A share of 2 %
/// takes 3 failures in a row, 5 % takes 4, 30 % takes 10.
pub const NOISE_SIGNIFICANCE: f64 = 1e-5;

/// …and for a streak that has gone on for [`RECOGNISE`]: over a second,
/// fewer failures in a row suffice (2 at a share under 10 %).
pub const SLOW_SIGNIFICANCE: f64 = 1e-2;

/// The fewest failures in a row that are an outage, however clean the
/// provider was: one or two failures prove nothing.
pub const MIN_FAILURES: u32 = 3;

/// The share of failures assumed before any was seen, and the lowest the
/// learned share is taken to be.
const NOISE_FLOOR: f64 = 0.02;

/// Weight of one answer in the learned share of failures (about the last
/// 200 answers).
const NOISE_WEIGHT: f64 = 1.0 / 200.0;

/// What an answer says about whether the provider is up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// The provider answered as a working server does: a success, a client
    /// error, or a throttle it named (429, 503 with `Retry-After`), which
    /// the pacer's hold deals with.
    Alive,
    /// The provider failed as a dead one does: a bare 5xx, a timeout, a
    /// connection refused or reset (R-SG4).
    Failed,
}

impl Answer {
    /// How the watch reads an attempt's outcome: its signal alive (clean,
    /// a named throttle) or not (see [`crate::classify::Signal`]).
    pub fn of(outcome: &Outcome) -> Answer {
        if outcome.signal().alive() {
            Answer::Alive
        } else {
            Answer::Failed
        }
    }
}

/// Why the provider is taken to be down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DownReason {
    /// Every answer failed, more often in a row than noise explains.
    Failures,
    /// The breaker is open (or half-open).
    Breaker,
    /// The rate controller judged the failures an outage (R-SG4).
    Controller,
}

impl DownReason {
    /// A bounded label for metrics, logs and the readout.
    pub fn label(self) -> &'static str {
        match self {
            DownReason::Failures => "every_answer_failed",
            DownReason::Breaker => "circuit_open",
            DownReason::Controller => "controller_outage",
        }
    }
}

/// A change of the watch's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// The provider went down.
    Down(DownReason),
    /// It answered again.
    Up,
}

#[derive(Debug, Clone, Copy)]
struct Streak {
    /// When the streak's first failing request was sent: an answer to a
    /// request sent before it says nothing about the streak.
    first_sent: Instant,
    /// When its first failure came back.
    first_at: Instant,
    failures: u32,
    /// The request whose failure began it.
    first_request: u64,
    /// Whether another request failed in it too: one request's own
    /// attempts failing (its retries) say that request fails — a record
    /// the provider cannot serve — not that the provider does.
    others: bool,
    /// The share of failures learned before the streak began: the streak's
    /// own failures do not make it look like noise.
    noise: f64,
}

#[derive(Debug, Clone, Copy)]
struct Down {
    since: Instant,
    /// Answers to requests sent before this say nothing about the return.
    sent_after: Instant,
    episode: u64,
    reason: DownReason,
    probe_out: bool,
    next_probe: Instant,
    failed_probes: u32,
}

/// A readout of the watch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WatchSnapshot {
    /// Down since how long, and why; `None` while up.
    pub down: Option<(Duration, DownReason)>,
    /// Failures in a row right now.
    pub streak: u32,
    /// Outages (down episodes) seen since start.
    pub episodes: u64,
    /// Probes sent since start.
    pub probes: u64,
    /// The learned share of failures outside outages.
    pub noise: f64,
}

/// One provider's outage watch.
#[derive(Debug, Clone)]
pub struct Watch {
    /// Boxed, as `down`: most providers never fail twice in a row.
    streak: Option<Box<Streak>>,
    /// Boxed: most providers are never down (R-PF1, issue 38).
    down: Option<Box<Down>>,
    /// Outages and probes since start, counted in 32 bits (saturating):
    /// the watch is 8 bytes smaller (R-PF1, issue 38).
    episodes: u32,
    probes: u32,
    /// Share of failures among answers while up: what noise looks like at
    /// this provider (an exponentially weighted mean).
    noise: f64,
}

impl Default for Watch {
    fn default() -> Self {
        Watch {
            streak: None,
            down: None,
            episodes: 0,
            probes: 0,
            noise: NOISE_FLOOR,
        }
    }
}

impl Watch {
    /// Whether the provider is taken to be down.
    pub fn is_down(&self) -> bool {
        self.down.is_some()
    }

    /// Whether it has seen nothing a new watch would not start from: no
    /// outage, probe or failures in a row, and noise at its floor (R-PF1).
    pub fn untaught(&self) -> bool {
        self.streak.is_none()
            && self.down.is_none()
            && self.episodes == 0
            && self.probes == 0
            && self.noise <= NOISE_FLOOR
    }

    /// Whether anything is amiss: down, or failures in a row so far.
    pub fn unsettled(&self) -> bool {
        self.down.is_some() || self.streak.is_some()
    }

    /// The outage in progress: its number and when it began.
    pub fn episode(&self) -> Option<(u64, Instant)> {
        self.down.as_deref().map(|d| (d.episode, d.since))
    }

    /// Failures in a row so far.
    pub fn streak(&self) -> u32 {
        self.streak.as_deref().map_or(0, |s| s.failures)
    }

    /// Whether the failures in a row so far came from more than one
    /// request.
    pub fn streak_of_many(&self) -> bool {
        self.streak.as_deref().is_some_and(|s| s.others)
    }

    /// When a streak that has not yet been called an outage will be, if
    /// no answer comes meanwhile: the instant the slow verdict is due.
    pub fn verdict_due(&self) -> Option<Instant> {
        match (self.down.as_deref(), self.streak.as_deref()) {
            (None, Some(s)) => Some(s.first_at + RECOGNISE),
            _ => None,
        }
    }

    /// Whether the streak is an outage at `now`.
    fn recognised(&self, now: Instant) -> bool {
        let Some(s) = self.streak.as_deref() else {
            return false;
        };
        let p = s.noise.clamp(NOISE_FLOOR, 0.99);
        let chance = p.powi(i32::try_from(s.failures).unwrap_or(i32::MAX));
        s.others
            && ((s.failures >= MIN_FAILURES && chance <= NOISE_SIGNIFICANCE)
                || (s.failures >= 2
                    && now.saturating_duration_since(s.first_at) >= RECOGNISE
                    && chance <= SLOW_SIGNIFICANCE))
    }

    fn go_down(&mut self, now: Instant, reason: DownReason) -> Option<Change> {
        if self.down.is_some() {
            return None;
        }
        self.episodes = self.episodes.saturating_add(1);
        let sent_after = self.streak.as_deref().map_or(now, |s| s.first_sent);
        self.down = Some(Box::new(Down {
            since: now,
            sent_after,
            episode: u64::from(self.episodes),
            reason,
            probe_out: false,
            next_probe: now + PROBE_FIRST_WAIT,
            failed_probes: 0,
        }));
        Some(Change::Down(reason))
    }

    /// The answer to an attempt of `request` (a number naming the client's
    /// request, the same for its retries) sent at `sent` came back at
    /// `now`.
    pub fn on_answer(
        &mut self,
        request: u64,
        sent: Instant,
        answer: Answer,
        now: Instant,
    ) -> Option<Change> {
        match answer {
            Answer::Alive => {
                if self.down.is_none() {
                    self.noise *= 1.0 - NOISE_WEIGHT;
                }
                if self.streak.as_deref().is_some_and(|s| sent >= s.first_sent) {
                    self.streak = None;
                }
                match self.down.as_deref() {
                    Some(d) if sent >= d.sent_after => {
                        self.down = None;
                        self.streak = None;
                        Some(Change::Up)
                    }
                    _ => None,
                }
            }
            Answer::Failed => {
                let noise = self.noise;
                if self.down.is_none() {
                    self.noise += (1.0 - self.noise) * NOISE_WEIGHT;
                }
                let s = self.streak.get_or_insert_with(|| {
                    Box::new(Streak {
                        first_sent: sent,
                        first_at: now,
                        failures: 0,
                        first_request: request,
                        others: false,
                        noise,
                    })
                });
                s.failures = s.failures.saturating_add(1);
                s.others |= request != s.first_request;
                if self.down.is_none() && self.recognised(now) {
                    return self.go_down(now, DownReason::Failures);
                }
                None
            }
        }
    }

    /// An answer from a live provider that does not end an outage (the
    /// breaker is still open): it ends the streak, not the outage.
    pub fn alive_but_held(&mut self, sent: Instant) {
        if self.streak.as_deref().is_some_and(|s| sent >= s.first_sent) {
            self.streak = None;
        }
    }

    /// The slow verdict, for a streak that stopped growing because nobody
    /// sent anything more: at [`Watch::verdict_due`] the streak is judged
    /// on what it has.
    pub fn tick(&mut self, now: Instant) -> Option<Change> {
        if self.down.is_none() && self.recognised(now) {
            return self.go_down(now, DownReason::Failures);
        }
        None
    }

    /// Something else found the provider down: the breaker opened, or the
    /// rate controller judged its failures an outage.
    pub fn force_down(&mut self, now: Instant, reason: DownReason) -> Option<Change> {
        self.go_down(now, reason)
    }

    /// Asks to send a probe at `now`. `Err` says until when to wait:
    /// `Some(instant)` for the next probe's time, `None` while a probe is
    /// out (its answer decides).
    pub fn take_probe(&mut self, now: Instant) -> Result<(), Option<Instant>> {
        let Some(d) = self.down.as_mut() else {
            return Ok(());
        };
        if d.probe_out {
            return Err(None);
        }
        if now < d.next_probe {
            return Err(Some(d.next_probe));
        }
        d.probe_out = true;
        self.probes = self.probes.saturating_add(1);
        Ok(())
    }

    /// A probe ended: `Some(answer)` when it reached the provider (feed the
    /// answer to [`Watch::on_answer`] first), `None` when it never did (its
    /// client went away, or sluice refused it): the next waiter probes at
    /// once.
    pub fn probe_ended(&mut self, answer: Option<Answer>, now: Instant) {
        let Some(d) = self.down.as_mut() else {
            return;
        };
        d.probe_out = false;
        match answer {
            Some(Answer::Failed) => {
                d.failed_probes = d.failed_probes.saturating_add(1);
                let wait = PROBE_FIRST_WAIT
                    .saturating_mul(1 << d.failed_probes.min(16))
                    .min(PROBE_MAX_WAIT);
                d.next_probe = now + wait;
            }
            // An answer that was alive ended the outage already; one that
            // never came leaves the turn to the next waiter.
            Some(Answer::Alive) | None => d.next_probe = now,
        }
    }

    /// When the next probe may go, while down and none is out.
    pub fn next_probe(&self) -> Option<Instant> {
        self.down
            .as_deref()
            .filter(|d| !d.probe_out)
            .map(|d| d.next_probe)
    }

    /// A readout at `now`.
    pub fn snapshot(&self, now: Instant) -> WatchSnapshot {
        WatchSnapshot {
            down: self
                .down
                .as_deref()
                .map(|d| (now.saturating_duration_since(d.since), d.reason)),
            streak: self.streak(),
            episodes: u64::from(self.episodes),
            probes: u64::from(self.probes),
            noise: self.noise,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Three bare failures in a row at a clean provider are an outage,
    /// however fast they came; two are not.
    #[test]
    fn a_few_failures_in_a_row_at_a_clean_provider_are_an_outage() {
        let t = Instant::now();
        let mut w = Watch::default();
        assert_eq!(w.on_answer(1, t, Answer::Failed, t + ms(5)), None);
        assert_eq!(w.on_answer(2, t + ms(20), Answer::Failed, t + ms(25)), None);
        assert!(!w.is_down() && w.unsettled());
        assert_eq!(
            w.on_answer(3, t + ms(40), Answer::Failed, t + ms(45)),
            Some(Change::Down(DownReason::Failures))
        );
        assert!(w.is_down());
        assert_eq!(w.snapshot(t + ms(45)).episodes, 1);
    }

    /// Noise is told from an outage by the provider's own share of
    /// failures: at 30 % failures, three or nine in a row happen often
    /// enough and are not an outage; ten are.
    #[test]
    fn a_noisy_provider_needs_a_longer_streak() {
        let t = Instant::now();
        let mut w = Watch::default();
        // 3 failures in every 10 answers, never two in a row, for a while.
        for i in 0..1000u64 {
            let at = t + ms(i * 10);
            let a = if i % 10 == 0 || i % 10 == 3 || i % 10 == 6 {
                Answer::Failed
            } else {
                Answer::Alive
            };
            assert_eq!(w.on_answer(1000 + i, at, a, at), None, "answer {i}");
        }
        assert!((w.snapshot(t).noise - 0.3).abs() < 0.05);
        let t = t + ms(10_000);
        for i in 0..3u64 {
            let at = t + ms(i * 10);
            assert_eq!(
                w.on_answer(2000 + i, at, Answer::Failed, at),
                None,
                "failure {i}"
            );
        }
        w.on_answer(6, t + ms(30), Answer::Alive, t + ms(30));
        let t = t + ms(100);
        for i in 0..9u64 {
            let at = t + ms(i * 10);
            assert_eq!(
                w.on_answer(3000 + i, at, Answer::Failed, at),
                None,
                "failure {i}"
            );
        }
        assert_eq!(
            w.on_answer(8, t + ms(90), Answer::Failed, t + ms(90)),
            Some(Change::Down(DownReason::Failures))
        );
    }

    /// One request's own attempts failing, however many, are that
    /// request's failure (a record the provider cannot serve), never an
    /// outage; a second request failing too makes the streak count.
    #[test]
    fn one_requests_retries_are_not_an_outage() {
        let t = Instant::now();
        let mut w = Watch::default();
        for i in 0..10u64 {
            let at = t + ms(i * 500);
            assert_eq!(w.on_answer(7, at, Answer::Failed, at), None, "attempt {i}");
            assert_eq!(w.tick(at + RECOGNISE), None);
        }
        assert!(!w.streak_of_many());
        let at = t + ms(5000);
        assert_eq!(
            w.on_answer(8, at, Answer::Failed, at),
            Some(Change::Down(DownReason::Failures))
        );
    }

    /// A quiet provider's two failures a second apart are an outage at the
    /// slow verdict; one failure never is.
    #[test]
    fn the_slow_verdict_needs_two_failures_and_a_second() {
        let t = Instant::now();
        let mut w = Watch::default();
        w.on_answer(9, t, Answer::Failed, t);
        assert_eq!(w.verdict_due(), Some(t + RECOGNISE));
        assert_eq!(
            w.tick(t + RECOGNISE * 5),
            None,
            "one failure proves nothing"
        );
        w.on_answer(10, t + ms(300), Answer::Failed, t + ms(300));
        assert_eq!(w.tick(t + ms(999)), None);
        assert_eq!(
            w.tick(t + RECOGNISE),
            Some(Change::Down(DownReason::Failures))
        );
    }

    /// An answer to a request sent before the streak began says nothing;
    /// a clean answer to one sent after ends it.
    #[test]
    fn only_answers_to_later_requests_end_a_streak_or_an_outage() {
        let t = Instant::now();
        let mut w = Watch::default();
        for i in 0..3 {
            w.on_answer(100 + i, t + ms(100 + i), Answer::Failed, t + ms(110 + i));
        }
        assert!(w.is_down());
        assert_eq!(w.on_answer(12, t, Answer::Alive, t + ms(200)), None, "old");
        assert!(w.is_down());
        assert_eq!(
            w.on_answer(13, t + ms(300), Answer::Alive, t + ms(310)),
            Some(Change::Up)
        );
        assert!(!w.unsettled());
    }

    /// One probe at a time; a failed one pushes the next out, doubling up
    /// to a second; one that never reached the provider hands the turn on
    /// at once.
    #[test]
    fn probes_go_one_at_a_time_with_back_off() {
        let t = Instant::now();
        let mut w = Watch::default();
        w.force_down(t, DownReason::Breaker);
        assert_eq!(w.take_probe(t), Err(Some(t + PROBE_FIRST_WAIT)));
        let t1 = t + PROBE_FIRST_WAIT;
        assert_eq!(w.take_probe(t1), Ok(()));
        assert_eq!(w.take_probe(t1), Err(None), "one at a time");
        w.on_answer(14, t1, Answer::Failed, t1 + ms(5));
        w.probe_ended(Some(Answer::Failed), t1 + ms(5));
        assert_eq!(w.take_probe(t1 + ms(10)), Err(Some(t1 + ms(1005))));
        let t2 = t1 + ms(1005);
        assert_eq!(w.take_probe(t2), Ok(()));
        w.probe_ended(None, t2);
        assert_eq!(w.take_probe(t2), Ok(()), "a dropped probe hands on");
        w.on_answer(15, t2, Answer::Failed, t2);
        w.probe_ended(Some(Answer::Failed), t2);
        assert_eq!(w.next_probe(), Some(t2 + PROBE_MAX_WAIT), "capped");
        assert_eq!(w.on_answer(16, t2, Answer::Alive, t2), Some(Change::Up));
        assert_eq!(w.take_probe(t2), Ok(()), "up: everyone goes");
        assert_eq!(w.snapshot(t2).probes, 3);
    }

    /// A throttle the provider named is an answer from a live provider: it
    /// ends an outage (the pacer's hold takes over), and a bare 503 is a
    /// failure.
    #[test]
    fn named_throttles_are_alive_bare_503s_fail() {
        let throttled = |status, retry_after| Outcome::Throttled {
            status,
            retry_after,
        };
        assert_eq!(Answer::of(&throttled(429, None)), Answer::Alive);
        assert_eq!(
            Answer::of(&throttled(503, Some(Duration::from_secs(1)))),
            Answer::Alive
        );
        assert_eq!(Answer::of(&throttled(503, None)), Answer::Failed);
        assert_eq!(
            Answer::of(&Outcome::ConnectError { retryable: true }),
            Answer::Failed
        );
        assert_eq!(
            Answer::of(&Outcome::ClientError { status: 404 }),
            Answer::Alive
        );
    }
}

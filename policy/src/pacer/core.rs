//! The pacer's whole decision state for one provider: GCRA + AIMD + hold +
//! the FIFO waiting room + the latency baseline. Pure: every method takes
//! `now`.

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::time::Instant;

use super::aimd::{Aimd, Backoff, BackoffReason};
use super::gcra::{interval_of, Gcra};
use crate::outcome::Outcome;
use crate::settings::ProviderSettings;

/// Samples of time-to-first-byte needed before soft throttles are judged.
pub const BASELINE_MIN_SAMPLES: u32 = 20;
/// Weight of a new sample in the baseline's moving average.
pub const BASELINE_ALPHA: f64 = 0.05;
/// A soft throttle also needs this much absolute slowdown, so that a 1 ms
/// baseline does not make every 4 ms response a throttle.
pub const SOFT_THROTTLE_SLACK: Duration = Duration::from_millis(100);

/// A place in the waiting room.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ticket(u64);

/// What a waiter should do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Go: the request has been admitted and its slot taken.
    Go,
    /// Wait until this instant (or until the state changes) and ask again.
    WaitUntil(Instant),
    /// Refused: its slot would come later than it may wait. Come back after
    /// the duration. The ticket has been removed.
    Refuse(Duration),
}

/// Why a request was refused at the door.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The waiting room is full.
    QueueFull,
    /// The slot would come later than `max_queue_wait`.
    WaitTooLong,
}

/// The time-to-first-byte baseline (an exponentially weighted average).
#[derive(Debug, Clone, Copy, Default)]
pub struct Baseline {
    /// The average, in seconds, once there is one.
    mean: Option<f64>,
    /// Samples seen (saturating).
    samples: u32,
}

impl Baseline {
    /// The learned baseline, once enough samples were seen.
    pub fn get(&self) -> Option<Duration> {
        (self.samples >= BASELINE_MIN_SAMPLES)
            .then(|| self.mean.map(Duration::from_secs_f64))
            .flatten()
    }

    fn observe(&mut self, ttfb: Duration) {
        let x = ttfb.as_secs_f64();
        self.mean = Some(match self.mean {
            None => x,
            Some(m) => m + BASELINE_ALPHA * (x - m),
        });
        self.samples = self.samples.saturating_add(1);
    }

    fn restore(&mut self, baseline: Duration) {
        self.mean = Some(baseline.as_secs_f64());
        self.samples = BASELINE_MIN_SAMPLES;
    }
}

/// One provider's pacer state.
#[derive(Debug)]
pub struct PacerCore {
    gcra: Gcra,
    aimd: Aimd,
    start_rps: f64,
    /// Nothing is admitted before this instant (a provider's `Retry-After`).
    hold_until: Option<Instant>,
    /// Tickets of requests waiting, in arrival order.
    waiting: BTreeSet<Ticket>,
    next_ticket: u64,
    max_queue_len: usize,
    max_queue_wait: Duration,
    soft_throttle_factor: f64,
    baseline: Baseline,
    last_backoff: Option<Backoff>,
    /// When anything last happened, for idle eviction.
    last_seen: Option<Instant>,
}

/// A readout of the pacer: what metrics, the admin API and the store read.
#[derive(Debug, Clone, PartialEq)]
pub struct PacerSnapshot {
    /// Current rate, requests per second.
    pub rate_rps: f64,
    /// Current emission interval.
    pub interval: Duration,
    /// The owner's ceiling.
    pub ceiling_rps: f64,
    /// The cold-start rate.
    pub start_rps: f64,
    /// The rate at which throttling last began, if ever.
    pub limit_rps: Option<f64>,
    /// Time left on a `Retry-After` hold.
    pub hold_remaining: Option<Duration>,
    /// Requests waiting for a slot.
    pub queue_len: usize,
    /// Learned time-to-first-byte baseline, once known.
    pub baseline_ttfb: Option<Duration>,
    /// The last cut of the rate.
    pub last_backoff: Option<Backoff>,
}

/// What an outcome did to the pacer.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Feedback {
    /// The rate was cut.
    pub backoff: Option<Backoff>,
    /// A hold was set or lengthened to this instant.
    pub hold_until: Option<Instant>,
    /// The rate grew.
    pub increased: bool,
}

impl Feedback {
    /// Whether waiters must re-check their slot.
    pub fn changed(&self) -> bool {
        self.backoff.is_some() || self.hold_until.is_some() || self.increased
    }
}

impl PacerCore {
    /// A cold pacer for these settings (validated by the caller).
    pub fn new(settings: &ProviderSettings) -> Self {
        let start = settings.start_rate();
        PacerCore {
            gcra: Gcra::new(interval_of(start), settings.burst),
            aimd: Aimd::new(
                start,
                settings.floor_rate(),
                settings.ceiling_rps,
                settings.decrease_factor,
                settings.increase_window,
            ),
            start_rps: start,
            hold_until: None,
            waiting: BTreeSet::new(),
            next_ticket: 0,
            max_queue_len: settings.max_queue_len,
            max_queue_wait: settings.max_queue_wait,
            soft_throttle_factor: settings.soft_throttle_factor,
            baseline: Baseline::default(),
            last_backoff: None,
            last_seen: None,
        }
    }

    /// Applies new settings (config reload) and keeps what was learned; the
    /// rate is clamped to the new ceiling.
    pub fn update_settings(&mut self, settings: &ProviderSettings) {
        self.aimd.set_bounds(
            settings.floor_rate(),
            settings.ceiling_rps,
            settings.decrease_factor,
            settings.increase_window,
        );
        self.start_rps = settings.start_rate();
        self.gcra.set_burst(settings.burst);
        self.max_queue_len = settings.max_queue_len;
        self.max_queue_wait = settings.max_queue_wait;
        self.soft_throttle_factor = settings.soft_throttle_factor;
        self.sync_interval();
    }

    /// Restores learned state (R-PS1): rate and limit clamped to the
    /// ceiling, baseline as saved.
    pub fn restore(&mut self, rate_rps: f64, limit_rps: Option<f64>, baseline: Option<Duration>) {
        self.aimd.restore(rate_rps, limit_rps);
        if let Some(b) = baseline {
            self.baseline.restore(b);
        }
        self.sync_interval();
    }

    fn sync_interval(&mut self) {
        let interval = interval_of(self.aimd.rate());
        if interval != self.gcra.interval() {
            self.gcra.set_interval(interval);
        }
    }

    /// The current rate.
    pub fn rate(&self) -> f64 {
        self.aimd.rate()
    }

    /// When the pacer last saw a request or an outcome.
    pub fn last_seen(&self) -> Option<Instant> {
        self.last_seen
    }

    /// The instant the request with `ahead` waiters before it would go.
    fn slot(&self, now: Instant, ahead: u32) -> Instant {
        let at = self.gcra.earliest(now, ahead);
        match self.hold_until {
            Some(hold) if hold > now => {
                // After the hold, waiters go one interval apart from the hold.
                at.max(hold + self.gcra.interval() * ahead)
            }
            _ => at,
        }
    }

    /// A request arrives. It either gets a ticket to wait with or is refused
    /// at once with the wait it would have had.
    pub fn enqueue(&mut self, now: Instant) -> Result<Ticket, (Refusal, Duration)> {
        self.last_seen = Some(now);
        let ahead = u32::try_from(self.waiting.len()).unwrap_or(u32::MAX);
        let wait = self.slot(now, ahead).saturating_duration_since(now);
        if self.waiting.len() >= self.max_queue_len {
            return Err((Refusal::QueueFull, wait));
        }
        if wait > self.max_queue_wait {
            return Err((Refusal::WaitTooLong, wait));
        }
        let ticket = Ticket(self.next_ticket);
        self.next_ticket += 1;
        self.waiting.insert(ticket);
        Ok(ticket)
    }

    /// The fast path: with nobody waiting and the slot due, a request is
    /// admitted at once, without a ticket. `false`: it must queue.
    pub fn try_admit(&mut self, now: Instant) -> bool {
        self.last_seen = Some(now);
        if !self.waiting.is_empty() || self.slot(now, 0) > now {
            return false;
        }
        self.gcra.admit(now);
        self.aimd.on_admit(now);
        true
    }

    /// Asks whether `ticket`, which may wait until `deadline`, may go now.
    /// Waiters are admitted strictly in arrival order (R-GC2); holds and
    /// rate changes apply to them as they stand.
    pub fn poll(&mut self, ticket: Ticket, deadline: Instant, now: Instant) -> Admission {
        let ahead = u32::try_from(self.waiting.range(..ticket).count()).unwrap_or(u32::MAX);
        let at = self.slot(now, ahead);
        if at > deadline {
            self.waiting.remove(&ticket);
            return Admission::Refuse(at.saturating_duration_since(now));
        }
        if ahead == 0 && at <= now {
            self.waiting.remove(&ticket);
            self.gcra.admit(now);
            self.aimd.on_admit(now);
            self.last_seen = Some(now);
            return Admission::Go;
        }
        Admission::WaitUntil(at)
    }

    /// The ticket at the head of the queue.
    pub fn head(&self) -> Option<Ticket> {
        self.waiting.first().copied()
    }

    /// A waiter left without being admitted (its client went away).
    pub fn cancel(&mut self, ticket: Ticket) -> bool {
        self.waiting.remove(&ticket)
    }

    /// The queue's deadline for a request arriving at `now`.
    pub fn deadline(&self, now: Instant) -> Instant {
        now + self.max_queue_wait
    }

    /// Feeds back what an attempt admitted at `sent_at` came back with.
    /// `ttfb` is the time from dispatch to the response head, when there was
    /// one.
    pub fn on_outcome(
        &mut self,
        outcome: &Outcome,
        sent_at: Instant,
        ttfb: Option<Duration>,
        now: Instant,
    ) -> Feedback {
        self.last_seen = Some(now);
        let mut fb = Feedback::default();
        match outcome {
            // A client error says nothing about the provider's capacity:
            // it neither grows the rate (R-AI4) nor cuts it.
            Outcome::ClientError { .. } => {}
            Outcome::Success => {
                let soft = ttfb.is_some_and(|t| self.is_soft_throttle(t));
                if let Some(t) = ttfb {
                    self.baseline.observe(t);
                }
                if soft {
                    fb.backoff = self
                        .aimd
                        .on_throttle(sent_at, now, BackoffReason::SoftThrottle);
                } else {
                    fb.increased = self.aimd.on_success(now);
                }
            }
            Outcome::Throttled { retry_after, .. } => {
                if let Some(wait) = retry_after {
                    let until = now + *wait;
                    if self.hold_until.is_none_or(|h| h < until) {
                        self.hold_until = Some(until);
                        fb.hold_until = Some(until);
                    }
                }
                fb.backoff = self
                    .aimd
                    .on_throttle(sent_at, now, BackoffReason::Throttled);
            }
            Outcome::Timeout => {
                fb.backoff = self
                    .aimd
                    .on_throttle(sent_at, now, BackoffReason::SoftThrottle);
            }
            Outcome::ServerError { .. } | Outcome::ConnectError => self.aimd.on_failure(),
        }
        if fb.backoff.is_some() {
            self.last_backoff = fb.backoff;
        }
        self.sync_interval();
        fb
    }

    fn is_soft_throttle(&self, ttfb: Duration) -> bool {
        self.baseline.get().is_some_and(|base| {
            ttfb.as_secs_f64() > base.as_secs_f64() * self.soft_throttle_factor
                && ttfb > base + SOFT_THROTTLE_SLACK
        })
    }

    /// The earliest instant a new request arriving at `now` could be sent.
    pub fn next_slot(&self, now: Instant) -> Instant {
        let ahead = u32::try_from(self.waiting.len()).unwrap_or(u32::MAX);
        self.slot(now, ahead)
    }

    /// A readout for metrics, the admin API and the store.
    pub fn snapshot(&self, now: Instant) -> PacerSnapshot {
        PacerSnapshot {
            rate_rps: self.aimd.rate(),
            interval: self.gcra.interval(),
            ceiling_rps: self.aimd.ceiling(),
            start_rps: self.start_rps,
            limit_rps: self.aimd.limit(),
            hold_remaining: self.hold_until.filter(|h| *h > now).map(|h| h - now),
            queue_len: self.waiting.len(),
            baseline_ttfb: self.baseline.get(),
            last_backoff: self.last_backoff,
        }
    }
}

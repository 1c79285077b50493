//! The pacer's whole decision state for one provider: GCRA + AIMD (with
//! its error and latency baselines) + hold + the FIFO waiting room. Pure:
//! every method takes `now`.

use std::time::Duration;

use tokio::time::Instant;

use super::aimd::{Aimd, Backoff, BackoffReason, Belief};
use super::allowance::{AllowanceSnapshot, AllowanceState, AllowanceUse};
use super::fair::{Class, FairQueue, Ticket};
use super::gcra::{interval_of, Gcra};
use super::shared::{Proposal, SharedView};
use crate::classify::{Outcome, Signal};
use crate::cost::Costs;
use crate::quota::Advertised;
use crate::settings::ProviderSettings;

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
    /// The slot would come at or after the instant the request may not
    /// wait past (its run's deadline).
    PastDeadline,
}

/// One provider's pacer state.
#[derive(Debug)]
pub struct PacerCore {
    gcra: Gcra,
    aimd: Aimd,
    start_rps: f64,
    /// Nothing is admitted before this instant (a provider's `Retry-After`).
    hold_until: Option<Instant>,
    /// Holds begun (one that lengthens a hold still in force is the same
    /// one): names a hold, so that a run's requests waiting out one count
    /// one wait (R-RN8).
    holds: u64,
    /// Requests waiting, in the order they go: weighted fair between
    /// collectors, steady before catch-up (FIFO for one class).
    waiting: FairQueue,
    next_ticket: u64,
    max_queue_len: usize,
    max_queue_wait: Duration,
    max_hold_wait: Duration,
    last_backoff: Option<Backoff>,
    /// When anything last happened, for idle eviction.
    last_seen: Option<Instant>,
    /// The quota the provider advertises, while it does (R-SG1).
    quota: Option<Quota>,
    /// The shared budget's rate as last seen, when the budget is shared
    /// (R-DS1).
    shared_rate: Option<f64>,
    /// The shared budget's admission count as last seen, and when.
    shared_count: Option<(u64, Instant)>,
    /// The shared budget could not be reached: pacing alone at this share
    /// (one over the replicas) of the last shared rate.
    alone: Option<u32>,
    /// A windowed quota learned from where the provider's `Retry-After`s
    /// point, when it advertises none.
    window: WindowLearner,
    /// What requests cost, by method and path (R-FS2).
    costs: Costs,
    /// Where the provider says what a request cost.
    cost_header: Option<http::HeaderName>,
    /// A long-horizon allowance, paced to last its period.
    allowance: Option<AllowanceState>,
}

/// Learns a fixed-window quota from a provider that advertises none: its
/// 429s carry a `Retry-After` reaching to the window's end, so two of them
/// a window apart give the window (the distance between the ends) and the
/// quota (the answers sent in between). Once learned, answers are counted
/// into windows and the quota is paced like an advertised one.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct WindowLearner {
    /// Where the last throttle said its window ends, and how far off that
    /// was.
    boundary: Option<Instant>,
    held: Duration,
    /// Clean answers to requests sent since that boundary.
    since: u64,
    /// The learned quota: requests per window, the window, the current
    /// window's start and the answers counted in it.
    learned: Option<(u64, Duration, Instant, u64)>,
}

/// A provider's advertised quota as the pacer follows it.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Quota {
    /// The last advertisement.
    advertised: Advertised,
    /// The latest the window may reset (holds last until then): the
    /// earliest this window's answers said.
    hi: Instant,
    /// The earliest it may reset (what remains is spent by then): headers
    /// carry whole seconds, so up to one before what they say.
    lo: Instant,
    /// When the last answered request of this window was sent.
    last_sent: Instant,
    /// How long a window lasts: advertised, or between two resets seen.
    window: Option<Duration>,
    /// Learned from `Retry-After`s, not advertised.
    synthetic: bool,
    /// The even rate: what remains, spread until the reset.
    rate: Option<f64>,
    /// No throttle since the provider began advertising: its word sets the
    /// rate. After one (it promised more than it allows), the rate is the
    /// lower of its word and what AIMD learns.
    trusted: bool,
    /// Answers in a row without the headers; at [`QUOTA_GONE`] the quota
    /// is forgotten and AIMD alone paces.
    missing: u32,
}

/// A window length measured between two resets or window ends, to whole seconds
/// (windows are stated in seconds).
fn round_window(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs_f64().round() as u64)
}

/// Answers in a row without quota headers after which the pacer stops
/// following the last advertisement.
const QUOTA_GONE: u32 = 3;

/// The quota a provider advertises, for the readout.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QuotaSnapshot {
    /// The last advertisement.
    pub advertised: Advertised,
    /// Until the window resets.
    pub reset_in: Duration,
    /// The even rate it is paced at (before the ceiling and AIMD).
    pub rate_rps: Option<f64>,
    /// Whether its word sets the rate (no throttle since it began).
    pub trusted: bool,
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
    /// Of those, how many per collector ("" for proxy users without one),
    /// for the collectors that have any waiting (R-FS1).
    pub waiting_by_collector: Vec<(String, usize)>,
    /// Learned time-to-first-byte baseline (the lower quartile of recent
    /// answers), once known.
    pub baseline_ttfb: Option<Duration>,
    /// Learned share of errors unrelated to load (bare 503s, other 5xx,
    /// timeouts, connect errors), once known.
    pub error_baseline: Option<f64>,
    /// A cut on ambiguous evidence (a bare 503, a timeout) awaits its
    /// verdict: kept if the errors stop at the lower rate, undone if not.
    pub on_trial: bool,
    /// The last cut of the rate.
    pub last_backoff: Option<Backoff>,
    /// The quota the provider advertises, while it does.
    pub quota: Option<QuotaSnapshot>,
    /// What the pace follows: `advertised` or `learned`.
    pub authority: &'static str,
    /// Whether the controller takes the recent failures for an outage or
    /// a throttle, and why (R-SG4); `None` when nothing is failing.
    pub belief: Option<Belief>,
    /// Outages seen since start.
    pub outages: u64,
    /// The long-horizon allowance, if one is set.
    pub allowance: Option<AllowanceSnapshot>,
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
    /// An outage was found (`true`) or ended (`false`) (R-SG4).
    pub outage: Option<bool>,
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
        let mut aimd = Aimd::new(
            start,
            settings.floor_rate(),
            settings.ceiling_rps,
            settings.decrease_factor,
            settings.increase_window,
        );
        aimd.set_latency_factor(settings.soft_throttle_factor);
        PacerCore {
            gcra: Gcra::new(interval_of(start), settings.burst),
            aimd,
            start_rps: start,
            hold_until: None,
            holds: 0,
            waiting: FairQueue::default(),
            next_ticket: 0,
            max_queue_len: settings.max_queue_len,
            max_queue_wait: settings.max_queue_wait,
            max_hold_wait: settings.max_hold_wait,
            last_backoff: None,
            last_seen: None,
            quota: None,
            shared_rate: None,
            shared_count: None,
            alone: None,
            window: WindowLearner::default(),
            costs: settings.costs.clone(),
            cost_header: settings.cost_header.clone(),
            allowance: settings.allowance.map(AllowanceState::new),
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
        self.max_hold_wait = settings.max_hold_wait;
        self.aimd.set_latency_factor(settings.soft_throttle_factor);
        self.costs = settings.costs.clone();
        self.cost_header = settings.cost_header.clone();
        match (settings.allowance, self.allowance.as_mut()) {
            (Some(a), Some(state)) => state.set(a),
            (Some(a), None) => self.allowance = Some(AllowanceState::new(a)),
            (None, _) => self.allowance = None,
        }
        self.sync_interval();
    }

    /// Units spent in the allowance's current period, for the store.
    pub fn allowance_use(&self, now: Instant) -> Option<AllowanceUse> {
        self.allowance.as_ref()?.usage(now)
    }

    /// Takes up an allowance period restored from the store.
    pub fn restore_allowance(&mut self, now: Instant, used: AllowanceUse) {
        if let Some(a) = self.allowance.as_mut() {
            a.restore(now, used);
        }
        self.sync_interval();
    }

    /// `units` were admitted at `now`: the allowance spends them and its
    /// rate moves with what is left.
    fn spend(&mut self, now: Instant, units: u32) {
        if let Some(a) = self.allowance.as_mut() {
            a.spend(now, f64::from(units));
            self.sync_interval();
        }
    }

    /// Brings an allowance's pace to `now` as requests arrive and wait:
    /// unspent time raises it, and a period that ended while everything
    /// was spent gives way to the next (nothing else would wake a pacer
    /// whose interval is the spent allowance's).
    fn refresh_allowance(&mut self, now: Instant) {
        if let Some(a) = self.allowance.as_mut() {
            a.refresh(now);
            self.sync_interval();
        }
    }

    /// What a request of `method` to `path` costs, in units (R-FS2).
    pub fn cost_of(&self, method: &http::Method, path: &str) -> u32 {
        self.costs.of(method, path)
    }

    /// The header the provider says what a request cost in, if configured.
    pub fn cost_header(&self) -> Option<&http::HeaderName> {
        self.cost_header.as_ref()
    }

    /// The provider charged a request admitted at `sent_at` `extra` units
    /// more than its price: the schedule takes them on (the next requests
    /// wait for them; a lower charge gives nothing back — never shorter).
    pub fn charge(&mut self, now: Instant, extra: u32) {
        if extra > 0 {
            self.gcra.charge(extra);
            self.aimd.on_admit_units(now, extra);
            self.spend(now, extra);
        }
    }

    /// Restores learned state (R-PS1): rate and limit clamped to the
    /// ceiling, baseline as saved.
    pub fn restore(&mut self, rate_rps: f64, limit_rps: Option<f64>, baseline: Option<Duration>) {
        self.aimd.restore(rate_rps, limit_rps, baseline);
        self.sync_interval();
    }

    fn sync_interval(&mut self) {
        let interval = interval_of(self.pace_rate());
        if interval != self.gcra.interval() {
            self.gcra.set_interval(interval);
        }
    }

    /// The current rate.
    pub fn rate(&self) -> f64 {
        self.pace_rate()
    }

    /// The rate requests are paced at: AIMD's, and while the provider
    /// advertises a quota never above its even rate; pacing alone while a
    /// shared budget is unreachable, this replica's share of it (never
    /// above the last shared rate: no replica grows it alone).
    fn pace_rate(&self) -> f64 {
        let rate = match self.quota.and_then(|q| q.rate) {
            Some(even) => self.aimd.rate().min(even.max(self.aimd.floor())),
            None => self.aimd.rate(),
        };
        // An allowance is a budget, not a guess: no floor under it.
        let rate = match &self.allowance {
            Some(a) => rate.min(a.pace()),
            None => rate,
        };
        match (self.alone, self.shared_rate) {
            (Some(replicas), Some(shared)) => rate.min(shared) / f64::from(replicas.max(1)),
            (Some(replicas), None) => rate / f64::from(replicas.max(1)),
            _ => rate,
        }
    }

    /// What this replica proposes to a shared budget nobody has started.
    pub fn proposal(&self) -> Proposal {
        Proposal {
            rate: self.aimd.rate(),
            limit: self.aimd.limit(),
            units: 1,
            allowance: self.allowance.as_ref().map(AllowanceState::allowance),
        }
    }

    /// The shared budget answered (R-DS1): its rate, throttle point and
    /// hold become this replica's, and pacing alone (if it was) ends.
    pub fn adopt_shared(&mut self, view: &SharedView, now: Instant) -> Feedback {
        let mut fb = Feedback::default();
        let before = self.gcra.interval();
        self.alone = None;
        self.shared_rate = Some(view.rate);
        self.aimd.adopt(now, view.rate, view.limit);
        // Every replica's admissions since this replica last asked: the
        // window's demand and delivery are the provider's, not this
        // replica's share of them.
        if let Some((prev, at)) = self.shared_count.filter(|(p, _)| view.admitted > *p) {
            let n = u32::try_from(view.admitted - prev).unwrap_or(u32::MAX);
            let held = self.hold_until.is_some_and(|h| h > at);
            let span = (!held).then(|| now.saturating_duration_since(at));
            self.aimd.on_shared_admitted(now, n, span);
        }
        if self.shared_count.is_none_or(|(p, _)| view.admitted != p) {
            self.shared_count = Some((view.admitted, now));
        }
        if let Some(hold) = view.hold.filter(|h| !h.is_zero()) {
            fb.hold_until = self.hold(now, now + hold);
        }
        // The allowance as every replica spent it (the readout, the store,
        // and this replica's pace should the store stop answering).
        if let (Some(used), Some(a)) = (view.allowance, self.allowance.as_mut()) {
            a.restore(now, used);
        }
        self.sync_interval();
        // Faster or slower, waiters' slots moved (it is not this replica's
        // cut or raise: nothing to report back).
        fb.increased = self.gcra.interval() != before;
        fb
    }

    /// The shared budget could not answer: pace alone at one share of the
    /// last shared rate until it answers again.
    pub fn pace_alone(&mut self, replicas: u32) -> Feedback {
        let before = self.gcra.interval();
        self.alone = Some(replicas.max(1));
        self.sync_interval();
        Feedback {
            increased: self.gcra.interval() != before,
            ..Feedback::default()
        }
    }

    /// How many requests may wait.
    pub fn max_queue_len(&self) -> usize {
        self.max_queue_len
    }

    /// Whether this replica paces alone because its shared budget is
    /// unreachable.
    pub fn alone(&self) -> bool {
        self.alone.is_some()
    }

    /// This replica took a slot of the shared budget.
    pub fn admitted_here(&mut self) {
        self.aimd.on_admitted_here();
    }

    /// A shared budget made this replica's request wait: its demand
    /// saturates the shared pace.
    pub fn pressed(&mut self) {
        self.aimd.on_pressed();
    }

    /// The learned rate and throttle point, before any quota or share:
    /// what a shared budget is told.
    pub fn learned(&self) -> (f64, Option<f64>) {
        (self.aimd.rate(), self.aimd.limit())
    }

    /// The increase window (at most one shared raise per window).
    pub fn increase_window(&self) -> Duration {
        self.aimd.window()
    }

    /// Which authority the pace follows: `advertised` while the provider
    /// advertises a quota, else `learned`.
    pub fn authority(&self) -> &'static str {
        if let Some(a) = &self.allowance {
            let learned = self.aimd.rate();
            if a.pace() < learned {
                return "allowance";
            }
        }
        match self.quota {
            Some(q) if q.synthetic => "learned_window",
            Some(_) => "advertised",
            None => "learned",
        }
    }

    /// What an answer's quota headers say (R-SG1): `Some` — pace to it
    /// (spend what remains evenly until the reset; nothing left holds the
    /// provider until the reset, like `Retry-After`); `None` — the answer
    /// carried none.
    pub fn on_quota(
        &mut self,
        advertised: Option<Advertised>,
        sent_at: Instant,
        now: Instant,
    ) -> Feedback {
        let mut fb = Feedback::default();
        let (advertised, synthetic) = match advertised {
            Some(a) => (Some(a), false),
            None => (self.learned_advert(now), true),
        };
        let Some(adv) = advertised else {
            if let Some(q) = self.quota.as_mut() {
                q.missing += 1;
                if q.missing >= QUOTA_GONE {
                    self.quota = None;
                    self.sync_interval();
                    fb.increased = true;
                }
            }
            return fb;
        };
        // When the window resets, as this answer says: whole seconds may
        // be rounded up, so the true reset is within a second before it —
        // and a reset counted from when the provider answered is later
        // still by the time the answer took to come back (at most since
        // the send), so the earliest it may be is that much before.
        let said = now + adv.reset;
        let rounding = adv.granularity;
        let earliest = said
            .checked_sub(rounding + now.saturating_duration_since(sent_at))
            .unwrap_or(now);
        let mut q = match self.quota {
            // The same window: no more remains than before, and the request
            // was sent before the latest the window may end. (Not judged by
            // the reset it states: rounded to whole seconds from an answer
            // that came back late, a reset in the same window can read a
            // whole second later.)
            Some(q) if adv.remaining <= q.advertised.remaining && sent_at < q.hi => {
                let hi = q.hi.min(said);
                Quota {
                    hi,
                    lo: q.lo.max(earliest).min(hi),
                    ..q
                }
            }
            // A new window began between the last answer's send and this
            // one's.
            Some(q) => {
                // Consecutive windows reset a window apart: to the second
                // when resets are Unix times, within one when they count
                // seconds (the old window's earliest reset is within its
                // rounding). Windows with no answer in them make a multiple:
                // the shortest seen is the window.
                let seen = round_window(said.saturating_duration_since(q.hi));
                let window = adv
                    .window
                    .or(match (q.window, seen.is_zero()) {
                        (Some(w), false) => Some(w.min(seen)),
                        (w, true) => w,
                        (None, false) => Some(seen),
                    })
                    .filter(|w| !w.is_zero());
                let mut hi = said;
                let mut lo = earliest;
                if let Some(w) = window {
                    // The window began after the last send of the old one
                    // and before this answer came back (not before this
                    // request's send: it may have reached the provider
                    // late): it ends a window after. The latest end must
                    // never be early — a hold that ends early is a 429.
                    hi = hi.min(now + w);
                    lo = lo.max(q.last_sent + w);
                    // The next window after the old one: what was known of
                    // its end carries over, so the bounds narrow with each
                    // window to the closest sends on either side of a reset.
                    if said < q.hi + w + rounding / 2 {
                        hi = hi.min(q.hi + w);
                        lo = lo.max(q.lo + w);
                    }
                    if lo > hi {
                        // The windows moved: this answer's word alone.
                        hi = said.min(now + w);
                        lo = earliest.min(hi);
                    }
                }
                Quota {
                    hi,
                    lo,
                    window,
                    ..q
                }
            }
            None => Quota {
                synthetic,
                advertised: adv,
                hi: said,
                lo: earliest,
                rate: None,
                trusted: true,
                missing: 0,
                last_sent: sent_at,
                window: adv.window,
            },
        };
        // A window not stated but measured is the quota's window.
        q.advertised = Advertised {
            window: adv.window.or(q.window),
            ..adv
        };
        let adv = q.advertised;
        q.synthetic = synthetic;
        q.missing = 0;
        q.last_sent = q.last_sent.max(sent_at);
        // Spend what remains by the earliest the window may reset — once
        // that has passed, at the policy's own rate (the reset may come any
        // moment); hold, when nothing remains, until the latest. While the
        // window's length is unknown (its first answers, with no policy
        // stated), the two may be a whole rounding apart: spent by the
        // earliest, the rest of the time would be a hold; spread to the
        // latest, only what this window has left is slower — the lesser
        // loss when the reset is near (a per-second window); when it is
        // far, the two lose the same and spending by the earliest is
        // sooner.
        let unsure = q.hi.saturating_duration_since(q.lo);
        let left = match adv.window {
            None if q.hi.saturating_duration_since(now) < unsure * 4 => {
                q.hi.saturating_duration_since(now)
            }
            _ if q.lo > now => q.lo - now,
            Some(_) => Duration::ZERO,
            None => q.hi.saturating_duration_since(now),
        };
        q.rate = Advertised { reset: left, ..adv }.even_rate();
        if q.rate.is_none() {
            fb.hold_until = self.hold(now, q.hi);
        }
        let before = self.gcra.interval();
        let (trusted, rate) = (q.trusted, q.rate);
        self.quota = Some(q);
        if trusted {
            if let Some(r) = rate {
                self.aimd.follow(now, r);
            }
        }
        self.sync_interval();
        fb.increased = self.gcra.interval() < before;
        fb
    }

    /// A 429 said its window ends at `end`. A window after the last such
    /// end, the distance between them is the window and the answers sent
    /// in between the quota; learned, it is paced like an advertised one
    /// (a fresh trust: a provider whose window changed is learned anew).
    fn learn_window(&mut self, end: Instant, wait: Duration) {
        let w = &mut self.window;
        if let Some(prev) = w.boundary {
            let window = round_window(end.saturating_duration_since(prev));
            // A fixed window's 429 sends us to its end, a large part of the
            // window away; a token bucket's short Retry-Afters (a second)
            // at a steady interval are not a window.
            let long = |held: Duration| held >= Duration::from_secs(2) && held * 4 >= window;
            if window >= Duration::from_secs(2) && w.since > 0 && long(w.held) && long(wait) {
                w.learned = Some((w.since, window, end, 0));
                if self.quota.is_some_and(|q| q.synthetic) {
                    self.quota = None;
                }
            }
        }
        w.boundary = Some(end);
        w.held = wait;
        w.since = 0;
    }

    /// The quota a learned window stands for now, as if advertised.
    fn learned_advert(&self, now: Instant) -> Option<Advertised> {
        let (limit, window, mut start, mut used) = self.window.learned?;
        while now >= start + window {
            start += window;
            used = 0;
        }
        Some(Advertised {
            limit: Some(limit),
            window: Some(window),
            remaining: limit.saturating_sub(used),
            reset: (start + window).saturating_duration_since(now),
            granularity: Duration::from_secs(1),
            family: crate::quota::Family::Learned,
        })
    }

    /// When the pacer last saw a request or an outcome.
    pub fn last_seen(&self) -> Option<Instant> {
        self.last_seen
    }

    /// The instant the request with `ahead` waiters before it would go.
    fn slot(&self, now: Instant, ahead: u32) -> Instant {
        let mut at = self.gcra.earliest(now, ahead);
        if let Some(end) = self.allowance.as_ref().and_then(|a| a.spent_until(now)) {
            at = at.max(end);
        }
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
        self.enqueue_as(now, &Class::default(), 1.0)
    }

    /// [`PacerCore::enqueue`] for a request of `class` costing `cost`
    /// units (R-FS2): its wait is its place in the fair order (R-FS1).
    pub fn enqueue_as(
        &mut self,
        now: Instant,
        class: &Class,
        cost: f64,
    ) -> Result<Ticket, (Refusal, Duration)> {
        self.last_seen = Some(now);
        self.refresh_allowance(now);
        let ticket = Ticket::new(self.next_ticket);
        self.waiting.insert(ticket, class, cost);
        let wait = self
            .slot(now, self.waiting.ahead(ticket))
            .saturating_duration_since(now);
        let refusal = if self.waiting.len() > self.max_queue_len {
            Some(Refusal::QueueFull)
        } else if wait > self.patience(now) {
            Some(Refusal::WaitTooLong)
        } else {
            None
        };
        if let Some(refusal) = refusal {
            self.waiting.remove(ticket);
            return Err((refusal, wait));
        }
        self.next_ticket += 1;
        Ok(ticket)
    }

    /// The fast path: with nobody waiting and the slot due, a request is
    /// admitted at once, without a ticket. `false`: it must queue.
    pub fn try_admit(&mut self, now: Instant) -> bool {
        self.try_admit_units(now, 1)
    }

    /// [`PacerCore::try_admit`] for a request costing `units`: it takes as
    /// many slots, paid after it goes (R-FS2).
    pub fn try_admit_units(&mut self, now: Instant, units: u32) -> bool {
        self.last_seen = Some(now);
        self.refresh_allowance(now);
        if !self.waiting.is_empty() || self.slot(now, 0) > now {
            return false;
        }
        self.gcra.admit(now);
        self.gcra.charge(units.saturating_sub(1));
        self.aimd.on_admit_units(now, units.max(1));
        self.spend(now, units.max(1));
        true
    }

    /// Asks whether `ticket`, which may wait until `deadline`, may go now.
    /// Waiters are admitted strictly in arrival order (R-GC2); holds and
    /// rate changes apply to them as they stand.
    pub fn poll(&mut self, ticket: Ticket, deadline: Instant, now: Instant) -> Admission {
        let next = self.waiting.next() == Some(ticket);
        let ahead = if next {
            0
        } else {
            self.waiting.ahead(ticket).max(1)
        };
        let at = self.slot(now, ahead);
        if at > deadline {
            self.waiting.remove(ticket);
            return Admission::Refuse(at.saturating_duration_since(now));
        }
        if next && at <= now {
            let units = self.waiting.cost(ticket).unwrap_or(1.0).round().max(1.0) as u32;
            self.waiting.admitted(ticket);
            self.gcra.admit_waited(now);
            self.gcra.charge(units - 1);
            self.aimd.on_admit_units(now, units);
            self.spend(now, units);
            self.last_seen = Some(now);
            return Admission::Go;
        }
        Admission::WaitUntil(at)
    }

    /// The ticket that goes next.
    pub fn head(&self) -> Option<Ticket> {
        self.waiting.next()
    }

    /// A waiter left without being admitted (its client went away).
    pub fn cancel(&mut self, ticket: Ticket) -> bool {
        self.waiting.remove(ticket)
    }

    /// The queue's deadline for a request arriving at `now`.
    pub fn deadline(&self, now: Instant) -> Instant {
        now + self.patience(now)
    }

    /// How long a request may wait for its slot: `max_queue_wait`, or
    /// `max_hold_wait` while the provider holds us off — a windowed quota's
    /// reset is waited for, not refused through.
    pub fn patience(&self, now: Instant) -> Duration {
        match self.hold_until {
            Some(h) if h > now => self.max_queue_wait.max(self.max_hold_wait),
            _ => self.max_queue_wait,
        }
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
        let (outages, in_outage) = (self.aimd.outages(), self.aimd.in_outage());
        // What the answer says is decided once, in `classify`.
        match outcome.signal() {
            // A client error (404 for a deleted record, 400 for a bad id)
            // is the provider working normally: a clean answer for the rate,
            // like a success (but never retried, never a breaker failure).
            Signal::Clean => {
                if self.window.boundary.is_some_and(|b| sent_at >= b) {
                    self.window.since += 1;
                }
                if let Some((_, w, start, used)) = self.window.learned.as_mut() {
                    while now >= *start + *w {
                        *start += *w;
                        *used = 0;
                    }
                    *used += 1;
                }
                let change = self.aimd.on_clean(sent_at, now, ttfb);
                fb.increased = change.increased;
                fb.backoff = change.backoff;
            }
            // A bare 503 may be noise: weighed against the error baseline.
            Signal::Ambiguous { timeout: false } => {
                fb.backoff = self
                    .aimd
                    .on_ambiguous(sent_at, now, BackoffReason::Unavailable);
            }
            Signal::Throttle {
                status,
                retry_after,
            } => {
                if let Some(wait) = retry_after {
                    let until = now + wait;
                    fb.hold_until = self.hold(now, until);
                    if status == 429 {
                        self.learn_window(until, wait);
                    }
                }
                self.aimd.on_hold(retry_after.unwrap_or_default());
                let reason = if status == 503 {
                    BackoffReason::UnavailableRetryAfter
                } else {
                    BackoffReason::Throttled
                };
                // Throttled while following its word: the provider allows
                // less than it advertises; AIMD learns the rest.
                if let Some(q) = self.quota.as_mut() {
                    q.trusted = false;
                }
                fb.backoff = self.aimd.on_throttle(sent_at, now, reason);
            }
            Signal::Ambiguous { timeout: true } => {
                fb.backoff = self.aimd.on_ambiguous(sent_at, now, BackoffReason::Timeout);
            }
            Signal::Failure => {
                self.aimd.on_error(sent_at, now);
            }
        }
        if fb.backoff.is_some() {
            self.last_backoff = fb.backoff;
        }
        if self.aimd.outages() > outages {
            fb.outage = Some(true);
        } else if in_outage && !self.aimd.in_outage() {
            fb.outage = Some(false);
        }
        self.sync_interval();
        fb
    }

    /// Whether the rate controller takes the recent failures for an outage
    /// (R-SG4).
    pub fn in_outage(&self) -> bool {
        self.aimd.in_outage()
    }

    /// The outage watch found the provider down first: see
    /// [`Aimd::declare_outage`](super::aimd::Aimd::declare_outage).
    pub fn declare_outage(&mut self, now: Instant) -> bool {
        self.aimd.declare_outage(now)
    }

    /// Holds every request until `until` unless a longer hold is in force;
    /// returns the new end if it moved.
    fn hold(&mut self, now: Instant, until: Instant) -> Option<Instant> {
        if self.hold_until.is_some_and(|h| h >= until) {
            return None;
        }
        if self.hold_until.is_none_or(|h| h <= now) {
            self.holds += 1;
        }
        self.hold_until = Some(until);
        Some(until)
    }

    /// The hold in force at `now`: time left, and which hold it is.
    pub fn hold_left(&self, now: Instant) -> Option<(Duration, u64)> {
        self.hold_until
            .filter(|h| *h > now)
            .map(|h| (h - now, self.holds))
    }

    /// The earliest instant a new request arriving at `now` could be sent.
    pub fn next_slot(&self, now: Instant) -> Instant {
        let ahead = u32::try_from(self.waiting.len()).unwrap_or(u32::MAX);
        self.slot(now, ahead)
    }

    /// A readout for metrics, the admin API and the store.
    pub fn snapshot(&self, now: Instant) -> PacerSnapshot {
        PacerSnapshot {
            rate_rps: self.pace_rate(),
            interval: self.gcra.interval(),
            ceiling_rps: self.aimd.ceiling(),
            start_rps: self.start_rps,
            limit_rps: self.aimd.limit(),
            hold_remaining: self.hold_until.filter(|h| *h > now).map(|h| h - now),
            queue_len: self.waiting.len(),
            waiting_by_collector: self
                .waiting
                .waiting_by_class()
                .map(|(name, n)| (name.to_string(), n))
                .collect(),
            baseline_ttfb: self.aimd.latency_baseline(),
            error_baseline: self.aimd.error_baseline(),
            on_trial: self.aimd.in_trial(),
            last_backoff: self.last_backoff,
            quota: self.quota.map(|q| QuotaSnapshot {
                advertised: q.advertised,
                reset_in: q.hi.saturating_duration_since(now),
                rate_rps: q.rate,
                trusted: q.trusted,
            }),
            authority: self.authority(),
            belief: self.aimd.belief(now),
            outages: self.aimd.outages(),
            allowance: self.allowance.as_ref().map(|a| a.snapshot(now)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drives a core with saturating demand for `secs` windows, every
    /// answer `outcome`; returns the rate reached.
    fn drive(outcome: Outcome, secs: u32) -> f64 {
        let settings = ProviderSettings::with_ceiling(1000.0);
        let mut core = PacerCore::new(&settings);
        let mut now = Instant::now();
        let end = now + Duration::from_secs(u64::from(secs));
        while now < end {
            if core.try_admit(now) {
                core.on_outcome(&outcome, now, Some(Duration::from_millis(30)), now);
            }
            now += Duration::from_millis(5);
        }
        core.rate()
    }

    /// Issue 8: a provider answering 404 (a collector probing ids) grows
    /// the rate as one answering 200 does.
    #[test]
    fn not_found_grows_the_rate_like_ok() {
        let ok = drive(Outcome::Success, 10);
        let not_found = drive(Outcome::ClientError { status: 404 }, 10);
        assert!(ok > 20.0, "{ok}");
        assert_eq!(not_found, ok);
    }

    fn advert(remaining: u64, reset_ms: u64) -> Option<Advertised> {
        Some(Advertised {
            limit: Some(600),
            window: Some(Duration::from_secs(60)),
            remaining,
            reset: Duration::from_millis(reset_ms),
            granularity: Duration::ZERO,
            family: crate::quota::Family::Ietf,
        })
    }

    /// R-SG1: from the first answer that advertises a quota, the pace is
    /// what remains spread until the reset (within the policy's rate), not
    /// the cold start; without the headers for a few answers, AIMD paces
    /// again.
    #[test]
    fn an_advertised_quota_sets_the_pace_at_once() {
        let mut core = PacerCore::new(&ProviderSettings::with_ceiling(50.0));
        let now = Instant::now();
        assert_eq!(core.rate(), 5.0, "cold start");
        assert_eq!(core.authority(), "learned");
        core.on_quota(advert(300, 60_000), now, now);
        assert!((core.rate() - 5.0).abs() < 1e-9, "300 over 60 s");
        core.on_quota(advert(590, 59_000), now, now);
        assert!((core.rate() - 10.0).abs() < 1e-9, "never above 600/60 s");
        assert_eq!(core.authority(), "advertised");
        for _ in 0..QUOTA_GONE {
            core.on_quota(None, now, now);
        }
        assert_eq!(core.authority(), "learned");
        assert!(
            (core.rate() - 10.0).abs() < 1e-9,
            "AIMD goes on from the advertised rate"
        );
    }

    /// A per-second window advertised as `X-RateLimit-*` (no window stated,
    /// the reset a whole Unix second, the windows' phase 0.37 s off the
    /// second): the window is measured between two resets, and from the
    /// third window on every window is used whole, never over.
    #[test]
    fn an_unstated_per_second_window_is_measured_and_used_whole() {
        let mut core = PacerCore::new(&ProviderSettings::with_ceiling(50.0));
        let t0 = Instant::now();
        let wall = |t: Instant| (t - t0).as_secs_f64() + 0.37;
        let (mut now, mut window, mut used) = (t0, 0u64, 0u64);
        let mut per_window = Vec::new();
        let mut over = 0;
        while now < t0 + Duration::from_secs(10) {
            let current = (now - t0).as_secs();
            if current != window {
                per_window.push(used);
                (window, used) = (current, 0);
            }
            if core.try_admit(now) {
                if used < 20 {
                    used += 1;
                } else {
                    over += 1;
                }
                let end = wall(t0 + Duration::from_secs(current + 1));
                let reset = Duration::from_secs_f64(end.ceil() - wall(now));
                let adv = Advertised {
                    limit: Some(20),
                    window: None,
                    remaining: 20 - used,
                    reset,
                    granularity: Duration::from_secs(1),
                    family: crate::quota::Family::XRateLimit,
                };
                core.on_quota(Some(adv), now, now);
            }
            now += Duration::from_millis(1);
        }
        assert_eq!(over, 0, "never over the quota: {per_window:?}");
        assert!(per_window[2..].iter().all(|&n| n == 20), "{per_window:?}");
        let q = core.snapshot(now).quota.unwrap();
        assert_eq!(q.advertised.window, Some(Duration::from_secs(1)));
    }

    /// R-FS2: an allowance spent before its period ends (here, as the
    /// store restores it after a restart) holds requests off; the period's
    /// end lets them go again, though no answer arrived to move the pace
    /// (requests arriving bring it up to date), and the new period is paced
    /// to last, not spent at once.
    #[test]
    fn a_spent_allowance_lets_requests_go_when_its_period_ends() {
        let mut settings = ProviderSettings::with_ceiling(50.0);
        settings.start_rps = Some(50.0);
        settings.allowance = Some(crate::pacer::Allowance {
            units: 20,
            per: Duration::from_secs(10),
        });
        let mut core = PacerCore::new(&settings);
        let t0 = Instant::now();
        core.restore_allowance(
            t0,
            AllowanceUse {
                elapsed: Duration::from_secs(1),
                spent: 20.0,
            },
        );
        let mut now = t0;
        let mut admitted = Vec::new();
        while now < t0 + Duration::from_secs(19) {
            if core.try_admit(now) {
                admitted.push((now - t0).as_secs_f64());
            }
            now += Duration::from_millis(5);
        }
        assert!(
            admitted.first().is_some_and(|&t| (9.0..9.1).contains(&t)),
            "{admitted:?}"
        );
        assert!((19..=20).contains(&admitted.len()), "{admitted:?}");
        assert!(
            admitted.windows(2).all(|w| w[1] - w[0] >= 0.3),
            "spread, never a burst: {admitted:?}"
        );
    }

    /// Nothing left: held until the reset, like `Retry-After`.
    #[test]
    fn nothing_left_holds_until_the_reset() {
        let mut core = PacerCore::new(&ProviderSettings::with_ceiling(50.0));
        let now = Instant::now();
        let fb = core.on_quota(advert(0, 2_500), now, now);
        assert_eq!(fb.hold_until, Some(now + Duration::from_millis(2_500)));
        assert_eq!(core.next_slot(now), now + Duration::from_millis(2_500));
    }

    /// A provider that throttles below what it advertises is no longer
    /// taken at its word: AIMD cuts from the advertised rate and its later
    /// adverts only cap the pace.
    #[test]
    fn a_throttle_below_the_advert_hands_the_pace_to_aimd() {
        let mut core = PacerCore::new(&ProviderSettings::with_ceiling(50.0));
        let now = Instant::now();
        core.on_quota(advert(590, 59_000), now, now);
        assert!((core.rate() - 10.0).abs() < 1e-9);
        let later = now + Duration::from_millis(200);
        core.on_outcome(
            &Outcome::Throttled {
                status: 429,
                retry_after: None,
            },
            later,
            None,
            later,
        );
        let cut = core.rate();
        assert!(cut < 10.0, "cut from the advertised rate: {cut}");
        core.on_quota(advert(580, 58_000), later, later);
        assert_eq!(core.rate(), cut, "its word no longer raises the pace");
    }
}

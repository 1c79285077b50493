//! Advertised quotas (R-SG1), and fixed windows learned from a
//! provider's `Retry-After`s where it advertises none.

use super::put;
use super::*;

/// Learns a fixed-window quota from a provider that advertises none: its
/// 429s carry a `Retry-After` reaching to the window's end, so two of them
/// a window apart give the window (the distance between the ends) and the
/// quota (the answers sent in between). Once learned, answers are counted
/// into windows and the quota is paced like an advertised one.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct WindowLearner {
    /// Where the last throttle said its window ends, and how far off that
    /// was.
    pub(super) boundary: Option<Instant>,
    pub(super) held: Duration,
    /// Clean answers to requests sent since that boundary.
    pub(super) since: u64,
    /// The learned quota: requests per window, the window, the current
    /// window's start and the answers counted in it.
    pub(super) learned: Option<(u64, Duration, Instant, u64)>,
}

/// What following a quota's stated resets delivered over a span.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Delivery {
    /// Since when.
    pub(super) since: Instant,
    /// The answers since that carried the quota and were not throttles.
    pub(super) served: u64,
    /// How often the quota was spent since.
    pub(super) spent: u32,
    /// In a fleet (R-DS1), the shared slots this replica and every replica
    /// had taken by `since`: this replica's answers are its share of the
    /// fleet's, and are judged as that share.
    pub(super) fleet: Option<FleetCount>,
}

impl Delivery {
    /// A span from `since`, the fleet's counts then (if sharing).
    pub(super) fn new(since: Instant, fleet: Option<FleetCount>) -> Delivery {
        Delivery {
            since,
            served: 0,
            spent: 0,
            fleet,
        }
    }

    /// This replica's share of the fleet's slots over the span, by the
    /// counts `now` (1 alone).
    fn share(&self, now: Option<FleetCount>) -> f64 {
        match (self.fleet, now) {
            (Some(then), Some(now)) if now.all > then.all => {
                let here = now.here.saturating_sub(then.here) as f64;
                (here / (now.all - then.all) as f64).min(1.0)
            }
            _ => 1.0,
        }
    }
}

/// Shared slots taken: by this replica, and by every replica (as the
/// shared budget last counted them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FleetCount {
    pub(super) here: u64,
    pub(super) all: u64,
}

/// A provider's advertised quota as the pacer follows it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Quota {
    /// The last advertisement.
    pub(super) advertised: Advertised,
    /// The latest the window may reset (holds last until then): the
    /// earliest this window's answers said.
    pub(super) hi: Instant,
    /// The earliest it may reset (what remains is spent by then): headers
    /// carry whole seconds, so up to one before what they say.
    pub(super) lo: Instant,
    /// When the last answered request of this window was sent.
    pub(super) last_sent: Instant,
    /// How long a window lasts: advertised, or between two resets seen.
    pub(super) window: Option<Duration>,
    /// Learned from `Retry-After`s, not advertised.
    pub(super) synthetic: bool,
    /// The even rate: what remains, spread until the reset.
    pub(super) rate: Option<f64>,
    /// No throttle since the provider began advertising: its word sets the
    /// rate. After one (it promised more than it allows), the rate is the
    /// lower of its word and what AIMD learns.
    pub(super) trusted: bool,
    /// Answers in a row without the headers; at [`QUOTA_GONE`] the quota
    /// is forgotten and AIMD alone paces.
    pub(super) missing: u32,
    /// When the request whose answer told the current `remaining` was
    /// sent.
    pub(super) low_sent: Instant,
    /// Refills no fixed window makes: `remaining` rose, for a request sent
    /// after the one that told the lower figure, while the reset stayed
    /// where it was. At [`ROLLING_AFTER`] the quota is a rolling one.
    pub(super) refills: u32,
    /// What following the stated resets delivers (see
    /// [`DELIVERED_SHARE`]).
    pub(super) delivery: Delivery,
    /// Answers that carried the quota.
    pub(super) answers: u64,
    /// [`Quota::answers`] at the last refusal that left a rolling quota's
    /// word trusted (see [`EDGE_ANSWERS`]).
    pub(super) edge_refused: Option<u64>,
}

/// A rolling quota's refusal is the network's jitter at a window's edge —
/// its word stays trusted — when no other came within this many answers
/// before it (one in 200: under the ≤ 1 % a well-paced collector may
/// meet). Refused more often, it allows less than it says and AIMD learns
/// the rest. (One refusal in a run was all a moving window was forgiven
/// before: over a minute at 20 a second, jitter met it twice in some runs
/// and AIMD's settle point took the pace to 0.89–0.92 of it.)
pub(super) const EDGE_ANSWERS: u64 = 200;

/// Spent at least [`SPENT_TIMES`] times over at least [`SPENT_WINDOWS`]
/// windows — demand more than the quota — yet delivered under this share
/// of `limit / window`: the stated resets lie past the real ones (a
/// window that restarts at the first request after it expired, rounded up
/// to a whole second: held to it, 20 a second were used at 0.74–0.92;
/// a moving window whose refills went unseen in the holds). The quota is
/// taken for a rolling one from then on: the results decide (R-SG1).
pub(super) const DELIVERED_SHARE: f64 = 0.85;
pub(super) const SPENT_TIMES: u32 = 3;
pub(super) const SPENT_WINDOWS: u32 = 5;

/// Refills a fixed window cannot make (see [`Quota::refills`]) before the
/// quota is taken for a rolling one: a moving window (the `limits`
/// library's, Flask-Limiter's, slowapi's), whose stated reset is when its
/// oldest hit leaves it — an upper bound, not a reset: requests free up
/// one at a time long before it. Held to it as to a fixed window's reset,
/// 20 a second were used at 0.55 (issue 35).
pub(super) const ROLLING_AFTER: u32 = 3;

/// A rolling quota is paced this far under `limit / window`: at its exact
/// rate, the limit + 1st request reaches the provider at the very edge of
/// the window its first one opened, where the network's jitter has it
/// refused half the time.
pub(super) const ROLLING_MARGIN: f64 = 0.97;

/// [`ROLLING_MARGIN`] for a fleet (R-DS1): its sends leave from several
/// processes, each slot taken after a round trip to the shared store and a
/// wake-up, and reach the provider further from their even spacing than
/// one process's (four replicas through one Redis, Flask-Limiter's moving
/// window at 20 a second: gaps of 36–41 ms at the 1st percentile of a
/// 51.5 ms pace, so that 21 sends fell within one second in most runs).
/// At 0.97 the 21st send of a window is 0.6 of an interval (31 ms) clear of
/// the window's edge, which that spread crosses: 0.3–1.4 % of a fleet's
/// sends refused over 30–60 s in sixteen runs of nineteen here; at 0.95 it is a
/// whole interval (53 ms) clear.
pub(super) const ROLLING_MARGIN_SHARED: f64 = 0.95;

/// How far clear of a stated window's edge a fleet keeps its last send
/// (R-DS1): a fleet's schedule is never raised past `limit / (window +
/// this)`. Its sends leave from several processes, each after a round trip
/// to the shared store (see [`ROLLING_MARGIN_SHARED`]), so at `limit /
/// window` the limit + 1st of a window reaches it at the window's very
/// edge. Without it, a replica that read Flask-Limiter's moving window as
/// a fixed one (its own quarter of the answers showed no refill yet)
/// followed the even rate up to 20 a second and raised every replica to
/// it: the fleet sent 21 in a second every few seconds (refused 0.5–1.4 %
/// of 30–60 s), where the replicas that knew it rolled paced 19. One
/// interval of a 20-a-second pace; a per-hour window loses nothing.
pub(super) const SHARED_EDGE: Duration = Duration::from_millis(50);

/// A window length measured between two resets or window ends, to whole seconds
/// (windows are stated in seconds).
pub(super) fn round_window(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs_f64().round() as u64)
}

/// Answers in a row without quota headers after which the pacer stops
/// following the last advertisement.
pub(super) const QUOTA_GONE: u32 = 3;

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

impl Quota {
    /// The same window again: the bounds on its reset narrow to this
    /// answer's.
    fn same_window(self, said: Instant, earliest: Instant) -> Quota {
        let hi = self.hi.min(said);
        Quota {
            hi,
            lo: self.lo.max(earliest).min(hi),
            ..self
        }
    }

    /// A new window after this one: its length learned from the resets a
    /// window apart, its reset's bounds carried over from the old one's.
    fn next_window(
        self,
        adv: &Advertised,
        said: Instant,
        earliest: Instant,
        now: Instant,
    ) -> Quota {
        // Consecutive windows reset a window apart: to the second
        // when resets are Unix times, within one when they count
        // seconds (the old window's earliest reset is within its
        // rounding). Windows with no answer in them make a multiple:
        // the shortest seen is the window.
        let rounding = adv.granularity;
        let seen = round_window(said.saturating_duration_since(self.hi));
        let window = adv
            .window
            .or(match (self.window, seen.is_zero()) {
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
            lo = lo.max(self.last_sent + w);
            // The next window after the old one: what was known of
            // its earliest end carries over, so that bound narrows with
            // each window to the closest send before a reset. The latest
            // only for a window the provider states (`RateLimit-Policy`'s
            // `w`): a fixed window on its clock, each ending a window after
            // the last. A window only measured may be one that begins at
            // the first request after the last one ended (GitHub's, the
            // `limits` library's fixed window, Redis's `INCR` and
            // `EXPIRE`, none of which state it): it begins when that
            // request arrives, after the old window's latest end by the
            // way there, and held to that end plus a window, the next
            // window's first request met this one spent (a GitHub-like
            // search budget in CI: 1 of 27 refused after the first
            // window, the 11th of 10 in its window). There each window's
            // own answers bound its end: up to a round trip later than a
            // clock's window needs (20 a second in stated 1 s windows,
            // 40 ms away, were used at 0.978 so, 1.000 carried).
            if said < self.hi + w + rounding / 2 {
                if adv.window.is_some() {
                    hi = hi.min(self.hi + w);
                }
                lo = lo.max(self.lo + w);
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
            ..self
        }
    }

    /// The first window a provider states.
    fn first(
        adv: Advertised,
        said: Instant,
        earliest: Instant,
        sent_at: Instant,
        synthetic: bool,
        fleet: Option<FleetCount>,
    ) -> Quota {
        Quota {
            synthetic,
            advertised: adv,
            hi: said,
            lo: earliest,
            rate: None,
            trusted: true,
            missing: 0,
            last_sent: sent_at,
            window: adv.window,
            low_sent: sent_at,
            refills: 0,
            delivery: Delivery::new(sent_at, fleet),
            answers: 0,
            edge_refused: None,
        }
    }

    /// Judges what following the stated resets delivered (see
    /// [`DELIVERED_SHARE`]), once a measure spans enough windows. In a
    /// fleet (`fleet`: the shared slots taken now), this replica's answers
    /// and the times it saw the quota spent are its share of the fleet's,
    /// and judged as that share: judged as a whole, a quarter of a moving
    /// window's answers never fell short (nor a quarter of its spends
    /// reached [`SPENT_TIMES`]), and four replicas held each other to its
    /// misleading resets — 0.62–0.78 of it used in some runs (R-DS1).
    fn judge_delivery(&mut self, now: Instant, fleet: Option<FleetCount>) {
        let (Some(policy), Some(window)) = (self.advertised.policy_rate(), self.advertised.window)
        else {
            return;
        };
        let d = self.delivery;
        let span = now.saturating_duration_since(d.since);
        if span < window * SPENT_WINDOWS || self.rolling() {
            return;
        }
        let share = d.share(fleet);
        if share > 0.0
            && f64::from(d.spent) >= f64::from(SPENT_TIMES) * share
            && (d.served as f64) < DELIVERED_SHARE * policy * span.as_secs_f64() * share
        {
            self.refills = ROLLING_AFTER;
        }
        self.delivery = Delivery::new(now, fleet);
    }

    /// Whether the quota refills as it goes (a moving window), not at its
    /// stated reset.
    pub(super) fn rolling(&self) -> bool {
        self.refills >= ROLLING_AFTER
    }

    /// The time left to spend what remains over.
    fn spend_by(&self, now: Instant) -> Duration {
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
        let unsure = self.hi.saturating_duration_since(self.lo);
        match self.advertised.window {
            None if self.hi.saturating_duration_since(now) < unsure * 4 => {
                self.hi.saturating_duration_since(now)
            }
            _ if self.lo > now => self.lo - now,
            Some(_) => Duration::ZERO,
            None => self.hi.saturating_duration_since(now),
        }
    }
}

impl PacerCore {
    /// The rate this replica may raise a fleet's shared schedule to
    /// (R-DS1, R-SG1): AIMD's, never above what a stated quota allows a
    /// fleet — a rolling one's steady rate, a window's `limit / (window +`
    /// [`SHARED_EDGE`]`)`. The shared schedule paces every replica by the
    /// shared rate alone (not by each one's reading of the quota), so a
    /// replica's reading must not lift it past the quota: one sluice paces
    /// at the lower of AIMD's rate and the quota's, a fleet at the rate
    /// its replicas raise it to.
    pub fn fleet_raise(&self) -> f64 {
        let rate = self.aimd.rate();
        let Some(q) = self.rare.quota() else {
            return rate;
        };
        let cap = if q.advertised.family == crate::quota::Family::Bucket {
            None
        } else if q.rolling() {
            q.rate
        } else {
            match (q.advertised.limit, q.advertised.window) {
                (Some(limit), Some(window)) if limit > 0 => {
                    Some(limit as f64 / (window + SHARED_EDGE).as_secs_f64())
                }
                _ => None,
            }
        };
        cap.map_or(rate, |c| rate.min(c))
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
            return self.quota_missing();
        };
        if adv.family == crate::quota::Family::Bucket {
            return self.on_bucket(adv, sent_at, now);
        }
        // When the window resets, as this answer says: whole seconds may
        // be rounded up, so the true reset is within a second before it —
        // and a reset counted from when the provider answered is later
        // still by the time the answer took to come back (at most since
        // the send), so the earliest it may be is that much before.
        let said = now + adv.reset;
        let earliest = said
            .checked_sub(adv.granularity + now.saturating_duration_since(sent_at))
            .unwrap_or(now);
        // More remains, though the request was sent after the one that told
        // less, and the reset has not moved: the provider's window rolls.
        let refilled = self.rare.quota().copied().is_some_and(|q| {
            adv.remaining > q.advertised.remaining
                && sent_at > q.low_sent
                && said < q.hi + adv.granularity / 2
        });
        let mut q = match self.rare.quota().copied() {
            // The same window: no more remains than before, and the request
            // was sent before the latest the window may end. (Not judged by
            // the reset it states: rounded to whole seconds from an answer
            // that came back late, a reset in the same window can read a
            // whole second later.)
            Some(q) if adv.remaining <= q.advertised.remaining && sent_at < q.hi => {
                q.same_window(said, earliest)
            }
            // A new window began between the last answer's send and this
            // one's.
            Some(q) => q.next_window(&adv, said, earliest, now),
            None => Quota::first(adv, said, earliest, sent_at, synthetic, self.fleet_count()),
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
        if self
            .rare
            .quota()
            .copied()
            .is_none_or(|old| adv.remaining != old.advertised.remaining)
        {
            q.low_sent = sent_at;
        }
        q.answers += 1;
        if refilled && q.refills + 1 == ROLLING_AFTER {
            // Now known to roll: a refusal met while it was read as a
            // fixed window (paced to a reset it does not keep) was the
            // reading's fault, not its word's.
            q.trusted = true;
        }
        q.refills += u32::from(refilled);
        q.delivery.served += 1;
        if adv.remaining == 0
            && self
                .rare
                .quota()
                .copied()
                .is_none_or(|old| old.advertised.remaining > 0)
        {
            q.delivery.spent += 1;
        }
        q.judge_delivery(now, self.fleet_count());
        let rolling = q.rolling().then(|| adv.policy_rate()).flatten();
        if let Some(refill) = rolling {
            // Rolling: paced evenly a hair under its rate, never held to a
            // reset it does not keep; spent, held until one request's
            // refill after this one was sent (an even pace's next is that
            // far apart already: counted from the answer, the hold would
            // add the round trip to every such gap).
            let margin = if self.sharing() {
                ROLLING_MARGIN_SHARED
            } else {
                ROLLING_MARGIN
            };
            q.rate = Some(refill * margin);
            let next = sent_at + Duration::from_secs_f64(1.0 / refill);
            if adv.remaining == 0 && next > now {
                fb.hold_until = self.hold(now, next, HoldCause::Refill);
                fb.hold_cause = HoldCause::Refill;
            }
        } else {
            let left = q.spend_by(now);
            q.rate = Advertised { reset: left, ..adv }.even_rate();
            if q.rate.is_none() {
                // Spent: every replica's quota, once its word is trusted;
                // before, a reset that may mislead (a moving window's is
                // an upper bound) holds this replica only.
                let cause = if q.trusted {
                    HoldCause::Spent
                } else {
                    HoldCause::Refill
                };
                fb.hold_until = self.hold(now, q.hi, cause);
                fb.hold_cause = cause;
            }
        }
        let before = self.gcra.interval();
        let (trusted, rate) = (q.trusted, q.rate);
        put(&mut self.rare.made().quota, q);
        if trusted {
            if let Some(r) = rate {
                self.aimd.follow(now, r);
            }
        }
        self.sync_interval();
        if q.rate.is_none() && rolling.is_none() {
            // Spent: the window is whole again at its reset, and its first
            // request goes then — not an interval after this window's last
            // (at the learned rate, up to a sixth of a short window lost
            // each time: Discord's 5 a second were used at 0.87).
            self.gcra.due_by(q.hi);
        }
        fb.increased = self.gcra.interval() < before;
        fb
    }

    /// A budget that refills continuously (a leaky bucket, a rolling
    /// allowance; R-PD1): paced at its refill rate — never above what it
    /// told, so never probing past it (R-PD6) — and, when nothing remains,
    /// held until one request's worth has refilled. There is no window to
    /// learn: its word is whole in every answer.
    fn on_bucket(&mut self, adv: Advertised, sent_at: Instant, now: Instant) -> Feedback {
        let mut fb = Feedback::default();
        let refill = adv.policy_rate();
        let trusted = self.rare.quota().copied().is_none_or(|q| q.trusted);
        let whole = now + adv.reset;
        let q = Quota {
            advertised: adv,
            hi: whole,
            lo: whole,
            last_sent: sent_at,
            window: adv.window,
            synthetic: false,
            rate: refill.filter(|_| adv.remaining > 0),
            trusted,
            missing: 0,
            low_sent: sent_at,
            refills: 0,
            delivery: Delivery::new(sent_at, None),
            answers: 0,
            edge_refused: None,
        };
        if adv.remaining == 0 {
            let one = refill.map_or(adv.reset, |r| Duration::from_secs_f64(1.0 / r));
            fb.hold_until = self.hold(now, now + one, HoldCause::Refill);
            fb.hold_cause = HoldCause::Refill;
        }
        let before = self.gcra.interval();
        put(&mut self.rare.made().quota, q);
        if let (true, Some(r)) = (trusted, q.rate) {
            self.aimd.follow(now, r);
        }
        self.sync_interval();
        fb.increased = self.gcra.interval() < before;
        fb
    }

    /// An answer with no quota headers: a quota that stops being stated
    /// is dropped after [`QUOTA_GONE`] such answers.
    fn quota_missing(&mut self) -> Feedback {
        let mut fb = Feedback::default();
        if let Some(q) = self.rare.quota_mut() {
            q.missing += 1;
            if q.missing >= QUOTA_GONE {
                self.rare.clear(|r| &mut r.quota);
                self.sync_interval();
                fb.increased = true;
            }
        }
        fb
    }

    /// A 429 said its window ends at `end`. A window after the last such
    /// end, the distance between them is the window and the answers sent
    /// in between the quota; learned, it is paced like an advertised one
    /// (a fresh trust: a provider whose window changed is learned anew).
    pub(super) fn learn_window(&mut self, end: Instant, wait: Duration) {
        let parts = self.rare.made();
        let w = &mut **parts.window.get_or_insert_with(Box::default);
        if let Some(prev) = w.boundary {
            let window = round_window(end.saturating_duration_since(prev));
            // A fixed window's 429 sends us to its end, a large part of the
            // window away; a token bucket's short Retry-Afters (a second)
            // at a steady interval are not a window.
            let long = |held: Duration| held >= Duration::from_secs(2) && held * 4 >= window;
            if window >= Duration::from_secs(2) && w.since > 0 && long(w.held) && long(wait) {
                w.learned = Some((w.since, window, end, 0));
                if parts.quota.as_deref().is_some_and(|q| q.synthetic) {
                    parts.quota = None;
                }
            }
        }
        w.boundary = Some(end);
        w.held = wait;
        w.since = 0;
    }

    /// The quota a learned window stands for now, as if advertised.
    pub(super) fn learned_advert(&self, now: Instant) -> Option<Advertised> {
        let (limit, window, mut start, mut used) = self.rare.window()?.learned?;
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
}

//! Simulated providers and client-side pacers on tokio's paused clock: the
//! ground on which sluice's pacer is compared with the in-client pacers
//! users know (the bench `bench_pacers`) and held to its bounds (the
//! `convergence` tests).
//!
//! Exact and repeatable: no sockets, no wall clock, and the only randomness
//! is a seeded generator, so a scenario gives the same figures on every run
//! and machine. Each scenario gates naive clients (no backoff of their own)
//! with one contender and measures at the provider — the side that counts.
//!
//! Contenders:
//! * [`Sluice`] — `sluice_policy`'s pacer (GCRA + AIMD), the exact code the
//!   proxy runs;
//! * [`Aws`] — a re-implementation of the AWS SDKs' adaptive retry mode's
//!   client rate limiter, after botocore's `retries/adaptive.py`: CUBIC with
//!   C = 0.4 and β = 0.7, a token bucket with a 0.5 req/s floor and a
//!   capacity of one second, the response rate smoothed (0.8) over 0.5 s
//!   buckets, off until the first throttle, every throttled response
//!   cutting to β × min(measured rate, current rate), and the new rate
//!   capped at 2 × the measured rate. Like botocore, it takes as throttles
//!   only answers whose error code says so (`Throttling`,
//!   `TooManyRequestsException`, `SlowDown`…): a provider's 429 is
//!   assumed to carry one, while a bare 503 is a transient error to
//!   botocore — retried, never a cut — and counts as a success for the
//!   rate (its `_on_receiving_response`);
//! * [`AutoThrottle`] — Scrapy's AutoThrottle (start delay 5 s, target
//!   concurrency 1, delay = max(latency / target, (delay + latency /
//!   target) / 2), non-200 answers never shorten the delay).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice_policy::pacer::shared::{AdmitFuture, FleetRefusal};
use sluice_policy::pacer::{
    PacerShared, Proposal, SharedAdmit, SharedBudget, SharedChange, SharedView, SHARED_SLACK,
};
use sluice_policy::{Outcome, ProviderSettings};
use tokio::time::Instant;

/// Every simulated answer's base latency.
pub const LATENCY: Duration = Duration::from_millis(40);

/// How a simulated provider behaves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Behaviour {
    /// A hidden token bucket (burst = limit / 2, at least 2): over it, this
    /// status without `Retry-After` (429, or a bare 503).
    Bucket {
        /// The status over the limit.
        over: u16,
    },
    /// A hidden token bucket with this burst (the commonest API limiter
    /// has a small one: 2, 5 or 10), a bare 429 over it.
    SmallBurst {
        /// Its burst.
        burst: u32,
    },
    /// No limit worth the name (a token bucket at the limit given, set far
    /// above demand), but this share of answers is a bare 503 at random,
    /// whatever the load.
    Noise {
        /// Share of random 503s.
        share: f64,
    },
    /// Like `Noise`, but this share of requests is heavier: `extra` more
    /// latency, uniformly between the two bounds, whatever the load.
    Heavy {
        /// Share of heavy requests.
        share: f64,
        /// Least extra latency, ms.
        min_ms: u64,
        /// Most extra latency, ms.
        max_ms: u64,
    },
    /// A provider that never refuses but serves at most `limit` requests a
    /// second, in arrival order: pushed past it, every answer slows down.
    Queue,
    /// nginx's `limit_req` with `burst=N nodelay`: a token bucket of N + 1
    /// (the request itself and N more at once), a bare 503 over it.
    LimitReq {
        /// Its `burst`.
        burst: u32,
    },
    /// nginx's `limit_req` with `burst=N` and no `nodelay`: requests over
    /// the rate wait their turn (at one per 1/rate) while at most N are
    /// waiting; past that, a bare 503 at once.
    LimitReqDelay {
        /// Its `burst`.
        burst: u32,
    },
    /// A hidden token bucket like `Bucket`, answering 429 with
    /// `Retry-After: secs` over it.
    Named {
        /// The `Retry-After` it sends, whole seconds.
        secs: u64,
        /// Its burst, if not half a second of the limit (the commonest
        /// API limiter has a small one: 2, 5 or 10).
        burst: Option<u32>,
    },
    /// HAProxy's stick table with `http_req_rate(1s)`: every request,
    /// refused ones too, is counted in a sliding one-second window (the
    /// last whole second weighted by how much of it is still inside, as
    /// HAProxy's `freq_ctr` does); over the limit, 429 without
    /// `Retry-After`. A client that keeps sending over it keeps its own
    /// window full.
    Sliding,
    /// The `limits` library's moving window (Flask-Limiter's
    /// `moving-window`, slowapi): a log of the accepted requests of the
    /// last second; a request is accepted while fewer than the limit are
    /// in it (refusals are not logged); over it, 429 without `Retry-After`.
    MovingLog,
    /// The `limits` library's fixed window in memory (Flask-Limiter's
    /// default): a one-second window that begins at the first request
    /// after the last one expired, not on the clock; over the limit, 429
    /// without `Retry-After`.
    LazyWindow,
    /// A fixed-window quota: `limit × window` requests per window (windows
    /// from the start); over it, 429 with `Retry-After` (whole seconds) to
    /// the window's end. With `advertise`, every answer carries
    /// `RateLimit-Policy` and `RateLimit` (delta seconds, rounded up), the
    /// quota multiplied by `lie`.
    Window {
        /// The window.
        window: Duration,
        /// Whether answers advertise the quota.
        advertise: bool,
        /// What it advertises over what it allows (1: the truth).
        lie: u32,
    },
}

/// One answer the provider gave.
#[derive(Debug, Clone, Copy)]
pub struct Answer {
    /// When the request arrived.
    pub at: Instant,
    /// The status.
    pub status: u16,
    /// Time to the answer.
    pub latency: Duration,
    /// `Retry-After`, whole seconds, if any.
    pub retry_after: Option<u64>,
    /// The advertised quota: (policy quota, window s, remaining, reset s).
    pub advert: Option<(u64, u64, u64, u64)>,
}

impl Answer {
    /// The answer's headers, as a real provider would send them.
    pub fn headers(&self) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        if let Some(ra) = self.retry_after {
            h.insert(http::header::RETRY_AFTER, ra.into());
        }
        if let Some((q, w, r, t)) = self.advert {
            if let (Ok(p), Ok(l)) = (
                format!("\"w\";q={q};w={w}").parse(),
                format!("\"w\";r={r};t={t}").parse(),
            ) {
                h.insert("ratelimit-policy", p);
                h.insert("ratelimit", l);
            }
        }
        h
    }
}

/// A hidden limit: a token bucket refilled at `rate` up to `burst`.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket at `now`.
    pub fn new(rate: f64, burst: f64, now: Instant) -> Self {
        TokenBucket {
            rate,
            burst,
            tokens: burst,
            last: now,
        }
    }

    /// Moves the limit; tokens beyond the new burst are lost.
    pub fn set(&mut self, rate: f64, burst: f64) {
        self.rate = rate;
        self.burst = burst;
        self.tokens = self.tokens.min(burst);
    }

    /// The refill rate.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// Takes a token for a request arriving at `now`, if there is one.
    pub fn take(&mut self, now: Instant) -> bool {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + dt * self.rate).min(self.burst);
        let took = self.tokens >= 1.0;
        if took {
            self.tokens -= 1.0;
        }
        took
    }
}

/// A seeded generator of uniform numbers (xorshift64*): repeatable.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(0x9E37_79B9_7F4A_7C15 ^ seed.wrapping_mul(0xD1B5_4A32_D192_ED03))
    }

    /// A uniform number in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The burst a simulated limit allows: half a second of it, at least 2.
fn burst_of(limit: f64) -> f64 {
    (limit / 2.0).ceil().max(2.0)
}

/// The burst of `behaviour`'s bucket at `limit`.
fn burst_for(behaviour: Behaviour, limit: f64) -> f64 {
    match behaviour {
        Behaviour::LimitReq { burst } => f64::from(burst) + 1.0,
        Behaviour::SmallBurst { burst } => f64::from(burst),
        Behaviour::Named {
            burst: Some(burst), ..
        } => f64::from(burst),
        _ => burst_of(limit),
    }
}

/// A simulated provider.
#[derive(Debug)]
pub struct Provider {
    behaviour: Behaviour,
    bucket: TokenBucket,
    /// When the queue's server is next free.
    free_at: Instant,
    rng: Rng,
    log: Vec<Answer>,
    /// The limit (requests per second) and, for `Window`, when windows
    /// began and the current window's number and count.
    limit: f64,
    started: Instant,
    window_at: (u64, u64),
    /// `Sliding`: the current second's number, its count and the
    /// previous second's.
    sliding: (u64, f64, f64),
    /// `MovingLog`: the accepted requests of the last second;
    /// `LazyWindow`: its window's start and count in `lazy`.
    moving: std::collections::VecDeque<Instant>,
    lazy: Option<(Instant, u64)>,
    /// Answers take between half and one and a half times [`LATENCY`]
    /// (seeded), instead of exactly it.
    jitter: bool,
}

impl Provider {
    /// A provider with this behaviour and limit, starting full at `now`;
    /// `seed` picks its random answers.
    pub fn new(behaviour: Behaviour, limit: f64, now: Instant, seed: u64) -> Self {
        Provider {
            behaviour,
            bucket: TokenBucket::new(limit, burst_for(behaviour, limit), now),
            free_at: now,
            rng: Rng::new(seed),
            log: Vec::new(),
            limit,
            started: now,
            window_at: (0, 0),
            sliding: (0, 0.0, 0.0),
            moving: std::collections::VecDeque::new(),
            lazy: None,
            jitter: false,
        }
    }

    /// Answers take a seeded, uniformly random latency between half and
    /// one and a half times [`LATENCY`].
    pub fn with_jitter(mut self, jitter: bool) -> Self {
        self.jitter = jitter;
        self
    }

    /// The base latency of the next answer.
    fn latency(&mut self) -> Duration {
        if self.jitter {
            LATENCY.mul_f64(0.5 + self.rng.uniform())
        } else {
            LATENCY
        }
    }

    /// Moves the hidden limit.
    pub fn set_limit(&mut self, limit: f64) {
        self.bucket.set(limit, burst_for(self.behaviour, limit));
        self.limit = limit;
    }

    /// Answers a request arriving at `now`.
    pub fn answer(&mut self, now: Instant) -> Answer {
        if let Behaviour::Window {
            window,
            advertise,
            lie,
        } = self.behaviour
        {
            let quota = (self.limit * window.as_secs_f64()).round() as u64;
            let index = ((now - self.started).as_secs_f64() / window.as_secs_f64()) as u64;
            if index != self.window_at.0 {
                self.window_at = (index, 0);
            }
            let ok = self.window_at.1 < quota;
            if ok {
                self.window_at.1 += 1;
            }
            let ends = self.started + window * (index as u32 + 1);
            let left = ends - now;
            let reset = left.as_secs() + u64::from(left.subsec_nanos() > 0);
            let advertised = quota * u64::from(lie);
            let a = Answer {
                at: now,
                status: if ok { 200 } else { 429 },
                latency: LATENCY,
                retry_after: (!ok).then_some(reset),
                advert: advertise.then_some((
                    advertised,
                    window.as_secs(),
                    advertised.saturating_sub(self.window_at.1),
                    reset,
                )),
            };
            self.log.push(a);
            return a;
        }
        if let Behaviour::Sliding = self.behaviour {
            let t = (now - self.started).as_secs_f64();
            let second = t as u64;
            let (at, curr, prev) = self.sliding;
            self.sliding = match second - at {
                0 => (at, curr, prev),
                1 => (second, 0.0, curr),
                _ => (second, 0.0, 0.0),
            };
            self.sliding.1 += 1.0;
            let (_, curr, prev) = self.sliding;
            let rate = curr + prev * (1.0 - t.fract());
            let ok = rate <= self.limit;
            return self.bare(now, ok);
        }
        if let Behaviour::MovingLog | Behaviour::LazyWindow = self.behaviour {
            let second = Duration::from_secs(1);
            let limit = self.limit.round() as u64;
            let ok = if self.behaviour == Behaviour::MovingLog {
                while self.moving.front().is_some_and(|&t| t + second <= now) {
                    self.moving.pop_front();
                }
                let ok = (self.moving.len() as u64) < limit;
                if ok {
                    self.moving.push_back(now);
                }
                ok
            } else {
                let (start, used) = match self.lazy {
                    Some((start, used)) if now < start + second => (start, used),
                    _ => (now, 0),
                };
                let ok = used < limit;
                self.lazy = Some((start, used + u64::from(ok)));
                ok
            };
            return self.bare(now, ok);
        }
        let took = self.bucket.take(now);
        let base = self.latency();
        let mut retry_after = None;
        let (status, latency) = match self.behaviour {
            Behaviour::Bucket { over } => (if took { 200 } else { over }, base),
            Behaviour::SmallBurst { .. } => (if took { 200 } else { 429 }, base),
            Behaviour::LimitReq { .. } => (if took { 200 } else { 503 }, base),
            Behaviour::Named { secs, .. } => {
                if !took {
                    retry_after = Some(secs);
                }
                (if took { 200 } else { 429 }, base)
            }
            Behaviour::Noise { share } => {
                let noisy = self.rng.uniform() < share;
                (if took && !noisy { 200 } else { 503 }, base)
            }
            Behaviour::Heavy {
                share,
                min_ms,
                max_ms,
            } => {
                let extra = if self.rng.uniform() < share {
                    let span = (max_ms - min_ms) as f64;
                    Duration::from_millis(min_ms + (self.rng.uniform() * span) as u64)
                } else {
                    Duration::ZERO
                };
                (if took { 200 } else { 429 }, base + extra)
            }
            Behaviour::LimitReqDelay { burst } => {
                // nginx's excess: requests ahead of this one in its queue.
                let slot = self.free_at.max(now);
                let ahead = (slot - now).as_secs_f64() * self.bucket.rate();
                if ahead > f64::from(burst) {
                    (503, base)
                } else {
                    self.free_at = slot + Duration::from_secs_f64(1.0 / self.bucket.rate());
                    (200, base + (slot - now))
                }
            }
            Behaviour::Queue => {
                let start = self.free_at.max(now);
                self.free_at = start + Duration::from_secs_f64(1.0 / self.bucket.rate());
                (200, base + (self.free_at - now))
            }
            Behaviour::Window { .. }
            | Behaviour::Sliding
            | Behaviour::MovingLog
            | Behaviour::LazyWindow => unreachable!("answered above"),
        };
        let a = Answer {
            at: now,
            status,
            latency,
            retry_after,
            advert: None,
        };
        self.log.push(a);
        a
    }

    /// A 200, or over the limit a bare 429 (no `Retry-After`, no headers),
    /// logged.
    fn bare(&mut self, now: Instant, ok: bool) -> Answer {
        let a = Answer {
            at: now,
            status: if ok { 200 } else { 429 },
            latency: self.latency(),
            retry_after: None,
            advert: None,
        };
        self.log.push(a);
        a
    }

    /// Figures over `[from, to)` against `limit`.
    pub fn figures(&self, from: Instant, to: Instant, limit: f64) -> Figures {
        let seen: Vec<_> = self
            .log
            .iter()
            .filter(|a| a.at >= from && a.at < to)
            .collect();
        let ok = seen.iter().filter(|a| a.status == 200).count();
        let mut lat: Vec<_> = seen.iter().map(|a| a.latency).collect();
        lat.sort();
        let secs = (to - from).as_secs_f64();
        Figures {
            ok_per_sec: ok as f64 / secs,
            goodput: ok as f64 / secs / limit,
            refused_share: (seen.len() - ok) as f64 / seen.len().max(1) as f64,
            attempts: seen.len(),
            median_latency: lat.get(lat.len() / 2).copied().unwrap_or_default(),
        }
    }

    /// Overshoots over `[from, to)`: runs of refused answers, a run ending
    /// once `gap` passes without one (a failed probe's refusals and the
    /// hold they bring are one overshoot).
    pub fn overshoots(&self, from: Instant, to: Instant, gap: Duration) -> usize {
        let mut last: Option<Instant> = None;
        let mut runs = 0;
        for a in self
            .log
            .iter()
            .filter(|a| a.at >= from && a.at < to && a.status != 200)
        {
            if last.is_none_or(|l| a.at.saturating_duration_since(l) >= gap) {
                runs += 1;
            }
            last = Some(a.at);
        }
        runs
    }
}

/// What the provider saw over a span.
#[derive(Debug, Clone, Copy)]
pub struct Figures {
    /// Successes per second.
    pub ok_per_sec: f64,
    /// Successes per second as a share of the limit.
    pub goodput: f64,
    /// Share of attempts answered other than 200 (429, 503).
    pub refused_share: f64,
    /// Attempts seen.
    pub attempts: usize,
    /// Median time to the answer.
    pub median_latency: Duration,
}

/// A client-side gate: wait before sending, learn from the answer.
pub trait Gate: Send + Sync + 'static {
    /// Waits for the request's turn; returns when it was let go.
    fn before_send(self: Arc<Self>) -> impl std::future::Future<Output = Instant> + Send;
    /// Learns from the answer to a request let go at `sent_at`.
    fn on_response(&self, sent_at: Instant, answer: &Answer);
}

// ------------------------------------------------------------------ sluice

/// sluice's pacer.
#[derive(Debug)]
pub struct Sluice(pub Arc<PacerShared>);

impl Sluice {
    /// A cold pacer with these settings.
    pub fn new(settings: &ProviderSettings) -> Arc<Self> {
        Arc::new(Sluice(PacerShared::new(settings)))
    }
}

impl Gate for Sluice {
    async fn before_send(self: Arc<Self>) -> Instant {
        loop {
            match self.0.acquire().await {
                Ok(at) => return at,
                // Refused (queue wait): a naive client just asks again.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    }
    fn on_response(&self, sent_at: Instant, answer: &Answer) {
        let headers = answer.headers();
        let outcome = Outcome::of(
            http::StatusCode::from_u16(answer.status).expect("a status"),
            &headers,
            std::time::SystemTime::now(),
        );
        let quota = sluice_policy::quota::advertised(&headers, std::time::SystemTime::now());
        self.0.answered(
            Some(outcome),
            sent_at,
            Some(answer.latency),
            0,
            Some(quota),
            None,
        );
    }
}

/// A budget shared by replicas, in memory: the proxy's four Redis scripts
/// (`proxy/src/shared`) on the paused clock, each call a millisecond's
/// round trip.
#[derive(Debug, Default)]
pub struct SharedMemory {
    state: Mutex<SharedState>,
    replicas: u32,
}

#[derive(Debug, Default)]
struct SharedState {
    tat: Option<Instant>,
    rate: Option<f64>,
    limit: Option<f64>,
    hold: Option<Instant>,
    cut: Option<Instant>,
    raised: Option<Instant>,
    admitted: u64,
    /// Admissions when the last hold began.
    held: Option<u64>,
    /// The last hold's length.
    hold_len: Option<Duration>,
    /// The last refusal after a hold: when, after the hold before it,
    /// admissions between; and its number.
    refusal: Option<(Instant, Duration, u64, u64)>,
}

/// A shared store's round trip.
const SHARED_RTT: Duration = Duration::from_millis(1);

impl SharedMemory {
    /// One budget for `replicas` replicas.
    pub fn new(replicas: u32) -> Arc<Self> {
        Arc::new(SharedMemory {
            state: Mutex::default(),
            replicas,
        })
    }

    /// `replicas` sluice pacers sharing one budget, their wake-ups for a
    /// shared slot spread by a generator seeded from `seed`.
    pub fn fleet(replicas: u32, settings: &ProviderSettings, seed: u64) -> Vec<Arc<Sluice>> {
        let budget = SharedMemory::new(replicas);
        (0..replicas)
            .map(|i| {
                let s = Sluice::new(settings);
                s.0.set_budget(Some(budget.clone() as Arc<dyn SharedBudget>));
                // Seeded: the fleet's wake-ups spread the same on every run.
                s.0.seed_spread(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(i) << 40);
                s
            })
            .collect()
    }

    fn admit_now(&self, proposal: Proposal, now: Instant) -> SharedAdmit {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.rate.is_none() {
            s.rate = Some(proposal.rate);
            s.limit = s.limit.or(proposal.limit);
        }
        let rate = s.rate.unwrap_or(proposal.rate);
        let tat = s.tat.unwrap_or(now);
        let hold = s.hold.unwrap_or(now);
        let at = tat.max(hold).max(now);
        let admitted = at <= now;
        if admitted {
            let slack = SHARED_SLACK.min(Duration::from_secs_f64(0.5 / rate));
            let due = tat.max(hold).max(now - slack);
            s.tat = Some(due + Duration::from_secs_f64(f64::from(proposal.units.max(1)) / rate));
            s.admitted += u64::from(proposal.units.max(1));
        }
        SharedAdmit {
            admitted,
            wait: at - now,
            view: SharedView {
                rate,
                limit: s.limit,
                hold: s.hold.map(|h| h.saturating_duration_since(now)),
                admitted: s.admitted,
                allowance: None,
                refusal: s.refusal.map(|(at, after, sent, id)| FleetRefusal {
                    id,
                    ago: now.saturating_duration_since(at),
                    after,
                    sent,
                }),
                held: s.hold_len,
            },
        }
    }

    fn apply(&self, change: SharedChange, now: Instant) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match change {
            SharedChange::Cut {
                sent_at,
                rate,
                limit,
            } => {
                if s.cut.is_some_and(|c| sent_at <= c) {
                    return;
                }
                if s.rate.is_none_or(|r| rate < r) {
                    s.rate = Some(rate);
                }
                s.cut = Some(now);
                if limit.is_some() {
                    s.limit = limit;
                }
            }
            SharedChange::Raise { rate, limit, every } => {
                let last = s.raised.max(s.cut);
                if s.rate.is_some_and(|r| rate <= r)
                    || last.is_some_and(|l| now.saturating_duration_since(l) < every)
                {
                    return;
                }
                s.rate = Some(rate);
                s.raised = Some(now);
                s.limit = limit;
            }
            SharedChange::Hold { until, .. } => {
                // A new hold, the last one over: a refusal after it.
                if s.hold.is_none_or(|h| now >= h) {
                    if let (Some(h), Some(held)) = (s.hold, s.held) {
                        let id = s.refusal.map_or(1, |r| r.3 + 1);
                        s.refusal = Some((now, now - h, s.admitted - held, id));
                    }
                    s.held = Some(s.admitted);
                }
                if s.hold.is_none_or(|h| until > h) {
                    s.hold = Some(until);
                    s.hold_len = Some(until.saturating_duration_since(now));
                }
            }
        }
    }
}

impl SharedBudget for SharedMemory {
    fn admit(&self, proposal: Proposal) -> AdmitFuture<'_> {
        Box::pin(async move {
            tokio::time::sleep(SHARED_RTT / 2).await;
            let answer = self.admit_now(proposal, Instant::now());
            tokio::time::sleep(SHARED_RTT / 2).await;
            Some(answer)
        })
    }

    fn report(&self, change: SharedChange) {
        // Fire and forget, as the proxy's are; applied half a round trip on
        // (`Hold`'s end is absolute, as the proxy sends it relative to now).
        self.apply(change, Instant::now() + SHARED_RTT / 2);
    }

    fn replicas(&self) -> u32 {
        self.replicas
    }

    fn retry_every(&self) -> Duration {
        Duration::from_secs(1)
    }
}

// ------------------------------------------------------------ AWS adaptive

struct Cubic {
    w_max: f64,
    k: f64,
    last_fail: f64,
}

impl Cubic {
    const C: f64 = 0.4;
    const BETA: f64 = 0.7;
    fn zero_point(w_max: f64) -> f64 {
        (w_max * (1.0 - Self::BETA) / Self::C).cbrt()
    }
    fn success(&self, t: f64) -> f64 {
        Self::C * (t - self.last_fail - self.k).powi(3) + self.w_max
    }
    fn error(&mut self, rate: f64, t: f64) -> f64 {
        self.w_max = rate;
        self.k = Self::zero_point(rate);
        self.last_fail = t;
        rate * Self::BETA
    }
}

struct AwsState {
    epoch: Instant,
    enabled: bool,
    cubic: Cubic,
    // token bucket
    fill_rate: f64,
    max_rate: f64,
    capacity: f64,
    max_capacity: f64,
    last_refill: Option<f64>,
    // rate clocker
    measured: f64,
    last_bucket: f64,
    count: f64,
}

impl AwsState {
    fn t(&self, now: Instant) -> f64 {
        now.saturating_duration_since(self.epoch).as_secs_f64()
    }
    fn refill(&mut self, t: f64) {
        if let Some(last) = self.last_refill {
            self.capacity = (self.capacity + (t - last) * self.fill_rate).min(self.max_capacity);
        }
        self.last_refill = Some(t);
    }
    fn set_max_rate(&mut self, value: f64, t: f64) {
        self.refill(t);
        self.fill_rate = value.max(0.5);
        self.max_capacity = if value >= 1.0 { value.ceil() } else { 1.0 };
        self.capacity = self.capacity.min(self.max_capacity);
        self.max_rate = value;
    }
    fn record(&mut self, t: f64) -> f64 {
        let bucket = (t * 2.0).floor() / 2.0;
        self.count += 1.0;
        if bucket > self.last_bucket {
            let current = self.count / (bucket - self.last_bucket);
            self.measured = current * 0.8 + self.measured * 0.2;
            self.count = 0.0;
            self.last_bucket = bucket;
        }
        self.measured
    }
}

/// The AWS SDKs' adaptive rate limiter.
pub struct Aws(Mutex<AwsState>);

impl std::fmt::Debug for Aws {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Aws")
    }
}

impl Aws {
    /// A fresh limiter (off until the first throttle).
    pub fn new() -> Arc<Self> {
        let epoch = Instant::now();
        let mut s = AwsState {
            epoch,
            enabled: false,
            cubic: Cubic {
                w_max: 0.5,
                k: Cubic::zero_point(0.5),
                last_fail: 0.0,
            },
            fill_rate: 0.5,
            max_rate: 0.5,
            capacity: 0.0,
            max_capacity: 1.0,
            last_refill: None,
            measured: 0.0,
            last_bucket: 0.0,
            count: 0.0,
        };
        s.set_max_rate(1.0, 0.0);
        Arc::new(Aws(Mutex::new(s)))
    }
}

impl Gate for Aws {
    async fn before_send(self: Arc<Self>) -> Instant {
        loop {
            let wait = {
                let mut s = self.0.lock().unwrap();
                let now = Instant::now();
                if !s.enabled {
                    return now;
                }
                let t = s.t(now);
                s.refill(t);
                if s.capacity >= 1.0 {
                    s.capacity -= 1.0;
                    return now;
                }
                (1.0 - s.capacity) / s.fill_rate
            };
            // At least a millisecond: a wait that rounds to zero would not
            // move the paused clock, and a capacity a hair under 1 would
            // never refill (botocore, on a real clock, always moves on).
            tokio::time::sleep(Duration::from_secs_f64(wait.max(0.001))).await;
        }
    }
    fn on_response(&self, _sent_at: Instant, answer: &Answer) {
        let status = answer.status;
        // botocore's throttling detector goes by the error code: a 429 is
        // taken to carry a throttling one; a bare 503 has none (a transient
        // error, retried), and the limiter treats it as a success.
        let throttled = status == 429;
        let mut s = self.0.lock().unwrap();
        let t = s.t(Instant::now());
        let measured = s.record(t);
        let new_rate = if !throttled {
            s.cubic.success(t)
        } else {
            let rate = if s.enabled {
                measured.min(s.max_rate)
            } else {
                measured
            };
            s.enabled = true;
            s.cubic.error(rate, t)
        };
        s.set_max_rate(new_rate.min(2.0 * measured), t);
    }
}

// ------------------------------------------------------------ AutoThrottle

#[derive(Debug)]
struct AutoThrottleState {
    delay: f64,
    next: Instant,
}

/// Scrapy's AutoThrottle.
#[derive(Debug)]
pub struct AutoThrottle(Mutex<AutoThrottleState>);

impl AutoThrottle {
    const START_DELAY: f64 = 5.0;
    const MAX_DELAY: f64 = 60.0;
    const TARGET_CONCURRENCY: f64 = 1.0;

    /// A fresh throttle at its start delay.
    pub fn new() -> Arc<Self> {
        Arc::new(AutoThrottle(Mutex::new(AutoThrottleState {
            delay: Self::START_DELAY,
            next: Instant::now(),
        })))
    }
}

impl Gate for AutoThrottle {
    async fn before_send(self: Arc<Self>) -> Instant {
        let at = {
            let mut s = self.0.lock().unwrap();
            let at = s.next.max(Instant::now());
            s.next = at + Duration::from_secs_f64(s.delay);
            at
        };
        tokio::time::sleep_until(at).await;
        at
    }
    fn on_response(&self, _sent_at: Instant, answer: &Answer) {
        let (status, latency) = (answer.status, answer.latency);
        let mut s = self.0.lock().unwrap();
        let target = latency.as_secs_f64() / Self::TARGET_CONCURRENCY;
        let new = ((s.delay + target) / 2.0).max(target).min(Self::MAX_DELAY);
        // Non-200 answers never shorten the delay.
        if status != 200 && new <= s.delay {
            return;
        }
        s.delay = new;
    }
}

// ------------------------------------------------------------------ runner

/// One scenario: a behaviour, the hidden limit of each phase, and how long
/// each phase lasts.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// How the provider behaves.
    pub behaviour: Behaviour,
    /// The hidden limit of each phase, in order.
    pub phases: Vec<f64>,
    /// Each phase's length.
    pub phase: Duration,
    /// Naive clients sending back to back.
    pub clients: usize,
    /// Seeds the provider's random answers.
    pub seed: u64,
    /// Latency varies around [`LATENCY`] (seeded), as a real provider's
    /// does: runs with different seeds then differ in timing.
    pub jitter: bool,
}

/// Runs `scenario` with `gate` on the paused clock (the caller's runtime
/// must be paused) and returns the provider and the instant it started.
pub async fn run<G: Gate>(gate: Arc<G>, scenario: &Scenario) -> (Provider, Instant) {
    run_fleet(&[gate], scenario).await
}

/// Like [`run`], with the clients spread over `gates` in turn: replicas,
/// each with its own pacer, in front of one provider.
pub async fn run_fleet<G: Gate>(gates: &[Arc<G>], scenario: &Scenario) -> (Provider, Instant) {
    let start = Instant::now();
    let provider = Arc::new(Mutex::new(
        Provider::new(scenario.behaviour, scenario.phases[0], start, scenario.seed)
            .with_jitter(scenario.jitter),
    ));
    let end = start + scenario.phase * scenario.phases.len() as u32;
    let mut clients = Vec::new();
    for i in 0..scenario.clients {
        let (gate, provider) = (gates[i % gates.len()].clone(), provider.clone());
        clients.push(tokio::spawn(async move {
            // Bounded: every loop ends at `end` on the paused clock.
            while Instant::now() < end {
                let sent_at = gate.clone().before_send().await;
                let a = provider.lock().unwrap().answer(Instant::now());
                tokio::time::sleep(a.latency).await;
                gate.on_response(sent_at, &a);
            }
        }));
    }
    for (i, limit) in scenario.phases.iter().enumerate().skip(1) {
        tokio::time::sleep_until(start + scenario.phase * i as u32).await;
        provider.lock().unwrap().set_limit(*limit);
    }
    for c in clients {
        c.await.expect("a client");
    }
    let p = std::mem::replace(
        &mut *provider.lock().unwrap(),
        Provider::new(Behaviour::Queue, 1.0, start, 0),
    );
    (p, start)
}

/// A current-thread runtime on the paused clock.
pub fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime")
}

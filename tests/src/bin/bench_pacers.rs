//! sluice's pacer against the in-client pacers users compare it with, on
//! the same simulated providers, side by side in one run.
//!
//! `cargo run --release -p sluice-tests --bin bench_pacers`
//!
//! Each contender gates 24 naive clients (no backoff of their own) sending
//! to a provider with a hidden token-bucket limit (burst = limit / 2, 40 ms
//! latency, 429 without `Retry-After` when over). The run is tokio's paused
//! clock: exact and repeatable, no sockets. Measured at the provider over
//! the last half of each phase: goodput (accepted per second / limit) and
//! the share of attempts that were 429.
//!
//! Contenders:
//! * **sluice** — `sluice_policy`'s pacer (GCRA + AIMD), the exact code the
//!   proxy runs;
//! * **AWS adaptive** — a re-implementation of the AWS SDKs' adaptive retry
//!   mode's client rate limiter, after botocore's `retries/adaptive.py`:
//!   CUBIC with C = 0.4 and β = 0.7, a token bucket with a 0.5 req/s floor
//!   and a capacity of one second, the response rate smoothed (0.8) over
//!   0.5 s buckets, off until the first throttle, every throttled response
//!   cutting to β × min(measured rate, current rate), and the new rate
//!   capped at 2 × the measured rate;
//! * **AutoThrottle** — Scrapy's AutoThrottle (start delay 5 s, target
//!   concurrency 1, delay = max(latency / target, (delay + latency /
//!   target) / 2), non-200 answers never shorten the delay).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice_policy::pacer::PacerShared;
use sluice_policy::{Outcome, ProviderSettings};
use tokio::time::Instant;

const LATENCY: Duration = Duration::from_millis(40);
const CLIENTS: usize = 24;
const PHASE: Duration = Duration::from_secs(240);

/// The provider's hidden limit.
struct Provider {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
    log: Vec<(Instant, bool)>,
}

impl Provider {
    fn set(&mut self, rate: f64) {
        self.rate = rate;
        self.burst = (rate / 2.0).ceil().max(2.0);
        self.tokens = self.tokens.min(self.burst);
    }

    fn take(&mut self, now: Instant) -> bool {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + dt * self.rate).min(self.burst);
        let ok = self.tokens >= 1.0;
        if ok {
            self.tokens -= 1.0;
        }
        self.log.push((now, ok));
        ok
    }
}

/// A client-side gate: wait before sending, learn from the answer.
trait Gate: Send + Sync + 'static {
    fn before_send(self: Arc<Self>) -> impl std::future::Future<Output = Instant> + Send;
    fn on_response(&self, sent_at: Instant, throttled: bool, latency: Duration);
}

// ------------------------------------------------------------------ sluice

struct Sluice(Arc<PacerShared>);

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
    fn on_response(&self, sent_at: Instant, throttled: bool, latency: Duration) {
        let outcome = if throttled {
            Outcome::Throttled {
                status: 429,
                retry_after: None,
            }
        } else {
            Outcome::Success
        };
        self.0.feedback(Some(outcome), sent_at, Some(latency));
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

struct Aws(Mutex<AwsState>);

impl Aws {
    fn new() -> Self {
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
        Aws(Mutex::new(s))
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
            tokio::time::sleep(Duration::from_secs_f64(wait)).await;
        }
    }
    fn on_response(&self, _sent_at: Instant, throttled: bool, _latency: Duration) {
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

struct AutoThrottleState {
    delay: f64,
    next: Instant,
}

struct AutoThrottle(Mutex<AutoThrottleState>);

impl AutoThrottle {
    const START_DELAY: f64 = 5.0;
    const MAX_DELAY: f64 = 60.0;
    const TARGET_CONCURRENCY: f64 = 1.0;
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
    fn on_response(&self, _sent_at: Instant, throttled: bool, latency: Duration) {
        let mut s = self.0.lock().unwrap();
        let target = latency.as_secs_f64() / Self::TARGET_CONCURRENCY;
        let new = ((s.delay + target) / 2.0).max(target).min(Self::MAX_DELAY);
        // Non-200 answers never shorten the delay.
        if throttled && new <= s.delay {
            return;
        }
        s.delay = new;
    }
}

// ------------------------------------------------------------------ runner

struct Figures {
    goodput: f64,
    throttled: f64,
}

async fn run<G: Gate>(gate: Arc<G>, phases: &[f64]) -> Figures {
    let start = Instant::now();
    let provider = Arc::new(Mutex::new(Provider {
        rate: 0.0,
        burst: 0.0,
        tokens: 0.0,
        last: start,
        log: Vec::new(),
    }));
    {
        let mut p = provider.lock().unwrap();
        p.set(phases[0]);
        p.tokens = p.burst;
    }
    let end = start + PHASE * phases.len() as u32;
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let (gate, provider) = (gate.clone(), provider.clone());
        clients.push(tokio::spawn(async move {
            while Instant::now() < end {
                let sent_at = gate.clone().before_send().await;
                let ok = provider.lock().unwrap().take(Instant::now());
                tokio::time::sleep(LATENCY).await;
                gate.on_response(sent_at, !ok, LATENCY);
            }
        }));
    }
    for (i, limit) in phases.iter().enumerate().skip(1) {
        tokio::time::sleep_until(start + PHASE * i as u32).await;
        provider.lock().unwrap().set(*limit);
    }
    for c in clients {
        c.await.unwrap();
    }
    let limit = *phases.last().unwrap();
    let p = provider.lock().unwrap();
    let from = end - PHASE / 2;
    let seen: Vec<_> = p
        .log
        .iter()
        .filter(|(t, _)| *t >= from && *t < end)
        .collect();
    let ok = seen.iter().filter(|(_, ok)| *ok).count();
    Figures {
        goodput: ok as f64 / (PHASE / 2).as_secs_f64() / limit,
        throttled: (seen.len() - ok) as f64 / seen.len().max(1) as f64,
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

fn main() {
    let scenarios: [(&str, &[f64]); 9] = [
        ("5 req/s", &[5.0]),
        ("20 req/s", &[20.0]),
        ("100 req/s", &[100.0]),
        ("5 → 2.5 req/s", &[5.0, 2.5]),
        ("20 → 10 req/s", &[20.0, 10.0]),
        ("100 → 50 req/s", &[100.0, 50.0]),
        ("5 → 10 req/s", &[5.0, 10.0]),
        ("20 → 40 req/s", &[20.0, 40.0]),
        ("100 → 200 req/s", &[100.0, 200.0]),
    ];
    println!(
        "hidden token-bucket limit, {CLIENTS} naive clients, {} ms latency; last half of {} s phases",
        LATENCY.as_millis(),
        PHASE.as_secs()
    );
    println!(
        "{:<16} | {:>22} | {:>22} | {:>22}",
        "limit", "sluice goodput / 429", "AWS adaptive", "AutoThrottle"
    );
    let mut sums = [(0.0, 0.0); 3];
    for (name, phases) in scenarios {
        let max = phases.iter().cloned().fold(0.0, f64::max);
        // sluice gets the owner's ceiling an operator would set: well above
        // the limit (4×), since the limit is what it must discover.
        let settings = ProviderSettings::with_ceiling(max * 4.0);
        let figures = [
            runtime().block_on(run(Arc::new(Sluice(PacerShared::new(&settings))), phases)),
            runtime().block_on(run(Arc::new(Aws::new()), phases)),
            runtime().block_on(run(
                Arc::new(AutoThrottle(Mutex::new(AutoThrottleState {
                    delay: AutoThrottle::START_DELAY,
                    next: Instant::now(),
                }))),
                phases,
            )),
        ];
        let cell = |f: &Figures| {
            format!(
                "{:6.1} % / {:6.2} %",
                f.goodput * 100.0,
                f.throttled * 100.0
            )
        };
        println!(
            "{name:<16} | {:>22} | {:>22} | {:>22}",
            cell(&figures[0]),
            cell(&figures[1]),
            cell(&figures[2])
        );
        for (s, f) in sums.iter_mut().zip(&figures) {
            s.0 += f.goodput / 9.0;
            s.1 += f.throttled / 9.0;
        }
    }
    let names = ["sluice", "AWS adaptive", "AutoThrottle"];
    println!();
    for (n, (g, t)) in names.iter().zip(sums) {
        println!(
            "{n:<13} mean goodput {:5.1} %, mean 429 share {:6.2} %",
            g * 100.0,
            t * 100.0
        );
    }
    let (sg, st) = sums[0];
    for (n, (g, t)) in names.iter().zip(sums).skip(1) {
        println!(
            "sluice vs {n}: goodput × {:.2}, 429 share ÷ {:.1}",
            sg / g,
            t / st.max(1e-9)
        );
    }
}

//! The pacer against a provider with a hidden token-bucket limit (R-AI1,
//! R-GC1): does it find the limit, and stay just under it?
//!
//! Pure and exact: tokio's paused clock, no sockets, no randomness, so the
//! figures are the same on every run and machine. Each scenario drives the
//! real `Pacer` layer with saturating demand (more clients than the limit
//! needs), and measures at the provider — the side that matters — over the
//! last half of a long phase:
//!
//! * goodput: accepted requests per second, as a share of the hidden limit
//!   (bound: ≥ 90 %);
//! * throttled share: 429s among the attempts the provider saw (≤ 3 %).
//!
//! The scenarios: hidden limits of 5, 20 and 100 req/s, and each of them
//! halving or doubling after the pacer has settled.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use sluice_policy::pacer::{PacerLayer, PacerShared, RateLimited};
use sluice_policy::ProviderSettings;
use tokio::time::Instant;
use tower::{Layer, ServiceExt};

/// The provider's hidden limit: a token bucket it does not announce.
struct HiddenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl HiddenBucket {
    fn new(rate: f64, now: Instant) -> Self {
        let burst = (rate / 2.0).ceil().max(2.0);
        HiddenBucket {
            rate,
            burst,
            tokens: burst,
            last: now,
        }
    }

    fn set_rate(&mut self, rate: f64) {
        self.rate = rate;
        self.burst = (rate / 2.0).ceil().max(2.0);
        self.tokens = self.tokens.min(self.burst);
    }

    fn take(&mut self, now: Instant) -> bool {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + dt * self.rate).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

struct Provider {
    bucket: HiddenBucket,
    /// (arrival, accepted) of every attempt the provider saw.
    log: Vec<(Instant, bool)>,
}

/// Figures over a window.
#[derive(Debug)]
struct Figures {
    goodput_share: f64,
    throttled_share: f64,
    attempts: usize,
    /// The pacer's rate and remembered limit at the end.
    rate_rps: f64,
    limit_rps: Option<f64>,
}

fn figures(
    log: &[(Instant, bool)],
    from: Instant,
    to: Instant,
    limit: f64,
    pacer: &PacerShared,
) -> Figures {
    let snap = pacer.snapshot(to);
    let seen: Vec<_> = log.iter().filter(|(t, _)| *t >= from && *t < to).collect();
    let accepted = seen.iter().filter(|(_, ok)| *ok).count();
    let secs = (to - from).as_secs_f64();
    Figures {
        goodput_share: accepted as f64 / secs / limit,
        throttled_share: (seen.len() - accepted) as f64 / seen.len().max(1) as f64,
        attempts: seen.len(),
        rate_rps: snap.rate_rps,
        limit_rps: snap.limit_rps,
    }
}

const PHASE: Duration = Duration::from_secs(240);
const LATENCY: Duration = Duration::from_millis(40);
const CLIENTS: usize = 24;

/// Runs `phases` of (hidden limit) back to back, each `PHASE` long, and
/// returns the figures of the last half of the last phase.
async fn scenario(phases: &[f64]) -> Figures {
    let max_limit = phases.iter().cloned().fold(0.0, f64::max);
    let settings = ProviderSettings::with_ceiling(max_limit * 4.0);
    let start = Instant::now();
    let provider = Arc::new(Mutex::new(Provider {
        bucket: HiddenBucket::new(phases[0], start),
        log: Vec::new(),
    }));
    let upstream = {
        let provider = provider.clone();
        tower::service_fn(move |_req: Request<()>| {
            let provider = provider.clone();
            async move {
                let now = Instant::now();
                let ok = {
                    let mut p = provider.lock().unwrap();
                    let ok = p.bucket.take(now);
                    p.log.push((now, ok));
                    ok
                };
                tokio::time::sleep(LATENCY).await;
                let status = if ok {
                    StatusCode::OK
                } else {
                    StatusCode::TOO_MANY_REQUESTS
                };
                let mut resp = Response::new(());
                *resp.status_mut() = status;
                Ok::<_, Infallible>(resp)
            }
        })
    };
    let shared = PacerShared::new(&settings);
    let pacer = PacerLayer::new(shared.clone()).layer(upstream);
    let end = start + PHASE * phases.len() as u32;
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let svc = pacer.clone();
        clients.push(tokio::spawn(async move {
            // Bounded: every loop ends at `end` on the paused clock.
            while Instant::now() < end {
                match svc.clone().oneshot(Request::new(())).await {
                    Ok(_) => {}
                    Err(e) => {
                        let wait = e
                            .downcast_ref::<RateLimited>()
                            .map_or(Duration::from_millis(100), |r| r.retry_after);
                        tokio::time::sleep(wait.max(Duration::from_millis(10))).await;
                    }
                }
            }
        }));
    }
    for (i, limit) in phases.iter().enumerate().skip(1) {
        tokio::time::sleep_until(start + PHASE * i as u32).await;
        provider.lock().unwrap().bucket.set_rate(*limit);
    }
    for c in clients {
        c.await.unwrap();
    }
    let last = *phases.last().unwrap();
    let log = &provider.lock().unwrap().log;
    figures(log, end - PHASE / 2, end, last, &shared)
}

fn check(name: &str, phases: &[f64], f: &Figures) {
    println!(
        "{name:>12}: limit {:>5} req/s → goodput {:>5.1} % of limit, throttled {:>4.2} % of {} attempts; \
         pacer ends at {:.2} req/s, throttling began at {:.2?}",
        phases.last().unwrap(),
        f.goodput_share * 100.0,
        f.throttled_share * 100.0,
        f.attempts,
        f.rate_rps,
        f.limit_rps,
    );
    assert!(
        f.goodput_share >= 0.90,
        "{name}: goodput {:.1} % < 90 %",
        f.goodput_share * 100.0
    );
    assert!(
        f.throttled_share <= 0.03,
        "{name}: throttled {:.2} % > 3 %",
        f.throttled_share * 100.0
    );
}

macro_rules! scenarios {
    ($($name:ident: $phases:expr;)*) => {$(
        #[tokio::test(start_paused = true)]
        async fn $name() {
            let phases: &[f64] = &$phases;
            let f = scenario(phases).await;
            check(stringify!($name), phases, &f);
        }
    )*};
}

scenarios! {
    steady_5: [5.0];
    steady_20: [20.0];
    steady_100: [100.0];
    halves_5: [5.0, 2.5];
    halves_20: [20.0, 10.0];
    halves_100: [100.0, 50.0];
    doubles_5: [5.0, 10.0];
    doubles_20: [20.0, 40.0];
    doubles_100: [100.0, 200.0];
}

//! The tower layers on tokio's paused clock: every instant asserted here is
//! exact, and no test sleeps for real.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use sluice_policy::attempt::Attempt;
use sluice_policy::breaker::{BreakerLayer, BreakerShared, Reason, State, Transition};
use sluice_policy::bulkhead::{BulkheadLayer, InFlight};
use sluice_policy::error::Cause;
use sluice_policy::error::{Upstream, UpstreamKind};
use sluice_policy::events::{Event, Observers};
use sluice_policy::pacer::{PacerLayer, Refusal};
use sluice_policy::park::watch::PROBE_FIRST_WAIT;
use sluice_policy::provider::PolicyOptions;
use sluice_policy::retry::Jitter;
use sluice_policy::run::{Envelope, RunHandle, StopReason};
use sluice_policy::stack::{provider_stack, ProviderService};
use sluice_policy::{Outcome, ProviderPolicy, ProviderSettings};
use tokio::time::{sleep, Instant};
use tower::{Layer, Service, ServiceExt};

/// What the scripted provider answers to its n-th request.
#[derive(Debug, Clone, Copy)]
struct Reply {
    status: u16,
    retry_after: Option<&'static str>,
    delay: Duration,
    error: Option<UpstreamKind>,
}

fn status(status: u16) -> Reply {
    Reply {
        status,
        retry_after: None,
        delay: Duration::ZERO,
        error: None,
    }
}

fn throttle(retry_after: &'static str) -> Reply {
    Reply {
        retry_after: Some(retry_after),
        ..status(429)
    }
}

type Seen = Arc<Mutex<Vec<(Instant, String)>>>;

/// A provider that answers from a script and records what it saw: the
/// instant each request arrived and its body (the test's request id).
#[derive(Clone)]
struct Provider {
    seen: Seen,
    script: Arc<dyn Fn(usize) -> Reply + Send + Sync>,
}

impl Provider {
    fn new(script: impl Fn(usize) -> Reply + Send + Sync + 'static) -> Self {
        Provider {
            seen: Arc::default(),
            script: Arc::new(script),
        }
    }

    fn arrivals(&self) -> Vec<(Instant, String)> {
        self.seen.lock().unwrap().clone()
    }
}

impl Service<Request<String>> for Provider {
    type Response = Response<()>;
    type Error = Cause;
    type Future = Pin<Box<dyn Future<Output = Result<Response<()>, Cause>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Cause>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<String>) -> Self::Future {
        let n = {
            let mut seen = self.seen.lock().unwrap();
            seen.push((Instant::now(), req.body().clone()));
            seen.len() - 1
        };
        let reply = (self.script)(n);
        Box::pin(async move {
            sleep(reply.delay).await;
            if let Some(kind) = reply.error {
                return Err(Upstream::new(kind, "scripted failure").into());
            }
            let mut resp = Response::new(());
            *resp.status_mut() = StatusCode::from_u16(reply.status).unwrap();
            if let Some(ra) = reply.retry_after {
                resp.headers_mut()
                    .insert(http::header::RETRY_AFTER, ra.parse().unwrap());
            }
            Ok(resp)
        })
    }
}

fn get(id: impl Into<String>) -> Request<String> {
    Request::get("http://provider.test/")
        .body(id.into())
        .unwrap()
}

/// Settings that keep the rate where the test puts it: no growth.
fn fixed_rate(rps: f64) -> ProviderSettings {
    let mut s = ProviderSettings::with_ceiling(rps * 10.0);
    s.start_rps = Some(rps);
    s.increase_window = Duration::from_secs(3600);
    s
}

type Evidence = Arc<Mutex<Vec<Transition>>>;

fn policy(settings: ProviderSettings) -> (Arc<ProviderPolicy>, Evidence) {
    let evidence: Evidence = Arc::default();
    let sink = evidence.clone();
    let policy = ProviderPolicy::new(
        "provider.test",
        settings.validated().unwrap(),
        PolicyOptions {
            observer: Some(Observers::of_transitions(move |t: &Transition| {
                sink.lock().unwrap().push(t.clone())
            })),
            jitter: Some(Jitter::Fixed(0.0)),
        },
    );
    (policy, evidence)
}

fn stack(policy: &Arc<ProviderPolicy>, provider: &Provider) -> ProviderService<String, ()> {
    provider_stack(policy, provider.clone())
}

// ---------------------------------------------------------------- pacer

/// R-GC2: waiters are admitted in arrival order, one interval apart.
#[tokio::test(start_paused = true)]
async fn fifo_admission_at_the_paced_rate() {
    let (policy, _) = policy(fixed_rate(1.0));
    let provider = Provider::new(|_| status(200));
    let svc = PacerLayer::new(policy.clone()).layer(provider.clone());
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..5 {
        tasks.push(tokio::spawn(svc.clone().oneshot(get(i.to_string()))));
        sleep(Duration::from_millis(1)).await;
    }
    for t in tasks {
        assert_eq!(t.await.unwrap().unwrap().status(), 200);
    }
    let seen = provider.arrivals();
    let ids: Vec<_> = seen.iter().map(|(_, id)| id.as_str()).collect();
    assert_eq!(ids, ["0", "1", "2", "3", "4"]);
    for (i, (at, _)) in seen.iter().enumerate() {
        assert_eq!(*at - t0, Duration::from_secs(i as u64), "request {i}");
    }
}

/// R-GC2, R-RA1: a hold applies to requests already waiting, and the first
/// of them goes exactly when the hold ends.
#[tokio::test(start_paused = true)]
async fn hold_applies_to_waiters_already_queued() {
    let (policy, _) = policy(fixed_rate(1.0));
    let provider = Provider::new(|n| match n {
        0 => Reply {
            delay: Duration::from_millis(100),
            ..throttle("5")
        },
        _ => status(200),
    });
    let svc = PacerLayer::new(policy.clone()).layer(provider.clone());
    let t0 = Instant::now();
    let first = tokio::spawn(svc.clone().oneshot(get("0")));
    sleep(Duration::from_millis(1)).await;
    // Queued at t0+1ms for the slot at t0+1s, before the 429 arrives.
    let second = tokio::spawn(svc.clone().oneshot(get("1")));
    sleep(Duration::from_millis(1)).await;
    let third = tokio::spawn(svc.clone().oneshot(get("2")));
    assert_eq!(first.await.unwrap().unwrap().status(), 429);
    second.await.unwrap().unwrap();
    third.await.unwrap().unwrap();
    let seen = provider.arrivals();
    // The 429 came back at t0+100ms with Retry-After: 5.
    assert_eq!(seen[1].0 - t0, Duration::from_millis(5100));
    // The rate was cut by the 429: the next waiter is one new interval later.
    let interval = policy.pacer.snapshot(Instant::now()).interval;
    assert!(interval > Duration::from_secs(1), "cut: {interval:?}");
    // (tokio's timer fires on whole milliseconds)
    let gap = seen[2].0 - seen[1].0;
    assert!(
        gap >= interval && gap < interval + Duration::from_millis(1),
        "{gap:?}"
    );
}

/// R-GC2: a request whose slot would come after `max_queue_wait` is refused
/// at once, carrying the wait it would have had.
#[tokio::test(start_paused = true)]
async fn bounded_wait_refuses_at_once_with_the_wait() {
    let mut settings = fixed_rate(1.0);
    settings.max_queue_wait = Duration::from_secs(2);
    let (policy, _) = policy(settings);
    let provider = Provider::new(|_| status(200));
    let svc = PacerLayer::new(policy.clone()).layer(provider.clone());
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..3 {
        tasks.push(tokio::spawn(svc.clone().oneshot(get(i.to_string()))));
        sleep(Duration::from_millis(1)).await;
    }
    // The fourth would go at t0+3s: more than 2 s from now.
    let asked = Instant::now();
    let err = svc.clone().oneshot(get("3")).await.unwrap_err();
    assert_eq!(Instant::now(), asked, "refused without waiting");
    let Cause::RateLimited(limited) = &err else {
        panic!("RateLimited: {err}")
    };
    assert_eq!(limited.refusal, Refusal::WaitTooLong);
    assert_eq!(limited.retry_after, (t0 + Duration::from_secs(3)) - asked);
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert_eq!(provider.arrivals().len(), 3);
}

/// R-GC2: a hold that pushes a waiter past its wait refuses it at once,
/// with the hold's end as the time to come back.
#[tokio::test(start_paused = true)]
async fn hold_past_the_queue_wait_refuses_waiters_at_once() {
    let mut settings = fixed_rate(1.0);
    settings.max_queue_wait = Duration::from_secs(2);
    let (policy, _) = policy(settings);
    let provider = Provider::new(|_| Reply {
        delay: Duration::from_millis(100),
        ..throttle("30")
    });
    let svc = PacerLayer::new(policy.clone()).layer(provider.clone());
    let t0 = Instant::now();
    let first = tokio::spawn(svc.clone().oneshot(get("0")));
    sleep(Duration::from_millis(1)).await;
    let err = svc.clone().oneshot(get("1")).await.unwrap_err();
    assert_eq!(Instant::now() - t0, Duration::from_millis(100));
    let Cause::RateLimited(limited) = &err else {
        panic!("RateLimited: {err}")
    };
    assert_eq!(limited.retry_after, Duration::from_secs(30));
    assert_eq!(first.await.unwrap().unwrap().status(), 429);
    assert_eq!(provider.arrivals().len(), 1);
}

/// A waiter whose client goes away leaves the queue: those behind it are
/// not held back by a ghost.
#[tokio::test(start_paused = true)]
async fn cancelled_waiters_leave_the_queue() {
    let (policy, _) = policy(fixed_rate(1.0));
    let provider = Provider::new(|_| status(200));
    let svc = PacerLayer::new(policy.clone()).layer(provider.clone());
    let t0 = Instant::now();
    svc.clone().oneshot(get("0")).await.unwrap();
    let ghost = tokio::spawn(svc.clone().oneshot(get("ghost")));
    sleep(Duration::from_millis(1)).await;
    let third = tokio::spawn(svc.clone().oneshot(get("2")));
    sleep(Duration::from_millis(1)).await;
    ghost.abort();
    third.await.unwrap().unwrap();
    let seen = provider.arrivals();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].1, "2");
    assert_eq!(seen[1].0 - t0, Duration::from_secs(1));
    assert_eq!(policy.pacer.snapshot(Instant::now()).queue_len, 0);
}

// -------------------------------------------------------------- breaker

fn breaker_settings() -> ProviderSettings {
    ProviderSettings {
        breaker_min_calls: 4,
        breaker_failure_ratio: 0.5,
        breaker_open_for: Duration::from_secs(5),
        breaker_half_open_probes: 2,
        ..ProviderSettings::default()
    }
}

fn is_open(err: &Cause) -> Duration {
    match err {
        Cause::CircuitOpen(open) => open.retry_after,
        other => panic!("CircuitOpen: {other}"),
    }
}

/// R-CB1, R-CB2: Closed → Open → HalfOpen → Closed, then HalfOpen → Open,
/// each transition published with its evidence.
#[tokio::test(start_paused = true)]
async fn breaker_cycle_with_evidence() {
    let (policy, evidence) = policy(breaker_settings());
    let provider = Provider::new(|n| match n {
        0..=3 => status(500),
        4 | 5 => status(200),
        _ => status(502),
    });
    let mut svc = BreakerLayer::new(policy.clone()).layer(provider.clone());
    for i in 0..4 {
        if i > 0 {
            sleep(Duration::from_secs(1)).await;
        }
        let resp = svc.ready().await.unwrap().call(get("x")).await.unwrap();
        assert_eq!(resp.status(), 500);
    }
    {
        let ev = evidence.lock().unwrap();
        assert_eq!(ev.len(), 1);
        let t = &ev[0];
        assert_eq!(
            (t.from, t.to, t.reason),
            (State::Closed, State::Open, Reason::FailureRate)
        );
        assert_eq!((t.calls, t.failures), (4, 4));
        assert_eq!(t.elapsed_ms, 3000);
        assert!(t.retry_budget_left.is_some());
    }
    // Open: fail fast with the time until half-open, provider untouched.
    let err = svc.ready().await.unwrap().call(get("x")).await.unwrap_err();
    assert_eq!(is_open(&err), Duration::from_secs(5));
    sleep(Duration::from_secs(2)).await;
    let err = svc.ready().await.unwrap().call(get("x")).await.unwrap_err();
    assert_eq!(is_open(&err), Duration::from_secs(3));
    assert_eq!(provider.arrivals().len(), 4);
    // Reset timeout: two probes succeed and close it.
    sleep(Duration::from_secs(3)).await;
    for _ in 0..2 {
        let resp = svc.ready().await.unwrap().call(get("probe")).await.unwrap();
        assert_eq!(resp.status(), 200);
    }
    {
        let ev = evidence.lock().unwrap();
        assert_eq!(ev.len(), 3);
        assert_eq!(
            (ev[1].from, ev[1].to, ev[1].reason, ev[1].elapsed_ms),
            (State::Open, State::HalfOpen, Reason::ResetTimeout, 5000)
        );
        assert_eq!(
            (ev[2].from, ev[2].to, ev[2].reason),
            (State::HalfOpen, State::Closed, Reason::ProbesSucceeded)
        );
        assert_eq!((ev[2].calls, ev[2].failures), (2, 0));
    }
    // Trip again; this time the probe fails and it opens again.
    for _ in 0..4 {
        svc.ready().await.unwrap().call(get("x")).await.unwrap();
    }
    sleep(Duration::from_secs(5)).await;
    let resp = svc.ready().await.unwrap().call(get("probe")).await.unwrap();
    assert_eq!(resp.status(), 502);
    let ev = evidence.lock().unwrap();
    let states: Vec<_> = ev.iter().map(|t| (t.from, t.to, t.reason)).collect();
    assert_eq!(
        states[3..],
        [
            (State::Closed, State::Open, Reason::FailureRate),
            (State::Open, State::HalfOpen, Reason::ResetTimeout),
            (State::HalfOpen, State::Open, Reason::ProbeFailed),
        ]
    );
    assert_eq!((ev[5].calls, ev[5].failures), (1, 1));
    assert_eq!(policy.breaker.recent().len(), 6);
}

/// R-CB1, R-PD3 (issue 35): a breaker opened by the provider's throttles
/// says so — its refusals carry `throttled`, answered as a throttle at the
/// edge — and one opened by failures does not.
#[tokio::test(start_paused = true)]
async fn a_breaker_opened_by_throttles_says_so() {
    for (code, throttled) in [(429, true), (500, false)] {
        let (policy, _evidence) = policy(breaker_settings());
        let provider = Provider::new(move |_| status(code));
        let mut svc = BreakerLayer::new(policy.clone()).layer(provider.clone());
        for _ in 0..4 {
            svc.ready().await.unwrap().call(get("x")).await.unwrap();
            sleep(Duration::from_millis(500)).await;
        }
        match svc.ready().await.unwrap().call(get("x")).await.unwrap_err() {
            Cause::CircuitOpen(open) => assert_eq!(open.throttled, throttled, "{code}"),
            other => panic!("CircuitOpen: {other}"),
        }
    }
}

/// R-CB2 (issue 36): a change to the provider's config closes an open
/// breaker at once — with evidence naming why — and forgets the window's
/// failures, so the next call reaches the provider; a closed breaker only
/// forgets its window.
#[tokio::test(start_paused = true)]
async fn a_config_change_clears_the_breaker() {
    let (policy, evidence) = policy(breaker_settings());
    let provider = Provider::new(|n| match n {
        0..=2 => status(500),
        _ => status(200),
    });
    let mut svc = BreakerLayer::new(policy.clone()).layer(provider.clone());
    for _ in 0..3 {
        svc.ready().await.unwrap().call(get("x")).await.unwrap();
    }
    // Three failures of four: one more would open it; cleared, it takes
    // four fresh calls to judge again.
    assert!(!policy.clear_breaker(), "it was closed");
    assert_eq!(policy.snapshot(Instant::now()).breaker.failures, 0);
    assert!(evidence.lock().unwrap().is_empty());
    let (policy, evidence) = policy_open();
    assert!(policy.clear_breaker());
    assert_eq!(policy.snapshot(Instant::now()).breaker.state, State::Closed);
    let t = evidence
        .lock()
        .unwrap()
        .last()
        .cloned()
        .expect("a transition");
    assert_eq!(
        (t.from, t.to, t.reason, t.reason.label()),
        (
            State::Open,
            State::Closed,
            Reason::ConfigChanged,
            "config_changed"
        )
    );
    let provider = Provider::new(|_| status(200));
    let mut svc = BreakerLayer::new(policy.clone()).layer(provider.clone());
    let resp = svc.ready().await.unwrap().call(get("x")).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(provider.arrivals().len(), 1);
}

/// A policy whose breaker four failures have opened.
fn policy_open() -> (Arc<ProviderPolicy>, Evidence) {
    let (policy, evidence) = policy(breaker_settings());
    let now = Instant::now();
    for _ in 0..4 {
        let permit = BreakerShared::acquire(&policy).expect("closed");
        permit.finish(Some(true));
    }
    assert_eq!(policy.snapshot(now).breaker.state, State::Open);
    (policy, evidence)
}

/// R-CB1: no verdict below the minimum number of calls, so a cold start
/// with a few failures does not open the breaker.
#[tokio::test(start_paused = true)]
async fn no_false_open_below_minimum_throughput() {
    let (policy, evidence) = policy(ProviderSettings::default());
    let provider = Provider::new(|_| status(500));
    let mut svc = BreakerLayer::new(policy.clone()).layer(provider.clone());
    for _ in 0..19 {
        svc.ready().await.unwrap().call(get("x")).await.unwrap();
    }
    assert!(evidence.lock().unwrap().is_empty());
    assert_eq!(policy.snapshot(Instant::now()).breaker.state, State::Closed);
    svc.ready().await.unwrap().call(get("x")).await.unwrap();
    assert_eq!(evidence.lock().unwrap().len(), 1, "the 20th call decides");
}

// ---------------------------------------------------------------- retry

/// R-RB2: retries are bounded by the ratio budget; when it is empty the
/// last upstream response goes back.
#[tokio::test(start_paused = true)]
async fn retries_stop_when_the_budget_is_empty() {
    let mut settings = ProviderSettings::with_ceiling(1000.0);
    settings.retry_ratio = 0.2;
    settings.retry_min_per_sec = 0;
    settings.retry_max_attempts = 10;
    settings.breaker_min_calls = 1000;
    // Parking off: a proxy user gets the provider's failures as they come
    // (R-RN13's `0`), and only the retry budget stands between them.
    settings.max_outage_wait = Duration::ZERO;
    let (policy, _) = policy(settings);
    let provider = Provider::new(|_| status(500));
    let svc = stack(&policy, &provider);
    for i in 0..10 {
        let resp = svc.clone().oneshot(get(i.to_string())).await.unwrap();
        assert_eq!(resp.status(), 500);
    }
    // Ten requests deposit 0.2 each: two retries in all, at the 5th and 10th.
    assert_eq!(provider.arrivals().len(), 12);
    assert_eq!(policy.retry.budget_left(Instant::now()), 0);
}

/// R-RB1: a non-retryable 4xx is passed through once and costs nothing;
/// a non-idempotent method is not retried.
#[tokio::test(start_paused = true)]
async fn client_errors_and_posts_are_never_retried() {
    let settings = ProviderSettings {
        retry_ratio: 1.0,
        retry_min_per_sec: 0,
        ..ProviderSettings::default()
    };
    let (policy, _) = policy(settings);
    let provider = Provider::new(|n| if n == 0 { status(404) } else { status(503) });
    let svc = stack(&policy, &provider);
    let resp = svc.clone().oneshot(get("a")).await.unwrap();
    assert_eq!(resp.status(), 404);
    assert_eq!(provider.arrivals().len(), 1);
    // One deposit, no withdrawal.
    assert_eq!(policy.retry.budget_left(Instant::now()), 1);
    let mut post = get("b");
    *post.method_mut() = Method::POST;
    assert_eq!(svc.clone().oneshot(post).await.unwrap().status(), 503);
    assert_eq!(provider.arrivals().len(), 2);
    assert_eq!(policy.retry.budget_left(Instant::now()), 2);
}

/// R-RB1: refusals that never reached the provider are not retried and
/// spend no budget; a connect error is retried.
#[tokio::test(start_paused = true)]
async fn connect_errors_are_retried_refusals_are_not() {
    let settings = ProviderSettings {
        retry_ratio: 1.0,
        retry_min_per_sec: 0,
        ..ProviderSettings::default()
    };
    let (policy, _) = policy(settings);
    let provider = Provider::new(|n| match n {
        0 => Reply {
            error: Some(UpstreamKind::ConnectionRefused),
            ..status(0)
        },
        1 => status(200),
        _ => Reply {
            error: Some(UpstreamKind::Prohibited),
            ..status(0)
        },
    });
    let svc = stack(&policy, &provider);
    assert_eq!(svc.clone().oneshot(get("a")).await.unwrap().status(), 200);
    assert_eq!(provider.arrivals().len(), 2);
    let err = svc.clone().oneshot(get("b")).await.unwrap_err();
    assert_eq!(
        match &err {
            Cause::Upstream(u) => Some(u.kind),
            _ => None,
        },
        Some(UpstreamKind::Prohibited)
    );
    assert_eq!(
        provider.arrivals().len(),
        3,
        "a prohibited target is not retried"
    );
}

/// R-RA1: `Retry-After: 2` is absorbed — the client gets the 200 — and the
/// retry reaches the provider exactly 2 s after the 429, not a millisecond
/// sooner or later. The events report the hold, the cut and the retry.
#[tokio::test(start_paused = true)]
async fn retry_after_is_waited_exactly() {
    let events: Arc<Mutex<Vec<Event>>> = Arc::default();
    let sink = events.clone();
    let policy = ProviderPolicy::new(
        "provider.test",
        ProviderSettings::default().validated().unwrap(),
        PolicyOptions {
            jitter: Some(Jitter::Fixed(0.0)),
            observer: Some(Observers::of_events(move |e: &Event| {
                sink.lock().unwrap().push(e.clone())
            })),
        },
    );
    let provider = Provider::new(|n| if n == 0 { throttle("2") } else { status(200) });
    let svc = stack(&policy, &provider);
    let resp = svc.oneshot(get("a")).await.unwrap();
    assert_eq!(resp.status(), 200);
    let seen = provider.arrivals();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].0 - seen[0].0, Duration::from_millis(2000));
    let events = events.lock().unwrap();
    let throttled = Outcome::Throttled {
        status: 429,
        retry_after: Some(Duration::from_secs(2)),
    };
    assert!(
        events.contains(&Event::Hold(Duration::from_secs(2))),
        "{events:?}"
    );
    assert!(events.contains(&Event::Retry(throttled)), "{events:?}");
    assert!(
        events.iter().any(|e| matches!(e, Event::Backoff(_))),
        "{events:?}"
    );
    let attempts = events
        .iter()
        .filter(|e| matches!(e, Event::Attempt { .. }))
        .count();
    assert_eq!(attempts, 2);
}

/// R-RA1: a `Retry-After` longer than `max_retry_after_wait` goes back to
/// the client, and the hold refuses later requests at once, saying when.
#[tokio::test(start_paused = true)]
async fn long_retry_after_goes_back_and_holds_the_provider() {
    let (policy, _) = policy(ProviderSettings::default());
    let provider = Provider::new(|_| throttle("30"));
    let svc = stack(&policy, &provider);
    let resp = svc.clone().oneshot(get("a")).await.unwrap();
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers()[http::header::RETRY_AFTER], "30");
    let asked = Instant::now();
    let err = svc.clone().oneshot(get("b")).await.unwrap_err();
    assert_eq!(Instant::now(), asked);
    let Cause::RateLimited(limited) = &err else {
        panic!("RateLimited: {err}")
    };
    assert_eq!(limited.retry_after, Duration::from_secs(30));
    assert_eq!(provider.arrivals().len(), 1);
}

/// R-TO1: a timed-out attempt is retried.
#[tokio::test(start_paused = true)]
async fn timed_out_attempts_are_retried() {
    let settings = ProviderSettings {
        attempt_timeout: Duration::from_secs(1),
        ..ProviderSettings::default()
    };
    let (policy, _) = policy(settings);
    let provider = Provider::new(|n| Reply {
        delay: if n == 0 {
            Duration::from_secs(60)
        } else {
            Duration::ZERO
        },
        ..status(200)
    });
    let svc = stack(&policy, &provider);
    let t0 = Instant::now();
    assert_eq!(svc.oneshot(get("a")).await.unwrap().status(), 200);
    assert_eq!(provider.arrivals().len(), 2);
    assert!(Instant::now() - t0 < Duration::from_secs(5));
}

/// R-TO1 with R-PF1 (issue 38): an attempt's bound is kept by its
/// request's one timer — each timed-out attempt is cut at exactly its own
/// bound, however far the request's is, and the next begins then.
#[tokio::test(start_paused = true)]
async fn each_attempt_is_cut_at_its_own_bound_by_the_requests_timer() {
    let (policy, _) = policy(ProviderSettings {
        attempt_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_secs(45),
        ..ProviderSettings::default()
    });
    let provider = Provider::new(|n| Reply {
        delay: if n < 2 {
            Duration::from_secs(60)
        } else {
            Duration::ZERO
        },
        ..status(200)
    });
    let svc = stack(&policy, &provider);
    let t0 = Instant::now();
    assert_eq!(svc.oneshot(get("a")).await.unwrap().status(), 200);
    let sent: Vec<Duration> = provider.arrivals().iter().map(|(at, _)| *at - t0).collect();
    assert_eq!(
        sent,
        [0, 1, 2].map(Duration::from_secs),
        "each cut at its 1 s, the back-off jitter fixed at 0"
    );
    assert_eq!(Instant::now() - t0, Duration::from_secs(2));
}

// ------------------------------------------------------------------ run

fn with_run(mut req: Request<String>, run: &RunHandle) -> Request<String> {
    req.extensions_mut().insert(Attempt {
        run: Some(run.clone()),
        ..Attempt::default()
    });
    req
}

/// R-RN2: the deadline is checked before an attempt starts; an attempt in
/// flight when it passes completes.
#[tokio::test(start_paused = true)]
async fn deadline_does_not_interrupt_an_attempt_in_flight() {
    let (policy, _) = policy(ProviderSettings::default());
    let provider = Provider::new(|_| Reply {
        delay: Duration::from_secs(3),
        ..status(200)
    });
    let svc = stack(&policy, &provider);
    let t0 = Instant::now();
    let run = RunHandle::new(Envelope {
        deadline: Some(t0 + Duration::from_secs(1)),
        ..Envelope::default()
    });
    let resp = svc.clone().oneshot(with_run(get("a"), &run)).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(Instant::now() - t0, Duration::from_secs(3));
    let err = svc
        .clone()
        .oneshot(with_run(get("b"), &run))
        .await
        .unwrap_err();
    assert_eq!(
        match &err {
            Cause::RunStopped(s) => Some(s.reason),
            _ => None,
        },
        Some(StopReason::Deadline)
    );
    assert_eq!(run.state().stopped, Some(StopReason::Deadline));
    assert_eq!(provider.arrivals().len(), 1);
}

/// R-RN1: the run's retry budget bounds retries; running out is a planned
/// stop. (A provider that throttles: its failures are not an outage, which
/// a run's requests would wait out parked instead, R-RN8.)
#[tokio::test(start_paused = true)]
async fn run_retry_budget_bounds_retries() {
    let (policy, _) = policy(ProviderSettings::default());
    let provider = Provider::new(|_| status(429));
    let svc = stack(&policy, &provider);
    let run = RunHandle::new(Envelope {
        retry_budget: Some(1),
        ..Envelope::default()
    });
    assert_eq!(
        svc.clone()
            .oneshot(with_run(get("a"), &run))
            .await
            .unwrap()
            .status(),
        429
    );
    // Three attempts were allowed per request, but the run had one retry.
    assert_eq!(provider.arrivals().len(), 2);
    let state = run.state();
    assert_eq!((state.attempts, state.retries), (2, 1));
    assert_eq!(state.stopped, Some(StopReason::RetryBudget));
    assert!(state.stopped.unwrap().is_budget());
}

/// Settings whose breaker opens after four failures and stays open 5 s,
/// with no retries (each request is one attempt), and proxy users' failures
/// passed at once (`max_outage_wait = 0`): a run's requests park all the
/// same (R-RN8).
fn quick_breaker() -> ProviderSettings {
    ProviderSettings {
        breaker_min_calls: 4,
        breaker_open_for: Duration::from_secs(5),
        breaker_half_open_probes: 1,
        retry_max_attempts: 1,
        max_outage_wait: Duration::ZERO,
        ..ProviderSettings::default()
    }
}

/// Four failures of proxy users open [`quick_breaker`]'s circuit; the
/// run's next request parks, goes as the first probe half a second later
/// (not `breaker_open_for`), and gets the recovered provider's `200`.
async fn open_then_wait_it_out(svc: &ProviderService<String, ()>, run: &RunHandle) {
    for i in 0..4 {
        let r = svc.clone().oneshot(get(i.to_string())).await;
        assert_eq!(r.unwrap().status(), 500);
    }
    let t0 = Instant::now();
    let r = svc.clone().oneshot(with_run(get("after"), run)).await;
    assert_eq!(r.unwrap().status(), 200);
    // The third failure, a pacing interval (200 ms) before the fourth,
    // told the outage (the proxy users' answers count, parked or not);
    // the first probe goes half a second after that.
    assert_eq!(
        Instant::now() - t0,
        PROBE_FIRST_WAIT - INTERVAL,
        "parked until the probe"
    );
}

/// The default start rate's interval (5 req/s).
const INTERVAL: Duration = Duration::from_millis(200);

/// R-RN8: a run's request that meets an open circuit is parked, goes as
/// the probe — let through the open breaker, whose success closes it — and
/// the provider, recovered, answers it. Only attempts that reached the
/// provider count against the cap.
#[tokio::test(start_paused = true)]
async fn a_run_waits_out_an_open_circuit() {
    let (policy, _) = policy(quick_breaker());
    let provider = Provider::new(|n| if n < 4 { status(500) } else { status(200) });
    let svc = stack(&policy, &provider);
    let run = RunHandle::new(Envelope {
        request_cap: Some(10),
        max_cooldown_waits: 3,
        ..Envelope::default()
    });
    open_then_wait_it_out(&svc, &run).await;
    let state = run.state();
    assert_eq!(state.attempts, 1, "the wait was not an attempt");
    assert_eq!(
        (state.waits_total, state.providers["provider.test"].cycles),
        (1, 0)
    );
    assert_eq!(state.stopped, None);
    assert_eq!(provider.arrivals().len(), 5);
    assert_eq!(policy.snapshot(Instant::now()).breaker.state, State::Closed);
}

/// Issue 20: a provider that never answers is given `request_timeout`
/// in all — attempts, back-off and retries — then the request fails with
/// `RequestTimeout`, saying how many attempts left.
#[tokio::test(start_paused = true)]
async fn the_request_timeout_bounds_every_attempt_and_wait() {
    let (policy, _) = policy(ProviderSettings {
        attempt_timeout: Duration::from_secs(2),
        request_timeout: Duration::from_secs(3),
        ..ProviderSettings::default()
    });
    let provider = Provider::new(|_| Reply {
        delay: Duration::from_secs(3600),
        ..status(200)
    });
    let svc = stack(&policy, &provider);
    let t0 = Instant::now();
    let err = svc.clone().oneshot(get("a")).await.unwrap_err();
    assert!(
        matches!(&err, Cause::RequestTimeout(t) if t.attempts == 2 && t.after == Duration::from_secs(3)),
        "{err}"
    );
    assert_eq!(Instant::now() - t0, Duration::from_secs(3));
    assert_eq!(
        provider.arrivals().len(),
        2,
        "the first timed out, the retry was cut"
    );
}

/// Issue 20 with R-RN8, R-RN13: a run's request parked through an outage
/// longer than its `request_timeout` (6 s against 4 s) does not spend the
/// bound on the wait, and is answered once the provider is back; a proxy
/// user's parked request beside it does (its `max_outage_wait` is 10 s):
/// `504` at 4 s, its clock its own.
#[tokio::test(start_paused = true)]
async fn a_runs_cooldown_wait_does_not_spend_the_request_timeout() {
    let (policy, _) = policy(ProviderSettings {
        attempt_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_secs(4),
        ..ProviderSettings::default()
    });
    let t0 = Instant::now();
    let up = t0 + Duration::from_secs(6);
    let provider = Provider::new(move |_| {
        if Instant::now() < up {
            status(503)
        } else {
            status(200)
        }
    });
    let svc = stack(&policy, &provider);
    let run = RunHandle::new(Envelope {
        max_cooldown_waits: 3,
        ..Envelope::default()
    });
    // Two requests: one request's own failures are no outage (it may be a
    // record the provider cannot serve); two requests failing for a second
    // are.
    let (in_run, alone) = tokio::join!(svc.clone().oneshot(with_run(get("run"), &run)), async {
        let r = svc.clone().oneshot(get("alone")).await;
        (r, Instant::now() - t0)
    },);
    assert_eq!(in_run.unwrap().status(), 200);
    assert!(
        Instant::now() - t0 <= Duration::from_secs(7),
        "back within a probe"
    );
    let (alone, at) = alone;
    assert!(
        matches!(&alone, Err(Cause::RequestTimeout(_))),
        "{:?}",
        alone.map(|r| r.status())
    );
    assert_eq!(at, Duration::from_secs(4), "its own 4 s");
    assert_eq!(
        run.state().waits_total,
        2,
        "two cycles of 5 s: {:?}",
        run.state()
    );
}

/// R-RN8's cycle guard: against a provider that never recovers, a run's
/// request is parked and only probes go, one a second; after
/// `max_cooldown_waits` cycles of `breaker_open_for` the provider's part
/// of the run stops with `circuit_open` (the breaker opened meanwhile:
/// source pressure), and its later requests are refused at once. The
/// first failure of a serial collector, before any verdict, goes back
/// (a lone failure proves nothing; retries are off here).
#[tokio::test(start_paused = true)]
async fn a_circuit_that_never_recovers_stops_the_run() {
    let (policy, _) = policy(quick_breaker());
    let provider = Provider::new(|_| status(500));
    let svc = stack(&policy, &provider);
    let run = RunHandle::new(Envelope {
        deadline: Some(Instant::now() + Duration::from_secs(3600)),
        max_cooldown_waits: 2,
        ..Envelope::default()
    });
    let t0 = Instant::now();
    let mut statuses = Vec::new();
    let mut stopped = None;
    for i in 0..20 {
        match svc
            .clone()
            .oneshot(with_run(get(i.to_string()), &run))
            .await
        {
            Ok(r) => statuses.push(r.status().as_u16()),
            Err(Cause::RunStopped(s)) => {
                stopped = Some((s.reason, s.provider, Instant::now() - t0));
                break;
            }
            Err(other) => panic!("{other}"),
        }
    }
    assert_eq!(
        statuses,
        [500],
        "the lone failure, after a second's verdict"
    );
    // Down at 1 s (the second failure, a second after the first); two
    // cycles of 5 s waited out; stopped at the third.
    assert_eq!(
        stopped,
        Some((
            StopReason::CircuitOpen,
            Some("provider.test".to_string()),
            Duration::from_secs(11)
        ))
    );
    assert!(StopReason::CircuitOpen.is_source_pressure());
    let t = Instant::now();
    let again = svc.clone().oneshot(with_run(get("x"), &run)).await;
    assert!(matches!(again, Err(Cause::RunStopped(_))));
    assert_eq!(Instant::now(), t, "refused at once");
    // Two failures, then a probe at 1.5 s and one a second to 10.5 s.
    assert_eq!(provider.arrivals().len(), 2 + 10);
    assert_eq!(run.state().attempts, 12);
}

/// A provider that fails everything, its breaker opened by four failures
/// (`quick_breaker`), and its stack.
async fn opened_dead_provider() -> (Provider, ProviderService<String, ()>) {
    let (policy, _) = policy(quick_breaker());
    let provider = Provider::new(|_| status(500));
    let svc = stack(&policy, &provider);
    for i in 0..4 {
        let _ = svc.clone().oneshot(get(i.to_string())).await;
    }
    (provider, svc)
}

/// R-RN2: an attempt whose pacing slot comes after the run's deadline is
/// not sent: the run stops with `deadline` at once (it used to start late,
/// then to wait for the slot and use it up).
#[tokio::test(start_paused = true)]
async fn a_pacing_slot_after_the_deadline_is_not_taken() {
    let (policy, _) = policy(fixed_rate(1.0));
    let provider = Provider::new(|_| status(200));
    let svc = stack(&policy, &provider);
    let t0 = Instant::now();
    let run = RunHandle::new(Envelope {
        deadline: Some(t0 + Duration::from_millis(500)),
        ..Envelope::default()
    });
    svc.clone().oneshot(with_run(get("a"), &run)).await.unwrap();
    // The next slot is at t0 + 1 s, past the deadline.
    let err = svc
        .clone()
        .oneshot(with_run(get("b"), &run))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Cause::RunStopped(s) if s.reason == StopReason::Deadline),
        "{err}"
    );
    assert_eq!(provider.arrivals().len(), 1);
    assert_eq!(run.state().attempts, 1, "the late attempt does not count");
    assert_eq!(run.state().stopped, Some(StopReason::Deadline));
    // Refused at once: it neither waited for the slot nor took it — a
    // request outside the run gets that slot, at t0 + 1 s.
    assert_eq!(Instant::now(), t0, "no wait for a slot past the deadline");
    svc.clone().oneshot(get("c")).await.unwrap();
    assert_eq!(provider.arrivals()[1].0 - t0, Duration::from_secs(1));
}

/// R-RN2 (issue 19's budget edges): a cap refusal neither waits for a
/// pacing slot nor takes one — the next slot goes to the next request.
#[tokio::test(start_paused = true)]
async fn a_cap_refusal_neither_waits_for_nor_takes_a_slot() {
    let (policy, _) = policy(fixed_rate(1.0));
    let provider = Provider::new(|_| status(200));
    let svc = stack(&policy, &provider);
    let t0 = Instant::now();
    let run = RunHandle::new(Envelope {
        request_cap: Some(1),
        ..Envelope::default()
    });
    svc.clone().oneshot(with_run(get("a"), &run)).await.unwrap();
    let err = svc
        .clone()
        .oneshot(with_run(get("b"), &run))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Cause::RunStopped(s) if s.reason == StopReason::RequestCap),
        "{err}"
    );
    assert_eq!(Instant::now(), t0, "refused without waiting for a slot");
    svc.clone().oneshot(get("c")).await.unwrap();
    assert_eq!(provider.arrivals()[1].0 - t0, Duration::from_secs(1));
    assert_eq!(run.state().attempts, 1);
}

/// R-RN2: an attempt counts only when it leaves for the provider. A run's
/// request whose client goes away while it waits for its pacing slot gives
/// its attempt back: under a cap of 2 the run still sends two.
#[tokio::test(start_paused = true)]
async fn a_queued_attempt_whose_client_left_is_given_back() {
    let (policy, _) = policy(fixed_rate(1.0));
    let provider = Provider::new(|_| status(200));
    let svc = stack(&policy, &provider);
    let t0 = Instant::now();
    let run = RunHandle::new(Envelope {
        request_cap: Some(2),
        ..Envelope::default()
    });
    svc.clone().oneshot(with_run(get("a"), &run)).await.unwrap();
    let gone = tokio::spawn(svc.clone().oneshot(with_run(get("gone"), &run)));
    sleep(Duration::from_millis(500)).await;
    assert_eq!(run.state().attempts, 2, "reserved while it waits");
    gone.abort();
    let _ = gone.await;
    assert_eq!(run.state().attempts, 1, "given back: it never left");
    let resp = svc.clone().oneshot(with_run(get("c"), &run)).await.unwrap();
    assert_eq!(resp.status(), 200);
    let ids: Vec<_> = provider.arrivals().into_iter().map(|(_, id)| id).collect();
    assert_eq!(ids, ["a", "c"]);
    assert_eq!(provider.arrivals()[1].0 - t0, Duration::from_secs(1));
    assert_eq!(run.state().attempts, 2);
}

mod budget_stop {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// R-RN3: whatever the provider did before, a run hitting its
        /// request cap changes nothing in the provider's pacer, breaker or
        /// retry budget, and sends nothing.
        #[test]
        fn a_budget_stop_changes_no_provider_state(
            statuses in proptest::collection::vec(
                prop_oneof![Just(200u16), Just(404), Just(429), Just(500), Just(503)], 1..25),
            refused in 1usize..5,
        ) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap();
            rt.block_on(async move {
                let settings = ProviderSettings {
                    breaker_min_calls: 5,
                    ..ProviderSettings::default()
                };
                let (policy, evidence) = policy(settings);
                let script = statuses.clone();
                let provider = Provider::new(move |n| status(script[n.min(script.len() - 1)]));
                let svc = stack(&policy, &provider);
                let run = RunHandle::new(Envelope {
                    request_cap: Some(statuses.len() as u64),
                    // An open circuit is waited out (R-RN8), however often.
                    max_cooldown_waits: u32::MAX,
                    ..Envelope::default()
                });
                // Spend the cap (some attempts may be refused by the
                // provider's own breaker or pacer: those do not count).
                while run.state().stopped.is_none() {
                    let _ = svc.clone().oneshot(with_run(get("x"), &run)).await;
                }
                let now = Instant::now();
                let before = policy.snapshot(now);
                let transitions = evidence.lock().unwrap().len();
                let sent = provider.arrivals().len();
                for _ in 0..refused {
                    let err = svc.clone().oneshot(with_run(get("y"), &run)).await.unwrap_err();
                    let reason = match &err {
            Cause::RunStopped(s) => Some(s.reason),
            _ => None,
        };
                    assert_eq!(reason, Some(StopReason::RequestCap));
                    assert!(!reason.unwrap().is_source_pressure());
                }
                assert_eq!(Instant::now(), now);
                assert_eq!(policy.snapshot(now), before);
                assert_eq!(evidence.lock().unwrap().len(), transitions);
                assert_eq!(provider.arrivals().len(), sent);
            });
        }
    }
}

// ------------------------------------------------------------- bulkhead

/// R-BH1: at most `max_in_flight` attempts at once; those beyond wait in a
/// bounded queue and are refused past `max_queue_len` or `max_queue_wait`.
#[tokio::test(start_paused = true)]
async fn bulkhead_caps_attempts_in_flight() {
    let settings = ProviderSettings {
        max_in_flight: 2,
        max_queue_len: 1,
        max_queue_wait: Duration::from_secs(3),
        ..fixed_rate(1000.0)
    };
    let (policy, _) = policy(settings);
    let provider = Provider::new(|_| Reply {
        delay: Duration::from_secs(2),
        ..status(200)
    });
    let svc = BulkheadLayer::new(policy.clone()).layer(provider.clone());
    let t0 = Instant::now();
    let a = tokio::spawn(svc.clone().oneshot(get("a")));
    let b = tokio::spawn(svc.clone().oneshot(get("b")));
    sleep(Duration::from_millis(1)).await;
    assert_eq!(policy.bulkhead.in_flight(), 2);
    // The third waits for a permit; the fourth finds the queue full.
    let c = tokio::spawn(svc.clone().oneshot(get("c")));
    sleep(Duration::from_millis(1)).await;
    assert_eq!(policy.bulkhead.waiting(), 1);
    let err = svc.clone().oneshot(get("d")).await.unwrap_err();
    assert!(matches!(err, Cause::BulkheadFull(_)), "{err}");
    a.await.unwrap().unwrap();
    b.await.unwrap().unwrap();
    c.await.unwrap().unwrap();
    let seen = provider.arrivals();
    assert_eq!(seen.len(), 3);
    // c went when a permit came back, 2 s in.
    assert_eq!(seen[2].0 - t0, Duration::from_secs(2));
    assert_eq!(policy.bulkhead.in_flight(), 0);
}

/// R-BH1: an attempt stays in flight while its response is held (the
/// proxy keeps it in the body it streams), and no longer.
#[tokio::test(start_paused = true)]
async fn the_permit_lives_with_the_response() {
    let settings = ProviderSettings {
        max_in_flight: 1,
        ..fixed_rate(1000.0)
    };
    let (policy, _) = policy(settings);
    let provider = Provider::new(|_| status(200));
    let svc = BulkheadLayer::new(policy.clone()).layer(provider.clone());
    let mut resp = svc.clone().oneshot(get("a")).await.unwrap();
    assert_eq!(policy.bulkhead.in_flight(), 1, "the body is still to come");
    let held = resp
        .extensions_mut()
        .remove::<InFlight>()
        .expect("the permit");
    drop(resp);
    assert_eq!(policy.bulkhead.in_flight(), 1, "moved, still held");
    drop(held);
    assert_eq!(policy.bulkhead.in_flight(), 0);
}

/// R-BH1: a wait longer than `max_queue_wait` is refused.
#[tokio::test(start_paused = true)]
async fn bulkhead_wait_is_bounded() {
    let settings = ProviderSettings {
        max_in_flight: 1,
        max_queue_wait: Duration::from_secs(1),
        ..fixed_rate(1000.0)
    };
    let (policy, _) = policy(settings);
    let provider = Provider::new(|_| Reply {
        delay: Duration::from_secs(60),
        ..status(200)
    });
    let svc = BulkheadLayer::new(policy.clone()).layer(provider.clone());
    let _hung = tokio::spawn(svc.clone().oneshot(get("a")));
    sleep(Duration::from_millis(1)).await;
    let t = Instant::now();
    let err = svc.clone().oneshot(get("b")).await.unwrap_err();
    assert!(matches!(err, Cause::BulkheadFull(_)));
    assert_eq!(Instant::now() - t, Duration::from_secs(1));
}

/// R-CB1: with `breaker_wait_for_probe`, a request arriving while the
/// breaker is open waits for the half-open probe (within the queue wait)
/// instead of failing fast.
#[tokio::test(start_paused = true)]
async fn breaker_can_wait_for_the_probe() {
    let settings = ProviderSettings {
        breaker_wait_for_probe: true,
        max_queue_wait: Duration::from_secs(10),
        ..breaker_settings()
    };
    let (policy, evidence) = policy(settings);
    let provider = Provider::new(|n| if n < 4 { status(500) } else { status(200) });
    let mut svc = BreakerLayer::new(policy.clone()).layer(provider.clone());
    for _ in 0..4 {
        svc.ready().await.unwrap().call(get("x")).await.unwrap();
    }
    assert_eq!(evidence.lock().unwrap().len(), 1, "open");
    let t = Instant::now();
    let resp = svc.ready().await.unwrap().call(get("waits")).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        Instant::now() - t,
        Duration::from_secs(5),
        "waited for half-open"
    );
    assert_eq!(provider.arrivals().len(), 5);
}

// --------------------------------------------------------- soft throttle

/// R-AI1, R-SG3: a soft throttle is a sustained shift of the latency
/// distribution, never one slow request. 40 fast answers teach a 20 ms
/// baseline; one 2 s answer cuts nothing; then every answer slows to 2 s
/// (a provider queueing) and the rate is cut, with reason `latency`.
#[tokio::test(start_paused = true)]
async fn a_sustained_latency_shift_is_a_soft_throttle_one_slow_answer_is_not() {
    let events: Arc<Mutex<Vec<Event>>> = Arc::default();
    let sink = events.clone();
    // Windows of a second: latency is judged as each one closes.
    let mut settings = ProviderSettings::with_ceiling(500.0);
    settings.start_rps = Some(50.0);
    let policy = ProviderPolicy::new(
        "provider.test",
        settings.validated().unwrap(),
        PolicyOptions {
            observer: Some(Observers::of_events(move |e: &Event| {
                sink.lock().unwrap().push(e.clone())
            })),
            ..PolicyOptions::default()
        },
    );
    let provider = Provider::new(|n| Reply {
        delay: Duration::from_millis(if n < 40 || n == 41 { 20 } else { 2000 }),
        ..status(200)
    });
    let svc = stack(&policy, &provider);
    for i in 0..42 {
        svc.clone().oneshot(get(i.to_string())).await.unwrap();
    }
    let snap = policy.snapshot(Instant::now());
    let baseline = snap.pacer.baseline_ttfb.expect("a baseline");
    assert!(baseline < Duration::from_millis(200), "{baseline:?}");
    assert_eq!(
        snap.pacer.last_backoff, None,
        "one slow answer is not a throttle"
    );
    // Now every answer is slow: concurrent requests, as a collector sends,
    // for a few seconds (latency is judged as each second's window closes).
    for round in 0..3 {
        let mut batch = Vec::new();
        for i in 0..40 {
            batch.push(tokio::spawn(
                svc.clone().oneshot(get(format!("slow{round}-{i}"))),
            ));
        }
        for b in batch {
            b.await.unwrap().unwrap();
        }
    }
    let snap = policy.snapshot(Instant::now());
    let cut = snap
        .pacer
        .last_backoff
        .expect("a sustained shift cut the rate");
    assert_eq!(cut.reason, sluice_policy::pacer::BackoffReason::Latency);
    assert!(cut.to_rps < cut.from_rps);
    assert!(events
        .lock()
        .unwrap()
        .iter()
        .any(|e| matches!(e, Event::Backoff(b) if b.reason == sluice_policy::pacer::BackoffReason::Latency)));
}

/// R-RB1: a method the config opts in is retried like an idempotent one.
#[tokio::test(start_paused = true)]
async fn opted_in_methods_are_retried() {
    let settings = ProviderSettings {
        retry_methods: vec![Method::POST],
        ..ProviderSettings::default()
    };
    let (policy, _) = policy(settings);
    let provider = Provider::new(|n| if n == 0 { status(503) } else { status(200) });
    let svc = stack(&policy, &provider);
    let mut post = get("body kept for replay");
    *post.method_mut() = Method::POST;
    assert_eq!(svc.oneshot(post).await.unwrap().status(), 200);
    let seen = provider.arrivals();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].1, "body kept for replay", "the same body, replayed");
}

// ------------------------------------------------- outages (issue 18)

/// Spawns `n` requests of `run` (or none) at once; returns what each got.
async fn concurrently(
    svc: &ProviderService<String, ()>,
    run: Option<&RunHandle>,
    n: usize,
) -> Vec<Result<u16, Cause>> {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let req = match run {
                Some(run) => with_run(get(format!("c{i}")), run),
                None => get(format!("c{i}")),
            };
            tokio::spawn(svc.clone().oneshot(req))
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap().map(|r| r.status().as_u16()));
    }
    out
}

/// The seeds' first scenario (001, "an open circuit with budget remaining
/// waits out the cool-down and resumes"), with eight requests of the run
/// waiting at once: one open period is one wait, however many wait it out
/// — a run allowed a single wait goes on — and every request succeeds
/// once the provider is back (R-RN8).
#[tokio::test(start_paused = true)]
async fn eight_waiters_of_one_open_period_are_one_wait() {
    let (policy, _) = policy(quick_breaker());
    let provider = Provider::new(|n| if n < 4 { status(500) } else { status(200) });
    let svc = stack(&policy, &provider);
    for i in 0..4 {
        let r = svc.clone().oneshot(get(i.to_string())).await.unwrap();
        assert_eq!(r.status(), 500);
    }
    let run = RunHandle::new(Envelope {
        request_cap: Some(100),
        max_cooldown_waits: 1,
        ..Envelope::default()
    });
    let t0 = Instant::now();
    let got = concurrently(&svc, Some(&run), 8).await;
    assert!(
        got.iter().all(|r| matches!(r, Ok(200))),
        "{:?}",
        got.iter()
            .map(|r| r.as_ref().map_err(|e| e.to_string()))
            .collect::<Vec<_>>()
    );
    // Parked until the probe (see `open_then_wait_it_out`), not for the
    // breaker's open period; then paced.
    let arrivals = provider.arrivals();
    assert_eq!(arrivals[4].0 - t0, PROBE_FIRST_WAIT - INTERVAL, "the probe");
    assert!(Instant::now() - t0 < Duration::from_secs(5));
    let state = run.state();
    assert_eq!(state.waits_total, 1, "{state:?}");
    assert_eq!(state.stopped, None);
    assert_eq!(state.attempts, 8, "the waits were not attempts");
}

/// The seeds' second scenario ("genuine budget exhaustion during the wait
/// defers"), concurrent; R-RN8 within the deadline: eight requests waiting
/// out an open circuit when the run's deadline passes all stop with
/// `deadline` — a budget reason, the whole run — at the deadline (a wait
/// never runs past it), and nothing more is sent.
#[tokio::test(start_paused = true)]
async fn a_deadline_during_the_wait_stops_every_waiter_planned() {
    let (provider, svc) = opened_dead_provider().await;
    let t0 = Instant::now();
    let run = RunHandle::new(Envelope {
        deadline: Some(t0 + Duration::from_secs(2)),
        max_cooldown_waits: 3,
        ..Envelope::default()
    });
    let got = concurrently(&svc, Some(&run), 8).await;
    for r in &got {
        match r {
            Err(Cause::RunStopped(s)) => {
                assert_eq!(s.reason, StopReason::Deadline);
                assert_eq!(s.provider, None, "a budget stop is run-wide");
            }
            other => panic!("{:?}", other.as_ref().map_err(|e| e.to_string())),
        }
    }
    assert_eq!(Instant::now() - t0, Duration::from_secs(2));
    // Four to open it, then only the probes: at 0.3 s and 1.3 s (see
    // `open_then_wait_it_out`).
    assert_eq!(provider.arrivals().len(), 4 + 2);
    assert_eq!(run.state().stopped, Some(StopReason::Deadline));
}

/// The seeds' third scenario ("a circuit that keeps re-opening converges
/// to a bounded defer"), with eight concurrent requests parked: each
/// `breaker_open_for` of the outage is one cycle whatever the concurrency;
/// after `max_cooldown_waits` cycles the provider's part of the run stops
/// with `circuit_open` — at `max_cooldown_waits × breaker_open_for` — while
/// the run itself goes on at another provider. Meanwhile only probes went,
/// one a second, each an attempt of the run.
#[tokio::test(start_paused = true)]
async fn a_circuit_that_keeps_reopening_stops_only_its_providers_part() {
    let (dead_policy, evidence) = policy(quick_breaker());
    let dead = Provider::new(|_| status(500));
    let dead_svc = stack(&dead_policy, &dead);
    let other_policy = ProviderPolicy::new(
        "other.test",
        ProviderSettings::default().validated().unwrap(),
        PolicyOptions::default(),
    );
    let healthy = Provider::new(|_| status(200));
    let healthy_svc = stack(&other_policy, &healthy);
    for i in 0..4 {
        let _ = dead_svc.clone().oneshot(get(i.to_string())).await;
    }
    let run = RunHandle::new(Envelope {
        request_cap: Some(30),
        max_cooldown_waits: 3,
        ..Envelope::default()
    });
    let t0 = Instant::now();
    let got = concurrently(&dead_svc, Some(&run), 8).await;
    let elapsed = Instant::now() - t0;
    for r in &got {
        match r {
            Err(Cause::RunStopped(s)) => {
                assert_eq!(s.reason, StopReason::CircuitOpen);
                assert_eq!(s.provider.as_deref(), Some("provider.test"));
            }
            other => panic!("{:?}", other.as_ref().map_err(|e| e.to_string())),
        }
    }
    // Three cycles from the outage's verdict, one pacing interval before
    // the fourth failure (see `open_then_wait_it_out`).
    assert_eq!(elapsed, Duration::from_secs(15) - INTERVAL);
    // Four to open it, then one probe at 0.5 s and one a second after.
    assert_eq!(dead.arrivals().len(), 4 + 15);
    let opens = evidence
        .lock()
        .unwrap()
        .iter()
        .filter(|t| t.to == State::Open)
        .count();
    // Opened, then re-opened by the probe after each half-open.
    assert_eq!(opens, 3, "{:?}", evidence.lock().unwrap());
    let state = run.state();
    assert_eq!(state.waits_total, 3);
    assert_eq!(state.attempts, 15, "the probes were the run's attempts");
    assert_eq!(state.stopped, None, "the run goes on");
    // The other provider's requests keep succeeding until the run's own
    // budget ends: 30 attempts, 7 of them spent at the dead provider.
    let mut ok = 0;
    loop {
        match healthy_svc.clone().oneshot(with_run(get("h"), &run)).await {
            Ok(r) => {
                assert_eq!(r.status(), 200);
                ok += 1;
            }
            Err(Cause::RunStopped(s)) => {
                assert_eq!((s.reason, s.provider), (StopReason::RequestCap, None));
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(ok, 30 - 15);
    assert_eq!(run.state().stopped, Some(StopReason::RequestCap));
}

/// R-SG4, R-CB1: an outage at a low rate never fills
/// `breaker_min_calls` in the window (1 req/s, 10 s window, 20 calls
/// needed), yet the breaker opens once every call has failed for half
/// the window — with `failure_streak` as its evidence.
#[tokio::test(start_paused = true)]
async fn an_outage_at_a_low_rate_opens_the_breaker_on_the_streak() {
    let mut settings = fixed_rate(1.0);
    settings.retry_max_attempts = 1;
    settings.max_outage_wait = Duration::ZERO;
    let (policy, evidence) = policy(settings);
    let provider = Provider::new(|_| status(502));
    let svc = stack(&policy, &provider);
    let t0 = Instant::now();
    let mut open_at = None;
    for i in 0..30 {
        match svc.clone().oneshot(get(i.to_string())).await {
            Ok(r) => assert_eq!(r.status(), 502),
            Err(Cause::CircuitOpen(_)) => {
                open_at.get_or_insert(Instant::now() - t0);
                sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
    let t = evidence.lock().unwrap()[0].clone();
    assert_eq!(
        (t.from, t.to, t.reason),
        (State::Closed, State::Open, Reason::FailureStreak)
    );
    assert_eq!((t.calls, t.failures), (6, 6), "{t:?}");
    assert!(t.calls < 20, "below breaker_min_calls");
    // The sixth failure, at 5 s, spans half the window.
    assert_eq!(open_at, Some(Duration::from_secs(5)));
}

/// R-SG4 through the whole stack, eight requests at a time: a provider
/// paced at its ceiling fails every request with a bare 503 for 3 s. The
/// rate is held (two cuts at most), the failures are found an outage, and
/// the first success afterwards gives the ceiling back; no throttle point
/// is learned. (Parking off: the controller's own verdict, with every
/// failure passed on; parked, see `a_short_outage_reaches_a_run_as_latency`.)
#[tokio::test(start_paused = true)]
async fn a_three_second_outage_of_bare_503s_costs_no_rate() {
    let mut settings = ProviderSettings::with_ceiling(50.0);
    settings.max_outage_wait = Duration::ZERO;
    let (policy, _) = policy(settings);
    let t0 = Instant::now();
    let down = (t0 + Duration::from_secs(20), t0 + Duration::from_secs(23));
    let provider = Provider::new(move |_| {
        let now = Instant::now();
        if now >= down.0 && now < down.1 {
            status(503)
        } else {
            status(200)
        }
    });
    let svc = stack(&policy, &provider);
    // (a batch of eight takes 160 ms at 50 req/s: stop before the outage)
    while Instant::now() + Duration::from_millis(500) < down.0 {
        concurrently(&svc, None, 8).await;
    }
    let before = policy.snapshot(Instant::now()).pacer;
    assert_eq!(before.rate_rps, 50.0, "{before:?}");
    let mut lowest = before.rate_rps;
    let mut outage = false;
    while Instant::now() < down.1 {
        concurrently(&svc, None, 8).await;
        let during = policy.snapshot(Instant::now()).pacer;
        lowest = lowest.min(during.rate_rps);
        outage |=
            during.belief.map(|b| b.condition) == Some(sluice_policy::pacer::Condition::Outage);
    }
    assert!(outage, "the failures were found an outage");
    assert!(lowest >= 50.0 * 0.7 * 0.7 - 1e-9, "held at {lowest}");
    let back = down.1 + Duration::from_secs(1);
    while Instant::now() < back {
        concurrently(&svc, None, 8).await;
    }
    let after = policy.snapshot(Instant::now()).pacer;
    assert_eq!(after.rate_rps, 50.0, "{after:?}");
    assert_eq!(after.limit_rps, None);
    assert_eq!(after.belief, None);
    assert_eq!(after.outages, 1);
    // Successes over the second after the outage: the full rate (±1).
    let ok = provider
        .arrivals()
        .iter()
        .filter(|(at, _)| *at >= down.1 && *at < back)
        .count();
    assert!(ok >= 48, "{ok} in the second after");
}

/// Eight requests at a time on `svc` until `until`; a batch that sluice
/// refused at once (an open circuit) is followed by 10 ms of the clients'
/// own time, or the paused clock would never move.
async fn keep_busy(svc: &ProviderService<String, ()>, until: Instant) {
    while Instant::now() < until {
        let start = Instant::now();
        concurrently(svc, None, 8).await;
        if Instant::now() == start {
            sleep(Duration::from_millis(10)).await;
        }
    }
}

/// R-SG4 through the whole stack, eight requests at a time, for a 10 s
/// outage of each kind: the breaker opens (on its failure streak or
/// ratio), and by `breaker_open_for` + 5 s after the provider's return the
/// successes are back at ≥ 0.9 of the rate before; no throttle point is
/// learned and the rate is the ceiling's.
async fn a_ten_second_outage(during: Reply) {
    let (policy, evidence) = policy(ProviderSettings::with_ceiling(50.0));
    let t0 = Instant::now();
    let down = (t0 + Duration::from_secs(30), t0 + Duration::from_secs(40));
    let provider = Provider::new(move |_| {
        let now = Instant::now();
        if now >= down.0 && now < down.1 {
            during
        } else {
            status(200)
        }
    });
    let svc = stack(&policy, &provider);
    keep_busy(&svc, down.1 + Duration::from_secs(15)).await;
    let ok = |from: Instant, secs: u64| {
        provider
            .arrivals()
            .iter()
            .filter(|(at, _)| *at >= from && *at < from + Duration::from_secs(secs))
            .count() as f64
            / secs as f64
    };
    let before = ok(down.0 - Duration::from_secs(10), 10);
    // (arrivals after the return are all answered 200)
    let back = ok(down.1 + Duration::from_secs(10), 5);
    assert!(before >= 49.0, "{before}/s before");
    assert!(back >= 0.9 * before, "{back}/s back against {before}/s");
    let opened = evidence
        .lock()
        .unwrap()
        .iter()
        .any(|t| t.to == State::Open && t.at >= down.0 && t.at < down.1);
    assert!(opened, "the breaker reached its verdict");
    let p = policy.snapshot(Instant::now()).pacer;
    assert_eq!((p.rate_rps, p.limit_rps, p.belief), (50.0, None, None));
    assert_eq!(p.outages, 1);
}

#[tokio::test(start_paused = true)]
async fn a_ten_second_outage_of_bare_503s_is_ridden_out() {
    a_ten_second_outage(status(503)).await;
}

#[tokio::test(start_paused = true)]
async fn a_ten_second_outage_of_refused_connections_is_ridden_out() {
    a_ten_second_outage(Reply {
        error: Some(UpstreamKind::ConnectionRefused),
        ..status(0)
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_ten_second_outage_of_reset_connections_is_ridden_out() {
    a_ten_second_outage(Reply {
        error: Some(UpstreamKind::ConnectionClosed),
        ..status(0)
    })
    .await;
}

// ------------------------------------------------- parking (issue 32)

/// A provider answering `status(200)` but during `down`, when it answers
/// `during`.
fn down_for(down: (Instant, Instant), during: Reply) -> Provider {
    Provider::new(move |_| {
        let now = Instant::now();
        if now >= down.0 && now < down.1 {
            during
        } else {
            status(200)
        }
    })
}

/// `threads` clients of `run` (or none), each sending GETs one after
/// another until `until`; what each request got, with when it was asked.
async fn clients(
    svc: &ProviderService<String, ()>,
    run: Option<&RunHandle>,
    threads: usize,
    until: Instant,
) -> Vec<(Instant, Result<u16, String>)> {
    let tasks: Vec<_> = (0..threads)
        .map(|i| {
            let (svc, run) = (svc.clone(), run.cloned());
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut n = 0;
                while Instant::now() < until {
                    let req = get(format!("t{i}-{n}"));
                    let req = match &run {
                        Some(run) => with_run(req, run),
                        None => req,
                    };
                    let asked = Instant::now();
                    let r = svc.clone().oneshot(req).await;
                    got.push((
                        asked,
                        r.map(|r| r.status().as_u16()).map_err(|e| e.to_string()),
                    ));
                    n += 1;
                }
                got
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.extend(t.await.unwrap());
    }
    out
}

/// Answers the provider gave in `[from, from + secs)`, per second.
fn per_second(provider: &Provider, from: Instant, secs: f64, status_ok: bool) -> f64 {
    let to = from + Duration::from_secs_f64(secs);
    let n = provider
        .arrivals()
        .iter()
        .filter(|(at, _)| *at >= from && *at < to)
        .count() as f64;
    if status_ok {
        n / secs
    } else {
        n
    }
}

/// Issue 32's first Done-when line on the paused clock (R-RN8): eight
/// clients of a run at a provider paced at its ceiling; the provider
/// answers a bare `503` to everything for 5 s. The run's requests see no
/// failure, only latency: the outage is told after three failures, the
/// requests are parked, only probes reach the provider (at most two a
/// second), and within a second of its return the successes are back at
/// the rate before. No retry was spent; each cycle of the outage was one
/// wait.
#[tokio::test(start_paused = true)]
async fn a_short_outage_reaches_a_run_as_latency() {
    let (policy, _) = policy(ProviderSettings::with_ceiling(50.0));
    let t0 = Instant::now();
    let down = (t0 + Duration::from_secs(20), t0 + Duration::from_secs(25));
    let provider = down_for(down, status(503));
    let svc = stack(&policy, &provider);
    let run = RunHandle::new(Envelope {
        max_cooldown_waits: 3,
        ..Envelope::default()
    });
    let got = clients(&svc, Some(&run), 8, t0 + Duration::from_secs(30)).await;
    let failed: Vec<_> = got.iter().filter(|(_, r)| *r != Ok(200)).collect();
    assert!(failed.is_empty(), "{failed:?}");
    let before = per_second(&provider, down.0 - Duration::from_secs(10), 10.0, true);
    let during = per_second(&provider, down.0, 5.0, false);
    let back = per_second(&provider, down.1 + Duration::from_secs(1), 1.0, true);
    assert!(before >= 49.0, "{before}/s before");
    assert!(
        during <= 10.0,
        "{during} requests in 5 s of outage: {:?}",
        provider
            .arrivals()
            .iter()
            .filter(|(at, _)| *at >= down.0 && *at < down.1)
            .map(|(at, id)| (*at - down.0, id.clone()))
            .collect::<Vec<_>>()
    );
    assert!(
        back >= 0.9 * before,
        "{back}/s in the second after the first"
    );
    let state = run.state();
    assert_eq!(state.retries, 0, "parked re-sends are not retries");
    // Down from 20 s to the probe after 25 s: into its second cycle of
    // `breaker_open_for`, each one wait however many were parked.
    assert_eq!(state.waits_total, 2, "{state:?}");
    let p = policy.snapshot(Instant::now());
    assert_eq!(p.pacer.rate_rps, 50.0, "{:?}", p.pacer);
    assert_eq!((p.pacer.limit_rps, p.pacer.outages), (None, 1));
    assert_eq!(p.park.watch.episodes, 1);
    assert!(p.park.resumed >= 8, "{:?}", p.park);
    assert_eq!(p.park.parked, 0);
}

/// R-RN13: a proxy user's requests are parked the same way, up to
/// `max_outage_wait` (10 s): a 5 s outage is absorbed; a provider that
/// stays down gets them `ProviderDown` at 10 s, with a `Retry-After`; with
/// `max_outage_wait = 0` its failures pass at once.
#[tokio::test(start_paused = true)]
async fn a_proxy_user_is_parked_up_to_max_outage_wait() {
    let t0 = Instant::now();
    let (policy_a, _) = policy(ProviderSettings::with_ceiling(50.0));
    let short = down_for(
        (t0 + Duration::from_secs(5), t0 + Duration::from_secs(10)),
        status(503),
    );
    let got = clients(
        &stack(&policy_a, &short),
        None,
        8,
        t0 + Duration::from_secs(15),
    )
    .await;
    let failed: Vec<_> = got.iter().filter(|(_, r)| *r != Ok(200)).collect();
    assert!(failed.is_empty(), "{failed:?}");

    let t1 = Instant::now();
    let (policy_b, _) = policy(ProviderSettings::with_ceiling(50.0));
    let long = down_for(
        (t1 + Duration::from_secs(1), t1 + Duration::from_secs(3600)),
        status(503),
    );
    let got = clients(
        &stack(&policy_b, &long),
        None,
        8,
        t1 + Duration::from_secs(5),
    )
    .await;
    let gave_up: Vec<_> = got
        .iter()
        .filter(|(_, r)| r.as_ref().is_err_and(|e| e.starts_with("provider down")))
        .collect();
    assert_eq!(gave_up.len(), 8, "{got:?}");
    for (asked, r) in &gave_up {
        assert!(
            r.as_ref().unwrap_err().contains("parked 10s"),
            "{asked:?} {r:?}"
        );
    }
    assert!(got
        .iter()
        .all(|(_, r)| r.as_ref().is_ok_and(|s| *s == 200) || r.is_err()));

    let mut settings = ProviderSettings::with_ceiling(50.0);
    settings.max_outage_wait = Duration::ZERO;
    let (policy_c, _) = policy(settings);
    let dead = Provider::new(|_| status(503));
    let svc = stack(&policy_c, &dead);
    let t2 = Instant::now();
    let r = svc.clone().oneshot(get("x")).await.unwrap();
    assert_eq!(r.status(), 503);
    assert!(
        Instant::now() - t2 < Duration::from_secs(2),
        "retried, never parked"
    );
}

/// R-RN8: a request the provider may have acted on is never sent again.
/// A run's `POST` that goes as the probe of a provider down (its breaker
/// opened by proxy users' failures) and whose connection is reset after it
/// was sent goes back as it is — one arrival; a `POST` answered `503` (the
/// provider says it did not process it) is parked again and sent with the
/// next probe, which the provider, back, answers.
#[tokio::test(start_paused = true)]
async fn a_post_is_parked_only_when_the_answer_proves_it_unprocessed() {
    let (policy, _) = policy(quick_breaker());
    let provider = Provider::new(|n| match n {
        0..4 => status(500),
        4 => status(503),
        _ => status(200),
    });
    let reset = Provider::new(|_| Reply {
        error: Some(UpstreamKind::ConnectionClosed),
        ..status(0)
    });
    let svc = stack(&policy, &provider);
    // The same provider's stack over an upstream that resets every
    // connection: the policy, and so the outage watch, is shared.
    let resetting = stack(&policy, &reset);
    for i in 0..4 {
        let r = svc.clone().oneshot(get(i.to_string())).await;
        assert_eq!(r.unwrap().status(), 500);
    }
    let run = RunHandle::new(Envelope {
        max_cooldown_waits: 3,
        ..Envelope::default()
    });
    let post = |id: &str| {
        let req = Request::post("http://provider.test/")
            .body(id.to_string())
            .unwrap();
        with_run(req, &run)
    };
    let t0 = Instant::now();
    let r = resetting.oneshot(post("reset")).await;
    assert!(
        matches!(&r, Err(Cause::Upstream(u)) if u.kind == UpstreamKind::ConnectionClosed),
        "{:?}",
        r.map(|r| r.status())
    );
    assert_eq!(reset.arrivals().len(), 1, "never sent twice");
    assert_eq!(
        Instant::now() - t0,
        PROBE_FIRST_WAIT - INTERVAL,
        "as the probe"
    );
    let r = svc.clone().oneshot(post("busy")).await.unwrap();
    assert_eq!(r.status(), 200, "parked, then sent again");
    let busy: Vec<Duration> = provider
        .arrivals()
        .iter()
        .filter(|(_, id)| id == "busy")
        .map(|(at, _)| *at - t0)
        .collect();
    // Probes a second apart once one failed: the reset at 0.3 s, the 503
    // at 1.3 s, the 200 at 2.3 s.
    assert_eq!(
        busy,
        [Duration::from_millis(1300), Duration::from_millis(2300)]
    );
    assert_eq!(run.state().attempts, 3);
}

//! Limiters whose headers mislead, and the limiters a provider is most
//! often built on (issue 35, R-SG1, R-SG5, R-PD6): the real binary on its
//! default config (loopback allowed), 8 naive Python clients per provider
//! configured only by `HTTP_PROXY`, judged at the provider over 30–60 s.

use std::time::Duration;

use sluice_tests::clients::naive_clients;
use sluice_tests::flask_limiter::{judge, FlaskLimiter, Strategy};
use sluice_tests::harness::Sluice;
use sluice_tests::sim::Sim;

const CONFIG: &str = "[destinations]\nallow = [\"127.0.0.0/8\"]\n";

/// Flask-Limiter at 20 a second, in its moving window and in its fixed
/// window (which begins at the first request after the last one expired),
/// each with its headers and without — four providers behind one sluice at
/// once. With headers, its `X-RateLimit-Reset` lies up to 2 s past the
/// real reset (the window's end + 1 s, rounded): held to it, the moving
/// window was used at 0.53–0.69 and the fixed one at 0.74–0.92; without,
/// AIMD alone reached 0.87 and 0.92. Issue 35 asks ≥ 0.95 of each with
/// ≤ 1 % refused over 30–60 s. Measured over five runs: moving window
/// 0.968–0.972 with its headers and 0.962–0.975 without, fixed window
/// 0.983–0.995 with and 0.973–0.975 without, 0–0.17 % refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flask_limiters_windows_are_used_with_and_without_their_headers() {
    let cases = [
        ("moving, headers", "127.0.9.11", Strategy::Moving, true),
        ("moving, none", "127.0.9.12", Strategy::Moving, false),
        ("fixed, headers", "127.0.9.13", Strategy::Fixed, true),
        ("fixed, none", "127.0.9.14", Strategy::Fixed, false),
    ];
    let providers: Vec<FlaskLimiter> = cases
        .iter()
        .map(|(_, ip, strategy, headers)| FlaskLimiter::start(ip, *strategy, *headers))
        .collect();
    let s = Sluice::start(CONFIG);
    let proxy = s.proxy_url();
    let urls: Vec<String> = providers.iter().map(FlaskLimiter::url).collect();
    let seen = tokio::join!(
        naive_clients(&proxy, &urls[0], 8, 60, &[]),
        naive_clients(&proxy, &urls[1], 8, 60, &[]),
        naive_clients(&proxy, &urls[2], 8, 60, &[]),
        naive_clients(&proxy, &urls[3], 8, 60, &[]),
    );
    let seen = [seen.0, seen.1, seen.2, seen.3];
    let mut failed = Vec::new();
    for ((name, ip, ..), (p, clients)) in cases.iter().zip(providers.iter().zip(&seen)) {
        let (used, refused) = judge(&p.seen(), 30.0, 60.0, 20.0);
        let (_, readout) = s.admin_get(&format!("/v1/providers/{ip}")).await;
        let r: serde_json::Value = serde_json::from_str(&readout).unwrap_or_default();
        println!(
            "{name:<15} 30–60 s: {used:.3} of 20/s used, {:.2} % refused; clients saw {}; \
             pace {} ({}), quota {}",
            refused * 100.0,
            clients.trim(),
            r["rate_rps"],
            r["pace_authority"],
            r["quota"],
        );
        if used < 0.95 || refused > 0.01 {
            failed.push(format!(
                "{name}: {used:.3} used, {:.2} % refused",
                refused * 100.0
            ));
        }
    }
    assert!(failed.is_empty(), "≥ 0.95 used, ≤ 1 % refused: {failed:?}");
}

/// The commonest API limiter: a token bucket of 20 a second with a burst
/// of 5, answering a bare `429` over it (no `Retry-After`, no headers):
/// ≥ 0.97 of it used over 30–60 s, ≤ 1 % refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_burst_token_bucket_with_bare_429s_is_used_to_its_rate() {
    let sim = Sim::start("127.0.9.15").await;
    sim.set_limit(20.0, 5.0);
    let s = Sluice::start(CONFIG);
    let clients = naive_clients(&s.proxy_url(), &sim.url("http", "/limited"), 8, 60, &[]).await;
    let f = sim.figures("/limited", 30, 60, 20.0);
    println!(
        "bucket 20 b=5, bare 429, 30–60 s: {f}; clients saw {}",
        clients.trim()
    );
    assert!(f.goodput >= 0.97, "{:.3} used", f.goodput);
    assert!(
        f.throttled_share <= 0.01,
        "{:.2} % refused",
        f.throttled_share * 100.0
    );
}

/// Where sluice already won and must go on winning: a quota of 1,200 a
/// minute advertised in `X-RateLimit-*` is spent evenly — every 10 s of
/// the run within a tenth of its share — and never refused, where the AWS
/// SDK's adaptive mode burns it in 2.5 s and is refused for the rest of
/// the minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_minute_quota_is_still_spent_evenly() {
    let sim = Sim::start("127.0.9.16").await;
    let s = Sluice::start(CONFIG);
    let path = "/quota/x/1200/60/1";
    let clients = naive_clients(&s.proxy_url(), &sim.url("http", path), 8, 50, &[]).await;
    let hits = sim.hits(path);
    let t0 = hits.first().expect("the provider saw requests").at;
    let refused = hits.iter().filter(|h| h.status != 200).count();
    let per_10s: Vec<usize> = (0..5)
        .map(|k| {
            let (a, b) = (
                t0 + Duration::from_secs(10 * k),
                t0 + Duration::from_secs(10 * (k + 1)),
            );
            hits.iter()
                .filter(|h| h.status == 200 && h.at >= a && h.at < b)
                .count()
        })
        .collect();
    println!(
        "1,200/min: served per 10 s {per_10s:?}, {refused} refused; clients saw {}",
        clients.trim()
    );
    assert_eq!(refused, 0, "never refused");
    // The first 10 s include the cold start; from then on, even.
    for n in &per_10s[1..] {
        assert!((180..=220).contains(n), "evenly, 200 per 10 s: {per_10s:?}");
    }
}

//! Budgets told in the providers' own dialects (issue 35, R-PD1, R-PD2,
//! R-PD4, R-PD6), through the real binary: simulators written from each
//! provider's documentation (`sluice_tests::saas`), naive clients that
//! know nothing of them, configured only by `HTTP_PROXY`.

use std::time::Duration;

use sluice_tests::clients::{curl, naive_clients};
use sluice_tests::harness::Sluice;
use sluice_tests::saas::{seen, Google, Judged, Reddit, Salesforce, Shopify};
use sluice_tests::sim::Sim;

fn config(ip: &str, dialect: &str) -> String {
    format!(
        "[destinations]\nallow = [\"127.0.0.0/8\"]\n\
         [providers.p]\nhosts = [\"{ip}\"]\ndialect = \"{dialect}\"\n"
    )
}

const MAX: Duration = Duration::from_secs(20);

/// Served per second over `[from, to)` seconds after the first request,
/// as a share of `rate`, and the share refused.
fn judge(judged: &[Judged], from: u64, to: u64, rate: f64) -> (f64, f64) {
    let t0 = judged.first().expect("requests").at;
    let (served, refused) = seen(
        judged,
        t0 + Duration::from_secs(from),
        t0 + Duration::from_secs(to),
    );
    let share = served as f64 / (to - from) as f64 / rate;
    (share, refused as f64 / (served + refused).max(1) as f64)
}

/// Served in each second from the first request: where a shortfall lies
/// (a stall, a period's end held too long), for a failure's message.
fn per_second(judged: &[Judged]) -> Vec<usize> {
    let t0 = judged.first().map(|j| j.at);
    let mut served = Vec::new();
    for j in judged.iter().filter(|j| j.served) {
        let i = t0.map_or(0, |t0| (j.at - t0).as_secs() as usize);
        if served.len() <= i {
            served.resize(i + 1, 0);
        }
        served[i] += 1;
    }
    served
}

/// Shopify's REST leaky bucket (40, draining 2 a second), found full: the
/// first answer's `Retry-After: 2.0` (a decimal) is waited out, and the
/// naive clients after it are paced at the drain — ≥ 0.95 of it, ≤ 0.5 %
/// refused — told by `X-Shopify-Shop-Api-Call-Limit`, never probed above.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shopify_is_paced_at_its_buckets_drain() {
    let ip = "127.0.7.4";
    let sim = Sim::start_model(ip, Shopify::new(40, 2.0, 40)).await;
    let s = Sluice::start(&config(ip, "shopify"));
    let url = sim.url("http", "/admin/api/2025-01/products.json");
    let r = curl(&s.proxy_url(), &[], &url, MAX).await;
    assert_eq!(r.status, 200, "{r:?}");
    let first: Vec<Judged> = sim.model(|m: &Shopify| m.judged.clone());
    assert_eq!(first.len(), 2, "refused once, then served: {first:?}");
    let waited = first[1].at - first[0].at;
    assert!(
        waited >= Duration::from_secs(2),
        "Retry-After: 2.0 waited out: {waited:?}"
    );
    let seen = naive_clients(&s.proxy_url(), &url, 8, 40, &[]).await;
    let judged = sim.model(|m: &Shopify| m.judged[2..].to_vec());
    let (share, refused) = judge(&judged, 5, 39, 2.0);
    println!(
        "clients saw {seen}; {share:.3} of the drain used, {:.2} % refused",
        refused * 100.0
    );
    assert!(
        share >= 0.95,
        "{share:.3} of the drain used; served a second: {:?}",
        per_second(&judged)
    );
    assert!(refused <= 0.005, "{:.2} % refused", refused * 100.0);
}

/// Salesforce's rolling daily allowance (here 86,400 a day: one a second),
/// told in `Sforce-Limit-Info`: paced as an allowance — spread at what it
/// refills, not spent at once — and never refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn salesforce_daily_usage_is_paced_as_an_allowance() {
    let ip = "127.0.7.5";
    let day = Duration::from_secs(24 * 3600);
    let sim = Sim::start_model(ip, Salesforce::new(86_400, day)).await;
    let s = Sluice::start(&config(ip, "salesforce"));
    let url = sim.url(
        "http",
        "/services/data/v62.0/query?q=SELECT+Id+FROM+Account",
    );
    let seen = naive_clients(&s.proxy_url(), &url, 4, 25, &[]).await;
    let judged = sim.model(|m: &Salesforce| m.judged.clone());
    let (share, refused) = judge(&judged, 3, 24, 1.0);
    println!("clients saw {seen}; {share:.3} of the allowance's rate, {refused} refused");
    // Over 21 s one request more or less is ±0.05.
    assert!(
        (0.9..=1.1).contains(&share),
        "spread at the allowance's rate: {share:.3}"
    );
    assert_eq!(refused, 0.0);
}

/// Reddit's clock-aligned periods (here 50 per 5 s), told with a float
/// `X-Ratelimit-Remaining` (`45.0`) and the seconds to the period's end:
/// ≥ 0.95 used, ≤ 0.5 % refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reddits_float_remaining_is_read() {
    let ip = "127.0.7.6";
    let sim = Sim::start_model(ip, Reddit::new(50, Duration::from_secs(5))).await;
    let s = Sluice::start(&config(ip, "reddit"));
    let url = sim.url("http", "/r/rust/new.json?limit=100");
    let seen = naive_clients(&s.proxy_url(), &url, 8, 35, &[]).await;
    let judged = sim.model(|m: &Reddit| m.judged.clone());
    let (share, refused) = judge(&judged, 10, 30, 10.0);
    println!(
        "clients saw {seen}; {share:.3} used, {:.2} % refused",
        refused * 100.0
    );
    assert!(
        share >= 0.95,
        "{share:.3} used; served a second: {:?}",
        per_second(&judged)
    );
    assert!(refused <= 0.005, "{:.2} % refused", refused * 100.0);
    let p = s.api("GET", "/v1/providers/p", None).await.1;
    assert_eq!(p["quota"]["family"], "x-ratelimit", "{p}");
}

/// Google's `RetryInfo` in a `429`'s body (no headers at all): the
/// request is sent again when the delay it names has passed — not before,
/// and not rounded up to whole seconds — and the client gets the `200`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn googles_retry_info_is_honoured_exactly() {
    let ip = "127.0.7.7";
    let sim = Sim::start_model(ip, Google::new(5, Duration::from_millis(3_300))).await;
    let s = Sluice::start(&config(ip, "google"));
    let url = sim.url("http", "/v4/spreadsheets/x/values/A1");
    for _ in 0..6 {
        let r = curl(&s.proxy_url(), &[], &url, MAX).await;
        assert_eq!(r.status, 200, "{r:?}");
    }
    let judged = sim.model(|m: &Google| m.judged.clone());
    let refusals: Vec<_> = judged
        .iter()
        .enumerate()
        .filter_map(|(i, (j, d))| d.map(|d| (i, j.at, d)))
        .collect();
    assert_eq!(refusals.len(), 1, "one refusal: {judged:?}");
    let (i, at, delay) = refusals[0];
    let again = judged[i + 1].0.at - at;
    println!("told {delay:?}, sent again after {again:?}");
    assert!(
        again >= delay,
        "never before the delay: {again:?} < {delay:?}"
    );
    assert!(
        again < delay + Duration::from_millis(500),
        "the delay as told, not rounded up: {again:?} for {delay:?}"
    );
}

//! sluice against HAProxy's sliding-window limiter, beside the AWS SDK's
//! adaptive limiter — real botocore — on the same limiter shape, in one
//! run (issue 21, R-SG5).
//!
//! `cargo build --release -p sluice && SLUICE_BIN=target/release/sluice
//! cargo run --release -p sluice-tests --bin bench_haproxy [SECS]`
//!
//! Debian's HAProxy with two frontends, each its own stick table counting
//! `http_req_rate(1s)` (refused requests count) and denying with a bare
//! `429` past 20 req/s. On one, 8 naive Python `requests` threads through
//! the real `sluice` binary (configured by `HTTP_PROXY` only); on the
//! other, 8 threads sending directly, gated by botocore's own
//! `ClientRateLimiter` (`botocore.retries.adaptive`: its CUBIC calculator,
//! rate clocker, token bucket and `ThrottlingErrorDetector`), each `429`
//! handed to it with a throttling error code as an AWS service sends one.
//! Printed for each: goodput (successes per second over the limit) and the
//! refused share, over the first 60 s and over 30–60 s, measured from
//! HAProxy's log.

use sluice_tests::clients::{botocore_clients, naive_clients};
use sluice_tests::haproxy::{figures, now_ms, Haproxy};
use sluice_tests::harness::Sluice;

const LIMIT: u32 = 20;
const CLIENTS: u32 = 8;

#[tokio::main]
async fn main() {
    let secs: u32 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let (via_sluice, via_aws) = ("127.0.0.41", "127.0.0.42");
    let haproxy = Haproxy::start(&[via_sluice, via_aws], LIMIT);
    let sluice = Sluice::start("[destinations]\nallow = [\"127.0.0.0/8\"]\n");
    let (proxy, target) = (sluice.proxy_url(), haproxy.url(via_sluice, "/items"));
    let t0 = now_ms();
    let aws_url = haproxy.url(via_aws, "/items");
    let aws = botocore_clients(&aws_url, CLIENTS, secs);
    // sluice's learned rate and throttle point, every second.
    let trace = async {
        let mut points = Vec::new();
        for _ in 0..secs {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            let (_, body) = sluice.admin_get("/v1/providers").await;
            let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            let p = v["providers"]
                .as_array()
                .and_then(|ps| ps.iter().find(|p| p["name"] == via_sluice).cloned())
                .unwrap_or_default();
            points.push(format!(
                "{:.1}/{}",
                p["rate_rps"].as_f64().unwrap_or(0.0),
                p["throttle_point_rps"]
                    .as_f64()
                    .map_or("-".to_string(), |l| format!("{l:.1}"))
            ));
        }
        points
    };
    let (ours, theirs, points) = tokio::join!(
        naive_clients(&proxy, &target, CLIENTS, secs, &[]),
        aws,
        trace
    );
    println!(
        "sluice's rate / throttle point, each second: {}",
        points.join(" ")
    );
    let refused: Vec<String> = haproxy
        .answers(via_sluice)
        .iter()
        .filter(|a| a.status != 200)
        .map(|a| format!("{:.2}", (a.at_ms.saturating_sub(t0)) as f64 / 1000.0))
        .collect();
    println!("sluice's refusals at (s): {}", refused.join(" "));
    let end = t0 + u64::from(secs) * 1000;
    let half = t0 + u64::from(secs) * 500;
    println!(
        "HAProxy http_req_rate(1s) > {LIMIT} → 429 (refusals counted), {CLIENTS} naive clients each, {secs} s"
    );
    println!(
        "{:<28} | {:>20} | {:>20} | clients saw",
        "contender", "goodput / 429, all", "second half"
    );
    for (name, ip, seen) in [
        ("sluice (real binary)", via_sluice, ours.trim().to_string()),
        (
            "AWS adaptive (botocore)",
            via_aws,
            theirs.trim().to_string(),
        ),
    ] {
        let answers = haproxy.answers(ip);
        let all = figures(&answers, t0, end, f64::from(LIMIT));
        let late = figures(&answers, half, end, f64::from(LIMIT));
        let (g, r) = (all.goodput, all.throttled_share);
        let (g2, r2, n2) = (late.goodput, late.throttled_share, late.attempts);
        println!(
            "{name:<28} | {:>6.1} % / {:>6.2} % | {:>6.1} % / {:>6.2} % | {seen} ({n2} answers in the second half)",
            g * 100.0,
            r * 100.0,
            g2 * 100.0,
            r2 * 100.0
        );
    }
}

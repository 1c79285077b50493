//! Provider dialects through the real binary (issue 35, R-PD2, R-PD3,
//! R-PD4): the simulator answers as each provider's documentation says
//! (`/dialect/...`), a naive client (curl) knows nothing of it, and
//! sluice reads each answer as its provider means it.

use std::time::Duration;

use serde_json::Value;
use sluice_tests::clients::curl;
use sluice_tests::harness::Sluice;
use sluice_tests::sim::Sim;

/// One provider per dialect, each on its own loopback address.
fn config(github: &str, openai: &str, anthropic: &str, generic: &str) -> String {
    format!(
        "[destinations]\nallow = [\"127.0.0.0/8\"]\n\
         [providers.gh]\nhosts = [\"{github}\"]\ndialect = \"github\"\n\
         [providers.oa]\nhosts = [\"{openai}\"]\ndialect = \"openai\"\n\
         [providers.an]\nhosts = [\"{anthropic}\"]\ndialect = \"anthropic\"\n\
         [providers.plain]\nhosts = [\"{generic}\"]\n"
    )
}

async fn readout(s: &Sluice, name: &str) -> Value {
    s.api("GET", &format!("/v1/providers/{name}"), None).await.1
}

const MAX: Duration = Duration::from_secs(20);

/// R-PD3: GitHub's throttles answered `403` are held like a `429` — the
/// primary limit until its Unix-time reset, the secondary for its
/// `retry-after` — and the client gets the `200` after them; a permission
/// `403` (budget left, another message) reaches the client at once, whole
/// (a 40 KiB body, past the 16 KiB read ahead), and cuts nothing. The same
/// primary-limit `403` from a provider of no dialect is the client's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn github_403_throttles_are_held_and_permission_403s_pass() {
    let ips = ["127.0.6.1", "127.0.6.2", "127.0.6.3", "127.0.6.4"];
    let sims = [
        Sim::start(ips[0]).await,
        Sim::start(ips[1]).await,
        Sim::start(ips[2]).await,
        Sim::start(ips[3]).await,
    ];
    let s = Sluice::start(&config(ips[0], ips[1], ips[2], ips[3]));
    let gh = &sims[0];

    for kind in ["github-primary", "github-secondary"] {
        let path = format!("/dialect/{kind}/1");
        let r = curl(&s.proxy_url(), &[], &gh.url("http", &path), MAX).await;
        let seen: Vec<u16> = gh.hits(&path).iter().map(|h| h.status).collect();
        assert_eq!(r.status, 200, "{kind}: the client got {r:?}");
        assert_eq!(seen, [403, 200], "{kind}: held, then sent again");
    }
    let p = readout(&s, "gh").await;
    assert_eq!(p["dialect"], "github");
    assert_eq!(p["last_backoff"]["reason"], "throttled", "{p}");

    let path = "/dialect/github-forbidden/1";
    let r = curl(&s.proxy_url(), &[], &gh.url("http", path), MAX).await;
    assert_eq!(r.status, 403);
    assert_eq!(gh.hits(path).len(), 1, "never retried");
    assert!(
        r.body.len() > 40 * 1024 && r.body.ends_with(r#""end":true}"#),
        "the body whole: {} bytes",
        r.body.len()
    );
    let after = readout(&s, "gh").await;
    assert_eq!(
        after["last_backoff"]["at_unix_ms"], p["last_backoff"]["at_unix_ms"],
        "a permission 403 cuts nothing: {after}"
    );

    // No dialect: GitHub's throttle is a 403 like any other.
    let plain = &sims[3];
    let path = "/dialect/github-primary/2";
    let r = curl(&s.proxy_url(), &[], &plain.url("http", path), MAX).await;
    assert_eq!(r.status, 403);
    assert_eq!(plain.hits(path).len(), 1);
    assert_eq!(readout(&s, "plain").await["dialect"], "generic");
}

/// R-PD3: OpenAI's `insufficient_quota` `429` reaches the client on the
/// first answer — no retry, no hold, no cut; Anthropic's `529` is the
/// provider's capacity: retried and cut by AIMD as a bare `503` is,
/// without a hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llm_429s_that_no_wait_fixes_and_overload() {
    let ips = ["127.0.6.5", "127.0.6.6", "127.0.6.7", "127.0.6.8"];
    let (oa, an) = (Sim::start(ips[1]).await, Sim::start(ips[2]).await);
    let s = Sluice::start(&config(ips[0], ips[1], ips[2], ips[3]));

    let path = "/dialect/openai-quota/1";
    let r = curl(
        &s.proxy_url(),
        &["-X", "POST", "-d", "{}"],
        &oa.url("http", path),
        MAX,
    )
    .await;
    assert_eq!(r.status, 429);
    assert!(r.body.contains("insufficient_quota"), "{}", r.body);
    assert_eq!(oa.hits(path).len(), 1, "never retried");
    let p = readout(&s, "oa").await;
    assert_eq!(p["last_backoff"], "unknown", "no cut: {p}");
    assert_eq!(p["hold"], "none", "no hold: {p}");

    let path = "/dialect/anthropic-overloaded/1";
    let r = curl(&s.proxy_url(), &[], &an.url("http", path), MAX).await;
    let seen: Vec<u16> = an.hits(path).iter().map(|h| h.status).collect();
    assert_eq!(r.status, 200, "retried past the overload: {r:?}");
    assert_eq!(seen, [529, 529, 200]);
    let p = readout(&s, "an").await;
    assert_eq!(p["hold"], "none", "no hold: {p}");
    assert_eq!(p["dialect"], "anthropic");
}

/// R-CB1, R-PD3 (issue 35): a provider answering nothing but throttles
/// opens the breaker — and sluice's own answers while it is open are a
/// throttle (`429`, `Retry-After`, `Proxy-Status` naming the pressure),
/// never `503 destination_unavailable`, which clients take for an outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_circuit_opened_by_throttles_answers_as_a_throttle() {
    let ip = "127.0.6.9";
    let sim = Sim::start(ip).await;
    let s = Sluice::start(&format!(
        "[destinations]\nallow = [\"127.0.0.0/8\"]\n\
         [providers.p]\nhosts = [\"{ip}\"]\nbreaker_min_calls = 5\nretry_max_attempts = 1\n"
    ));
    let url = sim.url("http", "/status/429");
    let mut own = Vec::new();
    // Bounded: 40 requests at most, each within MAX.
    for _ in 0..40 {
        let r = curl(&s.proxy_url(), &[], &url, MAX).await;
        assert_ne!(
            r.status, 503,
            "a throttled provider answered as down: {r:?}"
        );
        if r.headers
            .to_ascii_lowercase()
            .contains("proxy-status: sluice")
        {
            own.push(r);
            if own.len() == 3 {
                break;
            }
        }
    }
    let p = readout(&s, "p").await;
    assert_eq!(p["breaker"]["state"], "open", "{p}");
    assert!(
        !own.is_empty(),
        "sluice never answered for the open breaker"
    );
    for r in &own {
        let h = r.headers.to_ascii_lowercase();
        assert_eq!(r.status, 429, "{r:?}");
        assert!(h.contains("retry-after:"), "{h}");
        assert!(
            h.contains("error=http_request_denied") && h.contains("throttling"),
            "{h}"
        );
    }
}

//! R-AI1, R-GC1 end to end: naive clients against a provider with a hidden
//! limit, through sluice. Measured at the provider, which is what counts.

use sluice_tests::clients::naive_clients;
use sluice_tests::harness::Sluice;
use sluice_tests::sim::{Figures, Sim};

/// A provider on `ip` whose `path` has a hidden limit (`limit` req/s, a
/// burst of `burst`), `clients` naive clients on it through a fresh sluice
/// for `secs`; the provider's figures over the second half, and what the
/// clients saw.
async fn limited_run(
    ip: &str,
    path: &str,
    (limit, burst): (f64, f64),
    clients: u32,
    secs: u32,
) -> (Figures, String) {
    let sim = Sim::start(ip).await;
    sim.set_limit(limit, burst);
    let sluice = Sluice::start("[destinations]\nallow = [\"127.0.0.0/8\"]\n");
    let seen = naive_clients(
        &sluice.proxy_url(),
        &sim.url("http", path),
        clients,
        secs,
        &[],
    )
    .await;
    let half = u64::from(secs) / 2;
    (
        sim.figures(path, half, 2 * half, limit),
        seen.trim().to_string(),
    )
}

/// 8 naive clients (no backoff of their own) for 30 s against a hidden
/// limit of 20 req/s: over the last 15 s the provider accepts ≥ 95 % of its
/// limit and ≤ 2 % of the attempts it sees are 429 (measured: 99 %, 0.7–1 %).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn naive_clients_are_paced_to_the_hidden_limit() {
    const LIMIT: f64 = 20.0;
    let (f, clients) = limited_run("127.0.0.12", "/limited", (LIMIT, 10.0), 8, 30).await;
    println!(
        "hidden limit {LIMIT} req/s, 8 naive clients, 30 s over plain HTTP; \
         last 15 s at the provider: {f}; clients saw: {clients}"
    );
    let (goodput, share) = (f.goodput, f.throttled_share);
    assert!(goodput >= 0.95, "goodput {:.1} % < 95 %", goodput * 100.0);
    assert!(share <= 0.02, "429 share {:.2} % > 2 %", share * 100.0);
}

/// R-SG3: a provider that throttles with bare 503s (no `Retry-After`) over
/// a hidden 20 req/s limit is paced as one answering 429: 8 naive clients,
/// 30 s; over the last 15 s ≥ 95 % of the limit and ≤ 1 % 503s. Also
/// R-SG4's other side: failures that fall when the rate falls are never
/// taken for an outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_throttling_with_bare_503s_is_paced_to_its_limit() {
    const LIMIT: f64 = 20.0;
    let (f, clients) = limited_run("127.0.0.13", "/limited503", (LIMIT, 10.0), 8, 30).await;
    println!(
        "hidden limit {LIMIT} req/s answered with bare 503s, 8 naive clients, 30 s; \
         last 15 s at the provider: {f}; clients saw: {clients}"
    );
    assert!(
        f.goodput >= 0.95,
        "goodput {:.1} % < 95 %",
        f.goodput * 100.0
    );
    assert!(
        f.throttled_share <= 0.01,
        "503 share {:.2} % > 1 %",
        f.throttled_share * 100.0
    );
}

/// Issue 8 (slow providers): a 5 req/s limit answering 429 with
/// `Retry-After: 1`. 8 naive clients for 60 s; over the second half ≤ 0.5 %
/// of the attempts the provider saw were 429s, and it got ≥ 90 % of its
/// limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_provider_with_retry_after_sees_almost_no_429s() {
    const LIMIT: f64 = 5.0;
    let (f, clients) = limited_run("127.0.0.14", "/limited-ra/1", (LIMIT, 3.0), 8, 60).await;
    println!(
        "hidden limit {LIMIT} req/s, 429 with Retry-After: 1, 8 naive clients, 60 s; \
         second half at the provider: {f}; clients saw: {clients}"
    );
    assert!(
        f.goodput >= 0.9,
        "goodput {:.1} % < 90 %",
        f.goodput * 100.0
    );
    assert!(
        f.throttled_share <= 0.005,
        "429 share {:.2} % > 0.5 %",
        f.throttled_share * 100.0
    );
}

/// Issue 8: answers that say nothing about pressure are not silence. A
/// provider answering 404 to everything (a collector probing ids) grows the
/// rate as one answering 200: 4 naive clients on each, at once, for 12 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_found_answers_grow_the_rate_like_successes() {
    let ok = Sim::start("127.0.0.15").await;
    let missing = Sim::start("127.0.0.16").await;
    let sluice = Sluice::start("[destinations]\nallow = [\"127.0.0.0/8\"]\n");
    let proxy = sluice.proxy_url();
    let (ok_url, missing_url) = (
        ok.url("http", "/ok"),
        missing.url("http", "/no-such-record"),
    );
    let (a, b) = tokio::join!(
        naive_clients(&proxy, &ok_url, 4, 12, &[]),
        naive_clients(&proxy, &missing_url, 4, 12, &[]),
    );
    println!("200s: {}; 404s: {}", a.trim(), b.trim());
    let (_, body) = sluice.admin_get("/v1/providers").await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let rate = |ip: &str| {
        v["providers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"].as_str().is_some_and(|n| n.starts_with(ip)))
            .and_then(|p| p["rate_rps"].as_f64())
            .unwrap_or_else(|| panic!("no rate for {ip} in {body}"))
    };
    let (r_ok, r_missing) = (rate("127.0.0.15"), rate("127.0.0.16"));
    println!("rate after 12 s: 200s {r_ok:.1} req/s, 404s {r_missing:.1} req/s (start 5)");
    assert!(r_ok > 10.0, "the 200 provider grew: {r_ok}");
    assert!(
        r_missing >= 0.8 * r_ok,
        "404s grew the rate to {r_missing:.1}, 200s to {r_ok:.1}"
    );
}

/// R-SG3: a provider that never refuses but slows down when pushed past
/// 20 req/s (it serves in arrival order; 16 naive clients would keep a
/// queue of up to 16 waiting there, 0.8 s each) is paced to it by latency
/// alone: over the last 15 s of 30 the median wait in its queue stays short
/// (unpaced it would be ~800 ms), and it serves ≥ 75 % of its capacity — a
/// latency signal comes only once a queue has built, so sluice settles a
/// little further below a queueing provider's capacity than below a
/// refusing one's (measured: 79.7 %, median wait 50 ms, its service time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_slows_down_past_its_limit_is_paced_to_it() {
    const CAPACITY: f64 = 20.0;
    let sim = Sim::start("127.0.0.17").await;
    let sluice = Sluice::start("[destinations]\nallow = [\"127.0.0.0/8\"]\n");
    let clients = naive_clients(
        &sluice.proxy_url(),
        &sim.url("http", "/queue/20"),
        16,
        30,
        &[],
    )
    .await;
    let f = sim.figures("/queue/20", 15, 30, CAPACITY);
    let start = sim.hits("/queue/20").first().unwrap().at;
    let mut waits: Vec<_> = sim
        .hits("/queue/20")
        .iter()
        .filter(|h| h.at >= start + std::time::Duration::from_secs(15))
        .map(|h| h.delay)
        .collect();
    waits.sort();
    let median = waits[waits.len() / 2];
    let (_, providers) = sluice.admin_get("/v1/providers").await;
    println!(
        "queueing provider, capacity {CAPACITY} req/s, 16 naive clients, 30 s; last 15 s: {f}; \
         median wait in its queue {median:?}; clients saw: {}; {providers}",
        clients.trim()
    );
    assert!(
        f.goodput >= 0.75,
        "served {:.1} % of capacity",
        f.goodput * 100.0
    );
    assert!(
        median <= std::time::Duration::from_millis(300),
        "median wait {median:?}: the queue was not kept short (unpaced: ~800 ms)"
    );
}

/// R-SG4's other side, over a minute (issue 18): failures that fall as the
/// rate falls stay a throttle. Behind one sluice, each with 8 naive
/// clients for 60 s: two hidden 20 req/s token buckets — one answering
/// bare 503s over it, one 429 with `Retry-After: 1` — and (issue 21) real
/// nginx `limit_req` at 20 r/s, `burst=5`, refusing with its bare 503, once
/// with `nodelay` (a burst passes at once, the rest refused) and once
/// without (a burst waits its turn). Over the second half: the bare-503
/// bucket ≥ 95 % of its limit with ≤ 1 % 503s, the `Retry-After` one
/// ≥ 97 % with ≤ 0.5 % 429s (measured 99.3–99.5 % / 0 %: the time each
/// rate lasted after a hold told the bucket's refill rate; 96.3–96.7 %
/// before), each nginx ≥ 97 % with ≤ 0.5 % 503s (measured in nginx's
/// log: nodelay 98.2 % / 0.17 %, delay 97.0 % / 0.34 %). The first 60 s
/// from a cold start printed for each. Without
/// `nodelay` nginx queues what comes early, so a cut is followed by a
/// second of slow answers while that backlog drains; taken for a latency
/// shift it cut again and held the rate at 85–88 % of the limit.
/// (Named to sort first, so that this minute runs beside the shorter
/// tests, not after them.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minute_of_throttling_stays_a_throttle() {
    use sluice_tests::nginx::{figures, now_ms, Burst, Nginx};
    const LIMIT: f64 = 20.0;
    let bare = Sim::start("127.0.0.18").await;
    let named = Sim::start("127.0.0.19").await;
    bare.set_limit(LIMIT, 10.0);
    named.set_limit(LIMIT, 10.0);
    let (nodelay, delay) = ("127.0.0.45", "127.0.0.51");
    let eager = Nginx::limit_req(&[nodelay], LIMIT as u32, Burst::NoDelay(5));
    let queued = Nginx::limit_req(&[delay], LIMIT as u32, Burst::Delay(5));
    let sluice = Sluice::start("[destinations]\nallow = [\"127.0.0.0/8\"]\n");
    let proxy = sluice.proxy_url();
    let (bare_url, named_url) = (
        bare.url("http", "/limited503"),
        named.url("http", "/limited-ra/1"),
    );
    let (eager_url, queued_url) = (eager.url(nodelay, "/items"), queued.url(delay, "/items"));
    let t0 = now_ms();
    let (a, b, c, d) = tokio::join!(
        naive_clients(&proxy, &bare_url, 8, 60, &[]),
        naive_clients(&proxy, &named_url, 8, 60, &[]),
        naive_clients(&proxy, &eager_url, 8, 60, &[]),
        naive_clients(&proxy, &queued_url, 8, 60, &[]),
    );
    let fb = bare.figures("/limited503", 30, 60, LIMIT);
    let fn_ = named.figures("/limited-ra/1", 30, 60, LIMIT);
    let (half, end) = (t0 + 30_000, t0 + 60_000);
    let (ea, qa) = (eager.answers(nodelay), queued.answers(delay));
    let (ef, qf) = (
        figures(&ea, half, end, LIMIT),
        figures(&qa, half, end, LIMIT),
    );
    // Time to converge: the whole minute from a cold start.
    let (cb, cn, ce, cq) = (
        bare.figures("/limited503", 0, 60, LIMIT),
        named.figures("/limited-ra/1", 0, 60, LIMIT),
        figures(&ea, t0, end, LIMIT),
        figures(&qa, t0, end, LIMIT),
    );
    let (_, providers) = sluice.admin_get("/v1/providers").await;
    println!(
        "hidden {LIMIT} req/s, 8 naive clients each, 60 s; second half at the provider:\n  \
         bare 503: {fb}; clients saw: {}\n  429 + Retry-After: {fn_}; clients saw: {}\n  \
         nginx limit_req burst=5 nodelay: {ef}; clients saw: {}\n  \
         nginx limit_req burst=5: {qf}; clients saw: {}\n\
         first 60 s from a cold start: bare 503 {cb}; 429 + Retry-After {cn}; \
         nginx nodelay {ce}; nginx delay {cq}\n{providers}",
        a.trim(),
        b.trim(),
        c.trim(),
        d.trim()
    );
    assert!(
        fb.goodput >= 0.95,
        "bare 503: goodput {:.1} % < 95 %",
        fb.goodput * 100.0
    );
    assert!(
        fb.throttled_share <= 0.01,
        "bare 503: 503 share {:.2} % > 1 %",
        fb.throttled_share * 100.0
    );
    assert!(
        fn_.goodput >= 0.97,
        "Retry-After: goodput {:.1} % < 97 %",
        fn_.goodput * 100.0
    );
    assert!(
        fn_.throttled_share <= 0.005,
        "Retry-After: 429 share {:.2} % > 0.5 %",
        fn_.throttled_share * 100.0
    );
    for (name, f) in [("nginx nodelay", ef), ("nginx delay", qf)] {
        // nginx's limiter holds (30 s at 20 r/s and a burst of 5 is 1.008).
        assert!(f.goodput <= 1.02, "{name}: nginx let {f} through");
        assert!(
            f.goodput >= 0.97,
            "{name}: goodput {:.1} % < 97 %",
            f.goodput * 100.0
        );
        assert!(
            f.throttled_share <= 0.005,
            "{name}: 503 share {:.2} % > 0.5 %",
            f.throttled_share * 100.0
        );
    }
}

/// R-SG5 (issue 21): a limiter of another shape — Debian's HAProxy with a
/// stick table counting `http_req_rate(1s)`, refused requests included,
/// denying with a bare 429 past 20 req/s — with 8 naive clients through
/// sluice for 60 s: over 30–60 s ≥ 95 % of the limit with ≤ 1 % 429s.
/// Beside it, on a frontend with its own table, the same number of
/// threads gated by real botocore's adaptive limiter; both figures are
/// printed (measured: sluice 0.99 / 0.17 %, botocore 0.95 / 1.6 %).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sliding_window_that_counts_refusals_is_paced_to_its_limit() {
    use sluice_tests::clients::botocore_clients;
    use sluice_tests::haproxy::{figures, now_ms, Haproxy};
    const LIMIT: u32 = 20;
    let (ours, theirs) = ("127.0.0.43", "127.0.0.44");
    let haproxy = Haproxy::start(&[ours, theirs], LIMIT);
    let sluice = Sluice::start("[destinations]\nallow = [\"127.0.0.0/8\"]\n");
    let (proxy, our_url, their_url) = (
        sluice.proxy_url(),
        haproxy.url(ours, "/items"),
        haproxy.url(theirs, "/items"),
    );
    let t0 = now_ms();
    let (a, b) = tokio::join!(
        naive_clients(&proxy, &our_url, 8, 60, &[]),
        botocore_clients(&their_url, 8, 60),
    );
    let (half, end) = (t0 + 30_000, t0 + 60_000);
    let ours_f = figures(&haproxy.answers(ours), half, end, f64::from(LIMIT));
    let theirs_f = figures(&haproxy.answers(theirs), half, end, f64::from(LIMIT));
    let cold = figures(&haproxy.answers(ours), t0, end, f64::from(LIMIT)).goodput;
    let bcold = figures(&haproxy.answers(theirs), t0, end, f64::from(LIMIT)).goodput;
    let (g, r, n) = (ours_f.goodput, ours_f.throttled_share, ours_f.attempts);
    let (bg, br, bn) = (
        theirs_f.goodput,
        theirs_f.throttled_share,
        theirs_f.attempts,
    );
    println!(
        "HAProxy http_req_rate(1s) > {LIMIT} → 429, 8 clients each, 60 s; 30–60 s at HAProxy:\n  \
         sluice: {:.1} % of the limit, {:.2} % of {n} refused (first 60 s {:.1} %); clients saw {}\n  \
         botocore adaptive: {:.1} %, {:.2} % of {bn} refused (first 60 s {:.1} %); clients saw {}",
        g * 100.0,
        r * 100.0,
        cold * 100.0,
        a.trim(),
        bg * 100.0,
        br * 100.0,
        bcold * 100.0,
        b.trim()
    );
    assert!(bn > 0, "botocore's clients reached HAProxy");
    assert!(g >= 0.95, "goodput {:.1} % < 95 %", g * 100.0);
    assert!(r <= 0.01, "429 share {:.2} % > 1 %", r * 100.0);
}

//! R-AI1, R-GC1 end to end: naive clients against a provider with a hidden
//! limit, through sluice. Measured at the provider, which is what counts.

use std::time::Duration;

use sluice_tests::clients::python;
use sluice_tests::harness::Sluice;
use sluice_tests::sim::Sim;

const NAIVE_CLIENTS: &str = r#"
import sys, threading, time, requests
url, clients, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
deadline = time.monotonic() + secs
counts = {}
lock = threading.Lock()
def run():
    s = requests.Session()
    while time.monotonic() < deadline:
        try:
            code = s.get(url, timeout=30).status_code
        except Exception as e:
            code = type(e).__name__
        with lock:
            counts[code] = counts.get(code, 0) + 1
threads = [threading.Thread(target=run) for _ in range(clients)]
for t in threads: t.start()
for t in threads: t.join()
print(" ".join(f"{k}={v}" for k, v in sorted(counts.items(), key=str)))
"#;

/// 8 naive clients (no backoff of their own) for 30 s against a hidden
/// limit of 20 req/s: over the last 15 s the provider accepts ≥ 85 % of its
/// limit and ≤ 5 % of the attempts it sees are 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn naive_clients_are_paced_to_the_hidden_limit() {
    const LIMIT: f64 = 20.0;
    let sim = Sim::start("127.0.0.12").await;
    sim.set_limit(LIMIT, 10.0);
    let sluice = Sluice::start("[destinations]\nallow = [\"127.0.0.0/8\"]\n");
    let clients = python(
        &sluice.proxy_url(),
        NAIVE_CLIENTS,
        &[&sim.url("http", "/limited"), "8", "30"],
    )
    .await;
    let hits = sim.hits("/limited");
    let start = hits.first().expect("the provider saw requests").at;
    let from = start + Duration::from_secs(15);
    let to = start + Duration::from_secs(30);
    let window: Vec<_> = hits.iter().filter(|h| h.at >= from && h.at < to).collect();
    let accepted = window.iter().filter(|h| h.status == 200).count();
    let throttled = window.iter().filter(|h| h.status == 429).count();
    let goodput = accepted as f64 / 15.0 / LIMIT;
    let share = throttled as f64 / window.len().max(1) as f64;
    println!(
        "hidden limit {LIMIT} req/s, 8 naive clients, 30 s over plain HTTP; last 15 s at the provider: \
         {accepted} accepted ({:.1} % of the limit), {throttled} of {} attempts 429 ({:.2} %); \
         clients saw: {}",
        goodput * 100.0,
        window.len(),
        share * 100.0,
        clients.trim()
    );
    assert!(goodput >= 0.85, "goodput {:.1} % < 85 %", goodput * 100.0);
    assert!(share <= 0.05, "429 share {:.2} % > 5 %", share * 100.0);
}

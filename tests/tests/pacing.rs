//! R-AI1, R-GC1 end to end: naive clients against a provider with a hidden
//! limit, through sluice. Measured at the provider, which is what counts.

use sluice_tests::clients::naive_clients;
use sluice_tests::harness::Sluice;
use sluice_tests::sim::Sim;

/// 8 naive clients (no backoff of their own) for 30 s against a hidden
/// limit of 20 req/s: over the last 15 s the provider accepts ≥ 85 % of its
/// limit and ≤ 5 % of the attempts it sees are 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn naive_clients_are_paced_to_the_hidden_limit() {
    const LIMIT: f64 = 20.0;
    let sim = Sim::start("127.0.0.12").await;
    sim.set_limit(LIMIT, 10.0);
    let sluice = Sluice::start("[destinations]\nallow = [\"127.0.0.0/8\"]\n");
    let clients = naive_clients(
        &sluice.proxy_url(),
        &sim.url("http", "/limited"),
        8,
        30,
        &[],
    )
    .await;
    let f = sim.figures("/limited", 15, 30, LIMIT);
    println!(
        "hidden limit {LIMIT} req/s, 8 naive clients, 30 s over plain HTTP; \
         last 15 s at the provider: {f}; clients saw: {}",
        clients.trim()
    );
    let (goodput, share) = (f.goodput, f.throttled_share);
    assert!(goodput >= 0.85, "goodput {:.1} % < 85 %", goodput * 100.0);
    assert!(share <= 0.05, "429 share {:.2} % > 5 %", share * 100.0);
}
